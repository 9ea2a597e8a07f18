"""The ML stages: ``duotf.spark.TFEstimator``/``TFModel`` (fit, transform, save, load, a
``Pipeline``, a ``CrossValidator``) and their Dask twin (fit, predict, to_local, save, load),
with the same seed giving the same predictions on every engine."""

from __future__ import annotations

import math

import numpy as np
import pytest

import duotf
import duotf.estimator
from duotf.planner import balance
from tests.suite import mains

SIZES = [20, 4, 16, 24]  # uneven, more partitions than workers
WIDTH, BATCH, EPOCHS, WORKERS, SEED, LR = 3, 8, 2, 2, 7, 0.05
TRUE_W = np.array([1.5, -2.0, 0.5])
ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
SCHEMA = {"id": "long", "features": "array<float>", "label": "double"}
SPARK = ("spark-local", "spark-standalone")

#: predictions per engine seen in this session: the same seed must give the same bits
_PREDICTIONS: dict = {}


def _data():
    rng = np.random.default_rng(11)
    parts, start = [], 0
    for size in SIZES:
        x = rng.normal(size=(size, WIDTH)).astype(np.float32)
        y = x.astype(np.float64) @ TRUE_W + 0.3 + rng.normal(scale=0.1, size=size)
        parts.append([(start + i, x[i].tolist(), float(y[i])) for i in range(size)])
        start += size
    return parts


def _reference(parts):
    """The predictions of one process training the same seeded model on the same global
    batches: step k takes each worker's k-th ``BATCH // WORKERS`` rows, in the order the
    balanced plan feeds them."""
    import keras

    plan, _, _ = balance([len(p) for p in parts], WORKERS)
    rows = [[] for _ in range(WORKERS)]
    for pid in sorted(plan):
        for target, a, c, _ in plan[pid]:
            rows[target] += parts[pid][a:c]
    keras.utils.set_random_seed(SEED)
    model = mains.linear_model_fn()
    per_step = BATCH // WORKERS
    for _ in range(EPOCHS):
        for k in range(len(rows[0]) // per_step):
            batch = [r for worker in rows for r in worker[k * per_step:(k + 1) * per_step]]
            model.train_on_batch(np.array([r[1] for r in batch], np.float32),
                                 np.array([r[2] for r in batch], np.float32))
    x = np.array([r[1] for p in parts for r in p], np.float32)
    return model.predict(x, verbose=0)[:, 0]


def _stages(engine):
    if hasattr(engine, "session"):
        from duotf.spark import TFEstimator, TFModel

        return TFEstimator, TFModel, {}
    import duotf.dask

    return duotf.dask.TFEstimator, duotf.dask.TFModel, {"client": engine.client}


def _score(engine, model, df):
    out = model.transform(df) if hasattr(model, "transform") else model.predict(df)
    return engine.to_pandas(out).sort_values("id").reset_index(drop=True)


@pytest.mark.engines("dask", *SPARK)
def test_fit_transform_save_load_with_the_same_predictions_on_every_engine(backend, engine, tmp_path):
    TFEstimator, TFModel, extra = _stages(engine)
    parts = _data()
    df = engine.table(parts, SCHEMA)
    est = TFEstimator(modelFn=mains.linear_model_fn, featuresCol="features", labelCol="label",
                      numWorkers=WORKERS, epochs=EPOCHS, batchSize=BATCH, seed=SEED,
                      modelDir=str(tmp_path / "models"), env=ENV, **extra)
    model = est.fit(df)
    path = model.getModelPath() if hasattr(model, "getModelPath") else model.modelPath
    assert path.startswith(str(tmp_path / "models" / "fit-")) and path.endswith("/model.keras")
    assert list(model.history) == ["loss"] and len(model.history["loss"]) == EPOCHS
    assert all(math.isfinite(v) for v in model.history["loss"])

    scored = _score(engine, model, df)
    assert scored["id"].tolist() == list(range(sum(SIZES)))
    assert scored["prediction"].dtype == np.float64
    predictions = scored["prediction"].to_numpy()
    # the same seed and rows: what one process trains on the same global batches
    np.testing.assert_allclose(predictions, _reference(parts), rtol=1e-4, atol=1e-5)
    # and bit for bit what every other engine of this session predicted
    for kind, seen in _PREDICTIONS.items():
        assert np.array_equal(seen, predictions), f"{kind} predicted otherwise"
    _PREDICTIONS[engine.__class__.__name__] = predictions

    # to_local: the plain Keras model
    local = model.to_local()
    x = np.array([r[1] for p in parts for r in p], np.float32)
    np.testing.assert_allclose(local.predict(x, verbose=0)[:, 0], predictions, rtol=1e-6)

    # save and load: the saved folder is whole by itself (a copy of the model in it)
    if hasattr(model, "write"):
        model.write().save(str(tmp_path / "tfmodel"))
        est.write().save(str(tmp_path / "tfestimator"))
        loaded_est = TFEstimator.load(str(tmp_path / "tfestimator"))
        assert loaded_est.uid == est.uid and loaded_est.getOrDefault("epochs") == EPOCHS
        assert loaded_est.getOrDefault("env") == ENV
        assert loaded_est.getOrDefault("modelFn")().count_params() == WIDTH + 1
        loaded = TFModel.load(str(tmp_path / "tfmodel"))
        assert loaded.getModelPath() == str(tmp_path / "tfmodel" / "model" / "model.keras")
    else:
        model.save(str(tmp_path / "tfmodel"))
        loaded = TFModel.load(str(tmp_path / "tfmodel"))
        assert loaded.modelPath == str(tmp_path / "tfmodel" / "model" / "model.keras")
    assert loaded.history == model.history
    again = _score(engine, loaded, df)["prediction"].to_numpy()
    assert np.array_equal(again, predictions)


@pytest.mark.engines("spark-local")
def test_a_train_fn_fits_as_tensorflowonspark_does(backend, engine, tmp_path):
    """trainFn(args, ctx), TFoS style: the user's node program gets the estimator's params and
    trainArgs, saves to args["modelPath"]; its chief's dict is the history."""
    TFEstimator, _, extra = _stages(engine)
    parts = _data()
    est = TFEstimator(trainFn=mains.linear_train_fn, trainArgs={"note": "mine"}, numWorkers=WORKERS,
                      epochs=1, batchSize=BATCH, seed=SEED, modelDir=str(tmp_path), env=ENV, **extra)
    model = est.fit(engine.table(parts, SCHEMA))
    assert model.history["args"] == {"note": "mine"} and len(model.history["loss"]) == 1
    assert len(model.results) == WORKERS


def _bad(engine, name):
    """DataFrames that a fit must refuse before anything runs."""
    parts = _data()
    if name == "string":
        return engine.table([[(r[0], r[1], str(r[2])) for r in p] for p in parts],
                            {"id": "long", "features": "array<float>", "label": "string"})
    if name == "ragged":
        rows = [[(r[0], r[1][:2] if r[0] == 30 else r[1], r[2]) for r in p] for p in parts]
        return engine.table(rows, SCHEMA)
    if name == "null":
        return engine.table([[(r[0], r[1], None if r[0] == 5 else r[2]) for r in p] for p in parts],
                            SCHEMA)
    return engine.table(parts, SCHEMA)


@pytest.mark.engines("spark-local", "dask")
def test_bad_input_is_a_config_error_before_anything_runs(backend, engine, tmp_path):
    TFEstimator, TFModel, extra = _stages(engine)
    models = tmp_path / "models"

    def fit(data, **params):
        kwargs = dict(modelFn=mains.linear_model_fn, numWorkers=WORKERS, modelDir=str(models),
                      env=ENV, **extra)
        kwargs.update(params)
        with pytest.raises(duotf.ConfigError) as info:
            TFEstimator(**kwargs).fit(data)
        return str(info.value)

    good = _bad(engine, "good")
    message = fit(good, featuresCol="pixels")
    assert "feature column 'pixels' is not in the DataFrame" in message and "featuresCol" in message
    message = fit(good, labelCol="target")
    assert "label column 'target' is not in the DataFrame" in message and "labelCol" in message
    message = fit(_bad(engine, "string"))
    assert "'label'" in message and "string" in message
    message = fit(_bad(engine, "ragged"))
    assert "column 'features' is ragged" in message and "from 2 to 3 values" in message
    message = fit(_bad(engine, "null"))
    assert "column 'label' holds 1 null" in message and "dropna" in message
    assert "exactly one of modelFn" in fit(good, trainFn=mains.linear_train_fn)
    assert "numPs=1" in fit(good, numPs=1)
    assert "batchSize=7" in fit(good, batchSize=7) and "multiple of 2" in fit(good, batchSize=7)
    assert not models.exists()  # no fit started: no fit folder
    assert duotf.estimator.running_fits() == 0

    missing = str(tmp_path / "nowhere.keras")
    model = TFModel(modelPath=missing) if hasattr(TFModel, "read") else TFModel(missing)
    with pytest.raises(duotf.ConfigError, match="nowhere.keras' does not exist"):
        model.transform(good) if hasattr(model, "transform") else model.predict(good)


@pytest.mark.engines("spark-local")
def test_a_pipeline_and_a_cross_validator(backend, engine, tmp_path):
    """VectorAssembler -> TFEstimator in a Pipeline, tuned by a CrossValidator (2 folds, 2
    epoch values); the best PipelineModel saves and loads. (Fits that cannot have their slots
    together with parallelism > 1: tests/test_estimator_config.py, on the slot ledger.)"""
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.evaluation import RegressionEvaluator
    from pyspark.ml.feature import VectorAssembler
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

    from duotf.spark import TFEstimator, TFModel

    parts = [[(r[0], *r[1], r[2]) for r in p] for p in _data()]
    df = engine.table(parts, {"id": "long", "x0": "double", "x1": "double", "x2": "double",
                              "label": "double"}).cache()
    est = TFEstimator(modelFn=mains.linear_model_fn, numWorkers=1, batchSize=BATCH, seed=SEED,
                      modelDir=str(tmp_path / "models"), env=ENV)
    pipeline = Pipeline(stages=[VectorAssembler(inputCols=["x0", "x1", "x2"], outputCol="features"),
                                est])
    grid = ParamGridBuilder().addGrid(est.epochs, [1, 2]).build()
    evaluator = RegressionEvaluator(predictionCol="prediction", labelCol="label")
    cv = CrossValidator(estimator=pipeline, estimatorParamMaps=grid, evaluator=evaluator,
                        numFolds=2, seed=3)
    cv_model = cv.fit(df)
    assert len(cv_model.avgMetrics) == 2 and all(math.isfinite(m) for m in cv_model.avgMetrics)
    best = cv_model.bestModel
    assert isinstance(best.stages[-1], TFModel)
    assert len(best.stages[-1].history["loss"]) == (1, 2)[int(np.argmin(cv_model.avgMetrics))]
    scored = best.transform(df).orderBy("id").toPandas()
    assert len(scored) == sum(SIZES) and "features" in scored

    best.write().save(str(tmp_path / "best"))
    pipeline.write().save(str(tmp_path / "pipeline"))
    again = PipelineModel.load(str(tmp_path / "best")).transform(df).orderBy("id").toPandas()
    assert np.array_equal(again["prediction"], scored["prediction"])
    stage = Pipeline.load(str(tmp_path / "pipeline")).getStages()[1]
    assert isinstance(stage, TFEstimator) and stage.getOrDefault("modelFn") is not None

    df.unpersist()
