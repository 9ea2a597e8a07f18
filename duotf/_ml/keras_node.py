"""The node program that :class:`duotf.spark.TFEstimator` and :class:`duotf.dask.TFEstimator`
run for a ``modelFn`` (:func:`keras_main`), with its Keras callbacks (:func:`node_callbacks`)."""

from __future__ import annotations

import logging
import os
from typing import Callable

from duotf._ml import tracking
from duotf._ml.resume import checkpoint_callback, restore
from duotf.errors import ConfigError

logger = logging.getLogger("duotf._ml.estimator")

__all__ = ["keras_main", "batch_selector", "node_callbacks"]


# -- the node program for a modelFn -----------------------------------------------------------------
def keras_main(args, ctx):
    """The node program duotf writes for ``modelFn``: the model built in a
    ``MultiWorkerMirroredStrategy`` scope, ``fit`` on this node's feed (one feed epoch per
    ``fit`` epoch, no ``steps_per_epoch``; ``(x, y, weight)`` with ``weightCol``), with the
    validation rows shipped in ``args`` as ``validation_data`` and the ``callbacks``; the chief
    saves the model, and logs the fit to the MLflow run of ``args["mlflow"]`` if there is one
    (:mod:`duotf._ml.tracking`); returns the history. With a ``runId`` the chief keeps a
    checkpoint every epoch, and ``args["resume"]`` (a checkpoint) is loaded before the fit goes
    on from its epoch (:mod:`duotf._ml.resume`)."""
    import tensorflow as tf

    import keras

    if args["seed"] is not None:
        keras.utils.set_random_seed(args["seed"])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    feed = ctx.get_data_feed(train=True)
    batches = feed.dataset(args["batchSize"], per_epoch=True)  # {column: batch}, an epoch an iteration
    with strategy.scope():
        model = args["modelFn"]()
        if not isinstance(model, keras.Model):
            raise ConfigError(f"modelFn returned {type(model).__name__}: return a keras.Model")
        if getattr(model, "optimizer", None) is None or not getattr(model, "compiled", True):
            raise ConfigError("modelFn returned a model that is not compiled: call "
                              "model.compile(optimizer, loss, metrics) before returning it")
        resumed = args.get("resume")  # a runId's checkpoint: the epochs done, the history so far
        if resumed is not None:
            restore(model, resumed["checkpoint"])
    xy = batch_selector(args, model)
    validation = None
    if args.get("validationData") is not None:
        # every worker holds every validation row; the strategy splits each global batch
        # between the workers (sharding by data), and reduces the metrics over them
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        validation = (tf.data.Dataset.from_tensor_slices(args["validationData"])
                      .batch(args["batchSize"]).map(xy).with_options(options))
    first = resumed["epoch"] if resumed is not None else 0
    callbacks = node_callbacks(args.get("callbacks"), args["modelDir"], ctx.is_chief)
    if args.get("runId") is not None and ctx.is_chief:  # first: it has saved when the others run
        callbacks.insert(0, checkpoint_callback(args))
    tracker = None
    if ctx.is_chief and args.get(tracking.ARG) is not None:  # the other workers log nothing
        tracker = tracking.NodeTracker(args[tracking.ARG])
        callbacks.append(tracker.callback())
    history = model.fit(batches.map(xy), epochs=args["epochs"], initial_epoch=first,
                        verbose=args["verbose"], shuffle=False, validation_data=validation,
                        callbacks=callbacks)
    if first + len(history.epoch) < args["epochs"]:  # a callback stopped it (EarlyStopping): feed no more
        logger.info("TFEstimator: fit stopped after %d of %d epochs", first + len(history.epoch),
                    args["epochs"])
        feed.terminate()
    if ctx.is_chief:
        model.save(args["modelPath"])
        if tracker is not None:
            tracker.log_model(model)
    before = resumed["history"] if resumed is not None else {}
    return {k: [float(v) for v in before.get(k, [])] + [float(v) for v in values]
            for k, values in history.history.items()}


def batch_selector(args, model) -> Callable:
    """A batch ``{column: tensor}`` as Keras's ``(x, y)``, or ``(x, y, weight)``."""
    features = list(args["features"])
    labels = list(args.get("labels") or [args["labelCol"]])
    weight = args.get("weightCol")
    try:
        by_name = isinstance(model.input, dict)  # a model of named inputs takes them by column
    except (AttributeError, ValueError):  # a Sequential model never called has no input
        by_name = False

    def xy(batch):
        # featuresCol and labelCol in order, one column per model input and output (a model
        # whose inputs are a dict takes them by column name)
        x = ({name: batch[name] for name in features} if by_name else
             batch[features[0]] if len(features) == 1 else tuple(batch[name] for name in features))
        y = batch[labels[0]] if len(labels) == 1 else tuple(batch[name] for name in labels)
        return (x, y) if weight is None else (x, y, batch[weight])

    return xy


def node_callbacks(given, fit_dir: str, chief: bool) -> list:
    """This node's Keras callbacks from ``callbacks`` (a list, or a function of no arguments
    returning one; each node unpickles its own copies): a ``ModelCheckpoint`` whose path is
    relative saves under the fit's folder ``fit_dir``, and only the chief keeps one (every
    worker holds the same weights)."""
    import keras

    if given is None:
        return []
    callbacks = list(given() if callable(given) else given)
    out = []
    for cb in callbacks:
        if not isinstance(cb, keras.callbacks.Callback):
            raise ConfigError(f"callbacks: {cb!r} is not a keras.callbacks.Callback",
                              param="callbacks")
        if isinstance(cb, keras.callbacks.ModelCheckpoint):
            if not chief:
                continue
            path = str(cb.filepath)
            if "://" not in path and not os.path.isabs(path):
                cb.filepath = fit_dir.rstrip("/") + "/" + path
        out.append(cb)
    return out
