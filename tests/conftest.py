"""Session-scoped engines for the shared suite, and the leak check that runs after every test.

``backend`` is parametrized over every engine of ``tests/engines.py``; a test that takes it is
written once and runs on all of them, and takes ``engine`` for the engine's collections. pytest
finishes one parameter's tests (and tears its engine down) before it starts the next: the one
fixture holds one engine at a time, so the two Spark sessions never overlap in this process.
A test of some engines only keeps this fixture and says so with ``@pytest.mark.engines(...)``.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import cloudpickle
import psutil
import pytest

from tests.engines import ENGINES, Engine, poll_for
from tests.suite import mains

# The test-only "procpool" backend (tests/procpool_backend.py) is known to duotf through nothing
# but the entry point of its dist-info folder here, as an installed plugin would be.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugins"))

# Node programs travel by value, so executors never need to import the tests package.
cloudpickle.register_pickle_by_value(mains)
try:  # and so do the functions Spark pickles itself (UDFs), with its own copy of cloudpickle
    import pyspark.cloudpickle

    pyspark.cloudpickle.register_pickle_by_value(mains)
except ImportError:
    pass

BACKENDS = list(ENGINES)
# Free slots beside 2 nodes: what the feed tests need; the slot tests ask backend.slots().
QUIET_TF = {"TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}


# -- Spark standalone --------------------------------------------------------------------------
def _spark_home() -> str:
    import pyspark

    return os.path.dirname(pyspark.__file__)


def _start_java(args, log_path, env):
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [os.path.join(_spark_home(), "bin", "spark-class"), *args],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )
    log.close()
    return proc


def _read(path: str) -> str:
    with open(path, "rb") as f:
        return f.read().decode(errors="replace")


def _stop_process_group(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


_master_logs: dict = {}


@pytest.fixture(scope="session")
def spark_standalone_master():
    """A real standalone master and 2 workers of 3 cores on 127.0.0.1; yields the master URL.

    The suite's application takes an executor of 2 cores on each worker (2 task slots: one for
    its node, one for the tasks that feed it); 1 core a worker is left for a second application
    (the README's spark-submit command).
    """
    yield from _standalone_cluster(workers=2, cores=3)


#: what each worker of ``spark_gpu_master`` says it has: 2 GPUs that do not exist
FAKE_GPUS = '{"name": "gpu", "addresses": ["0", "1"]}'


@pytest.fixture
def spark_gpu_master(tmp_path):
    """A second standalone master with 1 worker of 3 cores and 2 fake GPUs (a discovery script
    prints ``FAKE_GPUS``); yields ``(master URL, discovery script)``. One test uses it (the
    README's GPU block): started once, and its JVMs live no longer than that test."""
    script = tmp_path / "fake_gpus.sh"
    script.write_text(f"#!/bin/sh\necho '{FAKE_GPUS}'\n")
    script.chmod(0o755)
    opts = (f"-Dspark.worker.resource.gpu.amount=2 "
            f"-Dspark.worker.resource.gpu.discoveryScript={script}")
    for url in _standalone_cluster(workers=1, cores=3, env={"SPARK_WORKER_OPTS": opts}):
        yield url, str(script)


def _standalone_cluster(workers: int, cores: int, env: dict = None):
    """Start a standalone master and ``workers`` workers of ``cores`` cores on 127.0.0.1 (with
    ``env`` added to their environment), yield the master URL, stop them all."""
    root = tempfile.mkdtemp(prefix="duotf-spark-")
    env = dict(
        os.environ,
        SPARK_HOME=_spark_home(),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        SPARK_NO_DAEMONIZE="1",
        SPARK_LOG_DIR=root,
        **(env or {}),
    )
    procs = []
    try:
        master_log = os.path.join(root, "master.log")
        procs.append(_start_java(
            ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0",
             "--webui-port", "0"], master_log, env,
        ))

        def master_url():
            if procs[0].poll() is not None:
                raise RuntimeError("Spark master exited:\n" + _read(master_log)[-3000:])
            found = re.search(r"Starting Spark master at (spark://\S+)", _read(master_log))
            return found and found.group(1)

        url = poll_for(master_url, 90, 0.1, "Spark master start")
        for i in range(workers):
            log = os.path.join(root, f"worker{i}.log")
            procs.append(_start_java(
                ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--port", "0",
                 "--webui-port", "0", "--cores", str(cores), "--memory", "2g",
                 "--work-dir", os.path.join(root, f"work{i}"), url], log, env,
            ))
        for i in range(workers):
            log = os.path.join(root, f"worker{i}.log")
            poll_for(lambda: "Successfully registered with master" in _read(log), 90, 0.1,
                     f"Spark worker {i} registration")
        _master_logs[url] = master_log
        yield url
    finally:
        for proc in reversed(procs):
            _stop_process_group(proc)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def spark_standalone_master_log(spark_standalone_master) -> str:
    """The standalone master's log file (which applications registered)."""
    return _master_logs[spark_standalone_master]


# -- the shared-suite backends ------------------------------------------------------------------
_running: dict = {}  # kind -> the Engine the backend fixture holds now


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request):
    """A duotf Backend on a real engine with room for 2 nodes and for the tasks feeding them."""
    with ENGINES[request.param].start(request) as engine:
        _running[request.param] = engine
        try:
            yield engine.backend
        finally:
            del _running[request.param]


@pytest.fixture
def engine(backend, request) -> Engine:
    """The engine under ``backend``: plain data in, the engine's collections out, and back."""
    return _running[request.node.callspec.params["backend"]]


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "engines(*kinds): run this test on these kinds of the backend fixture only")
    config.addinivalue_line(
        "markers", "xfail_on(*kinds, reason): a known defect of these kinds of the backend "
        "fixture (a strict xfail: it fails once the defect is fixed, to be removed then)")


def _kind_in(item, marker) -> bool:
    """Whether ``item`` runs on one of the kinds ``marker`` names (which it checks)."""
    kinds = set(marker.args)
    if not kinds or kinds - set(ENGINES):
        raise pytest.UsageError(f"{item.nodeid}: {marker.name}{marker.args}: kinds are {list(ENGINES)}")
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "backend" not in params:
        raise pytest.UsageError(f"{item.nodeid}: {marker.name} needs the backend fixture")
    return params["backend"] in kinds


def pytest_collection_modifyitems(config, items):
    """``engines(...)`` deselects a test on the other engines; ``xfail_on(...)`` marks it a
    strict xfail on the engines named. Both keep the one ``backend`` fixture, so each engine is
    still started once and the two Spark sessions never overlap."""
    kept, dropped = [], []
    for item in items:
        for marker in item.iter_markers("xfail_on"):
            if _kind_in(item, marker):
                item.add_marker(pytest.mark.xfail(reason=marker.kwargs["reason"], strict=True))
        marker = item.get_closest_marker("engines")
        (dropped if marker is not None and not _kind_in(item, marker) else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(scope="module")
def spark():
    """A SparkSession for tests outside the shared suite: the suite's own, when one is active,
    else a local[2] session for this module."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        yield active  # the shared suite's session, stopped by its own fixture
        return
    session = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def scoring_models(tmp_path_factory):
    """For the scoring tests: a tiny Keras model (4 values a row -> 1, and -> 3) saved as .keras
    and exported as a SavedModel; the rows; what model.predict gives for them."""
    import keras
    import numpy as np

    from tests.suite.data import SCORING_ROWS, SCORING_WIDTH

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


# -- leak check ---------------------------------------------------------------------------------
# Every process this test session starts inherits the tag, node processes included on every
# engine (setdefault: a process that imports this module again keeps its parent's), so the leak
# check counts only this session's nodes while other test sessions run on the machine.
SESSION_TAG = "DUOTF_TEST_SESSION"
os.environ.setdefault(SESSION_TAG, f"{os.getpid()}-{time.time_ns()}")


def _node_processes():
    """This session's duotf node processes, and the TensorBoard processes they started (one
    whose environment cannot be read counts)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if "duotf._node.child" not in cmdline and "tensorboard.main" not in cmdline:
            continue
        try:
            ours = proc.environ().get(SESSION_TAG) == os.environ[SESSION_TAG]
        except psutil.NoSuchProcess:
            continue
        except psutil.AccessDenied:
            ours = True
        if ours:
            found.append(proc)
    return found


# Threads that an engine or library starts and keeps for the life of the process: told by the
# module whose code they run (py4j's connections and callback server, the Dask client's event
# loop), or by name where their code is the standard library's: Dask's offload pool, fsspec's
# IO loop ("fsspecIO", asyncio code) and that loop's default executor ("asyncio_N"; duotf uses
# no asyncio), and a multiprocessing queue's feeder ("QueueFeederThread": a Dask nanny that
# restarts a killed worker process talks to the new one through such a queue, for its life).
# The test process pool's executor manager is the engine's too ("concurrent.futures.process":
# duotf runs no process pool; the pool replaces an executor that a killed worker broke).
_ENGINE_MODULES = ("py4j.", "pyspark.", "distributed.", "dask.", "tornado.", "tensorflow.",
                   "concurrent.futures.process")
_ENGINE_NAMES = ("Dask-Offload_", "fsspecIO", "asyncio_", "QueueFeederThread")


def _code_of(thread: threading.Thread) -> str:
    """The module of the code a thread runs: its target's, or its Thread subclass's."""
    target = getattr(thread, "_target", None)
    while isinstance(target, functools.partial):
        target = target.func
    return getattr(target, "__module__", None) or type(thread).__module__


def _kept_by_an_engine(thread: threading.Thread) -> bool:
    return _code_of(thread).startswith(_ENGINE_MODULES) or thread.name.startswith(_ENGINE_NAMES)


def leaked_threads(before, grace: float = 15.0) -> list:
    """The threads alive now that were not in ``before`` and that no engine keeps, once each
    had up to ``grace`` seconds to end (as dask/distributed's ``check_thread_leak``)."""
    deadline = time.monotonic() + grace
    while True:
        leaked = [t for t in threading.enumerate() if t not in before and not _kept_by_an_engine(t)]
        if not leaked or time.monotonic() > deadline:
            return leaked
        time.sleep(0.05)


def describe_threads(threads) -> str:
    """Each thread's name, the module it runs and where it is now."""
    frames = sys._current_frames()
    lines = [f"{len(threads)} thread(s) left running:"]
    for thread in threads:
        frame = frames.get(thread.ident)
        where = "".join(traceback.format_stack(frame, limit=4)) if frame is not None else "  (ended)\n"
        lines.append(f"- {thread.name!r}, running {_code_of(thread)} code, at:\n{where}")
    return "\n".join(lines)


def _listening_ports():
    return {
        c.laddr.port for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    }


@pytest.fixture(autouse=True)
def no_leaks(request):
    """After each test: no node process, no new thread but an engine's, no new listening port
    remains."""
    before = _listening_ports()
    threads = set(threading.enumerate())
    yield
    poll_for(lambda: not _node_processes(), 15, what="no duotf node or TensorBoard process left")
    leaked = leaked_threads(threads)
    assert not leaked, describe_threads(leaked)
    leaked = _listening_ports() - before
    assert not leaked, f"listening ports left open: {sorted(leaked)}"
