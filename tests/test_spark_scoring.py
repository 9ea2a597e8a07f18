"""Spark-only scoring checks: ``duotf.spark.predict_udf``'s return type and the top-level name.

The tests take the shared suite's ``backend`` fixture, narrowed by the ``engines`` marker, so
they run in the suite's own Spark session; what every engine does is in
``tests/suite/test_scoring.py``.
"""

from __future__ import annotations

import pytest

import duotf
import duotf.spark


@pytest.mark.engines("spark-local")
def test_a_return_type_that_does_not_fit_the_model_is_refused(backend, engine, scoring_models, tmp_path):
    models = scoring_models
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
    missing = str(tmp_path / "no-such-model.keras")
    with pytest.raises(duotf.ConfigError, match="does not exist"):
        duotf.predict_udf(missing, "double")  # the top-level name, as the issue names it
