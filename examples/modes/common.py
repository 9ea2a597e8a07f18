"""What the training-mode examples share: the digits data, the model, the engines.

The digits of scikit-learn ship with the package: nothing is downloaded.
"""

from __future__ import annotations

import os

import numpy as np


def prepare_data(data_dir: str, files: int = 4, seed: int = 0) -> dict:
    """Write the digits once: ``digits.npz`` (train and test splits, for the chief's and the
    evaluator's test accuracy) and the training split as ``files`` TFRecord files of raw
    float32 records (64 pixels, then the label), which TensorFlow reads itself.

    Returns ``{"data": npz path, "train_files": glob of the TFRecords, "rows": training rows}``.
    """
    from sklearn.datasets import load_digits

    from duotf.io.tfrecord import write_records

    os.makedirs(data_dir, exist_ok=True)
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    n_test = len(x) // 5
    path = os.path.join(data_dir, "digits.npz")
    np.savez(path, x_train=x[n_test:], y_train=y[n_test:], x_test=x[:n_test], y_test=y[:n_test])
    records = np.concatenate([x[n_test:], y[n_test:, None].astype(np.float32)], axis=1)
    for i, part in enumerate(np.array_split(records, files)):
        write_records(os.path.join(data_dir, f"train-{i}.tfrecord"), [r.tobytes() for r in part])
    return {"data": path, "train_files": os.path.join(data_dir, "train-*.tfrecord"),
            "rows": len(records)}


def parse_record(record):
    """A TFRecord of :func:`prepare_data` -> ``(x, y)``."""
    import tensorflow as tf

    values = tf.io.decode_raw(record, tf.float32)
    return values[:64], tf.cast(values[64], tf.int64)


def init_params(seed: int):
    """The digits model's initial weights, the same on every node for one seed: a 64-64-10
    perceptron, as examples/digits/train.py trains."""
    rng = np.random.default_rng(seed)

    def glorot(shape):
        limit = np.sqrt(6.0 / sum(shape))
        return rng.uniform(-limit, limit, size=shape).astype(np.float32)

    return [glorot((64, 64)), np.zeros(64, np.float32), glorot((64, 10)), np.zeros(10, np.float32)]


def logits(params, x):
    import tensorflow as tf

    w1, b1, w2, b2 = params
    return tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2


def accuracy(params, data_path: str) -> float:
    """The test accuracy of weights (variables or arrays) on the held-out split."""
    data = np.load(data_path)
    predicted = np.argmax(logits(params, data["x_test"]).numpy(), axis=1)
    return float(np.mean(predicted == data["y_test"]))


def make_backend(name: str, slots: int):
    """An engine with room for ``slots`` node and feeding tasks: Spark ``local[slots]`` (or
    spark-submit's master), a Dask LocalCluster of ``slots`` workers (duotf runs one node per
    Dask worker; feeding tasks run beside them), or the embedded local backend (None)."""
    if name == "spark":
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.appName("duotf-modes")
        if "PYSPARK_GATEWAY_PORT" not in os.environ and "--master" not in os.environ.get(
                "PYSPARK_SUBMIT_ARGS", ""):
            builder = builder.master(f"local[{slots}]").config("spark.ui.enabled", "false")
        return builder.getOrCreate()
    if name == "dask":
        from distributed import Client, LocalCluster

        return Client(LocalCluster(n_workers=slots, threads_per_worker=1, dashboard_address=None))
    import duotf

    return duotf.backends.LocalBackend(slots=slots)


def engine_rows(backend, data_path: str, partitions: int = 4):
    """The training split as a collection of the backend's engine, and the input_mapping that
    names its columns ``x`` and ``y`` on the nodes."""
    data = np.load(data_path)
    x, y = data["x_train"], data["y_train"]
    if hasattr(backend, "sparkContext"):
        rows = [(row.tolist(), int(label)) for row, label in zip(x, y)]
        return (backend.createDataFrame(rows, "x array<float>, y long").repartition(partitions),
                {"x": "x", "y": "y"})
    if hasattr(backend, "submit"):  # a distributed.Client
        import dask.array as da

        chunk = -(-len(x) // partitions)
        return (da.from_array(x, chunks=(chunk, 64)), da.from_array(y, chunks=chunk)), \
            {"0": "x", "1": "y"}
    bounds = np.linspace(0, len(x), partitions + 1).astype(int)
    return [{"x": x[a:b], "y": y[a:b]} for a, b in zip(bounds[:-1], bounds[1:])], {"x": "x", "y": "y"}


def ship_by_value(*modules) -> None:
    """Send ``modules`` with the node program (by value), so that executors need not import
    the examples package."""
    import cloudpickle

    for module in modules:
        cloudpickle.register_pickle_by_value(module)
        try:
            import pyspark.cloudpickle

            pyspark.cloudpickle.register_pickle_by_value(module)
        except ImportError:
            pass



def engine_files(backend, data_path: str, url: str, partitions: int = 4) -> list:
    """The training split as the engine writes it: a Spark or Dask DataFrame written by
    ``duotf.io.dataframe`` as TFRecord files of ``tf.train.Example`` (``x``: 64 floats, ``y``:
    an int64), one per partition, in the engine's own tasks. Returns the files' URLs."""
    from duotf.io import dataframe as dfio

    if hasattr(backend, "sparkContext"):
        df, _ = engine_rows(backend, data_path, partitions)
        return dfio.spark_to_tfrecords(df, url)
    if hasattr(backend, "submit"):  # a distributed.Client
        import dask
        import dask.dataframe as dd
        import pandas as pd

        data = np.load(data_path)
        frame = pd.DataFrame({"x": list(data["x_train"]), "y": data["y_train"]})
        with dask.config.set({"dataframe.convert-string": False}):  # keep the arrays arrays
            ddf = dd.from_pandas(frame, npartitions=partitions)
        return dfio.dask_to_tfrecords(ddf, url)
    raise ValueError("the engine writes the files on Spark or Dask; on the local backend use the "
                     "files of prepare_data")


def parse_example(record):
    """A ``tf.train.Example`` of :func:`engine_files` -> ``(x, y)``."""
    import tensorflow as tf

    parsed = tf.io.parse_single_example(record, {
        "x": tf.io.FixedLenFeature([64], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)})
    return parsed["x"], parsed["y"]
