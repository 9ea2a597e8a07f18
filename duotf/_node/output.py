"""A node's output on its way to the driver (task side; the driver's end is :mod:`duotf._driver.nodelogs`).

The agent gives its node process one pipe as both fd 1 and fd 2, so everything the process and
its children write - ``print``, tracebacks, ``logging``'s stream handlers, C and C++ output
such as TensorFlow's - arrives here in the order it was written. Two threads of the agent's
carry it on:

* the reader splits the bytes into lines, cuts a line at :data:`MAX_LINE` bytes, and admits
  lines at :data:`LINE_RATE` lines/s and :data:`BYTE_RATE` bytes/s (with a burst allowance);
  what is over is dropped and counted (then every line for :data:`DROP_SPELL`, so that a
  flood gives one count a second, not a note between every few lines), never waited for, so the node is never slowed down by
  its own output. The pipe is read at once whatever the driver does.
* the sender sends what was admitted in batches, one :data:`~duotf._transport.rendezvous.Msg.LOG` frame
  each (``lines`` and ``dropped``, the lines dropped just before them), over the agent's
  authenticated channel. If the driver is slow, at most :data:`QUEUE_LINES` lines wait; more
  are dropped and counted too.

:meth:`OutputRelay.drain` returns once every line written before the pipe closed was sent: the
agent reports a node's failure only after its output.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import Callable, List

#: bytes of one line kept; the rest is cut and the cut said
MAX_LINE = 8 * 1024
#: lines per second a node may send on average, and as a burst
LINE_RATE, LINE_BURST = 1000, 5000
#: bytes per second a node may send on average, and as a burst
BYTE_RATE, BYTE_BURST = 1 << 20, 4 << 20
#: seconds a node's lines are dropped once one was: its count then goes out once, not a note
#: between every few lines of a flood
DROP_SPELL = 1.0
#: lines waiting for the sender at most
QUEUE_LINES = 20000
#: lines (and bytes) in one LOG frame at most
BATCH_LINES, BATCH_BYTES = 2000, 1 << 20
_READ = 64 * 1024


class TokenBucket:
    """A token bucket: ``take(n)`` is true when ``n`` tokens were there."""

    def __init__(self, rate: float, burst: float):
        self.rate, self.burst = rate, burst
        self.tokens = burst
        self.at = time.monotonic()

    def refill(self, now: float) -> None:
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now


class OutputRelay:
    """Reads the node's output pipe ``fd`` and hands batches to ``send(lines, dropped)``."""

    def __init__(self, fd: int, send: Callable[[List[str], int], None], name: str = "output"):
        self._fd = fd
        self._send = send
        self._queue: "collections.deque" = collections.deque()
        self._dropped = 0  # lines dropped since the last batch went out
        self._cond = threading.Condition()
        self._eof = False
        self._lines = TokenBucket(LINE_RATE, LINE_BURST)
        self._bytes = TokenBucket(BYTE_RATE, BYTE_BURST)
        self._dropping_until = 0.0
        self._sent_all = threading.Event()
        self.threads = [
            threading.Thread(target=self._read, name=f"duotf-agent-{name}-read", daemon=True),
            threading.Thread(target=self._deliver, name=f"duotf-agent-{name}-send", daemon=True),
        ]
        for thread in self.threads:
            thread.start()

    # -- reader ---------------------------------------------------------------------------
    def _admit(self, lines: List[bytes]) -> None:
        now = time.monotonic()
        self._lines.refill(now)
        self._bytes.refill(now)
        kept, dropped = [], 0
        for raw in lines:
            if len(raw) > MAX_LINE:
                raw = raw[:MAX_LINE] + f" [... {len(raw) - MAX_LINE} bytes cut]".encode()
            size = len(raw) + 1
            if now < self._dropping_until:
                dropped += 1
            elif self._lines.tokens >= 1 and self._bytes.tokens >= size:
                self._lines.tokens -= 1
                self._bytes.tokens -= size
                kept.append(raw.decode("utf-8", "replace"))
            else:
                dropped += 1
                self._dropping_until = now + DROP_SPELL
        with self._cond:
            room = QUEUE_LINES - len(self._queue)
            if len(kept) > room:
                dropped += len(kept) - room
                kept = kept[:max(room, 0)]
            for line in kept:
                # a line carries the count of those dropped just before it
                self._queue.append((line, self._dropped))
                self._dropped = 0
            self._dropped += dropped
            self._cond.notify_all()

    def _read(self) -> None:
        pending = b""
        try:
            while True:
                try:
                    chunk = os.read(self._fd, _READ)
                except InterruptedError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    break
                pending += chunk
                *lines, pending = pending.split(b"\n")
                if len(pending) > MAX_LINE:  # a line with no end in sight: cut it now
                    lines.append(pending)
                    pending = b""
                if lines:
                    self._admit([line.rstrip(b"\r") for line in lines])
            if pending:
                self._admit([pending])
        finally:
            try:
                os.close(self._fd)
            except OSError:
                pass
            with self._cond:
                self._eof = True
                self._cond.notify_all()

    # -- sender ---------------------------------------------------------------------------
    def _deliver(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._queue and not self._eof:
                        self._cond.wait()
                    if not self._queue and self._eof:
                        tail_dropped, self._dropped = self._dropped, 0
                        if tail_dropped:
                            self._try_send([], tail_dropped)
                        return
                    batch, dropped, size = [], 0, 0
                    while self._queue and len(batch) < BATCH_LINES and size < BATCH_BYTES:
                        line, before = self._queue.popleft()
                        if before and batch:  # a gap: the count goes out ahead of this line
                            self._queue.appendleft((line, before))
                            break
                        dropped += before
                        batch.append(line)
                        size += len(line)
                self._try_send(batch, dropped)
        finally:
            self._sent_all.set()

    def _try_send(self, lines: List[str], dropped: int) -> None:
        try:
            self._send(lines, dropped)
        except (OSError, ValueError):
            pass  # the driver is gone: the agent stops the node; nothing is waited for

    def drain(self, timeout: float) -> bool:
        """Wait until the pipe closed and everything admitted was sent; True if it did."""
        return self._sent_all.wait(timeout)

    def join(self, timeout: float) -> None:
        for thread in self.threads:
            thread.join(timeout)
