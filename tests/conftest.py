"""Session-scoped engines for the shared suite, and the leak check that runs after every test.

``backend`` is parametrized over every engine duotf supports; a test that takes it is written
once and runs on all of them. pytest finishes one parameter's tests (and tears its engine down)
before it starts the next, so the two Spark sessions never overlap in this process.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import cloudpickle
import psutil
import pytest

import duotf
import duotf.backends
from tests.suite import mains

# The test-only "procpool" backend (tests/procpool_backend.py) is known to duotf through nothing
# but the entry point of its dist-info folder here, as an installed plugin would be.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugins"))

# Node programs travel by value, so executors never need to import the tests package.
cloudpickle.register_pickle_by_value(mains)

BACKENDS = ["local", "procpool", "dask", "spark-local", "spark-standalone"]
# Free slots beside 2 nodes: what the feed tests need; the slot tests ask backend.slots().
QUIET_TF = {"TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}


def poll_for(predicate, timeout: float, interval: float = 0.05, what: str = "condition"):
    """Poll ``predicate`` until it is truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        time.sleep(interval)


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


@pytest.fixture(scope="session")
def spark_standalone_master():
    """A real standalone master and 2 workers of 2 cores on 127.0.0.1; yields the master URL.

    Each executor has 2 task slots: one for its node, one for the tasks that feed it.
    """
    root = tempfile.mkdtemp(prefix="duotf-spark-")
    env = dict(
        os.environ,
        SPARK_HOME=_spark_home(),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        SPARK_NO_DAEMONIZE="1",
        SPARK_LOG_DIR=root,
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
        for i in range(2):
            log = os.path.join(root, f"worker{i}.log")
            procs.append(_start_java(
                ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--port", "0",
                 "--webui-port", "0", "--cores", "2", "--memory", "2g",
                 "--work-dir", os.path.join(root, f"work{i}"), url], log, env,
            ))
        for i in range(2):
            log = os.path.join(root, f"worker{i}.log")
            poll_for(lambda: "Successfully registered with master" in _read(log), 90, 0.1,
                     f"Spark worker {i} registration")
        yield url
    finally:
        for proc in reversed(procs):
            _stop_process_group(proc)
        shutil.rmtree(root, ignore_errors=True)


def _spark_session(master: str, **conf):
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName("duotf-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config("spark.pyspark.python", sys.executable)
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


# -- the shared-suite backends ------------------------------------------------------------------
@pytest.fixture(scope="session", params=BACKENDS)
def backend(request):
    """A duotf Backend on a real engine with room for 2 nodes and for the tasks feeding them."""
    kind = request.param
    if kind == "local":
        yield duotf.backends.LocalBackend(slots=4)
    elif kind == "procpool":  # by name, through the registry and its entry point
        backend = duotf.backends.resolve_backend("procpool")[0]  # a pool of 4 worker processes
        try:
            yield backend
        finally:
            backend.close()
    elif kind == "dask":
        from distributed import Client, LocalCluster

        with LocalCluster(
            n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None,
            host="127.0.0.1",
        ) as cluster, Client(cluster) as client:
            yield duotf.backends.resolve_backend(client)[0]
    else:
        from duotf.backends.spark import SparkBackend

        if kind == "spark-local":
            session = _spark_session("local[3]")  # 2 nodes + 1 slot to feed them
        else:
            url = request.getfixturevalue("spark_standalone_master")
            session = _spark_session(url, **{"spark.executor.cores": "2", "spark.executor.memory": "1g"})
        try:
            backend = SparkBackend(session, slot_wait=3.0)
            expected = 3 if kind == "spark-local" else 4  # every executor registered
            poll_for(lambda: backend.slots() >= expected, 90, 0.2, "Spark executors")
            yield backend
        finally:
            session.stop()


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


@pytest.fixture
def backend_kind(backend, request):
    return request.node.callspec.params["backend"]


# -- leak check ---------------------------------------------------------------------------------
# Node processes inherit this from the engines this session starts (and its own process): the
# leak check counts this session's nodes only, never those of a test run or benchmark beside it.
SESSION_TAG = os.environ.setdefault("DUOTF_TEST_SESSION", f"{os.getpid()}-{time.time_ns()}")


def _node_processes():
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if "duotf._child" in cmdline:
            try:
                if proc.environ().get("DUOTF_TEST_SESSION") == SESSION_TAG:
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
    return found


def _duotf_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith("duotf-")]


def _listening_ports():
    return {
        c.laddr.port for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    }


@pytest.fixture(autouse=True)
def no_leaks(request):
    """After each test: no node process, no duotf thread, no new listening port remains."""
    before = _listening_ports()
    yield
    poll_for(lambda: not _node_processes(), 15, what="no duotf node process left")
    poll_for(lambda: not _duotf_threads(), 15, what=f"no duotf thread left ({_duotf_threads()})")
    leaked = _listening_ports() - before
    assert not leaked, f"listening ports left open: {sorted(leaked)}"
