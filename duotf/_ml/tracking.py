"""MLflow tracking of a ``TFEstimator`` fit (the ``mlflow`` extra): the chief logs the fit's
parameters, every epoch's metrics and the model to the run that was active where ``fit`` was
called.

On the driver, :func:`tracking_target` finds that run: only if this process imported
``mlflow`` already (a run can be active only then, so duotf never imports it), and only in the
calling thread (MLflow's active run is per thread). The nodes get the tracking URI (a local
path made absolute), the run's and its experiment's ids, and the fit's parameters in
``args["mlflow"]``. On the chief of a ``modelFn`` fit, :class:`NodeTracker` logs them with the
run's id given explicitly (the node process has no active run, and must not end the run):
the parameters once as training begins (with the optimizer's name and learning rate), each
epoch's metrics, ``val_*`` included, at ``step=epoch``, and, once the chief saved it, the model
(MLflow's Keras 3 flavor, ``mlflow.keras``, as the model ``"model"`` of the run). The other
workers log nothing.

Logging is best-effort: a fit does not fail because the tracking server did. The first error
is logged as a warning naming the run and the cause, and the chief logs nothing more for that
fit (so a server that is down costs one wait, not one per epoch).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional

if TYPE_CHECKING:
    from duotf._ml.estimator import FitConfig

logger = logging.getLogger(__name__)

__all__ = ["ARG", "MODEL_NAME", "fit_target", "tracking_target", "absolute_uri", "NodeTracker"]

#: the key of ``args`` that holds the run to log to (None: no logging)
ARG = "mlflow"
#: the name of the model the chief logs in the run (``runs:/<run_id>/model`` loads it)
MODEL_NAME = "model"
#: what the chief's MLflow client retries, unless the node's environment says otherwise: a
#: server that is down holds the chief (and the workers waiting for it) about 15 s, not minutes
_RETRY_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}


def absolute_uri(uri: str) -> str:
    """``uri`` with a relative local path made absolute (the nodes run in other folders): a
    plain path, ``file:`` and ``sqlite:///relative.db``; any other URI (``databricks``
    included) as it is."""
    if uri.startswith("databricks"):
        return uri
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + os.path.abspath(uri[len("sqlite:///"):])
    if uri.startswith("file:") and not uri.startswith("file:/"):
        return "file://" + os.path.abspath(uri[len("file:"):])
    if "://" not in uri and ":" not in uri.split("/", 1)[0]:
        return os.path.abspath(uri)
    return uri


def tracking_target(params: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The MLflow run a fit logs to, for the nodes (``args["mlflow"]``); None when there is
    none.

    Parameters
    ----------
    params : dict
        The fit's parameters to log (names as :data:`~duotf._ml.estimator.FIT_PARAMS`); those
        that are None are left out.

    Returns
    -------
    dict or None
        ``{"trackingUri", "runId", "experimentId", "params"}`` when this process imported
        ``mlflow`` and a run is active in the calling thread, else None.
    """
    mlflow = sys.modules.get("mlflow")
    if mlflow is None:  # never imported here: no run can be active, and duotf does not import it
        return None
    run = mlflow.active_run()
    if run is None:
        return None
    uri = absolute_uri(mlflow.get_tracking_uri())
    logger.info("TFEstimator: the chief logs to MLflow run %s at %s", run.info.run_id, uri)
    return {"trackingUri": uri, "runId": run.info.run_id, "experimentId": run.info.experiment_id,
            "params": {name: str(value) for name, value in params.items() if value is not None}}


def fit_target(config: "FitConfig", validation: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """:func:`tracking_target` for one fit: its parameters to log are ``epochs``, ``batchSize``,
    ``numWorkers``, ``seed``, the columns, the validation settings (with ``validationRows``,
    the number of ``validation`` rows), and ``numPs``, ``shuffle``, ``runId``, ``trainFn``
    where set."""
    params = {name: getattr(config, name) for name in (
        "epochs", "batchSize", "numWorkers", "seed", "featuresCol", "labelCol", "weightCol",
        "validationIndicatorCol")}
    params.update({name: getattr(config, name) for name in ("numPs", "validationFraction",
                                                            "shuffle", "runId")
                   if getattr(config, name)})
    if validation:
        params["validationRows"] = len(next(iter(validation.values())))
    if config.trainFn is not None:
        params["trainFn"] = getattr(config.trainFn, "__qualname__", repr(config.trainFn))
    return tracking_target(params)


class NodeTracker:
    """The chief's logging to the run of ``target`` (:func:`tracking_target`'s dict): a Keras
    callback (:meth:`callback`) for the parameters and each epoch's metrics, and
    :meth:`log_model` for the saved model. Every call is best-effort (see the module)."""

    def __init__(self, target: Dict[str, Any]):
        for name, value in _RETRY_DEFAULTS.items():
            os.environ.setdefault(name, value)
        self.target = target
        self.run_id: str = target["runId"]
        self.failed = False
        self._client: Any = None

    def _try(self, what: str, step: Callable[[], None]) -> None:
        """Run one logging step; on its first failure warn, and log nothing more."""
        if self.failed:
            return
        try:
            step()
        except Exception as exc:  # MlflowException, a connection error: the fit goes on
            self.failed = True
            logger.warning("TFEstimator: MLflow logging to run %s at %s failed while logging "
                           "%s (%s: %s); the fit goes on, and logs nothing more to MLflow",
                           self.run_id, self.target["trackingUri"], what, type(exc).__name__, exc)

    @property
    def client(self):
        if self._client is None:
            from mlflow import MlflowClient

            self._client = MlflowClient(tracking_uri=self.target["trackingUri"])
        return self._client

    def log_params(self, model) -> None:
        """The fit's parameters, with the optimizer's class name and learning rate."""
        def step():
            from mlflow.entities import Param

            params = dict(self.target["params"])
            optimizer = getattr(model, "optimizer", None)
            if optimizer is not None:
                params["optimizer"] = type(optimizer).__name__
                rate = _learning_rate(optimizer)
                if rate is not None:
                    params["learningRate"] = rate
            self.client.log_batch(self.run_id, params=[Param(k, v) for k, v in sorted(params.items())])

        self._try("the fit's parameters", step)

    def log_epoch(self, epoch: int, logs: Optional[Dict[str, Any]]) -> None:
        """One epoch's metrics (``logs`` of ``on_epoch_end``), at ``step=epoch``; a value that
        is not one number (a metric of one value per class) is left out."""
        def step():
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            metrics = []
            for name, value in sorted((logs or {}).items()):
                try:
                    metrics.append(Metric(str(name), float(value), now, epoch))
                except (TypeError, ValueError):
                    continue
            if metrics:
                self.client.log_batch(self.run_id, metrics=metrics)

        self._try(f"epoch {epoch}'s metrics", step)

    def log_model(self, model) -> None:
        """The fitted model, with MLflow's Keras 3 flavor, as the run's model
        :data:`MODEL_NAME`; its pip requirements are this node's keras and tensorflow (named,
        not inferred: inferring loads the model again in a new process)."""
        def step():
            import tensorflow as tf

            import keras
            import mlflow

            mlflow.set_tracking_uri(self.target["trackingUri"])
            mlflow.set_experiment(experiment_id=self.target["experimentId"])
            mlflow.models.Model.log(
                artifact_path=None, name=MODEL_NAME, flavor=mlflow.keras, model=model,
                run_id=self.run_id, signature=_signature(model),
                pip_requirements=[f"keras=={keras.__version__}", f"tensorflow=={tf.__version__}"])

        self._try("the model", step)

    def callback(self):
        """A Keras callback: the parameters as training begins, each epoch's metrics."""
        import keras

        tracker = self

        class MlflowTracking(keras.callbacks.Callback):
            def on_train_begin(self, logs=None):
                tracker.log_params(self.model)

            def on_epoch_end(self, epoch, logs=None):
                tracker.log_epoch(epoch, logs)

        return MlflowTracking()


def _learning_rate(optimizer) -> Optional[str]:
    """The optimizer's learning rate as its config says (its variable read as a number, even
    under a distribution strategy), written as the float32 it is held in (``0.05``, not
    ``0.05000000074505806``); None for a schedule, which has no one value."""
    import numpy as np

    try:
        rate = optimizer.get_config().get("learning_rate")
    except Exception:  # an optimizer of one's own whose config fails: logged without it
        return None
    if not isinstance(rate, (int, float)) or isinstance(rate, bool):
        return None
    return str(np.float32(rate))


def _signature(model):
    """The model's signature for a model of one input and one output (tensors of their
    shapes and dtypes); None for others, which MLflow then logs without one."""
    import numpy as np
    from mlflow.models import ModelSignature
    from mlflow.types import Schema, TensorSpec

    try:
        inputs, outputs = list(model.inputs), list(model.outputs)
    except (AttributeError, ValueError):  # a model never built has none
        return None
    if len(inputs) != 1 or len(outputs) != 1:
        return None

    def spec(tensor):
        return Schema([TensorSpec(np.dtype(tensor.dtype), tuple(-1 if d is None else d
                                                                for d in tensor.shape))])

    return ModelSignature(inputs=spec(inputs[0]), outputs=spec(outputs[0]))
