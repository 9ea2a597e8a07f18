"""Scoring a DataFrame without a cluster: ``duotf.spark.predict_udf`` / ``duotf.spark.predict``
and ``duotf.dask.predict`` give what ``model.predict`` gives on the same rows, in order, with the
model loaded once per worker process; bad input is refused on the driver before anything runs."""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import pytest

import duotf
import duotf._ml.scoring
from duotf.testing.suite import mains
from duotf.testing.suite.data import SCORING_ROWS as ROWS, scoring_table as _table

pytestmark = pytest.mark.engines("dask", "spark-local", "spark-standalone", "spark-connect")


@pytest.mark.parametrize("kind", ["keras", "savedmodel"])
def test_predictions_equal_model_predict_in_order(backend, engine, scoring_models, kind):
    models = scoring_models
    df = _table(engine, models["x"])
    for way, out in engine.score_every_way(df, models[kind], output="p", batch_size=7).items():
        got = engine.to_pandas(out)
        assert got["id"].tolist() == list(range(ROWS)), way  # every row, in order
        assert got["p"].dtype == np.float64, way
        np.testing.assert_allclose(got["p"], models["expected"], rtol=1e-5, atol=1e-6, err_msg=way)


def test_a_vector_output_is_an_array_column(backend, engine, scoring_models):
    models = scoring_models
    df = _table(engine, models["x"])
    for way, out in engine.score_every_way(df, models["vector"], output="v",
                                           return_type="array<float>").items():
        got = engine.to_pandas(out)
        assert got["id"].tolist() == list(range(ROWS)), way
        np.testing.assert_allclose(np.stack([np.asarray(v) for v in got["v"]]),
                                   models["expected_vector"], rtol=1e-5, atol=1e-6, err_msg=way)


def test_the_model_is_loaded_once_per_worker_process(backend, engine, scoring_models):
    loader = functools.partial(mains.load_keras, scoring_models["keras"])
    source = duotf._ml.scoring.model_source(loader)  # one token: the cache's key in every process
    df = _table(engine, scoring_models["x"], parts=8)  # more tasks than worker processes
    engine.to_pandas(engine.score(df, source))
    stats = {pid: s.get(source.token) for pid, s in engine.scoring_stats().items()}
    used = [s for s in stats.values() if s]
    assert used, stats
    assert all(s["loads"] == 1 for s in used), stats  # never loaded twice in one process
    assert max(s["uses"] for s in used) >= 2, stats  # and reused by a later task


def test_ragged_rows_fail_with_a_feed_schema_error(backend, engine, scoring_models):
    df = _table(engine, scoring_models["x"], ragged_row=35)  # row 5 of partition 1
    with engine.task_failure() as failure:
        engine.to_pandas(engine.score(df, scoring_models["keras"]))
    assert "duotf.errors.FeedSchemaError: column 'features'" in failure.text
    # the row within its partition, and what to change
    assert "rows of different lengths: row 5 of partition 1 holds 1 values" in failure.text
    assert "filter or pad the rows" in failure.text


# -- refused on the driver, before anything runs --------------------------------------------------
def test_a_missing_or_wrong_input_column_is_refused(backend, engine, scoring_models):
    df = _table(engine, scoring_models["x"])
    with pytest.raises(duotf.ConfigError) as info:
        engine.score(df, scoring_models["keras"], columns=["nope"])
    assert "input column 'nope' is not in the DataFrame" in str(info.value)
    assert "columns=[...]" in str(info.value) and info.value.column == "nope"
    # a string column (pandas: of the string dtype; an object column may hold lists)
    strings = engine.frame([pd.DataFrame({"id": [1], "features": pd.Series(["a"], dtype="string")})])
    with pytest.raises(duotf.ConfigError) as info:
        engine.score(strings, scoring_models["keras"])
    assert "input column 'features' is" in str(info.value) and "takes numbers" in str(info.value)


def test_a_model_path_that_does_not_exist_is_refused(backend, engine, scoring_models, tmp_path):
    df = _table(engine, scoring_models["x"])
    missing = str(tmp_path / "no-such-model.keras")
    with pytest.raises(duotf.ConfigError) as info:
        engine.score(df, missing)
    assert f"model path {missing!r} does not exist" in str(info.value)
    assert info.value.path == missing
