"""The job's ``(main, args)`` as the driver sends it to every node, with the source of the code
it carries.

cloudpickle sends the user's functions by value (those of the driver's script or notebook, and
of modules registered with ``cloudpickle.register_pickle_by_value``) and names each one's file
``<dynamic-code>``. In a node, ``inspect.getsource`` then finds nothing, so AutoGraph runs a
``tf.function`` unconverted ("AutoGraph could not transform ... Unable to locate the source
code"): a Python ``if`` or ``for`` over tensors fails in the graph, and a traceback shows no
line of the user's code. So the driver keeps each function's own file name and sends the text
of those files beside the job (the driver reads them through ``linecache``, which holds a
notebook's cells too); the node puts the text into its ``linecache`` before it unpickles the
job, under the same names, so that ``inspect`` finds it whether or not the file exists on the
node's host.

A module beside the user's script (``from model import make_model`` next to ``train.py``) is
sent by value too, where the driver runs a script (:func:`modules_beside_the_script`): the
executors do not have the script's folder on their path (Spark Connect's never do).
"""

from __future__ import annotations

import io
import linecache
import logging
import os
import pickle
import sys
import sysconfig
import threading
import types
from typing import Any, Dict, List, Set, Tuple

__all__ = ["check_sendable", "dumps", "loads", "modules_beside_the_script", "install_sources"]

logger = logging.getLogger(__name__)
#: held while modules beside the script are registered with cloudpickle for one job's pickling
_registering = threading.Lock()


def check_sendable(value: Any, name: str, fix: str, **attrs: Any) -> None:
    """A :class:`~duotf.ConfigError` naming ``name`` (and saying ``fix``) where cloudpickle
    cannot pickle ``value``, before anything starts."""
    import cloudpickle

    from duotf.errors import ConfigError

    try:
        cloudpickle.dumps(value)
    except Exception as exc:  # noqa: BLE001 - any refusal of cloudpickle's, named
        raise ConfigError(f"{name} cannot be sent to the nodes: cloudpickle refused it "
                          f"({type(exc).__name__}: {exc}). {fix}", **attrs) from exc


def _code_named(rebuild, args, filename: str) -> types.CodeType:
    """A code object rebuilt by cloudpickle's reducer, under its own file name again."""
    return rebuild(*args).replace(co_filename=filename)


def _pickler(buffer: io.BytesIO, files: set):
    import cloudpickle

    code_reduce = cloudpickle.Pickler.dispatch_table.get(types.CodeType)

    class Pickler(cloudpickle.Pickler):
        def reducer_override(self, obj):
            if code_reduce is not None and type(obj) is types.CodeType:
                files.add(obj.co_filename)
                rebuild, args = code_reduce(obj)
                return _code_named, (rebuild, args, obj.co_filename)
            return super().reducer_override(obj)

    return Pickler(buffer, protocol=pickle.DEFAULT_PROTOCOL)


def _installed_roots() -> List[str]:
    """The folders of the interpreter's own and installed packages."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(name)
        if path:
            roots.add(path)
    return [os.path.realpath(r) for r in roots if r]


def _inside(path: str, roots: List[str]) -> bool:
    return any(path == root or path.startswith(root + os.sep) for root in roots)


def modules_beside_the_script() -> List[types.ModuleType]:
    """The imported one-file modules in the folder of the script the driver runs
    (``python train.py``: ``model.py`` beside it), which the nodes are sent by value. None
    where ``__main__`` is not a script of the user's (a notebook, ``python -m``, pytest) or
    the script lies among installed packages."""
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None)
    if not script or getattr(main, "__spec__", None) is not None:  # python -m pkg: a package's
        return []
    folder = os.path.dirname(os.path.realpath(script))
    roots = _installed_roots()
    if _inside(folder, roots):
        return []
    found = []
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if (not path or module is main or "." in name or not path.endswith(".py")
                or os.path.basename(path) == "__init__.py"):
            continue
        if os.path.dirname(os.path.realpath(path)) == folder and not name.startswith("duotf"):
            found.append(module)
    return found


def dumps(obj: Any) -> bytes:
    """``obj`` pickled for the nodes (see the module docstring): ``(sources, pickled)``."""
    import cloudpickle

    buffer = io.BytesIO()
    files: Set[str] = set()
    with _registering:  # the registry is cloudpickle's, one for the process (run_parallel's threads)
        registered = cloudpickle.list_registry_pickle_by_value()
        beside = [m for m in modules_beside_the_script() if m.__name__ not in registered]
        for module in beside:
            cloudpickle.register_pickle_by_value(module)
        if beside:
            logger.debug("duotf: the nodes get these modules beside the script by value: %s",
                         ", ".join(m.__name__ for m in beside))
        try:
            _pickler(buffer, files).dump(obj)
        finally:
            for module in beside:
                cloudpickle.unregister_pickle_by_value(module)
    sources: Dict[str, str] = {}
    for name in sorted(files):
        lines = linecache.getlines(name)
        if lines:
            sources[name] = "".join(lines)
    return pickle.dumps((sources, buffer.getvalue()), protocol=pickle.DEFAULT_PROTOCOL)


def install_sources(sources: Dict[str, str]) -> None:
    """Put ``{file name: text}`` into this process's ``linecache``, where ``inspect`` (and so
    AutoGraph) and tracebacks read source lines. An entry without a modification time is
    never dropped by ``linecache.checkcache``."""
    for name, text in sources.items():
        linecache.cache[name] = (len(text), None, text.splitlines(True), name)


def loads(payload: bytes) -> Tuple[Any, Any]:
    """What :func:`dumps` pickled, with its sources in ``linecache`` first."""
    sources, pickled = pickle.loads(payload)
    install_sources(sources)
    return pickle.loads(pickled)
