"""Spark ML alone: ``duotf.spark.TFEstimator`` in a ``Pipeline`` tuned by a ``CrossValidator``,
and Spark ML persistence of the stages. What every engine's ML stages do is in
``tests/suite/test_estimator.py``; these tests take its ``backend`` fixture, narrowed by the
``engines`` marker, so they run in the suite's own Spark session.
"""

from __future__ import annotations

import gc
import logging
import math

import numpy as np
import pytest

from tests.suite import mains
from tests.suite.test_estimator import (BATCH, ENV, EPOCHS, SEED, SIZES, WIDTH, WORKERS,
                                        linear_parts)


@pytest.mark.engines("spark-local")
def test_a_pipeline_and_a_cross_validator(backend, engine, tmp_path, caplog):
    """VectorAssembler -> TFEstimator in a Pipeline, tuned by a CrossValidator (2 folds, 2
    epoch values) with parallelism=4 where one fit fits at once (2 slots of 3: 1 node, 1 to feed
    it): the fits wait in line for the slots and never overlap; the best PipelineModel saves
    and loads. (The slot ledger alone: tests/test_estimator_config.py.)"""
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.evaluation import RegressionEvaluator
    from pyspark.ml.feature import VectorAssembler
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

    from duotf.spark import TFEstimator, TFModel

    caplog.set_level(logging.INFO, logger="duotf._ml.estimator")
    caplog.set_level(logging.INFO, logger="duotf.cluster")
    parts = [[(r[0], *r[1], r[2]) for r in p] for p in linear_parts()]
    df = engine.table(parts, {"id": "long", "x0": "double", "x1": "double", "x2": "double",
                              "label": "double"}).cache()
    est = TFEstimator(modelFn=mains.linear_model_fn, numWorkers=1, batchSize=BATCH, seed=SEED,
                      modelDir=str(tmp_path / "models"), env=ENV)
    assert backend.slots() < 2 * (1 + 1)  # two fits do not fit at once
    pipeline = Pipeline(stages=[VectorAssembler(inputCols=["x0", "x1", "x2"], outputCol="features"),
                                est])
    grid = ParamGridBuilder().addGrid(est.epochs, [1, 2]).build()
    evaluator = RegressionEvaluator(predictionCol="prediction", labelCol="label")
    cv = CrossValidator(estimator=pipeline, estimatorParamMaps=grid, evaluator=evaluator,
                        numFolds=2, seed=3, parallelism=4)
    cv_model = cv.fit(df)
    # 4 fits and the best one's refit, one at a time: the clusters' lifetimes (duotf's own log)
    # never overlap, and fits did wait for the slots another fit held
    messages = [r.getMessage() for r in caplog.records]
    events = [("start", m.split("(job ")[1].rstrip(")")) if m.startswith("duotf: starting")
              else ("end", m.split()[2]) for m in messages
              if m.startswith("duotf: starting") or m.endswith(" shut down")]
    jobs = [job for what, job in events if what == "start"]
    assert len(jobs) == 5 and events == [(w, j) for j in jobs for w in ("start", "end")], events
    assert any(m.startswith("TFEstimator: waiting for 2 slot(s)") for m in messages)
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


@pytest.mark.engines("spark-local")
def test_a_failed_fit_ends_its_cross_validator_with_nothing_left_running(backend, engine, tmp_path):
    """A CrossValidator over TFEstimator itself (so its fitMultiple: one FitGroup a fold), 2
    param maps, parallelism=2 where one fit fits at once. The fit of numWorkers=3 can never
    have its slots and fails at once, while the other fit waits for slots, starts its cluster
    or has not begun: CrossValidator raises that error, and by then no fit of the group runs,
    no cluster lives and no node is left. (The failure comes before the other fit can end: a
    fit that ended already gives CrossValidator a model, which pyspark scores in its pool
    even after it raised; that is no cluster, but a Spark job left to end by itself.)"""
    import duotf
    import duotf._driver.cluster
    import duotf._ml.estimator
    from multiprocessing.pool import ThreadPool

    from pyspark.ml.evaluation import RegressionEvaluator
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

    from duotf.spark import TFEstimator
    from duotf.testing import node_processes as _node_processes
    from tests.suite.test_estimator import SCHEMA

    df = engine.table(linear_parts(), SCHEMA)
    est = TFEstimator(trainFn=mains.linear_train_fn, batchSize=BATCH, seed=SEED,
                      modelDir=str(tmp_path / "models"), env=ENV)
    grid = ParamGridBuilder().addGrid(est.numWorkers, [1, 3]).build()
    cv = CrossValidator(estimator=est, estimatorParamMaps=grid, evaluator=RegressionEvaluator(),
                        numFolds=2, parallelism=2, seed=3)
    before = set(duotf._driver.cluster._live)  # an earlier test's cluster never shut down is not this one's
    with pytest.raises(duotf.InsufficientSlotsError) as info:
        cv.fit(df)
    assert "needs 4 free slots (numWorkers=3 node tasks + 1 to feed them)" in str(info.value)
    assert "has 3 in all" in str(info.value)
    # at once, not after a while: nothing of the group runs once CrossValidator has raised
    assert duotf._ml.estimator.running_fits() == 0 and not set(duotf._driver.cluster._live) - before
    del before
    assert not _node_processes()
    # pyspark's CrossValidator never closes its ThreadPool when a fit raises; the traceback
    # holds its frame, and a log record's may too: end the pool (it joins its threads) before
    # the leak check, which then sees only what duotf left.
    tb = info.tb
    while tb is not None:
        for value in list(tb.tb_frame.f_locals.values()):
            if isinstance(value, ThreadPool):
                value.terminate()
        tb = tb.tb_next
    info.value.__traceback__ = None
    del info, tb
    gc.collect()


@pytest.mark.engines("spark-local")
def test_validation_fraction_holds_out_rows_by_a_seeded_hash_of_each(backend, engine):
    """validationFraction's split, without a fit: about that fraction of the rows, the same
    rows however the DataFrame is partitioned, other rows for another seed; the validation
    rows collected as arrays."""
    from duotf._ml.estimator import FitConfig
    from duotf.spark._data import prepare_columns, split_validation
    from tests.suite.test_estimator import SCHEMA

    df = engine.table(linear_parts(), SCHEMA).cache()

    def held(frame, seed=SEED):
        config = FitConfig.from_params(dict(modelFn=mains.linear_model_fn, validationFraction=0.25,
                                            seed=seed))
        train, cols = split_validation(prepare_columns(frame, config), config)
        return train.count(), cols

    rows, cols = held(df)
    assert rows + len(cols["label"]) == sum(SIZES) and 8 <= len(cols["label"]) <= 24
    assert cols["features"].shape == (len(cols["label"]), WIDTH)
    _, again = held(df.repartition(3))
    assert sorted(again["label"]) == sorted(cols["label"])
    _, other = held(df, seed=SEED + 1)
    assert sorted(other["label"]) != sorted(cols["label"])
    df.unpersist()
