"""The engine-neutral half of duotf's ML stages: what :class:`duotf.spark.TFEstimator` and
:class:`duotf.dask.TFEstimator` share.

Both twins take the same parameters (:data:`FIT_PARAMS`; the Dask twin spells them in snake_case
and translates them at its boundary), check them here into a
:class:`FitConfig`, and fit with :func:`fit`: one duotf cluster over the engine's data, either
the node program duotf writes for a Keras model (:func:`keras_main`: ``modelFn()`` built in a
``MultiWorkerMirroredStrategy`` scope, ``fit`` on the engine feed, the chief saves
``model.keras``) or the user's own ``trainFn(args, ctx)`` (TensorFlowOnSpark's style). Every
fit writes into a fresh folder of ``modelDir``, so the fits of a ``CrossValidator`` never
overwrite each other's models; a fit given a ``runId`` writes into ``modelDir/<runId>``, and
resumes from the checkpoint it finds there (:mod:`duotf._ml.resume`). A fit called inside an
active MLflow run logs to it from the chief (:mod:`duotf._ml.tracking`).

Fits that run at once in one process (``CrossValidator(parallelism=k)``) need their task slots
together: :func:`fit` books them in a per-engine ledger (:func:`book_slots`) before its cluster
starts. A fit whose slots other fits of this process hold waits in line for them (first come,
first served) and starts as soon as enough are free; so ``parallelism`` larger than the engine
has room for runs the fits as the slots allow, instead of a second cluster's nodes waiting
inside the engine for slots that the first one holds. A fit that needs more slots than the
engine has in all fails at once with :class:`~duotf.errors.InsufficientSlotsError`, and so does
a wait in which no slot is freed for ``reservation_timeout`` (the time ``duotf.run`` gives nodes
to be placed; env ``DUOTF_RESERVATION_TIMEOUT``, default 120 s): its error names the fits
holding the slots and for how long.

The fits of one ``fitMultiple`` call (a ``CrossValidator`` fold, a ``TrainValidationSplit``)
form a :class:`FitGroup`: when one fails, the others that have not started do not start, the
ones waiting for slots stop waiting, the running ones' clusters are shut down, and the error
reaches the caller once nothing of the group runs.

Why not :func:`duotf.run_parallel`: it starts independent ``main``s, each a ``duotf.run`` and a
``wait``, from a thread pool of its own, returns every outcome at the end, and lets the other
runs go on when one fails. A fit feeds a DataFrame between start and wait (``cluster.train``),
and under ``CrossValidator`` the thread pool is pyspark's (it calls ``fitMultiple``'s
``next()`` and wants each model as it is done), with the opposite policy on failure (the first
error ends the group). So the fits share run_parallel's ideas instead of its code: admission by
slots (run_parallel sizes its pool by ``slots() // nodes``; here the ledger makes the extra
fits wait), and stopping what runs with ``shutdown(grace_secs=0)`` while refusing to start
more, as run_parallel does when interrupted.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import tempfile
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple, Union, cast

from duotf._ml import resume, tracking
from duotf._ml.fitdir import EXPORT_DIR, MODEL_FILE, saved_model_path
from duotf._ml.keras_node import keras_main
from duotf._node.job import check_sendable
from duotf.errors import ConfigError, InsufficientSlotsError

if TYPE_CHECKING:
    from duotf.context import NodeContext

logger = logging.getLogger(__name__)

__all__ = ["FitConfig", "FitResult", "FitGroup", "FIT_PARAMS", "fit", "keras_main", "book_slots",
           "running_fits", "MODEL_FILE", "EXPORT_DIR", "ColumnNames", "ModelFn", "TrainFn", "Callbacks",
           "VALIDATION_MAX_ROWS", "VALIDATION_MAX_BYTES", "VALIDATION_FLAG", "validation_rows",
           "check_validation_data"]

#: ``featuresCol`` / ``labelCol``: a column name, or a list of them (one per model input / output)
ColumnNames = Union[str, Sequence[str]]
#: ``modelFn``: a function of no arguments returning a compiled Keras model
ModelFn = Callable[[], Any]
#: ``trainFn``: the node program, ``trainFn(args, ctx)``
TrainFn = Callable[[Dict[str, Any], "NodeContext"], Any]
#: ``callbacks``: Keras callbacks, or a function of no arguments returning them
Callbacks = Union[Sequence[Any], Callable[[], Sequence[Any]]]


#: the most validation rows (``validationIndicatorCol`` / ``validationFraction``) a fit takes:
#: they are collected to the driver and shipped with the job to every worker
VALIDATION_MAX_ROWS = 200_000
#: the most bytes those rows may hold, as arrays on the driver
VALIDATION_MAX_BYTES = 64 << 20
#: the column of the split that ``validationFraction`` makes (True: a validation row)
VALIDATION_FLAG = "__duotf_validation"
#: the fraction's hash is cut in this many buckets
_HASH_BUCKETS = 1 << 24

#: the parameters both twins take, with their defaults (``featuresCol``, ``labelCol``: a name or
#: a list, one per model input / output)
FIT_PARAMS: Dict[str, Any] = {
    "modelFn": None, "trainFn": None, "trainArgs": None,
    "featuresCol": "features", "labelCol": "label",
    "numWorkers": 1, "numPs": 0, "epochs": 1, "batchSize": 32,
    "modelDir": None, "env": None, "seed": None, "verbose": 0,
    "validationIndicatorCol": None, "validationFraction": 0.0, "weightCol": None,
    "callbacks": None, "shuffle": False, "runId": None, "mlflowLogging": True,
}


def _positive(name: str, value, zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if zero else 1):
        raise ConfigError(f"{name}={value!r}: give a whole number, {0 if zero else 1} or more",
                          param=name)
    return value


def feature_names(value) -> Tuple[str, ...]:
    """``featuresCol`` as a tuple of column names (a name, or a list of them)."""
    names = (value,) if isinstance(value, str) else tuple(value) if isinstance(value, (list, tuple)) else None
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(f"featuresCol={value!r}: give a column name, or a list of column names "
                          "(one per model input)", param="featuresCol")
    return names


def label_names(value) -> Tuple[str, ...]:
    """``labelCol`` as a tuple of column names (a name, a list of them: one per model output,
    or None: no label)."""
    if value is None:
        return ()
    names = (value,) if isinstance(value, str) else tuple(value) if isinstance(value, (list, tuple)) else None
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(f"labelCol={value!r}: give a column name, or a list of column names (one "
                          "per model output); None: no label, trainFn only", param="labelCol")
    return names


@dataclasses.dataclass(frozen=True)
class FitConfig:
    """The checked parameters of one fit (see :data:`FIT_PARAMS`)."""

    modelFn: Optional[Callable] = None
    trainFn: Optional[Callable] = None
    trainArgs: Any = None
    featuresCol: Any = "features"
    labelCol: Any = "label"
    numWorkers: int = 1
    numPs: int = 0
    epochs: int = 1
    batchSize: int = 32
    modelDir: Optional[str] = None
    env: Optional[Dict[str, str]] = None
    seed: Optional[int] = None
    verbose: int = 0
    validationIndicatorCol: Optional[str] = None
    validationFraction: float = 0.0
    weightCol: Optional[str] = None
    callbacks: Any = None
    shuffle: bool = False
    runId: Optional[str] = None
    mlflowLogging: bool = True

    @classmethod
    def from_params(cls, params: Dict[str, Any]) -> "FitConfig":
        """Check ``params`` (names as :data:`FIT_PARAMS`); a bad one is a ConfigError naming it."""
        unknown = set(params) - set(FIT_PARAMS)
        if unknown:
            raise ConfigError(f"unknown parameter(s) {sorted(unknown)}: the parameters are "
                              f"{sorted(FIT_PARAMS)}", params=sorted(unknown))
        p = dict(FIT_PARAMS, **params)
        if (p["modelFn"] is None) == (p["trainFn"] is None):
            raise ConfigError("give exactly one of modelFn (a function of no arguments returning a "
                              "compiled Keras model: duotf writes the training program) and "
                              "trainFn (your node program, trainFn(args, ctx))", param="modelFn")
        for name in ("modelFn", "trainFn"):
            if p[name] is not None and not callable(p[name]):
                raise ConfigError(f"{name}={p[name]!r} is not callable", param=name)
        feature_names(p["featuresCol"])
        labels = label_names(p["labelCol"])
        if p["labelCol"] is None and p["modelFn"] is not None:
            raise ConfigError("labelCol=None: a modelFn model is fit on (features, label); give "
                              "the label column", param="labelCol")
        both = [n for n in labels if n in feature_names(p["featuresCol"])]
        if both:
            raise ConfigError(f"column {both[0]!r} is both in featuresCol and labelCol",
                              param="labelCol")
        if len(set(labels)) != len(labels):
            raise ConfigError(f"labelCol={p['labelCol']!r} names a column twice", param="labelCol")
        for name in ("numWorkers", "epochs", "batchSize"):
            _positive(name, p[name])
        _positive("numPs", p["numPs"], zero=True)
        _positive("verbose", p["verbose"], zero=True)
        if p["numPs"] and p["modelFn"] is not None:
            raise ConfigError(f"numPs={p['numPs']}: a modelFn model trains with "
                              "MultiWorkerMirroredStrategy, which has no parameter servers; set "
                              "numPs=0, or write a trainFn for ParameterServerStrategy",
                              param="numPs")
        if p["modelFn"] is not None and p["batchSize"] % p["numWorkers"]:
            raise ConfigError(f"batchSize={p['batchSize']} is the global batch, split evenly "
                              f"between numWorkers={p['numWorkers']}: give a multiple of "
                              f"{p['numWorkers']}", param="batchSize")
        if p["seed"] is not None:
            _positive("seed", p["seed"], zero=True)
        if p["env"] is not None and not (isinstance(p["env"], dict) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in p["env"].items())):
            raise ConfigError(f"env={p['env']!r}: give a dict of str to str", param="env")
        if p["modelDir"] is not None and (not isinstance(p["modelDir"], str) or not p["modelDir"]):
            raise ConfigError(f"modelDir={p['modelDir']!r}: give a folder path or URL", param="modelDir")
        if p["shuffle"] not in (True, False):
            raise ConfigError(f"shuffle={p['shuffle']!r}: give True or False", param="shuffle")
        _check_validation_and_weights(p, feature_names(p["featuresCol"]) + labels)
        resume.check_run_id(p["runId"], p["modelDir"])
        if not isinstance(p["mlflowLogging"], bool):
            raise ConfigError(f"mlflowLogging={p['mlflowLogging']!r}: give True (the chief logs "
                              "to the active MLflow run, if any) or False", param="mlflowLogging")
        return cls(**p)

    @property
    def features(self) -> Tuple[str, ...]:
        return feature_names(self.featuresCol)

    @property
    def labels(self) -> Tuple[str, ...]:
        return label_names(self.labelCol)

    @property
    def columns(self) -> List[str]:
        """The columns the nodes are fed: the features, the labels, then the weight."""
        return list(self.features) + list(self.labels) + ([self.weightCol] if self.weightCol else [])

    @property
    def validating(self) -> bool:
        """Whether the fit holds rows out for validation."""
        return self.validationIndicatorCol is not None or self.validationFraction > 0

    @property
    def split_column(self) -> Optional[str]:
        """The boolean column that marks the validation rows: ``validationIndicatorCol``, or
        :data:`VALIDATION_FLAG` (``validationFraction``'s split); None without validation."""
        if self.validationIndicatorCol is not None:
            return self.validationIndicatorCol
        return VALIDATION_FLAG if self.validationFraction > 0 else None

    @property
    def split_seed(self) -> int:
        """The seed of ``validationFraction``'s hash: ``seed``, else 0."""
        return self.seed if self.seed is not None else 0

    @property
    def hash_threshold(self) -> int:
        """A row whose hash, modulo ``2**24``, is below this is a validation row."""
        return int(round(self.validationFraction * _HASH_BUCKETS))

    @property
    def nodes(self) -> int:
        return self.numWorkers + self.numPs


def _check_validation_and_weights(p: Dict[str, Any], fed: Tuple[str, ...]) -> None:
    """``validationIndicatorCol``, ``validationFraction``, ``weightCol`` and ``callbacks``."""
    for name in ("validationIndicatorCol", "weightCol"):
        value = p[name]
        if value is not None and (not isinstance(value, str) or not value):
            raise ConfigError(f"{name}={value!r}: give a column name, or None", param=name)
        if value is not None and value in fed:
            raise ConfigError(f"{name}={value!r} is also in featuresCol or labelCol: give a "
                              "column of its own", param=name, column=value)
    if p["weightCol"] is not None and p["weightCol"] == p["validationIndicatorCol"]:
        raise ConfigError(f"weightCol and validationIndicatorCol are both {p['weightCol']!r}: "
                          "give each a column of its own", param="weightCol")
    fraction = p["validationFraction"]
    if (isinstance(fraction, bool) or not isinstance(fraction, (int, float))
            or not 0 <= fraction < 1):
        raise ConfigError(f"validationFraction={fraction!r}: give a number from 0 (no validation "
                          "rows) up to, not including, 1", param="validationFraction")
    if fraction and p["validationIndicatorCol"] is not None:
        raise ConfigError(f"validationFraction={fraction!r} and validationIndicatorCol="
                          f"{p['validationIndicatorCol']!r}: give one of them, not both",
                          param="validationFraction")
    callbacks = p["callbacks"]
    if callbacks is not None and not callable(callbacks) and not isinstance(callbacks, (list, tuple)):
        raise ConfigError(f"callbacks={callbacks!r}: give a list of Keras callbacks, or a "
                          "function of no arguments returning one", param="callbacks")
    check_sendable(callbacks, "callbacks", "Give callbacks a function of no arguments that builds "
                   "them (callbacks=lambda: [MyCallback(...)]): each node makes its own", param="callbacks")


def validation_rows(config: "FitConfig", rows: int, total: int) -> None:
    """Check the split before the validation rows are collected: ``rows`` of the ``total``
    are validation rows; the others must leave every worker rows, and they must be at most
    :data:`VALIDATION_MAX_ROWS` (a ConfigError names the parameter otherwise)."""
    param = ("validationIndicatorCol" if config.validationIndicatorCol is not None
             else "validationFraction")
    what = (f"validationIndicatorCol={config.validationIndicatorCol!r}"
            if config.validationIndicatorCol is not None
            else f"validationFraction={config.validationFraction!r}")
    if not rows:
        raise ConfigError(f"{what} holds out none of the {total} rows: give a column with True "
                          "rows, or a larger fraction", param=param, column=config.split_column,
                          rows=0)
    if total - rows < config.numWorkers:
        raise ConfigError(f"{what} leaves {total - rows} of the {total} rows to train on, fewer "
                          f"than numWorkers={config.numWorkers}: every worker needs rows",
                          param=param, column=config.split_column, rows=total - rows)
    if rows > VALIDATION_MAX_ROWS:
        raise ConfigError(f"{what} holds out {rows} rows; a fit takes at most "
                          f"{VALIDATION_MAX_ROWS} validation rows (they are collected to the "
                          "driver and shipped to every worker): hold out fewer, or validate in "
                          "a trainFn of your own", param=param, column=config.split_column, rows=rows)


def check_validation_data(config: "FitConfig", data: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The collected validation columns, checked against :data:`VALIDATION_MAX_BYTES`."""
    if data is None:
        return None
    size = sum(getattr(v, "nbytes", 0) for v in data.values())
    if size > VALIDATION_MAX_BYTES:
        param = ("validationIndicatorCol" if config.validationIndicatorCol is not None
                 else "validationFraction")
        raise ConfigError(f"the validation rows ({param}) hold {size / 2**20:.1f} MiB; a fit takes "
                          f"at most {VALIDATION_MAX_BYTES / 2**20:.0f} MiB of them (they are "
                          "shipped to every worker): hold out fewer rows, or validate in a "
                          "trainFn of your own", param=param, bytes=size)
    return data


@dataclasses.dataclass
class FitResult:
    """What one fit produced: the saved model's path, the chief's training history (Keras's
    ``history.history``: ``{metric: [value per epoch]}``; a ``trainFn``'s return value when it
    is a dict), every node's return value, how long the fit took, and the epoch it started at
    (a resumed ``runId``: the epochs its checkpoint had done)."""

    modelPath: str
    history: Dict[str, List[float]]
    results: List[Any]
    seconds: float
    initialEpoch: int = 0


# -- slots held by the fits running in this process ---------------------------------------------------
# One condition guards the ledger: a fit that waits for slots waits on it, and whatever may let
# a waiter go (a booking's end, a waiter leaving the line, a fit group failing) wakes them all.
_ledger_cond = threading.Condition()
_ledger: Dict[int, "_EngineSlots"] = {}  # id(engine handle) -> its slots


class _EngineSlots:
    """One engine's entry in the ledger: the bookings that hold its slots, and the fits waiting
    in line for theirs (first come, first served)."""

    def __init__(self):
        self.held = 0
        self.bookings: List["_Booking"] = []
        self.line: Deque[object] = collections.deque()
        self.freed = time.monotonic()  # when slots were freed last

    def book(self, key: int, need: int, what: str, total: int) -> "_Booking":
        booking = _Booking(key, need, what)
        self.held += need
        self.bookings.append(booking)
        logger.info("TFEstimator: %d slot(s) booked (%s): %d of %d held by %d fit(s)", need, what,
                    self.held, total, len(self.bookings))
        return booking

    def holders(self, now: float) -> str:
        return "; ".join(f"{b.slots} by a fit of {b.what}, for {now - b.since:.0f} s"
                         for b in self.bookings)


def _forget_if_idle(key: int) -> None:
    entry = _ledger.get(key)
    if entry is not None and not entry.bookings and not entry.line:
        del _ledger[key]


class _Booking:
    """The slots one fit holds, freed when its ``with`` block ends."""

    def __init__(self, key: int, slots: int, what: str):
        self.key, self.slots, self.what = key, slots, what
        self.since = time.monotonic()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        with _ledger_cond:
            entry = _ledger[self.key]
            entry.bookings.remove(self)
            entry.held -= self.slots
            entry.freed = time.monotonic()
            logger.info("TFEstimator: %d slot(s) freed after %.1f s: %d held by %d fit(s)",
                        self.slots, entry.freed - self.since, entry.held, len(entry.bookings))
            _forget_if_idle(self.key)
            _ledger_cond.notify_all()


def _wake_waiters() -> None:
    """Wake every fit waiting for slots, to look at its group again."""
    with _ledger_cond:
        _ledger_cond.notify_all()


def running_fits() -> int:
    """How many fits run now in this process (on every engine)."""
    with _ledger_cond:
        return sum(len(entry.bookings) for entry in _ledger.values())


def book_slots(key: int, backend, need: int, what: str, timeout: float = 0.0,
               check: Optional[Callable[[], None]] = None) -> _Booking:
    """Book ``need`` of the engine's slots for one fit, held for a ``with`` block.

    A fit that needs more slots than the engine has in all raises
    :class:`~duotf.errors.InsufficientSlotsError` at once. One whose slots other fits of this
    process hold waits in line for them (first come, first served: no fit takes slots that one
    ahead of it waits for), as long as some slot is freed every ``timeout`` seconds; past that
    it raises InsufficientSlotsError saying which fits hold the slots and since when
    (``timeout=0``: at once, without waiting). ``check`` is called whenever the fit wakes up
    and may raise to stop its wait (its fit group failed).
    """
    total = backend.slots()
    if need > total:
        raise InsufficientSlotsError(
            f"TFEstimator.fit needs {need} free slots ({what}) but {backend.name} has {total} in "
            f"all. {backend.capacity_hint()}", needed=need, available=total, backend=backend.name)
    with _ledger_cond:
        entry = _ledger.setdefault(key, _EngineSlots())
        if not entry.line and entry.held + need <= total:
            return entry.book(key, need, what, total)
        ticket = object()
        entry.line.append(ticket)
        start = time.monotonic()
        if timeout > 0:
            logger.info("TFEstimator: waiting for %d slot(s) (%s) on %s: %d of its %d are held "
                        "by %d other fit(s), %d fit(s) wait ahead", need, what, backend.name,
                        entry.held, total, len(entry.bookings), len(entry.line) - 1)
        try:
            while True:
                if check is not None:
                    check()
                if entry.line[0] is ticket and entry.held + need <= total:
                    logger.info("TFEstimator: waited %.1f s for %d slot(s)", time.monotonic() - start,
                                need)
                    return entry.book(key, need, what, total)
                now = time.monotonic()
                left = max(start, entry.freed) + timeout - now
                if left <= 0:
                    raise _no_slots(entry, backend, total, need, what, timeout, now - start)
                _ledger_cond.wait(left)
        finally:
            entry.line.remove(ticket)
            _forget_if_idle(key)
            _ledger_cond.notify_all()  # the next in line may go now


def _no_slots(entry: _EngineSlots, backend, total: int, need: int, what: str, timeout: float,
              waited: float) -> InsufficientSlotsError:
    """The error of a fit that did not get its slots (the ledger's lock is held)."""
    at_once = max(total // need, 1)
    held = (f"{entry.held} are held by {len(entry.bookings)} other fit(s) of this process (a "
            f"CrossValidator or TrainValidationSplit with parallelism > 1): "
            f"{entry.holders(time.monotonic())}")
    if len(entry.line) > 1:
        held += f"; {len(entry.line) - 1} other fit(s) wait for slots too"
    if timeout > 0:
        where = (f"TFEstimator.fit waited {waited:.0f} s for {need} free slots ({what}) on "
                 f"{backend.name}, which has {total} in all, and no slot was freed for "
                 f"{timeout:g} s (reservation_timeout, env DUOTF_RESERVATION_TIMEOUT): {held}")
        fix = (f"At most {at_once} such fit(s) run at once here: set parallelism={at_once}, or "
               "raise DUOTF_RESERVATION_TIMEOUT above the time one fit takes.")
    else:
        where = (f"TFEstimator.fit needs {need} free slots ({what}) but {backend.name} has "
                 f"{total} in all; {held}")
        fix = f"At most {at_once} such fit(s) can run at once here, so set parallelism={at_once}."
    return InsufficientSlotsError(f"{where}. {fix} {backend.capacity_hint()}", needed=need,
                                  available=total - entry.held, backend=backend.name,
                                  waited=round(waited, 3))


# -- fits that stand or fall together ---------------------------------------------------------------
class FitGroup:
    """The fits of one ``fitMultiple`` call (what a ``CrossValidator`` fold or a
    ``TrainValidationSplit`` runs from its thread pool): when one fails, the group fails with
    its error. A fit of the group that has not started does not start, one waiting for slots
    stops waiting, and the clusters of the fits running are shut down at once
    (``shutdown(grace_secs=0)``, as ``run_parallel`` stops its runs when interrupted).

    Each fit runs inside :meth:`member` and hands :func:`fit` the group; whoever saw a fit fail
    calls :meth:`fail`, then :meth:`settle` (which returns once no fit of the group runs and no
    cluster of it is being stopped), then :meth:`raise_error`. So the error reaches the caller
    only once nothing of the group runs any more.
    """

    def __init__(self):
        self._cond = threading.Condition()
        self._error: Optional[BaseException] = None
        self._traceback = None
        self._fits = 0  # members inside member()
        self._stopping = 0  # fail() calls stopping clusters now
        self._live: List[Any] = []  # the clusters of the group's running fits

    @property
    def failed(self) -> bool:
        with self._cond:
            return self._error is not None

    def check(self) -> None:
        """Raise the group's error if it failed."""
        with self._cond:
            error = self._error
        if error is not None:
            self.raise_error()

    def raise_error(self) -> None:
        """Raise the error of the fit that failed the group (its own traceback, wherever it is
        raised again)."""
        with self._cond:
            error, tb = self._error, self._traceback
        assert error is not None
        raise error.with_traceback(tb)

    @contextlib.contextmanager
    def member(self):
        """Count a fit of the group while it runs; refused (the group's error) after a failure."""
        with self._cond:
            if self._error is None:
                self._fits += 1
        self.check()
        try:
            yield self
        finally:
            with self._cond:
                self._fits -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def running(self, cluster):
        """Hold ``cluster`` (a running fit's) for :meth:`fail` to shut down; the group's error at
        once if it failed while the cluster started (the caller's ``with`` then shuts it down)."""
        with self._cond:
            if self._error is None:
                self._live.append(cluster)
        self.check()
        try:
            yield cluster
        finally:
            with self._cond:
                if cluster in self._live:
                    self._live.remove(cluster)

    def fail(self, error: BaseException) -> None:
        """Fail the group with ``error`` (the first failure wins): wake its fits that wait for
        slots and shut down its running clusters."""
        with self._cond:
            if self._error is None:
                self._error, self._traceback = error, error.__traceback__
                logger.info("TFEstimator: a fit failed (%s: %s); stopping the other fits of "
                            "its group", type(error).__name__, str(error))
            live, self._live = self._live, []
            self._stopping += 1
        try:
            _wake_waiters()
            for cluster in live:
                try:
                    cluster.shutdown(grace_secs=0)
                except Exception as exc:  # NodesStoppedError: it was stopped, as asked
                    logger.debug("TFEstimator: shutdown of %r: %s", cluster, exc)
        finally:
            with self._cond:
                self._stopping -= 1
                self._cond.notify_all()

    def settle(self) -> None:
        """Return once no fit of the group runs and none of its clusters is being stopped."""
        with self._cond:
            while self._fits or self._stopping:
                self._cond.wait()


# -- one fit ---------------------------------------------------------------------------------------
def new_fit_dir(model_dir: Optional[str]) -> str:
    """A fresh folder for one fit's model: under ``model_dir``, else under the temp folder
    (which only a cluster on this host can write and read)."""
    from duotf.io.files import filesystem

    root = model_dir if model_dir is not None else os.path.join(tempfile.gettempdir(), "duotf-models")
    name = f"fit-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
    fs, path = filesystem(root)
    folder = path.rstrip("/") + "/" + name
    fs.makedirs(folder, exist_ok=True)
    return root.rstrip("/") + "/" + name


def fit(config: FitConfig, backend, key: int, data, feed_slots: int,
        group: Optional[FitGroup] = None, validation: Optional[Dict[str, Any]] = None) -> FitResult:
    """Run one fit: book the slots, start the cluster on ``backend``, feed ``data`` (only the
    fit's columns) ``epochs`` times, wait, and find the saved model.

    ``key`` identifies the engine (fits on one engine share its slots); ``feed_slots`` is what
    feeding needs beside the nodes (Spark: 1; Dask nodes leave their worker's threads free: 0).
    Slots that other fits of this process hold are waited for (:func:`book_slots`, as long as
    some slot is freed every ``reservation_timeout``: env ``DUOTF_RESERVATION_TIMEOUT``, default
    120 s, the time duotf.run gives nodes to be placed and ready). ``group``: the
    :class:`FitGroup` the fit belongs to, which may stop it. ``validation``: the validation
    rows, ``{column: array}`` (the engine split and collected them), at most
    :data:`VALIDATION_MAX_BYTES`; the nodes get them as ``args["validationData"]``, and
    the MLflow run active in the calling thread, if any, as ``args["mlflow"]`` (:mod:`duotf._ml.tracking`).
    """
    from duotf._driver.api import check_run_arguments, run
    from duotf.spec import ClusterSpec

    t0 = time.monotonic()
    validation = check_validation_data(config, validation)
    state = resume.open_run(config, saved_model_path) if config.runId is not None else None
    if state is not None and state.finished:
        logger.info("TFEstimator: runId=%r finished before: its model, untrained", config.runId)
        return FitResult(cast(str, saved_model_path(state.folder)), state.history, [], 0.0, state.done)
    if config.modelFn is not None:
        main: Callable = keras_main
    else:
        main = cast(Callable, config.trainFn)  # the config checks one of the two is given
    spec, (reservation_timeout, _, _) = check_run_arguments(
        main, ClusterSpec(workers=config.numWorkers, ps=config.numPs))
    what = f"numWorkers={config.numWorkers}" + (f" + numPs={config.numPs}" if config.numPs else "")
    what += f" node tasks + {feed_slots} to feed them" if feed_slots else " node tasks"
    check = group.check if group is not None else None
    with book_slots(key, backend, config.nodes + feed_slots, what, reservation_timeout, check):
        if group is not None:
            group.check()
        fit_dir = new_fit_dir(config.modelDir) if state is None else state.folder
        first = state.done if state is not None and state.checkpoint is not None else 0
        args: Dict[str, Any] = {
            "features": config.features, "featuresCol": config.featuresCol,
            "labelCol": config.labelCol, "labels": config.labels, "epochs": config.epochs,
            "batchSize": config.batchSize,
            "seed": config.seed, "verbose": config.verbose, "modelDir": fit_dir,
            "modelPath": fit_dir + "/" + MODEL_FILE, "exportDir": fit_dir + "/" + EXPORT_DIR,
            "weightCol": config.weightCol, "validationData": validation,
            "callbacks": config.callbacks, "runId": config.runId,
            "resume": state.node_args() if state is not None else None,
            "runParams": resume.run_params(config), "runOwner": state.owner if state else None,
            tracking.ARG: tracking.fit_target(config, validation) if config.mlflowLogging else None,
        }
        if config.modelFn is not None:
            args["modelFn"] = config.modelFn
        else:
            args["args"] = config.trainArgs
        logger.info("TFEstimator: fitting on %s with %d node(s) into %s%s", backend.name,
                    config.nodes, fit_dir, f", resuming after epoch {first}" if first else "")
        with run(main, args, backend, spec, env=config.env,
                 reservation_timeout=reservation_timeout) as cluster:
            with group.running(cluster) if group is not None else contextlib.nullcontext():
                fed = cluster.train(data, epochs=config.epochs, initial_epoch=first,
                                    shuffle=config.shuffle,
                                    seed=config.seed if config.shuffle else None)
                results = cluster.wait()
    path = saved_model_path(fit_dir)
    if path is None:
        raise ConfigError(f"the fit saved no model: the chief must save it to args['modelPath'] "
                          f"({args['modelPath']}, a .keras file) or export a SavedModel to "
                          f"args['exportDir'] ({args['exportDir']})", path=fit_dir)
    chief = results[0] if results else None  # worker 0 is the chief
    history = {str(k): v for k, v in chief.items()} if isinstance(chief, dict) else {}
    if state is not None:
        resume.finish_run(config, fit_dir, history)
    seconds = time.monotonic() - t0
    logger.info("TFEstimator: fitted in %.1f s (%d epoch(s) fed); model at %s", seconds,
                fed["epochs"], path)
    return FitResult(path, history, results, seconds, first)


# -- copying a model (save/load of the fitted stages) ---------------------------------------------------
def copy_model(src: str, dst: str) -> None:
    """Copy a model file or SavedModel folder from ``src`` to ``dst`` (any fsspec URLs)."""
    from duotf.io.files import filesystem

    sfs, spath = filesystem(src)
    dfs, dpath = filesystem(dst)
    files = [spath] if not sfs.isdir(spath) else [p for p in sfs.find(spath)]
    for f in files:
        rel = f[len(spath):].lstrip("/")
        target = dpath if not rel else dpath.rstrip("/") + "/" + rel
        dfs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        with sfs.open(f, "rb") as r, dfs.open(target, "wb") as w:
            while True:
                block = r.read(8 << 20)
                if not block:
                    break
                w.write(block)
