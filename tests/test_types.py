"""Every public function and method is annotated: each parameter and the return.

Public: what the public modules export (their ``__all__``, or the names they define where they
have none): every module under duotf/ whose path has no ``_`` part, but ``duotf.backends`` (the
backend contract, for backend authors: typed where mypy needs it, not promised here) and
``duotf.testing.suite`` (the shared suite's test cases and node programs, which pytest and the
nodes call, not a user). Of a class, its public methods and properties and its ``__init__``
(the constructor's parameters; its return is None), where they are defined in duotf: methods
inherited from pyspark, Keras or Python are theirs. Added to those, the classes users get from a
public call without importing them (:data:`HANDED_OUT`). ``self`` and ``cls`` need no
annotation; ``*args`` and ``**kwargs`` do (their items' type).

Nothing is run: the modules are imported, which imports pyspark and dask for the ML stages
(no session, no cluster), so the test takes a few seconds. The classes a public module makes on
first use (Keras callbacks, whose base class would import Keras) are read from the source.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
from typing import Callable, Dict, Iterator, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: kept out of the walk (see the module docstring for why)
NOT_PUBLIC = ("duotf.backends", "duotf.testing.suite")

#: classes a public call hands out, defined in private modules and exported nowhere
HANDED_OUT = {
    "duotf._driver.planner:Stream": "Cluster.open_stream()",
    "duotf._transport.datafeed:DataFeed": "ctx.get_data_feed()",
    "duotf.spark._ml:TFEstimator": "duotf.spark.TFEstimator (loaded on first use, so not in __all__)",
    "duotf.spark._ml:TFModel": "duotf.spark.TFModel and TFEstimator.fit()",
}


def public_modules() -> List[str]:
    found = []
    for folder, _, files in os.walk(os.path.join(ROOT, "duotf")):
        for name in files:
            if not name.endswith(".py"):
                continue
            dotted = os.path.relpath(os.path.join(folder, name), ROOT)[:-3].replace(os.sep, ".")
            dotted = dotted[:-len(".__init__")] if dotted.endswith(".__init__") else dotted
            parts = dotted.split(".")
            if any(p.startswith("_") for p in parts) and not dotted.endswith("__main__"):
                continue
            if any(dotted == n or dotted.startswith(n + ".") for n in NOT_PUBLIC):
                continue
            found.append(dotted)
    return sorted(found)


def _exported(module) -> Iterator[object]:
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, v in vars(module).items() if not n.startswith("_")
                 and getattr(v, "__module__", None) == module.__name__]
    for name in names:
        yield getattr(module, name)


def _methods(cls: type) -> Iterator[Tuple[str, Callable]]:
    """``(qualified name, function)`` of the public methods, properties and ``__init__`` of
    ``cls`` and of its duotf bases."""
    for klass in cls.__mro__:
        if not klass.__module__.startswith("duotf"):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_") and name != "__init__":
                continue
            where = f"{klass.__module__}.{klass.__qualname__}.{name}"
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if isinstance(value, property):
                for fn in (value.fget, value.fset):
                    if fn is not None:
                        yield where, fn
            elif inspect.isfunction(value) and value.__module__.startswith("duotf"):
                yield where, value  # (not a Protocol's __init__, which typing puts there)


def callables() -> Dict[str, Callable]:
    """Every public function and method, by its qualified name."""
    found: Dict[str, Callable] = {}
    objects = []
    for name in public_modules():
        objects.extend(_exported(importlib.import_module(name)))
    for spec in HANDED_OUT:
        module, name = spec.split(":")
        objects.append(getattr(importlib.import_module(module), name))
    for obj in objects:
        if getattr(obj, "__module__", "").split(".")[0] != "duotf":
            continue
        if inspect.isclass(obj):
            found.update(_methods(obj))
        elif inspect.isfunction(obj):
            found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return found


def unannotated(name: str, fn: Callable) -> List[str]:
    """The parameters of ``fn`` with no annotation, and ``return`` when it has none."""
    fn = inspect.unwrap(fn)
    annotations = fn.__annotations__
    missing = [p.name for p in inspect.signature(fn).parameters.values()
               if p.name not in ("self", "cls") and p.name not in annotations]
    if "return" not in annotations and not name.endswith(".__init__"):
        missing.append("return")
    return missing


CALLABLES = callables()


def test_the_walk_finds_the_public_surface():
    # a walk that found nothing would pass the test below: it finds what users call
    names = set(CALLABLES)
    for expected in ("duotf._driver.api.run", "duotf.Cluster.train",
                     "duotf.Cluster.__init__", "duotf.context.NodeContext.report",
                     "duotf._transport.datafeed.DataFeed.next_batch", "duotf._driver.planner.Stream.feed",
                     "duotf.spark.TFEstimator.setEpochs", "duotf.dask.TFEstimator.fit",
                     "duotf.io.tfrecord.read_records", "duotf.testing.engine.Engine.rows",
                     "duotf.errors.DuotfError.__init__"):
        assert expected in names, expected
    assert "duotf.backends.base.FeedAdapter.report" not in names  # not promised here
    assert len(names) > 200


def test_unannotated_finds_what_lacks_an_annotation():
    def bare(a, b: int, *args, **kwargs):
        return a

    def full(self, a: int, *args: str, **kwargs: float) -> int:
        return a

    def __init__(self, a: int):
        pass

    assert unannotated("m.bare", bare) == ["a", "args", "kwargs", "return"]
    assert unannotated("m.full", full) == []
    assert unannotated("m.C.__init__", __init__) == []


def test_every_public_function_is_annotated():
    missing = [f"{name}: {', '.join(gaps)}" for name, fn in sorted(CALLABLES.items())
               for gaps in [unannotated(name, fn)] if gaps]
    assert not missing, (f"{len(missing)} public functions without annotations (parameter names, "
                         "or return):\n" + "\n".join(missing))


def made_on_first_use() -> Dict[str, List[str]]:
    """The public classes that a public module defines inside a function (made on first use,
    such as ``duotf.keras.ReportCallback``): each public method and ``__init__``, by qualified
    name, with what it lacks (read from the source: nothing imports Keras)."""
    found: Dict[str, List[str]] = {}
    for module in public_modules():
        path = os.path.join(ROOT, *module.split(".")) + ".py"
        if not os.path.exists(path):
            path = os.path.join(ROOT, *module.split("."), "__init__.py")
        tree = ast.parse(open(path, encoding="utf-8").read(), path)
        for fn in tree.body:
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for cls in ast.walk(fn):
                if not isinstance(cls, ast.ClassDef) or cls.name.startswith("_"):
                    continue
                for method in cls.body:
                    if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) or (
                            method.name.startswith("_") and method.name != "__init__"):
                        continue
                    a = method.args
                    params = a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x]
                    gaps = [p.arg for p in params if p.arg not in ("self", "cls") and p.annotation is None]
                    if method.returns is None and method.name != "__init__":
                        gaps.append("return")
                    found[f"{module}.{cls.name}.{method.name}"] = gaps
    return found


def test_the_classes_made_on_first_use_are_annotated():
    found = made_on_first_use()
    for expected in ("duotf.keras.ReportCallback.__init__", "duotf.keras.CheckpointCallback.restore",
                     "duotf.averaging.AveragingCallback.on_train_batch_end"):
        assert expected in found, expected
    missing = [f"{name}: {', '.join(gaps)}" for name, gaps in sorted(found.items()) if gaps]
    assert not missing, "classes made on first use without annotations:\n" + "\n".join(missing)
