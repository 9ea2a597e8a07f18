"""The node's feed server: it accepts the feeding tasks' connections and queues their batches.

Feeding tasks connect to the node's feed port and push columnar batches into a bounded queue
(``capacity`` batches): when ``main`` does not consume, the queue fills, the connection stops
being read, and TCP pushes back on the feeding task, so memory stays bounded on both sides. The
driver sends "epoch" and "end" markers on the data path once every feeding task of an epoch has
been acknowledged, and starts the next epoch only when the node acknowledged the marker, so data
and markers are queued in order. ``main`` reads the queue through
:class:`duotf._transport.datafeed.DataFeed`.
"""

from __future__ import annotations

import collections
import logging
import mmap
import os
import queue
import socket
import threading
import weakref
from typing import Any, Dict, List, Optional

import numpy as np

from duotf._deadline import Deadline
from duotf._transport import gate
from duotf._transport import tls as tls_
from duotf._transport import wire
from duotf._transport.feeder import FeedMode
from duotf._transport.ports import create_server
from duotf._transport.wire import Frame, Marker
from duotf._transport.columns import slice_cols

# The feed's logger kept its name when the server moved out of datafeed.py: logging settings
# that name it keep working.
logger = logging.getLogger("duotf._transport.datafeed")

__all__ = ["FeedServer"]

_CACHE_DIR_PREFIX = "duotf-feedcache-"  # the folders of duotf.spark.feed_cache
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # map a frame's pages in one go (Linux)
_IDLE_RINGS = 8  # shared memory rings kept open for feeding processes between their feeds
# Read once: the feed compares every frame's kind with these, and in Python 3.11 an enum member
# read off its class costs several times a global (EnumType.__getattr__).
_BATCH, _FILE, _SLOT, _MARKER = Frame.BATCH, Frame.FILE, Frame.SLOT, Frame.MARKER
_EPOCH = Marker.EPOCH


def _shuffle_key(value) -> Optional[List[int]]:
    """The "shuffle" field of an "order" frame, four whole numbers (seed, epoch, target, rows
    a window or 0), or None."""
    if value is None:
        return None
    if (not isinstance(value, list) or len(value) != 4
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        raise wire.FeedProtocolError(f"a range's shuffle key is {value!r}, not four whole numbers")
    return value


class _Conn:
    """The node's side of one feeding connection: replies, and "free" messages for shared
    memory slots, which come from whichever thread drops a frame's last reference."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.lock = threading.Lock()
        self.broken = False
        #: the shuffling key of the range this connection sends (see _shuffle_key), or None
        self.shuffle: Optional[List[int]] = None
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
        deadline = Deadline.after(timeout)
        with self._cond:
            while True:
                if seq in self._delivered:
                    return self.DELIVERED, self._delivered[seq]
                if self.failure is not None:
                    return self.REFUSED, self._refusal(seq, self.failure)
                if self._terminated.is_set():
                    return self.TURN, None
                if self._next == seq and self._holder is None:
                    self._holder = seq
                    return self.TURN, None
                if seq < self._next:  # its turn was passed (pass_turn): its rows come late
                    return self.TURN, None
                if deadline.expired:
                    return self.WAIT, None
                self._cond.wait(deadline.remaining)

    def _refusal(self, seq: int, failure: dict) -> str:
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

    def fail(self, why: str, error: Optional[dict] = None) -> None:
        """The driver failed the feed: every range still to come is refused with ``why`` (and
        ``error``, the fields of the FeedError that failed it, where a feeding task did)."""
        with self._cond:
            if self.failure is None:
                self.failure = {"why": why, "epoch": self.epoch, "partition": None, "error": error}
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
                 max_pending: Optional[int] = None, tls: Optional[tls_.Material] = None):
        self._secret = secret
        self._tls = tls  # each feeding connection's TLS, where the job has it
        self._on_terminate = on_terminate
        self._on_failure = on_failure  # told at once when a range breaks after delivering rows
        #: why the driver failed the feed (a "fail" marker): the node's reads raise it
        self.failure: Optional[str] = None
        self.queue: "queue.Queue" = queue.Queue(maxsize=capacity)
        self.terminated = threading.Event()
        self._order = _Order(self.terminated)
        self._host = socket.gethostname()
        #: rows of ranges fed from another host since the last "end" marker, which takes them
        self._across = 0
        self._across_lock = threading.Lock()
        self._rings: Dict[str, _SharedRing] = {}
        self._rings_lock = threading.RLock()  # a frame may be dropped while it is held
        listener = create_server("0.0.0.0", backlog=1024, what="a node's feed server")  # DUOTF_PORTS
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
        try:
            sock = tls_.secure(sock, self._tls, server_side=True)
        except OSError as exc:  # ssl.SSLError is one: nothing of a range came yet
            logger.warning("duotf: a feeding connection to the feed server on port %d failed its "
                           "TLS handshake (%s)", self.port, exc)
            sock.close()
            return
        conn = _Conn(sock)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            # A feeding task's host that is lost without closing the connection must not keep
            # its turn for ever (its engine's retry waits behind it): its reads fail instead,
            # and the range ends in broken() like any other.
            wire.keepalive(sock)
            rows = 0
            # rows that came through the socket itself: a "file" frame is read from this
            # host's disk and a ring's slot from its shared memory, so neither crossed hosts,
            # whichever host named them (the driver names kept frames to the nodes)
            carried = 0
            seq = None  # this connection's place in the epoch's order (training)
            partition = origin = None
            while True:
                header, cols = wire.recv_frame(sock)
                kind = wire.frame_kind(header)
                if kind is _BATCH:
                    carried += header.get("rows", 0)
                elif kind is _SLOT:  # a frame in a shared memory ring
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
                    conn.shuffle = _shuffle_key(header.get("shuffle"))
                    if not self._wait_turn(seq, conn):
                        seq = None  # delivered before, or refused: it sends nothing more
                elif kind is _MARKER:
                    self._on_marker(header, conn)
                elif kind is Frame.END:
                    if seq is not None:
                        self._order.done(seq, rows, passed=bool(header.get("passed")))
                        seq = None
                        if carried and (origin or {}).get("host", self._host) != self._host:
                            with self._across_lock:
                                self._across += carried
                    if self.terminated.is_set():
                        conn.send(Frame.TERMINATED)
                    elif header.get("mode") == FeedMode.TRAIN:
                        conn.send(Frame.ACK, rows=rows)
                    rows = carried = 0
                else:  # a known kind, but one that only a node sends
                    raise wire.UnknownFrameError(f"a node takes no {kind.value!r} frame")
        except wire.UnknownFrameError as exc:  # a protocol error: the connection is closed
            logger.warning("duotf: closing a feed connection: %s", exc)
        except (ConnectionError, OSError, ValueError) as exc:
            logger.debug("feed connection ended: %s", exc)
        finally:
            sock.close()
            if seq is not None:  # a training range that never reached its end
                self._range_broken(seq, rows, partition, origin)
            self._release(conn, files)

    def _wait_turn(self, seq: int, conn: _Conn) -> bool:
        """Answer a range's "order" frame once its turn came: True when the connection may send
        the range; False when it was delivered before or the epoch was refused here."""
        status, detail = self._order.wait_turn(seq, wire.WAIT_S)
        while status == _Order.WAIT:
            conn.send(Frame.WAIT)
            status, detail = self._order.wait_turn(seq, wire.WAIT_S)
        if status == _Order.TURN:
            conn.send(Frame.TURN)
            return True
        if status == _Order.DELIVERED:
            conn.send(Frame.DELIVERED, rows=detail)
        else:
            failure = self._order.failure or {}
            conn.send(Frame.REFUSED, why=detail, epoch=self._order.epoch,
                      partition=failure.get("partition"), error=failure.get("error"))
        return False

    def _on_marker(self, header: dict, conn: _Conn) -> None:
        """A marker from the driver, on the data path: it is queued after every batch already
        queued and before any later one, and acknowledged only then."""
        marker = wire.marker_kind(header)
        if marker is Marker.FAIL:  # at once: whatever is queued is dropped
            self.fail(str(header.get("why") or "the feed failed"), header.get("error"))
            conn.send(Frame.ACK)
        elif self.terminated.is_set() or not self._put((_MARKER, marker, None)):
            conn.send(Frame.TERMINATED)
        else:
            self._order.reset()
            if marker is Marker.END:  # the feed's rows that came from another host
                with self._across_lock:
                    across, self._across = self._across, 0
                conn.send(Frame.ACK, across=across)
            else:
                conn.send(Frame.ACK)

    def _range_broken(self, seq: int, rows: int, partition, origin) -> None:
        failure = self._order.broken(seq, rows, partition, origin)
        if failure is not None:
            logger.warning("duotf: %s", failure["why"])
            if self._on_failure is not None:
                self._on_failure(failure)

    def _release(self, conn: _Conn, files: Dict[str, tuple]) -> None:
        """A connection ended: close the cache files it opened; its rings become idle."""
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
        rows: Any = frame_header.get("rows")  # a JSON value, checked below
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
        # JSON values, checked below (a name that names no ring finds none)
        name: Any = header.get("ring")
        slot, length = header.get("slot"), header.get("length")
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

    def fail(self, why: str, error: Optional[dict] = None) -> None:
        """The driver failed the feed: every read of ``main`` raises ``why``, queued data is
        dropped, and waiting feeding tasks are refused (with ``error``, where a feeding task
        failed it: each then raises that FeedError)."""
        if self.failure is None:
            self.failure = why
            self._order.fail(why, error)
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
