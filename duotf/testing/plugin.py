"""The pytest plugin that runs duotf's shared suite on the engines a project declares.

Load it with ``pytest_plugins = ["duotf.testing.plugin"]`` in the project's top ``conftest.py``,
and declare the engines there with the ``pytest_duotf_engines`` hook (:class:`EngineHooks`).
It provides:

- ``backend``: session-scoped, parametrized over the declared engines (the test id is the
  engine's kind): a duotf Backend with room for 2 nodes and for the tasks feeding them;
- ``engine``: the :class:`~duotf.testing.Engine` under ``backend``;
- the markers ``engines(*kinds)`` (run a test on these kinds only),
  ``also_on(*kinds)`` (run it on these opt-in kinds too: an engine whose ``opt_in`` is true
  runs only the tests that name it) and ``xfail_on(*kinds, reason=...)`` (a strict xfail on
  these kinds);
- ``scoring_models``: the tiny saved Keras models of the scoring tests;
- ``no_leaks``: autouse, the leak check of :mod:`duotf.testing.leaks` after every test (a
  project overrides it with a fixture of that name).

pytest finishes one parameter's tests (and tears its engine down) before it starts the next:
the one fixture holds one engine at a time, so two engines of one kind (two Spark sessions)
never overlap in the test process. Importing this plugin tags this process's environment with
``SESSION_TAG`` (every process the session starts inherits it) and registers the suite's node
programs (:mod:`duotf.testing.suite.mains`) to be pickled by value, with cloudpickle and with
pyspark's copy of it when pyspark is installed, so executors never import the suite.
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import tempfile
import threading
import time
import warnings
from typing import Dict, List, Optional, Type

import cloudpickle
import pytest

from duotf.testing import SESSION_TAG, Engine, node_processes, poll_for
from duotf.testing.leaks import describe_threads, duotf_temp_dirs, leaked_threads, listening_ports
from duotf.testing.suite import mains

__all__ = ["EngineHooks", "SUITE_KINDS", "engines_of"]


def _tag_this_session() -> None:
    """Tag this test process's environment with ``SESSION_TAG``, which every process it starts
    inherits. A process that imports this module again (a spawned worker) keeps its parent's
    tag. A pytest-xdist worker (``PYTEST_XDIST_WORKER``) gets a tag of its own, not its
    controller's, and a temp folder of its own (``TMPDIR``, and ``SPARK_LOCAL_DIRS`` for Spark's
    JVMs, which the processes it starts inherit): the leak check after each test then sees
    only its own worker's node processes and duotf directories, not those of the tests beside
    it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker or os.environ.get(SESSION_TAG, "").startswith(f"{worker}/"):
        os.environ.setdefault(SESSION_TAG, f"{os.getpid()}-{time.time_ns()}")
        return
    os.environ[SESSION_TAG] = f"{worker}/{os.getpid()}-{time.time_ns()}"
    folder = tempfile.mkdtemp(prefix=f"pytest-duotf-{worker}-")
    os.environ["TMPDIR"] = folder
    # and Spark's JVMs their local dirs there (their java.io.tmpdir is /tmp whatever TMPDIR
    # says), where the frames a feed keeps lie: a standalone worker started here inherits it
    os.environ.setdefault("SPARK_LOCAL_DIRS", folder)
    tempfile.tempdir = None  # found again from TMPDIR
    _worker_temp.append(folder)


_worker_temp: List[str] = []  # the temp folder this xdist worker made, removed at its end
_tag_this_session()

cloudpickle.register_pickle_by_value(mains)
try:  # and so do the functions Spark pickles itself (UDFs), with its own copy of cloudpickle
    import pyspark.cloudpickle

    pyspark.cloudpickle.register_pickle_by_value(mains)
except ImportError:
    pass

#: the kinds the shipped suite's ``engines(...)`` markers name: duotf's own engines
SUITE_KINDS = ("local", "procpool", "dask", "spark-local", "spark-standalone", "spark-connect",
               "spark-hosts", "dask-hosts")

_ENGINES = pytest.StashKey[Dict[str, Type[Engine]]]()
_running: dict = {}  # kind -> the Engine the backend fixture holds now


class EngineHooks:
    """The hook a project implements in its ``conftest.py`` to declare its engines."""

    @pytest.hookspec(firstresult=True)
    def pytest_duotf_engines(self, config: pytest.Config) -> Optional[Dict[str, Type[Engine]]]:
        """The engines of the ``backend`` fixture: kind (the test id) -> :class:`Engine`
        subclass, in the order they run.

        Parameters
        ----------
        config : pytest.Config

        Returns
        -------
        dict of str to type
        """


def pytest_addhooks(pluginmanager):
    pluginmanager.add_hookspecs(EngineHooks)


def engines_of(config: pytest.Config) -> Dict[str, Type[Engine]]:
    """The engines the project declares (``pytest_duotf_engines``), asked once a session."""
    if _ENGINES not in config.stash:
        found = config.hook.pytest_duotf_engines(config=config)
        if not found:
            raise pytest.UsageError("duotf.testing.plugin: no engines; implement "
                                    "pytest_duotf_engines(config) in conftest.py")
        config.stash[_ENGINES] = dict(found)
    return config.stash[_ENGINES]


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "engines(*kinds): run this test on these kinds of the backend fixture only")
    config.addinivalue_line(
        "markers", "also_on(*kinds): run this test on these opt-in kinds of the backend fixture "
        "too (an engine whose opt_in is true runs only the tests that name it)")
    config.addinivalue_line(
        "markers", "xfail_on(*kinds, reason): a known defect of these kinds of the backend "
        "fixture (a strict xfail: it fails once the defect is fixed, to be removed then)")
    # shown in the warnings summary, never an error, whatever the project's filters say
    config.addinivalue_line("filterwarnings", "always::duotf.testing.plugin.EngineMended")
    # pytest-xdist registers it too; without xdist the mark the hook below adds is inert
    config.addinivalue_line(
        "markers", "xdist_group(name): pytest-xdist's --dist loadgroup runs a group on one worker")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    """The xdist worker's temp folder goes once its engines are down (they end in the session's
    last teardown, before this; a worker's process is ended before its unconfigure runs)."""
    while _worker_temp:
        shutil.rmtree(_worker_temp.pop(), ignore_errors=True)


def pytest_generate_tests(metafunc):
    if "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend", list(engines_of(metafunc.config)), indirect=True,
                             scope="session")


@pytest.fixture(scope="session")
def backend(request):
    """A duotf Backend on a real engine with room for 2 nodes and for the tasks feeding them."""
    kind = request.param
    with engines_of(request.config)[kind].start(request) as engine:
        _running[kind] = engine
        try:
            yield engine.backend
        finally:
            del _running[kind]


class EngineMended(UserWarning):
    """An engine did not replace a process a test killed, and the suite mended it."""


@pytest.fixture(autouse=True)
def _whole_engine(request):
    """Before a test on a running engine: the engine mended to its full size (a warning says
    what was mended: the engine did not replace what an earlier test killed)."""
    kind = getattr(getattr(request.node, "callspec", None), "params", {}).get("backend")
    if kind in _running:
        mended = _running[kind].mend()
        if mended:
            warnings.warn(f"{kind}: {mended}", EngineMended, stacklevel=1)


@pytest.fixture
def engine(backend, request) -> Engine:
    """The engine under ``backend``: plain data in, the engine's collections out, and back."""
    return _running[request.node.callspec.params["backend"]]


def _kind_in(item, marker) -> bool:
    """Whether ``item`` runs on one of the kinds ``marker`` names (which it checks)."""
    kinds = set(marker.args)
    known = [*engines_of(item.config), *(k for k in SUITE_KINDS if k not in engines_of(item.config))]
    if not kinds or kinds - set(known):
        raise pytest.UsageError(f"{item.nodeid}: {marker.name}{marker.args}: kinds are {known}")
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "backend" not in params:
        raise pytest.UsageError(f"{item.nodeid}: {marker.name} needs the backend fixture")
    return params["backend"] in kinds


def _runs_on(item) -> bool:
    """Whether ``item`` runs on its ``backend`` kind: every kind its ``engines`` marker names
    (every kind without one), but an opt-in kind only where ``engines`` or ``also_on`` names it."""
    marker = item.get_closest_marker("engines")
    if marker is not None and not _kind_in(item, marker):
        return False
    kind = getattr(getattr(item, "callspec", None), "params", {}).get("backend")
    engine = engines_of(item.config).get(kind) if kind is not None else None
    if engine is None or not engine.opt_in:
        return True
    also = item.get_closest_marker("also_on")
    return marker is not None or (also is not None and _kind_in(item, also))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """``engines(...)`` deselects a test on the other engines, and an opt-in engine runs only
    the tests that name it (``engines`` or ``also_on``); ``xfail_on(...)`` marks a test a
    strict xfail on the engines named. All keep the one ``backend`` fixture, so each engine is
    still started once and two engines of one kind never overlap.

    Under pytest-xdist's ``--dist loadgroup`` the tests of one engine are one group
    (``xdist_group(kind)``, unless a test names its own), run by one worker: each engine starts
    once in a run, as without xdist (marked first, before xdist reads the groups)."""
    kept: List[pytest.Item] = []
    dropped: List[pytest.Item] = []
    for item in items:
        kind = getattr(getattr(item, "callspec", None), "params", {}).get("backend")
        if kind is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(kind))
        for marker in item.iter_markers("xfail_on"):
            if _kind_in(item, marker):
                item.add_marker(pytest.mark.xfail(reason=marker.kwargs["reason"], strict=True))
        (kept if _runs_on(item) else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(scope="session")
def scoring_models(tmp_path_factory):
    """For the scoring tests: a tiny Keras model (4 values a row -> 1, and -> 3) saved as .keras
    and exported as a SavedModel; the rows; what model.predict gives for them."""
    import keras
    import numpy as np

    from duotf.testing.suite.data import SCORING_ROWS, SCORING_WIDTH

    keras.utils.set_random_seed(3)
    folder = tmp_path_factory.mktemp("models")
    inputs = keras.Input((SCORING_WIDTH,), name="features")
    hidden = keras.layers.Dense(3, activation="tanh")(inputs)
    scalar = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    vector = keras.Model(inputs, hidden)
    scalar.save(folder / "scalar.keras")
    vector.save(folder / "vector.keras")
    scalar.export(str(folder / "scalar_sm"), verbose=False)
    x = np.random.default_rng(0).normal(size=(SCORING_ROWS, SCORING_WIDTH)).astype("float32")
    return {"keras": str(folder / "scalar.keras"), "savedmodel": str(folder / "scalar_sm"),
            "vector": str(folder / "vector.keras"), "x": x,
            "expected": scalar.predict(x, verbose=0)[:, 0],
            "expected_vector": vector.predict(x, verbose=0)}


@pytest.fixture(autouse=True)
def no_leaks(request):
    """After each test: no node process, no new thread but an engine's, no new listening port
    and no new duotf directory in the temp folder remains."""
    before = listening_ports()
    threads = set(threading.enumerate())
    dirs = duotf_temp_dirs()
    yield
    poll_for(lambda: not node_processes(), 15, what="no duotf node or TensorBoard process left")
    # A Cluster's node logs (and, unshut, its checkpoint folder) go when it is collected, once
    # its threads let it go; a node's agent on another process may still be removing its own.
    # The records pytest captured keep their tracebacks, and so a failed job's frames, until
    # after this fixture: their text is formatted already, the objects are let go here.
    _forget_captured_tracebacks(request.node)
    if duotf_temp_dirs() - dirs:  # about one test in seven: a failed job's cycles
        gc.collect()
    deadline = time.monotonic() + 15
    while duotf_temp_dirs() - dirs and time.monotonic() < deadline:
        time.sleep(0.2)
        gc.collect()
    left = sorted(duotf_temp_dirs() - dirs)
    assert not left, f"duotf directories left in the temp folder: {left}"
    leaked = leaked_threads(threads)
    assert not leaked, describe_threads(leaked)
    ports = listening_ports() - before
    assert not ports, f"listening ports left open: {sorted(ports)}"


def _forget_captured_tracebacks(item) -> None:
    """Drop the exception objects of the log records pytest captured for ``item``, as
    ``exc_info`` or as an argument of the message (its ``caplog`` and report keep the text)."""
    try:
        from _pytest.logging import caplog_records_key
    except ImportError:  # a pytest without it: the records keep theirs
        return
    for records in item.stash.get(caplog_records_key, {}).values():
        for record in records:
            if record.exc_info:
                if not record.exc_text:
                    record.exc_text = logging.Formatter().formatException(record.exc_info)
                record.exc_info = None
            if isinstance(record.args, tuple) and any(isinstance(a, BaseException) for a in record.args):
                record.msg, record.args = record.getMessage(), ()
