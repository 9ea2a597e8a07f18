"""A feed of 1M+ MNIST-like rows (3.1 GB) keeps memory bounded on both sides, on every backend."""

from __future__ import annotations

import threading

import numpy as np
import psutil

import duotf
from tests.conftest import QUIET_TF
from tests.suite import mains

ROWS = 1_048_576
PARTS = 16
PER_PART = ROWS // PARTS
CHUNK = 16_384


def _local_part(p):
    def chunks():
        for start in range(0, PER_PART, CHUNK):
            ids = np.arange(p * PER_PART + start, p * PER_PART + start + CHUNK)
            yield {"0": np.full((CHUNK, 784), 0.5, dtype=np.float32), "1": ids % 10}
    return chunks


def _data(kind, backend):
    if kind == "local":
        return [_local_part(p) for p in range(PARTS)]
    if kind == "dask":
        import dask.array as da

        x = da.full((ROWS, 784), 0.5, dtype=np.float32, chunks=(CHUNK, 784))
        y = da.arange(ROWS, chunks=CHUNK, dtype=np.int64) % 10
        return (x, y)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    session = SparkSession(backend.sc)
    return session.range(0, ROWS, numPartitions=PARTS).select(
        F.array_repeat(F.lit(0.5).cast("float"), 784).alias("0"), (F.col("id") % 10).alias("1"))


class _Peak:
    """Samples the RSS of some processes while the feed runs."""

    def __init__(self, pids):
        self.procs = [psutil.Process(pid) for pid in pids]
        self.base = sum(p.memory_info().rss for p in self.procs)
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, sum(p.memory_info().rss for p in self.procs))

    def growth_mb(self):
        self._stop.set()
        self._thread.join()
        return (self.peak - self.base) / 2**20


def test_million_row_feed_has_bounded_memory(backend, backend_kind):
    data = _data(backend_kind, backend)
    if backend_kind == "local":
        feeders = [psutil.Process().pid]  # the feeding threads run in this process
    elif backend_kind == "dask":
        import os

        feeders = list(backend.client.run(os.getpid).values())
    else:
        feeders = []  # Spark's Python workers come and go; Arrow batches bound them
    with duotf.run(mains.feed_memory_main, {"batch": 1000}, backend, duotf.ClusterSpec(workers=2),
                   env=QUIET_TF) as cluster:
        peak = _Peak(feeders) if feeders else None
        report = cluster.train(data, epochs=1)
        results = cluster.wait(timeout=600)
    assert report["rows"] == ROWS and report["rows_fed"] == ROWS
    assert [r["rows"] for r in results] == [ROWS // 2, ROWS // 2]
    # 3.1 GB went through; each node holds at most its queue and a few blocks
    assert all(r["growth_mb"] < 600 for r in results), results
    if peak is not None:
        assert peak.growth_mb() < 1000
