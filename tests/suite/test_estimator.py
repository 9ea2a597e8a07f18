"""The shared suite's test_estimator, on every engine of tests/engines.py; and a test of the
mechanism under it (duotf._ml.estimator's FitGroup, whose internals it reads), kept here, out of
the shipped suite."""

import sys

import pytest

import duotf
import duotf._ml.estimator
from duotf.testing.suite import mains
from duotf.testing.suite.test_estimator import *  # noqa: F401,F403
from duotf.testing.suite.test_estimator import ENV, linear_parts


@pytest.mark.engines("local")
def test_a_failed_fit_group_stops_its_running_cluster_and_its_waiting_fit(backend, engine, tmp_path,
                                                                          caplog):
    """The mechanism under ``duotf.spark.TFEstimator.fitMultiple`` (tests/test_spark_estimator.py
    runs it under a CrossValidator): two fits of one FitGroup, each needing all the engine's
    slots. The first runs (its node waits until stopped), the second waits for slots; the group
    fails: the first's cluster is shut down at once, the second never starts, and once
    ``settle()`` returns no node of the group is left."""
    import logging
    import threading
    import time

    from duotf.testing import node_processes, poll_for

    caplog.set_level(logging.INFO, logger="duotf._ml.estimator")
    group = duotf._ml.estimator.FitGroup()
    config = duotf._ml.estimator.FitConfig.from_params(dict(
        trainFn=mains.started_train_fn, trainArgs={"started": str(tmp_path)},
        modelDir=str(tmp_path / "models"), env=ENV))
    feed_slots = backend.slots() - config.nodes  # one fit takes every slot
    data = engine.rows(linear_parts())
    outcomes = {}

    def one(name):
        try:
            with group.member():
                duotf._ml.estimator.fit(config, backend, id(backend), data, feed_slots, group)
        except BaseException as exc:
            outcomes[name] = exc

    first = threading.Thread(target=one, args=("first",))
    first.start()
    poll_for(lambda: (tmp_path / "node-0").exists(), 60, what="the first fit's node")
    # the node runs before duotf.run returns the cluster to the fit; a group failing in between
    # is refused at once with the group's own error (FitGroup.running), not stopped under it
    poll_for(lambda: group._live, 60, what="the first fit's cluster running in its group")
    second = threading.Thread(target=one, args=("second",))
    second.start()
    poll_for(lambda: any("waiting for" in r.getMessage() for r in caplog.records), 10,
             what="the second fit waiting for slots")
    error = ValueError("another fit of the group failed")
    t0 = time.monotonic()
    group.fail(error)
    group.settle()
    assert time.monotonic() - t0 < 15
    assert not node_processes()  # stopped, not being stopped
    first.join(5), second.join(5)
    assert outcomes["second"] is error  # woken in the line, never started
    # its cluster stopped under it as it fed the node (the feed's error, or the node's)
    assert isinstance(outcomes["first"], duotf.DuotfError)
    assert duotf._ml.estimator.running_fits() == 0
    assert sum("slot(s) booked" in r.getMessage() for r in caplog.records) == 1
    with pytest.raises(ValueError, match="another fit of the group failed"):
        group.raise_error()


@pytest.mark.engines("local")
def test_the_nodes_get_the_active_mlflow_run_unless_mlflow_logging_is_off(backend, engine, tmp_path,
                                                                          monkeypatch):
    """The driver's half of MLflow tracking, without MLflow (a stand-in module, as the import
    finds it): the run active in the calling thread reaches the nodes in ``args["mlflow"]``, a
    relative tracking path made absolute, with the fit's parameters as strings; with
    ``mlflowLogging=False``, or no active run, the nodes get None."""
    import types

    run = types.SimpleNamespace(info=types.SimpleNamespace(run_id="r1", experiment_id="7"))
    active = [run]
    monkeypatch.setitem(sys.modules, "mlflow", types.SimpleNamespace(
        active_run=lambda: active[0], get_tracking_uri=lambda: "sqlite:///runs.db"))
    monkeypatch.chdir(tmp_path)
    data = engine.rows(linear_parts())

    def handed(**params):
        config = duotf._ml.estimator.FitConfig.from_params(dict(
            trainFn=mains.tracking_train_fn, numWorkers=1, epochs=3, seed=0,
            modelDir=str(tmp_path / "models"), env=ENV, **params))
        return duotf._ml.estimator.fit(config, backend, id(backend), data, 0).history["mlflow"]

    assert handed(validationFraction=0.25) == {
        "trackingUri": f"sqlite:///{tmp_path}/runs.db", "runId": "r1", "experimentId": "7",
        "params": {"epochs": "3", "batchSize": "32", "numWorkers": "1", "seed": "0",
                   "featuresCol": "features", "labelCol": "label", "validationFraction": "0.25",
                   "trainFn": "tracking_train_fn"}}
    assert handed(mlflowLogging=False) is None
    active[0] = None
    assert handed() is None
    with pytest.raises(duotf.ConfigError, match="mlflowLogging='yes': give True"):
        duotf._ml.estimator.FitConfig.from_params(dict(trainFn=mains.tracking_train_fn,
                                                       mlflowLogging="yes"))
