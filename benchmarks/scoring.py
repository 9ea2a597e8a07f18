"""DataFrame scoring throughput: rows/s of ``duotf.predict_udf`` / ``duotf.spark.predict`` and
``duotf.dask.predict``, beside one process running ``model.predict`` over the same rows.

    python -m benchmarks.scoring [--rows 50000] [--spark-master local[2]] [--workers 2]
                                 [--with-tfos [WHEEL]] [--backends spark spark-connect dask]
                                 [--json PATH]

The model is an MNIST-sized MLP (784 -> 256 relu -> 10; ``--hidden 2048 --layers 3`` makes one
whose compute outweighs moving its rows), saved as ``.keras`` and exported as a
SavedModel; every row is 784 float32 values. Each engine runs ``--workers`` worker processes
(Spark ``local[N]``, or a standalone master of which a session takes N cores:
``spark.cores.max``; a Dask ``LocalCluster`` of N single-thread processes). The
``spark-connect`` backend runs the Spark cases again through a Spark Connect session: a Connect
server (``tests.conftest.connect_server``: pyspark's ``sbin/start-connect-server.sh``, started
here and stopped after) whose application runs on the same master with the same settings, once
the classic session has ended; its rows are printed beside the classic ones, with their ratio
to them (TensorFlowOnSpark needs an RDD: classic Spark only).
Every figure is the second of two runs over the same cached data (the first loads TF and the
model in every worker process; its rate is printed beside as "cold"; each run is a new graph, so
Dask computes it again rather than handing back results it still holds). Printed beside,
measured in the same run: ``model.predict(x, batch_size)`` over the same rows (warm, best of
2) in this process with every core, and in a process held to one core (``sched_setaffinity``
and one TensorFlow thread), which is what one worker of one core can do: the goal is >= 0.8x
that per-worker rate times the workers. With --with-tfos,
TensorFlowOnSpark 2.2.5's ``TFModel.transform`` on the same Spark session and DataFrame (its
wheel fetched with ``pip download`` unless given, never installed: put on the workers' path).
``--json PATH`` also writes the summary's rates, the baselines and the run's command, settings
and machine to PATH (``benchmarks/record.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

from benchmarks.feed import quiet_tf
from benchmarks.record import Record

WIDTH, CLASSES = 784, 10
#: seconds of each case's first (cold) run, by its label, as ``timed`` printed them
COLD_SECONDS: dict = {}


def make_model(folder: str, hidden: int = 256, layers: int = 1):
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((WIDTH,), name="features")
    x = inputs
    for _ in range(layers):
        x = keras.layers.Dense(hidden, activation="relu")(x)
    model = keras.Model(inputs, keras.layers.Dense(CLASSES)(x))
    path = os.path.join(folder, "mlp.keras")
    model.save(path)
    export = os.path.join(folder, "mlp_sm")
    model.export(export, verbose=False)
    return model, path, export


def rows_of(n: int) -> np.ndarray:
    """The rows every engine scores: row i holds 784 times (i % 255) / 255."""
    return np.repeat(((np.arange(n) % 255) / 255.0).astype(np.float32)[:, None], WIDTH, axis=1)


def baseline(model, x, batch: int) -> float:
    model.predict(x[:batch * 2], batch_size=batch, verbose=0)  # warm: traces the predict function
    best = 0.0
    for _ in range(2):
        t0 = time.perf_counter()
        model.predict(x, batch_size=batch, verbose=0)
        best = max(best, len(x) / (time.perf_counter() - t0))
    return best


_ONE_CORE = """
import os, sys, time
os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
import numpy as np
sys.path.insert(0, %(root)r)
from benchmarks.scoring import rows_of, baseline
import keras
model = keras.saving.load_model(%(path)r, compile=False)
print(baseline(model, rows_of(%(rows)d), %(batch)d))
"""


def baseline_one_core(path: str, rows: int, batch: int) -> float:
    """``baseline`` in a fresh process held to one core with one TensorFlow thread per pool."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1")
    code = _ONE_CORE % {"root": root, "path": path, "rows": rows, "batch": batch}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip().splitlines()[-1])


def timed(label: str, run, rows: int, rates: dict) -> None:
    """``run(k)`` builds and runs the k-th job (k = 0: cold, 1: warm)."""
    t0 = time.perf_counter()
    run(0)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    run(1)
    warm = time.perf_counter() - t0
    rates[label] = rows / warm
    COLD_SECONDS[label] = cold
    print(f"  {label:<54} warm {rows / warm:>9,.0f} rows/s ({warm:5.1f} s)  cold "
          f"{rows / cold:>9,.0f} rows/s ({cold:5.1f} s)", flush=True)


def spark_settings(opts, site=None) -> dict:
    """The settings of both Spark sessions, classic and Connect's: this checkout (after
    ``site``, where given) on the executors' ``PYTHONPATH``, and on a standalone master a
    session takes ``--workers`` cores (``local[N]`` has N already)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = [p for p in [site, root] + os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    conf = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
            "spark.driver.memory": "2g", "spark.executorEnv.PYTHONPATH": os.pathsep.join(path)}
    if opts.spark_master.startswith("spark://"):
        conf["spark.cores.max"] = str(opts.workers)
    return conf


def spark_bench(opts, paths, rates, tfos_site=None):
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(opts.spark_master).appName("duotf-scoring-bench")
    for key, value in spark_settings(opts, tfos_site).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    try:
        print(f"Spark {opts.spark_master} ({opts.rows} rows, {opts.partitions} partitions, cached):")
        spark_cases(session, "spark", opts, paths, rates, tfos_site)
    finally:
        session.stop()


def connect_bench(opts, paths, rates):
    """The Spark cases through a Spark Connect session, on a Connect server whose application
    runs on ``--spark-master`` with the classic session's settings (which has ended by then:
    its executors are free)."""
    from pyspark.sql import SparkSession

    from tests.conftest import connect_server

    server = connect_server(opts.spark_master, spark_settings(opts))
    url = next(server)
    try:
        session = SparkSession.builder.remote(url).getOrCreate()
        try:
            print(f"Spark Connect ({url}, its application on {opts.spark_master}; {opts.rows} rows, "
                  f"{opts.partitions} partitions, cached):")
            spark_cases(session, "spark-connect", opts, paths, rates)
        finally:
            session.stop()
    finally:
        os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)  # pyspark's process-wide mark
        next(server, None)  # stops the server


def spark_cases(session, engine: str, opts, paths, rates, tfos_site=None):
    """The Spark cases on ``session`` (classic or Connect), each labelled after ``engine``."""
    from pyspark.sql import functions as F

    import duotf
    import duotf.spark

    keras_path, export = paths
    df = session.range(0, opts.rows, numPartitions=opts.partitions).select(
        "id", F.array_repeat((F.col("id") % 255 / 255.0).cast("float"), WIDTH).alias("features"))
    df = df.cache()
    df.count()
    packed = duotf.spark.pack_tensors(df, "features").cache()
    packed.count()

    def noop(frame):
        return lambda _: frame.write.format("noop").mode("overwrite").save()

    def same(batches):  # no model: what moving the rows to Python and back costs alone
        yield from batches

    timed(f"{engine} mapInArrow, packed, no model (transport)",
          noop(packed.mapInArrow(same, packed.schema)), opts.rows, rates)
    udf = duotf.predict_udf(keras_path, "array<float>", batch_size=opts.batch)
    timed(f"{engine} predict_udf, array<float> column", noop(df.withColumn("p", udf("features"))),
          opts.rows, rates)
    timed(f"{engine} predict_udf, packed tensor column", noop(packed.withColumn("p", udf("features"))),
          opts.rows, rates)
    timed(f"{engine} predict (mapInArrow), packed, SavedModel",
          noop(duotf.spark.predict(packed, export, batch_size=opts.batch)), opts.rows, rates)
    if tfos_site:
        tfos_bench(df, export, opts, rates)
    df.unpersist()
    packed.unpersist()


def tfos_bench(df, export, opts, rates):
    try:
        from tensorflowonspark.pipeline import TFModel
    except Exception as exc:  # noqa: BLE001 - a baseline that cannot run is reported, not raised
        print(f"  TFoS 2.2.5 TFModel: cannot import: {type(exc).__name__}: {exc}")
        return
    model = (TFModel({"export_dir": export}).setExportDir(export).setSignatureDefKey("serving_default")
             .setTagSet("serve").setInputMapping({"features": "features"})
             .setOutputMapping({"output_0": "prediction"}).setBatchSize(opts.batch))
    try:
        out = model.transform(df.select("features"))
        timed("TFoS 2.2.5 TFModel.transform (SavedModel)",
              lambda _: out.write.format("noop").mode("overwrite").save(), opts.rows, rates)
    except Exception as exc:  # noqa: BLE001
        text = str(exc).strip().splitlines()
        print(f"  TFoS 2.2.5 TFModel.transform failed: {type(exc).__name__}: "
              f"{[line for line in text if 'Error' in line][-1:] or text[:1]}")


def dask_bench(opts, paths, rates):
    import dask.dataframe as dd
    import pandas as pd
    import pyarrow as pa
    from distributed import Client, LocalCluster

    import duotf.dask

    keras_path, export = paths
    bounds = np.linspace(0, opts.rows, opts.partitions + 1).astype(int)

    def part(bound):
        start, stop = bound
        x = rows_of(stop)[start:]
        values = pa.array(x.reshape(-1))
        offsets = pa.array(np.arange(len(x) + 1, dtype=np.int32) * WIDTH)
        features = pd.arrays.ArrowExtensionArray(pa.ListArray.from_arrays(offsets, values))
        return pd.DataFrame({"id": np.arange(start, stop), "features": features})

    with LocalCluster(n_workers=opts.workers, threads_per_worker=1, dashboard_address=None,
                      host="127.0.0.1") as cluster, Client(cluster) as client:
        ddf = dd.from_map(part, list(zip(bounds[:-1], bounds[1:]))).persist()
        print(f"Dask LocalCluster ({opts.workers} workers of 1 thread, {opts.rows} rows, "
              f"{opts.partitions} partitions, persisted):")
        def job(path):
            def run(k):  # a new output name: a new graph, computed again
                out = duotf.dask.predict(ddf, path, batch_size=opts.batch, output=f"prediction{k}")
                client.compute(out[f"prediction{k}"].map_partitions(len), sync=True)
            return run

        for label, path in [("dask predict (.keras)", keras_path), ("dask predict (SavedModel)", export)]:
            timed(label, job(path), opts.rows, rates)


def cli():
    quiet_tf()
    parser = argparse.ArgumentParser(description="duotf DataFrame scoring benchmark")
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256, help="units of each hidden layer")
    parser.add_argument("--layers", type=int, default=1, help="hidden layers")
    parser.add_argument("--spark-master", default=None, help="default: local[--workers]")
    parser.add_argument("--backends", nargs="*", default=["spark", "spark-connect", "dask"],
                        choices=["spark", "spark-connect", "dask"])
    parser.add_argument("--with-tfos", nargs="?", const="", default=None, metavar="WHEEL",
                        help="also run TensorFlowOnSpark 2.2.5's TFModel (optionally from this wheel)")
    parser.add_argument("--json", metavar="PATH",
                        help="also write the summary's rates, the baselines and the run's command, "
                             "settings and machine to PATH (benchmarks/record.py)")
    opts = parser.parse_args()
    opts.spark_master = opts.spark_master or f"local[{opts.workers}]"
    record = Record("scoring", vars(opts)) if opts.json else None

    folder = tempfile.mkdtemp(prefix="duotf-scoring-")
    model, keras_path, export = make_model(folder, opts.hidden, opts.layers)
    print(f"model: 784 -> {opts.layers} x {opts.hidden} relu -> {CLASSES}")
    every = baseline(model, rows_of(opts.rows), opts.batch)
    rate = baseline_one_core(keras_path, opts.rows, opts.batch)
    print(f"baseline: model.predict, batch {opts.batch}, in one process: {every:,.0f} rows/s with "
          f"{os.cpu_count()} cores, {rate:,.0f} rows/s held to one core (one worker's share); goal "
          f"per engine: >= 0.8 x {opts.workers} workers x {rate:,.0f} = "
          f"{0.8 * opts.workers * rate:,.0f} rows/s")
    rates = {}
    site = None
    if opts.with_tfos is not None and "spark" in opts.backends:
        import zipfile

        from benchmarks.feed import tfos_wheel

        site = tempfile.mkdtemp(prefix="tfos-site-")
        zipfile.ZipFile(tfos_wheel(opts.with_tfos)).extractall(site)
        sys.path.insert(0, site)
    if "spark" in opts.backends:
        spark_bench(opts, (keras_path, export), rates, site)
    if "spark-connect" in opts.backends:
        connect_bench(opts, (keras_path, export), rates)
    if "dask" in opts.backends:
        dask_bench(opts, (keras_path, export), rates)
    print("summary (rows/s; x: of model.predict in one process held to one core):")
    tfos = rates.get("TFoS 2.2.5 TFModel.transform (SavedModel)")
    for label, r in rates.items():
        line = (f"  {label:<54} {r:>10,.0f}  {r / rate:4.2f}x one core, "
                f"{r / (rate * opts.workers):4.2f}x per worker")
        if tfos and not label.startswith("TFoS"):
            line += f", {r / tfos:5.1f}x TFoS"
        classic = rates.get(label.replace("spark-connect ", "spark ", 1))
        if label.startswith("spark-connect ") and classic:
            line += f", {r / classic:4.2f}x classic"
        print(line)
    if record:
        record_rates(record, rates, every, rate, opts.workers)
        record.write(opts.json)


def record_rates(record, rates: dict, every: float, one_core: float, workers: int) -> None:
    """The summary's rates, the ``model.predict`` baselines and the goal as rows of ``record``."""
    chart = "DataFrame scoring"
    record.add("rows/s", "rows/s", [every], peer="model.predict", case="all cores", chart=chart,
               label=f"model.predict in one process, {os.cpu_count()} cores")
    record.add("rows/s", "rows/s", [one_core], peer="model.predict", case="one core", chart=chart,
               label="model.predict in one process held to one core")
    record.add("rows/s", "rows/s", [0.8 * workers * one_core], peer="goal", case="goal",
               chart=chart, label=f"goal: 0.8 x {workers} workers x one core", reference=True)
    for label, r in rates.items():
        tfos = label.startswith("TFoS")
        record.add("rows/s", "rows/s", [r], peer="TensorFlowOnSpark 2.2.5" if tfos else "duotf",
                   backend="spark" if tfos else label.split()[0], case=label, chart=chart,
                   label=label.replace("TFoS 2.2.5 ", "") if tfos else label,
                   cold_seconds=COLD_SECONDS.get(label))


if __name__ == "__main__":
    cli()
