"""The ML stages' engine-neutral half (duotf.estimator), without an engine: parameter checks,
the slot ledger of fits running at once, and light imports."""

from __future__ import annotations

import subprocess
import sys

import pytest

import duotf
from duotf import estimator
from duotf.backends import LocalBackend


def model_fn():
    raise AssertionError("not called: nothing runs here")


@pytest.mark.parametrize("params, words", [
    ({}, "give exactly one of modelFn"),
    ({"modelFn": model_fn, "trainFn": model_fn}, "give exactly one of modelFn"),
    ({"modelFn": 3}, "modelFn=3 is not callable"),
    ({"modelFn": model_fn, "featuresCol": []}, "featuresCol=[]"),
    ({"modelFn": model_fn, "labelCol": None}, "labelCol=None"),
    ({"modelFn": model_fn, "featuresCol": ["a", "label"]}, "both in featuresCol and labelCol"),
    ({"modelFn": model_fn, "epochs": 0}, "epochs=0"),
    ({"modelFn": model_fn, "numWorkers": 2, "batchSize": 33}, "multiple of 2"),
    ({"modelFn": model_fn, "numPs": 1}, "numPs=1"),
    ({"modelFn": model_fn, "env": {"A": 1}}, "env="),
    ({"modelFn": model_fn, "epoch": 2}, "unknown parameter(s) ['epoch']"),
])
def test_a_bad_parameter_is_a_config_error_naming_it(params, words):
    with pytest.raises(duotf.ConfigError) as info:
        estimator.FitConfig.from_params(params)
    assert words in str(info.value)


def test_a_good_config_lists_the_fed_columns():
    config = estimator.FitConfig.from_params({"trainFn": model_fn, "featuresCol": ["a", "b"],
                                              "labelCol": "y", "numWorkers": 2, "numPs": 1})
    assert config.columns == ["a", "b", "y"] and config.nodes == 3


def test_fits_at_once_book_their_slots_together_or_fail_at_once():
    backend = LocalBackend(slots=5)
    with estimator.book_slots(1, backend, 3, "2 nodes + 1 to feed them"):
        assert estimator.running_fits() == 1
        with pytest.raises(duotf.InsufficientSlotsError) as info:
            estimator.book_slots(1, backend, 3, "2 nodes + 1 to feed them")
        message = str(info.value)
        assert "needs 3 free slots" in message and "held by 1 other fit(s)" in message
        assert "set parallelism=1" in message and info.value.available == 2
        with estimator.book_slots(2, backend, 3, "another engine"):  # its own slots
            assert estimator.running_fits() == 2
    assert estimator.running_fits() == 0
    with estimator.book_slots(1, backend, 5, "all"):
        pass
    with pytest.raises(duotf.InsufficientSlotsError, match="has 5 in all"):
        estimator.book_slots(1, backend, 6, "more than there are")
    assert estimator.running_fits() == 0


def test_the_stage_modules_import_light():
    code = ("import sys, duotf.spark, duotf.dask, duotf.estimator\n"
            "print([m for m in ('tensorflow', 'pyspark', 'distributed', 'dask') if m in sys.modules])\n"
            "duotf.spark.TFEstimator\n"
            "print('pyspark' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "True"]


def test_the_spark_and_dask_stages_take_the_same_parameters():
    import inspect

    import duotf.dask
    from duotf.spark import TFEstimator, TFModel

    spark = {p.name for p in TFEstimator().params}
    dask = set(inspect.signature(duotf.dask.TFEstimator).parameters) - {"client"}
    assert spark == dask and set(estimator.FIT_PARAMS) <= spark
    est = TFEstimator(modelFn=model_fn).setEpochs(3).setNumWorkers(2).setEnv({"A": "1"})
    assert (est.getEpochs(), est.getNumWorkers(), est.getEnv()) == (3, 2, {"A": "1"})
    assert est.config().epochs == 3 and est.getFeaturesCol() == "features"
    assert duotf.dask.TFEstimator(modelFn=model_fn, epochs=3).config().epochs == 3
    assert TFModel(modelPath="m.keras").setPredictionCol("p").getPredictionCol() == "p"
