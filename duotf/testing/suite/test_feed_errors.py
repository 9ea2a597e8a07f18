"""Feed failures are typed on every engine, and inference of nothing is a collection of nothing.

A data source that fails in the engine's own task (while its rows are counted, before a feeding
task's first row, or mid-range after the task delivered rows) gives a FeedError within seconds
whose first line names the epoch, the partition, the node (where the rows were going) and the
source's error, and every node's feed ends with it: cluster.wait() raises at once (issues 18
and 19). Those cases print their figures (``-s`` shows them); docs/internals/how-it-works.md
("Failures") quotes them.
"""

from __future__ import annotations

import time

import pytest

import duotf
from duotf.testing import QUIET_TF, shutdown_quietly
from duotf.testing.suite import mains


def test_a_node_that_takes_no_data_gives_a_typed_feed_error(backend, engine, tmp_path):
    # 10 partitions a node, its queue holds 8 frames: a range finds no room, and its task
    # gives up after feed_timeout
    parts = [[(float(i), i) for i in range(p * 50, (p + 1) * 50)] for p in range(20)]
    cluster = duotf.run(mains.block_main, {"release": str(tmp_path / "release")}, backend,
                        duotf.ClusterSpec(workers=2))
    try:
        t0 = time.monotonic()
        with pytest.raises(duotf.FeedError) as info:
            cluster.train(engine.rows(parts), epochs=1, feed_timeout=1)
        assert time.monotonic() - t0 < 90
    finally:
        (tmp_path / "release").touch()
        shutdown_quietly(cluster)
    err = info.value
    first = str(err).splitlines()[0]
    # the task's own error, with its attributes, not an engine's traceback text
    assert first.startswith(f"feeding epoch 1 failed on {err.node}: feeding partition "
                            f"{err.partition}, the node took no data for feed_timeout=1 s"), first
    assert err.node.startswith("worker:") and err.epoch == 1
    assert isinstance(err.partition, int) and 0 <= err.partition < 20


def test_inference_of_empty_partitions_gives_empty_partitions(backend, engine):
    with duotf.run(mains.feed_infer_main, {"batch": 4, "feeds": 2}, backend,
                   duotf.ClusterSpec(workers=2)) as cluster:
        out = cluster.inference(engine.rows([[], [], []]))
        none = cluster.inference(engine.rows([]))  # no partition at all: none out
        cluster.wait(timeout=60)
    assert engine.partitions(out) == [[], [], []]
    assert engine.partitions(none) == []


@pytest.mark.parametrize("then", ["read", "return"])
def test_inference_with_results_missing_fails_at_once(backend, engine, then):
    data = engine.rows([[(float(i), 1.0) for i in range(p * 10, (p + 1) * 10)] for p in range(2)])
    cluster = duotf.run(mains.feed_infer_short_main, {"batch": 4, "then": then}, backend,
                        duotf.ClusterSpec(workers=2))
    try:
        t0 = time.monotonic()
        with pytest.raises(duotf.NodeFailedError) as info:
            cluster.inference(data, feed_timeout=120)
        took = time.monotonic() - t0
    finally:
        shutdown_quietly(cluster)
    what = "should_stop() was called" if then == "read" else "main returned"
    assert f"{what} with 1 rows read but not answered" in str(info.value)
    assert info.value.remote_type.endswith("FeedError")
    assert took < 60, f"took {took:.0f} s: the feed waited for results that could never come"


ROWS = 6_000  # per partition: the feed converts rows in chunks of 4,096
CAUSE = "RuntimeError: injected: the source"

CASES = {
    # fail: what RowSource(0, ROWS, fail) does; phrase: what the first line says; node: whether
    # the error names a node (a count feeds none)
    "count": dict(fail="count", phrase="counting the rows of partition 0 failed", node=False),
    "before its first row": dict(fail=0, phrase="partition 0 failed before its first row", node=True),
    "mid-epoch": dict(fail=5_000, phrase="delivered 4096 rows", node=True),
}


@pytest.mark.parametrize("case", [
    "count", "mid-epoch",
    # the same path on every engine (a task's own FeedError, as for a mid-epoch one, with no
    # node report to wait for): one engine, for CI time
    pytest.param("before its first row", marks=pytest.mark.engines("local")),
])
def test_a_failing_source_fails_the_feed_at_once_and_names_it(backend, engine, case):
    expect = CASES[case]
    cluster = duotf.run(mains.feed_train_main, {"batch": 500}, backend,
                        duotf.ClusterSpec(workers=2), env=QUIET_TF)
    try:
        # partition 0 fails; partition 1 feeds the other worker meanwhile
        data = engine.row_sources([mains.RowSource(0, ROWS, expect["fail"]),
                                   mains.RowSource(ROWS, 2 * ROWS)])
        t0 = time.monotonic()
        with pytest.raises(duotf.FeedError) as info:
            cluster.train(data, epochs=2, feed_timeout=60)
        raised = time.monotonic() - t0
        err = info.value
        first = str(err).splitlines()[0]
        assert first.startswith("feeding epoch 1 failed"), first
        # (where the cause is another error, the engine's whole error text says why)
        assert expect["phrase"] in first and CAUSE in first, (first, str(err.__cause__)[-6000:])
        assert "Py4JJavaError" not in first and "An error occurred while calling" not in first
        assert (err.epoch, err.partition) == (1, 0), (err.epoch, err.partition, first)
        assert CAUSE in err.cause, err.cause
        if expect["node"]:
            assert err.node.startswith("worker:0 ") and f"failed on {err.node}: " in first, first
        else:
            assert err.node is None, err.node
        # seconds on an idle machine; a shared 2-core one has needed 10 (Spark's count job)
        assert raised < 20, f"train() raised {raised:.1f} s after it started"
        t1 = time.monotonic()
        with pytest.raises(duotf.DuotfError):  # the nodes' reads raised the feed's failure
            cluster.wait(timeout=30)
        waited = time.monotonic() - t1
        assert waited < 5, f"cluster.wait() took {waited:.1f} s after the feed failed"
        print(f"\n[figures] source failing {case} ({engine.__class__.__name__.replace('Engine', '')}): "
              f"train() raised after {raised:.2f} s, wait() {waited:.2f} s\n{first}")
    finally:
        shutdown_quietly(cluster)
