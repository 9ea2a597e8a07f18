"""A feed of 1M+ MNIST-like rows (3.1 GB) keeps memory bounded on both sides, on every backend."""

from __future__ import annotations

import threading

import numpy as np
import psutil
import pytest

import duotf
from duotf.testing import QUIET_TF
from duotf.testing.suite import mains

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


# Two engines of five (CI time): the Dask and Spark feeding tasks; local and procpool feed through
# the same task code (feed.tasks) and the 3.1 GB test below covers Spark standalone.
@pytest.mark.engines("dask", "spark-local")
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


def _executor_jvms():
    """The Spark executors' JVMs on this host (under this process: the standalone workers')."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if "CoarseGrainedExecutorBackend" in " ".join(proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            pass
    return found


class _PeakEach(_Peak):
    """The largest RSS each process reached, and its RSS when first seen."""

    def __init__(self, procs):
        self.each, self.first = {}, {}
        super().__init__(procs)

    def _run(self):
        while not self._stop.wait(0.05):
            for proc in self.procs():
                try:
                    rss = proc.memory_info().rss
                except psutil.Error:
                    continue
                self.first.setdefault(proc.pid, rss)
                self.each[proc.pid] = max(self.each.get(proc.pid, 0), rss)

    def growth_each_mb(self):
        return sorted(round((self.each[pid] - self.first[pid]) / 2**20) for pid in self.each)


@pytest.mark.engines("spark-standalone")
@pytest.mark.timeout(600)
def test_a_dataframe_larger_than_the_executors_heaps_is_fed_and_cached_whole(backend, engine):
    """At Spark's default executor memory (1 GiB) and Arrow batch size, 3.1 GB of rows (both
    executors' heaps, 1.5 times over) are fed from the DataFrame and from ``feed_cache``: every
    row arrives once; the executors stay within their heaps and their Python workers bounded."""
    from duotf.spark import feed_cache

    conf = engine.session.sparkContext.getConf()
    assert conf.get("spark.executor.memory", "1g") == "1g"
    assert conf.get("spark.sql.execution.arrow.maxRecordsPerBatch", "10000") == "10000"
    data = engine.constant_features(ROWS, PARTS, width=784, chunk=CHUNK, ids=True)

    def fed_whole(source, what):
        with duotf.run(mains.ids_seen_main, {"batch": 1000, "rows": ROWS}, backend,
                       duotf.ClusterSpec(workers=2), env=QUIET_TF) as cluster:
            report = cluster.train(source, epochs=1)
            results = cluster.wait(timeout=600)
        seen = np.zeros(ROWS, dtype=bool)
        for r in results:
            seen |= np.unpackbits(np.frombuffer(r["seen"], np.uint8))[:ROWS].astype(bool)
        assert report["rows_fed"] == ROWS, (what, report)
        assert sum(r["rows"] for r in results) == ROWS and not any(r["twice"] for r in results)
        assert seen.all(), f"{what}: {int((~seen).sum())} ids never arrived"

    python_workers = engine.feeding_processes()

    def feeding_workers():
        """Spark's Python workers but the nodes' TensorFlow processes (tagged by their agent)."""
        found = []
        for proc in python_workers():
            try:
                if "DUOTF_NODE_ID" not in proc.environ():
                    found.append(proc)
            except psutil.Error:
                pass
        return found

    jvms, workers = _PeakEach(_executor_jvms), _PeakEach(feeding_workers)
    try:
        fed_whole(data, "DataFrame")
        cache = feed_cache(data)
        try:
            fed_whole(cache, "feed_cache")
        finally:
            cache.unpersist()
    finally:
        jvms.growth_mb()
        workers.growth_mb()
    jvm_mb = sorted(round(v / 2**20) for v in jvms.each.values())
    worker_mb = sorted(round(v / 2**20) for v in workers.each.values())
    worker_growth = workers.growth_each_mb()
    print(f"\n[figures] 2 x 3.1 GB through 1 GiB executors: peak RSS of the executor JVMs "
          f"{jvm_mb} MB, of each of their Python workers (the nodes' aside) {worker_mb} MB, "
          f"growth of each while seen {worker_growth} MB")
    # Holding the data would take 3.1 GB: a JVM stays within its 1 GiB heap plus its own
    # overhead, a Python worker grows by a few Arrow batches at most (10,000 rows are 31 MB).
    # Growth, not RSS: Spark reuses Python workers, and one that loaded a model for an earlier
    # scoring UDF in this session starts at 800 MB.
    assert len(jvm_mb) == 2 and max(jvm_mb) < 1800, jvm_mb
    assert worker_growth and max(worker_growth) < 600, (worker_mb, worker_growth)
