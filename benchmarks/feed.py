"""Engine feed throughput: rows/s and MB/s pushed from Spark or Dask into TF nodes.

    python -m benchmarks.feed [--spark-master spark://HOST:PORT] [--with-tfos [WHEEL]]
                              [--rows 250000 --epochs 50] [--tiny-rows 4000000 --tiny-epochs 20]
                              [--backends spark dask]

Each of 2 worker nodes drains ``ctx.get_data_feed().dataset(100)`` (feed only, no model) for
``--epochs`` epochs, so that every run lasts 10 s or more. The rate counts the rows read while
every node was reading: from the moment the last node to start (TF's start-up in a node takes
seconds, and varies) read its first batch to the moment the first node to finish read its last;
the rate from the first batch to the last is printed beside it. Spark feeds the MNIST-like rows
three ways: the DataFrame with an ``array<float>`` column; the same rows converted once into a
``duotf.spark.feed_cache`` (ready-to-send frames in files on the executors); and a
DataFrame with the column packed as a binary tensor column (``duotf.spark.pack_tensors``).

Printed beside, measured in the same run: the limit, an in-process
``tf.data.Dataset.from_tensor_slices`` over the same arrays drained at the same batch size for
the same epochs (warm, best of two); and
with --with-tfos, TensorFlowOnSpark 2.2.5 (InputMode.SPARK, ``next_batch(100)``) on the same
Spark cluster and data (its wheel is fetched with ``pip download`` unless given).
Targets: >= 30x TFoS rows/s on MNIST-like rows; aggregate >= 50% of the limit.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TF loads, here and in the nodes

import numpy as np  # noqa: E402

import duotf  # noqa: E402

BATCH = 100


def drain_main(args, ctx):
    import time as _time

    __import__("tensorflow")  # what a TF program does first

    feed = ctx.get_data_feed(train=True)
    rows = 0
    marks = []  # (time, rows read by then), about every 20,000 rows
    step = 0
    for batch in feed.dataset(args["batch"]):
        rows += int(next(iter(batch.values())).shape[0])
        last = _time.time()
        if rows >= step:
            marks.append((last, rows))
            step = rows + 20_000
    # The time of the last batch, not of the loop's end: ending a long tf.data iterator waits
    # for TF's autotuning thread, which here took up to 6 s after the last batch.
    marks.append((last, rows))
    return {"rows": rows, "marks": marks}


def _rows_at(marks, t: float) -> float:
    """Rows a node had read at time ``t``, interpolated between its marks."""
    import bisect

    times = [m[0] for m in marks]
    i = bisect.bisect_right(times, t)
    if i == 0:
        return 0.0
    if i == len(marks):
        return float(marks[-1][1])
    (t0, r0), (t1, r1) = marks[i - 1], marks[i]
    return r0 + (r1 - r0) * (t - t0) / max(t1 - t0, 1e-9)


def feed_rates(results):
    """``(whole, steady, seconds)``: rows/s from the first batch any node read to the last, and
    while every node was reading (from the moment the last node to start read its first batch
    to the moment the first node to finish read its last): the feed without the nodes' own
    start-up, which the limit leaves out too."""
    first = [r["marks"][0][0] for r in results]
    last = [r["marks"][-1][0] for r in results]
    whole = sum(r["rows"] for r in results) / (max(last) - min(first))
    t0, t1 = max(first), min(last)
    if t1 - t0 < 1.0:
        return whole, None, t1 - t0
    steady = sum(_rows_at(r["marks"], t1) - _rows_at(r["marks"], t0) for r in results) / (t1 - t0)
    return whole, steady, t1 - t0


def limit(x, y, epochs: int, repeats: int = 2) -> float:
    """The in-process limit: rows/s draining ``from_tensor_slices((x, y)).batch(100)`` for
    ``epochs`` epochs, the best of ``repeats`` runs after a warm-up pass (TF's first dataset in a
    process pays its start-up, about 3x slower; the feed's rate leaves the nodes' start-up out)."""
    import tensorflow as tf

    for _ in tf.data.Dataset.from_tensor_slices((x[:20_000], y[:20_000])).batch(BATCH):
        pass
    best = 0.0
    for _ in range(repeats):
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat(epochs)
        t0 = time.perf_counter()
        n = 0
        for bx, _ in ds:
            n += int(bx.shape[0])
        best = max(best, n / (time.perf_counter() - t0))
    return best


def run_duotf(backend, data, epochs: int, row_bytes: int, label: str):
    with duotf.run(drain_main, {"batch": BATCH}, backend, duotf.ClusterSpec(workers=2)) as cluster:
        report = cluster.train(data, epochs=epochs)
        results = cluster.wait()
    fed = sum(r["rows"] for r in results)
    assert fed == report["rows_fed"], (fed, report)
    whole, steady, seconds = feed_rates(results)
    rate = steady or whole
    print(f"  duotf {label:<30} {fed:>9} rows: {rate:>10,.0f} rows/s {rate * row_bytes / 1e6:>6.0f} MB/s "
          f"over {seconds:5.1f} s with every node reading ({whole:,.0f} rows/s from the first batch "
          f"to the last)" + ("  (under 10 s: raise the epochs)" if seconds < 10 else ""), flush=True)
    return rate


def spark_data(session, rows: int, tiny: bool, partitions: int, packed: bool = False):
    from pyspark.sql import functions as F

    from duotf.spark import pack_tensors

    df = session.range(0, rows, numPartitions=partitions)
    if tiny:
        df = df.select(F.col("id").alias("x"))
    else:
        df = df.select(F.array_repeat((F.col("id") % 255 / 255.0).cast("float"), 784).alias("features"),
                       (F.col("id") % 10).alias("label"))
        if packed:
            df = pack_tensors(df, "features")
    df = df.cache()
    df.count()
    return df


def tfos_wheel(path):
    """The TFoS 2.2.5 wheel: ``path``, or fetched from PyPI (never installed)."""
    import glob
    import subprocess
    import sys
    import tempfile

    if path:
        return path
    where = tempfile.mkdtemp(prefix="tfos-wheel-")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", where,
                    "tensorflowonspark==2.2.5"], check=True)
    return glob.glob(os.path.join(where, "tensorflowonspark-2.2.5-*.whl"))[0]


def dask_data(rows: int, tiny: bool, chunk: int):
    import dask.array as da

    if tiny:
        return (da.arange(rows, chunks=chunk, dtype=np.int64),)
    x = da.random.default_rng(0).random((rows, 784), chunks=(chunk, 784), dtype=np.float32)
    y = da.arange(rows, chunks=chunk, dtype=np.int64) % 10
    return (x.persist(), y.persist())


def cli():
    parser = argparse.ArgumentParser(description="duotf engine feed benchmark")
    parser.add_argument("--rows", type=int, default=250_000, help="MNIST-like rows in the data")
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--tiny-rows", type=int, default=4_000_000)
    parser.add_argument("--tiny-epochs", type=int, default=20)
    parser.add_argument("--backends", nargs="*", default=["spark", "dask"])
    parser.add_argument("--spark-master", default="local[3]")
    parser.add_argument("--with-tfos", nargs="?", const="", default=None, metavar="WHEEL",
                        help="also run TensorFlowOnSpark 2.2.5 (optionally from this wheel file)")
    parser.add_argument("--tfos-rows", type=int, default=100_000)
    opts = parser.parse_args()

    x = np.random.default_rng(0).random((opts.rows, 784), dtype=np.float32)
    y = np.arange(opts.rows, dtype=np.int64) % 10
    mnist_limit = limit(x, y, opts.epochs)
    del x, y
    tiny_limit = limit(np.arange(opts.tiny_rows, dtype=np.int64), np.zeros(opts.tiny_rows, np.int8),
                       opts.tiny_epochs)
    print(f"limit (in-process from_tensor_slices, batch {BATCH}): MNIST-like {mnist_limit:,.0f} rows/s "
          f"({mnist_limit * 3144 / 1e6:.0f} MB/s), tiny {tiny_limit:,.0f} rows/s", flush=True)

    rates = {}
    if "spark" in opts.backends:
        from pyspark.sql import SparkSession

        from duotf.spark import feed_cache

        # Spark's defaults (1 GiB driver and executor memory, 10,000 records per Arrow batch):
        # only the master, and the UI and progress bar off (they cost nothing to the figures).
        session = (SparkSession.builder.master(opts.spark_master).config("spark.ui.enabled", "false")
                   .config("spark.ui.showConsoleProgress", "false").getOrCreate())
        print("Spark settings beyond the master URL: none (engine defaults)")
        session.sparkContext.setLogLevel("ERROR")
        try:
            print(f"Spark {opts.spark_master}:")
            for kind, packed, label in [("mnist", False, "MNIST-like array<float> column"),
                                        ("mnist-packed", True, "MNIST-like packed tensor column")]:
                df = spark_data(session, opts.rows, False, 8, packed=packed)
                rates["spark", kind] = run_duotf(session, df, opts.epochs, 3144, label)
                if not packed:
                    t0 = time.perf_counter()
                    cache = feed_cache(df)
                    print(f"  (feed_cache of the array<float> DataFrame built in {time.perf_counter() - t0:.1f} s)")
                    rates["spark", "mnist-cache"] = run_duotf(session, cache, opts.epochs, 3144,
                                                              "MNIST-like feed_cache(DataFrame)")
                    cache.unpersist()
                df.unpersist()
            df = spark_data(session, opts.tiny_rows, True, 8)
            rates["spark", "tiny"] = run_duotf(session, df, opts.tiny_epochs, 8, "tiny DataFrame")
            df.unpersist()
        finally:
            session.stop()
        if opts.with_tfos is not None:
            from benchmarks import tfos_feed

            if not opts.spark_master.startswith("spark://"):
                raise SystemExit("--with-tfos needs --spark-master spark://... (TFoS has no local mode)")
            wheel = tfos_wheel(opts.with_tfos)
            rates["tfos", "mnist"] = tfos_feed.run(opts.spark_master, wheel, opts.tfos_rows, False)
            rates["tfos", "tiny"] = tfos_feed.run(opts.spark_master, wheel, opts.tfos_rows * 3, True)
    if "dask" in opts.backends:
        from distributed import Client, LocalCluster

        with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=None,
                          host="127.0.0.1") as lc, Client(lc) as client:
            print("Dask LocalCluster (2 workers):")
            rates["dask", "mnist"] = run_duotf(client, dask_data(opts.rows, False, 20_000), opts.epochs,
                                               3144, "MNIST-like arrays (x, y)")
            rates["dask", "tiny"] = run_duotf(client, dask_data(opts.tiny_rows, True, 250_000),
                                              opts.tiny_epochs, 8, "tiny array")
    print("summary:")
    for (engine, kind), rate in sorted(rates.items()):
        base = kind.split("-")[0]
        lim = mnist_limit if base == "mnist" else tiny_limit
        line = f"  {engine:<6}{kind:<13}{rate:>11,.0f} rows/s = {rate / lim:5.0%} of the limit"
        if engine != "tfos" and ("tfos", base) in rates:
            line += f", {rate / rates['tfos', base]:.0f}x TFoS"
        print(line)


if __name__ == "__main__":
    cli()
