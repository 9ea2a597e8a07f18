"""duotf's behaviour suite, shipped so that a backend outside duotf can prove itself with it.

The suite (:mod:`duotf.testing.suite`) is written once and runs on every engine: each test takes
the ``backend`` fixture (a started duotf Backend) and, for data, the ``engine`` fixture (an
:class:`Engine`: plain rows in, the engine's collections out, and back). duotf runs it on its own
engines (local, Dask, Spark, and a process-pool backend found only through its entry point).

Running the suite on a third-party backend
------------------------------------------
1. Load the pytest plugin, in the project's top ``conftest.py``::

       pytest_plugins = ["duotf.testing.plugin"]

2. Declare the engines, in that ``conftest.py``, by implementing the plugin's hook: it returns
   the kinds of the ``backend`` fixture (its test ids) and the :class:`Engine` subclass of each,
   in the order they run::

       def pytest_duotf_engines(config):
           return {"mybackend": MyEngine}

   (:mod:`duotf.testing.engine` says how to implement an engine; one whose collections are
   lists of partitions subclasses :class:`LocalEngine` and overrides ``start`` only.)

3. Add one file per suite module that the backend should pass, e.g. ``tests/suite/test_feed.py``::

       from duotf.testing.suite.test_feed import *  # noqa: F401,F403

A test of some engines only says so with ``@pytest.mark.engines(...)`` (duotf's kinds: local,
procpool, dask, spark-local, spark-standalone); an engine of another name runs every test no such
marker keeps to those kinds. After every test the plugin's ``no_leaks`` fixture checks that no
node process, no new thread but an engine's, and no new listening port remains
(:mod:`duotf.testing.leaks`).

Importing this package imports neither pytest nor an engine (pyspark, distributed) nor
TensorFlow; psutil is imported where it is used.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Callable, List, Optional, TypeVar

from duotf.testing.engine import Engine, LocalEngine, Processes, TaskFailure, pandas_frames

if TYPE_CHECKING:
    import psutil

    from duotf._driver.cluster import Cluster

_T = TypeVar("_T")

__all__ = ["Engine", "LocalEngine", "Processes", "QUIET_TF", "SESSION_TAG", "TaskFailure",
           "node_processes", "pandas_frames", "poll_for", "shutdown_quietly"]

QUIET_TF = {"TF_CPP_MIN_LOG_LEVEL": "1"}
"""The environment of the suite's nodes: TensorFlow's C++ INFO notes hidden, as a run that sets
nothing has them (duotf's default), so that its runs and those that set no environment import
TensorFlow alike and share one warm node server per engine worker (another level, or
``CUDA_VISIBLE_DEVICES``, would start a second server in each, and nodes that import
TensorFlow themselves until it serves)."""

SESSION_TAG = "DUOTF_TEST_SESSION"
"""The environment variable that tags every process of one test session (the plugin sets it):
node processes inherit it on every engine, so the leak check counts only this session's nodes
while other test sessions run on the machine."""


def poll_for(predicate: Callable[[], _T], timeout: float, interval: float = 0.05,
             what: str = "condition") -> _T:
    """Poll ``predicate`` until it is truthy; fail the test after ``timeout`` seconds.

    Parameters
    ----------
    predicate : callable
        Called with no argument until it returns a truthy value.
    timeout : float
        Seconds before the test fails.
    interval : float
        Seconds between two calls.
    what : str
        What is waited for, for the error.

    Returns
    -------
    object
        The predicate's truthy value.

    Raises
    ------
    AssertionError
        When ``timeout`` seconds passed first.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        time.sleep(interval)


def node_processes(tag: Optional[str] = None) -> List[psutil.Process]:
    """This session's duotf node processes, and the TensorBoard processes they started.

    Parameters
    ----------
    tag : str, optional
        The session's ``SESSION_TAG`` value; by default this process's. A process whose
        environment cannot be read counts; without any tag, every node process counts.

    Returns
    -------
    list of psutil.Process
    """
    import psutil

    tag = tag if tag is not None else os.environ.get(SESSION_TAG)
    found = []
    for pid, cmdline in _command_lines():
        if "duotf._node.child" not in cmdline and "tensorboard.main" not in cmdline:
            continue
        try:
            proc = psutil.Process(pid)
            ours = tag is None or proc.environ().get(SESSION_TAG) == tag
        except psutil.NoSuchProcess:
            continue
        except psutil.AccessDenied:
            ours = True
        if ours:
            found.append(proc)
    return found


def _command_lines():
    """``(pid, argv)`` of each process of this host: read from /proc where there is one (the
    leak check after every test calls it: a third of the time of psutil's scan, which reads
    each process's status too), else from psutil."""
    import psutil

    if not os.path.isdir("/proc/self"):
        for proc in psutil.process_iter(["pid", "cmdline"]):
            yield proc.info["pid"], proc.info.get("cmdline") or []
        return
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                raw = f.read()
        except OSError:  # gone, or not ours to read
            continue
        yield int(name), raw.decode(errors="replace").split("\0")


def shutdown_quietly(cluster: Cluster, grace_secs: float = 0.0) -> None:
    """Shut ``cluster`` down for a test's ``finally`` block: every node stopped and every
    process, thread and port released, as ``cluster.shutdown`` does; what shutdown raises then
    (a node failure the test already saw, :class:`~duotf.errors.NodesStoppedError`) is dropped,
    so that it never hides the test's own error.

    Parameters
    ----------
    cluster : duotf.Cluster
    grace_secs : float
        Seconds each ``main`` is given to return before it is stopped.
    """
    from duotf._driver.cluster import shutdown_quietly as quietly  # the atexit sweep's own

    quietly(cluster, grace_secs)
