"""TFEstimator.fit end to end (from the call to a fitted model on disk): duotf against
TensorFlowOnSpark 2.2.5's TFEstimator, on the same data and the same standalone cluster.

    python -m benchmarks.estimator --spark-master spark://127.0.0.1:PORT [--with-tfos [WHEEL]]

The same Keras model (64 -> 64 relu -> 10 softmax, Adam) trains with MultiWorkerMirroredStrategy
on 2 workers, the same rows (digits-like: 64 float32 + a label, --rows of them, 8 partitions,
cached), --epochs epochs, global batch --batch. duotf: ``duotf.spark.TFEstimator(modelFn=...)``
(2 executors of 2 cores: a node and a feeding slot each). TFoS: its ``TFEstimator(train_fn,
args)`` in its own SparkSession on the same cluster with ``spark.task.cpus`` = the executor's
cores (TFoS runs one node per executor), ``InputMode.SPARK`` (``next_batch``), and its Keras
example's recipe: ``steps_per_epoch`` at 90% of a worker's batches, then ``terminate()``.

TFoS's own Keras examples need Keras 2 (``tf-keras``, which needs the full ``tensorflow``
package); with ``tensorflow-cpu`` the TFoS ``train_fn`` here applies duotf's Keras 3 fix
(``duotf.keras.enable_multi_worker_fit()``) so that both sides run the same Keras ``fit``: what is
compared is the cluster start, the feed and the shutdown around it. The wheel is never
installed: it is unpacked and shipped with ``spark.executorEnv.PYTHONPATH`` (see
benchmarks/tfos_feed.py). Figures are printed, never asserted; both run in the same process,
one after the other.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

HIDDEN, CLASSES, WIDTH = 64, 10, 64


def build_model():
    import keras

    model = keras.Sequential([keras.Input((WIDTH,)), keras.layers.Dense(HIDDEN, activation="relu"),
                              keras.layers.Dense(CLASSES, activation="softmax")])
    model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy")
    return model


def tfos_train_fn(args, ctx):
    """TFoS's InputMode.SPARK Keras recipe (examples/mnist/keras/mnist_spark.py)."""
    import tensorflow as tf
    from tensorflowonspark import TFNode

    import duotf.keras

    duotf.keras.enable_multi_worker_fit()  # Keras 3 fit under MWMS (TFoS expects tf-keras)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    feed = TFNode.DataFeed(ctx.mgr, False)

    def rows():
        while not feed.should_stop():
            batch = feed.next_batch(args.batch_size)
            if not batch:
                return
            for features, label in batch:
                yield np.asarray(features, np.float32), label

    signature = (tf.TensorSpec((WIDTH,), tf.float32), tf.TensorSpec((), tf.int64))
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    ds = tf.data.Dataset.from_generator(rows, output_signature=signature).batch(
        args.batch_size).with_options(options)
    # TFoS's example takes 90% of a worker's even share of the steps: a worker that runs out of
    # rows ends fit while the other waits in a collective (TFoS does not deal rows evenly).
    steps = int(args.steps_fraction * args.rows / args.batch_size)
    with strategy.scope():
        model = build_model()
    model.fit(ds, epochs=args.epochs, steps_per_epoch=steps, verbose=0)
    if ctx.job_name == "chief":
        model.save(os.path.join(args.save_dir, "model.keras"))  # TFoS sets args.model_dir itself
    feed.terminate()


def _frame(session, rows: int):
    rng = np.random.default_rng(0)
    x = rng.random((rows, WIDTH), dtype=np.float32)
    y = (x[:, :CLASSES].argmax(axis=1)).astype(np.int64)
    data = [(a, int(b)) for a, b in zip(x.tolist(), y)]
    df = session.createDataFrame(data, "features array<float>, label long").repartition(8).cache()
    df.count()
    return df


def _session(master: str, name: str, **conf):
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(name)
               .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
               .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
               .config("spark.pyspark.python", sys.executable))
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def run_duotf(master: str, rows: int, epochs: int, batch: int) -> float:
    from duotf.spark import TFEstimator

    session = _session(master, "duotf-estimator", **{
        "spark.executor.cores": "2", "spark.executor.memory": "1g",
        "spark.executorEnv.PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    try:
        from duotf.backends.spark.backend import SparkBackend

        backend = SparkBackend(session)
        deadline = time.monotonic() + 60
        while backend.slots() < 4 and time.monotonic() < deadline:
            time.sleep(0.2)  # executors still registering: not part of the fit
        df = _frame(session, rows)
        est = TFEstimator(modelFn=build_model, numWorkers=2, epochs=epochs, batchSize=batch,
                          seed=1, modelDir=tempfile.mkdtemp(prefix="duotf-est-"),
                          env={"TF_CPP_MIN_LOG_LEVEL": "3"})
        t0 = time.perf_counter()
        model = est.fit(df)
        seconds = time.perf_counter() - t0
        assert os.path.exists(model.getModelPath())
        return seconds
    finally:
        session.stop()


def run_tfos(master: str, wheel: str, rows: int, epochs: int, batch: int, fraction: float) -> float:
    import zipfile

    site = tempfile.mkdtemp(prefix="tfos-site-")
    zipfile.ZipFile(wheel).extractall(site)
    sys.path.insert(0, site)
    from pyspark import cloudpickle
    from tensorflowonspark.pipeline import TFEstimator

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    paths = [site] + [p for p in sys.path if p and p != site]
    session = _session(master, "tfos-estimator", **{
        "spark.executor.cores": "2", "spark.task.cpus": "2", "spark.executor.memory": "1g",
        "spark.executorEnv.PYTHONPATH": os.pathsep.join(paths)})
    try:
        sc = session.sparkContext
        deadline = time.monotonic() + 60
        while sc._jsc.sc().getExecutorMemoryStatus().size() < 3 and time.monotonic() < deadline:
            time.sleep(0.2)  # 2 executors and the driver
        df = _frame(session, rows)
        model_dir = tempfile.mkdtemp(prefix="tfos-est-")
        args = {"batch_size": batch, "epochs": epochs, "rows": rows, "save_dir": model_dir,
                "steps_fraction": fraction}
        est = (TFEstimator(tfos_train_fn, args).setInputMapping({"features": "features", "label": "label"})
               .setClusterSize(2).setEpochs(epochs).setBatchSize(batch).setGraceSecs(60))
        t0 = time.perf_counter()
        est.fit(df)
        seconds = time.perf_counter() - t0
        if not os.path.exists(os.path.join(model_dir, "model.keras")):
            print("TFoS: the chief saved no model", file=sys.stderr)
        return seconds
    finally:
        session.stop()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spark-master", required=True, help="spark://HOST:PORT (standalone)")
    parser.add_argument("--with-tfos", nargs="?", const="", default=None, metavar="WHEEL")
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--tfos-steps", type=float, default=0.9,
                        help="TFoS steps_per_epoch as a fraction of an even share (its example: 0.9)")
    opts = parser.parse_args(argv)
    print(f"{opts.rows} rows x {opts.epochs} epochs, global batch {opts.batch}, 2 workers, "
          f"{opts.spark_master}", flush=True)
    duotf_s = run_duotf(opts.spark_master, opts.rows, opts.epochs, opts.batch)
    print(f"duotf TFEstimator.fit: {duotf_s:.1f} s", flush=True)
    if opts.with_tfos is None:
        print("TFoS baseline not run (--with-tfos [WHEEL])")
        return
    from .feed import tfos_wheel

    tfos_s = run_tfos(opts.spark_master, tfos_wheel(opts.with_tfos), opts.rows, opts.epochs,
                      opts.batch, opts.tfos_steps)
    print(f"TensorFlowOnSpark 2.2.5 TFEstimator.fit: {tfos_s:.1f} s, training on "
          f"{opts.tfos_steps:.0%} of the rows (duotf: all of them) "
          f"(duotf takes {duotf_s / tfos_s:.2f}x its time)")


if __name__ == "__main__":
    main()
