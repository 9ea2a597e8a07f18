"""Spark-only feed acceleration: tensor columns packed once (:func:`pack_tensors`), and ready-to-send
frames kept in files on the executors (:func:`feed_cache`, and a DataFrame fed several epochs,
converted in its first). Spark hands ``array<float>`` columns to Arrow one value at a time; both
take that cost once instead of every epoch. Public names are re-exported by :mod:`duotf.spark`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, BinaryIO, Dict, List, Optional, Sequence, Tuple, Union

from duotf._verbosity import quiet_known_notices
from duotf.errors import ConfigError
from duotf.backends.spark.tasks import (ERROR_COLUMN, arrow_batches, cached_files, error_json, guarded,
                                        raise_first)

if TYPE_CHECKING:  # pyspark is imported where it is used
    from pyspark import RDD
    from pyspark.sql import DataFrame

    from duotf._transport.wire import FileFrame

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


def pack_tensors(df: DataFrame, columns: Union[str, Sequence[str]], dtype: str = "float32") -> DataFrame:
    """A Spark DataFrame whose ``array<number>`` ``columns`` are packed as binary tensor columns.

    Each value becomes the raw bytes of a ``dtype`` array, and the column's metadata records
    dtype and shape, so the engine feed moves it out of the JVM as one buffer per batch and the
    node receives an ``(n, size)`` array of ``dtype`` with no per-value work. Spark turns
    ``array<float>`` into Arrow one element at a time, which bounds the feed at a fraction of
    memory speed: pack once, ``cache()`` the result, and feed it for every epoch. Every row of a
    column must hold the same number of values (the first row's); nulls are refused.
    """
    quiet_known_notices()  # pyspark's pandas notice (duotf._verbosity)
    import numpy as np
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from duotf._transport.columns import TENSOR_KEY

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


def arrow_source(df):
    """``(the DataFrame to read with mapInArrow, its tensor specs)``: ``df`` with its numeric
    array columns packed in the JVM (:func:`duotf.backends.spark.jvm.pack`, one memory copy a row instead of
    Spark's Arrow conversion of each element), their specs ``(dtype, None)`` beside those of
    its tensor columns; ``df`` itself where nothing is packed."""
    from duotf.backends.spark import jvm
    from duotf._transport.columns import tensor_specs

    packed, lists = jvm.pack(df)
    specs = tensor_specs(df.schema)
    specs.update({name: (dtype, None) for name, dtype in lists.items()})
    return packed, specs


def _frames(batches, tensors: Dict[str, tuple], block_bytes: int, ragged: Sequence[str] = ()):
    """``(rows, packed frame)`` of about ``block_bytes`` each from a partition's Arrow batches
    (small batches joined, large ones cut, as the feed cuts its frames); a
    :class:`~duotf.errors.FeedSchemaError` placed at its row of the partition where the feed
    refuses the data."""
    from pyspark import TaskContext

    from duotf.errors import FeedSchemaError
    from duotf._transport import wire
    from duotf._transport.columns import concat_cols, from_arrow, num_rows, split
    from duotf._transport.feeder import same_shapes

    def packed(parts):
        cols = concat_cols(parts)
        row_bytes = sum(v.nbytes // max(len(v), 1) if hasattr(v, "nbytes") else 64
                        for v in cols.values())
        for piece in split(cols, max(1, block_bytes // max(row_bytes, 1))):
            yield num_rows(piece), wire.pack_frame(piece)

    parts: list = []
    size, pos = 0, 0
    shapes: Dict[str, tuple] = {}
    pid = TaskContext.get().partitionId()  # type: ignore[union-attr]  # in a task: never None
    for batch in batches:
        if not batch.num_rows:
            continue
        try:
            cols = from_arrow(batch, tensors, ragged)
        except FeedSchemaError as exc:
            raise exc.located(pid, pos) from None
        same_shapes(cols, shapes, pid, pos)  # from one Arrow batch to the next too
        parts.append(cols)
        pos += batch.num_rows
        size += batch.nbytes
        if size >= block_bytes:
            yield from packed(parts)
            parts, size = [], 0
    if parts:
        yield from packed(parts)


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

    def open(self) -> Optional[Tuple[BinaryIO, List[FileFrame]]]:
        """The partition's frames as :class:`~duotf._transport.wire.FileFrame`, and the open file; or
        ``None`` where the file is not on this host (the task ran on another executor), or
        where the frames were not kept (no path)."""
        from duotf._transport.wire import FileFrame

        if not self.path:
            return None
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            return None
        return f, [FileFrame(rows, f, offset, length) for rows, offset, length in self.frames]

    def remove(self) -> bool:
        import os

        if not self.path:
            return False
        try:
            os.remove(self.path)
            removed = True
        except FileNotFoundError:
            removed = False
        try:
            os.rmdir(os.path.dirname(self.path))  # the cache's folder, once its last file is gone
        except OSError:
            pass
        return removed


INDEX_SCHEMA = f"pid long, host string, path string, frames string, rows long, {ERROR_COLUMN} string"


#: Free space a converting task leaves on its local disk: below this much, it stops keeping the
#: partition's frames (the partition is then read from the DataFrame again in later epochs).
#: The larger of the two: bytes, or a fraction of the disk.
MIN_FREE_BYTES, MIN_FREE_FRACTION = 1 << 30, 0.05


def _room(folder: str, need: int) -> bool:
    """Whether ``need`` more bytes leave the disk of ``folder`` above the floor."""
    import shutil

    usage = shutil.disk_usage(folder)
    return usage.free - need >= max(MIN_FREE_BYTES, MIN_FREE_FRACTION * usage.total)


def _keep(pid: int, frames, cache_id: str, job=None) -> dict:
    """Write a partition's packed ``frames`` (``(rows, bytes)``) to a file in this executor's
    local dir, and with ``job`` feed each to the nodes as it is written; return the partition's
    index entry (:data:`INDEX_SCHEMA`'s fields). A partition the feed refuses leaves no file:
    its entry carries the error instead. A disk that would fall below its floor
    (:data:`MIN_FREE_BYTES`, :data:`MIN_FREE_FRACTION`) stops the keeping, not the feeding: the
    file is removed and the entry has no path."""
    import os
    import socket
    import tempfile
    import uuid

    from duotf.errors import FeedSchemaError
    from duotf._transport import wire
    root = (os.environ.get("SPARK_LOCAL_DIRS") or tempfile.gettempdir()).split(",")[0]
    folder = os.path.join(root, f"duotf-feedcache-{cache_id}")
    path = os.path.join(folder, f"part-{pid:05d}-{uuid.uuid4().hex[:12]}")
    index, error, sent = [], None, 0
    for attempt in range(3):  # another task of this cache may remove the folder, emptied
        os.makedirs(folder, exist_ok=True)
        try:
            f = open(path, "wb")
            break
        except FileNotFoundError:
            if attempt == 2:
                raise
    keep = [True]

    def drop():
        os.remove(path)
        try:
            os.rmdir(folder)  # the cache's folder, once its last file is gone
        except OSError:
            pass

    def written():
        offset = 0
        for n, frame in frames:
            if keep[0] and job is not None and not _room(folder, len(frame) + 4096):
                keep[0] = False
                f.close()
                drop()
            if keep[0]:
                f.write(frame)
                index.append((n, offset, len(frame)))
                offset += len(frame)
                pad = -offset % 4096  # each frame starts a page: a node maps it where it lies
                f.write(bytes(pad))
                offset += pad
            yield wire.Packed(n, frame)

    try:
        if job is None:
            for _ in written():
                pass
        else:
            from duotf._transport.feeder import feed_train

            sent, error = guarded(lambda: feed_train(job, pid, written()))
    except FeedSchemaError as exc:
        error = error_json(exc)
    finally:
        if not f.closed:
            f.close()
    if (error or not keep[0]) and os.path.exists(path):
        drop()
    kept = keep[0] and not error
    return {"pid": pid, "host": socket.gethostname(), "path": path if kept else "",
            "frames": json.dumps(index if kept else []), "rows": sent or 0, ERROR_COLUMN: error}


def spiller(cache_id: str, tensors: Dict[str, tuple], block_bytes: int, ragged: Sequence[str],
             job=None):
    """A ``mapInArrow`` task: convert the partition into packed frames and keep them in a file
    in the executor's local dir, right there (:func:`_keep`); yield only where they lie (one
    small row), so no frame passes through the JVM. With ``job`` (the first epoch of
    ``cluster.train(df, epochs > 1)``), the frames are fed as they are written: the epoch's
    conversion is the cache's."""

    def run(batches):
        import pyarrow as pa
        from pyspark import TaskContext

        pid = TaskContext.get().partitionId()
        entry = _keep(pid, _frames(batches, tensors, block_bytes, ragged), cache_id, job)
        yield pa.RecordBatch.from_pydict({k: [v] for k, v in entry.items()})

    return run


def _row_frames(rows, ragged: Sequence[str], pid: int):
    """``(rows, packed frame)`` from an RDD partition's rows (or the other kinds
    :func:`duotf._transport.tasks.chunks_of` takes), checked and framed as the feed frames them (a
    chunk of rows at a time, cut at ``FRAME_BYTES``: a failing source has delivered the
    chunks before it); a refusal placed at its row of the partition."""
    from duotf.errors import FeedSchemaError
    from duotf._transport import wire
    from duotf._transport.columns import num_rows, split
    from duotf._transport.feeder import FRAME_BYTES, same_shapes
    from duotf._transport.tasks import chunks_of

    pos = 0
    shapes: Dict[str, tuple] = {}
    chunks = iter(chunks_of(rows, ragged))
    while True:
        try:
            cols = next(chunks)
        except StopIteration:
            return
        except FeedSchemaError as exc:
            raise exc.located(pid, pos) from None
        n = num_rows(cols)
        if not n:
            continue
        same_shapes(cols, shapes, pid, pos)
        pos += n
        row_bytes = sum(getattr(v, "nbytes", 64 * n) // n for v in cols.values())
        for part in split(cols, max(1, FRAME_BYTES // max(row_bytes, 1))):
            yield num_rows(part), wire.pack_frame(part)


def sweep_here(cache_id: str) -> None:
    """Delete what this host keeps of cache ``cache_id``: its folder in the local dir, and in
    Spark's block manager dirs beneath it (where the JVM writes its frames: ``blockmgr-*``, an
    executor's ``spark-*/executor-*/blockmgr-*``)."""
    import glob
    import os
    import shutil
    import tempfile

    root = (os.environ.get("SPARK_LOCAL_DIRS") or tempfile.gettempdir()).split(",")[0]
    name = f"duotf-feedcache-{cache_id}"
    for depth in range(4):
        for path in glob.glob(os.path.join(root, *["*"] * depth, name)):
            shutil.rmtree(path, ignore_errors=True)


def sweeper(cache_id: str):
    """A task that deletes what this executor keeps of cache ``cache_id`` (after a first epoch
    that failed: its tasks may have been cancelled before they could delete their files)."""

    def run(_):
        sweep_here(cache_id)
        yield 0

    return run


def rdd_spiller(cache_id: str, ragged: Sequence[str], job):
    """The RDD twin of :func:`spiller` with a job: an RDD partition's rows converted, fed and
    kept; yields the partition's index entry as a dict."""

    def run(index, rows):
        yield _keep(index, _row_frames(rows, ragged, index), cache_id, job)

    return run


def cached_partition(row):
    """The index entry of a partition: its CachedPartition (with no path where its frames were
    not kept), or its error JSON."""
    if row[ERROR_COLUMN]:
        return row[ERROR_COLUMN]
    return CachedPartition(row.pid, row.host, row.path, [tuple(f) for f in json.loads(row.frames)])


def teed_partition(row):
    """``(index entry, rows fed)`` of a partition of the first epoch of a DataFrame or RDD
    converted once (see :func:`_keep` with a job); ``row``: a Row or a dict."""
    get = row.get if isinstance(row, dict) else row.__getitem__
    if get(ERROR_COLUMN):
        return get(ERROR_COLUMN), 0
    part = CachedPartition(get("pid"), get("host"), get("path"),
                           [tuple(f) for f in json.loads(get("frames"))])
    return part, get("rows")


def arrow_cached_files(job, runs=None):
    """:func:`~duotf.backends.spark.tasks.cached_files` as a ``mapInArrow`` task over a DataFrame index (a Spark Connect
    session's, which has no RDD): each row of the partition a
    :class:`CachedPartition`; with ``runs``, the task of partition
    ``i`` of a ``range`` feeds ``runs[i]`` instead. Yields ``pid, rows, error`` rows."""
    feed = cached_files(job)

    def run(batches):
        import pyarrow as pa
        from pyspark import TaskContext

        if runs is None:
            parts = [teed_partition(row)[0] for batch in batches for row in batch.to_pylist()]
        else:  # the rows are the range's ids: this task's run is its partition's
            parts = runs[TaskContext.get().partitionId()]
            for _ in batches:
                pass
        out = list(feed(parts))
        yield pa.RecordBatch.from_pydict(
            {"pid": [p for p, _, _ in out], "rows": [r for _, r, _ in out],
             ERROR_COLUMN: [e for _, _, e in out]},
            schema=pa.schema([("pid", pa.int64()), ("rows", pa.int64()), (ERROR_COLUMN, pa.string())]))

    return run


def _remove_local(index, parts):
    yield sum(part.remove() for part in parts if isinstance(part, CachedPartition))


def _arrow_remove_local(batches):
    import pyarrow as pa

    parts = [teed_partition(row)[0] for batch in batches for row in batch.to_pylist()]
    yield pa.RecordBatch.from_pydict({"n": [sum(p.remove() for p in parts if isinstance(p, CachedPartition))]})


class JvmKept:
    """The JVM RDD that keeps the index of frames the JVM wrote (:func:`duotf.backends.spark.jvm.spill`), as
    :class:`FeedCache` releases what it keeps."""

    def __init__(self, jrdd):
        self.jrdd = jrdd

    def unpersist(self) -> None:
        release(self.jrdd)


class RddKept:
    """A PySpark RDD that keeps an index of kept frames (checkpointed locally), as
    :class:`FeedCache` releases what it keeps: its JVM RDD's blocks, without the warning."""

    def __init__(self, rdd):
        self.rdd = rdd

    def unpersist(self) -> None:
        release(self.rdd._jrdd.rdd())
        self.rdd.is_cached = False


def release(jrdd) -> None:
    """Drop the blocks of the locally checkpointed JVM RDD ``jrdd`` (Scala's), as its
    ``unpersist(False)`` does, without the warning that ``unpersist`` logs for such an RDD (that
    its lineage was truncated and cannot be recomputed: why duotf checkpointed it, and nothing
    reads it once its files are gone). ``SparkContext.unpersistRDD`` is Spark's own step of
    ``unpersist`` (Spark 3.5 to 4.3); a Spark without it gets ``unpersist``, warning and all."""
    try:
        jrdd.context().unpersistRDD(jrdd.id(), False)
    except Exception:  # noqa: BLE001 - py4j's error for a method this Spark lacks
        jrdd.unpersist(False)


class DataFrameKept:
    """A locally checkpointed DataFrame that keeps an index of kept frames (a Spark Connect
    session's, which has no RDD), as :class:`FeedCache` releases what it keeps."""

    def __init__(self, df):
        self.df = df

    def unpersist(self) -> None:
        self.df.unpersist()


class FeedCache:
    """A Spark DataFrame turned into ready-to-send feed frames, held in files on the executors
    (see :func:`feed_cache`). Pass it to ``cluster.train`` instead of the DataFrame."""

    def __init__(self, index: Union[RDD, DataFrame], df: Union[DataFrame, RDD],
                 parts: List[CachedPartition], columns: List[str],
                 kept: Union[RDD, JvmKept, DataFrameKept, None] = None):
        # one CachedPartition per partition, kept in executor memory (None once unpersisted):
        # an RDD of them, or (Spark Connect) a locally checkpointed DataFrame of index rows
        self.index: Optional[Union[RDD, DataFrame]] = index
        holder = kept if kept is not None else index  # the RDD whose blocks hold them
        self.kept: Union[RddKept, JvmKept, DataFrameKept, DataFrame] = \
            RddKept(holder) if hasattr(holder, "_jrdd") else holder
        self.df = df  # what a partition whose file is on another host is fed from
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
            if hasattr(self.index, "mapInArrow"):  # a DataFrame index (Spark Connect)
                self.index.mapInArrow(_arrow_remove_local, "n long").collect()
            else:
                self.index.mapPartitionsWithIndex(_remove_local).collect()
        finally:
            for part in self.parts:  # the files on the driver's own host (local mode)
                part.remove()
            self.kept.unpersist()
            self.index = None

    def __repr__(self) -> str:
        return (f"FeedCache({self.rows} rows in {len(self.parts)} partitions, "
                f"columns={self.columns})")


def feed_cache(df: DataFrame, *, block_bytes: int = 4 << 20, ragged: Sequence[str] = ()) -> FeedCache:
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

    Data is checked as for ``cluster.train(df)``: a null, or an array column whose rows differ
    in length and is not in ``ragged``, raises a :class:`~duotf.errors.FeedSchemaError` here
    (and no file is kept); columns in ``ragged`` are cached as ragged columns.
    """
    quiet_known_notices()  # pyspark's pandas notice (duotf._verbosity)
    import uuid

    from pyspark import StorageLevel

    from duotf._transport.columns import ragged_columns

    from duotf.backends.spark.client import is_connect

    source, tensors = arrow_source(df)
    spill = spiller(uuid.uuid4().hex[:16], tensors, block_bytes, ragged_columns(ragged))
    kept: Optional[DataFrameKept] = None
    if is_connect(df):  # no RDD: the index a DataFrame, made once and kept where it was made
        with arrow_batches(df.sparkSession):
            index = source.mapInArrow(spill, INDEX_SCHEMA).localCheckpoint(eager=True)
            collected = [cached_partition(row) for row in index.collect()]
        kept = DataFrameKept(index)
    else:
        index = source.mapInArrow(spill, INDEX_SCHEMA).rdd.map(cached_partition)
        index.persist(StorageLevel.MEMORY_ONLY)
        with arrow_batches(getattr(df, "sparkSession", None)):
            collected = index.collect()
    parts = sorted((p for p in collected if isinstance(p, CachedPartition)), key=lambda part: part.pid)
    cache = FeedCache(index, df, parts, list(df.columns), kept=kept)
    errors = sorted((e for e in collected if isinstance(e, str)), key=lambda e: json.loads(e)["partition"])
    if errors:
        cache.unpersist()
        raise_first(errors)
    return cache

