"""Dask-only scoring checks: ``duotf.dask.predict``'s ``meta``, and a task's typed error.

The tests take the shared suite's ``backend`` fixture, narrowed by the ``engines`` marker, so
they run in the suite's own Dask cluster; what every engine does is in
``tests/suite/test_scoring.py``.
"""

from __future__ import annotations

import pytest

import duotf
import duotf.dask
from tests.suite.data import scoring_table


@pytest.mark.engines("dask")
def test_a_meta_that_does_not_fit_the_model_is_refused(backend, engine, scoring_models):
    models = scoring_models
    df = scoring_table(engine, models["x"])
    with pytest.raises(duotf.ConfigError, match="holds 3 values a row"):
        duotf.dask.predict(df, models["vector"], meta={"prediction": "float64"})
    with pytest.raises(duotf.ConfigError, match="would be truncated"):
        duotf.dask.predict(df, models["keras"], meta={"prediction": "int64"})
    with pytest.raises(duotf.ConfigError, match="already a column"):
        duotf.dask.predict(df, models["keras"], output="id")
    # a task's FeedSchemaError reaches the driver typed, with its attributes (Spark gives text)
    ragged = scoring_table(engine, models["x"], ragged_row=35)  # row 5 of partition 1
    with pytest.raises(duotf.FeedSchemaError) as info:
        engine.client.compute(duotf.dask.predict(ragged, models["keras"]), sync=True)
    assert (info.value.column, info.value.partition, info.value.row) == ("features", 1, 5)
    assert info.value.problem == "ragged"


@pytest.mark.engines("dask")
def test_inference_keeps_an_array_column_as_arrays(backend, engine):
    """Dask makes object columns strings by default ("dataframe.convert-string"): the
    inference output keeps the input's array column as the arrays it held."""
    import dask
    import dask.dataframe as dd
    import numpy as np
    import pandas as pd

    from tests.suite import mains

    frames = [pd.DataFrame({"x": [float(i) for i in range(p * 5, p * 5 + 5)],
                            "y": [i for i in range(p * 5, p * 5 + 5)],
                            "v": [np.full(3, i, np.float32) for i in range(p * 5, p * 5 + 5)]})
              for p in range(2)]
    with dask.config.set({"dataframe.convert-string": False}):  # the input as made
        ddf = dd.from_pandas(pd.concat(frames, ignore_index=True), npartitions=2)
    with duotf.run(mains.feed_infer_main, {"batch": 4}, backend, duotf.ClusterSpec(workers=2)) as cluster:
        out = cluster.inference(ddf, keep=["y", "v"])
        cluster.wait(timeout=60)
    pdf = out.compute()
    assert pdf["y"].tolist() == list(range(10))
    assert all(isinstance(v, np.ndarray) and v.tolist() == [float(y)] * 3
               for v, y in zip(pdf["v"], pdf["y"])), pdf["v"].head()


@pytest.mark.engines("dask")
def test_predict_udf_scores_each_partition_with_map_partitions(backend, engine, scoring_models):
    """``duotf.dask.predict_udf``, the twin of ``duotf.spark.predict_udf``: a picklable function
    of a pandas partition for ``ddf.map_partitions``, scoring from the same per-process cache as
    ``duotf.dask.predict`` (one load per worker process for both)."""
    import pickle

    import numpy as np

    from tests.suite.data import SCORING_ROWS

    models = scoring_models
    df = scoring_table(engine, models["x"], parts=4)
    udf = pickle.loads(pickle.dumps(duotf.dask.predict_udf(models["keras"], output="p", batch_size=7)))
    assert isinstance(udf, duotf.dask.PredictUDF)
    meta = udf.output_meta(df)
    assert list(meta.columns) == ["id", "features", "p"] and meta["p"].dtype == np.float64
    got = engine.to_pandas(df.map_partitions(udf, meta=meta))
    assert got["id"].tolist() == list(range(SCORING_ROWS))  # every row, in order
    np.testing.assert_allclose(got["p"], models["expected"], rtol=1e-5, atol=1e-6)
    # the same function on one pandas frame, in this process
    first = engine.client.compute(df.partitions[0], sync=True)
    np.testing.assert_allclose(udf(first)["p"], models["expected"][:len(first)], rtol=1e-5, atol=1e-6)
    # predict and predict_udf share each worker's cache: the model is loaded once a process
    engine.to_pandas(duotf.dask.predict(df, models["keras"], output="q"))
    used = [s[models["keras"]] for s in engine.scoring_stats().values() if models["keras"] in s]
    assert used and all(s["loads"] == 1 for s in used), used
    # checked on the driver: the output's dtype against the model, the frame's columns
    with pytest.raises(duotf.ConfigError, match="holds 3 values a row"):
        duotf.dask.predict_udf(models["vector"], meta={"prediction": "float64"})
    with pytest.raises(duotf.ConfigError, match="already a column"):
        duotf.dask.predict_udf(models["keras"], output="id").output_meta(df)
    with pytest.raises(duotf.ConfigError, match="input column 'nope' is not in the DataFrame"):
        duotf.dask.predict_udf(models["keras"], columns=["nope"]).output_meta(df)
