"""The heartbeat watchdog: the one thread that asks whether a node fell silent or the engine job ended.

Heartbeats notify nobody (a thousand nodes' heartbeats would wake every waiter a million times
a second): they only move a node's ``last_seen``. The :class:`Watchdog` alone reads it, at its
own deadline, the earliest moment at which some node could have been silent for
``heartbeat_timeout``; between deadlines it sleeps on the supervisor's condition. It decides;
the supervisor acts (``on_stale``, ``on_job_failed``, ``on_job_ended``). It also keeps one
deadline for the supervisor's note on nodes that run on long after their peers returned
(``stall_due``, ``on_stall``): a look at one number, not at every node.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, List, Optional

from duotf._driver.nodes import LIVE, TERMINAL, NodeInfo, NodeState

__all__ = ["Watchdog"]

#: seconds the watchdog sleeps past a deadline, so that it wakes after it and not just before
_SLACK = 0.05


class Watchdog:
    """Watch a cluster's nodes and its engine job until the cluster is no longer starting or
    running, then report once what ended the watch.

    Parameters
    ----------
    cond:
        The supervisor's condition: every change of a node (but a heartbeat) or of the
        cluster's status notifies it, and so does the engine job's end.
    nodes:
        The node table; read under ``cond``.
    status:
        Returns the cluster's :class:`~duotf._driver.nodes.ClusterStatus` (called under ``cond``).
    gang:
        The engine job running the nodes (an ``EngineJob``).
    heartbeat_timeout:
        Seconds of silence after which a node counts as lost.
    on_stale, on_job_failed, on_job_ended:
        Called (without the lock) with the first node found silent, with the engine job's
        error, or with nothing when the job ended without one; exactly one of them, once.
    stall_due, on_stall:
        ``stall_due()`` (called under ``cond``) gives the ``time.monotonic()`` at which to call
        ``on_stall()`` (without the lock), or None while there is nothing to check; it is
        called once at most.
    clock:
        ``time.monotonic()`` up to which the driver has heard all that the nodes said (a
        relay's last exchange; see :class:`~duotf.backends.base.Route`): silence is measured
        up to it, so a relay that lags fails no node.
    """

    def __init__(self, cond: threading.Condition, nodes: List[NodeInfo], status: Callable, gang,
                 heartbeat_timeout: float, *, on_stale: Callable[[NodeInfo], None],
                 on_job_failed: Callable[[BaseException], None], on_job_ended: Callable[[], None],
                 stall_due: Callable[[], Optional[float]] = lambda: None,
                 on_stall: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic):
        self._cond = cond
        self._nodes = nodes
        self._status = status
        self._gang = gang
        self._timeout = heartbeat_timeout
        self._on_stale = on_stale
        self._on_job_failed = on_job_failed
        self._on_job_ended = on_job_ended
        self._stall_due = stall_due
        self._on_stall = on_stall
        self._clock = clock

    def start(self) -> threading.Thread:
        """Start watching on a daemon thread of its own (``duotf-monitor``); return it."""
        thread = threading.Thread(target=self._run, name="duotf-monitor", daemon=True)
        thread.start()
        return thread

    def _run(self) -> None:
        unwatched = (NodeState.PENDING,) + tuple(TERMINAL)
        due: Optional[float] = None  # no node can be stale before then (None: not known)
        stall_checked = False
        while True:
            stalled = False
            with self._cond:
                if self._status() not in LIVE:
                    return  # finished, failed (the stop sequence takes over), stopping or closed
                # A snapshot: done() first, then its error, so that a job ending between two
                # reads cannot pass for one that ended without its error.
                done = self._gang.done()
                gang_exc = self._gang.exception() if done else None
                now = time.monotonic()
                stall = None if stall_checked else self._stall_due()
                if stall is not None and now >= stall:
                    stall_checked = stalled = True
                elif not done and due is not None and now < due:
                    # Woken by a change before the deadline: no node can be stale yet (a
                    # heartbeat only moves a deadline later, and a node that registers now is
                    # due later than every other), so the nodes need no look.
                    self._cond.wait(_until(now, due, stall))
                    continue
                else:
                    watched = [x for x in self._nodes if x.state not in unwatched]
                    # silence up to what the driver has heard by (now, unless a relay lags)
                    heard = min(now, self._clock())
                    stale = [x for x in watched if heard - x.last_seen > self._timeout]
                    if not done and not stale:
                        # sleep until the next heartbeat deadline, or until something changes
                        due = min((x.last_seen + self._timeout for x in watched), default=None)
                        if due is not None and due <= now:
                            due = now + _RELAY_RECHECK  # due by now, not yet by what was heard
                        self._cond.wait(_until(now, due, stall))
                        continue
            if stalled:
                self._on_stall()
            elif stale:
                self._on_stale(stale[0])
                return
            elif gang_exc is not None:
                self._on_job_failed(gang_exc)
                return
            else:
                self._on_job_ended()
                return


_RELAY_RECHECK = 0.5  #: seconds: a lagging relay's next look at the nodes


def _until(now: float, *deadlines: Optional[float]) -> Optional[float]:
    """Seconds from ``now`` to just past the earliest of ``deadlines`` (None: none is set)."""
    due = min((d for d in deadlines if d is not None), default=None)
    return None if due is None else max(due - now, 0) + _SLACK
