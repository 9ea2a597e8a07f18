"""The engine-neutral half of duotf's ML stages: what :class:`duotf.spark.TFEstimator` and
:class:`duotf.dask.TFEstimator` share.

Both twins take the same parameters (:data:`FIT_PARAMS`), check them here into a
:class:`FitConfig`, and fit with :func:`fit`: one duotf cluster over the engine's data, either
the node program duotf writes for a Keras model (:func:`keras_main`: ``modelFn()`` built in a
``MultiWorkerMirroredStrategy`` scope, ``fit`` on the engine feed, the chief saves
``model.keras``) or the user's own ``trainFn(args, ctx)`` (TensorFlowOnSpark's style). Every
fit writes into a fresh folder of ``modelDir``, so the fits of a ``CrossValidator`` never
overwrite each other's models.

Fits that run at once in one process (``CrossValidator(parallelism=k)``) need their task slots
together: :func:`fit` books them in a per-engine ledger and raises
:class:`~duotf.errors.InsufficientSlotsError` at once when they are not free, instead of a
second cluster waiting for slots the first one holds.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

from .errors import ConfigError, InsufficientSlotsError

logger = logging.getLogger(__name__)

__all__ = ["FitConfig", "FitResult", "FIT_PARAMS", "fit", "keras_main", "running_fits", "MODEL_FILE",
           "EXPORT_DIR"]

#: the file the chief saves a ``modelFn`` model to, in the fit's folder
MODEL_FILE = "model.keras"
#: where a ``trainFn`` may export a SavedModel instead, in the fit's folder
EXPORT_DIR = "export"

#: the parameters both twins take, with their defaults (``featuresCol``, ``labelCol``: a name or
#: a list, one per model input / output)
FIT_PARAMS: Dict[str, Any] = {
    "modelFn": None, "trainFn": None, "trainArgs": None,
    "featuresCol": "features", "labelCol": "label",
    "numWorkers": 1, "numPs": 0, "epochs": 1, "batchSize": 32,
    "modelDir": None, "env": None, "seed": None, "verbose": 0,
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
        return cls(**p)

    @property
    def features(self) -> Tuple[str, ...]:
        return feature_names(self.featuresCol)

    @property
    def labels(self) -> Tuple[str, ...]:
        return label_names(self.labelCol)

    @property
    def columns(self) -> List[str]:
        """The columns the nodes are fed, features first, then the labels."""
        return list(self.features) + list(self.labels)

    @property
    def nodes(self) -> int:
        return self.numWorkers + self.numPs


@dataclasses.dataclass
class FitResult:
    """What one fit produced: the saved model's path, the chief's training history (Keras's
    ``history.history``: ``{metric: [value per epoch]}``; a ``trainFn``'s return value when it
    is a dict), every node's return value, and how long the fit took."""

    modelPath: str
    history: Dict[str, List[float]]
    results: List[Any]
    seconds: float


# -- the node program for a modelFn -----------------------------------------------------------------
def keras_main(args, ctx):
    """The node program duotf writes for ``modelFn``: the model built in a
    ``MultiWorkerMirroredStrategy`` scope, ``fit`` on this node's feed (one feed epoch per
    ``fit`` epoch, no ``steps_per_epoch``), the chief saves it; returns the history."""
    import tensorflow as tf

    import keras

    if args["seed"] is not None:
        keras.utils.set_random_seed(args["seed"])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    features = list(args["features"])
    labels = list(args.get("labels") or [args["labelCol"]])
    feed = ctx.get_data_feed(train=True)
    batches = feed.dataset(args["batchSize"], per_epoch=True)  # {column: batch}, an epoch an iteration
    with strategy.scope():
        model = args["modelFn"]()
        if not isinstance(model, keras.Model):
            raise ConfigError(f"modelFn returned {type(model).__name__}: return a keras.Model")
        if getattr(model, "optimizer", None) is None or not getattr(model, "compiled", True):
            raise ConfigError("modelFn returned a model that is not compiled: call "
                              "model.compile(optimizer, loss, metrics) before returning it")
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
        return x, y

    dataset = batches.map(xy)
    history = model.fit(dataset, epochs=args["epochs"], verbose=args["verbose"], shuffle=False)
    if ctx.is_chief:
        model.save(args["modelPath"])
    return {k: [float(v) for v in values] for k, values in history.history.items()}


# -- slots held by the fits running in this process ---------------------------------------------------
_ledger_lock = threading.Lock()
_ledger: Dict[int, Dict[str, int]] = {}  # id(engine handle) -> {"slots": held, "fits": n}


class _Booking:
    def __init__(self, key: int, slots: int):
        self.key, self.slots = key, slots

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        with _ledger_lock:
            entry = _ledger[self.key]
            entry["slots"] -= self.slots
            entry["fits"] -= 1
            if not entry["fits"]:
                del _ledger[self.key]


def running_fits() -> int:
    """How many fits run now in this process (on every engine)."""
    with _ledger_lock:
        return sum(entry["fits"] for entry in _ledger.values())


def book_slots(key: int, backend, need: int, what: str) -> _Booking:
    """Book ``need`` of the engine's slots for one fit, or raise InsufficientSlotsError at once
    when the fits already running in this process hold too many of them."""
    total = backend.slots()
    with _ledger_lock:
        entry = _ledger.setdefault(key, {"slots": 0, "fits": 0})
        held, fits = entry["slots"], entry["fits"]
        if held + need > total:
            if not entry["fits"]:
                del _ledger[key]
            at_once = total // need
            others = (f"; {held} are held by {fits} other fit(s) running in this process at the "
                      f"same time (a CrossValidator or TrainValidationSplit with parallelism > 1): "
                      f"at most {at_once} such fit(s) can run at once here, so set parallelism="
                      f"{max(at_once, 1)}" if fits else "")
            raise InsufficientSlotsError(
                f"TFEstimator.fit needs {need} free slots ({what}) but {backend.name} has "
                f"{total} in all{others}. {backend.capacity_hint()}",
                needed=need, available=total - held, backend=backend.name)
        entry["slots"] += need
        entry["fits"] += 1
    return _Booking(key, need)


# -- one fit ---------------------------------------------------------------------------------------
def new_fit_dir(model_dir: Optional[str]) -> str:
    """A fresh folder for one fit's model: under ``model_dir``, else under the temp folder
    (which only a cluster on this host can write and read)."""
    from .io.files import filesystem

    root = model_dir if model_dir is not None else os.path.join(tempfile.gettempdir(), "duotf-models")
    name = f"fit-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
    fs, path = filesystem(root)
    folder = path.rstrip("/") + "/" + name
    fs.makedirs(folder, exist_ok=True)
    return root.rstrip("/") + "/" + name


def saved_model_path(fit_dir: str) -> Optional[str]:
    """The model a fit left in ``fit_dir``: ``model.keras``, else ``export/`` (a SavedModel)."""
    from .io.files import filesystem

    fs, path = filesystem(fit_dir)
    if fs.exists(path.rstrip("/") + "/" + MODEL_FILE):
        return fit_dir.rstrip("/") + "/" + MODEL_FILE
    if fs.exists(path.rstrip("/") + "/" + EXPORT_DIR + "/saved_model.pb"):
        return fit_dir.rstrip("/") + "/" + EXPORT_DIR
    return None


def fit(config: FitConfig, backend, key: int, data, feed_slots: int) -> FitResult:
    """Run one fit: book the slots, start the cluster on ``backend``, feed ``data`` (only the
    fit's columns) ``epochs`` times, wait, and find the saved model.

    ``key`` identifies the engine (fits on one engine share its slots); ``feed_slots`` is what
    feeding needs beside the nodes (Spark: 1; Dask nodes leave their worker's threads free: 0).
    """
    from .api import run
    from .spec import ClusterSpec

    t0 = time.monotonic()
    what = f"numWorkers={config.numWorkers}" + (f" + numPs={config.numPs}" if config.numPs else "")
    what += f" node tasks + {feed_slots} to feed them" if feed_slots else " node tasks"
    with book_slots(key, backend, config.nodes + feed_slots, what):
        fit_dir = new_fit_dir(config.modelDir)
        args: Dict[str, Any] = {
            "features": config.features, "featuresCol": config.featuresCol,
            "labelCol": config.labelCol, "labels": config.labels, "epochs": config.epochs,
            "batchSize": config.batchSize,
            "seed": config.seed, "verbose": config.verbose, "modelDir": fit_dir,
            "modelPath": fit_dir + "/" + MODEL_FILE, "exportDir": fit_dir + "/" + EXPORT_DIR,
        }
        if config.modelFn is not None:
            main, args["modelFn"] = keras_main, config.modelFn
        else:
            main, args["args"] = config.trainFn, config.trainArgs
        spec = ClusterSpec(workers=config.numWorkers, ps=config.numPs)
        logger.info("TFEstimator: fitting on %s with %d node(s) into %s", backend.name,
                    config.nodes, fit_dir)
        with run(main, args, backend, spec, env=config.env) as cluster:
            cluster.train(data, epochs=config.epochs)
            results = cluster.wait()
    path = saved_model_path(fit_dir)
    if path is None:
        raise ConfigError(f"the fit saved no model: the chief must save it to args['modelPath'] "
                          f"({args['modelPath']}, a .keras file) or export a SavedModel to "
                          f"args['exportDir'] ({args['exportDir']})", path=fit_dir)
    chief = results[0] if results else None  # worker 0 is the chief
    history = {str(k): v for k, v in chief.items()} if isinstance(chief, dict) else {}
    seconds = time.monotonic() - t0
    logger.info("TFEstimator: fitted in %.1f s; model at %s", seconds, path)
    return FitResult(path, history, results, seconds)


# -- copying a model (save/load of the fitted stages) ---------------------------------------------------
def copy_model(src: str, dst: str) -> None:
    """Copy a model file or SavedModel folder from ``src`` to ``dst`` (any fsspec URLs)."""
    from .io.files import filesystem

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
