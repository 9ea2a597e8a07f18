"""The backend registry: names and install hints, run-time registration, and a backend from
outside duotf (tests/procpool_backend.py) found through its ``duotf.backends`` entry point alone
(tests/plugins/duotf_procpool_test-0.0.dist-info, put on sys.path by the conftest)."""

from __future__ import annotations

import importlib.metadata
import os
import socket
import subprocess
import sys

import pytest

import duotf
from duotf import backends as registry
from duotf.backends import (ENTRY_POINT_GROUP, LocalBackend, backend_class, register_backend, resolve_backend)
from tests.procpool_backend import ProcessPool, ProcessPoolBackend
from tests.suite import mains

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGINS = os.path.join(ROOT, "tests", "plugins")


@pytest.fixture
def table(monkeypatch):
    """The registry's table for one test: what the test registers is gone after it."""
    backend_class("local")  # entry points are read once; the copy holds them
    monkeypatch.setattr(registry, "known_backends", dict(registry.known_backends))
    return registry.known_backends


def _fresh_interpreter(code: str, *path: str) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((ROOT,) + path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_procpool_is_known_through_its_entry_point_alone():
    eps = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    (ep,) = [e for e in eps if e.name == "procpool"]
    assert ep.value == "tests.procpool_backend:ProcessPoolBackend"
    assert ep.dist.name == "duotf-procpool-test"
    assert backend_class("procpool") is ProcessPoolBackend

    code = (
        "import sys, duotf.backends as b\n"
        "print(sorted(b.known_backends), 'tests.procpool_backend' in sys.modules)\n"
        "try:\n"
        "    cls = b.backend_class('procpool')\n"
        "    print(cls.__module__, cls.__name__)\n"
        "except b.ConfigError as exc:\n"
        "    print(exc)\n"
    )
    # Nothing is registered before the entry points are read, and the module is imported only
    # when the backend is asked for.
    before, found = _fresh_interpreter(code, PLUGINS).splitlines()
    assert before == "['dask', 'local', 'spark'] False"
    assert found == "tests.procpool_backend ProcessPoolBackend"
    # Without the plugin's dist-info on sys.path, duotf knows no such backend.
    assert _fresh_interpreter(code).splitlines()[1] == (
        "unknown backend 'procpool'; known backends: dask, local, spark")


def test_run_by_name_makes_a_pool_and_closes_it_with_the_cluster():
    with duotf.run(mains.describe_main, None, "procpool", duotf.ClusterSpec(workers=2)) as cluster:
        results = cluster.wait()
        pool = cluster.backend.pool
        workers = pool.processes()
    assert type(cluster.backend) is ProcessPoolBackend
    assert [r["node_id"] for r in results] == [0, 1]
    # each node's agent ran in a worker process of its own
    assert sorted(r["executor_id"] for r in results) == sorted(
        f"procpool-{socket.gethostname()}-{p.pid}" for p in workers)
    assert pool.processes() == []  # duotf created the pool, so duotf closed it


def test_an_engine_object_is_matched_by_accepts(tmp_path):
    release = tmp_path / "release"
    with ProcessPool(max_workers=2) as pool:
        backend, owned = resolve_backend(pool)
        assert type(backend) is ProcessPoolBackend and backend.pool is pool and not owned
        with duotf.run(mains.block_main, {"release": str(release)}, pool,
                       duotf.ClusterSpec(workers=2)) as cluster:
            # the nodes take both workers: nothing is left to feed them, and train says so
            with pytest.raises(duotf.InsufficientSlotsError, match="more max_workers than") as info:
                cluster.train([[(1.0, 1)], [(2.0, 2)]])
            release.touch()
            assert cluster.wait(timeout=60) == [0, 1]
        assert (info.value.needed, info.value.available) == (3, 2)
        assert len(pool.processes()) == 2  # the caller's pool outlives the cluster
    assert pool.processes() == []


def test_unknown_backend_lists_the_known_ones():
    with pytest.raises(duotf.ConfigError,
                       match="unknown backend 'ray'; known backends: dask, local, procpool, spark"):
        backend_class("ray")
    with pytest.raises(duotf.ConfigError, match="unknown backend 'ray'"):
        duotf.run(mains.describe_main, None, "ray")
    with pytest.raises(duotf.ConfigError, match="SparkSession, SparkContext, distributed") as info:
        resolve_backend(object())
    assert "dask, local, procpool, spark" in str(info.value)


class _Inline(LocalBackend):
    name = "inline"


def test_register_backend(table):
    register_backend("inline", _Inline)
    assert backend_class("inline") is _Inline
    backend, owned = resolve_backend("inline")
    assert type(backend) is _Inline and owned
    with pytest.raises(duotf.ConfigError, match="'inline' is already registered; pass clobber"):
        register_backend("inline", LocalBackend)
    # a dotted path is imported when the backend is first asked for
    register_backend("inline", "tests.procpool_backend.ProcessPoolBackend", clobber=True)
    assert backend_class("inline") is ProcessPoolBackend
    register_backend("pool", "tests.procpool_backend.ProcessPool")
    with pytest.raises(duotf.ConfigError, match=r"ProcessPool \(backend 'pool'\) is not a duotf"):
        backend_class("pool")


def test_a_backend_whose_package_is_missing_says_what_to_install(table, monkeypatch):
    register_backend("ray", "duotf_ray_missing.RayBackend", "pip install duotf-ray")
    with pytest.raises(duotf.ConfigError) as info:
        backend_class("ray")
    assert str(info.value) == ("the 'ray' backend needs a package that is not installed "
                               "(duotf_ray_missing): pip install duotf-ray")
    with pytest.raises(duotf.ConfigError, match="pip install duotf-ray"):
        duotf.run(mains.describe_main, None, "ray")
    # A built-in backend imports its engine's package when duotf makes the engine.
    monkeypatch.setitem(sys.modules, "distributed", None)
    with pytest.raises(duotf.ConfigError,
                       match=r"not installed \(distributed\): pip install 'duotf\[dask\]'"):
        duotf.run(mains.describe_main, None, "dask")
    # A backend that cannot be imported accepts nothing, and keeps no other from accepting.
    with ProcessPool(max_workers=1) as pool:
        assert type(resolve_backend(pool)[0]) is ProcessPoolBackend
