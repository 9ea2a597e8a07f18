"""The leak check after every test (duotf.testing.plugin.no_leaks): new threads by comparing thread sets, and
this session's node processes on every engine."""

from __future__ import annotations

import threading

import pytest

import duotf
from duotf.testing import leaks, node_processes, poll_for
from duotf.testing.suite import mains


def _blocking(release: threading.Event, module: str):
    """A thread target that waits for ``release``, as code of ``module`` would."""
    def wait():
        release.wait(60)
    wait.__module__ = module
    return wait


def test_leak_check_flags_new_threads_named_or_not():
    before = set(threading.enumerate())
    release = threading.Event()
    # node.py's stop thread is unnamed ("Thread-N (...)"): a name prefix never saw it
    unnamed = threading.Thread(target=_blocking(release, "duotf.node"), daemon=True)
    named = threading.Thread(target=release.wait, name="duotf-stopper", daemon=True)
    engine = threading.Thread(target=_blocking(release, "py4j.clientserver"), daemon=True)
    for thread in (unnamed, named, engine):
        thread.start()
    try:
        leaked = leaks.leaked_threads(before, grace=0.3)
        assert set(leaked) == {unnamed, named}  # an engine's own threads are not the test's
        message = leaks.describe_threads(leaked)
        assert message.startswith("2 thread(s) left running")
        assert unnamed.name in message and "duotf.node" in message and "'duotf-stopper'" in message
    finally:
        release.set()
        for thread in (unnamed, named, engine):
            thread.join(10)
    assert leaks.leaked_threads(before, grace=5) == []


def test_leak_check_waits_for_a_thread_that_is_ending():
    before = set(threading.enumerate())
    release = threading.Event()
    thread = threading.Thread(target=release.wait, daemon=True)
    thread.start()
    threading.Timer(0.2, release.set).start()  # ends within the grace
    assert leaks.leaked_threads(before, grace=10) == []
    assert not thread.is_alive()


def test_leak_check_sees_the_node_processes_of_every_engine(backend, tmp_path):
    cluster = duotf.run(mains.block_main, {"release": str(tmp_path / "release")}, backend,
                        duotf.ClusterSpec(workers=2))
    try:
        seen = {proc.pid for proc in node_processes()}
        assert {node.pid for node in cluster.nodes} <= seen
    finally:
        (tmp_path / "release").touch()
        cluster.shutdown()


def test_leak_check_sees_a_duotf_directory_in_the_temp_folder(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    made = ["duotf-0123456789ab-checkpoints", "duotf-0123456789ab", "duotf-logs-0123456789ab-x1y",
            "duotf-feedcache-7"]
    for name in made + ["other", "duotf-models", "duotf-spark-q1", "duotf-hosts-a2"]:
        (tmp_path / name).mkdir()
    assert leaks.duotf_temp_dirs() == {str(tmp_path / name) for name in made}


@pytest.mark.engines("local")
def test_a_cluster_dropped_after_a_failed_wait_leaves_no_directory(backend):
    """A user who calls wait(), gets the node's error and never calls shutdown: the cluster's
    own checkpoint folder goes once the Cluster is collected, not at some later exit."""
    import gc
    import os

    def fail_and_drop():
        cluster = duotf.run(mains.talk_main, {"fail": 0}, backend, duotf.ClusterSpec(workers=1))
        path = cluster.checkpoint_dir
        with pytest.raises(duotf.NodeFailedError):
            cluster.wait()
        assert os.path.isdir(path)
        return path

    path = fail_and_drop()
    # its threads hold it until they end (a node's stop): then a collection takes it
    poll_for(lambda: gc.collect() is not None and not os.path.exists(path), 15,
             what=f"{path} removed with its Cluster")



def test_a_dask_worker_its_nanny_failed_to_restart_is_mended_before_the_next_test():
    """The suite's own repair (Engine.mend, before every test), on a LocalCluster of its own:
    a nanny whose restart fails keeps running without a worker, which left a CI run's later
    Dask tests with 1 worker of 2."""
    import os

    import psutil
    from distributed import Client, LocalCluster

    from tests.engines import DaskEngine

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      host="127.0.0.1") as cluster, Client(cluster) as client:
        engine = DaskEngine(duotf.backends.resolve_backend(client)[0], client)
        engine.cluster = cluster
        assert engine.mend(wait=1) is None  # whole: nothing to do
        address, pid = next(iter(client.run(os.getpid).items()))
        [nanny] = [n for n in cluster.workers.values() if n.worker_address == address]

        async def fails(*args, **kwargs):
            raise OSError("a restart that failed, as one did on a loaded machine")

        nanny.instantiate = fails
        psutil.Process(pid).kill()
        poll_for(lambda: len(client.nthreads()) < 2, 30, what="the worker gone")
        mended = engine.mend(wait=1)
        assert mended and "nanny" in mended, mended
        assert len(client.nthreads()) == 2
        assert nanny not in cluster.workers.values()
        assert client.submit(sum, [1, 2], pure=False).result(timeout=30) == 3
