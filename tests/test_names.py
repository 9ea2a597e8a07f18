"""Public names say where users import them (duotf/_names.py): a class that a public module
exports from a private one is that public module's, in its repr, its help and its pickles; the
lazy names of every public module resolve, and an unknown one is an AttributeError."""

from __future__ import annotations

import importlib
import inspect
import pickle

import pytest

#: the public modules and their names imported when first asked for (not in ``__all__`` only)
PUBLIC = {
    "duotf": (),
    "duotf.spark": ("TFEstimator", "TFModel"),
    "duotf.dask": (),
    "duotf.keras": ("ReportCallback", "CheckpointCallback"),
    "duotf.averaging": ("AveragingCallback",),
}


def _private(module: str) -> bool:
    return any(part.startswith("_") for part in module.split("."))


@pytest.mark.parametrize("module", ["duotf", "duotf.spark", "duotf.dask"])
def test_a_public_class_from_a_private_module_names_its_public_module(module):
    mod = importlib.import_module(module)
    classes = [getattr(mod, name) for name in list(mod.__all__) + list(PUBLIC[module])]
    classes = [c for c in classes if inspect.isclass(c)]
    wrong = [f"{c.__qualname__}: {c.__module__}" for c in classes
             if c.__module__ != module and _private(c.__module__)]
    assert not wrong, f"{module} exports classes that name a private module: {wrong}"
    # and a pickle of one, which names the public path, loads as the same class
    for cls in classes:
        assert pickle.loads(pickle.dumps(cls)) is cls


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_every_lazy_name_resolves_and_an_unknown_one_is_an_attribute_error(module):
    mod = importlib.import_module(module)
    for name in list(getattr(mod, "__all__", ())) + list(PUBLIC[module]):
        assert getattr(mod, name) is not None
        assert name in dir(mod)
    with pytest.raises(AttributeError, match="no_such_name"):
        getattr(mod, "no_such_name")
    with pytest.raises(AttributeError):
        getattr(mod, "__no_such_dunder__")
