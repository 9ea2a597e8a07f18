"""What the Spark feed's tasks run, and what they share with the driver's side: the record a task
returns for its error, the job group a feed's Spark jobs run in, duotf's Arrow batch size, and the
functions of the feeding tasks (counting, feeding an epoch, inference) over Arrow batches or RDD
partitions.

A feeding task never lets a FeedError escape as a task failure: Spark would hand it back as a
Py4JJavaError with the Python traceback as text. The task returns it as a record instead (a JSON
column of its one output row, :data:`ERROR_COLUMN`), and the driver raises it, typed, with its
attributes (:func:`raise_first`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from typing import Dict

logger = logging.getLogger(__name__)

ERROR_COLUMN = "__duotf_feed_error"  # the column of a task's error record


def error_json(exc) -> str:
    return json.dumps({"type": type(exc).__name__, "message": exc.message, **exc.attributes})


def guarded(call):
    """``(value, None)``, or ``(None, error JSON)`` when ``call()`` raised a FeedError."""
    from duotf.errors import FeedError

    try:
        return call(), None
    except FeedError as exc:
        return None, error_json(exc)


#: The Arrow batches of duotf's own jobs out of the JVM: at most this many bytes each (Spark's
#: default cuts them at 10,000 records only: 31 MB of MNIST-sized rows, which its Arrow writer
#: fills at about half the speed it fills batches that stay in the CPU's cache).
ARROW_BATCH_BYTES = 4 << 20


_ARROW_KEYS = ("spark.sql.execution.arrow.maxBytesPerBatch", "spark.sql.execution.arrow.maxRecordsPerBatch")


_arrow_lock = threading.Lock()


_arrow_users: Dict[int, list] = {}  # id(session) -> [duotf jobs in flight, the value set]


@contextlib.contextmanager
def arrow_batches(session):
    """duotf's jobs of ``session`` run with Arrow batches of at most :data:`ARROW_BATCH_BYTES`
    (``spark.sql.execution.arrow.maxBytesPerBatch``, Spark 4.0 and later), unless the session
    sets either batch setting itself: then that is kept. The setting is the session's, so while a duotf job plans
    its stages, another thread's Arrow query of the session may get batches of that size too
    (batch sizes only: never other rows or values); it is unset when the last duotf job of the
    session ends, if it still holds duotf's value."""
    jconf = None
    try:
        jconf = session._jsparkSession.sessionState().conf() if session is not None else None
    except Exception:  # noqa: BLE001 - Spark Connect, or no JVM: Spark's own batches
        jconf = None
    if jconf is None or not _cuts_by_bytes(session):
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


_told_records_only = False


def _cuts_by_bytes(session) -> bool:
    """Whether ``session``'s Spark cuts Arrow batches by bytes: 4.0 and later. Spark 3.5 cuts
    them by records only (10,000 by default), so duotf leaves its batches alone there rather
    than set a key that Spark would not read; said once, at DEBUG."""
    global _told_records_only
    try:
        major = int(str(session.version).split(".")[0])
    except (AttributeError, ValueError):
        return True
    if major >= 4:
        return True
    if not _told_records_only:
        _told_records_only = True
        logger.debug("duotf: Spark %s cuts Arrow batches by records only "
                     "(spark.sql.execution.arrow.maxRecordsPerBatch): duotf's jobs keep its "
                     "batches", session.version)
    return False


def raise_first(errors) -> None:
    """Raise the first error record, as the FeedError (or subclass) that the task raised."""
    from duotf import errors as duotf_errors

    for error in errors:
        if error:
            fields = json.loads(error)
            cls = getattr(duotf_errors, fields.pop("type", "FeedError"), None)
            if not (isinstance(cls, type) and issubclass(cls, duotf_errors.FeedError)):
                cls = duotf_errors.FeedError
            raise cls(**fields)


def arrow_counts(batches):
    import pyarrow as pa
    from pyspark import TaskContext

    n = sum(b.num_rows for b in batches)
    yield pa.RecordBatch.from_pydict({"p": [TaskContext.get().partitionId()], "n": [n]})


def arrow_train(job, tensors):
    def run(batches):
        import pyarrow as pa
        from pyspark import TaskContext

        from duotf._transport.columns import from_arrow
        from duotf._transport.feeder import feed_train

        pid = TaskContext.get().partitionId()
        sent, error = guarded(lambda: feed_train(job, pid, (from_arrow(b, tensors, job.ragged)
                                                              for b in batches)))
        yield pa.RecordBatch.from_pydict({"rows": [sent or 0], ERROR_COLUMN: [error]},
                                         schema=pa.schema([("rows", pa.int64()), (ERROR_COLUMN, pa.string())]))

    return run


def arrow_infer(job, keep_fields, result_fields, tensors):
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
        names = keep + [n for n, _ in types] + [ERROR_COLUMN]
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
            error = error_json(exc)
            arrays = [pa.nulls(1, to_arrow_type(f.dataType)) for f in keep_fields]
            arrays += [pa.nulls(1, t) for _, t in types] + [pa.array([error], pa.string())]
            yield pa.RecordBatch.from_arrays(arrays, names=names)

    return run


def rdd_counts(index, rows):
    """``(index, rows)``; ``(index, error JSON)`` when the partition's source raised (Python
    code pipelined into this task: its error is known here, by partition)."""
    from duotf.backends.base import count_error

    try:
        yield index, sum(1 for _ in rows)
    except Exception as exc:
        yield index, error_json(count_error(index, exc))


def cached_files(job):
    """Feed the cached partitions of this task, up to one per target node at once (a task may
    hold several after coalescing); yield ``(pid, rows sent, error)``, rows None for a file
    that is on another host."""

    def feed(part):
        from duotf._transport.feeder import feed_train, pass_turn

        opened = part.open()
        if opened is None:  # fed from the DataFrame once this job ends
            _, error = guarded(lambda: pass_turn(job, part.pid))
            return part.pid, None, error
        f, frames = opened
        with f:
            sent, error = guarded(lambda: feed_train(job, part.pid, frames))
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


def arrow_some(task, pids):
    """A ``mapInArrow`` task that runs ``task`` in the partitions ``pids`` only (the others
    yield nothing): Spark Connect's stand-in for ``SparkContext.runJob`` on some partitions."""
    wanted = frozenset(pids)

    def run(batches):
        from pyspark import TaskContext

        if TaskContext.get().partitionId() in wanted:
            yield from task(batches)

    return run


def train_rdd(job):
    def run(index, rows):
        from duotf._transport.tasks import train_partition

        yield guarded(lambda: train_partition(job, index, rows))

    return run


def infer_rdd(job, keep):
    def run(index, rows):
        from duotf._transport.tasks import infer_partition

        results, error = guarded(lambda: infer_partition(job, index, list(rows), keep))
        if error:
            yield (ERROR_COLUMN, error)
        else:
            yield from results

    return run


def is_error(item) -> bool:
    return isinstance(item, tuple) and len(item) == 2 and item[0] == ERROR_COLUMN

