"""Scoring Dask DataFrames with a saved model in the Dask workers (no TF cluster).

``import duotf.dask`` imports neither dask nor distributed; :func:`predict` imports what it needs.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence, Union

from . import scoring
from .errors import ConfigError

__all__ = ["predict"]


def _check_column(meta, name: str) -> None:
    import pandas as pd

    if name not in meta.columns:
        raise ConfigError(f"input column {name!r} is not in the DataFrame (its columns are "
                          f"{list(meta.columns)}): pass columns=[...] naming the model's input "
                          "columns", column=name)
    dtype = meta[name].dtype
    if isinstance(dtype, pd.ArrowDtype):
        import pyarrow as pa

        t = dtype.pyarrow_dtype
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            t = t.value_type
        if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
            return
    elif dtype == object or getattr(dtype, "numpy_dtype", dtype).kind in "iufb":
        return  # object: lists or arrays a row (checked per partition, as the feed does)
    raise ConfigError(f"input column {name!r} is {dtype}; a model input takes numbers: give a "
                      "number column or a column of lists/arrays of numbers (strings read "
                      "with dask.config.set({'dataframe.convert-string': False}) stay lists)",
                      column=name, dtype=str(dtype))


def _types_of(meta) -> dict:
    """``{column: type name}`` from ``meta`` (a dict of dtypes or a frame of the output columns)."""
    import pandas as pd

    dtypes = dict(meta.dtypes) if hasattr(meta, "dtypes") else dict(meta)
    names = {"float64": "double", "float32": "float", "int64": "long", "int32": "int", "bool": "boolean"}
    types = {}
    for column, dtype in dtypes.items():
        if isinstance(dtype, pd.ArrowDtype) or str(dtype) == "object":
            types[column] = "array<float>"
        elif str(pd.api.types.pandas_dtype(dtype)) in names:
            types[column] = names[str(pd.api.types.pandas_dtype(dtype))]
        else:
            raise ConfigError(f"meta: column {column!r} has dtype {dtype}; a prediction column is "
                              f"one of {sorted(names)} or object/list (a vector)", column=column)
    return types


def predict(ddf, model, *, columns: Optional[Sequence[str]] = None,
            output: Union[str, Mapping[str, str]] = "prediction", meta=None,
            batch_size: int = scoring.DEFAULT_BATCH_SIZE):
    """``ddf`` with prediction columns added: lazy, one output partition per input partition,
    rows in their order, every column of ``ddf`` kept.

    Each partition is scored in the worker that computes it with the model from that
    process's cache (:func:`duotf.scoring.get_model`: loaded once per worker process, reused by
    every task after). ``model``, ``columns``, ``output`` and ``batch_size`` are as for
    :func:`duotf.spark.predict`. A prediction of one value a row is a float64 column (int64 for
    an integer output), of several an Arrow-backed list column (``pd.ArrowDtype(pa.list_(
    pa.float32()))``, built from the predictions' buffer with no per-row work); ``meta`` (a
    dict ``{column: dtype}`` or an empty frame of the output columns) sets them otherwise, and
    is needed where the loader returns a plain callable. Array columns may hold lists or numpy
    arrays (object dtype) or be Arrow lists.

    Checked before anything runs, with ``ddf``'s meta and the model loaded once here, each a
    :class:`~duotf.ConfigError` naming the column or path: a missing input column or one that
    is not numbers, a model path that does not exist, output columns or dtypes that do not fit
    the model's outputs, an output column that exists already. A null, or an array column
    whose rows differ in length, fails the computation with a :class:`~duotf.FeedSchemaError`
    naming the column and the row.
    """
    import pandas as pd

    source = scoring.model_source(model)
    loaded = scoring.get_model(source)
    cols = scoring.input_columns(loaded, columns)
    frame_meta = ddf._meta
    for name in cols:
        _check_column(frame_meta, name)
    types = _types_of(meta) if meta is not None else None
    if types and isinstance(output, str) and len(types) > 1:
        output = {c: c for c in types}
    elif types and isinstance(output, str):
        types = {output: next(iter(types.values()))}
    outputs = scoring.output_columns(loaded, output, types)
    scoring.check_outputs(loaded, outputs, what="meta")
    for col in outputs:
        if col.column in frame_meta.columns:
            raise ConfigError(f"output column {col.column!r} is already a column of the DataFrame: "
                              "name the prediction otherwise (output=...)", column=col.column)
    plan = scoring.make_plan(source, loaded, cols, outputs, batch_size)
    out_meta = frame_meta.copy()
    for col in outputs:
        out_meta[col.column] = pd.Series([], dtype=scoring.pandas_dtype(col))
    return ddf.map_partitions(_score_partition, plan, meta=out_meta)


def _score_partition(frame, plan, partition_info=None):
    return scoring.score_pandas(plan, frame, (partition_info or {}).get("number"))
