"""Backends by name, imported lazily: ``import duotf`` never imports pyspark or distributed."""

from __future__ import annotations

import importlib
from typing import Tuple

from ..errors import ConfigError
from .base import Backend, NodeGang
from .local import LocalBackend

__all__ = ["Backend", "NodeGang", "LocalBackend", "known_backends", "resolve_backend"]

#: name -> (dotted path of the class, how to install what it needs)
known_backends = {
    "local": ("duotf.backends.local.LocalBackend", None),
    "spark": ("duotf.backends.spark.SparkBackend", "pip install 'duotf[spark]'"),
    "dask": ("duotf.backends.dask.DaskBackend", "pip install 'duotf[dask]'"),
}


def _load(name: str):
    path, hint = known_backends[name]
    module, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        raise ConfigError(
            f"the {name!r} backend needs a package that is not installed ({exc.name}): {hint}"
        ) from exc


def resolve_backend(backend) -> Tuple[Backend, bool]:
    """Turn what the user passed into a :class:`Backend`; the flag says duotf owns it.

    Accepts None (the embedded local default), a name from :data:`known_backends`, a Backend,
    a ``pyspark`` SparkSession or SparkContext, or a ``distributed.Client``.
    """
    if backend is None:
        return LocalBackend(), True
    if isinstance(backend, Backend):
        return backend, False
    if isinstance(backend, str):
        if backend not in known_backends:
            raise ConfigError(
                f"unknown backend {backend!r}; known backends: {', '.join(sorted(known_backends))}"
            )
        return _load(backend).from_name(), True
    module = type(backend).__module__ or ""
    if module.startswith("pyspark"):
        return _load("spark")(backend), False
    if module.startswith("distributed"):
        return _load("dask")(backend), False
    raise ConfigError(
        f"cannot run on {type(backend).__name__}: pass a SparkSession, SparkContext, "
        f"distributed.Client, a duotf Backend, or one of {', '.join(sorted(known_backends))}"
    )
