"""What the feeding calls return: the counts of ``cluster.train`` and of the streams.

Each report is a :class:`typing.TypedDict`: at run time a plain ``dict`` (so
``report["rows_fed"]`` and ``report.get("converted_once", False)`` work as they always did, and
a report prints, pickles and serializes to JSON as a dict does), while a type checker knows
every key and its type. Keys that only some feeds produce are not required: read them with
``report.get(key, default)``.

Which call returns which:

- :meth:`duotf.Cluster.train`: a :class:`TrainReport`;
- ``cluster.open_stream()``'s ``stream.report()``: a :class:`StreamReport`;
- :func:`duotf.spark.feed_stream`'s handle, ``stop()``, ``wait()`` and ``report()``: a
  :class:`SparkStreamReport`;
- :func:`duotf.dask.feed_stream`: a :class:`DaskStreamReport`;
- a backend's ``FeedAdapter.report()``: a :class:`FeedAdapterReport`, its keys of a
  :class:`TrainReport`.

``cluster.inference`` returns no report: its result is a collection of the input's engine.
"""

from __future__ import annotations

from typing import List, Optional, TypedDict

__all__ = ["TrainReport", "FeedAdapterReport", "StreamReport", "SparkStreamReport",
           "DaskStreamReport"]


class FeedAdapterReport(TypedDict, total=False):
    """What a backend's feed adapter adds to a :class:`TrainReport`
    (``duotf.backends.base.FeedAdapter.report``); every key is optional. Today only Spark's
    adds any, where it converted the data once or fed kept frames.

    Attributes
    ----------
    converted_once : bool
        The data was converted into feed frames once, in the first epoch, and the later epochs
        were fed from the frames kept (``cluster.train(convert_once=...)``).
    converted_in_jvm : bool
        Those frames were written by Spark's JVM (columns of numbers), not by Python tasks.
    partitions_kept : int
        The partitions whose frames were kept; the others were read from the data again.
    epochs_fed_by_reference : int
        The epochs fed by naming kept frame files to the nodes (no engine job), where the data
        was converted once or came from :func:`duotf.spark.feed_cache`.
    """

    converted_once: bool
    converted_in_jvm: bool
    partitions_kept: int
    epochs_fed_by_reference: int


class _TrainReportSometimes(FeedAdapterReport, total=False):
    """The keys of a :class:`TrainReport` present only in some feeds."""

    resumed_at_epoch: int
    shuffle_seed: int
    rows_across_hosts: int


class TrainReport(_TrainReportSometimes):
    """What :meth:`duotf.Cluster.train` returns: the counts of the feed, and where its time went.

    A ``TypedDict``, so a plain ``dict`` at run time: ``report["rows_fed"]`` as before. The keys
    from ``epochs`` to ``epoch_seconds`` are always present; ``resumed_at_epoch`` and those of
    :class:`FeedAdapterReport` only where the feed had them (``report.get(key, default)``).

    Attributes
    ----------
    epochs : int
        The epochs fed; fewer than asked when a node terminated its feed. After a restart,
        those fed to the restarted nodes (from ``resumed_at_epoch + 1``).
    rows : int
        The rows of the data, every partition: one epoch's worth.
    rows_fed : int
        The rows sent to the nodes, every epoch fed together.
    rows_per_worker : int or None
        The rows each node got per epoch with ``balance=True``; None with ``balance=False``
        (partitions go whole to the nodes in turn, unevenly).
    rows_dropped_per_epoch : int
        The rows left over per epoch after giving every node the same number (fewer than the
        number of nodes), not fed; 0 with ``balance=False``.
    terminated : bool
        A node ended the feed early (``feed.terminate()``).
    seconds : float
        The whole call.
    count_seconds : float
        Counting the rows of every partition, which the balanced plan needs first.
    epoch_seconds : list of float
        Each epoch fed: its engine job, its epoch markers acknowledged.
    resumed_at_epoch : int
        Present where a restart resumed the feed past epoch 0: the epoch the restarted nodes
        resumed at (the last every node saved); the epochs up to it were not fed again.
    shuffle_seed : int
        Present where the feed was shuffled (``train(shuffle=True)``): the seed of its order,
        the one given or the one drawn; ``train(..., shuffle=True, seed=...)`` repeats it.
    rows_across_hosts : int
        Of ``rows_fed``, those fed from another host than their node's (a feeding task on one
        machine, the node on another): the rows that crossed the network. Absent where the
        driver reaches the nodes through a relay (a Spark Connect client they cannot reach).
    converted_once, converted_in_jvm, partitions_kept, epochs_fed_by_reference
        The backend's keys, where it has them: see :class:`FeedAdapterReport`.
    """

    epochs: int
    rows: int
    rows_fed: int
    rows_per_worker: Optional[int]
    rows_dropped_per_epoch: int
    terminated: bool
    seconds: float
    count_seconds: float
    epoch_seconds: List[float]


class StreamReport(TypedDict):
    """What the open feed of :meth:`duotf.Cluster.open_stream` reports (``stream.report()``),
    every key always present.

    Attributes
    ----------
    chunks : int
        The chunks fed, those with no row to feed included.
    rows_fed : int
        The rows sent to the nodes.
    rows_dropped : int
        The rows not fed: left over by ``balance`` (fewer than one per node), in a chunk of
        fewer rows than nodes, or fed after a node terminated its feed.
    seconds : float
        Spent feeding chunks: counting their rows, then their engine jobs.
    terminated : bool
        A node ended the feed early (``feed.terminate()``): the chunks fed after are dropped.
    ended : bool
        ``stream.end()`` was called: every node's feed ends after the rows fed.
    """

    chunks: int
    rows_fed: int
    rows_dropped: int
    seconds: float
    terminated: bool
    ended: bool


class SparkStreamReport(StreamReport):
    """What :func:`duotf.spark.feed_stream`'s handle reports (``stop()``, ``wait()``,
    ``report()``): a :class:`StreamReport` of its micro-batches (one chunk each), and:

    Attributes
    ----------
    chunks, rows_fed, rows_dropped, seconds, terminated, ended
        The open feed's counts, one chunk a micro-batch: see :class:`StreamReport`.
    batches_fed : int
        The micro-batches fed by this query.
    batches_skipped : int
        The micro-batches Spark replayed that had been fed before (a query started again on
        the same checkpoint location): not fed twice.
    """

    batches_fed: int
    batches_skipped: int


class DaskStreamReport(StreamReport):
    """What :func:`duotf.dask.feed_stream` returns: a :class:`StreamReport` of its chunks (the
    futures done at the same moment, fed together), and:

    Attributes
    ----------
    chunks, rows_fed, rows_dropped, seconds, terminated, ended
        The open feed's counts: see :class:`StreamReport`.
    futures : int
        The futures fed.
    """

    futures: int
