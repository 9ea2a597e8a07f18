"""Saved models as scoring loads them, in the engine's own tasks: where a model comes from and
one loaded copy per process.

- a model **source** (:func:`model_source`, on the driver): a path or fsspec URL of a ``.keras``
  / ``.h5`` file or of a SavedModel directory (the signature that scores and the tags it is
  loaded with: ``serving_default`` and ``serve`` by default), or a loader (``callable() ->
  model``);
- a :class:`Model`: what scoring asks of any of them (its inputs and outputs as
  :class:`TensorInfo`, and a call on a batch), whichever kind it is;
- a per-process model **cache** (:func:`get_model`): a model is loaded once per Python process
  (a Spark Python worker, which Spark reuses across tasks; a Dask worker) and reused by every
  task after, keyed by the path and its file's modification time and size (a model saved again
  is loaded again), or by the loader's token.

:mod:`duotf._ml.scoring` plans and scores with them. TensorFlow is imported only when a model is
loaded.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import logging
import os
import shutil
import tempfile
import threading
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union, cast

import numpy as np

from duotf.errors import ConfigError

logger = logging.getLogger("duotf._ml.scoring")

__all__ = ["ModelRef", "ModelSource", "Model", "TensorInfo", "model_source", "tag_tuple",
           "get_model", "cache_stats", "DEFAULT_SIGNATURE", "DEFAULT_TAGS", "MAX_MODELS"]

#: what ``model=`` takes: the path or fsspec URL of a saved model (a ``.keras``/``.h5`` file or a
#: SavedModel directory), or a loader, a function of no arguments that returns the model
ModelRef = Union[str, "os.PathLike[str]", Callable[[], Any]]

DEFAULT_SIGNATURE = "serving_default"
DEFAULT_TAGS = ("serve",)
_KERAS_SUFFIXES = (".keras", ".h5", ".hdf5")


# -- sources ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: ``url`` (a file or SavedModel directory) or ``loader``, whose
    ``token`` (made once on the driver) names it in every process's cache."""

    url: Optional[str] = None
    loader: Optional[Callable] = None
    token: str = ""
    #: the SavedModel's signature that scores, and the tags of its MetaGraph
    signature: str = DEFAULT_SIGNATURE
    tags: Tuple[str, ...] = DEFAULT_TAGS

    def describe(self) -> str:
        return self.url if self.url is not None else f"loader {getattr(self.loader, '__name__', self.loader)!r}"


def tag_tuple(tags: Union[str, Sequence[str], None]) -> Tuple[str, ...]:
    """A SavedModel's tag set as a tuple: ``"serve"``, ``"serve,gpu"`` or a list of tags."""
    if tags is None:
        return DEFAULT_TAGS
    parts = tags.split(",") if isinstance(tags, str) else [str(t) for t in tags]
    return tuple(t.strip() for t in parts if t.strip())


def model_source(model, signature: str = DEFAULT_SIGNATURE,
                 tags: Union[str, Sequence[str], None] = None) -> ModelSource:
    """A :class:`ModelSource` for a path/URL or a loader; a path that does not exist, or is
    neither a Keras file nor a SavedModel directory, is a :class:`~duotf.ConfigError`, and so is
    a ``signature`` or ``tags`` other than the defaults for a Keras file (which has neither).
    ``signature`` names the SavedModel signature that scores, ``tags`` its MetaGraph's tag set."""
    if isinstance(model, ModelSource):
        return model
    signature, tag_set = str(signature or DEFAULT_SIGNATURE), tag_tuple(tags)
    if isinstance(model, (str, os.PathLike)):
        url = os.fspath(model)
        # raises where the path is missing or of no known kind
        if _kind(url) == "keras" and (signature, tag_set) != (DEFAULT_SIGNATURE, DEFAULT_TAGS):
            raise ConfigError(
                f"model path {url!r} is a Keras file, which has no signatures nor tags: "
                f"signatureDefKey={signature!r} and tagSet={','.join(tag_set)!r} choose among a "
                "SavedModel's; export one (model.export(dir), tf.saved_model.save) and give its "
                "directory, or leave signatureDefKey='serving_default' and tagSet='serve'",
                path=url, param="signatureDefKey")
        return ModelSource(url=url, signature=signature, tags=tag_set)
    if callable(model):
        return ModelSource(loader=model, token=uuid.uuid4().hex, signature=signature, tags=tag_set)
    raise ConfigError(f"model={model!r}: pass the path or URL of a saved model (a .keras/.h5 "
                      "file or a SavedModel directory) or a loader: a function of no arguments "
                      "that returns the model", model=repr(model))


def _kind(url: str) -> str:
    """``"keras"`` or ``"savedmodel"``: what lies at ``url``."""
    from duotf.io.files import filesystem

    fs, path = filesystem(url)
    if not fs.exists(path):
        raise ConfigError(f"model path {url!r} does not exist: save the model there first "
                          "(model.save(\"....keras\") or model.export(dir)) or give the path of "
                          "one (every worker reads it: use a shared filesystem or a URL such as "
                          "s3://...)", path=url)
    if fs.isdir(path):
        if fs.exists(path.rstrip("/") + "/saved_model.pb"):
            return "savedmodel"
        raise ConfigError(f"model path {url!r} is a directory without saved_model.pb: give a "
                          "SavedModel directory (model.export(dir), tf.saved_model.save) or a "
                          ".keras/.h5 file", path=url)
    if url.lower().endswith(_KERAS_SUFFIXES):
        return "keras"
    raise ConfigError(f"model path {url!r} is not a .keras/.h5 file nor a SavedModel directory: "
                      "save the model with model.save(\"name.keras\") or model.export(dir)",
                      path=url)


# -- models ----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One input or output of a model: its name, dtype and per-row shape (``None``: unknown)."""

    name: str
    dtype: Optional[str]
    shape: Optional[Tuple[Optional[int], ...]]

    @property
    def size(self) -> Optional[int]:
        """Values per row, where the shape is fully known."""
        if self.shape is None or any(d is None for d in self.shape):
            return None
        return int(np.prod(cast(Tuple[int, ...], self.shape), dtype=np.int64))  # each known


def _info(name, dtype, shape) -> TensorInfo:
    dims = None if shape is None else tuple(None if d is None else int(d) for d in list(shape)[1:])
    return TensorInfo(str(name), None if dtype is None else np.dtype(_np_dtype(dtype)).name, dims)


def _np_dtype(dtype):
    return getattr(dtype, "as_numpy_dtype", dtype)


class Model:
    """A loaded model: its ``inputs`` and ``outputs`` (:class:`TensorInfo`, ``None`` where the
    model does not say) and ``predict(arrays) -> {output name: array}`` for one batch."""

    inputs: Optional[List[TensorInfo]] = None
    outputs: Optional[List[TensorInfo]] = None

    def predict(self, arrays: List[np.ndarray]) -> Dict[str, np.ndarray]:
        raise NotImplementedError


def _keras_attr(model, one: str, several: str):
    """``model.input`` (``output``); a Sequential model loaded from a file has no ``input``
    (it "has never been called") nor ``output_names``, only ``inputs``/``outputs`` lists."""
    try:
        return getattr(model, one)
    except (AttributeError, ValueError):
        values = list(getattr(model, several))
        return values[0] if len(values) == 1 else values


class _KerasModel(Model):
    def __init__(self, model):
        self.model = model
        structure = _keras_attr(model, "input", "inputs")
        if isinstance(structure, dict):
            self._input_keys = list(structure)
            tensors = list(structure.values())
        else:
            tensors = list(structure) if isinstance(structure, (list, tuple)) else [structure]
            self._input_keys = None
        names = self._input_keys or [t.name for t in tensors]
        self.inputs = [_info(n, t.dtype, t.shape) for n, t in zip(names, tensors)]
        out = _keras_attr(model, "output", "outputs")
        if isinstance(out, dict):
            self.outputs = [_info(k, t.dtype, t.shape) for k, t in out.items()]
        else:
            outs = list(out) if isinstance(out, (list, tuple)) else [out]
            names = getattr(model, "output_names", None) or [
                t._keras_history.operation.name if hasattr(t, "_keras_history") else str(i)
                for i, t in enumerate(outs)]
            self.outputs = [_info(n, t.dtype, t.shape) for n, t in zip(names, outs)]

    def predict(self, arrays):
        if self._input_keys is not None:
            x = dict(zip(self._input_keys, arrays))
        else:
            x = arrays[0] if len(arrays) == 1 else list(arrays)
        y = self.model.predict_on_batch(x)
        if isinstance(y, dict):
            return {k: np.asarray(v) for k, v in y.items()}
        ys = list(y) if isinstance(y, (list, tuple)) else [y]
        return {o.name: np.asarray(v) for o, v in zip(self.outputs, ys)}


class _SignatureModel(Model):
    def __init__(self, loaded, key: str = DEFAULT_SIGNATURE, where: str = "the SavedModel"):
        self.loaded = loaded  # keeps the variables the signature reads alive
        if key not in loaded.signatures:
            raise ConfigError(f"{where} has no signature {key!r}: its signatures are "
                              f"{sorted(loaded.signatures)}; set signatureDefKey to one of them",
                              param="signatureDefKey", signatures=sorted(loaded.signatures))
        self.fn = loaded.signatures[key]
        _, kwargs = self.fn.structured_input_signature
        # by name: a signature's inputs and outputs come from a protobuf map, whose order may
        # differ from one process to the next (and a plan made on the driver feeds by position)
        self.inputs = [_info(n, s.dtype, s.shape) for n, s in sorted(kwargs.items())]
        self.outputs = [_info(n, s.dtype, s.shape)
                        for n, s in sorted(self.fn.structured_outputs.items())]

    def predict(self, arrays):
        import tensorflow as tf

        feed = {i.name: tf.constant(a) for i, a in zip(self.inputs, arrays)}
        return {k: v.numpy() for k, v in self.fn(**feed).items()}


class _CallableModel(Model):
    """A loader's plain callable: ``f(x)`` for one input, ``f(*xs)`` for several; it returns an
    array, a list of arrays, or a dict of them."""

    def __init__(self, fn):
        self.fn = fn

    def predict(self, arrays):
        y = self.fn(*arrays)
        if isinstance(y, dict):
            return {str(k): np.asarray(v) for k, v in y.items()}
        if isinstance(y, (list, tuple)):
            return {str(i): np.asarray(v) for i, v in enumerate(y)}
        return {"0": np.asarray(y)}


def _wrap(obj, where: str, signature: str = DEFAULT_SIGNATURE) -> Model:
    if isinstance(obj, Model):
        return obj
    if hasattr(obj, "predict_on_batch") and (hasattr(obj, "input") or hasattr(obj, "inputs")):
        if signature != DEFAULT_SIGNATURE:
            raise ConfigError(f"{where} gave a Keras model, which has no signature {signature!r}: "
                              "return a loaded SavedModel, or leave signatureDefKey="
                              "'serving_default'", param="signatureDefKey")
        return _KerasModel(obj)
    signatures = getattr(obj, "signatures", None)
    if signatures is not None and (signature in signatures or signature != DEFAULT_SIGNATURE):
        return _SignatureModel(obj, signature, where)
    if callable(obj):
        return _CallableModel(obj)
    raise ConfigError(f"{where} gave {type(obj).__name__}: a loader must return a Keras model, a "
                      "loaded SavedModel with a serving_default signature, or a callable")


# -- the per-process cache -------------------------------------------------------------------------
_lock = threading.Lock()
_cache: "collections.OrderedDict[tuple, Model]" = collections.OrderedDict()
_stats: Dict[str, Dict[str, int]] = {}  # source -> {"loads": n, "uses": n} in this process
_copies: List[str] = []  # local copies of remote models, removed at exit
MAX_MODELS = 4  # models kept per process (the least recently used goes first)


def _stat_key(url: str) -> tuple:
    """What tells one saved model from the next at ``url``: its file's (or its SavedModel's
    saved_model.pb and variables index's) modification time and size."""
    from duotf.io.files import filesystem

    fs, path = filesystem(url)
    parts = [path]
    if fs.isdir(path):
        base = path.rstrip("/")
        parts = [base + "/saved_model.pb", base + "/variables/variables.index"]
    key = []
    for part in parts:
        try:
            info = fs.info(part)
        except FileNotFoundError:
            if part == path:
                raise ConfigError(f"model path {url!r} does not exist (any more)", path=url) from None
            continue
        stamp = next((info[k] for k in ("mtime", "LastModified", "last_modified", "ETag", "etag")
                      if info.get(k) is not None), None)
        key.append((str(stamp), info.get("size")))
    return tuple(key)


def _load(source: ModelSource) -> Model:
    if source.loader is not None:
        return _wrap(source.loader(), source.describe(), source.signature)
    from duotf._node.output import import_tensorflow_quietly
    from duotf.io.files import filesystem

    import_tensorflow_quietly()  # this process's stderr may be the user's terminal
    url = source.url
    assert url is not None  # a source with no loader names a URL
    kind = _kind(url)
    fs, path = filesystem(url)
    local = path
    if "file" not in (fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)):
        folder = tempfile.mkdtemp(prefix="duotf-model-")
        _copies.append(folder)
        local = os.path.join(folder, os.path.basename(path.rstrip("/")) or "model")
        fs.get(path, local, recursive=kind == "savedmodel")
        logger.debug("duotf: copied model %s to %s", url, local)
    if kind == "keras":
        import keras

        return _KerasModel(keras.saving.load_model(local, compile=False))
    import tensorflow as tf

    try:
        loaded = tf.saved_model.load(local, tags=list(source.tags))
    except (RuntimeError, ValueError) as exc:
        found = _tag_sets(local)
        if found is None or sorted(source.tags) in found:
            raise
        raise ConfigError(f"the SavedModel at {url!r} has no MetaGraph of the tags "
                          f"{','.join(source.tags)!r}: its tag sets are "
                          f"{[','.join(t) for t in found]}; set tagSet to one of them",
                          path=url, param="tagSet") from exc
    return _SignatureModel(loaded, source.signature, f"the SavedModel at {url!r}")


def _tag_sets(local: str) -> Optional[List[List[str]]]:
    """The tag sets of the SavedModel at ``local`` (``None`` where its file cannot be read)."""
    try:
        from tensorflow.core.protobuf import saved_model_pb2

        proto = saved_model_pb2.SavedModel()
        with open(os.path.join(local, "saved_model.pb"), "rb") as f:
            proto.ParseFromString(f.read())
    except Exception:  # best effort: the load's own error stands
        return None
    return [sorted(m.meta_info_def.tags) for m in proto.meta_graphs]


def get_model(source: ModelSource, task: bool = False) -> Model:
    """The model of ``source``, loaded once in this process and then taken from the cache.
    ``task``: the call that starts a task (counted as a use in :func:`cache_stats`)."""
    name = source.url if source.url is not None else source.token
    key: tuple = (name, source.signature, source.tags)
    if source.url is not None:
        key += (_stat_key(source.url),)
    with _lock:
        stats = _stats.setdefault(name, {"loads": 0, "uses": 0})
        stats["uses"] += bool(task)
        model = _cache.get(key)
        if model is not None:
            _cache.move_to_end(key)
            return model
        # loading under the lock: two threads of one worker load a model once, not twice
        model = _load(source)
        stats["loads"] += 1
        _cache[key] = model
        while len(_cache) > MAX_MODELS:
            _cache.popitem(last=False)
        logger.info("duotf: loaded model %s in process %d", source.describe(), os.getpid())
        return model


def cache_stats() -> Dict[str, Dict[str, int]]:
    """This process's model loads and uses (tasks that scored with it), by source (a URL, or
    a loader's token): ``{source: {"loads": n, "uses": n}}``."""
    with _lock:
        return {k: dict(v) for k, v in _stats.items()}


@atexit.register
def _remove_copies():
    for folder in _copies:
        shutil.rmtree(folder, ignore_errors=True)
