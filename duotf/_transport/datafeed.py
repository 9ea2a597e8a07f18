"""The node side of the engine feed: a feed server in every node process, and ``DataFeed``.

Feeding tasks connect to the node's feed port and push columnar batches into a bounded queue
(``capacity`` batches): when ``main`` does not consume, the queue fills, the connection stops
being read, and TCP pushes back on the feeding task, so memory stays bounded on both sides. The
driver sends "epoch" and "end" markers on the data path once every feeding task of an epoch has
been acknowledged, and starts the next epoch only when the node acknowledged the marker, so data
and markers are queued in order.
"""

from __future__ import annotations

import collections
import logging
import mmap
import os
import queue
import socket
import threading
import time
import weakref
from typing import Dict, List, Optional

import numpy as np

from duotf._transport import gate
from duotf._transport import malloc
from duotf._transport import wire
from duotf._transport.wire import Frame, Marker
from duotf._transport.columns import Columns, RaggedColumn, concat_cols, num_rows, slice_cols

logger = logging.getLogger(__name__)

__all__ = ["DataFeed", "FeedServer"]

_CACHE_DIR_PREFIX = "duotf-feedcache-"  # the folders of duotf.spark.feed_cache
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # map a frame's pages in one go (Linux)
_IDLE_RINGS = 8  # shared memory rings kept open for feeding processes between their feeds
# Read once: the feed compares every frame's kind with these, and in Python 3.11 an enum member
# read off its class costs several times a global (EnumType.__getattr__).
_BATCH, _FILE, _SLOT, _MARKER = Frame.BATCH, Frame.FILE, Frame.SLOT, Frame.MARKER
_EPOCH = Marker.EPOCH


class _Conn:
    """The node's side of one feeding connection: replies, and "free" messages for shared
    memory slots, which come from whichever thread drops a frame's last reference."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.lock = threading.Lock()
        self.broken = False
        self._freed: "collections.deque" = collections.deque()  # (ring, slot) to announce

    def send(self, kind: Frame, columns=None, **fields) -> None:
        if self.broken:
            return
        with self.lock:
            try:
                wire.send_frame(self.sock, kind, columns, **fields)
            except OSError:
                self.broken = True  # the feeding task is gone; the driver reports why
        self._flush_freed()

    def free(self, ring: str, slot: int) -> None:
        self._freed.append((ring, slot))
        self._flush_freed()

    def _flush_freed(self) -> None:
        # Never waits for the lock: its holder (maybe this very thread, when a frame is dropped
        # in the middle of a send) flushes after its own send.
        while self._freed and not self.broken:
            if not self.lock.acquire(blocking=False):
                return
            try:
                by_ring: Dict[str, List[int]] = {}
                while self._freed:
                    ring, slot = self._freed.popleft()
                    by_ring.setdefault(ring, []).append(slot)
                for ring, slots in by_ring.items():
                    wire.send_frame(self.sock, Frame.FREE, ring=ring, slots=slots)
            except OSError:
                self.broken = True
            finally:
                self.lock.release()


class _SharedRing:
    """A feeding process's shared memory ring, as the node sees it (see :mod:`.shm`): mapped
    once, read-only; a frame's columns are views of it."""

    def __init__(self, mapped: mmap.mmap, slots: int, slot_bytes: int):
        self.map = mapped
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.held: set = set()  # slots whose frames are still referred to here
        self.owner: Optional[_Conn] = None  # the connection that uses it now


class _Order:
    """A training epoch's ranges are queued in the order of the plan (``seq`` 0, 1, ... per node,
    see :func:`duotf._driver.planner.balance`), whichever feeding task connects first: a connection
    whose turn has not come is not read (its task waits, as TCP or its ring pushes back).

    It also keeps every row of an epoch delivered at most once. It remembers which ranges of
    the epoch delivered rows: a later connection for a range delivered whole (an engine's retry
    of a task whose first attempt died after its rows were acknowledged) is told so and sends
    nothing; a range whose connection broke after it delivered some rows (its task died) fails
    the epoch on this node, since a retry would send those rows again. A range whose connection
    broke before it delivered a row gives its turn back: a retry may take it.
    """

    TURN, WAIT, DELIVERED, REFUSED = "turn", "wait", "delivered", "refused"

    def __init__(self, terminated: threading.Event):
        self._cond = threading.Condition()
        self._next = 0
        self._holder: Optional[int] = None  # the range being read now
        self._delivered: Dict[int, int] = {}  # seq -> rows, for ranges delivered whole
        self._partial: Dict[int, int] = {}  # seq -> rows, for ranges that broke after some rows
        self.failure: Optional[dict] = None  # what failed the epoch here (see broken)
        self.epoch = 1  # the epoch being fed, counted by the driver's epoch markers
        self._terminated = terminated

    def wait_turn(self, seq: int, timeout: float):
        """``(TURN, None)`` once it is ``seq``'s turn (or the feed was terminated);
        ``(DELIVERED, rows)`` for a range already delivered whole; ``(REFUSED, why)`` once the
        epoch failed here; ``(WAIT, None)`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if seq in self._delivered:
                    return self.DELIVERED, self._delivered[seq]
                if self.failure is not None:
                    return self.REFUSED, self._refusal(seq)
                if self._terminated.is_set():
                    return self.TURN, None
                if self._next == seq and self._holder is None:
                    self._holder = seq
                    return self.TURN, None
                if seq < self._next:  # its turn was passed (pass_turn): its rows come late
                    return self.TURN, None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return self.WAIT, None
                self._cond.wait(remaining)

    def _refusal(self, seq: int) -> str:
        failure = self.failure
        if seq in self._partial:
            return (f"the engine retried the task feeding partition {failure['partition']} of "
                    f"epoch {failure['epoch']} after its first attempt died having delivered "
                    f"{self._partial[seq]} rows: a retry would send them again, so the epoch "
                    f"fails (each row reaches its node exactly once)")
        return failure["why"]

    def done(self, seq: int, rows: int, passed: bool = False) -> None:
        """Range ``seq`` ended with ``rows`` rows; ``passed``: it gave its turn up without its
        rows, which come later on another connection (not a delivery)."""
        with self._cond:
            if not passed:
                self._delivered[seq] = self._delivered.get(seq, 0) + rows
            if self._holder == seq:
                self._holder = None
            if seq == self._next:
                self._next += 1
            self._cond.notify_all()

    def broken(self, seq: int, rows: int, partition, origin: Optional[dict] = None) -> Optional[dict]:
        """A range's connection ended before its end: the epoch's failure (a dict) if it had
        delivered rows, else None (its turn is given back). ``origin``: where its feeding task
        ran, as the task said (:func:`duotf._transport.feeder.origin`)."""
        with self._cond:
            if self._holder == seq:
                self._holder = None
            failure = None
            if rows and seq not in self._delivered and not self._terminated.is_set():
                self._partial[seq] = rows
                if self.failure is None:
                    failure = self.failure = {
                        "why": f"the task feeding partition {partition} of epoch {self.epoch}"
                               f"{_where(origin)} stopped after it delivered {rows} rows, before "
                               f"the range's end "
                               f"(its process died, or it failed): an engine's retry would send "
                               f"those rows again, so the epoch fails (each row reaches its "
                               f"node exactly once)",
                        "epoch": self.epoch, "partition": partition, "seq": seq, "rows": rows}
            self._cond.notify_all()
            return failure

    def reset(self) -> None:
        """An epoch ended (every range of it was acknowledged): the next starts at 0."""
        with self._cond:
            self._next = 0
            self._holder = None
            self._delivered.clear()
            self._partial.clear()
            self.epoch += 1
            self._cond.notify_all()

    def fail(self, why: str) -> None:
        """The driver failed the feed: every range still to come is refused with ``why``."""
        with self._cond:
            if self.failure is None:
                self.failure = {"why": why, "epoch": self.epoch, "partition": None}
            self._cond.notify_all()

    def release(self) -> None:
        with self._cond:
            self._cond.notify_all()


def _where(origin: Optional[dict]) -> str:
    """`` (Spark task 0.0 in stage 3 (TID 7); pid 123 on host)``: where a feeding task ran."""
    if not isinstance(origin, dict):
        return ""
    parts = [str(origin[k]) for k in ("spark", "dask") if origin.get(k)]
    if origin.get("pid"):
        parts.append(f"pid {origin['pid']} on {origin.get('host', '?')}")
    return f" ({'; '.join(parts)})" if parts else ""


class FeedServer:
    """Accepts authenticated feeding connections and queues their batches.

    Connections authenticate at a :class:`duotf._transport.gate.Gate` (one thread for all of them, a
    deadline and a bounded number at once; refusals logged as counts); each authenticated one
    gets a thread. ``handshake_timeout`` and ``max_pending`` default to the gate's.
    """

    def __init__(self, secret: bytes, capacity: int = 8, on_terminate=None, *,
                 on_failure=None, handshake_timeout: Optional[float] = None,
                 max_pending: Optional[int] = None):
        self._secret = secret
        self._on_terminate = on_terminate
        self._on_failure = on_failure  # told at once when a range breaks after delivering rows
        #: why the driver failed the feed (a "fail" marker): the node's reads raise it
        self.failure: Optional[str] = None
        self.queue: "queue.Queue" = queue.Queue(maxsize=capacity)
        self.terminated = threading.Event()
        self._order = _Order(self.terminated)
        self._rings: Dict[str, _SharedRing] = {}
        self._rings_lock = threading.RLock()  # a frame may be dropped while it is held
        listener = socket.create_server(("0.0.0.0", 0), backlog=1024)
        self.port = listener.getsockname()[1]
        self.gate = gate.Gate(
            listener, secret, wire.MAGIC, wire.DOMAIN, self._admit,
            what=f"the feed server on port {self.port}", name="duotf-feed-gate",
            handshake_timeout=handshake_timeout, max_pending=max_pending,
        )

    def _admit(self, sock: socket.socket, nonce: bytes) -> None:
        threading.Thread(target=self._serve, args=(sock,), name="duotf-feed-conn", daemon=True).start()

    def _put(self, item) -> bool:
        while not self.terminated.is_set():
            try:
                self.queue.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _serve(self, sock: socket.socket) -> None:
        files: Dict[str, tuple] = {}  # feed cache files opened by this connection
        conn = _Conn(sock)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            # A feeding task's host that is lost without closing the connection must not keep
            # its turn for ever (its engine's retry waits behind it): its reads fail instead,
            # and the range ends in broken() like any other.
            wire.keepalive(sock)
            rows = 0
            seq = None  # this connection's place in the epoch's order (training)
            partition = origin = None
            while True:
                header, cols = wire.recv_frame(sock)
                kind = wire.frame_kind(header)
                if kind is _SLOT:  # a frame in a shared memory ring
                    header, cols = self._map_slot(header)
                    kind = _BATCH
                elif kind is _FILE:  # a cached frame on this host: read it from the file
                    header, cols = self._read_file_frame(header, files)
                    kind = _BATCH
                if kind is _BATCH:
                    rows += header.get("rows", 0)
                    if not self.terminated.is_set():
                        self._put((_BATCH, cols, conn))
                elif kind is Frame.PROBE:  # can this node read a feed cache file itself?
                    try:
                        self._open_cache_file(header["path"], files)
                        conn.send(Frame.PROBE, ok=True)
                    except (OSError, wire.FeedProtocolError) as exc:
                        conn.send(Frame.PROBE, ok=False, why=str(exc))
                elif kind is Frame.RING:
                    self._attach_ring(header, conn)
                elif kind is Frame.ORDER:  # read no further until the earlier ranges are queued
                    seq, partition = int(header["seq"]), header.get("partition")
                    origin = header.get("origin")
                    status, detail = self._order.wait_turn(seq, wire.WAIT_S)
                    while status == _Order.WAIT:
                        conn.send(Frame.WAIT)
                        status, detail = self._order.wait_turn(seq, wire.WAIT_S)
                    if status == _Order.TURN:
                        conn.send(Frame.TURN)
                    else:  # delivered before, or refused: this connection sends nothing more
                        seq = None
                        if status == _Order.DELIVERED:
                            conn.send(Frame.DELIVERED, rows=detail)
                        else:
                            conn.send(Frame.REFUSED, why=detail, epoch=self._order.epoch,
                                      partition=(self._order.failure or {}).get("partition"))
                elif kind is _MARKER:
                    # From the driver, on the data path: it is queued after every batch already
                    # queued and before any later one, and acknowledged only then.
                    marker = wire.marker_kind(header)
                    if marker is Marker.FAIL:  # at once: whatever is queued is dropped
                        self.fail(str(header.get("why") or "the feed failed"))
                        conn.send(Frame.ACK)
                    elif self.terminated.is_set() or not self._put((_MARKER, marker, None)):
                        conn.send(Frame.TERMINATED)
                    else:
                        self._order.reset()
                        conn.send(Frame.ACK)
                elif kind is Frame.END:
                    if seq is not None:
                        self._order.done(seq, rows, passed=bool(header.get("passed")))
                        seq = None
                    if self.terminated.is_set():
                        conn.send(Frame.TERMINATED)
                    elif header.get("mode") == "train":
                        conn.send(Frame.ACK, rows=rows)
                    rows = 0
                else:  # a known kind, but one that only a node sends
                    raise wire.UnknownFrameError(f"a node takes no {kind.value!r} frame")
        except wire.UnknownFrameError as exc:  # a protocol error: the connection is closed
            logger.warning("duotf: closing a feed connection: %s", exc)
        except (ConnectionError, OSError, ValueError) as exc:
            logger.debug("feed connection ended: %s", exc)
        finally:
            sock.close()
            if seq is not None:  # a training range that never reached its end
                failure = self._order.broken(seq, rows, partition, origin)
                if failure is not None:
                    logger.warning("duotf: %s", failure["why"])
                    if self._on_failure is not None:
                        self._on_failure(failure)
            for fd, _ in files.values():
                os.close(fd)
            with self._rings_lock:
                for ring in self._rings.values():
                    if ring.owner is conn:
                        ring.owner = None

    @staticmethod
    def _open_cache_file(path: str, files: Dict[str, tuple]) -> tuple:
        """``(fd, size)`` of a feed cache file, opened once per connection."""
        if not os.path.basename(os.path.dirname(path)).startswith(_CACHE_DIR_PREFIX):
            raise wire.FeedProtocolError(f"{path}: not a feed cache file")
        if path not in files:
            fd = os.open(path, os.O_RDONLY)
            files[path] = (fd, os.fstat(fd).st_size)  # cache files are written once, never changed
        return files[path]

    @classmethod
    def _read_file_frame(cls, header: dict, files: Dict[str, tuple]):
        """A cached frame, mapped from the file: its columns are views of the page cache (no
        read copy, no fresh pages), unmapped once TF no longer holds them."""
        path, offset, length = header["path"], header["offset"], header["length"]
        fd, size = cls._open_cache_file(path, files)
        if offset < 0 or length <= 0 or offset + length > size:
            raise wire.FeedProtocolError(f"{path}: frame at {offset} of {length} bytes lies outside "
                                         f"the file's {size}")
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        mapped = mmap.mmap(fd, offset + length - start, flags=mmap.MAP_SHARED | _MAP_POPULATE,
                           prot=mmap.PROT_READ, offset=start)
        frame_header, cols = wire.unpack_frame(memoryview(mapped)[offset - start:])
        rows = frame_header.get("rows")
        if rows != header.get("rows"):
            raise wire.FeedProtocolError(f"{path}: frame at {offset} is not the one announced")
        if "start" in header:  # only some of its rows (a range of the plan splits the frame)
            first, stop = header["start"], header.get("stop")
            if not (isinstance(first, int) and isinstance(stop, int) and 0 <= first < stop <= rows):
                raise wire.FeedProtocolError(f"{path}: rows {first}..{stop} of a frame of {rows}")
            cols = slice_cols(cols, first, stop)
            frame_header = {**frame_header, "rows": stop - first}
        return frame_header, cols

    def _attach_ring(self, header: dict, conn: _Conn) -> None:
        """Open a feeding process's new ring, or take back one it used before; answer which of
        its slots are still held here. Under the lock, so that no "free" for this ring goes out
        on the connection before the answer."""
        name = header.get("ring", "")
        with self._rings_lock:
            ring = self._rings.pop(name, None)
            if ring is None:
                try:
                    ring = self._open_ring(header)
                except (OSError, ValueError, TypeError, wire.FeedProtocolError) as exc:
                    conn.send(Frame.RING, ok=False, why=str(exc))
                    return
            self._rings[name] = ring  # the most recently used last
            ring.owner = conn
            conn.send(Frame.RING, ok=True, held=sorted(ring.held))
            # A feeding process that closed a ring cannot say so (its connection is gone):
            # keep only the most recent idle ones open. Frames still mapped stay valid.
            idle = [k for k, r in self._rings.items() if r.owner is None]
            for k in idle[:max(0, len(idle) - _IDLE_RINGS)]:
                del self._rings[k]  # unmapped once no frame of it is referred to

    @staticmethod
    def _open_ring(header: dict) -> _SharedRing:
        from duotf._transport import shm
        path = header.get("path")
        if not path:
            raise wire.FeedProtocolError(f"ring {header.get('ring')!r} is not known here")
        if os.path.dirname(path) != shm.SHM_DIR or not os.path.basename(path).startswith(shm.PREFIX):
            raise wire.FeedProtocolError(f"{path}: not a feed ring")
        slots, slot_bytes = int(header["slots"]), int(header["slot_bytes"])
        if slots <= 0 or slot_bytes <= 0 or slot_bytes % mmap.ALLOCATIONGRANULARITY:
            raise wire.FeedProtocolError(f"{path}: {slots} slots of {slot_bytes} bytes")
        fd = os.open(path, os.O_RDONLY)
        try:
            if os.fstat(fd).st_size != slots * slot_bytes:
                raise wire.FeedProtocolError(f"{path}: not {slots} slots of {slot_bytes} bytes")
            mapped = mmap.mmap(fd, slots * slot_bytes, flags=mmap.MAP_SHARED | _MAP_POPULATE,
                               prot=mmap.PROT_READ)
        finally:
            os.close(fd)  # the mapping stays
        return _SharedRing(mapped, slots, slot_bytes)

    def _map_slot(self, header: dict):
        """A frame in a ring's slot: its columns are views of the shared pages (the ring is
        mapped once), and the slot is announced free once nothing refers to them any more."""
        name, slot, length = header.get("ring"), header.get("slot"), header.get("length")
        with self._rings_lock:
            ring = self._rings.get(name)
            if ring is None or not isinstance(slot, int) or not 0 <= slot < ring.slots \
                    or not isinstance(length, int) or not 0 < length <= ring.slot_bytes:
                raise wire.FeedProtocolError(f"slot {slot!r} of {length!r} bytes in ring {name!r}")
            if slot in ring.held:
                raise wire.FeedProtocolError(f"slot {slot} of ring {name} was sent again before it was free")
            # the frame's own array: every column is a view of it, so it lives while they do
            frame = np.frombuffer(ring.map, np.uint8, count=length, offset=slot * ring.slot_bytes)
            ring.held.add(slot)
        weakref.finalize(frame, self._slot_freed, ring, name, slot)
        frame_header, cols = wire.unpack_frame(frame)
        if frame_header.get("rows") != header.get("rows"):
            raise wire.FeedProtocolError(f"slot {slot} of ring {name} is not the frame announced")
        return frame_header, cols

    def _slot_freed(self, ring: _SharedRing, name: str, slot: int) -> None:
        with self._rings_lock:
            ring.held.discard(slot)
            owner = ring.owner
        if owner is not None:
            owner.free(name, slot)

    def close(self) -> None:
        """Stop accepting connections (a node process simply exits instead)."""
        self.gate.close()

    def fail(self, why: str) -> None:
        """The driver failed the feed: every read of ``main`` raises ``why``, queued data is
        dropped, and waiting feeding tasks are refused."""
        if self.failure is None:
            self.failure = why
            self._order.fail(why)
        self.terminated.set()
        self._order.release()
        self._drain()
        try:  # wakes a read waiting for data: it raises the failure
            self.queue.put_nowait((_MARKER, Marker.FAIL, None))
        except queue.Full:
            pass

    def terminate(self) -> None:
        if not self.terminated.is_set() and self._on_terminate is not None:
            self._on_terminate()  # the driver stops feeding and its train() returns
        self.terminated.set()
        self._order.release()
        self._drain()

    def _drain(self) -> None:
        while True:
            try:
                self.queue.get_nowait()
            except queue.Empty:
                return


#: the attribute that marks a dataset of an inference feed (``DataFeed.dataset(train=False)``):
#: ``duotf.keras`` predicts such a dataset per worker under MultiWorkerMirroredStrategy
INFERENCE_DATASET = "duotf_inference_feed"


def _as_result_columns(results) -> Columns:
    if isinstance(results, dict):
        return {str(k): (v if isinstance(v, list) else np.asarray(v)) for k, v in results.items()}
    if hasattr(results, "numpy"):
        results = results.numpy()
    if isinstance(results, list) and results and isinstance(results[0], (str, bytes)):
        return {"prediction": results}
    return {"prediction": np.asarray(results)}


class DataFeed:
    """What ``main`` reads the engine's data from: ``ctx.get_data_feed(train=...)``.

    ``next_batch(n)``, ``should_stop()``, ``batch_results(results)`` and ``terminate()`` behave
    as in TensorFlowOnSpark; :meth:`dataset` is the fast path, a ``tf.data.Dataset`` of column
    dicts built without per-row Python work.
    """

    def __init__(self, server: FeedServer, train: bool = True,
                 input_mapping: Optional[Dict[str, str]] = None):
        self._server = server
        self.train = train
        self.input_mapping = dict(input_mapping) if input_mapping else None
        self.epoch = 0
        self._ended = False
        self._current: Optional[Columns] = None
        self._offset = 0
        self._current_conn = None
        self._owed: "collections.deque" = collections.deque()  # [conn, rows] awaiting results
        self._epoch_cut = False  # the rows last taken ended their epoch

    # -- reading ------------------------------------------------------------------------------
    def _raise_failure(self) -> None:
        if self._server.failure is not None:
            from duotf.errors import FeedError

            raise FeedError(f"the driver ended the feed: {self._server.failure}")

    def _fill(self, block: Optional[bool] = None):
        """Make a current batch available: True; False once the feed has ended (or, when not
        blocking, while nothing is queued); ``Marker.EPOCH`` when an epoch just ended. By
        default it blocks in training, and in inference only while no row read is owed its
        result (the feeding tasks may send nothing more before they get those results).
        Raises the feed's failure once the driver failed it, rows of a frame already taken
        included (they were dropped with the rest: the epoch cannot be read whole)."""
        if block is None:
            block = self.train or not self._owed
        self._raise_failure()
        while self._current is None or self._offset >= num_rows(self._current):
            self._raise_failure()
            if self._ended or self._server.terminated.is_set():
                return False
            try:
                kind, payload, conn = self._server.queue.get(block)
            except queue.Empty:
                return False
            if kind is _MARKER:
                if payload is Marker.END:
                    self._ended = True
                elif payload is _EPOCH:
                    self.epoch += 1
                    return _EPOCH
                continue
            self._current, self._offset, self._current_conn = payload, 0, conn
        return True

    def _consume(self, k: int) -> Columns:
        """The next ``k`` rows of the current frame (a view, no copy)."""
        cols = slice_cols(self._current, self._offset, self._offset + k)
        self._offset += k
        if not self.train:
            if self._owed and self._owed[-1][0] is self._current_conn:
                self._owed[-1][1] += k
            else:
                self._owed.append([self._current_conn, k])
        return cols

    def _mapped(self, cols: Columns) -> Columns:
        if self.input_mapping:
            return {self.input_mapping[k]: v for k, v in cols.items() if k in self.input_mapping}
        return cols

    def _take(self, n: int, stop_at_epoch: bool = False):
        """Up to ``n`` rows, never across an epoch's end: None once the data ended;
        ``Marker.EPOCH`` with ``stop_at_epoch`` when an epoch ends before any row (otherwise
        the next epoch's rows). ``self._epoch_cut`` tells whether the rows end their epoch."""
        parts = []
        self._epoch_cut = False
        # Inference returns a short batch rather than wait for rows that may only come after
        # the results of the rows already taken (the feeding task waits for those).
        while n > 0:
            status = self._fill(block=self.train or (not parts and not self._owed))
            if status is _EPOCH:
                if parts:
                    self._epoch_cut = True
                    break  # a batch never spans two epochs
                if stop_at_epoch:
                    return _EPOCH
                continue
            if not status:
                break
            k = min(n, num_rows(self._current) - self._offset)
            parts.append(self._consume(k))
            n -= k
        if not parts:
            return None
        return self._mapped(concat_cols(parts))

    def _take_block(self, max_rows: int, batch_size: int, stop_at_epoch: bool = False):
        """Whole batches from the current frame as one view (up to ``max_rows``), or else one
        batch assembled across frames (short at the end of an epoch or of the data); None and
        ``Marker.EPOCH`` as in :meth:`_take`."""
        self._epoch_cut = False
        status = self._fill()
        while status is _EPOCH:
            if stop_at_epoch:
                return _EPOCH
            status = self._fill()
        if not status:
            return None
        available = num_rows(self._current) - self._offset
        if available < batch_size:
            return self._take(batch_size, stop_at_epoch)
        k = min(max_rows, available) // batch_size * batch_size
        return self._mapped(self._consume(k))

    @property
    def unanswered(self) -> int:
        """Inference: rows read whose results have not been sent by :meth:`batch_results`."""
        return sum(rows for _, rows in self._owed)

    def check_answered(self, what: str) -> None:
        """Inference: raise :class:`~duotf.errors.FeedError` if rows read are still owed results.

        The feeding task waits for the results of the rows it sent before it ends, so a read
        (or a return of ``main``) that leaves results owed would otherwise hang until
        ``feed_timeout``."""
        missing = self.unanswered
        if missing:
            from duotf.errors import FeedError

            raise FeedError(
                f"{what} with {missing} rows read but not answered: inference needs "
                f"feed.batch_results(...) with one result per row read (call it with the "
                f"{missing} missing results first)", missing=missing)

    def next_batch(self, batch_size: int):
        """Up to ``batch_size`` rows: a dict of column arrays with ``input_mapping``, else a list
        of rows (tuples, or single values for one column).

        A column declared ragged (``cluster.train(..., ragged=[name])``) is a
        :class:`~duotf._transport.columns.RaggedColumn` in the dict (``values`` and ``row_splits``),
        and in a row the row's own values, a 1-D numpy array.

        A batch never spans two epochs: the last batch of an epoch may be short (by the same
        amount on every worker, since ``train`` balances rows). In inference a batch is also cut
        short when no more rows are queued, as the rows' results must go back first, and reading
        with rows still unanswered raises :class:`~duotf.errors.FeedError`."""
        self.check_answered("next_batch() was called")
        cols = self._take(batch_size)
        if cols is None:
            return {} if self.input_mapping else []
        return self._rows(cols)

    def batches(self, batch_size: int):
        """The batches of one epoch, as :meth:`next_batch` gives them: iterating stops at the
        epoch's end (nothing more once the data ended), so ``for batch in feed.batches(n)``
        is one epoch, and a checkpoint saved after it holds whole epochs (what a restart
        resumes from: ``ctx.report_checkpoint``)."""
        self.check_answered("batches() was called")
        while True:
            cols = self._take(batch_size, stop_at_epoch=True)
            if cols is None or cols is _EPOCH:
                return
            cut = self._epoch_cut
            yield self._rows(cols)
            if cut:
                return

    def _rows(self, cols):
        if self.input_mapping:
            return cols
        values = list(cols.values())
        if len(values) == 1:
            return list(values[0])
        return list(zip(*values))

    def should_stop(self) -> bool:
        """True once every row has been read (end of data) or the feed was terminated.

        In inference, calling it with rows still unanswered raises
        :class:`~duotf.errors.FeedError`."""
        self.check_answered("should_stop() was called")
        status = self._fill()
        while status is _EPOCH:
            status = self._fill()
        return self._server.terminated.is_set() or not status

    def batch_results(self, results) -> None:
        """Send inference results for the rows read so far, in order, one per input row."""
        cols = _as_result_columns(results)
        n = num_rows(cols)
        start = 0
        while start < n:
            if not self._owed:
                from duotf.errors import FeedError

                raise FeedError(f"batch_results got {n - start} more results than rows were read "
                                f"({n} results for {start} unanswered rows)", extra=n - start)
            conn, rows = self._owed[0]
            k = min(rows, n - start)
            conn.send(Frame.RESULT, slice_cols(cols, start, start + k))
            start += k
            if k == rows:
                self._owed.popleft()
            else:
                self._owed[0][1] -= k

    def terminate(self) -> None:
        """Stop reading: pending and future data is dropped and the driver's call returns."""
        self._server.terminate()

    def dataset(self, batch_size: int, *, features=None, label: Optional[str] = None,
                per_epoch: Optional[bool] = None, block_bytes: int = 4 << 20):
        """A ``tf.data.Dataset`` of this node's rows in batches of ``batch_size``.

        Without ``features`` and ``label`` an element is a dict ``{column: tensor}``; with them
        it is what Keras ``model.fit`` takes, ``(x, y)``: ``x`` the tensor of ``features`` when
        it is one name, a dict of tensors when it is a list (every column but ``label`` when
        it is None), ``y`` the tensor of ``label`` (just ``x`` without ``label``, for
        ``predict``). Names are column names after ``input_mapping``.

        With ``per_epoch`` (the default when ``features`` or ``label`` is given) one iteration
        of the dataset is one epoch of the feed, and iterating it again reads the next epoch,
        as ``fit(ds, epochs=n)`` does: as ``train`` balances rows, every worker runs the same
        number of steps per epoch, so ``fit`` needs no ``steps_per_epoch``. Otherwise one
        iteration reads every epoch.

        The dataset's auto-shard policy is OFF: the engine already gave each node its own
        rows, and ``MultiWorkerMirroredStrategy`` must not drop any. Note that under that
        strategy Keras treats ``batch_size`` as the global batch: each worker's step takes
        ``batch_size / num_workers`` of its own rows (TF's rebatching).

        Batches follow the same rules as :meth:`next_batch` (never across epochs). Rows move
        from Python to TF in blocks of whole batches (about ``block_bytes``), each a view of one
        received frame where possible, and TF splits them: there is no per-row and little
        per-batch Python work. A column declared ragged is a ``tf.RaggedTensor`` of shape
        ``(rows, None)``.

        **Inference** (``train=False``): a feeding task sends its partition's later rows only
        once the earlier ones are answered, and the feed ends only once every row is answered,
        so a dataset of the whole feed could never end. One iteration of an inference feed's
        dataset is the rows queued now: it waits for the first, then ends as soon as none is
        queued while the rows read are unanswered (rows answered as they are read, batch by
        batch, let it read on). Answer them (``batch_results``) and ask again::

            while not feed.should_stop():
                feed.batch_results(model.predict(feed.dataset(256, features="x"), verbose=0))

        The dataset is marked (:data:`INFERENCE_DATASET`) so that ``model.predict`` under a
        multi-worker ``MultiWorkerMirroredStrategy`` predicts this worker's rows alone
        (:mod:`duotf.keras`): there, Keras's ``predict`` otherwise gathers every worker's
        predictions, step by step, and needs every worker to take the same number of steps.
        """
        import tensorflow as tf

        if not self.train:
            self.check_answered("dataset() was called")
        if per_epoch is None:
            per_epoch = features is not None or label is not None
        first = self._take(batch_size)
        if first is None:
            raise ValueError("the feed ended before any data arrived")
        pending = [first, self._epoch_cut]

        def spec(v):
            if isinstance(v, list):
                return tf.TensorSpec((None, None), tf.string)
            if isinstance(v, RaggedColumn):
                return tf.RaggedTensorSpec((None, None, None), tf.as_dtype(v.dtype), ragged_rank=2,
                                           row_splits_dtype=tf.int64)
            return tf.TensorSpec((None, None, *v.shape[1:]), tf.as_dtype(v.dtype))

        def stacked(cols, start, stop, k):
            # rows [start, stop) as k batches: shape (k, (stop - start) // k, ...)
            out = {}
            for name, v in cols.items():
                part = v[start:stop]
                if isinstance(part, RaggedColumn):
                    out[name] = tf.RaggedTensor.from_uniform_row_length(
                        part.to_tensor(), (stop - start) // k, validate=False)
                    continue
                if isinstance(part, list):
                    part = np.asarray(part, dtype=object)
                out[name] = part.reshape(k, (stop - start) // k, *part.shape[1:])
            return out

        signature = {k: spec(v) for k, v in first.items()}
        xy = _xy_selector(list(signature), features, label)
        row_bytes = sum(v.nbytes // max(len(v), 1) if isinstance(v, (np.ndarray, RaggedColumn)) else 64
                        for v in first.values())
        per_block = batch_size * max(1, block_bytes // max(row_bytes * batch_size, 1))

        def blocks():
            malloc.retune_after_tf()  # TF's from_generator has just set its trim threshold
            if pending[0] is not None:  # the batch read above, to learn the columns
                cols, cut = pending
                pending[0] = None
            else:
                cols = self._take_block(per_block, batch_size, stop_at_epoch=per_epoch)
                cut = self._epoch_cut
            while cols is not None and cols is not _EPOCH:
                n = num_rows(cols)
                full = n // batch_size * batch_size
                if full:
                    yield stacked(cols, 0, full, full // batch_size)
                if full < n:  # the short batch at the end of an epoch, or of the data
                    yield stacked(cols, full, n, 1)
                if per_epoch and cut:
                    return
                cols = self._take_block(per_block, batch_size, stop_at_epoch=per_epoch)
                cut = self._epoch_cut

        ds = tf.data.Dataset.from_generator(blocks, output_signature=signature).unbatch()
        if xy is not None:
            ds = ds.map(xy)
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        ds = ds.with_options(options)
        if not self.train:
            setattr(ds, INFERENCE_DATASET, True)
        return ds


def _xy_selector(columns: List[str], features, label: Optional[str]):
    """A function of a batch dict giving ``(x, y)`` (or ``x``), or None for the dict itself."""
    if features is None and label is None:
        return None
    from duotf.errors import ConfigError

    names = [features] if isinstance(features, str) else (
        [c for c in columns if c != label] if features is None else list(features))
    for name in names + ([label] if label is not None else []):
        if name not in columns:
            raise ConfigError(f"dataset(): no column {name!r} in the feed (its columns: "
                              f"{', '.join(map(repr, columns))}); name columns as "
                              f"input_mapping maps them", column=name)
    if label is not None and label in names:
        raise ConfigError(f"dataset(): column {label!r} is both a feature and the label",
                          column=label)
    single = isinstance(features, str) or (features is None and len(names) == 1)

    def select(batch):
        x = batch[names[0]] if single else {name: batch[name] for name in names}
        return x if label is None else (x, batch[label])

    return select
