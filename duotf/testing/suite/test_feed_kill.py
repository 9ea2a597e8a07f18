"""A feeding task lost mid-epoch: each row of an epoch reaches its node exactly once, or train()
raises a typed error naming the epoch, the partition and the node within seconds; either way
every node's feed ends and cluster.wait() returns or raises at once (issues 18 and 19). A
feeding task whose data source fails is tests/suite/test_feed_errors.py."""

from __future__ import annotations

import threading
import time

import psutil
import pytest

import duotf
from duotf.testing import QUIET_TF, poll_for, shutdown_quietly
from duotf.testing.suite import mains

ROWS = 48_000  # 4 partitions of 12,000 rows of 2 KiB: a range is 6 frames of 4 MiB
PARTS = 4
WIDTH = 512
EPOCHS = 3
HOLD = 1_000  # a node stops reading after this many rows until the test released it


def _connections(proc):
    get = getattr(proc, "net_connections", None) or proc.connections
    return get(kind="tcp")


def _feeding_process(engine, ports):
    """A process of the engine's feeding tasks that holds a connection to a node's feed port."""
    procs = engine.feeding_processes()
    for proc in procs() if callable(procs) else procs:
        try:
            if any(c.raddr and c.raddr.port in ports and c.status == psutil.CONN_ESTABLISHED
                   for c in _connections(proc)):
                return proc
        except psutil.Error:  # a worker that just exited
            pass
    return None


def _run_train(cluster, data, outcome):
    try:
        outcome["report"] = cluster.train(data, epochs=EPOCHS, feed_timeout=120)
    except duotf.DuotfError as exc:
        outcome["error"] = exc
    outcome["at"] = time.monotonic()


def _start_training(backend, data, tmp_path):
    """2 workers reading slowly once they hold HOLD rows (feed_hold_main), and train() of
    ``data`` in a thread that records its outcome."""
    args = {"batch": 500, "hold": HOLD, "held": str(tmp_path / "held"),
            "release": str(tmp_path / "release")}
    cluster = duotf.run(mains.feed_hold_main, args, backend, duotf.ClusterSpec(workers=2),
                        env=QUIET_TF)
    outcome: dict = {}
    trainer = threading.Thread(target=_run_train, args=(cluster, data, outcome))
    trainer.start()
    return cluster, outcome, trainer


def _check(engine, cluster, outcome, since):
    """Either train() raised a typed error within seconds and wait() raises at once, or every
    node got every row of its share of every epoch exactly once. The error is the FeedError,
    unless the killed process ran a node's task too (``engine.feeds_beside_nodes``)."""
    if "error" in outcome:
        err = outcome["error"]
        assert outcome["at"] - since < 20, f"train() raised {outcome['at'] - since:.1f} s after the fault"
        first = str(err).splitlines()[0]
        if isinstance(err, duotf.FeedError):
            assert first.startswith("feeding epoch 1 failed on worker:"), first
            assert f"partition {err.partition} of epoch 1" in first and err.node in first, first
            assert err.epoch == 1 and isinstance(err.partition, int), (err.epoch, err.partition)
            if "task feeding partition" in first and "at most once" in first:
                # Spark, epochs fed from kept frame files: the node had read the killed task's
                # range whole (a file's frames are read as they come), no range broke, and the
                # engine lost the task (no retry in local mode): its partitions are named
                assert "Python worker exited unexpectedly" in first, first
                assert err.partition in range(PARTS), err.partition
            else:
                assert "delivered" in first and "exactly once" in first, first
            assert "Py4JJavaError" not in first and "An error occurred while calling" not in first
        else:
            # On Dask the killed worker process also ran a node's task: the node is lost. A
            # process pool ends every worker when one dies, the nodes' agents with them: the
            # job running the nodes fails (BackendError) or the nodes are lost (NodeError).
            # Spark's Python workers run no node: only the FeedError will do.
            assert engine.feeds_beside_nodes, repr(err)
            assert isinstance(err, (duotf.NodeError, duotf.BackendError)), repr(err)
        t0 = time.monotonic()
        with pytest.raises(duotf.DuotfError):
            cluster.wait(timeout=60)
        outcome["wait_s"] = time.monotonic() - t0
        assert outcome["wait_s"] < 15, "cluster.wait() waited for nodes whose feed had failed"
        return "failed"
    results = cluster.wait(timeout=120)
    per = ROWS // 2
    for epoch in range(EPOCHS):
        got = [r["ids"].get(epoch, []) for r in results]
        assert [len(ids) for ids in got] == [per, per], (epoch, [len(ids) for ids in got])
        assert sorted(got[0] + got[1]) == list(range(ROWS)), f"epoch {epoch}: rows lost or repeated"
    return "exactly once"


@pytest.mark.slow
@pytest.mark.engines("procpool", "dask", "spark-local", "spark-standalone", "spark-connect")
def test_a_feeding_process_killed_mid_epoch_never_duplicates_rows(backend, engine, tmp_path, monkeypatch):
    # Spark's feeding tasks are what is killed: not the driver naming kept frames to the nodes
    import duotf.backends.spark.feed as spark_feed
    monkeypatch.setattr(spark_feed, "BY_REFERENCE", False)
    data = engine.constant_features(ROWS, PARTS, width=WIDTH, chunk=ROWS // PARTS, ids=True)
    cluster, outcome, trainer = _start_training(backend, data, tmp_path)
    try:
        poll_for(lambda: list(tmp_path.glob("held-*")), 180, what="a node reading slowly")
        ports = {node.feed_port for node in cluster.nodes}
        victim = poll_for(lambda: _feeding_process(engine, ports), 30, what="a feeding process")
        victim.kill()  # SIGKILL, mid-range: the node holds its ring's slots, the task waits
        killed = time.monotonic()
        (tmp_path / "release").touch()
        trainer.join(180)
        assert not trainer.is_alive(), "train() hung after a feeding process was killed"
        how = _check(engine, cluster, outcome, killed)
        print(f"{engine.__class__.__name__}: {how}; train() ended {outcome['at'] - killed:.2f} s "
              f"after the kill, wait() {outcome.get('wait_s', 0):.2f} s after that; "
              f"{outcome.get('error') or outcome.get('report')}")
    finally:
        (tmp_path / "release").touch()
        shutdown_quietly(cluster)
        trainer.join(60)
