"""Loaded by every Python process that the suite starts while ``pytest --timings DIR`` runs
(``tests/timings.py`` puts this folder first on ``PYTHONPATH``): it records when the process
started, when it imported TensorFlow and how long that took, and when it ended, as one JSON
line in ``DIR/procs-<pid>.jsonl``. Nothing else changes in the process."""

import atexit
import importlib.abc
import json
import os
import sys
import time

_DIR = os.environ.get("DUOTF_TIMINGS_DIR")
#: as duotf._node.warm.IMPORT_PREFIXES (not imported: this runs before anything is)
_IMPORT_PREFIXES = ("TF_", "TF2_", "CUDA", "NVIDIA_", "XLA_", "KERAS_", "OMP_", "MKL_", "KMP_",
                    "OPENBLAS_", "GOTO", "BLIS_", "TPU_", "HIP_", "ROCM_", "PYTHON", "LD_", "MALLOC_",
                    "GLIBC_", "HDF5_", "LANG", "LC_", "HOME", "DUOTF_WARM_")


def _kind() -> str:
    argv = " ".join(getattr(sys, "orig_argv", None) or getattr(sys, "argv", []))
    for marker, kind in (("duotf._node.child", "node"), ("duotf._node.warm", "warm"), ("pyspark.daemon", "spark-python"),
                         ("pyspark/daemon", "spark-python"), ("distributed", "dask"),
                         ("tensorboard", "tensorboard")):
        if marker in argv:
            return kind
    return "other"


class _Record:
    def __init__(self, kind=None):
        self.start = time.time()
        self.tf = None  # (start, end) of `import tensorflow`
        self.kind = kind  # None: from the command line

    def write(self, end=None):
        if not _DIR:
            return
        kind = self.kind or _kind()
        line = {"pid": os.getpid(), "kind": kind, "start": self.start,
                "end": end if end is not None else time.time(), "tf": self.tf}
        if kind in ("warm", "node") and self.tf is not None:
            # what decides which warm server a node's import could have come from: its
            # environment's import variables, its path and directory (duotf/_node/warm.py)
            line["env"] = {k: v for k, v in os.environ.items()
                           if k.startswith(_IMPORT_PREFIXES) and k != "DUOTF_WARM_ROOM"}
            line["cwd"], line["ppid"] = os.getcwd(), os.getppid()
        try:
            with open(os.path.join(_DIR, f"procs-{os.getpid()}.jsonl"), "a") as f:
                f.write(json.dumps(line) + "\n")
        except OSError:
            pass


_record = _Record()


class _TimedLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        begun = time.time()
        try:
            self.loader.exec_module(module)
        finally:
            if _record.tf is None:
                _record.tf = (begun, time.time())
                # a node and a forked Spark worker end with os._exit: say it now, too
                _record.write(end=_record.tf[1])


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "tensorflow" or _record.tf is not None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _TimedLoader(spec.loader)
                return spec
        return None


def _after_fork():
    global _record
    # a process forked by a warm node server is a node (its command line says so only later)
    _record = _Record("node" if (_record.kind or _kind()) == "warm" else _record.kind)


if _DIR:
    sys.meta_path.insert(0, _Finder())
    atexit.register(lambda: _record.write())
    os.register_at_fork(after_in_child=_after_fork)


def _load_next() -> None:
    """The ``sitecustomize`` that this one hides, if any (tests/cover_site's, under both)."""
    from importlib.machinery import PathFinder

    here = os.path.dirname(os.path.abspath(__file__))
    spec = PathFinder.find_spec("sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != here])
    if spec is not None and spec.loader is not None:
        module = type(sys)("sitecustomize")
        module.__file__ = spec.origin
        spec.loader.exec_module(module)


_load_next()
