"""The engine side of the feed: what runs in the engine's tasks, once per partition.

Training: each partition's rows go to the nodes its plan names (row ranges, see
:func:`balance`), in frames of a few MiB; the task ends when every node acknowledged that it
queued the rows. Inference: a partition goes to one node, and its results come back on the same
connection, in order; a reader thread takes them while the task still sends, so neither side
can block the other.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import queue
import socket
import sys
import threading
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np

from duotf._enum import StrEnum
from duotf.errors import FeedError, FeedProblem, FeedSchemaError, cause_of, feed_schema_error
from duotf._transport import shm
from duotf._transport import wire
from duotf._transport.tls import Material
from duotf._transport.wire import Frame
from duotf._transport.columns import Columns, concat_cols, num_rows, slice_cols, split

FRAME_BYTES = 4 << 20

logger = logging.getLogger(__name__)


class FeedMode(StrEnum):
    """What a feed job does: feed training rows, or rows to answer (inference)."""

    TRAIN = "train"
    INFER = "infer"


@dataclasses.dataclass(frozen=True)
class FeedJob:
    secret: bytes
    addresses: List[Tuple[str, int]]  # feed address of each target node, by feed rank
    labels: List[str]  # "worker:1 on host" per target, for errors
    mode: FeedMode
    timeout: float
    #: train: partition -> its ranges, each (target, start row, stop row, seq in the target's order)
    plan: Optional[Dict[int, List[Tuple[int, int, int, int]]]] = None
    ragged: Tuple[str, ...] = ()  # columns declared ragged: delivered as RaggedColumn
    job_id: str = ""  # the cluster's job id, for what the engine's UI shows
    epoch: Optional[int] = None  # train: the epoch (from 1) this engine job feeds, of ``epochs``
    epochs: int = 0
    #: train: this job feeds one chunk of an open stream (``epoch``: the chunk's number, from
    #: 1), not an epoch (:class:`duotf._driver.planner.Stream`)
    stream: bool = False
    #: train: the seed of a shuffled feed (:mod:`duotf._transport.shuffle`), or None
    shuffle: Optional[int] = None
    #: the job's TLS material where its feed is encrypted (:mod:`duotf._transport.tls`)
    tls: Optional[Material] = None
    shuffle_rows: int = 0  # rows in a node's shuffling window; 0: about shuffle.WINDOW_BYTES

    def __post_init__(self):
        object.__setattr__(self, "mode", FeedMode(self.mode))  # "train" -> FeedMode.TRAIN; a typo fails

    @property
    def work(self) -> str:
        """What this engine job does, as the engine's UI names it: ``"feed epoch 3/10"``,
        ``"feed stream chunk 3"`` or ``"inference"``."""
        if self.mode is FeedMode.TRAIN and self.stream:
            return f"feed stream chunk {self.epoch}"
        if self.mode is FeedMode.TRAIN:
            return f"feed epoch {self.epoch}/{self.epochs}" if self.epoch else "feed"
        return "inference"

    @property
    def key_prefix(self) -> str:
        """The start of this job's task names where an engine names tasks (Dask keys):
        ``"duotf-feed-<job id>-epoch-3"``, ``"duotf-infer-<job id>"``."""
        if self.mode is FeedMode.TRAIN and self.stream:
            return f"duotf-feed-{self.job_id}-chunk-{self.epoch}"
        if self.mode is FeedMode.TRAIN:
            return f"duotf-feed-{self.job_id}" + (f"-epoch-{self.epoch}" if self.epoch else "")
        return f"duotf-infer-{self.job_id}"

    @property
    def what(self) -> str:
        """What this job does, for the first words of its errors."""
        if self.stream:
            return f"feeding stream chunk {self.epoch}"
        return f"feeding epoch {self.epoch}" if self.epoch is not None else "inference"


class _SourceFailed(Exception):
    """The partition's own rows failed to come (its source raised), not the connection."""

    def __init__(self, error: BaseException):
        super().__init__(error)
        self.error = error


def _source_error(job: "FeedJob", pid: int, target: int, rows: int, exc: BaseException) -> FeedError:
    cause = cause_of(exc)
    when = f"after it sent {rows} rows" if rows else "before its first row"
    label = job.labels[target]
    return FeedError(f"{job.what} failed on {label}: the task feeding partition {pid} failed "
                     f"{when}, its data source raised {cause}", epoch=job.epoch, partition=pid,
                     node=label, rows=rows, cause=cause)


def origin() -> Dict[str, object]:
    """Where this feeding task runs, for the node's errors: host and pid, and the engine's task
    where one is known (Spark's stage, partition and attempt; Dask's worker)."""
    where: Dict[str, object] = {"host": socket.gethostname(), "pid": os.getpid()}
    if "pyspark" in sys.modules:
        try:
            from pyspark import TaskContext

            ctx = TaskContext.get()
            if ctx is not None:
                # as Spark names a task in its own errors ("task 0.1 in stage 3.0 (TID 7)")
                where["spark"] = (f"Spark task {ctx.partitionId()}.{ctx.attemptNumber()} in stage "
                                  f"{ctx.stageId()} (TID {ctx.taskAttemptId()})")
        except Exception:  # noqa: BLE001 - only a description
            pass
    if "distributed" in sys.modules:
        try:
            from distributed import get_worker

            where["dask"] = f"Dask worker {get_worker().address}"
        except Exception:  # noqa: BLE001 - not in a Dask worker
            pass
    return where


def same_shapes(cols: Columns, shapes: Dict[str, tuple], pid: int, pos: int) -> None:
    """Raise a placed :class:`FeedSchemaError` where an array column of ``cols`` (rows ``pos``
    on of partition ``pid``) has rows of another shape than the rows before it; ``shapes``
    holds the shapes seen so far in the partition, and learns new columns' shapes."""
    for name, values in cols.items():
        if isinstance(values, np.ndarray) and values.ndim > 1:
            shape = shapes.setdefault(name, values.shape[1:])
            if values.shape[1:] != shape:
                size, expected = int(np.prod(values.shape[1:])), int(np.prod(shape))
                raise feed_schema_error(
                    name, 0, FeedProblem.RAGGED,
                    f"rows of different lengths: {{where}} holds {size} "
                    f"values where the rows before it hold {expected}",
                    "a fixed-shape column needs one length in every row: filter or pad the "
                    "rows to one length, or declare the column ragged: "
                    f"cluster.train(..., ragged=[{name!r}])").located(pid, pos)


def validated(chunks: Iterable[Columns], pid: int) -> Iterator[Columns]:
    """``chunks`` of partition ``pid`` as they come, once each fits the rows before it: an array
    column keeps its row shape from chunk to chunk. A chunk refused while it was made (a
    :class:`FeedSchemaError` of the conversion) is placed in the partition: its row is counted
    from the partition's start. Any other error of the source (but a FeedError, which says itself
    what failed) becomes a :class:`_SourceFailed`, so that it is never taken for a connection
    that failed."""
    shapes: Dict[str, tuple] = {}
    pos = 0
    it = iter(chunks)
    while True:
        try:
            cols = next(it)
        except StopIteration:
            return
        except FeedSchemaError as exc:
            raise exc.located(pid, pos) from exc
        except FeedError:
            raise
        except Exception as exc:
            raise _SourceFailed(exc) from exc
        if isinstance(cols, wire.PACKED):
            pos += cols.rows
            yield cols
            continue
        same_shapes(cols, shapes, pid, pos)
        pos += num_rows(cols)
        yield cols


def _frames(chunks: Iterable[Columns]) -> Iterator[Columns]:
    for cols in chunks:
        if isinstance(cols, wire.PACKED):
            if cols.rows:
                yield cols  # already a frame
            continue
        n = num_rows(cols)
        if not n:
            continue
        row_bytes = sum(v.nbytes // max(len(v), 1) if hasattr(v, "nbytes") else 64 for v in cols.values())
        yield from split(cols, max(1, FRAME_BYTES // max(row_bytes, 1)))


def _fail(job: FeedJob, pid: int, target: int, exc: BaseException, rows: Optional[int] = None) -> FeedError:
    label = job.labels[target]
    stuck = isinstance(exc, socket.timeout)
    if stuck:
        why = (f"the node took no data for feed_timeout={job.timeout:g} s (alive but stuck: "
               "is its main reading its feed?)")
    else:
        why = f"the connection failed ({type(exc).__name__}: {exc}); the node may have died"
    return FeedError(f"{job.what} failed on {label}: feeding partition {pid}, {why}",
                     epoch=job.epoch, partition=pid, node=label, rows=rows, stuck=stuck)


class _Target:
    """A feeding task's connection to one node, and how frames reach that node: by TCP, as a
    cached file the node reads itself, or through a shared memory ring (:mod:`.shm`)."""

    def __init__(self, job: FeedJob, target: int, seq: Optional[int] = None,
                 pid: Optional[int] = None):
        self.job = job
        self.target = target
        self.reads_files: Optional[bool] = None  # asked once, with the first whole cached frame
        self.ring: Optional[shm.Ring] = None
        self._ring_tried = False
        #: an earlier attempt of this task delivered the whole range: send none of it
        self.delivered = False
        self.sock = wire.connect(job.addresses[target], job.secret, job.timeout, job.tls)
        if seq is not None:
            # The node reads this connection once its earlier ranges are queued; until then it
            # says it waits (every WAIT_S), so feed_timeout counts only a node that says nothing.
            shuffle = ({} if job.shuffle is None else
                       {"shuffle": [job.shuffle, job.epoch or 0, target, job.shuffle_rows]})
            self.send(Frame.ORDER, seq=seq, partition=pid, origin=origin(), **shuffle)
            while True:
                header = self.reply(Frame.WAIT, Frame.TURN, Frame.DELIVERED, Frame.REFUSED)
                if header["t"] == Frame.DELIVERED:
                    self.delivered = True
                elif header["t"] == Frame.REFUSED:
                    self.sock.close()
                    if header.get("error"):  # another task's error failed the feed: it, again
                        raise FeedError(**header["error"])
                    label = job.labels[target]
                    raise FeedError(f"feeding epoch {header.get('epoch')} failed on {label}: "
                                    f"{header.get('why')}", epoch=header.get("epoch") or job.epoch,
                                    partition=header.get("partition", pid), node=label)
                if header["t"] != Frame.WAIT:
                    break

    def reply(self, *kinds: Frame) -> dict:
        """The node's next answer of one of ``kinds``; slots it frees meanwhile are noted."""
        while True:
            header, _ = wire.recv_frame(self.sock)
            if header["t"] == Frame.FREE:
                if self.ring is not None and header.get("ring") == self.ring.id:
                    self.ring.freed(header["slots"])
                if not kinds:
                    return header
                continue
            if header["t"] in kinds:
                return header
            due = tuple(str(kind) for kind in kinds)
            raise wire.FeedProtocolError(f"the node answered {header['t']!r} where {due} was due")

    def send(self, kind: Frame, **fields) -> None:
        wire.send_frame(self.sock, kind, **fields)

    def send_frame(self, parts: List[memoryview], rows: int) -> None:
        size = sum(len(p) for p in parts)
        if not self._ring_tried:
            self._ring_tried = True
            self.ring = shm.attach(self.sock, self.job.addresses[self.target], self.job.secret,
                                   max(size, FRAME_BYTES), self.reply, self.send)
        if self.ring is not None and size <= self.ring.slot_bytes:
            slot = self.ring.put(parts, size, self.reply)
            self.send(Frame.SLOT, ring=self.ring.id, slot=slot, length=size, rows=rows)
        else:
            wire.send_parts(self.sock, parts)

    def send_file_frame(self, frame: wire.FileFrame) -> None:
        if self.reads_files is None:
            self.reads_files = wire.reads_files(self.sock, frame, self.reply)
        wire.send_packed(self.sock, frame, self.reads_files)

    def close(self, ok: bool) -> None:
        self.sock.close()
        if self.ring is not None:
            if ok:  # the node still holds some slots: it says which when the ring is next used
                shm.give_back(self.job.addresses[self.target], self.job.secret, self.ring)
            else:
                self.ring.close()
            self.ring = None


def feed_train(job: FeedJob, pid: int, chunks: Iterable[Columns]) -> int:
    """Send partition ``pid``'s rows by its plan; return the rows the nodes accepted.

    Each range goes on a connection of its own that first says the range's place in its node's
    order (``seq``), and ends as soon as the range is sent, so the node can go on with its next
    range while this task feeds another node."""
    assert job.plan is not None  # a training feed has a plan
    ranges = job.plan.get(pid, [])
    conns: Dict[int, _Target] = {}
    target = ranges[0][0] if ranges else 0

    def conn_for(target: int, seq: int) -> _Target:
        if target not in conns:
            conns[target] = _Target(job, target, seq, pid)
        return conns[target]

    ended = set()  # the ranges whose END went out

    def end(target: int, seq: int) -> None:
        conn = conn_for(target, seq)
        if not conn.delivered:
            conn.send(Frame.END, mode=FeedMode.TRAIN, partition=pid)
        ended.add((target, seq))

    sent = 0
    ok = False
    fed = target  # the target of the range being sent
    try:
        pos = 0
        for cols in _frames(validated(chunks, pid)):
            packed = cols if isinstance(cols, wire.PACKED) else None
            n = packed.rows if packed else num_rows(cols)
            for target, a, b, seq in ranges:
                lo, hi = max(a, pos), min(b, pos + n)
                if lo >= hi:
                    continue
                fed = target
                cols, packed = _send_rows(conn_for(target, seq), cols, packed, n, lo - pos, hi - pos)
                sent += hi - lo
                if hi == b:
                    end(target, seq)
            pos += n
        _check_count(job, pid, ranges, pos)
        for target, conn in conns.items():
            if not conn.delivered:  # terminated: the node wants no more data
                conn.reply(Frame.ACK, Frame.TERMINATED)
        ok = True
        return sent
    except FeedSchemaError:
        # Rows this partition refused are not sent, nor any after them. Its places in its
        # nodes' order are given up, so that the ranges after them are not held up waiting.
        _give_up_turns(pid, ranges, ended, end, conns)
        raise
    except _SourceFailed as exc:
        # Its connections close before their END: the node gives back the turn of a range that
        # had no row yet, and fails the epoch for one that had (exactly once).
        raise _source_error(job, pid, fed, sent, exc.error) from exc.error
    except (OSError, wire.FeedProtocolError) as exc:
        error = _fail(job, pid, fed, exc, sent)
        if error.stuck:
            _fail_stuck_node(job, pid, fed, error)
        raise error from exc
    finally:
        for conn in conns.values():
            conn.close(ok)


def _fail_stuck_node(job: FeedJob, pid: int, target: int, error: FeedError) -> None:
    """Node ``target`` took no data for ``feed_timeout`` (``error``): fail the feed of every node
    at once (the driver's "fail" marker, each on a connection of its own; the driver fails them
    all anyway when the error reaches it), the stuck one first. The epoch's other ranges are
    then refused with ``error`` itself, each task raising it again, instead of each waiting
    ``feed_timeout`` in turn (one partition after another, as the engine's free slots run
    them): whichever task's error the engine reports, it names the stuck node. A node that
    cannot be told is left to its ranges' own timeouts."""
    label = job.labels[target]
    why = (f"{label} took no data for feed_timeout={job.timeout:g} s, feeding partition {pid} "
           "(alive but stuck: is its main reading its feed?): the epoch cannot go on without it")
    fields = {"message": error.message, **error.attributes}
    order = [target] + [t for t in range(len(job.addresses)) if t != target]
    for t in order:
        told, failed = wire.send_markers([job.addresses[t]], job.secret, wire.Marker.FAIL,
                                         min(job.timeout, 5.0), tls=job.tls, why=why, error=fields)
        if not told:
            logger.debug("partition %d: telling %s that %s is stuck failed: %s", pid,
                         job.labels[t], label, failed)


def _send_rows(conn: _Target, cols, packed, n: int, start: int, stop: int):
    """Send rows ``start..stop`` of a frame of ``n`` rows on ``conn``: ``packed`` as it came
    (a cached file's frame, or one packed already) where it goes whole, else ``cols``. Returns
    ``(cols, packed)``, decoded once where a packed frame is split between targets."""
    if conn.delivered:  # by an earlier attempt of this task (the engine retried it)
        pass
    elif isinstance(packed, wire.FileRef):  # the node reads it, or its rows start..stop
        wire.send_file_ref(conn.sock, packed, start, stop)
    elif isinstance(packed, wire.FileFrame) and stop - start == n:
        conn.send_file_frame(packed)  # whole, as cached
    elif isinstance(packed, wire.Packed) and stop - start == n:
        conn.send_frame([memoryview(packed.data)], n)
    else:
        if packed:  # split between targets: only here is a cached frame decoded
            data = packed.read() if isinstance(packed, wire.FileFrame) else packed.data
            cols, packed = wire.unpack_frame(data)[1], None
        conn.send_frame(wire.frame_parts(Frame.BATCH, slice_cols(cols, start, stop)), stop - start)
    return cols, packed


def _check_count(job: FeedJob, pid: int, ranges: list, rows: int) -> None:
    """Raise :class:`FeedError` where partition ``pid`` gave fewer ``rows`` than its plan."""
    planned = max((b for _, _, b, _ in ranges), default=0)
    if rows < planned:
        raise FeedError(
            f"partition {pid} gave {rows} rows where {planned} were counted before feeding: the "
            "data changed between the count and the feed (a non-deterministic source?); "
            "cache() or persist() it first", epoch=job.epoch, partition=pid,
            node=job.labels[ranges[0][0]])


def _give_up_turns(pid: int, ranges: list, ended: set, end, conns: Dict[int, _Target]) -> None:
    """End partition ``pid``'s ranges not ``ended`` yet (with ``end(target, seq)``) and wait for
    their nodes' answers; a failure is logged, as the node's own error tells why."""
    try:
        for target, _, _, seq in ranges:
            if (target, seq) not in ended:
                end(target, seq)
        for conn in conns.values():
            conn.reply(Frame.ACK, Frame.TERMINATED)
    except (OSError, wire.FeedProtocolError) as exc:
        logger.debug("partition %d: giving up its turns failed: %s", pid, exc)


def pass_turn(job: FeedJob, pid: int) -> None:
    """Give up partition ``pid``'s places in its nodes' order without sending a row, so the
    ranges after it are not held up (its rows come later, out of order: a feed_cache file lost
    with its executor, fed again from the DataFrame)."""
    assert job.plan is not None  # a training feed has a plan
    for target, _, _, seq in job.plan.get(pid, []):
        conn = None
        try:
            conn = _Target(job, target, seq, pid)
            if not conn.delivered:  # "passed": the range's rows are still to come
                conn.send(Frame.END, mode=FeedMode.TRAIN, partition=pid, passed=True)
                conn.reply(Frame.ACK, Frame.TERMINATED)
        except (OSError, wire.FeedProtocolError) as exc:
            raise _fail(job, pid, target, exc) from exc
        finally:
            if conn is not None:
                conn.close(True)


def feed_infer(job: FeedJob, pid: int, chunks: Iterable[Columns],
               inputs: bool = True) -> Iterator[Tuple[Optional[Columns], Columns]]:
    """Send partition ``pid`` to its node; yield ``(input rows, their results)`` in input order
    (``inputs=False``: ``(None, results)``, for a caller that keeps its own rows: no input
    rows are kept here, or copied where a block of results spans two frames)."""
    target = pid % len(job.addresses)
    try:
        sock = wire.connect(job.addresses[target], job.secret, job.timeout, job.tls)
    except OSError as exc:
        raise _fail(job, pid, target, exc) from exc
    results: "queue.Queue" = queue.Queue()
    reader = _start_reader(sock, results)
    pending: "collections.deque" = collections.deque()  # input frames awaiting results
    waiting = 0

    def take(block: bool):
        nonlocal waiting
        while waiting:
            try:
                kind, payload = results.get(timeout=job.timeout) if block else results.get_nowait()
            except queue.Empty:
                if block:
                    raise _fail(job, pid, target, socket.timeout()) from None
                return
            if kind == Frame.RESULT:
                if num_rows(payload) > waiting:
                    raise FeedError(f"{job.labels[target]} sent more results than rows fed",
                                    partition=pid, node=job.labels[target])
                waiting -= num_rows(payload)
                yield _paired(pending, payload) if inputs else (None, payload)
            elif kind == Frame.TERMINATED:
                raise FeedError(f"{job.labels[target]} terminated its feed with {waiting} rows of "
                                f"partition {pid} unanswered: inference needs one result per row",
                                partition=pid, node=job.labels[target])
            else:
                raise _fail(job, pid, target, payload if isinstance(payload, BaseException) else
                            ConnectionError(kind))

    sent = 0
    try:
        for cols in _frames(validated(chunks, pid)):
            wire.send_frame(sock, Frame.BATCH, cols)
            sent += num_rows(cols)
            if inputs:
                pending.append(cols)
            waiting += num_rows(cols)
            yield from take(block=False)
        wire.send_frame(sock, Frame.END, mode=FeedMode.INFER, partition=pid)
        yield from take(block=True)
    except _SourceFailed as exc:
        raise _source_error(job, pid, target, sent, exc.error) from exc.error
    except OSError as exc:
        raise _fail(job, pid, target, exc, sent) from exc
    finally:
        # Shut down, let the reader see it, and only then close: a socket closed under a thread
        # blocked in it frees its descriptor for the next socket the process opens, and the
        # reader would wait on that one (seen once in CI: a reader left for the feed timeout).
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        reader.join(job.timeout)
        sock.close()


def _start_reader(sock: socket.socket, results: "queue.Queue") -> threading.Thread:
    """A thread that queues the node's answers on ``sock`` as ``(kind, columns)``, and how the
    connection ended as ``(None, exception)``."""
    def read():
        try:
            while True:
                header, cols = wire.recv_frame(sock)
                results.put((header["t"], cols))
        except BaseException as exc:  # handed to the sending thread, as no kind of frame
            results.put((None, exc))

    reader = threading.Thread(target=read, name="duotf-feed-results", daemon=True)
    reader.start()
    return reader


def _paired(pending: "collections.deque", res: Columns) -> Tuple[Columns, Columns]:
    """``(input rows, res)``: the first rows of the input frames ``pending`` answered by the
    results ``res``, taken off ``pending``."""
    need, parts = num_rows(res), []
    while need:
        head = pending[0]
        k = min(need, num_rows(head))
        parts.append(slice_cols(head, 0, k))
        if k == num_rows(head):
            pending.popleft()
        else:
            pending[0] = slice_cols(head, k, num_rows(head))
        need -= k
    return concat_cols(parts), res
