"""Frames through shared memory, for a feeding task and a node on the same host.

A TCP connection on loopback copies every byte twice (into the kernel, out of it) and the node
receives each frame into new pages; at MNIST-like rows that was half of what feeding cost. A
*ring* is instead a file in ``/dev/shm`` cut into a few slots of one frame each:

- the feeding task creates it, and announces it on the (authenticated) feed connection with a
  "ring" frame; the node opens it and answers which of its slots it still holds; the task then
  unlinks the file, so nothing is left behind whatever happens to either process;
- the task writes a frame into a free slot (one memory copy) and sends a small "slot" frame;
  the node maps that slot read-only, and its columns are views of the shared pages up to TF;
- the node says "free" once nothing refers to the slot any more (the mapping is gone), and only
  then does the task write into it again. A task that finds no free slot waits for that message
  on the connection, with the feed timeout, so a ring also bounds what is in flight.

Fresh pages are costly (on the test machines a 4 MiB frame into new shared pages took 50 times
as long as into pages already used), so a process keeps the rings of finished feeds for the next
feed to the same node: up to :data:`POOL_SIZE` idle rings, each closed when it has been idle
for :data:`POOL_IDLE_S` seconds at the next feed, or when the process exits.

A node that cannot open a ring (it sees another ``/dev/shm``, say) is fed over TCP, and this
process does not offer it a ring again for :data:`REFUSAL_S` seconds; then it asks again, so
that a long-lived process (a reused Spark Python worker) is not held to TCP by one refusal.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import mmap
import os
import socket
import threading
import time
import uuid
from typing import Callable, Dict, List, Optional, Tuple

from duotf._transport.wire import Frame

logger = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
PREFIX = "duotf-feedshm-"
SLOTS = 4
POOL_SIZE = 4
POOL_IDLE_S = 60.0
REFUSAL_S = 60.0  # a node that could not open a ring is fed over TCP this long, then asked again
_PAGE = mmap.ALLOCATIONGRANULARITY


class Ring:
    """The feeding side of a ring: the shared file, mapped writable, and which slots the node
    holds."""

    def __init__(self, slots: int, slot_bytes: int, folder: str = SHM_DIR):
        self.id = uuid.uuid4().hex
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.path: Optional[str] = os.path.join(folder, PREFIX + self.id)
        self.busy: set = set()  # slots the node may still read
        self.used = time.monotonic()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            # Allocated now, so that a full /dev/shm (Docker gives 64 MiB) is an error here and
            # never a SIGBUS on a later write.
            os.posix_fallocate(fd, 0, slots * slot_bytes)
            self.map = mmap.mmap(fd, slots * slot_bytes)
        except BaseException:
            os.close(fd)
            self.unlink()
            raise
        self.fd = fd
        self._next = 0

    def unlink(self) -> None:
        """Remove the file's name; the pages live on while the two sides keep it open."""
        if self.path is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self.path = None

    def close(self) -> None:
        self.unlink()
        self.map.close()
        os.close(self.fd)

    def freed(self, slots) -> None:
        self.busy.difference_update(slots)

    def _free_slot(self) -> Optional[int]:
        for i in range(self.slots):
            slot = (self._next + i) % self.slots
            if slot not in self.busy:
                return slot
        return None

    def put(self, parts: List[memoryview], size: int, wait_free: Callable[[], object]) -> int:
        """Copy a frame (its buffers, ``size`` bytes in all) into a free slot; return the slot.
        ``wait_free`` reads the node's next message (a "free") when every slot is held."""
        slot = self._free_slot()
        while slot is None:
            wait_free()
            slot = self._free_slot()
        pos = slot * self.slot_bytes
        for part in parts:
            self.map[pos:pos + len(part)] = part
            pos += len(part)
        self.busy.add(slot)
        self._next = slot + 1
        return slot


# -- the process's idle rings, by node ---------------------------------------------------------
_lock = threading.Lock()  # guards _idle and _refused
_idle: Dict[tuple, List[Ring]] = {}
_refused: Dict[tuple, float] = {}  # node -> when it could not open a ring (time.monotonic())


def _key(address: Tuple[str, int], secret: bytes) -> tuple:
    return (tuple(address), hashlib.sha256(secret).hexdigest()[:16])


def _refused_lately(key: tuple) -> bool:
    """Whether the node of ``key`` refused a ring less than :data:`REFUSAL_S` seconds ago."""
    with _lock:
        when = _refused.get(key)
        if when is None:
            return False
        if time.monotonic() - when < REFUSAL_S:
            return True
        del _refused[key]
        return False


def _take(key: tuple, slot_bytes: int) -> Optional[Ring]:
    now = time.monotonic()
    stale = []
    ring = None
    with _lock:
        for k, rings in list(_idle.items()):
            for r in list(rings):
                if now - r.used > POOL_IDLE_S:
                    rings.remove(r)
                    stale.append(r)
            if not rings:
                del _idle[k]
        for r in _idle.get(key, []):
            if r.slot_bytes >= slot_bytes:
                _idle[key].remove(r)
                ring = r
                break
    for r in stale:
        r.close()
    return ring


def give_back(address: Tuple[str, int], secret: bytes, ring: Ring) -> None:
    """Keep a ring whose feed ended well for the next feed to the same node (``address``)."""
    key = _key(address, secret)
    ring.used = time.monotonic()
    evicted = []
    with _lock:
        _idle.setdefault(key, []).append(ring)
        rings = sorted((r.used, id(r), k, r) for k, rs in _idle.items() for r in rs)
        for _, _, k, r in rings[:max(0, len(rings) - POOL_SIZE)]:
            _idle[k].remove(r)
            evicted.append(r)
    for r in evicted:
        r.close()


def close_idle() -> int:
    """Close every idle ring of this process (they are also closed at exit); return how many."""
    with _lock:
        rings = [r for rs in _idle.values() for r in rs]
        _idle.clear()
    for r in rings:
        r.close()
    return len(rings)


def same_host(sock: socket.socket) -> bool:
    try:
        return sock.getsockname()[0] == sock.getpeername()[0]
    except OSError:
        return False


def slot_bytes_for(frame_bytes: int) -> int:
    """A slot size that holds frames of about ``frame_bytes`` and their header, in pages."""
    want = frame_bytes + frame_bytes // 4 + (64 << 10)
    return -(-want // _PAGE) * _PAGE


def attach(sock: socket.socket, address, secret: bytes, frame_bytes: int,
           reply: Callable[..., dict], send: Callable[..., None]) -> Optional[Ring]:
    """A ring shared with the node at the other end of ``sock``, or None where there can be
    none (another host, no ``/dev/shm``, or the node could not open it)."""
    key = _key(address, secret)
    if not same_host(sock) or not os.path.isdir(SHM_DIR) or _refused_lately(key):
        return None
    slot_bytes = slot_bytes_for(frame_bytes)
    ring = _take(key, slot_bytes)
    while True:
        if ring is None:
            try:
                ring = Ring(SLOTS, slot_bytes)
            except OSError as exc:  # no room in /dev/shm, say
                logger.debug("duotf: no shared memory ring (%s); the feed goes over TCP", exc)
                return None
        fresh = ring.path is not None  # else a ring of an earlier feed, which the node may know
        try:
            send(Frame.RING, ring=ring.id, path=ring.path, slots=ring.slots, slot_bytes=ring.slot_bytes)
            header = reply(Frame.RING)
        except BaseException:
            ring.close()
            raise
        ring.unlink()  # the node opened it, or never will
        if header.get("ok"):
            ring.busy = set(header.get("held", ()))
            return ring
        ring.close()
        if fresh:
            logger.debug("duotf: node at %s cannot share memory (%s); the feed goes over TCP",
                         address, header.get("why"))
            with _lock:
                _refused[key] = time.monotonic()
            return None
        ring = None  # the node has let that ring go since: a new one


def _close_at_exit() -> None:
    try:
        close_idle()
    except Exception:  # noqa: BLE001 - at exit, nothing is left to tell
        pass


atexit.register(_close_at_exit)
