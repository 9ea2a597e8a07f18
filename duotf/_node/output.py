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

Noise that says nothing about the user's job is hidden unless the job is verbose
(:data:`VERBOSE_ENV` in the node's environment, which ``duotf.set_verbose`` gives it): the reader
drops TensorFlow's lines that :func:`tf_noise` matches before they count against the rate, and
the node process filters Keras's warnings about duotf's own datasets
(:func:`quiet_keras_notices`).
"""

from __future__ import annotations

import collections
import importlib
import os
import re
import sys
import threading
import time
import warnings
from typing import Callable, List, Mapping, Optional

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

#: the node environment's variable that says the job is verbose (``"1"``): nothing is hidden
VERBOSE_ENV = "DUOTF_VERBOSE"

# TensorFlow writes a few C++ log lines before it reads TF_CPP_MIN_LOG_LEVEL (absl's preamble and
# the oneDNN note, at every import), and one warning for every dataset made from a generator, as
# each of duotf's feed datasets is. TF_ENABLE_ONEDNN_OPTS is left alone: it changes numerics.
_TF_NOISE = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"
    r"|I\d{4} [\d:.]+ +\d+ \S+:\d+\] "  # a C++ INFO line: the level asks for none
    r"|W\d{4} [\d:.]+ +\d+ dataset\.cc:\d+\] Input of GeneratorDatasetOp::Dataset will not be "
    r"optimized because the dataset does not implement the AsGraphDefInternal\(\) method")

#: (category, start of the message) of Keras's warnings on every ``fit`` of a feed's dataset:
#: it is shuffled by the feed already, and one iteration of it is one epoch by design
KERAS_NOTICES = (
    (UserWarning, "`shuffle=True` was passed, but will be ignored since the data `x` was "
                  "provided as a tf.data.Dataset"),
    (UserWarning, "Your input ran out of data; interrupting training."),
)


def verbose(env: Mapping[str, str]) -> bool:
    """Whether a node with the environment ``env`` shows everything (see :data:`VERBOSE_ENV`)."""
    return env.get(VERBOSE_ENV) == "1"


def tf_noise(env: Mapping[str, str]) -> Optional[Callable[[str], bool]]:
    """What the relay of a node with the environment ``env`` hides: TensorFlow's start-up notes
    and generator-dataset warning, unless verbose or ``TF_CPP_MIN_LOG_LEVEL=0`` asks for them."""
    if verbose(env) or env.get("TF_CPP_MIN_LOG_LEVEL") == "0":
        return None
    return lambda line: _TF_NOISE.match(line) is not None


def import_tensorflow_quietly() -> None:
    """Import TensorFlow in a process whose stderr the user reads (the driver, a Spark or Dask
    worker that scores), without the lines :func:`tf_noise` hides in a node's output: those its
    C++ side writes while it loads, before it reads ``TF_CPP_MIN_LOG_LEVEL``. Anything else
    written to stderr during the import is written there once it ends."""
    hide = tf_noise(os.environ)
    if "tensorflow" in sys.modules or hide is None:
        importlib.import_module("tensorflow")
        return
    with _QUIET_IMPORT:  # one thread moves fd 2 (a Dask worker scores in several)
        if "tensorflow" not in sys.modules:
            _import_holding_stderr(hide)


_QUIET_IMPORT = threading.Lock()


def _import_holding_stderr(hide: Callable[[str], bool]) -> None:
    import tempfile

    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (AttributeError, ValueError, OSError):  # no stderr to hold back
        importlib.import_module("tensorflow")
        return
    # the level a node has by default, for the import (TensorFlow reads it once): its INFO
    # notes, such as the CPU instructions it was built without, not shown; the process's own
    # environment, which its children inherit, as it was after
    level = "TF_CPP_MIN_LOG_LEVEL" not in os.environ
    if level:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "1"
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            importlib.import_module("tensorflow")
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if level:
                os.environ.pop("TF_CPP_MIN_LOG_LEVEL", None)
            held.seek(0)
            kept = b"".join(line for line in held
                            if not hide(line.decode(errors="replace").rstrip("\r\n")))
            if kept:
                os.write(2, kept)


def quiet_keras_notices() -> None:
    """Filter :data:`KERAS_NOTICES` in this node process, unless its job is verbose."""
    if verbose(os.environ):
        return
    for category, text in KERAS_NOTICES:
        warnings.filterwarnings("ignore", message=re.escape(text), category=category)


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
    """Reads the node's output pipe ``fd`` and hands batches to ``send(lines, dropped)``; a
    line that ``hide`` (:func:`tf_noise`) matches is dropped uncounted."""

    def __init__(self, fd: int, send: Callable[[List[str], int], None], name: str = "output",
                 hide: Optional[Callable[[str], bool]] = None):
        self._fd = fd
        self._send = send
        self._hide = hide
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
            if self._hide is not None and self._hide(raw.decode("utf-8", "replace")):
                continue
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
                    batch: List[str] = []
                    dropped, size = 0, 0
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
