"""Keras 3 ``model.fit``/``evaluate``/``predict`` under ``MultiWorkerMirroredStrategy``.

Keras 3 (3.15 with TF 2.21) cannot train under ``MultiWorkerMirroredStrategy`` (MWMS), because
of two spots in ``keras/src/backend/tensorflow/trainer.py``:

1. ``TensorFlowTrainer._maybe_symbolic_build`` takes the first batch of the distributed dataset
   and reduces it across replicas (``strategy.reduce("MEAN", batch, axis=None)``) only to learn
   the shapes it builds the model with; under MWMS that raises "Attempt to convert a value
   (PerReplica...)". It also pulls that batch from a fresh iterator which it then drops, rows
   read ahead with it: harmless for a file, but an engine feed would lose them.
2. ``reduce_per_replica(values, strategy, "mean")`` (the logs of every train and test step)
   reduces the scalar loss and metrics with ``strategy.reduce("MEAN", v, axis=0)``: "Invalid
   reduction dimension 0 for input with 0 dimensions".

A third spot is not a bug but a collective: ``predict`` under MWMS gathers every worker's
predictions each step (``reduce_per_replica(..., "concat")`` -> ``strategy.gather``), so every
worker gets all workers' rows, interleaved step by step, and all workers must take the same
steps. An inference feed (``cluster.inference``) gives each worker partitions of its own, of any
size, and wants this worker's predictions in its rows' order: ``predict`` of an inference feed's
dataset (``ctx.get_data_feed(train=False).dataset(...)``, marked by the feed) runs on this worker
alone, without the strategy (the mirrored variables read as they are here, the same everywhere),
one prediction per row read, in order. Any other input is predicted as Keras does.

duotf replaces the first two (and wraps ``predict``), in every node process, when Keras imports that module (a ``sys.meta_path``
hook: a node that never imports Keras pays nothing): the build takes its shapes from the
dataset's ``element_spec`` (or, failing that, from the first replica's part of a batch), and a
multi-worker mean is the cross-replica mean (``axis=None``), what Keras computes on one worker.
The gradients are untouched (the optimizer sums the replicas' gradients of a loss scaled by
``1 / num_replicas``), so 2 workers train the weights one process trains on the same global
batches; the shared suite checks it.

The replacements are made only when the two functions have the expected signatures. Otherwise
(another Keras), ``fit``/``evaluate``/``predict`` under a multi-worker MWMS raise
:class:`~duotf.errors.ConfigError` before training, saying what to install. Set
``DUOTF_KERAS_FIX=0`` (e.g. ``duotf.run(..., env={"DUOTF_KERAS_FIX": "0"})``) to leave Keras
as it is; call :func:`enable_multi_worker_fit` to apply the fix outside a duotf node.

``ReportCallback(ctx, every="epoch")`` sends ``fit``'s logs to the driver with ``ctx.report``
(``cluster.metrics``, ``cluster.on_report``, the progress bar); it is made on first use, so that
importing this module imports no Keras.
"""

from __future__ import annotations

import importlib.abc
import inspect
import logging
import os
import sys
from typing import TYPE_CHECKING, Any, Dict, Literal, Optional, Union

from duotf._names import lazy as _lazy
from duotf.errors import ConfigError

if TYPE_CHECKING:  # Keras is imported where a callback class is made
    import keras

    from duotf.context import NodeContext

# ReportCallback too, made on first use (module __getattr__): its base class is Keras's
__all__ = ["enable_multi_worker_fit", "ENV_VAR", "TESTED_KERAS"]

logger = logging.getLogger(__name__)

ENV_VAR = "DUOTF_KERAS_FIX"
"""The environment variable that turns the multi-worker fit fix off (``0``) in the nodes."""
TESTED_KERAS = "3.15"
"""The Keras minor version the fix is tested with; on another within the supported range it is
applied with a warning."""
_TRAINER = "keras.src.backend.tensorflow.trainer"
_MARK = "__duotf_multi_worker_fix__"


def _disabled() -> bool:
    return os.environ.get(ENV_VAR, "1").strip().lower() in ("0", "false", "no", "off")


def _params(fn) -> Optional[list]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


def _problems(trainer) -> list:
    """What this Keras lacks for the fix (empty: it can be applied)."""
    problems = []
    cls = getattr(trainer, "TensorFlowTrainer", None)
    if cls is None:
        return ["TensorFlowTrainer"]
    if _params(getattr(cls, "_maybe_symbolic_build", None)) != ["self", "iterator", "data_batch"]:
        problems.append("TensorFlowTrainer._maybe_symbolic_build(self, iterator, data_batch)")
    if not callable(getattr(cls, "_symbolic_build", None)):
        problems.append("Trainer._symbolic_build")
    if _params(getattr(trainer, "reduce_per_replica", None)) != ["values", "strategy", "reduction"]:
        problems.append("reduce_per_replica(values, strategy, reduction)")
    if not callable(getattr(trainer, "_collective_all_reduce_multi_worker", None)):
        problems.append("_collective_all_reduce_multi_worker(strategy)")
    return problems


def _unsupported_message(problems: list) -> str:
    try:
        import keras

        version = keras.version()
    except Exception:  # noqa: BLE001 - only for the message
        version = "?"
    return (
        f"Keras {version} cannot run fit/evaluate/predict under MultiWorkerMirroredStrategy, and "
        f"duotf cannot fix it: its fix needs {', '.join(problems)} in {_TRAINER}, which this "
        f"Keras does not have. Install a Keras duotf was tested with "
        f"(pip install 'keras=={TESTED_KERAS}.*'), or use Keras 2 instead: pip install tf-keras "
        f"(it needs the 'tensorflow' package, not 'tensorflow-cpu') and "
        f"duotf.run(..., env={{'TF_USE_LEGACY_KERAS': '1'}}). To keep Keras as it is, set "
        f"{ENV_VAR}=0."
    )


def _is_multi_worker(strategy) -> bool:
    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return False
    in_mode = getattr(strategy.extended, "_in_multi_worker_mode", None)
    return bool(in_mode()) if callable(in_mode) else True


def _install_guard(trainer, problems: list) -> bool:
    """Make fit/evaluate/predict raise ConfigError under a multi-worker MWMS (before any step)."""
    cls = getattr(trainer, "TensorFlowTrainer", None)
    if cls is None:
        logger.warning("duotf cannot fix or guard Keras multi-worker training: %s",
                       _unsupported_message(problems))
        return False
    message = _unsupported_message(problems)
    for name in ("fit", "evaluate", "predict"):
        original = getattr(cls, name, None)
        if original is None or getattr(original, _MARK, False):
            continue

        def guarded(self, *args, _original=original, **kwargs):
            if _is_multi_worker(getattr(self, "distribute_strategy", None)):
                raise ConfigError(message, problems=list(problems))
            return _original(self, *args, **kwargs)

        guarded.__name__, guarded.__doc__ = original.__name__, original.__doc__
        setattr(guarded, _MARK, True)
        setattr(cls, name, guarded)
    return True


def _local_first(strategy, batch):
    """``batch`` with every distributed value replaced by its first local replica's part."""
    import tensorflow as tf
    from keras.src import tree

    return tree.map_structure(
        lambda v: strategy.experimental_local_results(v)[0]
        if isinstance(v, tf.distribute.DistributedValues) else v, batch)


def _spec_batch(iterator):
    """The dataset's element_spec, each replica spec taken by its first replica's, when every
    leaf is a TensorSpec (shapes and dtypes are all the build needs); else None."""
    import tensorflow as tf

    dataset = getattr(iterator, "_distributed_dataset", None)
    spec = getattr(dataset, "element_spec", None)
    if spec is None:
        return None

    def first(s):  # a PerReplicaSpec holds one spec per local replica
        values = getattr(s, "_value_specs", None)
        return values[0] if values else s

    spec = tf.nest.map_structure(first, spec)
    leaves = tf.nest.flatten(spec)
    if not leaves or not all(type(s) is tf.TensorSpec for s in leaves):
        return None
    return spec


def _patch(trainer) -> None:
    cls = trainer.TensorFlowTrainer
    build = cls._maybe_symbolic_build
    reduce_per_replica = trainer.reduce_per_replica
    multi_worker = trainer._collective_all_reduce_multi_worker

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = self._distribute_strategy
        if iterator is not None and strategy is not None:
            # Shapes and dtypes are all the build needs: take them from the spec rather than a
            # batch, so no iterator is opened (and dropped, with the rows it read ahead).
            spec = _spec_batch(iterator)
            if spec is not None:
                data_batch, iterator = spec, None
            elif multi_worker(strategy):
                for _, _, it in iterator:
                    data_batch = _local_first(strategy, next(it))
                    break
                iterator = None
        return build(self, iterator=iterator, data_batch=data_batch)

    def reduce_per_replica_fixed(values, strategy, reduction):
        # under MultiWorkerMirroredStrategy "auto" is "mean" (it is "first" only on TPUs)
        if reduction in ("auto", "mean") and multi_worker(strategy):
            from keras.src import tree

            return tree.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), values)
        return reduce_per_replica(values, strategy, reduction)

    for fn, original in ((_maybe_symbolic_build, build),
                         (reduce_per_replica_fixed, reduce_per_replica)):
        fn.__doc__ = original.__doc__
        setattr(fn, _MARK, True)
    cls._maybe_symbolic_build = _maybe_symbolic_build
    trainer.reduce_per_replica = reduce_per_replica_fixed
    _patch_predict(cls, multi_worker)


def _patch_predict(cls, multi_worker) -> None:
    """``predict`` of an inference feed's dataset under a multi-worker strategy: this worker's
    rows alone, in their order, as one process predicts them.

    Keras's ``predict`` under MultiWorkerMirroredStrategy is a collective: each step's
    predictions are gathered from every worker (``reduce_per_replica(..., "concat")`` ->
    ``strategy.gather``), so every worker gets every worker's rows, interleaved step by step,
    and every worker must take as many steps and call ``predict`` as often as the others. An
    inference feed gives each worker its own partitions (partition i to worker i mod n, of any
    size) and its results must be this worker's rows: the dataset (marked by the feed) is
    predicted with the model's variables as they are on this worker (the same on every worker:
    mirrored), without the strategy, and with no collective."""
    from duotf._transport.datafeed import INFERENCE_DATASET

    predict = cls.predict
    if getattr(predict, _MARK, False):
        return

    def predict_fixed(self, x=None, *args, **kwargs):
        strategy = self._distribute_strategy
        if not (getattr(x, INFERENCE_DATASET, False) and strategy is not None
                and multi_worker(strategy)):
            return predict(self, x, *args, **kwargs)
        distributed = self.predict_function
        self._distribute_strategy = None  # the default strategy: this process alone
        self.predict_function = getattr(self, "_duotf_local_predict", None)
        try:
            return predict(self, x, *args, **kwargs)
        finally:
            self._duotf_local_predict = self.predict_function  # traced once, kept apart
            self.predict_function = distributed
            self._distribute_strategy = strategy

    predict_fixed.__name__, predict_fixed.__doc__ = predict.__name__, predict.__doc__
    setattr(predict_fixed, _MARK, True)
    cls.predict = predict_fixed


def _apply(trainer) -> list:
    """Fix ``trainer`` (the imported module) or guard it; returns what was missing."""
    if getattr(getattr(trainer, "reduce_per_replica", None), _MARK, False):
        return []
    problems = _problems(trainer)
    if problems:
        _install_guard(trainer, problems)
        logger.info("Keras multi-worker fix not applied (missing %s); fit under "
                    "MultiWorkerMirroredStrategy raises ConfigError", ", ".join(problems))
        return problems
    _patch(trainer)
    logger.debug("Keras multi-worker fix applied to %s", _TRAINER)
    return []


def enable_multi_worker_fit() -> None:
    """Fix Keras 3 ``fit``/``evaluate``/``predict`` under ``MultiWorkerMirroredStrategy`` now.

    duotf does it by itself in every node process; call this in a process duotf did not start.
    Does nothing when Keras's backend is not TensorFlow or Keras is Keras 2 (tf-keras, which
    needs no fix).

    Raises
    ------
    ConfigError
        This Keras lacks the internals the fix replaces; the message says what to install.
    """
    import keras

    if not str(keras.version()).startswith("3.") or keras.backend.backend() != "tensorflow":
        return
    trainer = importlib.import_module(_TRAINER)
    problems = _apply(trainer)
    if problems:
        raise ConfigError(_unsupported_message(problems), problems=problems)


class _ApplyOnImport(importlib.abc.MetaPathFinder):
    """Fires once, when Keras imports its TensorFlow trainer, and fixes it right after."""

    def find_spec(self, name, path=None, target=None):
        if name != _TRAINER:
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _FixingLoader(spec.loader)
        return spec


class _FixingLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):  # get_source (tracebacks), get_filename, ...
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:
            _apply(module)
        except Exception:  # never break the user's import of Keras
            logger.warning("duotf could not apply its Keras multi-worker fix", exc_info=True)


def install() -> bool:
    """In a node process, before ``main``: fix Keras when (if ever) it is imported.

    Returns False when switched off by ``DUOTF_KERAS_FIX=0``."""
    if _disabled():
        return False
    trainer = sys.modules.get(_TRAINER)
    if trainer is not None:
        _apply(trainer)
    elif not any(isinstance(f, _ApplyOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _ApplyOnImport())
    return True


# -- reporting fit's logs to the driver ------------------------------------------------------------
_REPORT_CALLBACK = None


def _report_callback_class():
    """``ReportCallback``, made on first use: its base class is Keras's, and ``import
    duotf.keras`` imports no Keras."""
    global _REPORT_CALLBACK
    if _REPORT_CALLBACK is not None:
        return _REPORT_CALLBACK
    import keras

    class ReportCallback(keras.callbacks.Callback):
        """Send ``fit``'s logs to the driver with ``ctx.report``: ``cluster.metrics``,
        ``cluster.on_report`` and the progress bar get them.

        Parameters
        ----------
        ctx:
            The node's :class:`~duotf.NodeContext` (``main``'s second argument).
        every:
            ``"epoch"`` (default): each epoch's logs (``loss``, metrics, ``val_*``) at
            ``step=epoch`` (Keras's 0-based epoch, as ``history`` and TensorBoard count);
            ``"batch"``: each training batch's logs at ``step=`` the batches trained so far
            (1, 2, ...); a whole number ``n``: every ``n``-th batch's. Batch reports are
            subject to the node's report rate (50/s; the rest is dropped and counted).
        """

        def __init__(self, ctx: NodeContext, every: Union[Literal["epoch", "batch"], int] = "epoch"):
            super().__init__()
            if every == "epoch":
                self._batches = 0
            elif every == "batch":
                self._batches = 1
            elif isinstance(every, int) and not isinstance(every, bool) and every >= 1:
                self._batches = every
            else:
                raise ConfigError(f"ReportCallback(every={every!r}): give 'epoch', 'batch' or a "
                                  "whole number of batches (1 or more)")
            if not callable(getattr(ctx, "report", None)):
                raise ConfigError("ReportCallback(ctx): pass the node's context, main's second "
                                  f"argument; got {type(ctx).__name__}")
            self.ctx = ctx
            self.every = every
            self._seen = 0

        def _send(self, step: int, logs) -> None:
            values = {}
            for name, value in (logs or {}).items():
                try:
                    values[str(name)] = float(value)
                except (TypeError, ValueError):
                    continue  # not a number (a learning-rate schedule object, ...): skipped
            if values:
                self.ctx.report(step=step, **values)

        def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
            if not self._batches:
                self._send(epoch, logs)

        def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
            if self._batches:
                self._seen += 1
                if self._seen % self._batches == 0:
                    self._send(self._seen, logs)

    _REPORT_CALLBACK = ReportCallback
    return ReportCallback


# -- checkpoints that restarts resume from ----------------------------------------------------------
_CHECKPOINT_CALLBACK = None


def _checkpoint_callback_class():
    """``CheckpointCallback``, made on first use (as ``ReportCallback``)."""
    global _CHECKPOINT_CALLBACK
    if _CHECKPOINT_CALLBACK is not None:
        return _CHECKPOINT_CALLBACK
    import keras

    class CheckpointCallback(keras.callbacks.Callback):
        """Save the model's weights after every epoch into ``ctx.checkpoint_dir`` and report
        them (``ctx.report_checkpoint``), so that ``duotf.run(..., max_restarts=N)`` resumes
        after the last epoch saved; :meth:`restore` loads them into a restarted node's model.

        ``fit(ds, epochs=n, initial_epoch=ctx.resume_epoch, callbacks=[CheckpointCallback(ctx)])``
        after ``CheckpointCallback.restore(model, ctx)``: the restarted ``fit`` goes on at the
        epoch the feed resumes at. The chief (``worker:0`` without one) writes, as under
        ``MultiWorkerMirroredStrategy`` every worker holds the same weights; ``keep`` files
        are kept (at least 2: the driver may learn of the newest only after a failure).
        """

        def __init__(self, ctx: NodeContext, keep: int = 2):
            super().__init__()
            if isinstance(keep, bool) or not isinstance(keep, int) or keep < 2:
                raise ConfigError(f"CheckpointCallback(keep={keep!r}): keep 2 or more")
            self.ctx = ctx
            self.keep = keep

        @staticmethod
        def path(ctx: NodeContext, epoch: int) -> str:
            """Where the weights after ``epoch`` epochs are saved."""
            import os

            return os.path.join(ctx.checkpoint_dir, f"epoch-{epoch}.weights.h5")

        @staticmethod
        def restore(model: keras.Model, ctx: NodeContext) -> bool:
            """Load ``ctx.latest_checkpoint()`` into ``model`` (built first); False when there
            is none (the first attempt)."""
            path = ctx.latest_checkpoint()
            if not path:
                return False
            model.load_weights(path)
            return True

        def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
            if not self.ctx.is_chief:
                return
            import os

            done = epoch + 1  # Keras counts from 0; a checkpoint names the epochs done
            path = self.path(self.ctx, done)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self.model.save_weights(path)
            self.ctx.report_checkpoint(done, path)
            old = self.path(self.ctx, done - self.keep)
            if done > self.keep and os.path.exists(old):
                os.remove(old)

    _CHECKPOINT_CALLBACK = CheckpointCallback
    return CheckpointCallback


__getattr__, __dir__ = _lazy(__name__, {"ReportCallback": _report_callback_class,
                                       "CheckpointCallback": _checkpoint_callback_class})
