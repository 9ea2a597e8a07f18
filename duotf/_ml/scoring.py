"""Scoring a DataFrame with a saved model, in the engine's own tasks: no cluster, no nodes.

The engine-neutral core of :func:`duotf.spark.predict_udf`, :func:`duotf.spark.predict` and
:func:`duotf.dask.predict`:

- the model, from its source, loaded once per process (:mod:`duotf._ml.models`, whose names
  this module re-exports: :func:`model_source`, :func:`get_model`, ...);
- a scoring **plan** (:class:`Plan`, made and checked on the driver: :func:`make_plan`) and the
  function that scores one Arrow record batch or pandas frame with it (:func:`score_arrow`,
  :func:`score_pandas`). Columns are decoded as the engine feed decodes them
  (:func:`duotf._transport.columns.from_arrow`: list columns through their offsets, packed tensor
  columns as one buffer, nulls and ragged rows refused with a ``FeedSchemaError``);
- a classifier's columns, derived from its scores in the scoring task (:func:`derived`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from duotf.errors import ConfigError
from duotf._ml.models import (DEFAULT_SIGNATURE, DEFAULT_TAGS, MAX_MODELS, Model, ModelRef, ModelSource,
                              TensorInfo, cache_stats, get_model, model_source, tag_tuple)

__all__ = ["ModelRef", "ModelSource", "Model", "TensorInfo", "OutputColumn", "Plan", "model_source",
           "get_model", "make_plan", "score_columns", "score_arrow", "score_pandas",
           "cache_stats", "tag_tuple", "probabilities", "derived", "DEFAULT_BATCH_SIZE",
           "DEFAULT_SIGNATURE", "DEFAULT_TAGS", "MAX_MODELS"]

DEFAULT_BATCH_SIZE = 1024
#: the output column types a plan knows, by their Spark names (Dask uses the numpy dtype)
SCALAR_TYPES = {"double": "float64", "float": "float32", "long": "int64", "bigint": "int64",
                "int": "int32", "integer": "int32", "boolean": "bool"}
VECTOR_TYPES = {"array<float>": "float32", "array<double>": "float64", "array<int>": "int32",
                "array<bigint>": "int64", "array<long>": "int64"}


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


# -- a classifier's columns ------------------------------------------------------------------
def probabilities(scores: np.ndarray) -> np.ndarray:
    """Class probabilities from a classifier's scores (one row of scores a row): a row whose
    values lie in [0, 1] and sum to 1 (within 1e-4) is taken as they are (a softmax or sigmoid
    output), any other row (logits) gets its softmax."""
    scores = scores.astype(np.float64, copy=False)
    shifted = np.exp(scores - scores.max(axis=1, keepdims=True))
    soft = shifted / shifted.sum(axis=1, keepdims=True)
    already = ((scores >= 0).all(axis=1) & (scores <= 1).all(axis=1)
               & (np.abs(scores.sum(axis=1) - 1) <= 1e-4))
    return np.where(already[:, None], scores, soft)


def derived(scores: np.ndarray, derive: str) -> np.ndarray:
    """A classifier's column ``derive`` (:attr:`OutputColumn.derive`) of its ``scores``."""
    if derive == "raw":
        return scores.astype(np.float64, copy=False)
    if derive == "probability":
        return probabilities(scores)
    return np.argmax(scores, axis=1).astype(np.float64)
