"""Spark ML alone: ``duotf.spark.TFEstimator`` in a ``Pipeline`` tuned by a ``CrossValidator``,
and Spark ML persistence of the stages. What every engine's ML stages do is in
``tests/suite/test_estimator.py``; these tests take its ``backend`` fixture, narrowed by the
``engines`` marker, so they run in the suite's own Spark session.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.suite import mains
from tests.suite.test_estimator import (BATCH, ENV, EPOCHS, SEED, SIZES, WIDTH, WORKERS,
                                        linear_parts)


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

    parts = [[(r[0], *r[1], r[2]) for r in p] for p in linear_parts()]
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

    # an estimator saves and loads with its parameters (its modelFn included)
    est = TFEstimator(modelFn=mains.linear_model_fn, featuresCol="features", labelCol="label",
                      numWorkers=WORKERS, epochs=EPOCHS, batchSize=BATCH, seed=SEED,
                      modelDir=str(tmp_path / "models"), env=ENV)
    est.write().save(str(tmp_path / "tfestimator"))
    loaded_est = TFEstimator.load(str(tmp_path / "tfestimator"))
    assert loaded_est.uid == est.uid and loaded_est.getOrDefault("epochs") == EPOCHS
    assert loaded_est.getOrDefault("env") == ENV
    assert loaded_est.getOrDefault("modelFn")().count_params() == WIDTH + 1

    df.unpersist()
