"""The Spark backend's feed: its :class:`SparkFeed` adapter and the code of its feeding tasks,
and Spark-only feed acceleration: tensor columns (:func:`pack_tensors`) and ready-to-send frames
cached in files on the executors (:func:`feed_cache`).

Spark hands ``array<float>`` columns to Arrow one value at a time; both functions take that cost
once instead of every epoch. Public names are re-exported by :mod:`duotf.spark`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from typing import Dict, List, Optional, Sequence, Union

from duotf.errors import ConfigError, InsufficientSlotsError
from duotf.backends.base import EngineJob, FeedAdapter, ThreadJob, work_name

logger = logging.getLogger(__name__)

_ERROR = "__duotf_feed_error"  # the column of a task's error record (see "the feed adapter")

__all__ = ["SparkFeed", "pack_tensors", "FeedCache", "CachedPartition", "feed_cache"]

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

    parts, size, pos, shapes = [], 0, 0, {}
    pid = TaskContext.get().partitionId()
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

    def open(self):
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
        except FileNotFoundError:
            return False
        try:
            os.rmdir(os.path.dirname(self.path))  # the cache's folder, once its last file is gone
        except OSError:
            pass
        return True


_INDEX_SCHEMA = f"pid long, host string, path string, frames string, rows long, {_ERROR} string"

#: Free space a converting task leaves on its local disk: below this much, it stops keeping the
#: partition's frames (the partition is then read from the DataFrame again in later epochs).
#: The larger of the two: bytes, or a fraction of the disk.
MIN_FREE_BYTES, MIN_FREE_FRACTION = 1 << 30, 0.05


#: Epochs fed from kept frame files (:func:`feed_cache`, or a DataFrame converted once) go
#: without a Spark job where every node can open every file itself (all on one host, as in
#: local mode or a one-machine standalone cluster): the driver names each frame to its node
#: (a "file" frame: path, offset, length), and the node maps it from its own page cache. No
#: data passes through the driver. False: always a Spark job of feeding tasks, as across hosts.
BY_REFERENCE = True


def _room(folder: str, need: int) -> bool:
    """Whether ``need`` more bytes leave the disk of ``folder`` above the floor."""
    import shutil

    usage = shutil.disk_usage(folder)
    return usage.free - need >= max(MIN_FREE_BYTES, MIN_FREE_FRACTION * usage.total)


def _keep(pid: int, frames, cache_id: str, job=None) -> dict:
    """Write a partition's packed ``frames`` (``(rows, bytes)``) to a file in this executor's
    local dir, and with ``job`` feed each to the nodes as it is written; return the partition's
    index entry (:data:`_INDEX_SCHEMA`'s fields). A partition the feed refuses leaves no file:
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

            sent, error = _guarded(lambda: feed_train(job, pid, written()))
    except FeedSchemaError as exc:
        error = _error_json(exc)
    finally:
        if not f.closed:
            f.close()
    if (error or not keep[0]) and os.path.exists(path):
        drop()
    kept = keep[0] and not error
    return {"pid": pid, "host": socket.gethostname(), "path": path if kept else "",
            "frames": json.dumps(index if kept else []), "rows": sent or 0, _ERROR: error}


def _spiller(cache_id: str, tensors: Dict[str, tuple], block_bytes: int, ragged: Sequence[str],
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

    pos, shapes = 0, {}
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


def _sweeper(cache_id: str):
    """A task that deletes what this executor keeps of cache ``cache_id`` (after a first epoch
    that failed: its tasks may have been cancelled before they could delete their files)."""

    def run(_):
        import os
        import shutil
        import tempfile

        root = (os.environ.get("SPARK_LOCAL_DIRS") or tempfile.gettempdir()).split(",")[0]
        shutil.rmtree(os.path.join(root, f"duotf-feedcache-{cache_id}"), ignore_errors=True)
        yield 0

    return run


def _rdd_spiller(cache_id: str, ragged: Sequence[str], job):
    """The RDD twin of :func:`_spiller` with a job: an RDD partition's rows converted, fed and
    kept; yields the partition's index entry as a dict."""

    def run(index, rows):
        yield _keep(index, _row_frames(rows, ragged, index), cache_id, job)

    return run


def _cached_partition(row):
    """The index entry of a partition: its CachedPartition (with no path where its frames were
    not kept), or its error JSON."""
    if row[_ERROR]:
        return row[_ERROR]
    return CachedPartition(row.pid, row.host, row.path, [tuple(f) for f in json.loads(row.frames)])


def _teed_partition(row):
    """``(index entry, rows fed)`` of a partition of the first epoch of a DataFrame or RDD
    converted once (see :func:`_keep` with a job); ``row``: a Row or a dict."""
    get = row.get if isinstance(row, dict) else row.__getitem__
    if get(_ERROR):
        return get(_ERROR), 0
    part = CachedPartition(get("pid"), get("host"), get("path"),
                           [tuple(f) for f in json.loads(get("frames"))])
    return part, get("rows")


def _remove_local(index, parts):
    yield sum(part.remove() for part in parts if isinstance(part, CachedPartition))


class _JvmKept:
    """The JVM RDD that keeps the index of frames the JVM wrote (:func:`duotf.backends.spark.jvm.spill`), as
    :class:`FeedCache` releases what it keeps."""

    def __init__(self, jrdd):
        self.jrdd = jrdd

    def unpersist(self) -> None:
        self.jrdd.unpersist(False)


class FeedCache:
    """A Spark DataFrame turned into ready-to-send feed frames, held in files on the executors
    (see :func:`feed_cache`). Pass it to ``cluster.train`` instead of the DataFrame."""

    def __init__(self, index, df, parts: List[CachedPartition], columns: List[str], kept=None):
        self.index = index  # RDD: one CachedPartition per partition, kept in executor memory
        self.kept = kept if kept is not None else index  # the RDD whose blocks hold them
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
            self.index.mapPartitionsWithIndex(_remove_local).collect()
        finally:
            for part in self.parts:  # the files on the driver's own host (local mode)
                part.remove()
            self.kept.unpersist()
            self.index = None

    def __repr__(self) -> str:
        return (f"FeedCache({self.rows} rows in {len(self.parts)} partitions, "
                f"columns={self.columns})")


def feed_cache(df, *, block_bytes: int = 4 << 20, ragged: Sequence[str] = ()) -> FeedCache:
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
    import uuid

    from pyspark import StorageLevel

    from duotf._transport.columns import ragged_columns

    source, tensors = arrow_source(df)
    spill = _spiller(uuid.uuid4().hex[:16], tensors, block_bytes, ragged_columns(ragged))
    index = source.mapInArrow(spill, _INDEX_SCHEMA).rdd.map(_cached_partition)
    index.persist(StorageLevel.MEMORY_ONLY)
    with arrow_batches(getattr(df, "sparkSession", None)):
        collected = index.collect()
    parts = sorted((p for p in collected if isinstance(p, CachedPartition)), key=lambda part: part.pid)
    cache = FeedCache(index, df, parts, list(df.columns))
    errors = sorted((e for e in collected if isinstance(e, str)), key=lambda e: json.loads(e)["partition"])
    if errors:
        cache.unpersist()
        _raise_first(errors)
    return cache


# -- the feed adapter ---------------------------------------------------------------------------
# A feeding task never lets a FeedError escape as a task failure: Spark would hand it back as a
# Py4JJavaError with the Python traceback as text. The task returns it as a record instead (a
# JSON column of its one output row, _ERROR), and the driver raises it, typed, with its attributes.


def _error_json(exc) -> str:
    return json.dumps({"type": type(exc).__name__, "message": exc.message, **exc.attributes})


def _guarded(call):
    """``(value, None)``, or ``(None, error JSON)`` when ``call()`` raised a FeedError."""
    from duotf.errors import FeedError

    try:
        return call(), None
    except FeedError as exc:
        return None, _error_json(exc)


def _in_group(sc, group: str, what: str, call):
    """``call()`` with the Spark jobs it starts in a job group of their own (cancelled alone),
    described as the Spark UI shows them (``what``: "duotf <job id>: feed epoch 3/10"). The
    calling thread's own group and description (the user's, on the driver's thread) come back
    after it."""
    keys = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
    before = {key: sc.getLocalProperty(key) for key in keys}
    sc.setJobGroup(group, what, interruptOnCancel=True)
    try:
        return call()
    finally:
        for key, value in before.items():
            sc.setLocalProperty(key, value)


#: The Arrow batches of duotf's own jobs out of the JVM: at most this many bytes each (Spark's
#: default cuts them at 10,000 records only: 31 MB of MNIST-sized rows, which its Arrow writer
#: fills at about half the speed it fills batches that stay in the CPU's cache).
ARROW_BATCH_BYTES = 4 << 20
_ARROW_KEYS = ("spark.sql.execution.arrow.maxBytesPerBatch", "spark.sql.execution.arrow.maxRecordsPerBatch")
_arrow_lock = threading.Lock()
_arrow_users = {}  # id(session) -> [duotf jobs in flight, the value set]


@contextlib.contextmanager
def arrow_batches(session):
    """duotf's jobs of ``session`` run with Arrow batches of at most :data:`ARROW_BATCH_BYTES`
    (``spark.sql.execution.arrow.maxBytesPerBatch``), unless the session sets either batch
    setting itself: then that is kept. The setting is the session's, so while a duotf job plans
    its stages, another thread's Arrow query of the session may get batches of that size too
    (batch sizes only: never other rows or values); it is unset when the last duotf job of the
    session ends, if it still holds duotf's value."""
    jconf = None
    try:
        jconf = session._jsparkSession.sessionState().conf() if session is not None else None
    except Exception:  # noqa: BLE001 - Spark Connect, or no JVM: Spark's own batches
        jconf = None
    if jconf is None:
        yield
        return
    key, value = _ARROW_KEYS[0], str(ARROW_BATCH_BYTES)
    with _arrow_lock:
        users = _arrow_users.get(id(session))
        if users is None:
            if any(jconf.contains(k) for k in _ARROW_KEYS):
                users = None  # the user's own setting
            else:
                session.conf.set(key, value)
                users = _arrow_users[id(session)] = [0, value]
        if users is not None:
            users[0] += 1
    try:
        yield
    finally:
        if users is not None:
            with _arrow_lock:
                users[0] -= 1
                if users[0] == 0:
                    del _arrow_users[id(session)]
                    if session.conf.get(key, None) == value:
                        session.conf.unset(key)


def _raise_first(errors) -> None:
    """Raise the first error record, as the FeedError (or subclass) that the task raised."""
    from duotf import errors as duotf_errors

    for error in errors:
        if error:
            fields = json.loads(error)
            cls = getattr(duotf_errors, fields.pop("type", "FeedError"), None)
            if not (isinstance(cls, type) and issubclass(cls, duotf_errors.FeedError)):
                cls = duotf_errors.FeedError
            raise cls(**fields)


def _arrow_counts(batches):
    import pyarrow as pa
    from pyspark import TaskContext

    n = sum(b.num_rows for b in batches)
    yield pa.RecordBatch.from_pydict({"p": [TaskContext.get().partitionId()], "n": [n]})


def _arrow_train(job, tensors):
    def run(batches):
        import pyarrow as pa
        from pyspark import TaskContext

        from duotf._transport.columns import from_arrow
        from duotf._transport.feeder import feed_train

        pid = TaskContext.get().partitionId()
        sent, error = _guarded(lambda: feed_train(job, pid, (from_arrow(b, tensors, job.ragged)
                                                              for b in batches)))
        yield pa.RecordBatch.from_pydict({"rows": [sent or 0], _ERROR: [error]},
                                         schema=pa.schema([("rows", pa.int64()), (_ERROR, pa.string())]))

    return run


def _arrow_infer(job, keep_fields, result_fields, tensors):
    def run(batches):
        import collections

        import pyarrow as pa
        from pyspark import TaskContext
        from pyspark.sql.pandas.types import to_arrow_type

        from duotf.errors import FeedError
        from duotf._transport.columns import from_arrow, num_rows
        from duotf._transport.feeder import feed_infer

        inputs = collections.deque()

        def remember(stream):
            for batch in stream:
                inputs.append(batch)
                yield from_arrow(batch, tensors, job.ragged)

        def take_inputs(n):
            """The next ``n`` input rows, as slices of the input batches (no copy): one where
            the rows lie in one batch, more where they span several."""
            parts = []
            while n:
                head = inputs[0]
                k = min(n, head.num_rows)
                parts.append(head.slice(0, k))
                if k == head.num_rows:
                    inputs.popleft()
                else:
                    inputs[0] = head.slice(k)
                n -= k
            return parts

        keep = [f.name for f in keep_fields]
        types = [(f.name, to_arrow_type(f.dataType)) for f in result_fields]
        names = keep + [n for n, _ in types] + [_ERROR]
        try:
            for _, results in feed_infer(job, TaskContext.get().partitionId(), remember(batches),
                                         inputs=False):  # the Arrow batches are kept above
                rows = num_rows(results)
                answers = []
                for name, arrow_type in types:
                    values = results.get(name)
                    if values is None:
                        raise KeyError(f"the node's results have no column {name!r} "
                                       f"(they have {sorted(results)}); set result_columns=...")
                    answers.append(pa.array(list(values) if getattr(values, "ndim", 1) > 1 else values,
                                            type=arrow_type))
                at = 0
                for kept in take_inputs(rows):  # one output batch per input batch they came from
                    k = kept.num_rows
                    arrays = [kept.column(kept.schema.get_field_index(name)) for name in keep]
                    arrays += [a.slice(at, k) for a in answers] + [pa.nulls(k, pa.string())]
                    yield pa.RecordBatch.from_arrays(arrays, names=names)
                    at += k
        except FeedError as exc:  # one row that carries the error, every other column null
            error = _error_json(exc)
            arrays = [pa.nulls(1, to_arrow_type(f.dataType)) for f in keep_fields]
            arrays += [pa.nulls(1, t) for _, t in types] + [pa.array([error], pa.string())]
            yield pa.RecordBatch.from_arrays(arrays, names=names)

    return run


def _rdd_counts(index, rows):
    """``(index, rows)``; ``(index, error JSON)`` when the partition's source raised (Python
    code pipelined into this task: its error is known here, by partition)."""
    from duotf.backends.base import count_error

    try:
        yield index, sum(1 for _ in rows)
    except Exception as exc:
        yield index, _error_json(count_error(index, exc))


def _cached_files(job):
    """Feed the cached partitions of this task, up to one per target node at once (a task may
    hold several after coalescing); yield ``(pid, rows sent, error)``, rows None for a file
    that is on another host."""

    def feed(part):
        from duotf._transport.feeder import feed_train, pass_turn

        opened = part.open()
        if opened is None:  # fed from the DataFrame once this job ends
            _, error = _guarded(lambda: pass_turn(job, part.pid))
            return part.pid, None, error
        f, frames = opened
        with f:
            sent, error = _guarded(lambda: feed_train(job, part.pid, frames))
            return part.pid, sent or 0, error

    def run(parts):
        from concurrent.futures import ThreadPoolExecutor

        parts = list(parts)
        if len(parts) <= 1:
            yield from map(feed, parts)
            return
        # sendfile leaves the GIL: partitions in order, so the ones fed at once go to
        # different nodes (see duotf._driver.planner.balance)
        with ThreadPoolExecutor(min(len(parts), len(job.addresses)), "duotf-feed") as pool:
            yield from pool.map(feed, parts)

    return run


def _train_rdd(job):
    def run(index, rows):
        from duotf._transport.tasks import train_partition

        yield _guarded(lambda: train_partition(job, index, rows))

    return run


def _infer_rdd(job, keep):
    def run(index, rows):
        from duotf._transport.tasks import infer_partition

        results, error = _guarded(lambda: infer_partition(job, index, list(rows), keep))
        if error:
            yield (_ERROR, error)
        else:
            yield from results

    return run


def _is_error(item) -> bool:
    return isinstance(item, tuple) and len(item) == 2 and item[0] == _ERROR


class SparkFeed(FeedAdapter):
    """A Spark DataFrame (read with ``mapInArrow``), an RDD, or a :class:`FeedCache`."""

    @staticmethod
    def accepts(data) -> bool:
        return (hasattr(data, "mapInArrow") or hasattr(data, "mapPartitionsWithIndex")
                or isinstance(data, FeedCache))

    def __init__(self, backend, data):
        self.backend = backend
        self.sc = backend.sc
        self.kept = None  # the FeedCache of a DataFrame converted once, in its first epoch
        self._converting = None  # the id of that cache, from the first epoch's start
        self.cache = data if isinstance(data, FeedCache) else None
        self.df = data if hasattr(data, "mapInArrow") else None
        self.rdd = None if self.df is not None or self.cache is not None else data
        self._source = None  # (the DataFrame read with mapInArrow, its tensor specs): arrow_source
        self.converted_in_jvm = False  # the kept frames were written by the JVM (_convert_in_jvm)
        self._by_reference: Optional[bool] = None  # whether the last epoch was fed by naming frames
        self.epochs_by_reference = 0  # epochs fed by naming kept frames (no Spark job)
        if self.cache is not None and self.cache.index is None:
            raise ConfigError(f"{self.cache!r} was unpersisted; make a new feed_cache()")

    def _job(self, job, call, task_partitions=None) -> EngineJob:
        # A group of its own (cancelled alone), described as the Spark UI shows it:
        # "duotf <job id>: feed epoch 3/10".
        group = f"{job.key_prefix}-{time.monotonic_ns()}"
        sc, session = self.sc, self._session()

        def scoped():
            with arrow_batches(session):
                return _in_group(sc, group, work_name(job.job_id, job.work), call)

        return ThreadJob(scoped, cancel=lambda: sc.cancelJobGroup(group), name="spark-feed",
                         task_partitions=task_partitions)

    def _session(self):
        """The SparkSession of the DataFrame read (directly or by a cache), else None."""
        source = self.df if self.df is not None else getattr(self.cache, "df", None)
        return getattr(source, "sparkSession", None)

    def _arrow(self):
        if self._source is None:
            self._source = arrow_source(self.df)
        return self._source

    def check_capacity(self, nodes: int) -> None:
        slots = self.backend.slots()
        if slots - nodes < 1:
            raise InsufficientSlotsError(
                f"feeding needs a free task slot beside the {nodes} node tasks, but Spark "
                f"({self.sc.master}) has {slots} slots in all. Give each executor "
                "one more core than its nodes use (spark.executor.cores), or run local[N] with "
                "N > number of nodes.",
                needed=nodes + 1, available=slots, backend="spark",
            )

    def counts(self) -> List[int]:
        if self.cache is not None:
            return list(self.cache.counts)
        if self.df is not None and self.feed_epochs > 1 and self.convert_once is not False \
                and not self.ragged:
            counts = self._convert_in_jvm()
            if counts is not None:
                return counts
        if self.df is not None:
            from pyspark.sql import functions as F

            # One literal column: Spark reads no data column just to count rows.
            collect = self.df.select(F.lit(0).alias("_")).mapInArrow(_arrow_counts, "p long, n long").collect
            counts = [0] * self.df.select(F.lit(0)).rdd.getNumPartitions()  # the plan of df itself stays unmade
        else:
            collect = self.rdd.mapPartitionsWithIndex(_rdd_counts).collect
            counts = [0] * self.rdd.getNumPartitions()
        # the Spark UI names it: "duotf <job id>: count rows"
        with arrow_batches(self._session()):
            rows = _in_group(self.sc, f"duotf-count-{self.job_id}-{time.monotonic_ns()}",
                             work_name(self.job_id, "count rows"), collect)
        _raise_first(n for _, n in rows if isinstance(n, str))
        for p, n in rows:
            counts[p] = n
        return counts

    def _convert_in_jvm(self) -> Optional[List[int]]:
        """The first pass of a DataFrame of numbers (numbers, arrays of numbers, tensor
        columns) fed ``epochs > 1`` times: the JVM writes
        each partition into a feed frame file in its executor's local dir, and counts its rows,
        in one job (:func:`duotf.backends.spark.jvm.spill`); every epoch is then fed from those files
        (:meth:`_train_cached`), and :meth:`close` deletes them. No row passes through Arrow
        or a Python worker, and no separate count is run. None (nothing done) where the
        DataFrame has another kind of column or the JVM helper is not usable: the first epoch
        then converts through Arrow (:meth:`_train_converting`). A partition the JVM did not
        write (one the feed refuses, or a near-full disk) is read from the DataFrame in every
        epoch, where the feed names a refused row."""
        import uuid

        from duotf.backends.spark import jvm
        cache_id = uuid.uuid4().hex[:16]
        # the DataFrame's plan is made here: under duotf's Arrow batches (its own Arrow steps)
        with arrow_batches(self._session()):
            spilled = jvm.spill(self.df, cache_id, 4 << 20, MIN_FREE_BYTES, MIN_FREE_FRACTION, _ERROR)
            if spilled is None:
                return None
            index, kept = spilled[0], _JvmKept(spilled[1])
            self._converting = cache_id  # close() sweeps the files of a pass that failed
            try:
                rows = _in_group(self.sc, f"duotf-convert-{self.job_id}-{time.monotonic_ns()}",
                                 work_name(self.job_id, "convert once (count rows, keep feed frames)"),
                                 index.collect)
            except BaseException:
                kept.unpersist()
                raise
        out = [_teed_partition(row) for row in rows]
        parts = sorted((entry for entry, _ in out), key=lambda p: p.pid)
        # each task reading the index runs where its entry, and so its file, is
        self.kept = self.cache = FeedCache(index.rdd.map(_cached_partition), self.df, parts,
                                           list(self.df.columns), kept=kept)
        self.converted_in_jvm = True
        dropped = sum(1 for p in parts if not p.path)
        if dropped:
            logger.info("duotf: %d of %d partitions were not written to feed frames by the JVM (the "
                        "feed refuses a row of theirs, or an executor's local disk is near full: "
                        "see duotf.backends.spark.feed MIN_FREE_BYTES); they are read from the "
                        "DataFrame in every epoch", dropped, len(parts))
        counts = [0] * len(parts)
        for entry, rows in out:
            counts[entry.pid] = rows
        return counts

    def train(self, job) -> EngineJob:
        if self.cache is not None:
            if self._nodes_read_files(job):
                return ThreadJob(self._train_by_reference(job), cancel=lambda: None,
                                 name="feed-by-reference")
            return self._job(job, *self._train_cached(job))
        if job.epoch == 1 and job.epochs > 1 and self.convert_once is not False:
            return self._job(job, self._train_converting(job))
        if self.df is not None:
            def run_df():
                # packing reads the plan (AQE runs its shuffles then): in the job's group
                df, tensors = self._arrow()
                out = df.mapInArrow(_arrow_train(job, tensors), f"rows long, {_ERROR} string").collect()
                _raise_first(row[_ERROR] for row in out)
                return [row.rows for row in out]

            return self._job(job, run_df)
        rdd = self.rdd

        def run_rdd():
            out = rdd.mapPartitionsWithIndex(_train_rdd(job)).collect()
            _raise_first(error for _, error in out)
            return [sent for sent, _ in out]

        return self._job(job, run_rdd)

    def _nodes_read_files(self, job) -> bool:
        """Whether this epoch's kept frames may be named to the nodes, not sent
        (:data:`BY_REFERENCE`): every partition with a planned row has a kept file, and each
        node says it can open every file it is to read (asked before every epoch: a file can
        go with its executor). Otherwise the epoch is a Spark job, which feeds a partition
        whose file is gone from the DataFrame."""
        from duotf._transport import wire
        if not BY_REFERENCE:
            return False
        wanted: Dict[int, List[str]] = {}
        for part in self.cache.parts:
            for target, *_ in job.plan.get(part.pid, ()):
                if not part.path:
                    return False
                wanted.setdefault(target, []).append(part.path)
        ok = bool(wanted)
        for target, paths in wanted.items():
            try:
                with wire.connect(job.addresses[target], job.secret, job.timeout) as sock:
                    ok = all(wire.probe_file(sock, path) for path in paths)
            except (OSError, wire.FeedProtocolError) as exc:
                logger.debug("duotf: asking %s whether it reads the kept frames: %s",
                             job.labels[target], exc)
                ok = False
            if not ok:
                break
        if ok != self._by_reference:
            logger.info("duotf: epoch %d fed from kept frames %s", job.epoch,
                        "by naming each frame to its node (no Spark job)" if ok else
                        "by Spark tasks (a node cannot open every file it is to read)")
        self._by_reference = ok
        return ok

    def _train_by_reference(self, job):
        """The engine call of an epoch fed from kept frames by the driver: for each partition,
        in partition order, the "file" frames of its ranges (a few threads: each range waits
        for its turn on its node, as a feeding task does)."""
        from concurrent.futures import ThreadPoolExecutor

        from duotf._transport.feeder import feed_train
        from duotf._transport.wire import FileRef

        parts = self.cache.parts
        self.epochs_by_reference += 1

        def feed(part):
            sent = feed_train(job, part.pid, [FileRef(rows, part.path, offset, length)
                                              for rows, offset, length in part.frames])
            self.partition_done(part.pid, sent)
            return sent

        def call():
            with ThreadPoolExecutor(max(1, min(len(parts), 2 * len(job.addresses))),
                                    "duotf-feed-ref") as pool:
                return list(pool.map(feed, parts))

        return call

    def _train_cached(self, job):
        """``(the engine call of a cached epoch, each task's partitions where a task feeds
        several)``."""
        cache, sc = self.cache, self.sc
        index, runs = cache.index, None
        free = max(self.backend.slots() - len(job.addresses), 1)
        if len({part.host for part in cache.parts}) == 1 and len(cache.parts) > free:
            # One host: every file is local to every task. One task per free slot, each
            # feeding a run of partitions, saves Spark's per-task cost, and with no locality
            # preference no task waits for the executor that holds an index entry. Across
            # hosts each partition keeps its own task, which Spark runs where its index entry
            # (and so its file) is.
            per = -(-len(cache.parts) // free)
            runs = [cache.parts[i:i + per] for i in range(0, len(cache.parts), per)]
            index = sc.parallelize(runs, len(runs)).flatMap(lambda run: run)

        def call():
            out = index.mapPartitions(_cached_files(job)).collect()
            _raise_first(error for _, _, error in out)
            sent = {pid: rows for pid, rows, _ in out}
            missed = sorted(pid for pid, rows in sent.items() if rows is None)
            if missed:
                logger.info("duotf: %d cached partitions were on another host; feeding them "
                            "from the DataFrame", len(missed))
                source = cache.df  # a DataFrame, or the RDD converted in the first epoch
                if hasattr(source, "mapInArrow"):
                    source, tensors = arrow_source(source)
                    fed = source.mapInArrow(_arrow_train(job, tensors),
                                            f"rows long, {_ERROR} string").rdd
                    again = [(row.rows, row[_ERROR]) for row in sc.runJob(fed, lambda rows: rows, missed)]
                else:
                    again = sc.runJob(source.mapPartitionsWithIndex(_train_rdd(job)),
                                      lambda rows: rows, missed)
                _raise_first(error for _, error in again)
                for pid, (rows, _) in zip(missed, again):
                    sent[pid] = rows
            return [sent[pid] for pid in sorted(sent)]

        # a lost task of a run is named by its partitions, not by its index
        return call, ([[part.pid for part in run] for run in runs] if runs else None)

    def _train_converting(self, job):
        """The first epoch of a DataFrame or RDD fed ``epochs > 1`` times: each task converts
        its partition into feed frames, feeds them, and keeps them in a file in its executor's
        local dir, as :func:`feed_cache` does; the later epochs are fed from those files
        (:meth:`_train_cached`), and :meth:`close` deletes them when ``train`` returns."""
        import uuid

        source, cache_id = (self.df if self.df is not None else self.rdd), uuid.uuid4().hex[:16]
        self._converting = cache_id

        def call():
            if self.df is not None:
                read, tensors = self._arrow()
                task = _spiller(cache_id, tensors, 4 << 20, job.ragged, job=job)
                teed = read.mapInArrow(task, _INDEX_SCHEMA).rdd.map(_teed_partition)
            else:
                teed = source.mapPartitionsWithIndex(_rdd_spiller(cache_id, job.ragged, job)).map(
                    _teed_partition)
            # Checkpointed, not just persisted: a lost block is never recomputed, since that
            # would run this epoch's feeding task again. Persisted too: PySpark pipelines a
            # map onto an RDD that is neither cached nor checkpointed (its Python flag), and
            # the index below would then run the feeding task every time it is read.
            from pyspark import StorageLevel

            teed.persist(StorageLevel.MEMORY_AND_DISK)
            teed.localCheckpoint()
            out = teed.collect()
            entries = [entry for entry, _ in out]
            parts = sorted((e for e in entries if isinstance(e, CachedPartition)), key=lambda p: p.pid)
            columns = list(source.columns) if self.df is not None else []
            cache = FeedCache(teed.map(lambda item: item[0]), source, parts, columns, kept=teed)
            errors = sorted((e for e in entries if isinstance(e, str)),
                            key=lambda e: json.loads(e)["partition"])
            if errors:
                cache.unpersist()
                _raise_first(errors)
            self.kept = self.cache = cache
            dropped = sum(1 for p in parts if not p.path)
            if dropped:
                logger.warning("duotf: %d of %d partitions were not kept for the later epochs (their "
                               "executors' local disks were near full: see duotf.spark feed "
                               "MIN_FREE_BYTES); they are read from the DataFrame again",
                               dropped, len(parts))
            rows = {entry.pid: n for entry, n in out if isinstance(entry, CachedPartition)}
            return [rows[pid] for pid in sorted(rows)]

        return call

    def report(self) -> dict:
        by_reference = {"epochs_fed_by_reference": self.epochs_by_reference} if self.cache is not None \
            or self.kept is not None else {}
        if self.kept is None:
            return by_reference
        return {"converted_once": True, "converted_in_jvm": self.converted_in_jvm,
                "partitions_kept": sum(1 for p in self.kept.parts if p.path), **by_reference}

    def close(self) -> None:
        kept, self.kept = self.kept, None
        cache_id, self._converting = self._converting, None
        try:
            if kept is not None:
                if self.cache is kept:
                    self.cache = None
                kept.unpersist()
            elif cache_id is not None:
                # The first epoch failed: its tasks (some cancelled mid-write) kept no index.
                # One sweeping task per slot, twice over, reaches every executor with a free
                # slot; Spark deletes its executors' local dirs, and what is left with them,
                # when the application ends.
                n = 2 * max(self.backend.slots(), 1)
                self.sc.parallelize(range(n), n).mapPartitions(_sweeper(cache_id)).collect()
        except Exception as exc:  # Spark stopped under it: its local dirs go with the app
            logger.warning("duotf: could not delete the frames kept for the feed (%s)", exc)

    def infer(self, job, keep, result_columns) -> EngineJob:
        if self.cache is not None:
            raise ConfigError("a FeedCache is for training; pass the DataFrame itself to inference()")
        if self.df is not None:
            return self._job(job, self._infer_df(job, keep, result_columns))
        rdd = self.rdd

        def run_rdd():
            from pyspark import StorageLevel

            out = rdd.mapPartitionsWithIndex(_infer_rdd(job, keep))
            # Materialize now, while the nodes run. persist() also keeps PySpark from pipelining
            # count() past this RDD, which would leave the checkpoint unfilled.
            out.persist(StorageLevel.MEMORY_AND_DISK)
            out.localCheckpoint()
            _raise_first(error for _, error in out.filter(_is_error).take(1))
            return out.filter(lambda item: not _is_error(item))

        return self._job(job, run_rdd)

    def _infer_df(self, job, keep, result_columns):
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        from duotf.backends.spark import jvm
        source = self.df
        keep = list(source.columns) if keep is None else list(keep)
        spec = result_columns or {"prediction": "double"}
        result_fields = source.sparkSession.createDataFrame(
            [], ", ".join(f"`{k}` {v}" for k, v in spec.items())).schema.fields

        def fields(schema):  # nullable: a task's error comes back as a row of nulls beside its message
            kept = [T.StructField(f.name, f.dataType, True, f.metadata) for f in (schema[k] for k in keep)]
            return kept + list(result_fields) + [T.StructField(_ERROR, T.StringType(), True)]

        def answered(out):
            """``out`` computed once (the nodes answer while it is), locally checkpointed, and
            without its error column; the first error record a task returned raised."""
            out = out.localCheckpoint(eager=True)
            failed = out.where(F.col(_ERROR).isNotNull()).select(_ERROR).limit(1).collect()
            _raise_first(row[0] for row in failed)
            return out.drop(_ERROR)

        def run():
            missing = [name for name in keep if name not in source.columns]
            if missing:
                raise ConfigError(f"keep= names {missing}, which the DataFrame does not have "
                                  f"(it has {source.columns})")
            # array columns packed in the JVM (in the job's group)
            df, tensors = self._arrow()
            answers_only = T.StructType(list(result_fields) + [T.StructField(_ERROR, T.StringType(), True)])
            answers = df.mapInArrow(_arrow_infer(job, [], result_fields, tensors), answers_only)
            pair = jvm.answers_beside(source, keep, answers) if keep else (lambda out: out)
            if pair is not None:
                # Only the answers are kept; the kept columns are read from the DataFrame beside
                # them, never through Python, each time the result is read.
                return pair(answered(answers))
            # A DataFrame that may not give the same rows again: its kept columns go through the
            # nodes' tasks and are kept beside the answers (packed there, unpacked on the way out).
            schema, unpacked = T.StructType(fields(df.schema)), T.StructType(fields(source.schema))
            task = _arrow_infer(job, schema.fields[:len(keep)], result_fields, tensors)
            out = answered(df.mapInArrow(task, schema))
            return jvm.unpack(out, T.StructType(unpacked.fields[:-1])) if unpacked != schema else out

        return run
