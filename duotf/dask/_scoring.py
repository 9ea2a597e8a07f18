"""Scoring Dask DataFrames with a saved model in the Dask workers (no TF cluster):
:func:`predict` and :func:`predict_udf`, re-exported by :mod:`duotf.dask`.

Both score each partition with :func:`duotf._ml.scoring.score_pandas`: the model comes from the
per-process cache of :mod:`duotf._ml.scoring` (loaded once per worker process, reused by every
task after), and a prediction of several values a row goes back as one Arrow-backed list column.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Sequence, Union

from duotf._names import public
from duotf._ml import scoring
from duotf.errors import ConfigError

if TYPE_CHECKING:  # dask and pandas are imported where they are used
    import dask.dataframe as dd
    import pandas as pd

#: what ``meta=`` takes: ``{column: dtype}``, or an empty frame of the output columns
Meta = Union[Dict[str, Any], "pd.DataFrame", None]

__all__ = ["predict", "predict_udf", "PredictUDF", "check_column", "predict_outputs"]


def check_column(meta: pd.DataFrame, name: str) -> None:
    """Refuse the input column ``name`` of the frame ``meta`` (a Dask DataFrame's meta) where it
    is missing or does not hold numbers (a :class:`~duotf.ConfigError` naming it)."""
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


@public("duotf.dask")
class PredictUDF:
    """What :func:`predict_udf` returns: a picklable function of one pandas partition, giving
    the partition with the prediction columns added, for ``ddf.map_partitions(udf,
    meta=udf.output_meta(ddf))``.

    It holds the checked scoring plan, not the model: each worker process loads the model once
    into its cache on the first partition it scores and reuses it for every later one (the same
    cache as :func:`predict`).
    """

    def __init__(self, plan: scoring.Plan):
        self.plan = plan

    def __call__(self, frame, partition_info=None):
        # Dask passes partition_info to a function that takes it: the number names the
        # partition in a FeedSchemaError
        return scoring.score_pandas(self.plan, frame, (partition_info or {}).get("number"))

    def output_meta(self, ddf: Union[dd.DataFrame, pd.DataFrame]) -> pd.DataFrame:
        """The meta of ``ddf.map_partitions(self)``: ``ddf``'s columns and the prediction
        columns, after checking ``ddf``'s meta (each a :class:`~duotf.ConfigError` naming the
        column): an input column that is missing or not numbers, an output column that exists
        already."""
        import pandas as pd

        frame_meta = getattr(ddf, "_meta", ddf)  # a Dask DataFrame, or an empty pandas frame
        for name in dict.fromkeys(self.plan.columns):
            check_column(frame_meta, name)
        for col in self.plan.outputs:
            if col.column in frame_meta.columns:
                raise ConfigError(f"output column {col.column!r} is already a column of the "
                                  "DataFrame: name the prediction otherwise (output=...)",
                                  column=col.column)
        out_meta = frame_meta.copy()
        for col in self.plan.outputs:
            out_meta[col.column] = pd.Series([], dtype=scoring.pandas_dtype(col))
        return out_meta

    def __repr__(self) -> str:
        return (f"duotf.dask.PredictUDF({self.plan.source.describe()}, "
                f"{[c.column for c in self.plan.outputs]})")


def predict_udf(model: scoring.ModelRef, *, columns: Optional[Sequence[str]] = None,
                output: Union[str, Mapping[str, str]] = "prediction", meta: Meta = None,
                batch_size: int = scoring.DEFAULT_BATCH_SIZE) -> PredictUDF:
    """A picklable function that scores a pandas partition with a saved model: the Dask twin
    of :func:`duotf.spark.predict_udf`, for ``ddf.map_partitions``.

    ``udf = predict_udf("s3://m/model.keras", columns=["features"])``, then
    ``ddf.map_partitions(udf, meta=udf.output_meta(ddf))`` (what :func:`predict` does), or
    ``udf(frame)`` on one pandas DataFrame. ``model``, ``columns``, ``output``, ``meta`` and
    ``batch_size`` are as for :func:`predict`. The model is loaded once here to check
    ``output`` and ``meta`` against its outputs and ``columns`` against its inputs (a
    :class:`~duotf.ConfigError`); in the workers, once per process, from the cache
    :func:`predict` uses. The input columns' dtypes are checked by
    :meth:`PredictUDF.output_meta`, or in the task.
    """
    source = scoring.model_source(model)
    loaded = scoring.get_model(source)  # once on the driver: the checks read its specs
    cols = scoring.input_columns(loaded, columns)
    types = _types_of(meta) if meta is not None else None
    if types and isinstance(output, str) and len(types) > 1:
        output = {c: c for c in types}
    elif types and isinstance(output, str):
        types = {output: next(iter(types.values()))}
    outputs = scoring.output_columns(loaded, output, types)
    scoring.check_outputs(loaded, outputs, what="meta")
    return PredictUDF(scoring.make_plan(source, loaded, cols, outputs, batch_size))


def predict(ddf: dd.DataFrame, model: scoring.ModelRef, *, columns: Optional[Sequence[str]] = None,
            output: Union[str, Mapping[str, str]] = "prediction", meta: Meta = None,
            batch_size: int = scoring.DEFAULT_BATCH_SIZE) -> dd.DataFrame:
    """``ddf`` with prediction columns added: lazy, one output partition per input partition,
    rows in their order, every column of ``ddf`` kept.

    Each partition is scored in the worker that computes it with the model from that
    process's cache (:func:`duotf._ml.scoring.get_model`: loaded once per worker process, reused by
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
    udf = predict_udf(model, columns=columns, output=output, meta=meta, batch_size=batch_size)
    return _map(ddf, udf)


def predict_outputs(ddf: dd.DataFrame, source: scoring.ModelSource, loaded: scoring.Model,
                    cols: Sequence[str], outputs: Sequence[scoring.OutputColumn],
                    batch_size: int) -> dd.DataFrame:
    """:func:`predict` once its outputs are resolved (the ML stage's way in, whose outputs may
    be a classifier's)."""
    udf = PredictUDF(scoring.make_plan(source, loaded, cols, outputs, batch_size))
    return _map(ddf, udf)


def _map(ddf: dd.DataFrame, udf: PredictUDF) -> dd.DataFrame:
    """``ddf`` scored by ``udf``, partition by partition; its array columns and the array
    predictions stay arrays (Dask before dask-expr, 2024.1, made them strings at this step:
    "dataframe.convert-string")."""
    import dask

    with dask.config.set({"dataframe.convert-string": False}):
        return ddf.map_partitions(udf, meta=udf.output_meta(ddf))
