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
