"""``ctx.report``'s way to the driver (task side; the driver's end is :mod:`duotf._driver.metrics`).

:meth:`Reporter.report` checks a report (a step and named numbers), stamps it with the node's
clock, and queues it; it never waits. One thread of the node process sends what is queued to
the agent in batches, one ``ChildMsg.REPORT`` each, over the pipe the agent reads at once;
the agent relays each batch as a :data:`~duotf._transport.rendezvous.Msg.REPORT` frame on its
authenticated channel. One thread, one pipe, one connection: a node's reports arrive in the
order it made them.

Bounded: reports are admitted at :data:`RATE` a second on average (bursts of :data:`BURST`),
and at most :data:`QUEUE` wait for the sender; what is over is dropped and counted, and the
count travels with the next batch (the driver logs it). Training is never made to wait.
"""

from __future__ import annotations

import collections
import numbers
import threading
import time
from typing import Callable, Dict, Optional

from duotf._deadline import Deadline
from duotf._node.output import TokenBucket
from duotf.errors import ConfigError

__all__ = ["Reporter", "check_report", "RATE", "BURST", "QUEUE", "MAX_METRICS"]

#: reports per second a node may send on average, and as a burst
RATE, BURST = 50, 500
#: reports waiting for the sender at most
QUEUE = 5000
#: reports in one batch at most
BATCH = 500
#: metrics in one report at most, and the longest metric name
MAX_METRICS, MAX_NAME = 100, 200


def _number(value) -> float:
    if isinstance(value, (bool, str, bytes)) or value is None:
        raise TypeError
    if isinstance(value, numbers.Real):
        return value if isinstance(value, int) else float(value)
    return float(value)  # numpy scalars, 0-d arrays and tensors


def check_report(step, metrics: Dict[str, object]) -> tuple:
    """``(step, {name: number})`` of a valid report, or the :class:`ConfigError` that says why
    not. Numbers are ints and floats (numpy scalars, 0-d arrays and scalar tensors become
    floats; NaN and infinities are kept, a diverging loss is worth seeing)."""
    if step is not None and (isinstance(step, bool) or not isinstance(step, numbers.Integral)):
        raise ConfigError(f"ctx.report(step={step!r}): step must be a whole number (or left out: "
                          "the node's count of reports)")
    if not metrics:
        raise ConfigError("ctx.report() got no metrics: pass them as keywords, "
                          "ctx.report(step=10, loss=0.25)")
    if len(metrics) > MAX_METRICS:
        raise ConfigError(f"ctx.report() got {len(metrics)} metrics; a report takes at most "
                          f"{MAX_METRICS}: report fewer, or in several reports")
    out = {}
    for name, value in metrics.items():
        if len(name) > MAX_NAME or name in ("node", "step", "time"):
            raise ConfigError(f"ctx.report({name[:40]}=...): a metric name is at most {MAX_NAME} "
                              "characters and not 'node', 'step' or 'time' (cluster.metrics' own "
                              "columns)")
        try:
            number = _number(value)
        except (TypeError, ValueError):
            raise ConfigError(
                f"ctx.report({name}={value!r}): metric values must be numbers (int, float, a numpy "
                f"scalar or a scalar tensor), not {type(value).__name__}; report a number, or "
                "print other values (they reach the driver's log)") from None
        if isinstance(number, int) and not -(1 << 63) <= number < (1 << 63):
            number = float(number)
        out[name] = number
    return (None if step is None else int(step)), out


class Reporter:
    """A node process's reports on their way to its agent: ``send(payload)`` writes one batch
    to the agent's pipe (called from the reporter's own thread only)."""

    def __init__(self, send: Callable[[dict], None]):
        self._send = send
        self._queue: "collections.deque" = collections.deque()
        self._cond = threading.Condition()
        self._bucket = TokenBucket(RATE, BURST)
        self._dropped = 0
        self._count = 0  # reports made: the step of a report without one
        self._busy = False
        self._flushing = False
        self._thread: Optional[threading.Thread] = None

    def report(self, step, metrics: Dict[str, object]) -> bool:
        """Queue one report; False when it was dropped (over the rate, or the queue full)."""
        step, values = check_report(step, metrics)
        stamp = time.time()
        with self._cond:
            if step is None:
                step = self._count
            self._count += 1
            self._bucket.refill(time.monotonic())
            if self._bucket.tokens < 1 or len(self._queue) >= QUEUE:
                # counted; the count goes with the next batch (no message of its own: a flood
                # of reports is not turned into a flood of counts)
                self._dropped += 1
                return False
            self._bucket.tokens -= 1
            self._queue.append([step, stamp, values])
            if self._thread is None:
                self._thread = threading.Thread(target=self._deliver, name="duotf-reports",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return True

    def _deliver(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not (self._flushing and self._dropped):
                    self._cond.wait()
                batch = [self._queue.popleft() for _ in range(min(BATCH, len(self._queue)))]
                dropped, self._dropped = self._dropped, 0
                self._busy = True
            try:
                self._send({"reports": batch, "dropped": dropped})
            except (OSError, ValueError):
                pass  # the agent is gone: this process ends too
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def flush(self, timeout: float) -> bool:
        """Wait until every queued report went to the agent (main returned: its reports go
        before its result); True if they did within ``timeout`` seconds."""
        deadline = Deadline.after(timeout)
        with self._cond:
            self._flushing = True  # a count of dropped reports goes even with no batch
            self._cond.notify_all()
            while self._queue or self._busy or (self._dropped and self._thread is not None):
                if deadline.expired:
                    return False
                self._cond.wait(deadline.remaining)
        return True
