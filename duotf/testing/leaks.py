"""The leak check that :mod:`duotf.testing.plugin` runs after every test (its ``no_leaks``
fixture): no duotf node process (:func:`duotf.testing.node_processes`), no new thread but an
engine's, no new listening port and no new duotf directory in the temp folder remains.

Threads are compared as sets, the way dask/distributed's ``check_thread_leak`` does, and each
new one has a grace period to end. psutil is imported where it is used.
"""

from __future__ import annotations

import functools
import re
import sys
import threading
import time
import traceback
from typing import Iterable, List, Set

__all__ = ["ENGINE_MODULES", "ENGINE_NAMES", "code_of", "describe_threads", "duotf_temp_dirs",
           "kept_by_an_engine", "leaked_threads", "listening_ports"]

# Threads that an engine or library starts and keeps for the life of the process: told by the
# module whose code they run (py4j's connections and callback server, the Dask client's event
# loop), or by name where their code is the standard library's: Dask's offload pool, fsspec's
# IO loop ("fsspecIO", asyncio code) and that loop's default executor ("asyncio_N"; duotf uses
# no asyncio), and a multiprocessing queue's feeder ("QueueFeederThread": a Dask nanny that
# restarts a killed worker process talks to the new one through such a queue, for its life).
# The test process pool's executor manager is the engine's too ("concurrent.futures.process":
# duotf runs no process pool; the pool replaces an executor that a killed worker broke).
#: the modules whose threads an engine keeps for the life of the process
ENGINE_MODULES = ("py4j.", "pyspark.", "distributed.", "dask.", "tornado.", "tensorflow.",
                  "concurrent.futures.process")
#: the name prefixes of the standard library's threads that an engine keeps
ENGINE_NAMES = ("Dask-Offload_", "fsspecIO", "asyncio_", "QueueFeederThread")


def code_of(thread: threading.Thread) -> str:
    """The module of the code a thread runs: its target's, or its Thread subclass's."""
    target = getattr(thread, "_target", None)
    while isinstance(target, functools.partial):
        target = target.func
    return getattr(target, "__module__", None) or type(thread).__module__


def kept_by_an_engine(thread: threading.Thread) -> bool:
    """Whether ``thread`` is one an engine or library keeps for the life of the process."""
    return (code_of(thread).startswith(ENGINE_MODULES) or thread.name.startswith(ENGINE_NAMES)
            or thread in _spark_connect_pool())


def _spark_connect_pool() -> Set[threading.Thread]:
    """The threads of the pools a Spark Connect client's result iterators keep to release
    finished operations on the server (plain ThreadPoolExecutor workers: known by their pools,
    not by name or code). pyspark 4.x makes one a live iterator; its threads end when it is
    collected."""
    reattach = sys.modules.get("pyspark.sql.connect.client.reattach")
    iterator = getattr(reattach, "ExecutePlanResponseReattachableIterator", None)
    if iterator is None:
        return set()
    owners = [iterator, *list(getattr(iterator, "_instances", ()))]
    pools = [vars(owner).get("_release_thread_pool_instance") for owner in owners]
    return {thread for pool in pools if pool is not None for thread in getattr(pool, "_threads", ())}


def leaked_threads(before: Iterable[threading.Thread], grace: float = 15.0) -> List[threading.Thread]:
    """The threads alive now that were not in ``before`` and that no engine keeps, once each
    had up to ``grace`` seconds to end (as dask/distributed's ``check_thread_leak``)."""
    import gc

    before = set(before)
    deadline = time.monotonic() + grace
    collected = False
    while True:
        leaked = [t for t in threading.enumerate() if t not in before and not kept_by_an_engine(t)]
        if not leaked or time.monotonic() > deadline:
            return leaked
        if not collected:  # a pool's workers end once it is collected (the Connect client's)
            gc.collect()
            collected = True
        time.sleep(0.05)


def describe_threads(threads: List[threading.Thread]) -> str:
    """Each thread's name, the module it runs and where it is now."""
    frames = sys._current_frames()
    lines = [f"{len(threads)} thread(s) left running:"]
    for thread in threads:
        frame = frames.get(thread.ident) if thread.ident is not None else None
        where = "".join(traceback.format_stack(frame, limit=4)) if frame is not None else "  (ended)\n"
        lines.append(f"- {thread.name!r}, running {code_of(thread)} code, at:\n{where}")
    return "\n".join(lines)


def listening_ports() -> Set[int]:
    """The TCP ports this process listens on."""
    import psutil

    return {
        c.laddr.port for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    }


def duotf_temp_dirs() -> Set[str]:
    """The entries of this process's temp folder that a duotf job makes: its working
    directories and own checkpoint folder (``duotf-<job id>...``), its node logs
    (``duotf-logs-<job id>-...``) and feed caches (``duotf-feedcache-...``). None may outlive the
    job (the logs: its Cluster). ``duotf-models``, the fits' models without a ``modelDir``, stays."""
    import os
    import tempfile

    root = tempfile.gettempdir()
    return {os.path.join(root, n) for n in os.listdir(root) if _JOB_ENTRY.match(n)}


#: the names of what a duotf job makes in the temp folder
_JOB_ENTRY = re.compile(r"duotf-(logs-[0-9a-f]{12}-|[0-9a-f]{12}|feedcache-)")
