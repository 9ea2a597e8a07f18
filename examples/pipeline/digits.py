"""The digits classifier as a Spark ML pipeline, and its Dask twin.

Spark: a DataFrame of 64 pixel columns -> ``VectorAssembler`` -> ``duotf.spark.TFEstimator``
(a Keras model that duotf trains on a cluster of ``--workers`` nodes, the rows fed by Spark) ->
``TFModel.transform`` -> accuracy with Spark ML's ``MulticlassClassificationEvaluator``.
Dask: the same data as a Dask DataFrame with a column of pixel arrays ->
``duotf.dask.TFEstimator`` (the same parameters, in snake_case) -> ``TFModel.predict`` -> accuracy.

    python examples/pipeline/digits.py                  # Spark local[N+1]
    python examples/pipeline/digits.py --backend dask   # a Dask LocalCluster
    spark-submit --master spark://host:7077 examples/pipeline/digits.py

The scikit-learn digits ship with the package: nothing is downloaded.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np


def digits(seed: int = 0):
    """``(x_train, y_train, x_test, y_test)``: the 8x8 digits scaled to [0, 1], a fifth held out."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    n_test = len(x) // 5
    return x[n_test:], y[n_test:], x[:n_test], y[:n_test]


def make_model():
    """The modelFn: a compiled Keras classifier of the 64 pixels (duotf builds it in the
    strategy's scope on every worker)."""
    import keras

    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy")
    return model


def spark_pipeline(spark, workers: int = 2, epochs: int = 10, model_dir=None, seed: int = 1,
                   partitions: int = 4, env=None) -> float:
    """Fit the pipeline on the training rows, score the held-out rows; their accuracy."""
    from pyspark.ml import Pipeline
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.feature import VectorAssembler

    from duotf.spark import TFEstimator

    x_train, y_train, x_test, y_test = digits()
    pixels = [f"p{i}" for i in range(64)]
    schema = ", ".join(f"{p} float" for p in pixels) + ", label long"

    def frame(x, y):
        rows = [tuple(r) + (int(t),) for r, t in zip(x.tolist(), y)]
        return spark.createDataFrame(rows, schema).repartition(partitions)

    train, test = frame(x_train, y_train), frame(x_test, y_test)
    pipeline = Pipeline(stages=[
        VectorAssembler(inputCols=pixels, outputCol="features"),
        TFEstimator(modelFn=make_model, featuresCol="features", labelCol="label",
                    predictionCol="scores", argmaxCol="prediction", numWorkers=workers,
                    epochs=epochs, batchSize=64, seed=seed, modelDir=model_dir, env=env),
    ])
    model = pipeline.fit(train)
    scored = model.transform(test)
    evaluator = MulticlassClassificationEvaluator(labelCol="label", predictionCol="prediction",
                                                  metricName="accuracy")
    return evaluator.evaluate(scored)


def dask_pipeline(client, workers: int = 2, epochs: int = 10, model_dir=None, seed: int = 1,
                  partitions: int = 4, env=None) -> float:
    """The Dask twin: the same estimator parameters (snake_case); the held-out rows' accuracy."""
    import dask
    import dask.dataframe as dd
    import pandas as pd

    import duotf.dask

    x_train, y_train, x_test, y_test = digits()

    def frame(x, y):
        pdf = pd.DataFrame({"features": list(x), "label": y})
        with dask.config.set({"dataframe.convert-string": False}):  # arrays stay arrays
            return dd.from_pandas(pdf, npartitions=partitions, sort=False)

    est = duotf.dask.TFEstimator(model_fn=make_model, features_col="features", label_col="label",
                                 prediction_col="scores", argmax_col="prediction",
                                 num_workers=workers, epochs=epochs, batch_size=64, seed=seed,
                                 model_dir=model_dir, env=env, client=client)
    model = est.fit(frame(x_train, y_train))
    scored = model.predict(frame(x_test, y_test)).compute()
    return float(np.mean(scored["prediction"].to_numpy() == scored["label"].to_numpy()))


def pipeline(engine, **kwargs) -> float:
    """:func:`spark_pipeline` for a ``SparkSession`` (classic or Spark Connect),
    :func:`dask_pipeline` for a Dask ``Client`` (the same keyword arguments)."""
    run = spark_pipeline if type(engine).__module__.startswith("pyspark") else dask_pipeline
    return run(engine, **kwargs)


def cli(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["spark", "dask"], default="spark",
                        help="spark: local[workers+1], or spark-submit's --master; dask: a "
                        "LocalCluster of --workers workers (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=2, help="TF workers of each fit (default: %(default)s)")
    parser.add_argument("--epochs", type=int, default=10, help="Keras fit epochs (default: %(default)s)")
    parser.add_argument("--model-dir", default=None,
                        help="where the fitted models are saved (default: a new temporary "
                        "directory)")
    opts = parser.parse_args(argv)
    model_dir = opts.model_dir or tempfile.mkdtemp(prefix="duotf-pipeline-")
    env = {"TF_CPP_MIN_LOG_LEVEL": "2"}
    t0 = time.monotonic()
    if opts.backend == "spark":
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.appName("duotf-pipeline")
        if "PYSPARK_GATEWAY_PORT" not in os.environ and "--master" not in os.environ.get(
                "PYSPARK_SUBMIT_ARGS", ""):  # a plain `python` run: local, a slot to feed from
            builder = builder.master(f"local[{opts.workers + 1}]").config("spark.ui.enabled", "false")
        spark = builder.getOrCreate()
        accuracy = pipeline(spark, workers=opts.workers, epochs=opts.epochs, model_dir=model_dir, env=env)
    else:
        from distributed import Client, LocalCluster

        with LocalCluster(n_workers=opts.workers, threads_per_worker=2,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            accuracy = pipeline(client, workers=opts.workers, epochs=opts.epochs, model_dir=model_dir,
                                env=env)
    print(f"backend={opts.backend} workers={opts.workers} test accuracy={accuracy:.4f} "
          f"({time.monotonic() - t0:.1f} s); models in {model_dir}")
    return accuracy


if __name__ == "__main__":
    cli()
