"""Spark and Dask DataFrames to TFRecord files of ``tf.train.Example`` (one file per partition)
and back, over any fsspec URL. Files written from Spark read into Dask as the same rows, and the
other way round. Spark's functions run ``mapInArrow`` tasks: the same on a classic session and
on a Spark Connect one.

Column types map to features as follows (``list`` = Spark ``array<...>`` / a Python list):

========================  ============  =========================  ==================
Spark                     feature       Spark on read              pandas on read
========================  ============  =========================  ==================
long/int/short/byte/bool  int64_list    long                       int64 (Int64 if nullable)
float/double              float_list    float (TF stores float32)  float32 (Float32 if nullable)
string                    bytes_list    string                     object (str)
binary                    bytes_list    binary (or string)         object (bytes or str)
========================  ============  =========================  ==================

Values keep their meaning both ways: a null (None, ``pd.NA``) is an absent feature and reads back
as a null; NaN and +/-inf are float values and stay NaN and +/-inf (also in a nullable Float32
column, where a null is ``pd.NA``); an empty list is an empty feature and reads back as an empty
list. A null inside a list cannot be written. Doubles are stored as float32 (TF's only float).

Reading types come from, in order: ``schema=`` (a list of :class:`Field`, or for
:func:`tfrecords_to_spark` the Spark ``StructType`` the data was written from, which gives back
its exact column types: int, boolean, double...), else inference over ``infer_limit`` records
(see :func:`duotf.io.example.infer_schema`: a list column empty in every sampled record reads as
the kind its empty lists were written with, float where they name none).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Iterable, Iterator, List, Optional, Sequence, Union, cast

from duotf.errors import ConfigError, SchemaMismatchError
from duotf.io.example import (Field, Schema, example_to_row, infer_schema, is_null, numpy_kind, row_to_example)
from duotf.io.files import expand, filesystem
from duotf.io.tfrecord import TFRecordReader, TFRecordWriter, resolve_compression

if TYPE_CHECKING:  # the engines are imported where they are used
    import dask.dataframe as dd
    from pyspark import SparkContext
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = [
    "spark_to_tfrecords", "tfrecords_to_spark", "dask_to_tfrecords", "tfrecords_to_dask",
    "infer_tfrecord_schema", "write_partition", "read_rows", "iter_rows",
]

_SUFFIX = {"NONE": ".tfrecord", "GZIP": ".tfrecord.gz", "ZLIB": ".tfrecord.zlib"}


def _prepare_dir(url: str, mode: str, storage_options: Optional[dict]) -> None:
    fs, path = filesystem(url, storage_options)
    if fs.exists(path) and fs.ls(path):
        if mode == "overwrite":
            fs.rm(path, recursive=True)
        elif mode != "append":
            raise ConfigError(f"{url} exists and is not empty; pass mode='overwrite' or 'append'")
    fs.makedirs(path, exist_ok=True)


def write_partition(rows: Iterable[dict], url: str, index: int, schema: Schema,
                    compression: str, storage_options: Optional[dict]) -> str:
    """Write one partition's rows as ``part-NNNNN.tfrecord[.gz]`` under ``url``; return its URL."""
    target = f"{url.rstrip('/')}/part-{index:05d}{_SUFFIX[compression]}"
    with TFRecordWriter(target, compression, storage_options=storage_options) as writer:
        for row in rows:
            writer.write(row_to_example(row, schema))
    return target


def iter_rows(url: str, schema: Schema, compression: Optional[str] = "infer",
              skip_corrupt: bool = False, storage_options: Optional[dict] = None) -> Iterator[dict]:
    """The rows of one TFRecord file as they are read: a Spark task holds one batch of records
    at a time, not the file's rows (as Python objects, several times the file's size)."""
    reader = TFRecordReader(url, compression, skip_corrupt=skip_corrupt, storage_options=storage_options)
    for batch in reader.batches():
        for record in batch:
            yield example_to_row(record, schema)


def read_rows(url: str, schema: Schema, compression: Optional[str] = "infer",
              skip_corrupt: bool = False, storage_options: Optional[dict] = None) -> List[dict]:
    """Every row of the TFRecord file(s) at ``url`` as a list: :func:`iter_rows` read whole,
    for data that fits in memory."""
    return list(iter_rows(url, schema, compression, skip_corrupt, storage_options))


def infer_tfrecord_schema(urls: Union[str, Sequence[str]], limit: Optional[int] = 1000,
                          bytes_as: Union[str, Dict[str, str]] = "bytes",
                          compression: Optional[str] = "infer",
                          storage_options: Optional[dict] = None) -> Schema:
    """Infer a schema from up to ``limit`` records, taken across the files in turn."""
    files = expand(urls, storage_options)
    per_file = None if limit is None else max(1, -(-limit // len(files)))

    def sample():
        for f in files:
            for i, record in enumerate(TFRecordReader(f, compression, storage_options=storage_options)):
                if per_file is not None and i >= per_file:
                    break
                yield record

    return infer_schema(sample(), limit=limit, bytes_as=bytes_as)


# -- Spark ------------------------------------------------------------------------------------
def _field_from_spark(field) -> Field:
    from pyspark.sql import types as T

    dtype, is_list = field.dataType, False
    if isinstance(dtype, T.ArrayType):
        dtype, is_list = dtype.elementType, True
    if isinstance(dtype, (T.LongType, T.IntegerType, T.ShortType, T.ByteType, T.BooleanType)):
        kind = "int64"
    elif isinstance(dtype, (T.FloatType, T.DoubleType)):
        kind = "float"
    elif isinstance(dtype, T.StringType):
        kind = "string"
    elif isinstance(dtype, T.BinaryType):
        kind = "bytes"
    else:
        raise ConfigError(
            f"column {field.name!r} has type {field.dataType.simpleString()}, which has no "
            "tf.train.Example feature; cast it to long, double, string, binary or an array of those"
        )
    return Field(field.name, kind, is_list=is_list, nullable=field.nullable)


def to_spark_schema(schema: Schema):
    from pyspark.sql import types as T

    atoms = {"int64": T.LongType(), "float": T.FloatType(), "string": T.StringType(),
             "bytes": T.BinaryType()}
    return T.StructType([
        T.StructField(f.name, T.ArrayType(atoms[f.kind], containsNull=False) if f.is_list
                      else atoms[f.kind], nullable=f.nullable)
        for f in schema
    ])


def _partition() -> int:
    """The partition of the Spark task this runs in."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise RuntimeError("not in a Spark task: a partition's function runs in one")
    return context.partitionId()


def spark_to_tfrecords(df: DataFrame, url: str, *, compression: Optional[str] = None, mode: str = "error",
                       storage_options: Optional[dict] = None) -> List[str]:
    """Write a Spark DataFrame as TFRecord files, one per partition; return their URLs.

    ``df`` may be a classic DataFrame or a Spark Connect one: each partition is written by a
    ``mapInArrow`` task (an empty partition writes an empty file).
    """
    schema = [_field_from_spark(f) for f in df.schema.fields]
    codec = resolve_compression(compression)
    _prepare_dir(url, mode, storage_options)

    def write(batches):
        import pyarrow as pa

        # the partition's rows one Arrow batch at a time, as Row.asDict() gives them: bools,
        # lists, bytes, None for a null (booleans are written as int64 0/1)
        rows = (row for batch in batches for row in batch.to_pylist())
        index = _partition()
        target = write_partition(rows, url, index, schema, codec, storage_options)
        yield pa.RecordBatch.from_pydict({"url": [target]}, schema=pa.schema([("url", pa.string())]))

    return sorted(row.url for row in df.mapInArrow(write, "url string").collect())


def _spark_converter(schema, struct):
    """A function turning a read row (a dict) into a tuple of the types of ``struct``: booleans
    come back from their int64 0/1; every other type takes the value as read."""
    from pyspark.sql import types as T

    def is_bool(dtype):
        dtype = dtype.elementType if isinstance(dtype, T.ArrayType) else dtype
        return isinstance(dtype, T.BooleanType)

    names = [f.name for f in schema]
    bools = {f.name for f in struct.fields if is_bool(f.dataType)}

    def convert(row):
        for name in bools:
            value = row[name]
            if isinstance(value, list):
                row[name] = [bool(x) for x in value]
            elif value is not None:
                row[name] = bool(value)
        return tuple(row[name] for name in names)

    return convert


def _arrow_batch(rows: List[tuple], arrow_schema, url: str):
    """One Arrow record batch of ``rows`` (tuples in the order of ``arrow_schema``). A value its
    column's type cannot hold (300 in a byte column) raises :class:`SchemaMismatchError` naming
    the column, the value and the file."""
    import pyarrow as pa

    try:
        return pa.RecordBatch.from_struct_array(pa.array(rows, type=pa.struct(list(arrow_schema))))
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        for i, field in enumerate(arrow_schema):
            for row in rows:
                try:
                    pa.array([row[i]], type=field.type)
                except (pa.ArrowInvalid, pa.ArrowTypeError) as why:
                    raise SchemaMismatchError(
                        f"column {field.name!r} ({field.type}) of {url} cannot hold {row[i]!r}: "
                        f"{why}; read it as a wider type (long, double)",
                        column=field.name, expected=str(field.type), value=row[i]) from exc
        raise


def _session(spark: Union[SparkSession, SparkContext]) -> SparkSession:
    """``spark`` itself when it is a SparkSession (classic or Connect), else a classic session of
    the SparkContext ``spark``."""
    if hasattr(spark, "createDataFrame"):  # a session; Connect's is no classic SparkSession
        return cast("SparkSession", spark)
    from pyspark.sql import SparkSession

    return SparkSession(spark)


def tfrecords_to_spark(spark: Union[SparkSession, SparkContext], urls: Union[str, Sequence[str]], *,
                       schema: Union[Schema, StructType, None] = None,
                       bytes_as: Union[str, Dict[str, str]] = "bytes",
                       infer_limit: Optional[int] = 1000, compression: Optional[str] = "infer",
                       skip_corrupt: bool = False, storage_options: Optional[dict] = None) -> DataFrame:
    """Read TFRecord files of Examples as a Spark DataFrame (one partition per file).

    ``spark``: a SparkSession (classic or Spark Connect) or a SparkContext. Task ``i`` of a
    ``mapInArrow`` over ``range`` reads file ``i``, handing Spark its rows as they are read: an
    Arrow batch for each batch of records the reader reads (about 1 MiB of them).

    ``schema``: a list of :class:`Field`, or a Spark ``StructType`` (such as the ``df.schema``
    the files were written from): its columns come back with exactly those types.
    """
    files = expand(urls, storage_options)
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import to_arrow_schema

    struct = None
    if isinstance(schema, T.StructType):
        struct, schema = schema, [_field_from_spark(f) for f in schema.fields]
    elif schema is None:
        schema = infer_tfrecord_schema(files, infer_limit, bytes_as, compression, storage_options)
    if struct is None:
        struct = to_spark_schema(schema)
    convert = _spark_converter(schema, struct)
    arrow_schema = to_arrow_schema(struct)

    def read(batches):
        for _ in batches:  # the range's one row: which file is this task's is its partition
            pass
        url = files[_partition()]
        reader = TFRecordReader(url, compression, skip_corrupt=skip_corrupt, storage_options=storage_options)
        for records in reader.batches():  # about 1 MiB of records: never the file's rows at once
            yield _arrow_batch([convert(example_to_row(r, schema)) for r in records], arrow_schema, url)

    n = len(files)
    return _session(spark).range(0, n, 1, n).mapInArrow(read, struct)


# -- Dask -------------------------------------------------------------------------------------
def _field_from_pandas(name: str, dtype, sample) -> Field:
    import pandas as pd

    kind_char = getattr(dtype, "kind", "O")
    if pd.api.types.is_bool_dtype(dtype) or pd.api.types.is_integer_dtype(dtype):
        return Field(name, "int64", nullable=pd.api.types.is_extension_array_dtype(dtype))
    if pd.api.types.is_float_dtype(dtype):
        return Field(name, "float", nullable=True)
    if kind_char == "O" or pd.api.types.is_string_dtype(dtype):
        # a missing value: None, pd.NA, or NaN (how pandas' str dtype spells a missing string)
        values = [v for v in sample if not is_null(v) and not (isinstance(v, float) and v != v)]
        first = values[0] if values else ""
        if isinstance(first, (bytes, bytearray)):
            return Field(name, "bytes")
        if isinstance(first, str):
            return Field(name, "string")
        if hasattr(first, "__iter__"):
            inner = [x for v in values for x in v]
            # ints (bools too) only: a float 2.0 is not an int (nor is anything without a dtype)
            if inner and all(isinstance(x, int) or numpy_kind(x) in ("i", "u", "b") for x in inner):
                return Field(name, "int64", is_list=True)
            if inner and isinstance(inner[0], (bytes, bytearray)):
                return Field(name, "bytes", is_list=True)
            if inner and isinstance(inner[0], str):
                return Field(name, "string", is_list=True)
            return Field(name, "float", is_list=True)  # floats, or lists empty in the sample
    raise ConfigError(f"column {name!r} has dtype {dtype}, which has no tf.train.Example feature")


def _pandas_frame(rows: List[dict], schema: Schema):
    import pandas as pd

    data = {}
    for f in schema:
        values = [r[f.name] for r in rows]
        if f.is_list or f.kind in ("bytes", "string"):
            data[f.name] = pd.Series(values, dtype=object)
        elif f.kind == "int64":
            data[f.name] = pd.Series(values, dtype="Int64" if f.nullable else "int64")
        elif f.nullable:  # NaN is a value, a null is masked: pandas would turn NaN into NA
            import numpy as np

            mask = np.array([v is None for v in values], dtype=bool)
            floats = np.array([0.0 if v is None else v for v in values], dtype=np.float32)
            data[f.name] = pd.Series(pd.arrays.FloatingArray(floats, mask))
        else:
            data[f.name] = pd.Series(values, dtype="float32")
    return pd.DataFrame(data, columns=[f.name for f in schema])


def dask_to_tfrecords(ddf: dd.DataFrame, url: str, *, compression: Optional[str] = None, mode: str = "error",
                      schema: Optional[Schema] = None, storage_options: Optional[dict] = None) -> List[str]:
    """Write a Dask DataFrame as TFRecord files, one per partition; return their URLs."""
    import dask

    if schema is None:
        head = ddf.get_partition(0).head(100, compute=True)
        schema = [_field_from_pandas(c, ddf.dtypes[c], list(head[c])) for c in ddf.columns]
    codec = resolve_compression(compression)
    _prepare_dir(url, mode, storage_options)

    def write(pdf, index):
        return write_partition(pdf.to_dict("records"), url, index, schema, codec, storage_options)

    tasks = [dask.delayed(write)(part, i) for i, part in enumerate(ddf.to_delayed())]
    return sorted(dask.compute(*tasks))


def tfrecords_to_dask(urls: Union[str, Sequence[str]], *, schema: Optional[Schema] = None,
                      bytes_as: Union[str, Dict[str, str]] = "bytes",
                      infer_limit: Optional[int] = 1000, compression: Optional[str] = "infer",
                      skip_corrupt: bool = False, storage_options: Optional[dict] = None) -> dd.DataFrame:
    """Read TFRecord files of Examples as a Dask DataFrame (one partition per file)."""
    import dask
    import dask.dataframe as dd

    files = expand(urls, storage_options)
    if schema is None:
        schema = infer_tfrecord_schema(files, infer_limit, bytes_as, compression, storage_options)

    def load(url):
        return _pandas_frame(read_rows(url, schema, compression, skip_corrupt, storage_options), schema)

    # Binary and list columns are Python objects; Dask's default Arrow-string conversion would
    # try to decode bytes as text.
    with dask.config.set({"dataframe.convert-string": False}):
        return dd.from_map(load, files, meta=_pandas_frame([], schema), enforce_metadata=False)
