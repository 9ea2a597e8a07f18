"""Feed failures are typed on every engine, and inference of nothing is a collection of nothing."""

from __future__ import annotations

import time

import pytest

import duotf
from tests.suite import mains


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
        cluster.shutdown(grace_secs=0, _raise=False)
    err = info.value
    first = str(err).splitlines()[0]
    # the task's own error, with its attributes, not an engine's traceback text
    assert first.startswith(f"feeding partition {err.partition} to worker:"), first
    assert "feed_timeout=1" in first and "worker:" in err.node
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
        cluster.shutdown(grace_secs=0, _raise=False)
    what = "should_stop() was called" if then == "read" else "main returned"
    assert f"{what} with 1 rows read but not answered" in str(info.value)
    assert info.value.remote_type.endswith("FeedError")
    assert took < 60, f"took {took:.0f} s: the feed waited for results that could never come"
