"""A feed of 1M+ MNIST-like rows (3.1 GB) keeps memory bounded on both sides, on every backend."""

from __future__ import annotations

import threading

import psutil

import duotf
from tests.conftest import QUIET_TF
from tests.suite import mains

ROWS = 1_048_576
PARTS = 16
CHUNK = 16_384


def _rss(procs):
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.Error:  # a worker that just exited
            pass
    return total


class _Peak:
    """Samples the summed RSS of some processes (a list, or a callable giving one) while the
    feed runs."""

    def __init__(self, procs):
        self.procs = procs if callable(procs) else (lambda: procs)
        first = self.procs()
        self.seen = len(first)
        self.base = _rss(first)
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.05):
            procs = self.procs()
            self.seen = max(self.seen, len(procs))
            self.peak = max(self.peak, _rss(procs))

    def growth_mb(self):
        self._stop.set()
        self._thread.join()
        return (self.peak - self.base) / 2**20


def test_million_row_feed_has_bounded_memory(backend, engine):
    data = engine.constant_features(ROWS, PARTS, width=784, chunk=CHUNK)
    feeders = engine.feeding_processes()  # Spark's: every Python worker, nodes' tasks included
    with duotf.run(mains.feed_memory_main, {"batch": 1000}, backend, duotf.ClusterSpec(workers=2),
                   env=QUIET_TF) as cluster:
        peak = _Peak(feeders)
        try:
            report = cluster.train(data, epochs=1)
            results = cluster.wait(timeout=600)
        finally:
            growth = peak.growth_mb()
    assert report["rows"] == ROWS and report["rows_fed"] == ROWS
    assert [r["rows"] for r in results] == [ROWS // 2, ROWS // 2]
    # 3.1 GB went through; each node holds at most its queue and a few blocks
    assert all(r["growth_mb"] < 600 for r in results), results
    assert peak.seen and growth < 1000, (peak.seen, growth)
