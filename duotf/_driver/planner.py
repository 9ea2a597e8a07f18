"""The driver's feed planner: which rows go to which worker, epochs, markers.

``Cluster.train`` and ``Cluster.inference`` come here. The planner asks the backend for a
:class:`~duotf.backends.base.FeedAdapter` of the data, plans each worker's rows
(:mod:`duotf._driver.dealing`), runs one engine job per epoch through the supervisor (a node's failure wins
over the job's), and queues epoch and end markers on every node's data path. It calls the
backend and the transport below it, and the supervisor's documented methods; nothing calls it
but the cluster.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import threading
import time
from typing import Any, List, Optional, Sequence, Set, Tuple

from duotf._deadline import Deadline
from duotf._verbosity import is_verbose
from duotf.backends.base import Backend, FeedAdapter, FeedOptions
from duotf.errors import ConfigError, DuotfError, FeedError, cause_of
from duotf.reports import StreamReport, TrainReport
from duotf.spec import seconds
from duotf._transport import wire
from duotf._transport.columns import ragged_columns
from duotf._transport.feeder import FeedJob, FeedMode
from duotf._transport.shuffle import partition_order
from duotf._driver.dealing import balance, local_order, shuffle_seed
from duotf._driver.nodes import TERMINAL
from duotf._driver.progress import FeedProgress
from duotf._driver.supervisor import FeedTarget, JobStopped, Supervisor

logger = logging.getLogger("duotf.feed")

__all__ = ["balance", "shuffle_seed", "train", "inference", "Stream"]


def _job(sup: Supervisor, targets: List[FeedTarget], mode: FeedMode, timeout: float, plan=None,
         ragged: Tuple[str, ...] = ()) -> FeedJob:
    return FeedJob(
        secret=sup.secret,
        addresses=[t.address for t in targets],
        labels=[t.label for t in targets],
        mode=mode,
        timeout=timeout,
        plan=plan,
        ragged=ragged,
        job_id=sup.job_id or "",
        tls=sup.tls,
    )


def _failure_error(what: str, failure, cause: Optional[str] = None, source: bool = False) -> FeedError:
    """The FeedError for a node's report that a training range broke after delivering rows.
    ``source``: the feeding task said its data source raised (``cause``); otherwise its process
    went away (killed, or its executor or worker lost): the error is ``lost``."""
    label, info = failure
    message = f"{what} failed on {label}: {info.get('why')}"
    if cause:
        message += f"; the feeding task's error: {cause}"
    return FeedError(message, epoch=info.get("epoch"), partition=info.get("partition"),
                     node=label, rows=info.get("rows"), cause=cause, lost=not source)


_GRACE = 3.0  # seconds a failed job waits for the node's error or report that says why


def _run(sup: Supervisor, adapter: FeedAdapter, job, what: str, stoppable: bool,
         targets: List[FeedTarget], feed: FeedJob):
    """The engine job's result; None when a node terminated its feed (``stoppable``). A node's
    failure is raised as it is; a training range that broke after delivering rows (a node
    reports it at once) fails the job as a FeedError naming the epoch, the partition and the
    node, with the feeding task's error where it is known; any other failure of the job as a
    FeedError whose first line says what failed, where, and why."""
    def stop_if():
        return (stoppable and sup.feed_terminated()) or sup.feed_failure() is not None

    ended_first = []  # the job had ended by itself when it was stopped: its error is a cause

    def release():  # tasks waiting for their turn on a node are refused at once
        ended_first.append(job.done())
        failure = sup.feed_failure()
        if failure is not None and not sup.feed_terminated():
            _end_feeds(sup, targets, _failure_error(what, failure).message)
            # Refused, the other tasks end within milliseconds, and so does the job: the error
            # of the task whose range broke (a failed data source) is then known, not cancelled
            # (on a busy machine that task took more than 1 s to return it: a job cancelled
            # then failed with its killed Python worker's error, named as the cause).
            job.join(_GRACE)

    try:
        # no grace here: _failed waits once, for a node's error or its report, whichever comes
        return sup.run_job(job, stop_if=stop_if, on_stop=release, node_error_grace=0)
    except JobStopped:
        if sup.feed_terminated():
            return None
        failure = sup.feed_failure()
        broken = job.exception() if job.done() else None
        if isinstance(broken, FeedError):
            # The node's report says what broke; the task's error adds its data source's error
            # where that is why. Another task's error (refused, or its connection to a node
            # that died meanwhile) is a consequence, not the cause.
            assert failure is not None  # a stopped feed job that did not end: a node reported why
            same = broken.cause is not None and broken.partition == failure[1].get("partition")
            raise _failure_error(what, failure, broken.cause if same else None, same) from broken
        # the job's own error, unless it is only our cancellation of it
        cancelled = "cancel" in f"{type(broken).__name__} {broken}".lower()
        cause = (adapter.job_error(broken).cause if broken is not None and (ended_first[:1] == [True] or not cancelled)
                 else None)
        raise _failure_error(what, failure, cause) from broken
    except FeedError as exc:
        _failed(sup, adapter, what, feed, exc, job)
    except DuotfError:
        raise
    except Exception as exc:
        _failed(sup, adapter, what, feed, exc, job)


def _failed(sup: Supervisor, adapter: FeedAdapter, what: str, feed: FeedJob, exc: BaseException,
            job=None):
    """Raise the error for a feed job that failed with ``exc``. A node that died is usually
    why (its error wins), or a node reports a range broken after delivering rows: one wait of
    up to ``_GRACE`` seconds for either, none when the task's data source failed before its
    first row or the node was stuck (nothing else is coming)."""
    # a data source that failed before its first row, or a node alive but stuck: none is coming
    if not (isinstance(exc, FeedError) and (exc.stuck or (exc.cause is not None and not exc.rows))):
        sup.wait_for(lambda: sup.feed_failure() is not None, Deadline.after(_GRACE))
    if sup.error is not None:
        try:
            sup.raise_if_failed()
        except DuotfError as node_error:
            raise node_error from exc
    failure = sup.feed_failure()
    if failure is not None:  # what broke, with the task's error where it says why (as above)
        same = (isinstance(exc, FeedError) and exc.cause is not None
                and exc.partition == failure[1].get("partition"))
        cause = (exc.cause if same and isinstance(exc, FeedError)
                 else None if isinstance(exc, FeedError) else adapter.job_error(exc).cause)
        raise _failure_error(what, failure, cause, same) from exc
    if isinstance(exc, FeedError):
        target = next((t for t in sup.feed_targets() if t.label == exc.node), None)
        if target is not None and exc.cause is None and sup.takes_no_feed(target.node_id):
            # the connection closed because main returned: the user's mistake, not a death
            raise FeedError(f"{what} failed on {exc.node}: its main returned without reading its "
                            f"feed to the end (partition {exc.partition} was being fed): read "
                            "every batch (while not feed.should_stop(): ...), or call "
                            "feed.terminate() to end the feed early", **exc.attributes) from exc
        raise exc
    said = adapter.job_error(exc)
    cause, partition, where = said.cause, said.partition, said.task
    runs = getattr(job, "task_partitions", None)
    if runs is not None and partition is not None and partition < len(runs) and runs[partition]:
        # the lost task fed a run of partitions (cached epochs on one host): name them. A
        # node reports a range broken mid-way (above); here no range broke: the task's
        # ranges that reached their nodes are delivered, the others never will be.
        pids = runs[partition]
        partition, node = pids[0], _node_of(feed, pids[0])
        others = (f" (and partition{'s' if len(pids) > 2 else ''} "
                  f"{', '.join(map(str, pids[1:]))}, fed by the same task)") if len(pids) > 1 else ""
        raise FeedError(f"{what} failed{f' on {node}' if node else ''}: the task feeding partition "
                        f"{partition} of epoch {feed.epoch}{others} was lost ({where}): "
                        f"{cause.rstrip('.')}; the rows of its partitions that had reached their "
                        "nodes are not sent again (each row reaches its node at most once)",
                        epoch=feed.epoch, partition=partition, node=node, cause=cause,
                        lost=True) from exc
    node = _node_of(feed, partition)
    place = f" on {node}" if node else ""
    task = f"the {where} failed" if where else "the engine's job failed"
    raise FeedError(f"{what} failed{place}: {task}: {cause}", epoch=feed.epoch,
                    partition=partition, node=node, cause=cause) from exc


def _node_of(feed: FeedJob, partition: Optional[int]) -> Optional[str]:
    """The node a partition's rows go to first (training: its plan; inference: by rank)."""
    if partition is None:
        return None
    if feed.plan is not None:
        ranges = feed.plan.get(partition) or []
        return feed.labels[ranges[0][0]] if ranges else None
    return feed.labels[partition % len(feed.labels)]


def _count(sup: Supervisor, adapter, targets: List[FeedTarget]) -> List[int]:
    """The rows of every partition. A count that fails fails the feed: every node's feed ends
    with the error (their reads raise), so no node waits for data that will not come."""
    try:
        return adapter.counts()
    except ConfigError:
        raise
    except BaseException as exc:
        if not isinstance(exc, Exception) or (isinstance(exc, DuotfError)
                                               and not isinstance(exc, FeedError)):
            # interrupted, or the engine refused: raised as it is, and the nodes told
            _end_feeds(sup, targets, f"counting the rows failed: {cause_of(exc)}")
            raise
        if sup.error is not None:  # a node died (its worker lost): that is why
            try:
                sup.raise_if_failed()
            except DuotfError as node_error:
                error = node_error
        elif isinstance(exc, FeedError):  # the adapter knows the partition
            error = FeedError(f"feeding epoch 1 failed: {str(exc).splitlines()[0]}",
                              **{**exc.attributes, "epoch": 1})
        else:
            said = adapter.job_error(exc)
            cause, partition, where = said.cause, said.partition, said.task
            counting = f"counting the rows of partition {partition}" if partition is not None \
                else "counting the rows"
            error = FeedError(f"feeding epoch 1 failed: {counting} failed"
                              f"{f' ({where})' if where else ''}: {cause}",
                              epoch=1, partition=partition, cause=cause)
        _end_feeds(sup, targets, str(error).splitlines()[0])
        raise error from exc


def _end_feeds(sup: Supervisor, targets: List[FeedTarget], why: str) -> None:
    """The feed failed: tell every node at once (a "fail" marker, not queued behind data), so
    that its reads raise ``why`` and the tasks waiting on it are refused. Best effort: a node
    that is gone needs nothing, nor does one that failed (a node given up for its silence may
    be cut off: connecting to it would only wait out the timeout)."""
    pending = [t for t in targets if sup.nodes[t.node_id].state not in TERMINAL]
    while pending:
        try:
            sent, error = sup.reach(functools.partial(
                wire.send_markers, [t.address for t in pending], sup.secret, wire.Marker.FAIL, 5.0,
                tls=sup.tls, why=why[:4000]))
        except Exception as exc:  # noqa: BLE001 - the engine job that would reach them failed
            sent, error = 0, f"{type(exc).__name__}: {exc}"
            pending = pending[:1]
        if error is None:
            return
        logger.debug("could not tell %s that the feed failed: %s", pending[sent].label, error)
        pending = pending[sent + 1:]


def _end_feeds_for(sup: Supervisor, targets: List[FeedTarget], exc: BaseException) -> None:
    """:func:`_end_feeds` for a failure while feeding; a ConfigError started nothing."""
    if not isinstance(exc, ConfigError):
        _end_feeds(sup, targets, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


def _markers(sup: Supervisor, targets: List[FeedTarget], kind: wire.Marker, timeout: float,
             epoch: Optional[int] = None) -> Optional[int]:
    """Queue an epoch/end marker on every target, on the data path, and wait for each ack.
    An "end" marker returns the feed's rows that crossed hosts (a feeding task on one, its
    node on another), where every node said (None: a relay stood between)."""
    pending = list(targets)
    answers: list = []
    while pending:
        sent, error = sup.reach(functools.partial(
            wire.send_markers, [t.address for t in pending], sup.secret, kind, timeout, answers,
            tls=sup.tls))
        if error is None:
            across = [a.get("across") for a in answers]
            return sum(across) if across and None not in across else None
        target = pending[sent]
        pending = pending[sent + 1:]
        if sup.takes_no_feed(target.node_id):
            continue  # this node needs no marker any more
        sup.expect_failure(3.0)
        raise FeedError(f"could not send the {kind} marker to {target.label}: {error}",
                        epoch=epoch, node=target.label)
    return None  # the last nodes needed no marker: what crossed is not known


@contextlib.contextmanager
def _feeding(sup: Supervisor, targets, progress: FeedProgress):
    """A feed's epochs or inference: on any error every node's feed ends with it (their reads
    raise, so cluster.wait() never hangs) before it is raised; the bar closes however it ends."""
    try:
        yield
    except BaseException as exc:
        _end_feeds_for(sup, targets, exc)
        raise
    finally:
        progress.close()


def train(sup: Supervisor, backend, data, epochs: int, feed_timeout: float, balanced: bool,
          ragged=(), progress: Optional[FeedProgress] = None,
          convert_once: Optional[bool] = None, first_epoch: int = 0,
          shuffle: Optional[int] = None, shuffle_rows: int = 0, local: bool = False) -> TrainReport:
    """Feed epochs ``first_epoch + 1`` to ``epochs`` (a restarted cluster resumes at
    ``first_epoch``, the epochs before it done); then the end marker. ``shuffle``: the seed
    of a shuffled feed (:mod:`duotf._transport.shuffle`), or None; ``shuffle_rows`` the rows
    of its nodes' windows (0: by size). ``local``: each epoch deals partitions to the targets
    on their hosts (:func:`local_order`)."""
    if epochs < 1:
        raise ConfigError(f"epochs={epochs}: must be >= 1")
    ragged = ragged_columns(ragged)
    progress = progress if progress is not None else FeedProgress(False)
    options = FeedOptions(job_id=sup.job_id or "", epochs=epochs - first_epoch, ragged=tuple(ragged),
                          convert_once=convert_once,  # (Spark converts in epoch 1: a resumed feed reads)
                          on_partition=progress.partition_done)
    adapter = backend.feed_adapter(data, len(sup.nodes), options)  # a ConfigError for bad data first
    try:
        report = _train(sup, adapter, epochs, feed_timeout, balanced, ragged, progress, first_epoch,
                        shuffle, shuffle_rows, local)
    except BaseException:
        if sup.error is None:  # the cluster goes on (bad data, say): its feed leaves nothing
            adapter.close()
            raise
        # A node failed: its error first, what the feed kept freed behind it (deleting Spark's
        # kept frames is an engine job, which can take seconds on a loaded cluster); the
        # cluster's shutdown or restart waits for that.
        sup.behind(adapter.close, "duotf-feed-close")
        raise
    adapter.close()
    return report


def _names(sup: Supervisor, targets: List[FeedTarget]) -> List[Set[str]]:
    """Each target's host names: its address, and the name its engine task's host gave."""
    nodes = {n.node_id: n for n in sup.nodes}
    return [{t.address[0]} | ({nodes[t.node_id].executor_id.rsplit(":", 1)[0]}
                              if nodes[t.node_id].executor_id else set()) for t in targets]


def _train(sup: Supervisor, adapter, epochs: int, feed_timeout: float, balanced: bool, ragged,
           progress: FeedProgress, first_epoch: int = 0, seed: Optional[int] = None,
           shuffle_rows: int = 0, local: bool = False) -> TrainReport:
    sup.check_running("train")
    targets = sup.feed_targets()
    adapter.check_capacity(len(sup.nodes))
    t0 = time.monotonic()
    counts = _count(sup, adapter, targets)
    count_seconds = time.monotonic() - t0
    plan, per, dropped = balance(counts, len(targets), drop_remainder=balanced)
    if dropped:
        # what balance=True does by design, on every fit: a warning only when asked for
        logger.log(logging.WARNING if is_verbose() else logging.DEBUG,
                   "duotf: %d rows left over after giving each of %d workers %d rows are not "
                   "fed (balance=False feeds everything, unevenly)", dropped, len(targets), per)
    job = dataclasses.replace(_job(sup, targets, FeedMode.TRAIN, feed_timeout, plan, ragged),
                              shuffle=seed, shuffle_rows=shuffle_rows)
    epoch_rows = sum(counts) if per is None else per * len(targets)
    fed, done, epoch_seconds = 0, 0, []
    with _feeding(sup, targets, progress):
        for epoch in range(first_epoch + 1, epochs + 1):
            t1 = time.monotonic()
            # the rows handed to the nodes, which queue them ahead of training (see progress)
            progress.start(f"feed epoch {epoch}/{epochs} (rows queued)", epoch_rows)
            if seed is not None:  # every epoch deals the rows out in an order of its own
                order = partition_order(len(counts), seed, epoch)
                job = dataclasses.replace(job, plan=balance(counts, len(targets), balanced, order)[0])
            elif local:  # where the data lies now (Spark's kept frames exist from epoch 1 on)
                order = local_order(counts, adapter.partition_hosts(), _names(sup, targets))
                job = dataclasses.replace(job, plan=balance(counts, len(targets), balanced, order)[0])
            feed = dataclasses.replace(job, epoch=epoch, epochs=epochs)  # names its tasks too
            sent = _run(sup, adapter, adapter.train(feed), feed.what, True, targets, feed)
            if sent is None:
                progress.finish()  # a node terminated the feed: the partitions counted so far
                break
            progress.finish(sum(sent))  # the epoch's own count: the bar ends where it did
            fed += sum(sent)
            done += 1
            t2 = time.monotonic()
            _markers(sup, targets, wire.Marker.EPOCH, feed_timeout, epoch)
            epoch_seconds.append(time.monotonic() - t1)
            logger.debug("duotf: epoch %d fed in %.3f s, its markers acknowledged in %.3f s",
                         epoch, t2 - t1, time.monotonic() - t2)
        across = _markers(sup, targets, wire.Marker.END, feed_timeout)
    report: TrainReport = {
        "epochs": done, "rows": sum(counts), "rows_fed": fed, "rows_per_worker": per,
        "rows_dropped_per_epoch": dropped, "terminated": sup.feed_terminated(),
        "seconds": time.monotonic() - t0, "count_seconds": count_seconds,
        "epoch_seconds": epoch_seconds, **adapter.report()}
    if seed is not None:
        report["shuffle_seed"] = seed
    if across is not None:
        report["rows_across_hosts"] = across
    return report


def inference(sup: Supervisor, backend, data, keep, result_columns, feed_timeout: float,
              ragged=(), progress: Optional[FeedProgress] = None):
    ragged = ragged_columns(ragged)
    progress = progress if progress is not None else FeedProgress(False)
    options = FeedOptions(job_id=sup.job_id or "", ragged=tuple(ragged),
                          on_partition=progress.partition_done)
    adapter = backend.feed_adapter(data, len(sup.nodes), options)
    sup.check_running("run inference")
    targets = sup.feed_targets()
    adapter.check_capacity(len(sup.nodes))
    job = _job(sup, targets, FeedMode.INFER, feed_timeout, ragged=ragged)
    with _feeding(sup, targets, progress):
        progress.start("inference", None)  # rows answered, where the engine says
        output = _run(sup, adapter, adapter.infer(job, keep, result_columns), job.what, False, targets,
                      job)
        progress.finish()
        _markers(sup, targets, wire.Marker.END, feed_timeout)
    return output


class Stream:
    """An open training feed: chunks of data (a Spark micro-batch, Dask partitions as they
    complete) fed one after another, which every node reads as one continuous stream.

    Each chunk is counted, balanced (:func:`balance`: with ``balanced`` every worker gets the
    same number of the chunk's rows, and the fewer than one-per-worker rows left over are not
    fed) and fed by one engine job, as one epoch of :func:`train` is, schema checks and
    exactly-once delivery of its ranges included. The ranges of a node are numbered on from
    the previous chunk's, so no marker separates chunks: a node's ``next_batch`` takes rows
    across them, and its feed ends (``should_stop()``, the end of ``dataset()``) only with
    :meth:`end`. :meth:`feed` returns once every row of the chunk is in the nodes' bounded
    queues: a caller that feeds chunks one after another (Spark's ``foreachBatch``) is pushed
    back by the slowest node. A chunk that fails ends every node's feed with the error (their
    reads raise) and raises it; the stream is then closed.
    """

    def __init__(self, sup: Supervisor, backend: Backend, feed_timeout: float, balanced: bool = True,
                 ragged: Sequence[str] = ()):
        sup.check_running("feed a stream")
        self._sup = sup
        self._backend = backend
        self._targets = sup.feed_targets()
        self._job = dataclasses.replace(
            _job(sup, self._targets, FeedMode.TRAIN, feed_timeout, ragged=ragged_columns(ragged)),
            stream=True)
        self._balanced = balanced
        self._seqs = [0] * len(self._targets)  # each target's next range number
        self._lock = threading.Lock()  # one chunk at a time, in the order fed
        self.chunks = 0  # chunks fed (those with no row to feed included)
        self.rows_fed = 0
        self.rows_dropped = 0  # left over by balance, or a chunk of fewer rows than workers
        self.seconds = 0.0  # spent feeding chunks (counting, then the engine jobs)
        self.error: Optional[BaseException] = None  # why the stream failed
        self.ended = False

    @property
    def terminated(self) -> bool:
        """A node terminated its feed (``feed.terminate()``): chunks fed after are dropped."""
        return self._sup.feed_terminated()

    def _check_open(self) -> None:
        if self.error is not None:
            raise FeedError(f"the stream failed earlier: {str(self.error).splitlines()[0]}")
        if self.ended:
            raise ConfigError("the stream was ended: open another with cluster.open_stream()")

    def feed(self, data: Any) -> int:
        """Feed one chunk (any data ``cluster.train`` takes); return the rows fed once every
        node has them queued. Rows of a chunk fed after a node terminated its feed are
        dropped (0)."""
        with self._lock:
            self._check_open()
            t0 = time.monotonic()
            options = FeedOptions(job_id=self._sup.job_id or "", convert_once=False)  # fed once
            adapter = self._backend.feed_adapter(data, len(self._sup.nodes), options)
            try:
                return self._feed(adapter)
            except BaseException as exc:
                self.error = exc
                _end_feeds_for(self._sup, self._targets, exc)
                raise
            finally:
                adapter.close()
                self.seconds += time.monotonic() - t0

    def _feed(self, adapter) -> int:
        sup, targets = self._sup, self._targets
        self.chunks += 1
        sup.check_running("feed a stream")
        adapter.check_capacity(len(sup.nodes))
        counts = _count(sup, adapter, targets)
        total = sum(counts)
        if sup.feed_terminated() or total < (len(targets) if self._balanced else 1):
            if total:
                logger.warning("duotf: stream chunk %d: its %d rows are not fed (%s)", self.chunks,
                               total, "a node terminated its feed" if sup.feed_terminated() else
                               f"fewer than one for each of {len(targets)} workers")
            self.rows_dropped += total
            return 0
        plan, per, dropped = balance(counts, len(targets), drop_remainder=self._balanced)
        if dropped:
            logger.info("duotf: stream chunk %d: %d rows left over after giving each of %d "
                        "workers %d are not fed", self.chunks, dropped, len(targets), per)
        plan = {pid: [(t, a, b, self._seqs[t] + seq) for t, a, b, seq in ranges]
                for pid, ranges in plan.items()}
        feed = dataclasses.replace(self._job, plan=plan, epoch=self.chunks)
        sent = _run(sup, adapter, adapter.train(feed), feed.what, True, targets, feed)
        if sent is None:  # a node terminated the feed meanwhile
            self.rows_dropped += total
            return 0
        for ranges in plan.values():
            for t, *_ in ranges:
                self._seqs[t] += 1
        self.rows_fed += sum(sent)
        self.rows_dropped += dropped
        return sum(sent)

    def end(self, timeout: Optional[float] = None) -> None:
        """End the stream: every node's feed ends after the rows already fed (an end marker on
        its data path). Idempotent; after a failure (the nodes were told then) it does nothing."""
        with self._lock:
            if self.ended or self.error is not None:
                return
            self.ended = True
            try:
                _markers(self._sup, self._targets, wire.Marker.END,
                         self._job.timeout if timeout is None else timeout)
            except BaseException as exc:
                self.error = exc
                _end_feeds_for(self._sup, self._targets, exc)
                raise

    def fail(self, why: str) -> None:
        """End every node's feed with an error (their reads raise ``why``): the stream's source
        failed. Idempotent."""
        with self._lock:
            if self.ended or self.error is not None:
                return
            self.error = FeedError(why)
            _end_feeds(self._sup, self._targets, why)

    def report(self) -> StreamReport:
        """The stream's counts so far (:class:`~duotf.reports.StreamReport`)."""
        return {"chunks": self.chunks, "rows_fed": self.rows_fed,
                "rows_dropped": self.rows_dropped, "seconds": self.seconds,
                "terminated": self.terminated, "ended": self.ended}


def check_feed_args(epochs, feed_timeout, convert_once=None, initial_epoch=0, locality=False,
                    shuffle=False) -> None:
    """The arguments of ``cluster.train`` (and a stream's), checked before anything is fed."""
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ConfigError(f"epochs={epochs!r}: give a whole number of epochs, 1 or more")
    if isinstance(initial_epoch, bool) or not isinstance(initial_epoch, int) or not (
            0 <= initial_epoch < epochs):
        raise ConfigError(f"initial_epoch={initial_epoch!r}: give the epochs done, 0 to {epochs - 1}")
    if convert_once not in (None, True, False):
        raise ConfigError(f"convert_once={convert_once!r}: give True, False or None")
    if locality and shuffle:
        raise ConfigError("locality=True deals each epoch's partitions by the host holding them, "
                          "shuffle=True by the seed: pass one of them")
    seconds(feed_timeout, "feed_timeout")
