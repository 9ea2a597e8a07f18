"""Training a running cluster from a Spark Structured Streaming query:
:func:`duotf.spark.feed_stream`.

The query's ``foreachBatch`` feeds each micro-batch as one chunk of an open feed
(:meth:`duotf.Cluster.open_stream`); the nodes read one continuous stream, which ends when the
query ends. Micro-batches already fed are recorded beside the query's checkpoint, so that the
batch Spark replays after a driver restart (same ``checkpointLocation``) is not fed twice.
"""

from __future__ import annotations

import json
import logging
import posixpath
import threading
from typing import TYPE_CHECKING, Optional, Sequence

from duotf._names import public
from duotf._verbosity import quiet_known_notices
from duotf.errors import ConfigError, FeedError
from duotf.reports import SparkStreamReport

if TYPE_CHECKING:  # pyspark is imported where a query starts
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import StreamingQuery

    from duotf._driver.cluster import Cluster
    from duotf._driver.planner import Stream

logger = logging.getLogger("duotf.feed")

__all__ = ["feed_stream", "SparkStream", "LEDGER"]

_STOPPING = "duotf: the stream is stopping; this micro-batch is left to the next query"

#: the file in the checkpoint location that records the last micro-batch fed
LEDGER = "duotf-fed-batches.json"


class _Ledger:
    """The id of the last micro-batch fed, in a file in the query's checkpoint location (any
    filesystem fsspec reaches; a plain path is local). Spark numbers micro-batches 0, 1, ... in
    order and replays only the last one after a restart, so the highest id fed is enough."""

    def __init__(self, location: str):
        import fsspec

        self.fs, root = fsspec.core.url_to_fs(location)
        self.path = posixpath.join(root, LEDGER)
        self.fs.makedirs(root, exist_ok=True)
        self.last: Optional[int] = None
        if self.fs.exists(self.path):
            with self.fs.open(self.path, "rb") as f:
                self.last = json.loads(f.read().decode())["last_batch_id"]

    def fed(self, batch_id: int) -> bool:
        return self.last is not None and batch_id <= self.last

    def record(self, batch_id: int, rows: int) -> None:
        tmp = self.path + ".tmp"
        with self.fs.open(tmp, "wb") as f:
            f.write(json.dumps({"last_batch_id": int(batch_id), "rows": int(rows)}).encode())
        self.fs.mv(tmp, self.path)  # a rename: the file is whole or the old one
        self.last = batch_id


class _Batches:
    """The function a query's ``foreachBatch`` calls: the stream's :meth:`SparkStream._batch`
    while the stream is open. py4j keeps it, and pyspark the last error it raised, until the
    JVM lets the query's proxy go, long after the query ended: neither may hold the stream (and
    so the cluster) after :meth:`end`. The query fails with a copy of a micro-batch's error,
    raised with no context; the stream keeps the error itself, with its traceback, for
    ``wait()`` and ``stop()`` to raise."""

    def __init__(self, target: "SparkStream"):
        self.target: Optional[SparkStream] = target

    def __call__(self, batch_df, batch_id: int) -> None:
        target = self.target
        if target is None:  # the stream has ended: nothing is fed, nothing committed
            raise RuntimeError(_STOPPING)
        failed: Optional[BaseException] = None
        try:
            target._batch(batch_df, batch_id)
        except BaseException as exc:
            failed = _copy_error(exc)
        del target
        if failed is not None:
            raise failed

    def end(self) -> None:
        """The query has ended: let the stream go."""
        self.target = None


def _copy_error(exc: BaseException) -> BaseException:
    """``exc`` again, without its traceback or context (duotf's errors pickle, so they copy)."""
    import copy

    try:
        return copy.copy(exc).with_traceback(None)
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


@public("duotf.spark")
class SparkStream:
    """A streaming query feeding a cluster (:func:`feed_stream`): :attr:`query` is the
    ``StreamingQuery``; :meth:`stop` stops it and ends the nodes' feed, :meth:`wait` waits for
    a query that ends by itself (``trigger(availableNow=True)``) and ends the feed. Stop the
    query through them: a ``query.stop()`` alone leaves the nodes' feed open."""

    def __init__(self, stream: Stream, ledger: _Ledger):
        self.stream = stream  # the open feed (duotf._driver.planner.Stream)
        self.query: Optional[StreamingQuery] = None  # feed_stream starts it
        self.batches_fed = 0
        self.batches_skipped = 0  # micro-batches fed before (a replay after a restart)
        self._ledger = ledger
        self._feeding = threading.Lock()  # held while a micro-batch is fed
        self._stopping = False
        # what foreachBatch is given: py4j keeps it until the JVM lets the query's proxy go,
        # long after the query ended, so it holds this object (and the cluster) only until then
        self._batches = _Batches(self)

    def _started(self) -> StreamingQuery:
        assert self.query is not None, "feed_stream() starts the query before it returns"
        return self.query

    # foreachBatch's function: runs on the driver, in the query's own thread, one batch at a time
    def _batch(self, batch_df, batch_id: int) -> None:
        if self._ledger.fed(batch_id):
            self.batches_skipped += 1
            logger.info("duotf: micro-batch %d was fed before (a replay): skipped", batch_id)
            return
        with self._feeding:
            if self._stopping:  # not fed, so not committed: a later query feeds it
                raise RuntimeError(_STOPPING)
            rows = self.stream.feed(batch_df)  # raises a FeedError: the query fails with it
            self._ledger.record(batch_id, rows)
            self.batches_fed += 1

    @property
    def rows_fed(self) -> int:
        return self.stream.rows_fed

    def report(self) -> SparkStreamReport:
        """The counts so far: the open feed's, and the micro-batches fed and skipped."""
        return {**self.stream.report(), "batches_fed": self.batches_fed,
                "batches_skipped": self.batches_skipped}

    def _finish(self) -> SparkStreamReport:
        """The query has ended: end the feed (or fail it, if the query failed otherwise), and
        raise the feed's own error if it failed the query."""
        self._batches.end()
        exc = self._started().exception()
        if exc is not None and _STOPPING in str(exc):
            exc = None  # a micro-batch refused by stop(): not fed, not committed
        if self.stream.error is not None:
            raise self.stream.error
        if exc is not None:
            self.stream.fail(f"the streaming query failed: {str(exc).splitlines()[0]}")
            raise FeedError(f"the streaming query failed: {exc}")
        self.stream.end()
        return self.report()

    def stop(self) -> SparkStreamReport:
        """Stop the query (after the micro-batch being fed, if any) and end the nodes' feed
        after its rows; return the counts. Raises the feed's error if a micro-batch failed."""
        self._stopping = True
        with self._feeding:  # the micro-batch being fed is fed whole; none starts after
            pass
        self._started().stop()
        return self._finish()

    def wait(self, timeout: Optional[float] = None) -> Optional[SparkStreamReport]:
        """Wait until the query ends by itself, then end the feed and return the counts; None
        if it still runs after ``timeout`` seconds."""
        try:
            # pyspark annotates an int; it takes seconds as a float (int(timeout * 1000) ms)
            done = self._started().awaitTermination(timeout)  # type: ignore[arg-type]
        except Exception:  # the query failed: _finish says why
            done = True
        if done is False:
            return None
        return self._finish()


def feed_stream(cluster: Cluster, streaming_df: DataFrame, *, checkpoint_location: str,
                trigger: Optional[dict] = None, query_name: Optional[str] = None,
                feed_timeout: float = 600.0, balance: bool = True,
                ragged: Sequence[str] = ()) -> SparkStream:
    """Start a streaming query that trains ``cluster`` from ``streaming_df``.

    Each micro-batch is fed, through ``foreachBatch``, as one chunk of an open feed
    (:meth:`duotf.Cluster.open_stream`): its rows go to the chief and workers as
    ``cluster.train`` feeds a DataFrame (schema checks, ``balance`` per micro-batch), and the
    nodes read one continuous stream (``next_batch`` across micro-batches; ``should_stop()``
    and ``dataset()`` end when the query ends). ``foreachBatch`` is synchronous: a micro-batch
    ends once every node has its rows in its bounded queue, so nodes that train slower than the
    source produces hold the query back (a source that reads by offsets, such as files or
    Kafka, then takes larger micro-batches: bound them with ``maxFilesPerTrigger`` or
    ``maxOffsetsPerTrigger``).

    ``checkpoint_location``: the query's ``checkpointLocation``, required. Beside Spark's own
    files duotf keeps the id of the last micro-batch fed (:data:`LEDGER`); a query started
    again with the same location after a driver restart skips the micro-batch Spark replays
    when it was fed already, so each micro-batch is fed once (a driver that dies between
    feeding a micro-batch and recording it feeds it again: at least once, there).

    ``trigger``: keyword arguments of ``DataStreamWriter.trigger`` (``{"processingTime": "1
    second"}``, ``{"availableNow": True}``). A micro-batch that fails feeding fails the query
    with its :class:`~duotf.errors.FeedError` and ends every node's feed with it; a query that
    fails otherwise ends the feed with its error. Stop the query with
    :meth:`SparkStream.stop` (or wait for one that ends by itself with :meth:`SparkStream.wait`):
    either ends the nodes' feed after the rows fed.
    """
    quiet_known_notices()  # pyspark's pandas notice (duotf._verbosity)
    from duotf.backends.spark.client import is_connect

    if is_connect(streaming_df):
        raise ConfigError(
            "feed_stream needs a classic SparkSession: on Spark Connect, foreachBatch runs its "
            "function in a Python process of the server, not in this one, where the cluster's "
            "feed is. Write the stream to a table or files with its own query, and train on "
            "each new part with cluster.train(spark.read...), or run this driver where a "
            "classic session (SparkSession.builder.master(...)) reaches the cluster")
    if not checkpoint_location or not isinstance(checkpoint_location, str):
        raise ConfigError(f"checkpoint_location={checkpoint_location!r}: give the query's "
                          "checkpoint directory (a path or URL every restart of the driver sees)")
    if not getattr(streaming_df, "isStreaming", False):
        raise ConfigError("feed_stream() takes a streaming DataFrame (spark.readStream...); "
                          "feed a DataFrame with cluster.train()")
    ledger = _Ledger(checkpoint_location)
    handle = SparkStream(cluster.open_stream(feed_timeout=feed_timeout, balance=balance,
                                             ragged=ragged), ledger)
    writer = (streaming_df.writeStream.foreachBatch(handle._batches)
              .option("checkpointLocation", checkpoint_location))
    if trigger:
        writer = writer.trigger(**trigger)
    if query_name:
        writer = writer.queryName(query_name)
    try:
        handle.query = writer.start()
    except BaseException as exc:
        handle.stream.fail(f"the streaming query did not start: {exc}")
        raise
    return handle
