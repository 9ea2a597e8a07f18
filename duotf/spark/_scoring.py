"""Scoring Spark DataFrames with a saved model in Spark's own Python workers (no TF cluster):
:func:`predict_udf` and :func:`predict`, re-exported by :mod:`duotf.spark`.

Both hand every Arrow batch of a partition to :func:`duotf._ml.scoring.score_arrow`: the model comes
from the per-process cache of :mod:`duotf._ml.scoring` (loaded once per Python worker, which Spark
reuses across tasks: ``spark.python.worker.reuse``, on by default), the columns are decoded
without per-row Python, and the predictions go back as Arrow arrays.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence, Union

from duotf._names import public
from duotf.errors import ConfigError
from duotf._verbosity import quiet_known_notices
from duotf._ml import scoring

if TYPE_CHECKING:  # pyspark is imported where it is used
    from pyspark.sql import DataFrame
    from pyspark.sql.types import DataType
__all__ = ["predict_udf", "predict", "PredictUDF"]

_NUMBERS = {"float", "double", "tinyint", "smallint", "int", "bigint", "boolean"}


def _data_type(return_type):
    from pyspark.sql import types as T

    if isinstance(return_type, T.DataType):
        return return_type
    try:
        return T._parse_datatype_string(str(return_type))
    except Exception as exc:  # pyspark's parse errors come in several classes
        raise ConfigError(f"return_type={return_type!r} is not a Spark type: give one such as "
                          "\"double\", \"array<float>\" or \"a double, b array<float>\" "
                          f"({str(exc).splitlines()[0]})", return_type=str(return_type)) from exc


def _types_of(data_type, default_column: str) -> Dict[str, str]:
    """``{column: type name}`` of a return type: a struct's fields, or one column."""
    from pyspark.sql import types as T

    if isinstance(data_type, T.StructType):
        return {f.name: f.dataType.simpleString() for f in data_type.fields}
    return {default_column: data_type.simpleString()}


def _arrow_type(type_name: str):
    import pyarrow as pa

    dtype = scoring.VECTOR_TYPES.get(type_name) or scoring.SCALAR_TYPES[type_name]
    arrow = pa.from_numpy_dtype(dtype)
    return pa.list_(arrow) if type_name in scoring.VECTOR_TYPES else arrow


@public("duotf.spark")
class PredictUDF:
    """What :func:`predict_udf` returns: call it with the input columns, as a Spark UDF
    (``udf("features")``, ``udf(*cols)``) to get the prediction column. The number of columns is
    checked against the model's inputs here, on the driver."""

    def __init__(self, plan: scoring.Plan, model: scoring.Model, data_type: DataType):
        self.plan = plan
        self.return_type = data_type
        self._inputs = model.inputs

    def __call__(self, *cols):
        import dataclasses
        import typing

        import pyarrow as pa
        from pyspark.sql import types as T
        from pyspark.sql.functions import arrow_udf

        if not cols:
            raise ConfigError("predict_udf(...)(): give the input column(s), e.g. udf(\"features\")")
        if self._inputs is not None and len(self._inputs) not in (1, len(cols)):
            names = [i.name for i in self._inputs]
            raise ConfigError(f"the model takes {len(names)} inputs {names}: call the UDF with one "
                              f"column for each, in that order (got {len(cols)})", inputs=names)
        plan = dataclasses.replace(self.plan, columns=tuple(str(i) for i in range(len(cols))))
        labels = {str(i): _label(c, i) for i, c in enumerate(cols)}
        run = _udf_task(plan, labels, [_arrow_type(c.type) for c in plan.outputs],
                        isinstance(self.return_type, T.StructType))
        # the hints tell pyspark the UDF's form (an iterator of batches), as objects: this
        # module's annotations are strings, and pyarrow is no global here
        run.__annotations__ = {"iterator": typing.Iterator[typing.Tuple[pa.Array, ...]],
                               "return": typing.Iterator[pa.Array]}
        return arrow_udf(run, self.return_type)(*cols)

    def __repr__(self) -> str:
        return f"PredictUDF({self.plan.source.describe()}, {self.return_type.simpleString()})"


def predict_udf(model: scoring.ModelRef, return_type: Union[str, DataType] = "double", *,
                batch_size: int = scoring.DEFAULT_BATCH_SIZE) -> PredictUDF:
    """A Spark UDF that scores its input columns with a saved model.

    ``df.withColumn("pred", predict_udf("s3://m/model.keras")("features"))``, or
    ``df.select(udf(*cols))``: the columns feed the model's inputs in order (several scalar
    columns for a model of one input are stacked into its rows). ``array<number>`` columns and
    packed tensor columns (:func:`duotf.spark.pack_tensors`) are decoded from their Arrow
    buffers, not row by row.

    Parameters
    ----------
    model
        The path or fsspec URL of a ``.keras``/``.h5`` file or a SavedModel directory (its
        ``serving_default`` signature), readable from every executor; or a loader, a function
        of no arguments returning a Keras model, a loaded SavedModel, or a callable
        ``f(*arrays) -> array | list | dict``. Loaded once per Python worker process and
        reused by its following tasks (keyed by the file's mtime and size: a model saved
        again is loaded again).
    return_type
        A Spark type or DDL string: a scalar (``"double"``, ``"float"``, ``"long"``) or
        ``"array<float>"`` for a model of one output; a struct (``"y double, z array<float>"``)
        whose field names are the model's output names, for several.
    batch_size
        Rows per model call.

    Notes
    -----
    The model is loaded once on the driver to check ``return_type`` against its outputs
    (number, values per row, dtype), and the number of columns against its inputs, when the
    UDF is called: a mismatch is a :class:`~duotf.ConfigError` before any task runs. The
    columns' types reach the UDF only in its tasks: a string column, or an array column whose
    rows differ in length (a :class:`~duotf.FeedSchemaError`, as in the feed), fails the job
    with that error's message. :func:`predict` checks the column types on the driver.

    Why an Arrow UDF (``pyspark.sql.functions.arrow_udf``, PySpark >= 4.1, an iterator of
    batches per task) rather than a pandas UDF: it is the only UDF form that hands the worker
    the Arrow arrays themselves, so an ``array<float>`` column becomes a 2-D array through its
    offsets and values (a pandas UDF makes one numpy object per row first) and the prediction
    goes back as one buffer. The UDF form is kept (rather than only ``mapInArrow``, which
    :func:`predict` uses) because it is what users of ``pyspark.ml.functions.predict_batch_udf``
    know: a column expression for ``withColumn``/``select``. Its output is one column (a struct
    for several outputs); :func:`predict` adds one top-level column per output.
    """
    quiet_known_notices()  # pyspark's pandas notice (duotf._verbosity)
    from pyspark.sql import functions

    if not hasattr(functions, "arrow_udf"):  # PySpark < 4.1
        raise ConfigError("predict_udf needs PySpark >= 4.1 (arrow_udf); with this PySpark use "
                          "duotf.spark.predict(df, model, ...), which needs only mapInArrow")
    from pyspark.sql import types as T

    source = scoring.model_source(model)
    loaded = scoring.get_model(source)  # once on the driver: the checks read its specs
    data_type = _data_type(return_type)
    types = _types_of(data_type, "prediction")
    if isinstance(data_type, T.StructType):
        outputs = scoring.output_columns(loaded, {c: c for c in types}, types)
    else:
        outputs = scoring.output_columns(loaded, "prediction", types)
    scoring.check_outputs(loaded, outputs)
    n_inputs = len(loaded.inputs) if loaded.inputs is not None else None
    plan = scoring.make_plan(source, loaded, tuple(str(i) for i in range(n_inputs or 1)), outputs,
                             batch_size)
    return PredictUDF(plan, loaded, data_type)


def _label(col, i: int) -> str:
    """The name a UDF argument shows in errors: a column name, or the argument's position."""
    import re

    if isinstance(col, str):
        return col
    found = re.fullmatch(r"Column<'(.*)'>", str(col))
    return found.group(1) if found else f"argument {i}"


_loads_frozen = 0  # the model loads of this Python worker when its heap was last frozen


def _settle_heap() -> None:
    """Keep pyspark's per-task garbage collection cheap once a model is loaded here.

    A reused Spark Python worker runs a full ``gc.collect()`` after every task (pyspark's
    ``daemon.py``). With TensorFlow, Keras and a model in the heap (~400,000 objects) that
    collection takes a good fraction of a second, which on a DataFrame of short tasks is the
    largest single cost of scoring. After each new model load this collects once
    and then moves every object into the permanent generation (``gc.freeze()``), which later
    collections skip: they then take microseconds. Objects frozen are still freed by reference
    counting; a model dropped from the cache since the last freeze is collected by the
    ``gc.unfreeze()`` + ``gc.collect()`` that precede the next freeze.
    """
    global _loads_frozen
    loads = sum(s["loads"] for s in scoring.cache_stats().values())
    if loads != _loads_frozen:
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        _loads_frozen = loads


def _udf_task(plan: scoring.Plan, labels: Dict[str, str], arrow_types, struct: bool):
    def run(iterator):  # an iterator of tuples of pa.Array -> one of pa.Array
        import pyarrow as pa
        from pyspark import TaskContext

        pid, pos = TaskContext.get().partitionId(), 0
        model = scoring.get_model(plan.source, task=True)  # once a task: one stat of the file
        _settle_heap()
        for arrays in iterator:
            arrays = arrays if isinstance(arrays, (tuple, list)) else (arrays,)
            batch = pa.RecordBatch.from_arrays(list(arrays), names=list(plan.columns))
            out = [a.cast(t) for a, t in zip(scoring.score_arrow(plan, batch, pid, pos, labels, model),
                                             arrow_types)]
            pos += len(batch)
            if struct:
                yield pa.StructArray.from_arrays(out, names=[c.column for c in plan.outputs])
            else:
                yield out[0]

    return run


def _check_column(df, name: str, tensors: Mapping[str, tuple]) -> None:
    from pyspark.sql import types as T

    if name not in df.columns:
        raise ConfigError(f"input column {name!r} is not in the DataFrame (its columns are "
                          f"{df.columns}): pass columns=[...] naming the model's input columns",
                          column=name)
    dt = df.schema[name].dataType
    if name in tensors:
        return
    if isinstance(dt, T.ArrayType) and dt.elementType.simpleString() in _NUMBERS:
        return
    if dt.simpleString() in _NUMBERS:
        return
    hint = ("pack it with duotf.spark.pack_tensors (or give an array<float> column)"
            if isinstance(dt, T.BinaryType) else
            "convert it first (ML vectors: pyspark.ml.functions.vector_to_array)"
            if "vector" in dt.simpleString() else "give a number or array<number> column")
    raise ConfigError(f"input column {name!r} is {dt.simpleString()}; a model input takes numbers: "
                      f"{hint}", column=name, type=dt.simpleString())


def predict(df: DataFrame, model: scoring.ModelRef, *, columns: Optional[Sequence[str]] = None,
            output: Union[str, Mapping[str, str]] = "prediction",
            return_type: Union[str, DataType, None] = None,
            batch_size: int = scoring.DEFAULT_BATCH_SIZE) -> DataFrame:
    """``df`` with prediction columns added, scored with ``mapInArrow`` (lazy, as any
    transformation: nothing runs until an action).

    ``columns`` names the input columns in the model's input order (default: the model's input
    names); ``output`` is the name of the prediction column, or ``{column: model output name}``
    for a model of several outputs (one column each); ``return_type`` (a type, or a struct DDL
    naming those columns) sets their types, by default double (long for integer outputs) for an
    output of one value a row and array<float> otherwise. ``model`` and ``batch_size`` are as
    for :func:`predict_udf`. Rows keep their order and partitions; every column of ``df`` stays.

    Checked on the driver with the DataFrame's schema before anything runs, each a
    :class:`~duotf.ConfigError` naming the column or path: a missing input column, one that is
    not numbers, an array or a packed tensor column (:func:`~duotf.spark.pack_tensors`), a
    model path that does not exist, output columns or types that do not fit the model's
    outputs, an output column that exists already.
    """
    quiet_known_notices()  # pyspark's pandas notice (duotf._verbosity)
    source = scoring.model_source(model)
    loaded = scoring.get_model(source)
    cols = scoring.input_columns(loaded, columns)
    types = None
    if return_type is not None:
        default = output if isinstance(output, str) else "prediction"
        types = _types_of(_data_type(return_type), default)
        if isinstance(output, str) and len(types) > 1:
            output = {c: c for c in types}
    outputs = scoring.output_columns(loaded, output, types)
    scoring.check_outputs(loaded, outputs)
    return predict_outputs(df, source, loaded, cols, outputs, batch_size)


def predict_outputs(df: DataFrame, source: scoring.ModelSource, loaded: scoring.Model,
                    cols: Sequence[str], outputs: Sequence[scoring.OutputColumn],
                    batch_size: int) -> DataFrame:
    """:func:`predict` once its outputs are resolved (the ML stage's way in, whose outputs may
    be a classifier's): the input columns and output names checked against ``df``'s schema,
    then ``mapInArrow``."""
    from pyspark.sql import types as T

    from duotf._transport.columns import tensor_specs

    tensors = tensor_specs(df.schema)
    for name in cols:
        _check_column(df, name, tensors)
    for col in outputs:
        if col.column in df.columns:
            raise ConfigError(f"output column {col.column!r} is already a column of the DataFrame: "
                              "name the prediction otherwise (output=...)", column=col.column)
    plan = scoring.make_plan(source, loaded, cols, outputs, batch_size, tensors)
    fields = [T.StructField(c.column, _data_type(c.type), False) for c in outputs]
    schema = T.StructType(list(df.schema.fields) + fields)
    return df.mapInArrow(_scorer(plan, [_arrow_type(c.type) for c in outputs]), schema)


def _scorer(plan: scoring.Plan, arrow_types: List[object]):
    def run(batches):
        import pyarrow as pa
        from pyspark import TaskContext

        pid, pos = TaskContext.get().partitionId(), 0
        model = scoring.get_model(plan.source, task=True)
        _settle_heap()
        for batch in batches:
            out = [a.cast(t) for a, t in zip(scoring.score_arrow(plan, batch, pid, pos, model=model),
                                             arrow_types)]
            pos += batch.num_rows
            yield pa.RecordBatch.from_arrays(list(batch.columns) + out,
                                             names=list(batch.schema.names) + [c.column for c in plan.outputs])

    return run
