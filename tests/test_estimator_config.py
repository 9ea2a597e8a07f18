"""The ML stages' engine-neutral half (duotf._ml.estimator), without an engine: parameter checks,
the slot ledger of fits running at once, and light imports."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import duotf
from duotf._ml import estimator
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
    ({"modelFn": model_fn, "validationFraction": 1}, "validationFraction=1: give a number from 0"),
    ({"modelFn": model_fn, "validationFraction": -0.1}, "validationFraction=-0.1"),
    ({"modelFn": model_fn, "validationFraction": True}, "validationFraction=True"),
    ({"modelFn": model_fn, "validationFraction": 0.2, "validationIndicatorCol": "v"},
     "give one of them, not both"),
    ({"modelFn": model_fn, "validationIndicatorCol": "label"}, "validationIndicatorCol='label' is also"),
    ({"modelFn": model_fn, "weightCol": ""}, "weightCol='': give a column name"),
    ({"modelFn": model_fn, "weightCol": "v", "validationIndicatorCol": "v"}, "both 'v'"),
    ({"modelFn": model_fn, "callbacks": 3}, "callbacks=3: give a list of Keras callbacks"),
    ({"modelFn": model_fn, "runId": "r1"}, "runId='r1' names a folder of modelDir, which is not set"),
    ({"modelFn": model_fn, "modelDir": "/m", "runId": "../r1"}, "runId='../r1': give a folder name"),
    ({"modelFn": model_fn, "modelDir": "/m", "runId": 3}, "runId=3: give a folder name"),
])
def test_a_bad_parameter_is_a_config_error_naming_it(params, words):
    with pytest.raises(duotf.ConfigError) as info:
        estimator.FitConfig.from_params(params)
    assert words in str(info.value)


def test_a_good_config_lists_the_fed_columns():
    config = estimator.FitConfig.from_params({"trainFn": model_fn, "featuresCol": ["a", "b"],
                                              "labelCol": "y", "numWorkers": 2, "numPs": 1})
    assert config.columns == ["a", "b", "y"] and config.nodes == 3


def test_validation_and_weights_in_the_config():
    config = estimator.FitConfig.from_params({"modelFn": model_fn, "weightCol": "w",
                                              "validationFraction": 0.25, "seed": 3})
    assert config.columns == ["features", "label", "w"] and config.validating
    assert config.split_column == estimator.VALIDATION_FLAG and config.split_seed == 3
    assert config.hash_threshold == 1 << 22
    config = estimator.FitConfig.from_params({"modelFn": model_fn, "validationIndicatorCol": "v"})
    assert config.split_column == "v" and "v" not in config.columns
    with pytest.raises(duotf.ConfigError, match="leaves 1 of the 5 rows to train on") as info:
        estimator.validation_rows(config.__class__.from_params(
            {"modelFn": model_fn, "validationIndicatorCol": "v", "numWorkers": 2}), 4, 5)
    assert info.value.param == "validationIndicatorCol"
    with pytest.raises(duotf.ConfigError, match="at most 200000 validation rows"):
        estimator.validation_rows(config, estimator.VALIDATION_MAX_ROWS + 1, 10 ** 6)
    big = {"x": np.zeros(estimator.VALIDATION_MAX_BYTES // 8 + 1)}
    with pytest.raises(duotf.ConfigError, match="MiB"):
        estimator.check_validation_data(config, big)
    assert not estimator.FitConfig.from_params({"modelFn": model_fn}).validating


def test_callbacks_on_the_nodes_save_checkpoints_under_the_fit_folder():
    import keras

    from duotf._ml.keras_node import node_callbacks

    def given():
        return [keras.callbacks.EarlyStopping(), keras.callbacks.ModelCheckpoint("ckpt/m.keras"),
                keras.callbacks.ModelCheckpoint("/abs/m.keras")]

    chief = node_callbacks(given, "/models/fit-1", chief=True)
    assert [getattr(c, "filepath", None) for c in chief] == [None, "/models/fit-1/ckpt/m.keras",
                                                             "/abs/m.keras"]
    assert [type(c).__name__ for c in node_callbacks(given(), "/m", chief=False)] == ["EarlyStopping"]
    with pytest.raises(duotf.ConfigError, match="is not a keras.callbacks.Callback"):
        node_callbacks([3], "/m", chief=True)


def test_a_run_folder_resumes_its_checkpoint_with_its_own_parameters(tmp_path):
    """What a runId's folder holds decides the fit (duotf._ml.resume; a fit whose driver is
    killed resumes on the engines in tests/suite/test_resume.py): a new run, a checkpoint to
    resume after its epochs, a run started with other parameters (refused), a run whose last
    checkpoint is its last epoch (that checkpoint becomes its model), a finished run."""
    import json

    from duotf._ml import resume

    def config(**params):
        return estimator.FitConfig.from_params(dict(
            {"modelFn": model_fn, "modelDir": str(tmp_path), "runId": "r1", "epochs": 3}, **params))

    state = resume.open_run(config(), estimator.saved_model_path)
    assert (state.folder, state.done, state.checkpoint, state.finished) == (str(tmp_path / "r1"), 0,
                                                                           None, False)
    assert state.node_args() is None and os.listdir(tmp_path / "r1") == ["owner"]  # its token
    assert (tmp_path / "r1" / "owner").read_text() == state.owner and len(state.owner) == 32
    (tmp_path / "r1" / "checkpoint-2.keras").write_bytes(b"2 epochs")
    resume.write_state(state.folder, {"params": resume.run_params(config()), "done": 2,
                                      "history": {"loss": [2.0, 1.0]}, "model": "checkpoint-2.keras",
                                      "finished": False})
    assert sorted(os.listdir(tmp_path / "r1")) == ["checkpoint-2.keras", "owner", "run.json"]  # no .tmp
    first = state.owner
    state = resume.open_run(config(numWorkers=2), estimator.saved_model_path)
    assert state.owner not in ("", first) and (tmp_path / "r1" / "owner").read_text() == state.owner
    assert state.node_args() == {"checkpoint": str(tmp_path / "r1" / "checkpoint-2.keras"),
                                 "epoch": 2, "history": {"loss": [2.0, 1.0]}}
    with pytest.raises(duotf.ConfigError) as info:
        resume.open_run(config(batchSize=16, seed=4), estimator.saved_model_path)
    assert "runId='r1' was started with batchSize=32 (now 16), seed=None (now 4)" in str(info.value)
    assert info.value.param == "runId"
    # every epoch checkpointed, the driver gone before the model was saved: that checkpoint is it
    resume.write_state(str(tmp_path / "r1"), dict(json.loads((tmp_path / "r1" / "run.json").read_text()),
                                                  params=resume.run_params(config(epochs=2))))
    state = resume.open_run(config(epochs=2), estimator.saved_model_path)
    assert state.finished and state.history == {"loss": [2.0, 1.0]}
    assert sorted(os.listdir(tmp_path / "r1")) == ["model.keras", "run.json"]  # no token left
    assert (tmp_path / "r1" / "model.keras").read_bytes() == b"2 epochs"
    again = resume.open_run(config(epochs=2), estimator.saved_model_path)
    assert again.finished and again.done == 2


def test_the_chief_checkpoints_every_epoch_and_a_node_restores_the_optimizer(tmp_path):
    import json

    import keras

    from duotf._ml import resume

    def built():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.Adam(0.1), "mse")
        return model

    config = estimator.FitConfig.from_params({"modelFn": model_fn, "modelDir": str(tmp_path),
                                              "runId": "r", "epochs": 4})
    folder = str(tmp_path / "r")
    os.makedirs(folder)  # the driver's open_run makes it
    model = built()
    x, y = np.ones((8, 2), np.float32), np.ones((8,), np.float32)
    callback = resume.checkpoint_callback({"modelDir": folder, "runParams": resume.run_params(config),
                                           "resume": None})
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[callback])
    state = json.loads((tmp_path / "r" / "run.json").read_text())
    assert (state["done"], state["model"], len(state["history"]["loss"])) == (2, "checkpoint-2.keras", 2)
    assert sorted(os.listdir(folder)) == ["checkpoint-2.keras", "run.json"]  # the older one deleted
    other = built()
    resume.restore(other, folder + "/checkpoint-2.keras")
    assert int(np.asarray(other.optimizer.iterations)) == 4
    np.testing.assert_array_equal(other.get_weights()[0], model.get_weights()[0])
    unbuilt = keras.Sequential([keras.layers.Dense(1)])
    unbuilt.compile("sgd", "mse")
    with pytest.raises(duotf.ConfigError, match="not built.*keras.Input"):
        resume.restore(unbuilt, folder + "/checkpoint-2.keras")


def test_a_chief_whose_run_another_fit_took_over_commits_no_checkpoint(tmp_path):
    """The fence (duotf._ml.resume): a fit resumed while the lost fit's nodes still run takes
    the run; the old chief's next epoch end commits nothing, leaves the checkpoint the new fit
    resumes from, and ends its node."""
    import json

    import keras

    from duotf._ml import resume

    config = estimator.FitConfig.from_params({"modelFn": model_fn, "modelDir": str(tmp_path),
                                              "runId": "r", "epochs": 4})
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    x, y = np.ones((8, 2), np.float32), np.ones((8,), np.float32)
    lost = resume.open_run(config, estimator.saved_model_path)
    old = resume.checkpoint_callback({"modelDir": lost.folder, "runParams": resume.run_params(config),
                                      "resume": None, "runId": "r", "runOwner": lost.owner})
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[old])  # its driver then lost
    committed = (tmp_path / "r" / "run.json").read_text()
    resumed = resume.open_run(config, estimator.saved_model_path)  # at once, the old nodes alive
    assert resumed.node_args()["epoch"] == 2
    with pytest.raises(resume.RunTakenOverError, match="runId='r' was taken over by another fit"):
        model.fit(x, y, batch_size=4, epochs=3, initial_epoch=2, verbose=0, callbacks=[old])
    assert (tmp_path / "r" / "run.json").read_text() == committed
    assert sorted(os.listdir(tmp_path / "r")) == ["checkpoint-2.keras", "owner", "run.json"]
    # the new fit's chief commits as before
    new = resume.checkpoint_callback({"modelDir": resumed.folder, "resume": resumed.node_args(),
                                      "runParams": resume.run_params(config), "runId": "r",
                                      "runOwner": resumed.owner})
    model.fit(x, y, batch_size=4, epochs=3, initial_epoch=2, verbose=0, callbacks=[new])
    assert json.loads((tmp_path / "r" / "run.json").read_text())["done"] == 3
    assert sorted(os.listdir(tmp_path / "r")) == ["checkpoint-3.keras", "owner", "run.json"]


def test_fit_multiple_refuses_a_run_id():
    from duotf.spark import TFEstimator

    est = TFEstimator(modelFn=model_fn, modelDir="/m", runId="r")
    with pytest.raises(duotf.ConfigError, match="runId names one fit's folder, and fitMultiple"):
        est.fitMultiple(None, [{}])
    plain = TFEstimator(modelFn=model_fn, modelDir="/m")
    with pytest.raises(duotf.ConfigError, match="unset runId"):
        plain.fitMultiple(None, [{plain.runId: "r"}])


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
    code = ("import sys, duotf.spark, duotf.dask, duotf._ml.estimator\n"
            "print([m for m in ('tensorflow', 'pyspark', 'distributed', 'dask', 'mlflow') if m in sys.modules])\n"
            "duotf.dask.predict_udf, duotf.dask.feed_stream\n"
            "print('dask' in sys.modules)\n"
            "duotf.spark.TFEstimator\n"
            "print('pyspark' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "False", "True"]


def test_the_spark_and_dask_stages_take_the_same_parameters():
    import inspect
    import re

    import duotf.dask
    from duotf.spark import TFEstimator, TFModel

    spark = {p.name for p in TFEstimator().params}
    dask = {p.name for p in inspect.signature(duotf.dask.TFEstimator).parameters.values()
            if p.kind is p.KEYWORD_ONLY} - {"client"}
    # the same parameters, each in its ecosystem's spelling (Dask: snake_case)
    assert {re.sub(r"(?<=[a-z])([A-Z])", r"_\1", name).lower() for name in spark} == dask
    assert set(estimator.FIT_PARAMS) <= spark
    est = TFEstimator(modelFn=model_fn).setEpochs(3).setNumWorkers(2).setEnv({"A": "1"})
    assert (est.getEpochs(), est.getNumWorkers(), est.getEnv()) == (3, 2, {"A": "1"})
    assert est.config().epochs == 3 and est.getFeaturesCol() == "features"
    assert duotf.dask.TFEstimator(model_fn=model_fn, epochs=3).config().epochs == 3
    assert TFModel(modelPath="m.keras").setPredictionCol("p").getPredictionCol() == "p"


def test_the_repeated_signatures_stay_one():
    """pyspark's ``@keyword_only`` needs ``__init__`` and ``setParams`` to spell out the same
    keywords, and the Dask twin repeats them in snake_case, so each signature is written out
    where users read it (help(), an IDE). They may not drift apart: the same names, defaults
    and annotations, in the same order."""
    import inspect
    import re

    import duotf.dask
    from duotf.spark import TFEstimator

    def keywords(fn, snake=False):
        out = []
        for p in inspect.signature(fn).parameters.values():
            if p.kind is p.KEYWORD_ONLY and p.name != "client":
                name = re.sub(r"(?<=[a-z])([A-Z])", r"_\1", p.name).lower() if snake else p.name
                out.append((name, p.default, p.annotation))
        return out

    assert keywords(TFEstimator.__init__) == keywords(TFEstimator.setParams)
    assert keywords(TFEstimator.__init__, snake=True) == keywords(duotf.dask.TFEstimator.__init__)
    # the models too (the Dask twin takes model_path by position)
    from duotf.spark import TFModel

    spark_model = [k for k in keywords(TFModel.__init__, snake=True) if k[0] != "model_path"]
    assert spark_model == keywords(duotf.dask.TFModel.__init__)
    assert set(duotf.dask.TFModel._PARAMS) == {k[0] for k in spark_model} | {"model_path"}


class FakeEngine:
    """What the ledger asks of a backend."""

    name = "FakeEngine(slots=3)"

    def slots(self):
        return 3

    def capacity_hint(self):
        return "(a hint)"


def _book_in_thread(key, need, what, order, timeout=10.0, check=None, hold=None):
    """Book in a thread of its own; ``order`` gets ``what`` once booked (and the error if it
    fails); the booking is held until ``hold`` is set."""
    def book():
        try:
            with estimator.book_slots(key, FakeEngine(), need, what, timeout, check):
                order.append(what)
                if hold is not None:
                    assert hold.wait(10)
        except BaseException as exc:
            order.append(exc)

    thread = threading.Thread(target=book)
    thread.start()
    return thread


def _poll(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _waiting(key):
    with estimator._ledger_cond:
        entry = estimator._ledger.get(key)
        return len(entry.line) if entry is not None else 0


def test_fits_wait_in_line_for_slots_other_fits_hold():
    """3 slots: a fit holds 2; a fit of 2 waits; one of 1 that comes later waits behind it
    (first come, first served) though 1 slot is free; both go once the first is done."""
    order = []
    first = estimator.book_slots(7, FakeEngine(), 2, "first", timeout=10)
    hold = threading.Event()
    second = _book_in_thread(7, 2, "second", order, hold=hold)
    _poll(lambda: _waiting(7) == 1)
    third = _book_in_thread(7, 1, "third", order, hold=hold)
    _poll(lambda: _waiting(7) == 2)
    time.sleep(0.2)
    assert order == [] and estimator.running_fits() == 1
    with first:
        pass
    _poll(lambda: len(order) == 2)
    assert order == ["second", "third"] and estimator.running_fits() == 2
    hold.set()
    second.join(5), third.join(5)
    assert estimator.running_fits() == 0 and not estimator._ledger


def test_a_wait_without_a_freed_slot_is_bounded_and_says_what_holds_them():
    with estimator.book_slots(8, FakeEngine(), 2, "numWorkers=1 node tasks + 1 to feed them"):
        t0 = time.monotonic()
        with pytest.raises(duotf.InsufficientSlotsError) as info:
            estimator.book_slots(8, FakeEngine(), 2, "numWorkers=1 node tasks + 1 to feed them",
                                 timeout=0.3)
        assert 0.3 <= time.monotonic() - t0 < 3
    message = str(info.value)
    assert "waited 0 s for 2 free slots" in message and "no slot was freed for 0.3 s" in message
    assert "held by 1 other fit(s)" in message
    assert "2 by a fit of numWorkers=1 node tasks + 1 to feed them, for 0 s" in message
    assert "DUOTF_RESERVATION_TIMEOUT" in message and "set parallelism=1" in message
    assert info.value.waited >= 0.3 and info.value.available == 1
    assert estimator.running_fits() == 0 and not estimator._ledger
    # more than the engine has in all: at once, whatever the timeout
    t0 = time.monotonic()
    with pytest.raises(duotf.InsufficientSlotsError, match="has 3 in all"):
        estimator.book_slots(8, FakeEngine(), 4, "too many", timeout=30)
    assert time.monotonic() - t0 < 1


def test_a_failed_group_stops_its_waiting_fits_and_its_clusters():
    class Cluster:
        stopped = None

        def shutdown(self, grace_secs):
            self.stopped = grace_secs
            raise duotf.NodesStoppedError("stopped, as asked")

    group, order = estimator.FitGroup(), []
    cluster = Cluster()
    with estimator.book_slots(9, FakeEngine(), 3, "all"), group.member(), group.running(cluster):
        waiter = _book_in_thread(9, 1, "waiter", order, check=group.check)
        _poll(lambda: _waiting(9) == 1)
        error = ValueError("fit 1 failed")
        group.fail(error)
        waiter.join(5)
        assert order == [error] and cluster.stopped == 0
        group.fail(RuntimeError("a later failure"))  # the first one is the group's
    group.settle()
    with pytest.raises(ValueError, match="fit 1 failed"):
        group.raise_error()
    with pytest.raises(ValueError, match="fit 1 failed"), group.member():
        pass  # a fit that comes after a failure does not start
    assert estimator.running_fits() == 0 and not estimator._ledger
