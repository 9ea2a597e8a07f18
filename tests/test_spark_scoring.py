"""Spark-only scoring checks: ``duotf.spark.predict_udf``'s return type and the top-level name.

The tests take the shared suite's ``backend`` fixture, narrowed by the ``engines`` marker, so
they run in the suite's own Spark session; what every engine does is in
``tests/suite/test_scoring.py``.
"""

from __future__ import annotations

import pytest
from pyspark.sql import functions

import duotf
import duotf.spark

#: predict_udf is an ``arrow_udf`` (PySpark >= 4.1); below, it refuses with the way that works
ARROW_UDF = hasattr(functions, "arrow_udf")


@pytest.mark.engines("spark-local")
def test_a_return_type_that_does_not_fit_the_model_is_refused(backend, engine, scoring_models, tmp_path):
    models = scoring_models
    if not ARROW_UDF:  # (the version legs' PySpark 3.5 and 4.0)
        with pytest.raises(duotf.ConfigError, match=r"needs PySpark >= 4.1 .* use duotf.spark.predict"):
            duotf.spark.predict_udf(models["keras"], "double")
        return
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


@pytest.mark.engines("spark-local")
def test_a_model_of_two_inputs_and_two_outputs_scores_into_a_struct_and_into_columns(
        backend, engine, tmp_path):
    """predict_udf with a struct return type (a field per model output) and predict with a
    column per output, on an array<float> and a double column: what model.predict gives."""
    import keras
    import numpy as np

    from tests.suite import mains

    keras.utils.set_random_seed(4)
    model = mains.two_io_model_fn()
    path = str(tmp_path / "two_io.keras")
    model.save(path)
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(40, 3)).astype(np.float32), rng.normal(size=40)
    y, z = model.predict([a, b[:, None].astype(np.float32)], verbose=0)
    rows = [(i, a[i].tolist(), float(b[i])) for i in range(40)]
    df = engine.table([rows[:25], rows[25:]], {"id": "long", "a": "array<float>", "b": "double"})

    if ARROW_UDF:
        udf = duotf.spark.predict_udf(path, "y double, z array<float>", batch_size=16)
        out = df.withColumn("p", udf("a", "b")).select("id", "p.y", "p.z").toPandas()
        assert out["id"].tolist() == list(range(40))
        np.testing.assert_allclose(out["y"].to_numpy(), y[:, 0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.stack(out["z"].to_numpy()), z, rtol=1e-5, atol=1e-6)

    both = duotf.spark.predict(df, path, columns=["a", "b"], output={"py": "y", "pz": "z"}).toPandas()
    assert both.columns.tolist() == ["id", "a", "b", "py", "pz"]
    np.testing.assert_allclose(both["py"].to_numpy(), y[:, 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.stack(both["pz"].to_numpy()), z, rtol=1e-5, atol=1e-6)
