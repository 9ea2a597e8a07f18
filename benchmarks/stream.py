"""Streaming input: the rate of a stream fed into 2 nodes, and its backpressure.

    python -m benchmarks.stream [--backends spark dask] [--chunks 10] [--rows 200000]

Throughput: each of 2 worker nodes drains ``next_batch(10000)`` (feed only, no model) from
``--chunks`` pieces of ``--rows`` rows (a float64 and an int64 column): Spark, as Parquet files
read by a streaming query (``maxFilesPerTrigger=2``, ``availableNow``) through
``duotf.spark.feed_stream``; Dask, as futures yielded one by one and fed by
``duotf.dask.feed_stream``. The rate is every row fed over the whole stream, from the call
that starts it to the end of the nodes' feed (each micro-batch's count, its feed and the query's
own work included).

Backpressure (Dask): the same rows in 4 times as many futures (a node queues 8 frames, and a
future's rows are a frame or more) into nodes that read 1,000 rows per ``--pause`` seconds (a
training step's time): ``feed_stream`` is held to their pace, less what their bounded queues
take.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

import duotf

ENV = {"TF_CPP_MIN_LOG_LEVEL": "3"}


def drain(args, ctx):
    import time

    feed = ctx.get_data_feed(train=True)
    rows = 0
    while not feed.should_stop():
        rows += len(feed.next_batch(args["batch"]))
        if args["pause"]:
            time.sleep(args["pause"])  # a training step's time
    return rows, time.time()


def frame(k: int, rows: int):
    import pandas as pd

    ids = np.arange(k * rows, (k + 1) * rows)
    return pd.DataFrame({"x": ids.astype(np.float64), "id": ids})


def spark_stream(chunks: int, rows: int) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[3]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    folder = tempfile.mkdtemp(prefix="duotf-bench-stream-")
    os.makedirs(os.path.join(folder, "in"))
    for k in range(chunks):
        pq.write_table(pa.Table.from_pandas(frame(k, rows), preserve_index=False),
                       os.path.join(folder, "in", f"part-{k:04d}.parquet"))
    args = {"batch": 10000, "pause": 0.0}
    with duotf.run(drain, args, spark, duotf.ClusterSpec(workers=2), env=ENV) as cluster:
        source = (spark.readStream.schema("x double, id long").option("maxFilesPerTrigger", 2)
                  .parquet(os.path.join(folder, "in")))
        t0 = time.time()
        stream = duotf.spark.feed_stream(cluster, source, trigger={"availableNow": True},
                                         checkpoint_location=os.path.join(folder, "checkpoint"))
        counts = stream.wait()
        seconds = time.time() - t0
        read = sum(rows for rows, _ in cluster.wait())
    spark.stop()
    return (f"spark local[3]: {counts['rows_fed']:,} rows ({read:,} read) in {counts['chunks']} "
            f"micro-batches, {seconds:.2f} s: {counts['rows_fed'] / seconds:,.0f} rows/s")


def dask_stream(client, chunks: int, rows: int, pause: float) -> str:
    args = {"batch": 1000 if pause else 10000, "pause": pause}
    with duotf.run(drain, args, client, duotf.ClusterSpec(workers=2), env=ENV) as cluster:
        def futures():
            for k in range(chunks):
                yield client.submit(frame, k, rows, pure=False)

        t0 = time.time()
        counts = duotf.dask.feed_stream(cluster, futures())
        fed = time.time()
        results = cluster.wait()
    read = sum(rows for rows, _ in results)
    done = max(end for _, end in results)
    line = (f"dask (2 workers): {counts['rows_fed']:,} rows ({read:,} read) in {counts['chunks']} "
            f"chunks, feed_stream took {fed - t0:.2f} s: {counts['rows_fed'] / (fed - t0):,.0f} rows/s")
    if pause:
        line += (f"; nodes reading at most {2 * 1000 / pause:,.0f} rows/s (1,000 rows per "
                 f"{pause * 1000:g} ms each) ended {done - fed:.2f} s after it returned")
    return line


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", choices=["spark", "dask"], default=["spark", "dask"],
                        help="engines to measure (default: %(default)s)")
    parser.add_argument("--chunks", type=int, default=10, help="files / futures (default: %(default)s)")
    parser.add_argument("--rows", type=int, default=200_000, help="rows in each (default: %(default)s)")
    parser.add_argument("--pause", type=float, default=0.01,
                        help="backpressure: seconds a node takes per 1,000 rows (default: %(default)s)")
    opts = parser.parse_args(argv)
    if "spark" in opts.backends:
        print(spark_stream(opts.chunks, opts.rows), flush=True)
    if "dask" in opts.backends:
        from distributed import Client, LocalCluster

        with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=None) as lc, \
                Client(lc) as client:
            print(dask_stream(client, opts.chunks, opts.rows, 0.0), flush=True)
            # the same rows in 4 times as many futures: more frames than a node queues (8)
            print(dask_stream(client, opts.chunks * 4, opts.rows // 4, opts.pause), flush=True)


if __name__ == "__main__":
    main()
