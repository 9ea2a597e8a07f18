"""The nodes' reports on the driver: ``cluster.metrics``, ``cluster.on_report`` and the latest values.

A node's ``ctx.report(step=..., **metrics)`` arrives over the authenticated rendezvous channel
(see :mod:`duotf._node.reports` for the node's end, its checks and rate limit), in the order the node
made its reports. :class:`NodeMetrics`

* keeps every report as a row (node, step, time, metrics) for ``cluster.metrics``;
* keeps the latest value of each metric, with its report's step (the progress bar shows them);
* calls the user's ``on_report`` callbacks with each :class:`Report`, in arrival order, on a
  thread of its own (``duotf-on-report``): a slow callback never holds up a node's connection,
  and one that raises is logged (``duotf._driver.cluster``, with its traceback) and called again for
  the next report. At most :data:`PENDING` reports wait for the callbacks; more are not given to
  them (counted and logged), but still kept in ``cluster.metrics``.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from duotf._names import public
from duotf._node.reports import BURST, RATE

__all__ = ["Report", "NodeMetrics", "PENDING"]

logger = logging.getLogger("duotf.cluster")

#: reports waiting for the on_report callbacks at most
PENDING = 100_000
#: seconds between two notes of a node's dropped reports
DROP_NOTE = 1.0


@public("duotf")
@dataclasses.dataclass(frozen=True)
class Report:
    """One ``ctx.report`` as the driver received it.

    Attributes
    ----------
    node : str
        The node's role, ``"worker:1"``.
    node_id : int
        The node's id.
    step : int
        The step the node gave (or its count of reports).
    time : float
        When the node made it, in seconds since the epoch (the node's clock).
    metrics : dict
        ``{name: number}``.
    """

    node: str
    node_id: int
    step: int
    time: float
    metrics: Dict[str, float]


class NodeMetrics:
    """The reports of a cluster's nodes, as they arrive. Thread-safe."""

    def __init__(self, roles: Sequence):
        self.roles = [str(r) for r in roles]
        self._reports: List[Report] = []
        self._latest: Dict[str, float] = {}
        self._latest_step: Dict[str, int] = {}  # the step of the report each latest value came from
        self._callbacks: List[Callable[[Report], None]] = []
        self._pending: "collections.deque" = collections.deque()
        self._lost = 0  # reports not given to the callbacks (too many waiting)
        self._cond = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._closed = False
        self._dispatching = False
        self._drops = [0] * len(self.roles)  # dropped reports not yet logged, by node
        self._noted = [float("-inf")] * len(self.roles)
        #: called (no arguments) after each batch of reports is stored: the progress bar
        self.listener: Optional[Callable[[], None]] = None

    # -- from the supervisor (a node's connection thread) ----------------------------------
    def add(self, node_id: int, reports: list, dropped: int = 0) -> None:
        """Record a batch of node ``node_id``'s reports (``[step, time, {name: number}]``);
        ``dropped``: reports its rate limit dropped just before them."""
        role = self.roles[node_id]
        if dropped:
            self._count_dropped(node_id, dropped)
        got = []
        for item in reports:
            try:
                step, stamp, values = item
                got.append(Report(role, node_id, int(step), float(stamp),
                                  {str(k): v for k, v in dict(values).items()
                                   if isinstance(v, (int, float)) and not isinstance(v, bool)}))
            except (TypeError, ValueError):
                logger.warning("duotf: [%s] a malformed report was ignored: %r", role, item)
        if not got:
            return
        with self._cond:
            self._reports.extend(got)
            for report in got:
                self._latest.update(report.metrics)
                self._latest_step.update(dict.fromkeys(report.metrics, report.step))
            if self._callbacks and not self._closed:
                room = PENDING - len(self._pending)
                self._pending.extend(got[:max(room, 0)])
                self._lost += max(len(got) - max(room, 0), 0)
                self._cond.notify_all()
        listener = self.listener
        if listener is not None:
            try:
                listener()
            except Exception as exc:  # the progress bar: never worth a lost report
                logger.debug("duotf: metrics listener raised %r", exc)

    def _count_dropped(self, node_id: int, dropped: int, flush: bool = False) -> None:
        """Log a node's dropped reports at most once a second (a flood is one note a second)."""
        now = time.monotonic()
        with self._cond:
            self._drops[node_id] += dropped
            count = self._drops[node_id]
            if not count or (not flush and now - self._noted[node_id] < DROP_NOTE):
                return
            self._drops[node_id], self._noted[node_id] = 0, now
        logger.warning("duotf: [%s] %d reports dropped (a node sends at most %d reports/s, "
                       "bursts of %d)", self.roles[node_id], count, RATE, BURST)

    # -- for the cluster -------------------------------------------------------------------
    def on_report(self, callback: Callable[[Report], None]) -> None:
        """Call ``callback(report)`` for every report that arrives from now on."""
        if not callable(callback):
            from duotf.errors import ConfigError

            raise ConfigError(f"on_report takes a callable, called with each duotf.Report; got "
                              f"{type(callback).__name__}")
        with self._cond:
            self._callbacks.append(callback)
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._dispatch, name="duotf-on-report",
                                                daemon=True)
                self._thread.start()

    def latest(self) -> Dict[str, float]:
        """The latest value of every metric reported so far (by any node)."""
        with self._cond:
            return dict(self._latest)

    def latest_steps(self) -> Dict[str, Tuple[float, int]]:
        """``{name: (value, step)}``: the latest value of every metric and the step of the
        report it came from (the progress bar tags each value with it: the feed runs ahead of
        training, so the latest report may be epochs behind the epoch being fed)."""
        with self._cond:
            return {k: (v, self._latest_step[k]) for k, v in self._latest.items()}

    def reports(self) -> List[Report]:
        with self._cond:
            return list(self._reports)

    def frame(self):
        """Every report so far as a pandas DataFrame: ``node``, ``step``, ``time`` (seconds
        since the epoch, the node's clock), then one column per metric (NaN where a report
        did not carry it), in arrival order (each node's reports in the order it made them)."""
        try:
            import pandas as pd
        except ImportError:
            from duotf.errors import ConfigError

            raise ConfigError("cluster.metrics is a pandas DataFrame: pip install pandas (or the "
                              "duotf[dask] or duotf[spark] extra); cluster.on_report works "
                              "without it") from None
        rows = [dict(r.metrics, node=r.node, step=r.step, time=r.time) for r in self.reports()]
        names: Dict[str, None] = {}
        for row in rows:
            names.update(dict.fromkeys(k for k in row if k not in ("node", "step", "time")))
        return pd.DataFrame(rows, columns=["node", "step", "time", *names])

    def _dispatch(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return
                report = self._pending.popleft()
                callbacks = list(self._callbacks)
                self._dispatching = True
            for callback in callbacks:
                try:
                    callback(report)
                except Exception:
                    logger.exception("duotf: an on_report callback (%r) raised on a report of "
                                     "%s at step %d; it is called again for the next report",
                                     callback, report.node, report.step)
            with self._cond:
                self._dispatching = False
                self._cond.notify_all()

    def close(self, timeout: float = 30.0) -> None:
        """Give the callbacks the reports that arrived (up to ``timeout`` seconds), then stop
        their thread; later reports are kept but no callback is called."""
        for node_id in range(len(self.roles)):
            self._count_dropped(node_id, 0, flush=True)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread, lost, self._lost = self._thread, self._lost, 0
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                logger.warning("duotf: the on_report callbacks still ran %g s after shutdown; "
                               "%d reports were not given to them", timeout, len(self._pending))
                with self._cond:
                    self._pending.clear()
        if lost:
            logger.warning("duotf: %d reports were not given to the on_report callbacks: more "
                           "than %d waited for them (they are in cluster.metrics)", lost, PENDING)
