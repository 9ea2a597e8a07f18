"""Public names: where a user imports them, and imported only when first asked for.

duotf's classes and functions are defined in private modules (``duotf._driver.cluster``) and
imported from public ones (``duotf``, ``duotf.spark``, ``duotf.dask``). Two helpers keep the two
apart for the user:

* :func:`public` sets a class's ``__module__`` to where users import it, so that its ``repr``,
  ``help()``, tracebacks and pickles name ``duotf.Cluster``, not the private module (which may
  move between versions: a pickle that names the public path still loads). As with numpy's
  classes, ``inspect.getsource`` of such a class finds no source (it searches the module its
  ``__module__`` names); its methods' source is found (their code names their file).
* :func:`lazy` gives a module its ``__getattr__`` and ``__dir__`` for names imported when first
  asked for: ``import duotf`` must stay light (every node process imports it first), and most
  public names come from modules that import numpy, pandas, TensorFlow or an engine. A name is
  looked up once, in the table the module passes: the module that defines it, or a function
  that makes it (a class that subclasses a Keras class can exist only once Keras is imported),
  and kept in the module's namespace, so later lookups cost nothing.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, List, Mapping, Tuple, TypeVar, Union

__all__ = ["lazy", "public"]

_C = TypeVar("_C", bound=type)

#: where a lazy name comes from: the dotted module that defines it, or a function that makes it
Source = Union[str, Callable[[], object]]


def public(module: str) -> Callable[[_C], _C]:
    """A class decorator: the class says it is ``module``'s (which must export it)."""
    def mark(cls: _C) -> _C:
        cls.__module__ = module
        return cls
    return mark


def lazy(module: str, names: Mapping[str, Source], submodules: bool = False
         ) -> Tuple[Callable[[str], Any], Callable[[], List[str]]]:
    """``(__getattr__, __dir__)`` for ``module``, whose ``names`` are imported when first
    asked for (see the module's notes). ``submodules``: any other name is tried as a submodule,
    as an eagerly imported package would have it (``duotf._driver.supervisor``)."""
    def __getattr__(name: str) -> Any:
        source = names.get(name)
        if source is not None:
            value = getattr(importlib.import_module(source), name) if isinstance(source, str) \
                else source()
            setattr(sys.modules[module], name, value)  # once: later lookups skip __getattr__
            return value
        if submodules and not name.startswith("__"):  # a dunder is a probe (copy, pickle)
            try:
                return importlib.import_module(f"{module}.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{module}.{name}":
                    raise
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    def __dir__() -> List[str]:
        return sorted(set(vars(sys.modules[module])) | set(names))

    return __getattr__, __dir__
