"""Spark-only feed acceleration: tensor columns (:func:`pack_tensors`) and ready-to-send frames
cached in files on the executors (:func:`feed_cache`).

Spark hands ``array<float>`` columns to Arrow one value at a time; both functions take that cost
once instead of every epoch. Public names are re-exported by :mod:`duotf.spark`.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Union

from ..errors import ConfigError

__all__ = ["pack_tensors", "FeedCache", "CachedPartition", "feed_cache"]

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

    from ..feed.columns import TENSOR_KEY

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

        from ..feed import wire
        from ..feed.columns import concat_cols, from_arrow, num_rows

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
        from ..feed.wire import FileFrame

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

    from ..feed.columns import tensor_specs

    tensors = tensor_specs(df.schema)
    frames = (df.mapInArrow(_blocker(tensors, block_bytes), "n long, frame binary")
              .rdd.map(lambda row: (row.n, bytes(row.frame))))
    index = frames.mapPartitionsWithIndex(_spill(uuid.uuid4().hex[:16]))
    index.persist(StorageLevel.MEMORY_ONLY)
    parts = sorted(index.collect(), key=lambda part: part.pid)
    return FeedCache(index, frames, parts, list(df.columns))
