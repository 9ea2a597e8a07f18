"""The ML stages: ``duotf.spark.TFEstimator``/``TFModel`` and their Dask twin (fit, score,
to_local, save, load), with the same seed giving the same predictions on every engine, and a
fit's MLflow tracking against a real tracking server. Spark ML
alone (a ``Pipeline``, a ``CrossValidator``, an estimator saved): tests/test_spark_estimator.py."""

from __future__ import annotations

import math
import os
import threading

import numpy as np
import pytest

import duotf
import duotf._ml.estimator
from duotf.testing import QUIET_TF
from duotf.testing.suite.data import epoch_rows
from duotf.testing.suite import mains

SIZES = [20, 4, 16, 24]  # uneven, more partitions than workers
WIDTH, BATCH, EPOCHS, WORKERS, SEED, LR = 3, 8, 2, 2, 7, 0.05
TRUE_W = np.array([1.5, -2.0, 0.5])
ENV = QUIET_TF  # the nodes' environment: that of the rest of the suite (one warm server)
SCHEMA = {"id": "long", "features": "array<float>", "label": "double"}
SPARK = ("spark-local", "spark-standalone", "spark-connect")

#: predictions per engine seen in this session: the same seed must give the same bits
_PREDICTIONS: dict = {}


def linear_parts():
    """Rows ``(id, 3 features, label)`` of a noisy linear target, in partitions of ``SIZES``."""
    rng = np.random.default_rng(11)
    parts, start = [], 0
    for size in SIZES:
        x = rng.normal(size=(size, WIDTH)).astype(np.float32)
        y = x.astype(np.float64) @ TRUE_W + 0.3 + rng.normal(scale=0.1, size=size)
        parts.append([(start + i, x[i].tolist(), float(y[i])) for i in range(size)])
        start += size
    return parts


def _global_batches(parts, seed=None):
    """Every epoch's global batches, in order: step k takes each worker's k-th
    ``BATCH // WORKERS`` rows, in the order the balanced plan feeds them (with a ``seed``: a
    shuffled feed's, whose windows here hold a whole epoch)."""
    per_step = BATCH // WORKERS
    for epoch in range(1, EPOCHS + 1):
        rows = list(epoch_rows(parts, WORKERS, epoch, seed, window=1 << 30).values())
        for k in range(len(rows[0]) // per_step):
            yield [r for worker in rows for r in worker[k * per_step:(k + 1) * per_step]]


def _reference(parts, shuffled: bool = False):
    """The predictions of one process training the same seeded model on the same global
    batches: step k takes each worker's k-th ``BATCH // WORKERS`` rows, in the order the
    balanced plan feeds them (``shuffled``: shuffled by ``SEED``)."""
    import keras

    keras.utils.set_random_seed(SEED)
    model = mains.linear_model_fn()
    for batch in _global_batches(parts, SEED if shuffled else None):
        model.train_on_batch(np.array([r[1] for r in batch], np.float32),
                             np.array([r[2] for r in batch], np.float32))
    x = np.array([r[1] for p in parts for r in p], np.float32)
    return model.predict(x, verbose=0)[:, 0]


def _params(engine, **params) -> dict:
    """The ML stages' keywords (written here in Spark ML's camelCase) as the engine spells them."""
    return {engine.ml_name(name): value for name, value in params.items()}


def _score(engine, model, df):
    return engine.to_pandas(engine.apply_model(model, df)).sort_values("id").reset_index(drop=True)


# spark-local cut from CI's time (20 s; it passed there): a classic session's estimator runs
# on spark-standalone, the same code over executors of their own
@pytest.mark.engines("dask", "spark-standalone", "spark-connect")
def test_fit_transform_save_load_with_the_same_predictions_on_every_engine(backend, engine, tmp_path):
    TFEstimator, _, extra = engine.ml_stages()
    parts = linear_parts()
    df = engine.table(parts, SCHEMA)
    est = TFEstimator(**_params(engine, modelFn=mains.linear_model_fn, featuresCol="features",
                                labelCol="label", numWorkers=WORKERS, epochs=EPOCHS,
                                batchSize=BATCH, seed=SEED, modelDir=str(tmp_path / "models"),
                                env=ENV, shuffle=True), **extra)
    model = est.fit(df)
    path = engine.model_path(model)
    assert path.startswith(str(tmp_path / "models" / "fit-")) and path.endswith("/model.keras")
    assert list(model.history) == ["loss"] and len(model.history["loss"]) == EPOCHS
    assert all(math.isfinite(v) for v in model.history["loss"])

    scored = _score(engine, model, df)
    assert scored["id"].tolist() == list(range(sum(SIZES)))
    assert scored["prediction"].dtype == np.float64
    predictions = scored["prediction"].to_numpy()
    # the same seed and rows: what one process trains on the same global batches, shuffled by
    # the seed every epoch (and not what it trains on the rows in their plain order)
    np.testing.assert_allclose(predictions, _reference(parts, shuffled=True), rtol=1e-4, atol=1e-5)
    assert not np.allclose(predictions, _reference(parts), rtol=1e-4, atol=1e-5)
    # and bit for bit what every other engine of this session predicted
    for kind, seen in _PREDICTIONS.items():
        assert np.array_equal(seen, predictions), f"{kind} predicted otherwise"
    _PREDICTIONS[engine.__class__.__name__] = predictions

    # to_local: the plain Keras model
    local = model.to_local()
    x = np.array([r[1] for p in parts for r in p], np.float32)
    np.testing.assert_allclose(local.predict(x, verbose=0)[:, 0], predictions, rtol=1e-6)

    # save and load: the saved folder is whole by itself (a copy of the model in it). A loaded
    # model scoring on the engine: the ML blocks of docs/guides/ml-pipelines.md (tests/test_readme.py); here its
    # copy predicts what the fitted model did.
    loaded = engine.save_and_load(model, str(tmp_path / "tfmodel"))
    assert engine.model_path(loaded) == str(tmp_path / "tfmodel" / "model" / "model.keras")
    assert loaded.history == model.history
    np.testing.assert_array_equal(loaded.to_local().predict(x, verbose=0)[:, 0],
                                  local.predict(x, verbose=0)[:, 0])


@pytest.mark.engines("spark-local")
def test_a_train_fn_fits_as_tensorflowonspark_does(backend, engine, tmp_path):
    """trainFn(args, ctx), TFoS style: the user's node program gets the estimator's params and
    trainArgs, saves to args["modelPath"]; its chief's dict is the history."""
    TFEstimator, _, extra = engine.ml_stages()
    parts = linear_parts()
    est = TFEstimator(**_params(engine, trainFn=mains.linear_train_fn, trainArgs={"note": "mine"},
                                numWorkers=WORKERS, epochs=1, batchSize=BATCH, seed=SEED,
                                modelDir=str(tmp_path), env=ENV), **extra)
    model = est.fit(engine.table(parts, SCHEMA))
    assert model.history["args"] == {"note": "mine"} and len(model.history["loss"]) == 1
    assert len(model.results) == WORKERS


def _bad(engine, name):
    """DataFrames that a fit must refuse before anything runs."""
    parts = linear_parts()
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


@pytest.mark.engines("spark-local", "dask", "spark-connect")
def test_bad_input_is_a_config_error_before_anything_runs(backend, engine, tmp_path):
    TFEstimator, _, extra = engine.ml_stages()
    models = tmp_path / "models"

    def fit(data, **params):
        kwargs = dict(modelFn=mains.linear_model_fn, numWorkers=WORKERS, modelDir=str(models),
                      env=ENV)
        kwargs.update(params)
        kwargs = dict(_params(engine, **kwargs), **extra)
        with pytest.raises(duotf.ConfigError) as info:
            TFEstimator(**kwargs).fit(data)
        return str(info.value)

    good = _bad(engine, "good")
    message = fit(good, featuresCol="pixels")
    assert ("feature column 'pixels' is not in the DataFrame" in message
            and engine.ml_name("featuresCol") in message)
    message = fit(good, labelCol="target")
    assert ("label column 'target' is not in the DataFrame" in message
            and engine.ml_name("labelCol") in message)
    message = fit(_bad(engine, "string"))
    assert "'label'" in message and "string" in message
    message = fit(_bad(engine, "ragged"))
    assert "column 'features' is ragged" in message and "from 2 to 3 values" in message
    message = fit(_bad(engine, "null"))
    assert "column 'label' holds 1 null" in message and "dropna" in message
    name = engine.ml_name
    assert f"exactly one of {name('modelFn')}" in fit(good, trainFn=mains.linear_train_fn)
    assert f"{name('numPs')}=1" in fit(good, numPs=1)
    assert f"{name('batchSize')}=7" in fit(good, batchSize=7) and "multiple of 2" in fit(good, batchSize=7)
    # validation rows and sample weights: the parameter and the column named
    message = fit(good, weightCol="w")
    assert "weight column 'w' is not in the DataFrame" in message and name("weightCol") in message
    message = fit(good, callbacks=[threading.Lock()])  # what cloudpickle cannot send
    assert "callbacks cannot be sent to the nodes" in message and "callbacks=lambda:" in message
    message = fit(_bad(engine, "string"), labelCol="id", weightCol="label")  # weights of strings
    assert f"{name('weightCol')}='label' is" in message and "one number a row" in message
    message = fit(good, validationIndicatorCol="id")
    assert f"{name('validationIndicatorCol')}='id'" in message and "give a boolean column" in message
    assert "is not a column" in fit(good, validationIndicatorCol="held")
    assert f"{name('validationFraction')}=1.0" in fit(good, validationFraction=1.0)
    message = fit(good, validationFraction=1e-9)
    assert f"{name('validationFraction')}=1e-09 holds out none of the 64 rows" in message
    assert "give one of them" in fit(good, validationFraction=0.2, validationIndicatorCol="id")
    assert not models.exists()  # no fit started: no fit folder
    assert duotf._ml.estimator.running_fits() == 0

    missing = str(tmp_path / "nowhere.keras")
    with pytest.raises(duotf.ConfigError, match="nowhere.keras' does not exist"):
        engine.apply_model(engine.model_at(missing), good)


# -- validation rows, sample weights and callbacks ---------------------------------------------------
HOLDOUT_SCHEMA = dict(SCHEMA, val="boolean", w="double")


@pytest.mark.engines("dask", "spark-local", "spark-connect")
def test_validation_rows_sample_weights_and_callbacks_reach_keras_fit(backend, engine, tmp_path):
    """validationIndicatorCol's rows are Keras's validation_data (val_loss in the history: the
    saved model's loss on them), weightCol its sample weights (the training rows weigh 0 here:
    their loss is 0 and the seeded model learns nothing), and callbacks run on the nodes:
    EarlyStopping ends the fit after 2 of 4 epochs (the rest of the feed is dropped), and a
    ModelCheckpoint of a relative path saves in the fit's folder."""
    import keras

    TFEstimator, _, extra = engine.ml_stages()
    # 13 validation rows: the second of their global batches is short, split unevenly
    parts = [[(*r, r[0] % 5 == 0, float(r[0] % 5 == 0)) for r in p] for p in linear_parts()]
    df = engine.table(parts, HOLDOUT_SCHEMA)
    est = TFEstimator(**_params(engine, modelFn=mains.linear_model_fn, numWorkers=WORKERS, epochs=4,
                                batchSize=BATCH, seed=SEED, modelDir=str(tmp_path / "models"),
                                env=ENV, validationIndicatorCol="val", weightCol="w",
                                callbacks=mains.holdout_callbacks), **extra)
    model = est.fit(df)
    assert sorted(model.history) == ["loss", "val_loss"]
    assert model.history["loss"] == [0.0, 0.0]  # stopped: val_loss did not improve
    first, second = model.history["val_loss"]
    assert first == second > 0

    held = [r for p in parts for r in p if r[3]]
    x, y = np.array([r[1] for r in held], np.float32), np.array([r[2] for r in held])
    predicted = model.to_local().predict(x, verbose=0)[:, 0]
    keras.utils.set_random_seed(SEED)
    np.testing.assert_allclose(predicted, mains.linear_model_fn().predict(x, verbose=0)[:, 0],
                               rtol=1e-6)
    np.testing.assert_allclose(second, np.mean((predicted - y) ** 2), rtol=1e-4)
    fit_dir = os.path.dirname(engine.model_path(model))
    assert os.listdir(os.path.join(fit_dir, "checkpoints")) == ["best.keras"]


# -- MLflow tracking (the mlflow extra) ----------------------------------------------------------
@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real MLflow tracking server for the session (:mod:`duotf.testing.tracking`: SQLite
    store, artifacts served over HTTP), stopped with its workers at the end; telemetry off."""
    from duotf.testing.tracking import SERVER_ENV, mlflow_server as serve, server_command

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
        pytest.importorskip("mlflow", reason="the mlflow extra (mlflow-skinny) is not installed")
        command = server_command()
        if command is None:
            message = (f"no MLflow server to run: set {SERVER_ENV} to the mlflow command of a full "
                       "MLflow install (.ci/run makes one), or pip install mlflow")
            if os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message)
        with serve(str(tmp_path_factory.mktemp("mlflow")), command) as url:
            yield url


@pytest.mark.engines("dask", "spark-local", "spark-connect")
def test_a_fit_inside_an_mlflow_run_logs_its_parameters_metrics_and_model(backend, engine, tmp_path,
                                                                        mlflow_server, monkeypatch):
    """A fit inside an active MLflow run logs to it from the chief (mlflowLogging, on by
    default), read back from a real tracking server: the fit's parameters, each epoch's loss and
    val_loss at step=epoch, once (no other worker logs) and equal to the fitted model's history,
    and the model (MLflow's Keras flavor), which loads and predicts what the fitted model does.
    The run stays the caller's: running until its ``with`` block ends."""
    import mlflow
    from mlflow import MlflowClient

    quiet = {"MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
    for name, value in dict(quiet, MLFLOW_TRACKING_URI=mlflow_server).items():
        monkeypatch.setenv(name, value)  # no tqdm bar, whose monitor thread would outlive the test
    client = MlflowClient()
    experiment = client.create_experiment(f"duotf-{engine.__class__.__name__}-{tmp_path.name}")
    TFEstimator, _, extra = engine.ml_stages()
    parts = [[(*r, r[0] % 5 == 0, 1.0) for r in p] for p in linear_parts()]  # 13 validation rows
    est = TFEstimator(**_params(engine, modelFn=mains.linear_model_fn, numWorkers=WORKERS,
                                epochs=EPOCHS, batchSize=BATCH, seed=SEED,
                                modelDir=str(tmp_path / "models"), validationIndicatorCol="val",
                                env=dict(ENV, **quiet)), **extra)
    with mlflow.start_run(experiment_id=experiment) as run:
        model = est.fit(engine.table(parts, HOLDOUT_SCHEMA))
        assert client.get_run(run.info.run_id).info.status == "RUNNING"
    logged = client.get_run(run.info.run_id)
    params = dict(logged.data.params)
    assert params == {"epochs": str(EPOCHS), "batchSize": str(BATCH), "numWorkers": str(WORKERS),
                      "seed": str(SEED), "featuresCol": "features", "labelCol": "label",
                      "validationIndicatorCol": "val", "validationRows": "13", "optimizer": "SGD",
                      "learningRate": str(LR)}
    assert sorted(logged.data.metrics) == sorted(model.history) == ["loss", "val_loss"]
    for name, values in model.history.items():
        points = sorted(client.get_metric_history(run.info.run_id, name), key=lambda m: m.step)
        assert [(m.step, m.value) for m in points] == list(enumerate(values)), name

    models = mlflow.search_logged_models(experiment_ids=[experiment], output_format="list")
    assert [(m.name, m.source_run_id) for m in models] == [("model", run.info.run_id)]
    x = np.array([r[1] for p in parts for r in p], np.float32)
    np.testing.assert_array_equal(
        mlflow.keras.load_model(f"runs:/{run.info.run_id}/model").predict(x, verbose=0),
        model.to_local().predict(x, verbose=0))


# -- a model of two inputs and two outputs ---------------------------------------------------------
TWO_IO_SCHEMA = {"id": "long", "a": "array<float>", "b": "double", "label": "double",
                 "label2": "array<float>"}
_TWO_IO_PREDICTIONS: dict = {}


def two_io_parts():
    """Rows ``(id, a: 3 floats, b, label, label2: 2 floats)`` in partitions of ``SIZES``."""
    rng = np.random.default_rng(13)
    parts, start = [], 0
    for size in SIZES:
        a = rng.normal(size=(size, WIDTH)).astype(np.float32)
        b = rng.normal(size=size)
        y = a.astype(np.float64) @ TRUE_W + 0.5 * b + rng.normal(scale=0.1, size=size)
        z = np.stack([a[:, 0] - b, a[:, 1] + a[:, 2]], axis=1).astype(np.float32)
        parts.append([(start + i, a[i].tolist(), float(b[i]), float(y[i]), z[i].tolist())
                      for i in range(size)])
        start += size
    return parts


def _inputs(rows):
    return [np.array([r[1] for r in rows], np.float32), np.array([[r[2]] for r in rows], np.float32)]


def _two_io_reference(parts):
    """What one process trains on the same global batches (as ``_reference``), predicted."""
    import keras

    keras.utils.set_random_seed(SEED)
    model = mains.two_io_model_fn()
    for batch in _global_batches(parts):
        model.train_on_batch(_inputs(batch), [np.array([r[3] for r in batch], np.float32),
                                              np.array([r[4] for r in batch], np.float32)])
    y, z = model.predict(_inputs([r for p in parts for r in p]), verbose=0)
    return y[:, 0], z


@pytest.mark.engines("dask", "spark-local")
def test_a_model_of_two_inputs_and_two_outputs_fits_and_scores_each_output(backend, engine, tmp_path):
    """featuresCol and labelCol as lists (one column per model input and output, in order), the
    fitted model's outputCols, and the engine's predict with both outputs as columns: the same
    predictions as one process training on the same global batches, on every engine."""
    TFEstimator, _, extra = engine.ml_stages()
    parts = two_io_parts()
    df = engine.table(parts, TWO_IO_SCHEMA)
    est = TFEstimator(**_params(engine, modelFn=mains.two_io_model_fn, featuresCol=["a", "b"],
                                labelCol=["label", "label2"], outputCols={"py": "y", "pz": "z"},
                                numWorkers=WORKERS, epochs=EPOCHS, batchSize=BATCH, seed=SEED,
                                modelDir=str(tmp_path / "models"), env=ENV), **extra)
    model = est.fit(df)
    assert len(model.history["loss"]) == EPOCHS and all(math.isfinite(v) for v in model.history["loss"])

    scored = _score(engine, model, df)
    assert scored["id"].tolist() == list(range(sum(SIZES)))
    assert scored["py"].dtype == np.float64
    py, pz = scored["py"].to_numpy(), np.stack([np.asarray(v) for v in scored["pz"]])
    assert pz.shape == (sum(SIZES), 2)
    ref_y, ref_z = _two_io_reference(parts)
    np.testing.assert_allclose(py, ref_y, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(pz, ref_z, rtol=1e-4, atol=1e-5)
    for kind, (seen_y, seen_z) in _TWO_IO_PREDICTIONS.items():  # bit for bit, engine to engine
        assert np.array_equal(seen_y, py) and np.array_equal(seen_z, pz), f"{kind} predicted otherwise"
    _TWO_IO_PREDICTIONS[engine.__class__.__name__] = (py, pz)

    # the engine's scoring function, both outputs as columns: what the Keras model predicts
    direct = engine.to_pandas(engine.score(df, engine.model_path(model), columns=["a", "b"],
                                           output={"y": "y", "z": "z"}))
    direct = direct.sort_values("id").reset_index(drop=True)
    local_y, local_z = model.to_local().predict(_inputs([r for p in parts for r in p]), verbose=0)
    np.testing.assert_allclose(direct["y"].to_numpy(), local_y[:, 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.stack([np.asarray(v) for v in direct["z"]]), local_z, rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(direct["y"].to_numpy(), py, rtol=1e-6)


# -- TensorFlowOnSpark's signature, tags and mappings; a classifier's columns ----------------------
SIG_SCHEMA = {"id": "long", "feat": "array<float>", "shift": "double"}
SIG_W = np.array([[1.0, -2.0, 0.5], [0.0, 1.0, -1.0]], np.float32)


def two_signature_savedmodel(path: str) -> str:
    """A SavedModel (tags "serve") of two signatures: ``serving_default(x: [2], shift: [1]) ->
    {logits: [3], total: [1]}`` and ``probs(x: [2]) -> {probs: [3]}`` (the softmax of x @ W)."""
    import tensorflow as tf

    class Scores(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(SIG_W)

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32),
                                      tf.TensorSpec([None, 1], tf.float32)])
        def scores(self, x, shift):
            return {"logits": tf.matmul(x, self.w) + shift,
                    "total": tf.reduce_sum(x, axis=1, keepdims=True)}

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
        def probs(self, x):
            return {"probs": tf.nn.softmax(tf.matmul(x, self.w))}

    module = Scores()
    tf.saved_model.save(module, path, signatures={"serving_default": module.scores,
                                                  "probs": module.probs})
    return path


def _sig_parts():
    rng = np.random.default_rng(5)
    x, shift = rng.normal(size=(11, 2)).astype(np.float32), rng.normal(size=11)
    rows = [(i, x[i].tolist(), float(shift[i])) for i in range(11)]
    return [rows], x, shift  # one partition: one Python worker loads the models


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _vectors(column):
    """A column of vectors (Spark ML vectors, lists, arrays) as one 2-D array."""
    return np.stack([np.asarray(v.toArray() if hasattr(v, "toArray") else v, np.float64)
                     for v in column])


def _param(engine, model, name):
    if hasattr(model, "getOrDefault"):
        return model.getOrDefault(name)
    return getattr(model, engine.ml_name(name))


@pytest.mark.engines("dask", "spark-local", "spark-connect")
def test_a_tfmodel_scores_the_signature_and_tensors_it_is_named(backend, engine, tmp_path):
    """signatureDefKey, tagSet, inputMapping ({column: input}) and outputMapping ({output:
    column}) pick what of a SavedModel scores; probabilityCol and rawPredictionCol make a
    classifier (predictionCol the class); the parameters survive save and load."""
    path = two_signature_savedmodel(str(tmp_path / "sm"))
    parts, x, shift = _sig_parts()
    df = engine.table(parts, SIG_SCHEMA)
    logits = x @ SIG_W + shift[:, None].astype(np.float32)

    # serving_default, its inputs fed by name, its outputs into columns named here, as a
    # classifier of its logits: the probabilities are their softmax, the class their argmax
    both = {"feat": "x", "shift": "shift"}
    model = engine.model_at(path, **_params(engine, inputMapping=both,
                                            outputMapping={"logits": "z", "total": "sum"},
                                            probabilityCol="p", predictionCol="cls", argmaxCol="top"))
    got = _score(engine, model, df)
    assert got["id"].tolist() == list(range(11)) and got["sum"].dtype == np.float64
    np.testing.assert_allclose(_vectors(got["z"]), logits, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["sum"], x.sum(axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_vectors(got["p"]), _softmax(logits.astype(np.float64)), rtol=1e-5,
                               atol=1e-6)
    assert got["cls"].tolist() == got["top"].tolist() == np.argmax(logits, axis=1).astype(float).tolist()
    assert "rawPrediction" not in got.columns and "prediction" not in got.columns

    # another signature, of one input, as a classifier: its outputs are probabilities already
    probabilities = engine.model_at(path, **_params(
        engine, signatureDefKey="probs", tagSet="serve", inputMapping={"feat": "x"},
        probabilityCol="probability", rawPredictionCol="rawPrediction"))
    scored = _score(engine, probabilities, df)
    probs = _softmax((x @ SIG_W).astype(np.float64))
    assert scored["prediction"].dtype == np.float64
    assert scored["prediction"].tolist() == np.argmax(probs, axis=1).astype(float).tolist()
    np.testing.assert_allclose(_vectors(scored["probability"]), probs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_vectors(scored["rawPrediction"]), probs, rtol=1e-5, atol=1e-6)
    # not a classifier: the output as it is, and argmaxCol beside it
    plain = engine.model_at(path, **_params(engine, signatureDefKey="probs", inputMapping={"feat": "x"},
                                            outputMapping={"probs": "q"}, argmaxCol="k"))
    scored = _score(engine, plain, df)
    np.testing.assert_allclose(_vectors(scored["q"]), probs, rtol=1e-5, atol=1e-6)
    assert scored["k"].tolist() == np.argmax(probs, axis=1).astype(float).tolist()

    loaded = engine.save_and_load(model, str(tmp_path / "saved"))
    for name, value in [("signatureDefKey", "serving_default"), ("tagSet", "serve"),
                        ("inputMapping", both), ("outputMapping", {"logits": "z", "total": "sum"}),
                        ("probabilityCol", "p"), ("rawPredictionCol", ""), ("predictionCol", "cls")]:
        assert _param(engine, loaded, name) == value, name
    again = _score(engine, loaded, df)
    assert again["cls"].tolist() == got["cls"].tolist()
    np.testing.assert_array_equal(_vectors(again["p"]), _vectors(got["p"]))


@pytest.mark.engines("dask", "spark-local")
def test_a_tfmodel_names_what_the_savedmodel_has(backend, engine, tmp_path):
    """A signature, tag set, input or output that the SavedModel lacks is a ConfigError listing
    those it has; a .keras file takes no signature; a classifier needs a score per class."""
    path = two_signature_savedmodel(str(tmp_path / "sm"))
    df = engine.table(_sig_parts()[0], SIG_SCHEMA)
    name = engine.ml_name

    def refused(where, **params):
        with pytest.raises(duotf.ConfigError) as info:
            engine.apply_model(engine.model_at(where, **_params(engine, **params)), df)
        return str(info.value)

    message = refused(path, signatureDefKey="predict")
    assert "no signature 'predict'" in message and "['probs', 'serving_default']" in message
    assert f"set {name('signatureDefKey')}" in message
    message = refused(path, tagSet="train")
    assert "tags 'train'" in message and "its tag sets are ['serve']" in message
    assert f"set {name('tagSet')}" in message
    message = refused(path, inputMapping={"feat": "features", "shift": "shift"})
    assert "no input 'features'" in message and "['shift', 'x']" in message
    assert name("inputMapping") in message
    message = refused(path, inputMapping={"feat": "x"})
    assert "no column to the signature's input(s) ['shift']" in message
    message = refused(path, inputMapping={"feat": "x", "shift": "shift"}, outputMapping={"y": "y"})
    assert "no output 'y'" in message and "['logits', 'total']" in message
    message = refused(path, inputMapping={"feat": "x", "shift": "shift"},
                      outputMapping={"total": "t"}, rawPredictionCol="raw")
    assert "one score per class" in message
    keras_file = tmp_path / "m.keras"
    keras_file.write_bytes(b"")  # the check reads the name: no model loads
    message = refused(str(keras_file), signatureDefKey="probs")
    assert "is a Keras file, which has no signatures" in message and "model.export(dir)" in message
    assert name("signatureDefKey") in message
