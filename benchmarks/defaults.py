"""Every duotf Spark path at the engine's defaults, on data larger than an executor's heap.

    python -m benchmarks.defaults --spark-master spark://127.0.0.1:PORT [--rows 1048576]

The session sets nothing beyond the master URL (1 GiB executors and driver, 10,000 records and
64 MiB per Arrow batch). The data is ``--rows`` MNIST-like rows (784 float32 and an int64 id,
3.1 GB at the default 1M rows) made by Spark (never in the driver). Each path runs once:
``train`` from the DataFrame, ``train`` from a ``pack_tensors`` column, ``feed_cache`` then
``train`` from it, ``inference`` (a result per row), and DataFrame -> TFRecord files -> DataFrame.
For each it prints the rows that arrived, the seconds, and the peak RSS of the executors' JVMs
and of their Python workers (the nodes' own processes aside), sampled every 50 ms.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time

import psutil

import duotf
from benchmarks.feed import checkout_on_executors, quiet_tf

BATCH = 1000


def drain_main(args, ctx):
    """Read every row of the feed through dataset(); count rows and sum the ids."""
    __import__("tensorflow")  # what a node does first

    rows = total = 0
    for batch in ctx.get_data_feed(train=True).dataset(args["batch"]):
        ids = batch["id"].numpy()
        rows += len(ids)
        total += int(ids.sum())
    return rows, total


def answer_main(args, ctx):
    """Inference: answer every row with its id."""
    feed = ctx.get_data_feed(train=False)
    while not feed.should_stop():
        batch = feed.next_batch(args["batch"])
        if batch:
            feed.batch_results([float(row[1]) for row in batch])
    return ctx.task_index


class Peaks:
    """The largest RSS each process that ``procs()`` gives reached, sampled every 50 ms."""

    def __init__(self, procs):
        self.procs, self.each, self._stop = procs, {}, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.05):
            for proc in self.procs():
                try:
                    rss = proc.memory_info().rss
                except psutil.Error:
                    continue
                self.each[proc.pid] = max(self.each.get(proc.pid, 0), rss)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.each.values(), default=0) // 2**20


def _spark_processes():
    """(executor JVMs, their Python workers but the nodes') under this host's processes."""
    jvms, workers = [], []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            line = " ".join(proc.info["cmdline"] or [])
            if "CoarseGrainedExecutorBackend" in line:
                jvms.append(proc)
            elif "pyspark.daemon" in line and "DUOTF_NODE_ID" not in proc.environ():
                workers.append(proc)
        except psutil.Error:
            pass
    return jvms, workers


def measure(name, fn, rows):
    jvms = Peaks(lambda: _spark_processes()[0])
    workers = Peaks(lambda: _spark_processes()[1])
    t0 = time.perf_counter()
    try:
        arrived = fn()
        outcome = "ok" if arrived == rows else f"WRONG: {arrived:,} rows"
    except Exception as exc:  # noqa: BLE001 - a benchmark reports what failed and goes on
        arrived, outcome = 0, f"FAILED: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    seconds = time.perf_counter() - t0
    print(f"| {name} | {arrived:,} | {seconds:.1f} s | {jvms.stop()} MB | {workers.stop()} MB | "
          f"{outcome} |", flush=True)


def main():
    quiet_tf()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spark-master", required=True)
    parser.add_argument("--rows", type=int, default=1 << 20)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--only", nargs="*", default=None,
                        choices=["train", "pack_tensors", "feed_cache", "inference", "tfrecords"],
                        help="run only these paths (default: all)")
    opts = parser.parse_args()

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from duotf.backends.spark.backend import SparkBackend
    from duotf.io import dataframe as dfio
    from duotf.spark import feed_cache, pack_tensors

    session = checkout_on_executors(
        SparkSession.builder.master(opts.spark_master).config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")).getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    conf = session.sparkContext.getConf()
    print("Spark settings beyond the master URL: none (engine defaults; the executors' PYTHONPATH "
          "names this checkout, for the nodes to import the benchmark's functions): executor memory "
          f"{conf.get('spark.executor.memory', '1g')}, Arrow batch "
          f"{session.conf.get('spark.sql.execution.arrow.maxRecordsPerBatch')} records / "
          f"{session.conf.get('spark.sql.execution.arrow.maxBytesPerBatch')}")
    rows = opts.rows
    df = session.range(0, rows, numPartitions=opts.partitions).select(
        F.array_repeat(F.lit(0.5).cast("float"), 784).alias("x"), F.col("id"))
    print(f"{rows:,} rows x (784 float32 + int64) = {rows * 3144 / 1e9:.1f} GB, "
          f"{opts.partitions} partitions\n")
    print("| path | rows arrived | time | executor JVM peak RSS | Python worker peak RSS | |")
    print("| --- | --- | --- | --- | --- | --- |")
    backend = SparkBackend(session)
    want = rows * (rows - 1) // 2

    def train(source):
        with duotf.run(drain_main, {"batch": BATCH}, backend, duotf.ClusterSpec(workers=2),
                       env={"TF_CPP_MIN_LOG_LEVEL": "3"}) as cluster:
            cluster.train(source, epochs=1)
            results = cluster.wait(timeout=3600)
        got, total = sum(r[0] for r in results), sum(r[1] for r in results)
        return got if total == want else -got

    def cached():
        cache = feed_cache(df)
        try:
            return train(cache)
        finally:
            cache.unpersist()

    def inference():
        with duotf.run(answer_main, {"batch": BATCH}, backend, duotf.ClusterSpec(workers=2)) as cluster:
            out = cluster.inference(df, keep=["id"])
            cluster.wait(timeout=3600)
        checked = out.select(F.count("*").alias("n"),
                             F.sum((F.col("prediction") == F.col("id")).cast("long")).alias("ok"))
        n, ok = checked.first()
        return n if ok == n else -ok

    where = tempfile.mkdtemp(prefix="duotf-defaults-")

    def tfrecords():
        try:
            dfio.spark_to_tfrecords(df, os.path.join(where, "x"), mode="overwrite")
            back = dfio.tfrecords_to_spark(session, os.path.join(where, "x"), schema=df.schema)
            n, total = back.select(F.count("*"), F.sum("id")).first()
            return n if total == want else -n
        finally:
            shutil.rmtree(where, ignore_errors=True)

    paths = [
        ("train", "train(df), `array<float>` column", lambda: train(df)),
        ("pack_tensors", "train(pack_tensors(df, 'x'))", lambda: train(pack_tensors(df, "x"))),
        ("feed_cache", "feed_cache(df), then train(cache)", cached),
        ("inference", "inference(df, keep=['id'])", inference),
        ("tfrecords", "spark_to_tfrecords, then tfrecords_to_spark", tfrecords),
    ]
    for key, name, fn in paths:
        if opts.only is None or key in opts.only:
            measure(name, fn, rows)
    session.stop()


if __name__ == "__main__":
    main()
