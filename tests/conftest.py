"""The project's engines for the shared suite, and the Spark clusters some of them need.

The suite's fixtures (``backend``, ``engine``), its markers (``engines``, ``xfail_on``) and the
leak check after every test come from :mod:`duotf.testing.plugin`, as for any third-party
backend; this project declares its engines (tests/engines.py) with the plugin's hook, and
tests/suite/ holds one file a suite module. pytest finishes one engine's tests (and tears it
down) before it starts the next, so the two Spark sessions never overlap in this process.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import zlib

import pytest

from duotf.testing import QUIET_TF, poll_for  # noqa: F401 - tests import them from here
from tests import hosts
from tests.engines import ENGINES, EXECUTOR_C1

#: the job secret of the tests that speak duotf's wire or control channel without a cluster
#: (a real job draws 32 random bytes): one value, imported from here
SECRET = b"k" * 32

pytest_plugins = ["duotf.testing.plugin", "tests.timings"]

# The suite runs with the interpreter that runs it, activated or not (``.venv/bin/python -m
# pytest``): Spark's Python workers take PYSPARK_PYTHON (else whatever ``python3`` is first on
# PATH), and the commands the docs show (``python3 -m duotf ...``) run as a user's shell would
# find them in the activated environment. A PYSPARK_PYTHON the user set is kept.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
# The JVMs the suite starts compile with the client compiler only (tests/spark-conf: half the
# CPU of a JVM's start and a test's small jobs): Spark's drivers through the applications'
# configuration, the standalone masters and workers through their daemons' options (not the
# executors: tests/spark-conf/spark-defaults.conf says why).
os.environ.setdefault("SPARK_CONF_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                     "spark-conf"))
os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", "-XX:TieredStopAtLevel=1")
_BIN = os.path.dirname(sys.executable)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _BIN:
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")

# The test-only "procpool" backend (tests/procpool_backend.py) is known to duotf through nothing
# but the entry point of its dist-info folder here, as an installed plugin would be.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugins"))


def pytest_duotf_engines(config):
    """The ``backend`` fixture's kinds: every engine of tests/engines.py."""
    return ENGINES


# -- tiers: `python3 -m pytest` is the fast one, `python3 -m pytest --full` the whole matrix ----
#: the engines of the full tier alone: a real standalone cluster, Spark Connect on it, separate
#: hosts, and the procpool test double (what it proves, a backend found by its entry point, the
#: fast tier proves by name with tests/test_registry.py)
FULL_ENGINES = {"spark-standalone", "spark-connect", "spark-hosts", "dask-hosts", "procpool"}
#: fixtures that start clusters of the full tier alone
#: fixtures that start clusters and servers of the full tier alone (the MLflow server's venv is
#: made by .ci/run after the fast tier)
FULL_FIXTURES = {"spark_standalone_master", "spark_connect_server", "spark_hosts_master",
                 "dask_hosts_scheduler", "spark_gpu_master", "spark_standalone_master_log",
                 "mlflow_server", "spark_hosts_private_tmp"}
TIERS = ("fast", "full", "rest")
#: the engines of the fast tier, and the modules of the shared suite that run on each of them
#: there: the same weights on every engine. Every other test of the suite runs, in the fast
#: tier, on one of the fast engines it is collected for, the same one in every run (picked by
#: its name): every behaviour once, and each engine a share of them (what one engine alone
#: does, its own feed paths among it, is in tests/test_spark_*.py and tests/test_dask_*.py,
#: which run whole); the full tier runs each on every engine.
FAST_ENGINES = ("local", "dask", "spark-local")
ON_EVERY_FAST_ENGINE = {"test_determinism"}
#: modules of the full tier alone: they prove the docs, not a behaviour (every code block of the
#: README and the docs site run as a user copies it; the notebook guide), and each behaviour
#: they show has a case of its own in the fast tier
FULL_MODULES = {"test_readme", "test_notebook", "test_troubleshooting", "test_reference"}


def pytest_addoption(parser):
    group = parser.getgroup("duotf tiers")
    group.addoption("--full", action="store_const", const="full", dest="tier",
                    help="run the full matrix: every engine and every case (CI)")
    group.addoption("--tier", choices=TIERS, default="fast", dest="tier",
                    help="fast (the default): the in-process backend, Dask and Spark local[3], "
                         "every behaviour at least once, in minutes; full: every engine and "
                         "case; rest: the full tier less the fast one (CI runs fast, then rest)")


def _case(item) -> tuple:
    """What tells a test's cases apart but the engine: its module, function and other params."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    others = tuple(sorted((k, repr(v)) for k, v in params.items() if k != "backend"))
    return (item.module.__name__, getattr(item, "originalname", item.name), others)


def in_fast_tier(item, fast_engines_of) -> bool:
    """Whether ``item`` runs in the fast tier: not on an engine, nor with a cluster, of the full
    tier alone, not marked ``slow``, not in a module of ``FULL_MODULES``, and, for a test of the shared suite outside
    ``ON_EVERY_FAST_ENGINE``, on the one fast engine picked for it. ``fast_engines_of(item)``:
    the fast engines its cases are collected for."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    engine = params.get("backend")
    if engine in FULL_ENGINES:
        return False
    if FULL_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return False
    if item.get_closest_marker("slow") is not None:
        return False
    if item.module.__name__.rsplit(".", 1)[-1] in FULL_MODULES:
        return False
    if engine is None or item.module.__name__.rsplit(".", 1)[-1] in ON_EVERY_FAST_ENGINE:
        return True
    engines = sorted(fast_engines_of(item))
    picked = engines[zlib.crc32(repr(_case(item)).encode()) % len(engines)]
    return engine == picked


#: the cluster fixtures, and the engine whose worker runs the tests that use them outside the
#: shared suite (pytest-xdist's loadgroup): a cluster starts in one worker, not in each
FIXTURE_GROUPS = {"spark_connect_server": "spark-connect",
                  "spark_standalone_master": "spark-standalone",
                  "spark_hosts_master": "hosts", "dask_hosts_scheduler": "hosts",
                  "spark_hosts_private_tmp": "hosts"}


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook (the dev extra installs it)
def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (setup.cfg): a worker a core and one more, at least 2 and at most 5. The
    tests wait on JVMs, node processes and sockets more than they compute: on 2 workers of a
    2-core machine the cores were idle a quarter of the time, and a third worker took the fast
    tier from 7.3 to 6.1 minutes and the rest tier from 35.5 to 16.4 (with the standalone and
    Connect engines in groups of their own). Each engine group starts once, in one worker;
    more workers than groups only share the tests outside them.
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` or ``-n N`` sets it; ``-n 0`` runs in this process."""
    return max(2, min((os.cpu_count() or 1) + 1, 5))


#: engines whose tests share one xdist group: each engine's own (the standalone cluster's two
#: applications apart: the session fixture starts a cluster in each worker that uses it, and
#: the two groups, the longest of the rest tier, run side by side), and the two kinds of
#: separate hosts, whose networks of namespaces (the same host names, cut and killed by the
#: tests) never run side by side
ENGINE_GROUPS = {"spark-standalone": "spark-standalone", "spark-connect": "spark-connect",
                 "spark-hosts": "hosts", "dask-hosts": "hosts"}


def pytest_itemcollected(item):
    params = getattr(getattr(item, "callspec", None), "params", {})
    if params.get("backend") in ENGINE_GROUPS:
        item.add_marker(pytest.mark.xdist_group(ENGINE_GROUPS[params["backend"]]))
        return
    if "backend" in params or item.get_closest_marker("xdist_group") is not None:
        return  # the plugin groups the shared suite's by engine
    for fixture, group in FIXTURE_GROUPS.items():
        if fixture in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(group))
            return


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    tier = config.getoption("tier") or "fast"
    if tier == "full":
        return
    engines: dict = {}
    for item in items:
        engine = getattr(getattr(item, "callspec", None), "params", {}).get("backend")
        if engine in FAST_ENGINES:
            engines.setdefault(_case(item), set()).add(engine)
    kept, dropped = [], []
    for item in items:
        fast = in_fast_tier(item, lambda i: engines[_case(i)])
        (kept if fast == (tier == "fast") else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


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
    """A real standalone master and 2 workers of 5 cores on 127.0.0.1; yields the master URL.

    The suite's classic application takes an executor of 2 cores on each worker (2 task slots:
    one for its node, one for the tasks that feed it), the Spark Connect server's application
    (``spark_connect_server``) as many; 1 core a worker is left for a third application (the
    spark-submit commands of tests/test_readme.py and tests/suite/test_example.py).
    """
    yield from standalone_cluster(workers=2, cores=5)


#: what each worker of ``spark_gpu_master`` says it has: 2 GPUs that do not exist
FAKE_GPUS = '{"name": "gpu", "addresses": ["0", "1"]}'


@pytest.fixture
def spark_gpu_master(tmp_path):
    """A second standalone master with 1 worker of 3 cores and 2 fake GPUs (a discovery script
    prints ``FAKE_GPUS``); yields ``(master URL, discovery script)``. One test uses it (the
    GPU block of docs/guides/gpus.md): started once, and its JVMs live no longer than that test."""
    script = tmp_path / "fake_gpus.sh"
    script.write_text(f"#!/bin/sh\necho '{FAKE_GPUS}'\n")
    script.chmod(0o755)
    opts = (f"-Dspark.worker.resource.gpu.amount=2 "
            f"-Dspark.worker.resource.gpu.discoveryScript={script}")
    for url in standalone_cluster(workers=1, cores=3, env={"SPARK_WORKER_OPTS": opts}):
        yield url, str(script)


def standalone_cluster(workers: int, cores: int, env: dict = None):
    """Start a standalone master and ``workers`` workers of ``cores`` cores on 127.0.0.1 (with
    ``env`` added to their environment), yield the master URL, stop them all. The benchmarks
    start theirs with it too (``benchmarks.one_pass --standalone``)."""
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
                 "--webui-port", "0", "--cores", str(cores), "--memory", "4g",
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


# -- separate hosts (network namespaces: tests/hosts.py) -----------------------------------------
def _hosts_or_skip():
    why = hosts.unavailable()
    if why and os.environ.get("DUOTF_HOSTS_REQUIRED"):  # CI (.ci/run): they must run
        pytest.fail(f"DUOTF_HOSTS_REQUIRED is set, but no separate hosts can be made: {why}")
    if why:
        pytest.skip(f"no separate hosts here: {why}")
    return hosts


@pytest.fixture(scope="session")
def spark_hosts_master():
    """A standalone master on a bridge's address and a worker of 4 cores on each of 2 separate
    hosts (tests/hosts.py): the suite's application takes 2 on each, a fresh one the other 2;
    yields ``(network, master URL)``."""
    hosts = _hosts_or_skip()
    with hosts.Network(2) as net, hosts.spark_cluster(net, cores=4) as url:
        yield net, url


@pytest.fixture
def spark_hosts_private_tmp():
    """A standalone master on a bridge's address and a worker of 2 cores on each of 2 separate
    hosts that, as machines do, have a ``/tmp`` of their own (``Network(private_tmp=True)``);
    yields ``(network, master URL)``. The Getting started test's alone: its JVMs live no longer
    than that test."""
    hosts = _hosts_or_skip()
    with hosts.Network(2, private_tmp=True) as net, hosts.spark_cluster(net, cores=2) as url:
        yield net, url


@pytest.fixture(scope="session")
def dask_hosts_scheduler():
    """A Dask scheduler on a bridge's address and a worker (with its nanny) of 2 threads on
    each of 2 separate hosts (tests/hosts.py); yields ``(network, scheduler address)``."""
    hosts = _hosts_or_skip()
    with hosts.Network(2) as net, hosts.dask_cluster(net, threads=2) as address:
        yield net, address


@pytest.fixture(autouse=True)
def _classic_pyspark_outside_connect_tests(request):
    """pyspark marks the whole process "remote" (``SPARK_CONNECT_MODE_ENABLED``) once a Spark
    Connect session starts: its functions and ML classes then take the Connect path, and so
    would a classic session made here or a ``spark-submit`` this process starts. Unmarked for
    every test but those of the ``spark-connect`` engine and those of its server."""
    callspec = getattr(request.node, "callspec", None)
    if (callspec is not None and callspec.params.get("backend") == "spark-connect") \
            or "spark_connect_server" in request.fixturenames:
        yield
        return
    marked = os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
    try:
        yield
    finally:
        if marked is not None:
            os.environ["SPARK_CONNECT_MODE_ENABLED"] = marked


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def spark_connect_server(spark_standalone_master):
    """A real Spark Connect server (pyspark's own ``sbin/start-connect-server.sh``, in the
    foreground) whose application runs on ``spark_standalone_master`` with 2 executors of 2
    cores; yields its ``sc://127.0.0.1:PORT`` URL and stops it (and its executors) after the run."""
    yield from connect_server(spark_standalone_master, {"spark.executor.cores": "2", "spark.cores.max": "4",
                                                        **EXECUTOR_C1})


def connect_server(master: str, conf: dict = None):
    """Start a Spark Connect server whose application runs on ``master`` (with ``conf`` added
    to its settings) on a free port of 127.0.0.1, yield its ``sc://`` URL, stop it (its
    executors go with it) and remove its folder. The benchmarks start theirs with it too."""
    root = tempfile.mkdtemp(prefix="duotf-connect-")
    port = _free_port()
    env = dict(os.environ, SPARK_HOME=_spark_home(), SPARK_LOCAL_IP="127.0.0.1",
               PYSPARK_PYTHON=sys.executable, SPARK_NO_DAEMONIZE="1", SPARK_LOG_DIR=root,
               SPARK_PID_DIR=root)
    settings = {"spark.connect.grpc.binding.port": str(port),
                "spark.connect.grpc.binding.address": "127.0.0.1",
                "spark.executor.memory": "1g", "spark.ui.enabled": "false",
                "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
                # its JVM's temp files (Spark Connect's artifacts-<uuid> folder, left behind
                # in /tmp once stopped) in this folder, removed with it
                "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={root}", **(conf or {})}
    args = [os.path.join(_spark_home(), "sbin", "start-connect-server.sh"), "--master", master]
    for key, value in settings.items():
        args += ["--conf", f"{key}={value}"]
    try:
        with hosts.daemon(args, os.path.join(root, "connect.log"), r"(Spark Connect server started at)",
                          "the Spark Connect server", env=env):
            yield f"sc://127.0.0.1:{port}"
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def spark_standalone_master_log(spark_standalone_master) -> str:
    """The standalone master's log file (which applications registered)."""
    return _master_logs[spark_standalone_master]


@pytest.fixture(scope="module")
def spark():
    """A classic SparkSession for tests outside the shared suite: the suite's own, when one is
    active, else a local[2] session for this module. Never the Spark Connect engine's session:
    pyspark's process-wide remote mark is lifted while the module runs (see
    ``_classic_pyspark_outside_connect_tests``), as it is for each of its tests."""
    from pyspark.sql import SparkSession

    marked = os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
    try:
        active = SparkSession.getActiveSession()
        if active is not None and not type(active).__module__.startswith("pyspark.sql.connect"):
            yield active  # the shared suite's session, stopped by its own fixture
            return
        session = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                   .config("spark.driver.host", "127.0.0.1").getOrCreate())
        session.sparkContext.setLogLevel("ERROR")
        try:
            yield session
        finally:
            session.stop()
    finally:
        if marked is not None:
            os.environ["SPARK_CONNECT_MODE_ENABLED"] = marked
