"""Dask-only: ``duotf.dask.TFEstimator`` / ``TFModel`` as scikit-learn pipeline stages (what
dask-ml pipelines use): a real ``sklearn.pipeline.Pipeline`` fitted on a Dask DataFrame, then
``predict``/``transform`` through it, and ``sklearn.base.clone``.

The test takes the shared suite's ``backend`` fixture, narrowed by the ``engines`` marker, so it
runs in the suite's own Dask cluster.
"""

from __future__ import annotations

import numpy as np
import pytest

import duotf.dask
from tests.suite import mains
from tests.suite.test_estimator import BATCH, ENV, SEED, WORKERS, linear_parts

sklearn_base = pytest.importorskip("sklearn.base")
from sklearn.pipeline import Pipeline  # noqa: E402
from sklearn.preprocessing import FunctionTransformer  # noqa: E402


def _prep(ddf):
    """The pipeline's first step, a Dask DataFrame -> Dask DataFrame function: the raw column
    named as the model's features, and the label scaled."""
    return ddf.rename(columns={"raw": "features"}).assign(label=lambda d: d["label"] * 2.0)


@pytest.mark.engines("dask")
def test_the_estimator_is_a_sklearn_pipeline_stage(backend, engine, tmp_path):
    raw = engine.table(linear_parts(), {"id": "long", "raw": "array<float>", "label": "double"})
    est = duotf.dask.TFEstimator(model_fn=mains.linear_model_fn, num_workers=WORKERS, epochs=1,
                                 batch_size=BATCH, seed=SEED, model_dir=str(tmp_path / "models"),
                                 env=ENV, client=engine.client)
    # clone: an unfitted copy of the same parameters (the client shared, not copied)
    copy = sklearn_base.clone(est)
    assert copy is not est and copy.get_params() == est.get_params()
    assert copy.client is engine.client and copy.set_params(epochs=3).epochs == 3 and est.epochs == 1
    assert not sklearn_base.is_classifier(copy) and not hasattr(copy, "model_")  # its tags

    pipeline = Pipeline([("prep", FunctionTransformer(_prep)), ("tf", est)])
    assert pipeline.fit(raw) is pipeline  # one cluster run: the last step's fit
    model = pipeline.named_steps["tf"].model_
    assert isinstance(model, duotf.dask.TFModel) and len(model.history["loss"]) == 1

    direct = engine.to_pandas(model.predict(_prep(raw)))
    assert direct["id"].tolist() == list(range(len(direct)))
    for way in (pipeline.predict, pipeline.transform):  # the step's predict / transform
        got = engine.to_pandas(way(raw))
        assert got.columns.tolist() == ["id", "features", "label", "prediction"], way
        assert np.array_equal(got["prediction"].to_numpy(), direct["prediction"].to_numpy()), way
    assert np.array_equal(engine.to_pandas(model.transform(_prep(raw)))["prediction"],
                          direct["prediction"])
    # the whole fitted pipeline clones to an unfitted one; a TFModel clones to the same model
    again = sklearn_base.clone(pipeline)
    assert not hasattr(again.named_steps["tf"], "model_")
    assert sklearn_base.clone(model).get_params() == model.get_params()
    with pytest.raises(duotf.ConfigError, match="not fitted"):
        again.named_steps["tf"].predict(raw)


def test_the_dask_stages_spell_their_parameters_in_snake_case():
    """Spark ML's camelCase names are refused by the Dask twin, each with its snake_case
    spelling; the core's errors name the parameters as the Dask twin spells them."""
    with pytest.raises(TypeError, match="spells it model_fn="):
        duotf.dask.TFEstimator(modelFn=mains.linear_model_fn)
    with pytest.raises(TypeError, match="spells it model_path="):
        duotf.dask.TFModel(modelPath="m.keras")
    with pytest.raises(TypeError, match="unexpected keyword argument 'workers'$"):
        duotf.dask.TFEstimator(workers=2)
    with pytest.raises(duotf.ConfigError, match="numWorkers is spelled num_workers"):
        duotf.dask.TFEstimator().set_params(numWorkers=2)
    est = duotf.dask.TFEstimator(model_fn=mains.linear_model_fn, num_workers=2, batch_size=7)
    assert "num_workers=2" in repr(est) and "batch_size=7" in repr(est)
    with pytest.raises(duotf.ConfigError, match="batch_size=7 is the global batch, split evenly "
                       "between num_workers=2") as info:
        est.config()
    assert info.value.param == "batch_size"
    with pytest.raises(duotf.ConfigError, match="exactly one of model_fn .* and train_fn"):
        duotf.dask.TFEstimator().config()
    model = duotf.dask.TFModel("m.keras", prediction_col="p", argmax_col="k")
    assert model.get_params()["prediction_col"] == "p" and model.model_path == "m.keras"


def test_import_duotf_dask_imports_no_dask_pandas_or_numpy():
    """(Its lazy names stay light too: tests/test_estimator_config.py.)"""
    import subprocess
    import sys

    code = "import sys, duotf.dask; print(sorted({'dask', 'distributed', 'pandas', 'numpy'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.engines("dask")
def test_a_model_saved_with_camel_case_keys_loads_and_saves_snake_case(backend, engine, tmp_path,
                                                                       scoring_models):
    """A folder that an earlier duotf saved (metadata.json with camelCase keys) loads; saving
    it again writes the snake_case keys."""
    import json
    import shutil

    from tests.suite.data import scoring_table

    old = tmp_path / "old"
    (old / "model").mkdir(parents=True)
    shutil.copy(scoring_models["keras"], old / "model" / "scalar.keras")
    (old / "metadata.json").write_text(json.dumps({
        "featuresCol": "features", "predictionCol": "p", "argmaxCol": None, "outputCols": None,
        "batchSize": 16, "history": {"loss": [1.0]}, "fitSeconds": 2.5, "modelFile": "scalar.keras"}))
    model = duotf.dask.TFModel.load(str(old))
    assert (model.model_path, model.prediction_col, model.batch_size, model.fit_seconds) == (
        str(old / "model" / "scalar.keras"), "p", 16, 2.5)
    assert model.history == {"loss": [1.0]}
    got = engine.to_pandas(model.predict(scoring_table(engine, scoring_models["x"])))
    np.testing.assert_allclose(got["p"], scoring_models["expected"], rtol=1e-5, atol=1e-6)
    model.save(str(tmp_path / "new"))
    saved = json.loads((tmp_path / "new" / "metadata.json").read_text())
    assert set(saved) == {"features_col", "prediction_col", "argmax_col", "output_cols",
                          "batch_size", "signature_def_key", "tag_set", "input_mapping",
                          "output_mapping", "probability_col", "raw_prediction_col", "history",
                          "fit_seconds", "model_file"}
    assert duotf.dask.TFModel.load(str(tmp_path / "new")).get_params() == dict(
        model.get_params(), model_path=str(tmp_path / "new" / "model" / "scalar.keras"))


@pytest.mark.engines("dask")
def test_validation_fraction_holds_out_rows_by_a_seeded_hash_of_each(backend, engine):
    """validation_fraction's split, without a fit: about that fraction of the rows, the same
    rows however the DataFrame is partitioned, other rows for another seed; the validation
    rows computed as arrays."""
    from duotf.dask._ml import _fit_columns, _split
    from tests.suite.test_estimator import SCHEMA, SIZES, WIDTH

    ddf = engine.table(linear_parts(), SCHEMA)

    def held(frame, seed=SEED):
        config = duotf.dask.TFEstimator(model_fn=mains.linear_model_fn, validation_fraction=0.25,
                                        seed=seed).config()
        train, cols = _split(_fit_columns(frame, config), config)
        return len(train), cols

    rows, cols = held(ddf)
    assert rows + len(cols["label"]) == sum(SIZES) and 8 <= len(cols["label"]) <= 24
    assert cols["features"].shape == (len(cols["label"]), WIDTH)
    _, again = held(ddf.repartition(npartitions=2))
    assert sorted(again["label"]) == sorted(cols["label"])
    _, other = held(ddf, seed=SEED + 1)
    assert sorted(other["label"]) != sorted(cols["label"])
