"""TensorFlowOnSpark 2.2.5's InputMode.SPARK feed, measured as the baseline of benchmarks/feed.py.

Only a benchmark baseline, never a dependency: the wheel is fetched by
``pip download --no-deps tensorflowonspark==2.2.5`` (or given to --with-tfos WHEEL); it is
added to sys.path here and shipped to the executors with addPyFile. TFoS does not run in Spark
local mode and puts one node per executor, so it gets its own SparkSession on the same standalone
cluster with spark.task.cpus = the executor's cores (one task slot per executor).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time


def _drain(args, ctx):
    import time as _time

    from tensorflowonspark import TFNode

    feed = TFNode.DataFeed(ctx.mgr, False)
    rows, first = 0, None
    while not feed.should_stop():
        batch = feed.next_batch(args["batch"])
        if batch and first is None:
            first = _time.time()
        rows += len(batch)
    with open(os.path.join(args["out"], f"worker-{ctx.worker_num}"), "w") as f:
        f.write(f"{rows} {first} {_time.time()}")


def _answer(args, ctx):
    import time as _time

    from tensorflowonspark import TFNode

    feed = TFNode.DataFeed(ctx.mgr, False)
    rows, first = 0, None
    while not feed.should_stop():
        batch = feed.next_batch(args["batch"])
        if batch:
            first = first or _time.time()
            feed.batch_results([float(row[1]) for row in batch])  # the identity of the label
            rows += len(batch)
    with open(os.path.join(args["out"], f"worker-{ctx.worker_num}"), "w") as f:
        f.write(f"{rows} {first} {_time.time()}")


def run(master: str, wheel: str, rows: int, kind: str, cores: int = 2, inference: bool = False) -> float:
    """TFoS's rows/s feeding an RDD of ``kind``: "lists" ``([784 floats], label)`` as its
    examples make them, "numpy" ``(float32[784], label)``, "frame" the rows of the benchmarks'
    MNIST-like DataFrame (``benchmarks.mnist``) as tuples ``([784 floats], label)``, as a TFoS
    program feeds a DataFrame (``df.rdd``), or "tiny" ``(i,)``."""
    import zipfile

    site = tempfile.mkdtemp(prefix="tfos-site-")
    zipfile.ZipFile(wheel).extractall(site)  # pure Python: the wheel unpacked is importable
    sys.path.insert(0, site)
    from pyspark import cloudpickle
    from pyspark.sql import SparkSession
    from tensorflowonspark import TFCluster

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors lack benchmarks/

    session = (SparkSession.builder.master(master).appName("tfos-baseline")
               .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
               .config("spark.executor.cores", str(cores)).config("spark.task.cpus", str(cores))
               .config("spark.executorEnv.PYTHONPATH", site)
               .getOrCreate())
    sc = session.sparkContext
    sc.setLogLevel("ERROR")
    try:
        tiny = kind == "tiny"
        if tiny:
            rdd = sc.parallelize(range(rows), 8).map(lambda i: (i,))
        elif kind == "numpy":
            import numpy as np

            rdd = sc.parallelize(range(rows), 8).map(
                lambda i: (np.full(784, (i % 255) / 255.0, np.float32), i % 10))
        elif kind == "frame":
            from benchmarks.mnist import mnist_frame

            rdd = mnist_frame(session, rows, 8).rdd.map(tuple)
        else:
            rdd = sc.parallelize(range(rows), 8).map(lambda i: ([(i % 255) / 255.0] * 784, i % 10))
        rdd = rdd.cache()
        rdd.count()
        out = tempfile.mkdtemp(prefix="tfos-")
        cluster = TFCluster.run(sc, _answer if inference else _drain,
                                {"batch": 1000 if inference else 100, "out": out}, 2, 0, False,
                                TFCluster.InputMode.SPARK)
        t0 = time.time()
        if inference:
            answered = cluster.inference(rdd).count()
            assert answered == rows, (answered, rows)
        else:
            cluster.train(rdd, 1)
        cluster.shutdown()
        fed, last = 0, t0
        for name in os.listdir(out):
            n, _, end = open(os.path.join(out, name)).read().split()
            fed, last = fed + int(n), max(last, float(end))
        rate = fed / (last - t0)
        label = {"tiny": "tiny", "numpy": "MNIST-like numpy", "lists": "MNIST-like lists",
                 "frame": "MNIST-like DataFrame"}[kind]
        label += " inference" if inference else ""
        print(f"  TFoS  {label + ' RDD':<28} {fed:>9} rows in {last - t0:6.2f} s: {rate:>10,.0f} rows/s "
              f"{rate * (8 if tiny else 3144) / 1e6:>7.0f} MB/s", flush=True)
        return rate
    finally:
        session.stop()
