"""Spark and Dask DataFrames to TFRecord files of ``tf.train.Example`` (one file per partition)
and back, over any fsspec URL. Files written from Spark read into Dask as the same rows, and the
other way round.

Column types map to features as follows (``list`` = Spark ``array<...>`` / a Python list):

========================  ============  =========================  ==================
Spark                     feature       Spark on read              pandas on read
========================  ============  =========================  ==================
long/int/short/byte/bool  int64_list    long                       int64 (Int64 if nullable)
float/double              float_list    float (TF stores float32)  float32 (Float32 if nullable)
string                    bytes_list    string                     object (str)
binary                    bytes_list    binary (or string)         object (bytes or str)
========================  ============  =========================  ==================
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence, Union

from ..errors import ConfigError
from .example import Field, Schema, example_to_row, infer_schema, row_to_example
from .files import expand, filesystem
from .tfrecord import TFRecordReader, TFRecordWriter, resolve_compression

__all__ = [
    "spark_to_tfrecords", "tfrecords_to_spark", "dask_to_tfrecords", "tfrecords_to_dask",
    "infer_tfrecord_schema", "write_partition", "read_rows", "pack_tensors", "FeedCache", "feed_cache",
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


def read_rows(url: str, schema: Schema, compression: Optional[str] = "infer",
              skip_corrupt: bool = False, storage_options: Optional[dict] = None) -> List[dict]:
    reader = TFRecordReader(url, compression, skip_corrupt=skip_corrupt, storage_options=storage_options)
    return [example_to_row(r, schema) for batch in reader.batches() for r in batch]


def infer_tfrecord_schema(urls, limit: Optional[int] = 1000, bytes_as: str = "bytes",
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


def spark_to_tfrecords(df, url: str, *, compression: Optional[str] = None, mode: str = "error",
                       storage_options: Optional[dict] = None) -> List[str]:
    """Write a Spark DataFrame as TFRecord files, one per partition; return their URLs."""
    schema = [_field_from_spark(f) for f in df.schema.fields]
    codec = resolve_compression(compression)
    _prepare_dir(url, mode, storage_options)
    bools = {f.name for f in df.schema.fields if f.dataType.simpleString() == "boolean"}

    def write(index, rows):
        def as_dicts():
            for row in rows:
                d = row.asDict()
                for name in bools:
                    if d[name] is not None:
                        d[name] = int(d[name])
                yield d

        yield write_partition(as_dicts(), url, index, schema, codec, storage_options)

    return sorted(df.rdd.mapPartitionsWithIndex(write).collect())


def tfrecords_to_spark(spark, urls, *, schema: Optional[Schema] = None, bytes_as: str = "bytes",
                       infer_limit: Optional[int] = 1000, compression: Optional[str] = "infer",
                       skip_corrupt: bool = False, storage_options: Optional[dict] = None):
    """Read TFRecord files of Examples as a Spark DataFrame (one partition per file)."""
    files = expand(urls, storage_options)
    if schema is None:
        schema = infer_tfrecord_schema(files, infer_limit, bytes_as, compression, storage_options)
    sc = getattr(spark, "sparkContext", spark)

    def read(url):
        return read_rows(url, schema, compression, skip_corrupt, storage_options)

    rdd = sc.parallelize(files, len(files)).flatMap(read).map(lambda d: tuple(d[f.name] for f in schema))
    from pyspark.sql import SparkSession

    session = spark if isinstance(spark, SparkSession) else SparkSession(sc)
    return session.createDataFrame(rdd, to_spark_schema(schema))


# -- tensor columns (the fast engine feed) -----------------------------------------------------
_NUMERIC = {"float", "double", "byte", "short", "int", "bigint", "tinyint", "smallint", "long"}


def _packer(names: Sequence[str], dtype: str, widths: Dict[str, int]):
    def pack(batches):
        import numpy as np
        import pyarrow as pa

        for batch in batches:
            arrays = []
            for name, column in zip(batch.schema.names, batch.columns):
                if name not in widths:
                    arrays.append(column)
                    continue
                n, width = len(column), widths[name]
                if column.null_count:
                    raise ValueError(f"pack_tensors: column {name!r} has a null row; fill or drop it")
                sizes = np.diff(column.offsets.to_numpy())
                bad = np.flatnonzero(sizes != width)
                if bad.size:
                    raise ValueError(f"pack_tensors: column {name!r} has a row of {int(sizes[bad[0]])} "
                                     f"values where the first row has {width}: a tensor column "
                                     "needs the same shape in every row")
                values = np.ascontiguousarray(column.flatten().to_numpy(zero_copy_only=False), dtype=dtype)
                nbytes = values.nbytes
                if nbytes >= 1 << 31:
                    raise ValueError("pack_tensors: an Arrow batch over 2 GiB; lower "
                                     "spark.sql.execution.arrow.maxRecordsPerBatch")
                offsets = (np.arange(n + 1, dtype=np.int64) * (width * values.itemsize)).astype(np.int32)
                arrays.append(pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                                     pa.py_buffer(values)]))
            yield pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)

    return pack


def pack_tensors(df, columns: Union[str, Sequence[str]], dtype: str = "float32"):
    """A Spark DataFrame whose ``array<number>`` ``columns`` are packed as binary tensor columns.

    Each value becomes the raw bytes of a ``dtype`` array, and the column's metadata records
    dtype and shape, so the engine feed moves it out of the JVM as one buffer per batch and the
    node receives an ``(n, size)`` array of ``dtype`` with no per-value work. Spark turns
    ``array<float>`` into Arrow one element at a time, which bounds the feed at a fraction of
    memory speed: pack once, ``cache()`` the result, and feed it for every epoch. Every row of a
    column must hold the same number of values (the first row's); nulls are refused.
    """
    import numpy as np
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from .columns import TENSOR_KEY

    names = [columns] if isinstance(columns, str) else list(columns)
    np.dtype(dtype)  # a clear error for an unknown dtype, here rather than in a task
    for name in names:
        if name not in df.columns:
            raise ConfigError(f"pack_tensors: no column {name!r} (the DataFrame has {df.columns})")
        field = df.schema[name]
        if not (isinstance(field.dataType, T.ArrayType)
                and field.dataType.elementType.simpleString() in _NUMERIC):
            raise ConfigError(f"pack_tensors: column {name!r} is {field.dataType.simpleString()}; "
                              "it must be an array of numbers (use pyspark.ml.functions."
                              "vector_to_array for ML vectors)")
    first = df.select(*[F.size(n).alias(n) for n in names]).head()
    if first is None:
        raise ConfigError("pack_tensors: the DataFrame is empty")
    widths = {n: int(first[n]) if first[n] is not None else -1 for n in names}
    for name, width in widths.items():
        if width < 0:
            raise ConfigError(f"pack_tensors: column {name!r} is null in the first row")
    fields = [T.StructField(f.name, T.BinaryType(), False) if f.name in widths else f
              for f in df.schema.fields]
    packed = df.mapInArrow(_packer(names, dtype, widths), T.StructType(fields))
    for name in names:
        packed = packed.withMetadata(name, {TENSOR_KEY: {"dtype": np.dtype(dtype).name,
                                                         "shape": [widths[name]]}})
    return packed


def _blocker(tensors: Dict[str, tuple], block_bytes: int):
    def make(batches):
        import pyarrow as pa

        from . import wire
        from .columns import concat_cols, from_arrow, num_rows

        def frame(parts):
            cols = concat_cols(parts)
            return pa.RecordBatch.from_pydict({"n": [num_rows(cols)], "frame": [wire.pack_frame(cols)]},
                                              schema=pa.schema([("n", pa.int64()), ("frame", pa.binary())]))

        parts, size = [], 0
        for batch in batches:
            if not batch.num_rows:
                continue
            parts.append(from_arrow(batch, tensors))
            size += batch.nbytes
            if size >= block_bytes:
                yield frame(parts)
                parts, size = [], 0
        if parts:
            yield frame(parts)

    return make


class CachedPartition:
    """Where one partition of a :class:`FeedCache` lies: a file of packed frames on one host."""

    def __init__(self, pid: int, host: str, path: str, frames: List[tuple]):
        self.pid = pid
        self.host = host
        self.path = path
        self.frames = frames  # (rows, offset, length) of every frame in the file

    @property
    def rows(self) -> int:
        return sum(rows for rows, _, _ in self.frames)

    def open(self):
        """The partition's frames as :class:`~duotf.feed.wire.FileFrame`, and the open file; or
        ``None`` where the file is not on this host (the task ran on another executor)."""
        from .wire import FileFrame

        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            return None
        return f, [FileFrame(rows, f, offset, length) for rows, offset, length in self.frames]

    def remove(self) -> bool:
        import os

        try:
            os.remove(self.path)
        except FileNotFoundError:
            return False
        try:
            os.rmdir(os.path.dirname(self.path))  # the cache's folder, once its last file is gone
        except OSError:
            pass
        return True


def _spill(cache_id: str):
    """Write a partition's packed frames to a file in the executor's local dir; return where."""

    def run(pid, frames):
        import os
        import socket
        import tempfile
        import uuid

        root = (os.environ.get("SPARK_LOCAL_DIRS") or tempfile.gettempdir()).split(",")[0]
        folder = os.path.join(root, f"duotf-feedcache-{cache_id}")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"part-{pid:05d}-{uuid.uuid4().hex[:12]}")
        index, offset = [], 0
        with open(path, "wb") as f:
            for n, frame in frames:
                f.write(frame)
                index.append((n, offset, len(frame)))
                offset += len(frame)
                pad = -offset % 4096  # each frame starts a page: a node maps it where it lies
                f.write(bytes(pad))
                offset += pad
        yield CachedPartition(pid, socket.gethostname(), path, index)

    return run


def _remove_local(index, parts):
    yield sum(part.remove() for part in parts)


class FeedCache:
    """A Spark DataFrame turned into ready-to-send feed frames, held in files on the executors
    (see :func:`feed_cache`). Pass it to ``cluster.train`` instead of the DataFrame."""

    def __init__(self, index, frames, parts: List[CachedPartition], columns: List[str]):
        self.index = index  # RDD: one CachedPartition per partition, kept in executor memory
        self.frames = frames  # RDD of (rows, packed frame) computed from the DataFrame again
        self.parts = parts
        self.columns = columns

    @property
    def counts(self) -> List[int]:
        return [part.rows for part in self.parts]

    @property
    def rows(self) -> int:
        return sum(self.counts)

    def unpersist(self) -> None:
        """Delete the cached files now (Spark deletes its executors' local dirs, and with them
        any file left, when the application ends). Idempotent."""
        if self.index is None:
            return
        try:
            self.index.mapPartitionsWithIndex(_remove_local).collect()
        finally:
            for part in self.parts:  # the files on the driver's own host (local mode)
                part.remove()
            self.index.unpersist()
            self.index = None

    def __repr__(self) -> str:
        return (f"FeedCache({self.rows} rows in {len(self.parts)} partitions, "
                f"columns={self.columns})")


def feed_cache(df, *, block_bytes: int = 4 << 20) -> FeedCache:
    """Convert ``df`` once into ready-to-send feed frames, kept in files on the executors, for
    training.

    Every epoch of ``cluster.train(cache, epochs)`` then hands each cached frame to the socket
    with ``sendfile``: the data does not pass through the JVM or a Python worker, and there is
    no Arrow conversion, no per-row or per-value work and no counting pass. Array columns become
    2-D arrays and tensor columns (:func:`pack_tensors`) their own shape, as in the DataFrame
    feed. Each partition's frames go to one file in the local dir of the executor that
    converted it (``spark.local.dir``), and a small index of where they lie stays in that
    executor's memory, so Spark runs the partition's feeding task there. A task that runs on
    another host (the executor was busy or lost) is fed from the DataFrame instead. Costs about
    the DataFrame's size in local disk (in the page cache while memory lasts). Call
    ``unpersist()`` when done.
    """
    import uuid

    from pyspark import StorageLevel

    from .columns import tensor_specs

    tensors = tensor_specs(df.schema)
    frames = (df.mapInArrow(_blocker(tensors, block_bytes), "n long, frame binary")
              .rdd.map(lambda row: (row.n, bytes(row.frame))))
    index = frames.mapPartitionsWithIndex(_spill(uuid.uuid4().hex[:16]))
    index.persist(StorageLevel.MEMORY_ONLY)
    parts = sorted(index.collect(), key=lambda part: part.pid)
    return FeedCache(index, frames, parts, list(df.columns))


# -- Dask -------------------------------------------------------------------------------------
def _field_from_pandas(name: str, dtype, sample) -> Field:
    import pandas as pd

    kind_char = getattr(dtype, "kind", "O")
    if pd.api.types.is_bool_dtype(dtype) or pd.api.types.is_integer_dtype(dtype):
        return Field(name, "int64", nullable=pd.api.types.is_extension_array_dtype(dtype))
    if pd.api.types.is_float_dtype(dtype):
        return Field(name, "float", nullable=True)
    if kind_char == "O" or pd.api.types.is_string_dtype(dtype):
        values = [v for v in sample if v is not None]
        first = values[0] if values else ""
        if isinstance(first, (bytes, bytearray)):
            return Field(name, "bytes")
        if isinstance(first, str):
            return Field(name, "string")
        if hasattr(first, "__iter__"):
            inner = [x for v in values for x in v]
            if all(isinstance(x, (int,)) or getattr(getattr(x, "dtype", None), "kind", "") in "iu"
                   for x in inner) and inner:
                return Field(name, "int64", is_list=True)
            if inner and isinstance(inner[0], (bytes, bytearray)):
                return Field(name, "bytes", is_list=True)
            if inner and isinstance(inner[0], str):
                return Field(name, "string", is_list=True)
            return Field(name, "float", is_list=True)
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
        else:
            data[f.name] = pd.Series(values, dtype="Float32" if f.nullable else "float32")
    return pd.DataFrame(data, columns=[f.name for f in schema])


def dask_to_tfrecords(ddf, url: str, *, compression: Optional[str] = None, mode: str = "error",
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


def tfrecords_to_dask(urls, *, schema: Optional[Schema] = None, bytes_as: str = "bytes",
                      infer_limit: Optional[int] = 1000, compression: Optional[str] = "infer",
                      skip_corrupt: bool = False, storage_options: Optional[dict] = None):
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
