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
    if kind in ("local", "procpool"):
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


def _spark_python_workers():
    """Spark's Python worker processes on this machine (they come and go with the tasks)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if "pyspark.daemon" in " ".join(proc.info["cmdline"] or []):
            found.append(proc)
    return found


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


def test_million_row_feed_has_bounded_memory(backend, backend_kind):
    data = _data(backend_kind, backend)
    if backend_kind == "local":
        feeders = [psutil.Process()]  # the feeding threads run in this process
    elif backend_kind == "procpool":
        feeders = backend.pool.processes  # the pool's workers, nodes' agents included
    elif backend_kind == "dask":
        import os

        feeders = [psutil.Process(pid) for pid in backend.client.run(os.getpid).values()]
    else:
        feeders = _spark_python_workers  # all of them, nodes' tasks included, as they come and go
    with duotf.run(mains.feed_memory_main, {"batch": 1000}, backend, duotf.ClusterSpec(workers=2),
                   env=QUIET_TF) as cluster:
        peak = _Peak(feeders)
        report = cluster.train(data, epochs=1)
        results = cluster.wait(timeout=600)
    assert report["rows"] == ROWS and report["rows_fed"] == ROWS
    assert [r["rows"] for r in results] == [ROWS // 2, ROWS // 2]
    # 3.1 GB went through; each node holds at most its queue and a few blocks
    assert all(r["growth_mb"] < 600 for r in results), results
    growth = peak.growth_mb()
    assert peak.seen and growth < 1000, (peak.seen, growth)
