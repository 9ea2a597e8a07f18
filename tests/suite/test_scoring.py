"""Scoring a DataFrame without a cluster: ``duotf.spark.predict_udf`` / ``duotf.spark.predict``
and ``duotf.dask.predict`` give what ``model.predict`` gives on the same rows, in order, with the
model loaded once per worker process; bad input is refused on the driver before anything runs."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest

import duotf
import duotf.dask
import duotf.scoring
import duotf.spark
from tests.suite import mains

pytestmark = pytest.mark.engines("dask", "spark-local", "spark-standalone")

ROWS, WIDTH = 60, 4
PARTS = 2  # few tasks at once: each new Python worker imports TensorFlow


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny Keras model (4 values a row -> 1, and -> 3) saved as .keras and exported as a
    SavedModel; the rows; what model.predict gives for them."""
    import keras

    keras.utils.set_random_seed(3)
    folder = tmp_path_factory.mktemp("models")
    inputs = keras.Input((WIDTH,), name="features")
    hidden = keras.layers.Dense(3, activation="tanh")(inputs)
    scalar = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    vector = keras.Model(inputs, hidden)
    scalar.save(folder / "scalar.keras")
    vector.save(folder / "vector.keras")
    scalar.export(str(folder / "scalar_sm"), verbose=False)
    x = np.random.default_rng(0).normal(size=(ROWS, WIDTH)).astype("float32")
    return {"keras": str(folder / "scalar.keras"), "savedmodel": str(folder / "scalar_sm"),
            "vector": str(folder / "vector.keras"), "x": x,
            "expected": scalar.predict(x, verbose=0)[:, 0],
            "expected_vector": vector.predict(x, verbose=0)}


def _parts(x, ragged_row=None, parts=PARTS):
    rows = [(i, [float(v) for v in x[i]]) for i in range(len(x))]
    if ragged_row is not None:
        rows[ragged_row] = (ragged_row, [1.0])
    size = len(rows) // parts
    return [rows[p * size:(p + 1) * size] for p in range(parts)]


def _table(engine, x, ragged_row=None, parts=PARTS):
    return engine.table(_parts(x, ragged_row, parts), {"id": "long", "features": "array<float>"})


def _spark(engine) -> bool:
    return hasattr(engine.handle, "sparkContext")


@pytest.mark.parametrize("kind", ["keras", "savedmodel"])
def test_predictions_equal_model_predict_in_order(backend, engine, models, kind):
    df = _table(engine, models["x"])
    if _spark(engine):
        udf = duotf.spark.predict_udf(models[kind], "double", batch_size=7)
        got = engine.to_pandas(df.withColumn("p", udf("features")))  # array<float> column
        packed = duotf.spark.pack_tensors(df, "features")
        also = engine.to_pandas(duotf.spark.predict(packed, models[kind], output="p", batch_size=7))
        assert also["id"].tolist() == list(range(ROWS))
        np.testing.assert_allclose(also["p"], models["expected"], rtol=1e-5, atol=1e-6)
    else:
        got = engine.to_pandas(duotf.dask.predict(df, models[kind], output="p", batch_size=7))
    assert got["id"].tolist() == list(range(ROWS))  # every row, in order
    assert got["p"].dtype == np.float64
    np.testing.assert_allclose(got["p"], models["expected"], rtol=1e-5, atol=1e-6)


def test_a_vector_output_is_an_array_column(backend, engine, models):
    df = _table(engine, models["x"])
    if _spark(engine):
        out = df.select("id", duotf.spark.predict_udf(models["vector"], "array<float>")(
            "features").alias("v"))
    else:
        out = duotf.dask.predict(df, models["vector"], output="v")
    got = engine.to_pandas(out)
    assert got["id"].tolist() == list(range(ROWS))
    np.testing.assert_allclose(np.stack([np.asarray(v) for v in got["v"]]),
                               models["expected_vector"], rtol=1e-5, atol=1e-6)


def test_the_model_is_loaded_once_per_worker_process(backend, engine, models):
    loader = functools.partial(mains.load_keras, models["keras"])
    source = duotf.scoring.model_source(loader)  # one token: the cache's key in every process
    df = _table(engine, models["x"], parts=8)  # more tasks than worker processes
    if _spark(engine):
        engine.to_pandas(df.withColumn("p", duotf.spark.predict_udf(source)("features")))
        # one report per Python worker that runs a task of this job: as many tasks as
        # there are slots, at once, so each idle worker takes one
        reports = engine.session.range(0, 64, numPartitions=16).mapInArrow(
            mains.scoring_stats, "pid long, stats string").collect()
        stats = {r.pid: json.loads(r.stats).get(source.token) for r in reports}
    else:
        engine.to_pandas(duotf.dask.predict(df, source))
        stats = {pid: s.get(source.token) for pid, s in
                 engine.client.run(duotf.scoring.cache_stats).items()}
    used = [s for s in stats.values() if s]
    assert used, stats
    assert all(s["loads"] == 1 for s in used), stats  # never loaded twice in one process
    assert max(s["uses"] for s in used) >= 2, stats  # and reused by a later task


def test_ragged_rows_fail_with_a_feed_schema_error(backend, engine, models):
    df = _table(engine, models["x"], ragged_row=35)  # row 5 of partition 1
    if _spark(engine):
        from pyspark.errors import PythonException

        with pytest.raises(PythonException) as info:
            df.withColumn("p", duotf.spark.predict_udf(models["keras"])("features")).collect()
        text = str(info.value)
        assert "duotf.errors.FeedSchemaError: column 'features'" in text
    else:
        with pytest.raises(duotf.FeedSchemaError) as info:
            engine.to_pandas(duotf.dask.predict(df, models["keras"]))
        text = str(info.value)
        assert (info.value.column, info.value.partition) == ("features", 1)
        assert info.value.problem == "ragged"
    # the row within its partition, and what to change
    assert "rows of different lengths: row 5 of partition 1 holds 1 values" in text
    assert "filter or pad the rows" in text


# -- refused on the driver, before anything runs --------------------------------------------------
def _predict(engine, df, model, **kw):
    if _spark(engine):
        return duotf.spark.predict(df, model, **kw)
    return duotf.dask.predict(df, model, **kw)


def test_a_missing_or_wrong_input_column_is_refused(backend, engine, models):
    df = _table(engine, models["x"])
    with pytest.raises(duotf.ConfigError) as info:
        _predict(engine, df, models["keras"], columns=["nope"])
    assert "input column 'nope' is not in the DataFrame" in str(info.value)
    assert "columns=[...]" in str(info.value) and info.value.column == "nope"
    strings = engine.table([[(1, "a")]], {"id": "long", "features": "string"})
    if not _spark(engine):  # an object column may hold lists; a string column is refused
        strings = strings.astype({"features": "string"})
    with pytest.raises(duotf.ConfigError) as info:
        _predict(engine, strings, models["keras"])
    assert "input column 'features' is" in str(info.value) and "takes numbers" in str(info.value)


def test_a_model_path_that_does_not_exist_is_refused(backend, engine, models, tmp_path):
    df = _table(engine, models["x"])
    missing = str(tmp_path / "no-such-model.keras")
    with pytest.raises(duotf.ConfigError) as info:
        _predict(engine, df, missing)
    assert f"model path {missing!r} does not exist" in str(info.value)
    assert info.value.path == missing
    if _spark(engine):
        with pytest.raises(duotf.ConfigError, match="does not exist"):
            duotf.predict_udf(missing, "double")  # the top-level name, as the issue names it


@pytest.mark.engines("spark-local")
def test_a_return_type_that_does_not_fit_the_model_is_refused(backend, engine, models):
    cases = {
        "double": (models["vector"], "holds 3 values a row (shape 3): use array<float>"),
        "long": (models["keras"], "is float32: its values would be truncated; use double or float"),
        "y double, z double": (models["keras"], "the model has no output 'y'; its outputs are"),
    }
    for return_type, (model, words) in cases.items():
        with pytest.raises(duotf.ConfigError) as info:
            duotf.spark.predict_udf(model, return_type)
        assert words in str(info.value), (return_type, str(info.value))
    udf = duotf.spark.predict_udf(models["keras"], "double")
    with pytest.raises(duotf.ConfigError, match="give the input column"):
        udf()
    with pytest.raises(duotf.ConfigError, match="is not a Spark type"):
        duotf.spark.predict_udf(models["keras"], "no such type")


@pytest.mark.engines("dask")
def test_a_meta_that_does_not_fit_the_model_is_refused(backend, engine, models):
    df = _table(engine, models["x"])
    with pytest.raises(duotf.ConfigError, match="holds 3 values a row"):
        duotf.dask.predict(df, models["vector"], meta={"prediction": "float64"})
    with pytest.raises(duotf.ConfigError, match="would be truncated"):
        duotf.dask.predict(df, models["keras"], meta={"prediction": "int64"})
    with pytest.raises(duotf.ConfigError, match="already a column"):
        duotf.dask.predict(df, models["keras"], output="id")
