"""MLflow tracking's halves without an engine (duotf._ml.tracking): the tracking URI the nodes
get, and the chief's logging when the server fails. The fit against a real tracking server:
the shared suite's test_estimator (dask, spark-local)."""

from __future__ import annotations

import logging
import os
import socket

import pytest

from duotf._ml import tracking


@pytest.mark.parametrize("uri, absolute", [
    ("mlruns", os.path.abspath("mlruns")),
    ("./runs/here", os.path.abspath("runs/here")),
    ("/data/mlruns", "/data/mlruns"),
    ("file:mlruns", "file://" + os.path.abspath("mlruns")),
    ("file:///data/mlruns", "file:///data/mlruns"),
    ("sqlite:///mlflow.db", "sqlite:///" + os.path.abspath("mlflow.db")),
    ("sqlite:////data/mlflow.db", "sqlite:////data/mlflow.db"),
    ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
    ("databricks", "databricks"),
    ("databricks://profile", "databricks://profile"),
])
def test_a_relative_local_tracking_uri_is_made_absolute_for_the_nodes(uri, absolute):
    assert tracking.absolute_uri(uri) == absolute


def test_the_chief_warns_once_when_the_server_fails_and_logs_nothing_more(monkeypatch, caplog):
    """A tracking server that does not answer: the first logging step warns, naming the run,
    the server and the cause; the later ones try nothing (the fit goes on)."""
    pytest.importorskip("mlflow", reason="the mlflow extra (mlflow-skinny) is not installed")
    monkeypatch.setattr(os, "environ", dict(os.environ))  # what NodeTracker sets goes with it
    os.environ.pop("MLFLOW_HTTP_REQUEST_TIMEOUT", None)
    os.environ.update(MLFLOW_HTTP_REQUEST_MAX_RETRIES="0",  # NodeTracker keeps what is set
                      MLFLOW_DISABLE_TELEMETRY="true")
    with socket.socket() as sock:  # a port that nothing listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    tracker = tracking.NodeTracker({"trackingUri": url, "runId": "r1", "experimentId": "0",
                                    "params": {"epochs": "2"}})
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "30"  # its default for the chief
    caplog.set_level(logging.WARNING, logger="duotf._ml.tracking")
    tracker.log_epoch(0, {"loss": 1.0})
    assert tracker.failed
    (record,) = caplog.records
    message = record.getMessage()
    assert "MLflow logging to run r1 at " + url in message and "epoch 0's metrics" in message
    assert "the fit goes on, and logs nothing more to MLflow" in message
    tracker.log_epoch(1, {"loss": 0.5})
    tracker.log_model(object())  # not even tried: a model would fail otherwise
    assert len(caplog.records) == 1


def test_the_chief_logs_the_parameters_and_each_number_of_an_epoch(monkeypatch):
    """What reaches the client: the fit's parameters with the optimizer's name and learning
    rate (as the float32 it is held in), and an epoch's numbers at its step (a value of one
    number per class is left out)."""
    import types

    import keras
    import numpy as np

    monkeypatch.setattr(os, "environ", dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true"))
    mlflow = pytest.importorskip("mlflow", reason="the mlflow extra (mlflow-skinny) is not installed")
    batches = []
    monkeypatch.setattr(mlflow, "MlflowClient", lambda tracking_uri: types.SimpleNamespace(
        log_batch=lambda run_id, **logged: batches.append((tracking_uri, run_id, logged))))
    tracker = tracking.NodeTracker({"trackingUri": "http://server", "runId": "r1",
                                    "experimentId": "0", "params": {"epochs": "2"}})
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    tracker.log_params(model)
    tracker.log_epoch(1, {"loss": np.float32(0.5), "val_loss": 0.25, "per_class": np.ones(3)})
    assert not tracker.failed
    (uri, run, params), (_, _, metrics) = batches
    assert (uri, run) == ("http://server", "r1")
    assert {p.key: p.value for p in params["params"]} == {"epochs": "2", "optimizer": "Adam",
                                                          "learningRate": "0.001"}
    assert [(m.key, m.value, m.step) for m in metrics["metrics"]] == [("loss", 0.5, 1),
                                                                    ("val_loss", 0.25, 1)]
