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
    est = duotf.dask.TFEstimator(modelFn=mains.linear_model_fn, numWorkers=WORKERS, epochs=1,
                                 batchSize=BATCH, seed=SEED, modelDir=str(tmp_path / "models"),
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
