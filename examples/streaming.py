"""Train the digits classifier from a stream: a Spark Structured Streaming query, or Dask futures.

The nodes run the digits program of examples/digits/train.py unchanged (one pass of its feed
mode, under MultiWorkerMirroredStrategy); the driver streams the training rows into them while
they train, as new data would arrive:

- Spark: the rows are written as Parquet files, one file per pass over the training set, and a
  streaming query reads the folder (``maxFilesPerTrigger`` files per micro-batch) and feeds
  each micro-batch through ``duotf.spark.feed_stream``; ``availableNow`` ends the query once
  every file is read, and with it the nodes' feed. Its checkpoint records the micro-batches fed.
- Dask: each pass is a few partitions computed by Dask futures (``client.submit``), fed by
  ``duotf.dask.feed_stream`` as they complete.

    python examples/streaming.py --backend spark
    python examples/streaming.py --backend dask --passes 20
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time

if __package__ in (None, ""):  # run as a script: make the examples package importable
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import cloudpickle
import numpy as np

import duotf
from examples.digits import train as digits_train
from examples.digits.train import main, make_backend, prepare_data

# main is the digits program's: sent to the nodes by value, so that the executors (a standalone
# cluster's, a Dask worker's node processes) need not import the examples package. A main of
# this file travels by value anyway: cloudpickle sends what __main__ defines by value.
cloudpickle.register_pickle_by_value(digits_train)


def shuffled_pass(data_path: str, seed: int):
    """One pass over the training rows in its own order, as a pandas DataFrame ``x`` (an array
    of 64 floats a row), ``y``."""
    import pandas as pd

    data = np.load(data_path)
    order = np.random.default_rng(seed).permutation(len(data["y_train"]))
    return pd.DataFrame({"x": list(data["x_train"][order]), "y": data["y_train"][order]})


def _part(data_path: str, seed: int, part: int, parts: int):
    frame = shuffled_pass(data_path, seed)
    bounds = np.linspace(0, len(frame), parts + 1).astype(int)
    return frame.iloc[bounds[part]:bounds[part + 1]].reset_index(drop=True)


def stream_spark(cluster, spark, data_path: str, work_dir: str, passes: int,
                 files_per_batch: int) -> dict:
    """Write ``passes`` Parquet files into a folder and stream it into the cluster."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = os.path.join(work_dir, "incoming")
    os.makedirs(source, exist_ok=True)
    for seed in range(passes):
        frame = shuffled_pass(data_path, seed)
        table = pa.table({"x": pa.array([row.tolist() for row in frame["x"]], pa.list_(pa.float32())),
                          "y": pa.array(frame["y"], pa.int64())})
        pq.write_table(table, os.path.join(source, f"pass-{seed:04d}.parquet"))
    rows = (spark.readStream.schema("x array<float>, y long")
            .option("maxFilesPerTrigger", files_per_batch).parquet(source))
    stream = duotf.spark.feed_stream(cluster, rows,
                                     checkpoint_location=os.path.join(work_dir, "checkpoint"),
                                     trigger={"availableNow": True})
    return stream.wait()  # the query ends once every file is read: so does the nodes' feed


def stream_dask(cluster, client, data_path: str, passes: int, parts: int) -> dict:
    """Compute ``passes`` x ``parts`` partitions with futures and feed them as they complete."""
    def futures():  # as a source would make them: one after another
        for seed in range(passes):
            for part in range(parts):
                yield client.submit(_part, data_path, seed, part, parts, pure=False)

    return duotf.dask.feed_stream(cluster, futures())


def train_stream(handle, data_dir: str, *, workers: int = 2, passes: int = 10, batch_size: int = 64,
                 lr: float = 0.5, seed: int = 1, files_per_batch: int = 2, env=None) -> dict:
    """Run the digits program on ``handle`` (a SparkSession or a Dask Client) fed by a stream;
    return the chief's test accuracy, the feed's counts and the seconds it took."""
    args = {
        "data": prepare_data(os.path.join(data_dir, "digits.npz")),
        "batch_size": batch_size,
        "epochs": 1,  # one pass of the feed: the whole stream, until it ends
        "lr": lr,
        "seed": seed,
        "model_dir": os.path.join(data_dir, "model"),
        "feed": {"x": "x", "y": "y"},
    }
    t0 = time.monotonic()
    spec = duotf.ClusterSpec(workers=workers)
    with duotf.run(main, args, handle, spec, env=env or {"TF_CPP_MIN_LOG_LEVEL": "2"}) as cluster:
        if hasattr(handle, "sparkContext"):
            counts = stream_spark(cluster, handle, args["data"], data_dir, passes, files_per_batch)
        else:
            counts = stream_dask(cluster, handle, args["data"], passes, parts=3)
        results = cluster.wait()
    return {"accuracy": results[0]["accuracy"], "counts": counts,
            "seconds": time.monotonic() - t0}


def cli(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["spark", "dask"], default="spark",
                        help="spark: a streaming query on local[workers+1], or spark-submit's "
                        "--master; dask: a LocalCluster's futures (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=2, help="TF workers, nodes (default: %(default)s)")
    parser.add_argument("--passes", type=int, default=10,
                        help="passes over the training rows the stream brings (default: %(default)s)")
    parser.add_argument("--files-per-batch", type=int, default=2,
                        help="Spark: files (passes) per micro-batch (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="global batch; each worker's step takes its share (default: %(default)s)")
    parser.add_argument("--lr", type=float, default=0.5, help="SGD learning rate (default: %(default)s)")
    parser.add_argument("--data-dir", default=None,
                        help="where the data, the stream's files and checkpoint go (default: a new "
                        "temporary directory)")
    parser.add_argument("--quiet", action="store_true",
                        help="do not show the nodes' output (default: show it)")
    opts = parser.parse_args(argv)
    if not opts.quiet:
        logging.basicConfig(format="%(message)s")
        logging.getLogger("duotf.node").setLevel(logging.INFO)
    data_dir = opts.data_dir or tempfile.mkdtemp(prefix="duotf-streaming-")
    handle = make_backend(opts.backend, opts.workers)
    try:
        out = train_stream(handle, data_dir, workers=opts.workers, passes=opts.passes,
                           batch_size=opts.batch_size, lr=opts.lr,
                           files_per_batch=opts.files_per_batch)
    finally:
        if opts.backend == "dask":
            cluster = handle.cluster
            handle.close()
            cluster.close()
    counts = out["counts"]
    print(f"backend={opts.backend} workers={opts.workers} test accuracy={out['accuracy']:.4f}; "
          f"{counts['rows_fed']} rows fed in {counts['chunks']} chunks, "
          f"{counts['rows_fed'] / max(counts['seconds'], 1e-9):.0f} rows/s while feeding "
          f"({out['seconds']:.1f} s in all)")
    return out


if __name__ == "__main__":
    cli()
