"""Backends by name, imported lazily: ``import duotf`` never imports pyspark or distributed.

One table, :data:`known_backends`, maps a name to the dotted path of its class and how to install
what it needs. Other packages add theirs through the ``duotf.backends`` entry point group::

    [options.entry_points]
    duotf.backends =
        ray = duotf_ray:RayBackend

or at run time with :func:`register_backend`. An engine object passed to ``duotf.run`` (a
SparkSession, a ``distributed.Client``, ...) is matched by each backend's ``accepts(obj)``.
"""

from __future__ import annotations

import importlib
import logging
from typing import Dict, Optional, Tuple, Type, Union

from duotf.errors import ConfigError
from duotf.backends.base import (Backend, CheckStatus, EngineJob, FeedAdapter, FeedOptions, JobError,
                                 ThreadJob, count_error)
from duotf.backends.local import LocalBackend

__all__ = [
    "Backend", "FeedAdapter", "FeedOptions", "JobError", "CheckStatus", "EngineJob", "ThreadJob",
    "LocalBackend", "count_error",
    "known_backends", "register_backend", "backend_class", "resolve_backend", "ENTRY_POINT_GROUP",
]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "duotf.backends"
"""The entry point group in which other packages name their backends (see above)."""

known_backends: Dict[str, Tuple[Union[str, Type[Backend]], Optional[str]]] = {
    "local": ("duotf.backends.local.LocalBackend", None),
    "spark": ("duotf.backends.spark.backend.SparkBackend", "pip install 'duotf[spark]'"),
    "dask": ("duotf.backends.dask.backend.DaskBackend", "pip install 'duotf[dask]'"),
}
"""Name -> (the class, or the dotted path of the class; how to install what it needs)."""
_BUILTIN = tuple(known_backends)
_entry_points_loaded = False


def register_backend(name: str, cls: Union[str, Type[Backend]], install_hint: Optional[str] = None,
                     *, clobber: bool = False) -> None:
    """Make a backend known by ``name``: a :class:`Backend` subclass or where to find it
    (``"package.module:Class"`` or ``"package.module.Class"``, imported when first used)."""
    if name in known_backends and not clobber:
        raise ConfigError(f"a backend named {name!r} is already registered; pass clobber=True")
    known_backends[name] = (cls, install_hint)


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _BUILTIN:
            logger.warning("duotf: entry point %r of %s ignored: the name is duotf's own",
                           ep.name, ep.value)
            continue
        known_backends.setdefault(ep.name, (ep.value, None))


def _not_installed(name: str, exc: ImportError) -> ConfigError:
    hint = known_backends[name][1]
    return ConfigError(f"the {name!r} backend needs a package that is not installed ({exc.name})"
                       + (f": {hint}" if hint else ""))


def backend_class(name: str) -> Type[Backend]:
    """The class registered as ``name``; a :class:`ConfigError` names the known ones or says
    what to install."""
    _load_entry_points()
    if name not in known_backends:
        raise ConfigError(f"unknown backend {name!r}; known backends: {', '.join(sorted(known_backends))}")
    target = known_backends[name][0]
    if not isinstance(target, str):
        return target
    module, _, attr = target.rpartition(":") if ":" in target else target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        raise _not_installed(name, exc) from exc
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise ConfigError(f"{target} (backend {name!r}) is not a duotf.backends.Backend")
    return cls


def resolve_backend(backend) -> Tuple[Backend, bool]:
    """Turn what the user passed into a :class:`Backend`; the flag says duotf owns it.

    Accepts None (the embedded local default), a registered name, a Backend, or an engine
    object that a registered backend ``accepts`` (a ``pyspark`` SparkSession or SparkContext, a
    ``distributed.Client``, ...).
    """
    if backend is None:
        return LocalBackend(), True
    if isinstance(backend, Backend):
        return backend, False
    if isinstance(backend, str):
        cls = backend_class(backend)
        try:
            return cls.from_name(), True
        except ImportError as exc:  # from_name imports the engine's package (pyspark, ...)
            raise _not_installed(backend, exc) from exc
    _load_entry_points()
    for name in list(known_backends):
        try:
            cls = backend_class(name)
        except ConfigError as exc:  # a backend whose package is missing accepts nothing
            logger.debug("duotf: backend %r not considered: %s", name, exc)
            continue
        if cls.accepts(backend):
            # each backend class takes its engine's handle; the base declares no constructor
            return cls(backend), False  # type: ignore[call-arg]
    raise ConfigError(
        f"cannot run on {type(backend).__name__}: pass a SparkSession, SparkContext, "
        f"distributed.Client, a duotf Backend, or one of {', '.join(sorted(known_backends))}"
    )
