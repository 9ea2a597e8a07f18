"""Scoring a DataFrame with a saved model, in the engine's own tasks: no cluster, no nodes.

The engine-neutral core of :func:`duotf.spark.predict_udf`, :func:`duotf.spark.predict` and
:func:`duotf.dask.predict`:

- a model **source** (:func:`model_source`, on the driver): a path or fsspec URL of a ``.keras``
  / ``.h5`` file or of a SavedModel directory (the signature that scores and the tags it is
  loaded with: ``serving_default`` and ``serve`` by default), or a loader (``callable() ->
  model``);
- a per-process model **cache** (:func:`get_model`): a model is loaded once per Python process
  (a Spark Python worker, which Spark reuses across tasks; a Dask worker) and reused by every
  task after, keyed by the path and its file's modification time and size (a model saved again
  is loaded again), or by the loader's token;
- a scoring **plan** (:class:`Plan`, made and checked on the driver: :func:`make_plan`) and the
  function that scores one Arrow record batch or pandas frame with it (:func:`score_arrow`,
  :func:`score_pandas`). Columns are decoded as the engine feed decodes them
  (:func:`duotf._transport.columns.from_arrow`: list columns through their offsets, packed tensor
  columns as one buffer, nulls and ragged rows refused with a ``FeedSchemaError``).

TensorFlow is imported only when a model is loaded.
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
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union, cast

import numpy as np

from duotf.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["ModelRef", "ModelSource", "Model", "TensorInfo", "OutputColumn", "Plan", "model_source",
           "get_model", "make_plan", "score_columns", "score_arrow", "score_pandas",
           "cache_stats", "DEFAULT_BATCH_SIZE"]

#: what ``model=`` takes: the path or fsspec URL of a saved model (a ``.keras``/``.h5`` file or a
#: SavedModel directory), or a loader, a function of no arguments that returns the model
ModelRef = Union[str, "os.PathLike[str]", Callable[[], Any]]

DEFAULT_BATCH_SIZE = 1024
DEFAULT_SIGNATURE = "serving_default"
DEFAULT_TAGS = ("serve",)
_KERAS_SUFFIXES = (".keras", ".h5", ".hdf5")
#: the output column types a plan knows, by their Spark names (Dask uses the numpy dtype)
SCALAR_TYPES = {"double": "float64", "float": "float32", "long": "int64", "bigint": "int64",
                "int": "int32", "integer": "int32", "boolean": "bool"}
VECTOR_TYPES = {"array<float>": "float32", "array<double>": "float64", "array<int>": "int32",
                "array<bigint>": "int64", "array<long>": "int64"}


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


# -- the plan --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class OutputColumn:
    """One output column: ``column`` holds the model output ``output`` as ``type`` (a Spark
    type name: one of :data:`SCALAR_TYPES` or :data:`VECTOR_TYPES`)."""

    column: str
    output: str
    type: str
    #: what the column holds of the output: the output itself (""), or for a classifier's
    #: scores "raw" (the scores), "probability" (:func:`probabilities`) or "argmax" (the class)
    derive: str = ""

    @property
    def vector(self) -> bool:
        return self.type in VECTOR_TYPES

    @property
    def dtype(self) -> str:
        return VECTOR_TYPES[self.type] if self.vector else SCALAR_TYPES[self.type]


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything a task needs to score a batch: the model's source, the input columns (in the
    model's input order; several scalar columns for a one-input model are stacked), the packed
    tensor columns ``{column: (dtype, shape)}``, the output columns and the batch size."""

    source: ModelSource
    columns: Tuple[str, ...]
    outputs: Tuple[OutputColumn, ...]
    batch_size: int = DEFAULT_BATCH_SIZE
    tensors: Tuple[Tuple[str, str, Tuple[int, ...]], ...] = ()


def _output_type(info: Optional[TensorInfo]) -> str:
    """The column type an output gets by default: a scalar (one value a row) as double (long for
    integers), anything else as array<float>."""
    integer = info is not None and info.dtype is not None and np.dtype(info.dtype).kind in "iub"
    if info is not None and info.shape is not None and info.size == 1:
        return "long" if integer else "double"
    return "array<float>"


def output_columns(model: Model, output: Union[str, Mapping[str, str], None],
                   types: Optional[Mapping[str, str]] = None) -> Tuple[OutputColumn, ...]:
    """The output columns for ``output``: a column name (the model's one output), or
    ``{column: model output name}``; their types from ``types`` ({column: type}) or the model."""
    outs = model.outputs
    names = [o.name for o in outs] if outs is not None else None
    if output is None or isinstance(output, str):
        column = output or "prediction"
        if names is not None and len(names) != 1:
            raise ConfigError(f"the model has {len(names)} outputs {names}: name a column for each, "
                              f"output={{{', '.join(repr(n) + ': ' + repr(n) for n in names)}}}",
                              outputs=names)
        mapping = {column: names[0] if names else "0"}
    else:
        mapping = {str(c): str(o) for c, o in dict(output).items()}
        for column, name in mapping.items():
            if names is not None and name not in names:
                raise ConfigError(f"output column {column!r}: the model has no output {name!r}; "
                                  f"its outputs are {names}", column=column, outputs=names)
    types = dict(types or {})
    by_name = {o.name: o for o in outs or ()}
    cols = []
    for column, name in mapping.items():
        kind = types.get(column)
        if kind is None:
            if outs is None:
                raise ConfigError(f"output column {column!r}: the model (a plain callable) does not "
                                  "say what it returns: give its type (Spark: return_type; Dask: "
                                  "meta)", column=column)
            kind = _output_type(by_name.get(name))
        cols.append(OutputColumn(column, name, normalize_type(kind, column)))
    return tuple(cols)


def normalize_type(kind: str, column: str) -> str:
    kind = kind.strip().lower().replace(" ", "")
    if kind not in SCALAR_TYPES and kind not in VECTOR_TYPES:
        raise ConfigError(f"output column {column!r}: type {kind!r} is not one a prediction can take; "
                          f"use one of {sorted(SCALAR_TYPES) + sorted(VECTOR_TYPES)}",
                          column=column, type=kind)
    return kind


def check_outputs(model: Model, outputs: Sequence[OutputColumn], what: str = "return_type") -> None:
    """Refuse output types that do not fit what the model returns: a scalar type for an output
    of several values a row, a vector type whose values would lose their fraction, an integer
    type for a floating-point output."""
    if model.outputs is None:
        return  # a plain callable: checked on its first batch
    by_name = {o.name: o for o in model.outputs}
    for col in outputs:
        if col.derive:
            continue  # a classifier's columns: their types follow from the scores
        info = by_name[col.output]
        shape = "x".join("?" if d is None else str(d) for d in info.shape or ()) or "a scalar"
        if not col.vector and info.size != 1 and info.shape is not None and info.size is not None:
            raise ConfigError(
                f"{what}: column {col.column!r} is {col.type}, but the model's output "
                f"{col.output!r} holds {info.size} values a row (shape {shape}): use array<float>",
                column=col.column, output=col.output)
        if (info.dtype is not None and np.dtype(info.dtype).kind == "f"
                and np.dtype(col.dtype).kind in "iub"):
            raise ConfigError(
                f"{what}: column {col.column!r} is {col.type}, but the model's output "
                f"{col.output!r} is {info.dtype}: its values would be truncated; use "
                + ("array<float> or array<double>" if col.vector else "double or float"),
                column=col.column, output=col.output)


def input_columns(model: Model, columns: Optional[Sequence[str]]) -> Tuple[str, ...]:
    """The input columns, in the model's input order: ``columns``, or the model's input names."""
    if columns is None:
        if model.inputs is None:
            raise ConfigError("the model (a plain callable) does not name its inputs: pass "
                              "columns=[...]")
        return tuple(i.name for i in model.inputs)
    if isinstance(columns, str):
        columns = [columns]
    columns = tuple(str(c) for c in columns)
    if model.inputs is not None and len(columns) != len(model.inputs) and len(model.inputs) != 1:
        raise ConfigError(f"columns={list(columns)}: the model takes {len(model.inputs)} inputs "
                          f"{[i.name for i in model.inputs]}; give one column for each, in that "
                          "order", columns=list(columns))
    return columns


def make_plan(source: ModelSource, model: Model, columns, outputs, batch_size: int,
              tensors: Optional[Dict[str, tuple]] = None) -> Plan:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ConfigError(f"batch_size={batch_size!r}: give a positive number of rows",
                          batch_size=batch_size)
    tensors = tensors or {}
    packed = tuple((c, *tensors[c]) for c in columns if c in tensors)
    return Plan(source, tuple(columns), tuple(outputs), batch_size, packed)


# -- scoring ---------------------------------------------------------------------------------------
def _model_inputs(model: Model, plan: Plan, cols: Dict[str, np.ndarray]) -> List[np.ndarray]:
    """The arrays the model takes, from decoded columns: cast to the input's dtype, reshaped to
    its per-row shape; several scalar columns stacked for a one-input model."""
    arrays = [cols[c] for c in plan.columns]
    specs = model.inputs
    if specs is not None and len(specs) == 1 and len(arrays) > 1:
        arrays = [np.stack([np.asarray(a).reshape(len(a), -1) for a in arrays], axis=1)
                  .reshape(len(arrays[0]), -1)]
    out = []
    for i, a in enumerate(arrays):
        if not isinstance(a, np.ndarray):
            raise ConfigError(f"input column {plan.columns[min(i, len(plan.columns) - 1)]!r} holds "
                              "strings or bytes; a model input takes numbers (or pack tensors "
                              "with duotf.spark.pack_tensors)", column=plan.columns[i])
        spec = specs[i] if specs is not None and i < len(specs) else None
        if spec is not None:
            if spec.dtype is not None and a.dtype != np.dtype(spec.dtype):
                a = a.astype(spec.dtype)
            if spec.shape is not None and spec.size is not None and a.shape[1:] != spec.shape:
                if int(np.prod(a.shape[1:], dtype=np.int64)) != spec.size:
                    raise ConfigError(
                        f"input column {plan.columns[i]!r}: rows of {list(a.shape[1:]) or 'one value'}"
                        f" do not fit the model's input {spec.name!r} of shape {list(spec.shape)}; "
                        "give a column with that many values a row", column=plan.columns[i])
                a = a.reshape((len(a),) + spec.shape)
        out.append(a)
    return out


def score_columns(plan: Plan, cols: Dict[str, Any], model: Optional[Model] = None
                  ) -> Dict[str, np.ndarray]:
    """Predictions ``{output column: array}`` for decoded input ``cols``, in batches of
    ``plan.batch_size`` rows; one row out for every row in, in order. ``model``: the plan's,
    where the caller has it (a task takes it from the cache once)."""
    model = model or get_model(plan.source)
    inputs = _model_inputs(model, plan, cols)
    n = len(inputs[0]) if inputs else 0
    parts: Dict[str, list] = {c.column: [] for c in plan.outputs}
    for start in range(0, n, plan.batch_size):
        got = model.predict([a[start:start + plan.batch_size] for a in inputs])
        for col in plan.outputs:
            if col.output not in got:
                raise ConfigError(f"output column {col.column!r}: the model returned no output "
                                  f"{col.output!r} (it returned {sorted(got)})", column=col.column)
            parts[col.column].append(got[col.output])
    out = {}
    for col in plan.outputs:
        values = (np.concatenate(parts[col.column]) if parts[col.column]
                  else np.empty((0,) + ((0,) if col.vector else ()), dtype=col.dtype))
        values = values.reshape(len(values), -1)
        if col.derive:
            from duotf._ml.mapping import derived

            values = derived(values, col.derive).reshape(len(values), -1)
        if not col.vector:
            if values.shape[1] != 1:
                raise ConfigError(f"output column {col.column!r} is {col.type}, but the model's "
                                  f"output {col.output!r} holds {values.shape[1]} values a row: "
                                  "use array<float>", column=col.column)
            values = values[:, 0]
        out[col.column] = values.astype(col.dtype, copy=False)
    return out


def _decode(batch, plan: Plan, model: Model) -> Dict[str, object]:
    """The batch's input columns as arrays; a binary column not known as a packed tensor
    column (a UDF's input, whose metadata stays on the driver) is decoded as the model input
    it feeds: that input's dtype and shape."""
    import pyarrow as pa

    from duotf._transport.columns import from_arrow

    tensors: Dict[str, Tuple[str, Optional[tuple]]] = {
        c: (dtype, tuple(shape)) for c, dtype, shape in plan.tensors}
    inputs = model.inputs or []
    for i, name in enumerate(plan.columns):
        if name in tensors or name not in batch.schema.names:
            continue
        if pa.types.is_binary(batch.schema.field(name).type) or pa.types.is_large_binary(batch.schema.field(name).type):
            spec = inputs[i] if i < len(inputs) else None
            if spec is None or spec.size is None or spec.dtype is None:
                raise ConfigError(f"input column {name!r} is binary, but the model input it feeds "
                                  "has no fixed shape and dtype to decode it as: pass an "
                                  "array<float> column", column=name)
            tensors[name] = (spec.dtype, spec.shape)
    return from_arrow(batch, tensors)


def to_arrow(values: np.ndarray, vector: bool):
    """A prediction column as Arrow: a number column, or a list column made from the array's
    buffer and even offsets (no per-row work)."""
    import pyarrow as pa

    if not vector:
        return pa.array(values)
    n, width = values.shape
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * width, pa.int32())
    return pa.ListArray.from_arrays(offsets, pa.array(np.ascontiguousarray(values).reshape(-1)))


_RAGGED_HINT = ("a model input needs one length in every row: filter or pad the rows to the "
                "length the model takes")


def _refused(exc, labels: Mapping[str, str], partition, offset: int):
    """The feed's FeedSchemaError for a scoring task: the column as the user named it, the row
    placed in its partition, and a hint for scoring (a ragged column cannot be declared here)."""
    attrs = exc.attributes
    column = labels.get(attrs["column"], attrs["column"])
    hint = _RAGGED_HINT if attrs["problem"] == "ragged" else attrs["hint"].replace(
        repr(attrs["column"]), repr(column))
    err = type(exc)("", **dict(attrs, column=column, hint=hint))
    return err.located(partition, offset)


def score_arrow(plan: Plan, batch, partition=None, offset: int = 0,
                labels: Optional[Mapping[str, str]] = None, model: Optional[Model] = None
                ) -> List[Any]:
    """The output columns (Arrow arrays, in ``plan.outputs`` order) for an Arrow record batch
    holding at least the plan's input columns. A null or a ragged row is a
    :class:`~duotf.FeedSchemaError` naming the column (as ``labels`` names it), the
    ``partition`` and the row (counted from ``offset``: the batch's first row in it)."""
    from duotf.errors import FeedSchemaError

    if batch.num_rows == 0:
        return [to_arrow(np.empty((0, 1) if c.vector else 0, c.dtype), c.vector) for c in plan.outputs]
    model = model or get_model(plan.source)
    names = set(batch.schema.names)
    try:
        cols = _decode(batch.select([c for c in dict.fromkeys(plan.columns) if c in names]), plan,
                       model)
    except FeedSchemaError as exc:
        raise _refused(exc, labels or {}, partition, offset) from None
    preds = score_columns(plan, cols, model)
    return [to_arrow(preds[c.column], c.vector) for c in plan.outputs]


def score_pandas(plan: Plan, frame, partition=None):
    """``frame`` (partition ``partition``) with the output columns added (vector columns as
    Arrow-backed lists)."""
    import pandas as pd
    import pyarrow as pa

    model = get_model(plan.source, task=True)
    out = frame.copy()
    inputs = list(dict.fromkeys(plan.columns))
    if len(frame):
        batch = pa.RecordBatch.from_pandas(frame[inputs], preserve_index=False)
        arrays = score_arrow(plan, batch, partition, model=model)
    else:
        arrays = [to_arrow(np.empty((0, 1) if c.vector else 0, c.dtype), c.vector) for c in plan.outputs]
    for col, arr in zip(plan.outputs, arrays):
        if col.vector:
            out[col.column] = pd.Series(pd.arrays.ArrowExtensionArray(arr), index=frame.index)
        else:
            out[col.column] = pd.Series(arr.to_numpy(zero_copy_only=False), index=frame.index)
    return out


def pandas_dtype(col: OutputColumn):
    """The pandas dtype of an output column (the ``meta`` of a Dask prediction)."""
    import pandas as pd
    import pyarrow as pa

    if col.vector:
        return pd.ArrowDtype(pa.list_(pa.from_numpy_dtype(np.dtype(col.dtype))))
    return np.dtype(col.dtype)
