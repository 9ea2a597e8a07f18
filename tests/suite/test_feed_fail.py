"""A feed whose data source fails, in the engine's own task: while its rows are counted, before
a feeding task's first row, or mid-range after the task delivered rows. Each gives a FeedError
within seconds whose first line names the epoch, the partition, the node (where the rows were
going) and the source's error, and every node's feed ends with it: cluster.wait() raises at
once (issues 18 and 19).

Each case prints its figures (``-s`` shows them); the README's "Failures" list quotes them.
"""

from __future__ import annotations

import time

import pytest

import duotf
from tests.conftest import QUIET_TF
from tests.suite import mains

ROWS = 6_000  # per partition: the feed converts rows in chunks of 4,096
CAUSE = "RuntimeError: injected: the source"

CASES = {
    # fail: what RowSource(0, ROWS, fail) does; phrase: what the first line says; node: whether
    # the error names a node (a count feeds none)
    "count": dict(fail="count", phrase="counting the rows of partition 0 failed", node=False),
    "before its first row": dict(fail=0, phrase="partition 0 failed before its first row", node=True),
    "mid-epoch": dict(fail=5_000, phrase="delivered 4096 rows", node=True),
}


@pytest.mark.parametrize("case", list(CASES))
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
        assert expect["phrase"] in first and CAUSE in first, first
        assert "Py4JJavaError" not in first and "An error occurred while calling" not in first
        assert (err.epoch, err.partition) == (1, 0), (err.epoch, err.partition, first)
        assert CAUSE in err.cause, err.cause
        if expect["node"]:
            assert err.node.startswith("worker:0 ") and f"failed on {err.node}: " in first, first
        else:
            assert err.node is None, err.node
        assert raised < 10, f"train() raised {raised:.1f} s after it started"
        t1 = time.monotonic()
        with pytest.raises(duotf.DuotfError):  # the nodes' reads raised the feed's failure
            cluster.wait(timeout=30)
        waited = time.monotonic() - t1
        assert waited < 5, f"cluster.wait() took {waited:.1f} s after the feed failed"
        print(f"\n[figures] source failing {case} ({engine.__class__.__name__.replace('Engine', '')}): "
              f"train() raised after {raised:.2f} s, wait() {waited:.2f} s")
    finally:
        cluster.shutdown(grace_secs=0, _raise=False)
