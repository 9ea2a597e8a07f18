"""The progress bars of ``cluster.train`` and ``cluster.inference`` (tqdm).

One bar per feeding epoch: ``feed epoch 2/5 (rows queued)``, rows fed of the epoch's rows, rows/s,
and the latest value of each metric the nodes reported (``ctx.report``), each tagged with the step
of the report it came from: ``reported: loss=0.31 (step 4)``. The feed runs ahead of training (the
nodes queue what they have not read yet), so the bar counts rows handed to the nodes, not rows
trained on, and the metrics beside it may come from an epoch before the one being fed; the
step says which (``duotf.keras.ReportCallback`` reports each epoch at ``step=`` that epoch).
The last bar of ``cluster.train`` stays open after the feed has ended, showing the reports as
they arrive, until ``cluster.wait()`` (or ``shutdown``, or the next feed) closes it with the
last values reported. The rows come from the feed's own
count, the rows each partition's feeding task sent (what ``train()`` adds up for its
``rows_fed``): an engine whose feed adapter hands over each partition's count as its task ends
(the local backend, Dask) moves the bar partition by partition; one that hands them over with
the epoch's result (Spark: one ``collect``) moves it once per epoch. Either way a bar ends at
the rows its epoch fed. Inference: one bar, rows answered where the engine says (local backend;
elsewhere the elapsed time).

Whether bars are shown is ``duotf.run(..., progress=...)``: ``None`` (default) shows them when
stderr is a terminal or in a Jupyter kernel (``tqdm.auto`` draws a widget there), ``True``
always (to stderr), ``False`` never, and a file-like object (anything with ``write``) writes
them there. In a Jupyter kernel a bar is tqdm's widget where ipywidgets is installed, else tqdm's
text bar on the cell's stderr, which the notebook redraws in place (see :func:`bar_class`).
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from duotf.errors import ConfigError

__all__ = ["FeedProgress", "bar_class", "check_progress", "describe_metrics"]

logger = logging.getLogger("duotf.feed")

#: metrics shown beside a bar at most (the first reported first)
SHOWN_METRICS = 6


def check_progress(progress) -> None:
    if progress is None or isinstance(progress, bool) or callable(getattr(progress, "write", None)):
        return
    raise ConfigError(f"progress={progress!r}: give None (bars when stderr is a terminal or in "
                      "Jupyter), True (always), False (never) or a file-like object to write "
                      "them to")


def _interactive() -> bool:
    """A person is watching: a Jupyter kernel runs this process, or stderr is a terminal. A
    kernel is asked of IPython, not read from ``sys.modules``: pyspark imports ``ipykernel``
    in any script where it is installed (to name call sites), which would show bars in logs."""
    if "ipykernel" in sys.modules:
        ipython = sys.modules.get("IPython")
        shell = getattr(ipython, "get_ipython", lambda: None)() if ipython is not None else None
        if shell is not None and getattr(shell, "kernel", None) is not None:
            return True
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def bar_class():
    """The tqdm class of a bar shown on the console or in a notebook: ``tqdm.auto``'s (a widget
    in a Jupyter kernel) where ipywidgets is installed, else ``tqdm.std``'s text bar. Not
    ``tqdm.auto`` without ipywidgets: in a kernel it would warn "IProgress not found. Please
    update jupyter and ipywidgets" into the user's cell, then draw the text bar all the same."""
    if importlib.util.find_spec("ipywidgets") is None:
        from tqdm.std import tqdm
    else:
        from tqdm.auto import tqdm
    return tqdm


def describe_metrics(latest: Dict[str, Tuple[float, int]]) -> str:
    """``{name: (value, step)}`` as a bar shows it: ``reported: loss=0.31, rows=44 (step 4)``,
    the values of one step together, each group tagged with its step."""
    shown = list(latest.items())[:SHOWN_METRICS]
    groups: List[Tuple[int, List[str]]] = []
    for name, (value, step) in shown:
        text = f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value}"
        if groups and groups[-1][0] == step:
            groups[-1][1].append(text)
        else:
            groups.append((step, [text]))
    return "reported: " + "; ".join(f"{', '.join(texts)} (step {step})" for step, texts in groups)


def _freeze_rate(bar) -> None:
    """Show the time and rate of the feed as it ended: a bar that stays open while training
    goes on would otherwise show its rate falling (rows over the time it has been open)."""
    elapsed = bar.format_dict["elapsed"]
    rate = f", {bar.n / elapsed:.4g} {bar.unit}/s" if elapsed > 0 else ""
    bar.bar_format = ("{l_bar}{bar}| {n_fmt}/{total_fmt} [fed in " + f"{elapsed:.1f} s{rate}"
                      + "{postfix}]")


class FeedProgress:
    """The bars of one cluster. Thread-safe: feeding tasks and reports update it from their
    own threads. Every method is a no-op when bars are off, and none raises.

    Parameters
    ----------
    progress:
        What ``duotf.run(progress=...)`` was given.
    latest:
        Returns ``{name: (value, step)}``, the latest reports (``NodeMetrics.latest_steps``).
    linger:
        Keep the last bar open once its epoch is fed (:meth:`finish` and :meth:`close` leave it
        open), so that it shows the reports still to come, until :meth:`end`.
    """

    def __init__(self, progress, latest: Callable[[], Dict[str, Tuple[float, int]]] = dict,
                 linger: bool = False):
        check_progress(progress)
        given = progress is not None and not isinstance(progress, bool)
        self._file = progress if given else None  # a file-like object
        self.enabled = given or progress is True or (progress is None and _interactive())
        self._latest = latest
        self._linger = linger
        self._finished = False  # the open bar's epoch was fed to its end
        self._lock = threading.Lock()
        self._bar: Any = None  # the open tqdm bar
        self._parts: Dict[int, int] = {}
        #: ``(description, rows, total)`` of every bar closed, for those who check (tests)
        self.closed: list = []

    def _new_bar(self, desc: str, total: Optional[int], unit: str):
        if self._file is not None:
            from tqdm.std import tqdm as base
            options = {"file": self._file}
        else:
            base = bar_class()  # a widget in Jupyter with ipywidgets
            options = {"dynamic_ncols": True}

        class Bar(base):
            # no tqdm monitor thread: it would outlive the cluster (it only corrects a bar
            # that stalls, and these bars are updated by the feed itself)
            monitor_interval = 0

        return Bar(total=total, desc=desc, unit=unit, leave=True, mininterval=0.2,
                   disable=False, **options)

    def start(self, desc: str, total: Optional[int], unit: str = "rows") -> None:
        """Open a bar (closing one still open)."""
        if not self.enabled:
            return
        self.end()
        with self._lock:
            self._parts = {}
            self._finished = False
            try:
                self._bar = self._new_bar(desc, total, unit)
                self._postfix()
            except Exception as exc:  # a bar is never worth a failed feed
                logger.debug("duotf: no progress bar: %s", exc)
                self._bar = None

    def partition_done(self, pid: int, rows: int) -> None:
        """A partition's feeding task ended: ``rows`` is what it sent (or answered)."""
        with self._lock:
            bar = self._bar
            if bar is None:
                return
            self._parts[pid] = int(rows)
            self._move_to(sum(self._parts.values()))

    def finish(self, rows: Optional[int] = None) -> None:
        """The job ended: the bar shows ``rows`` (the job's own count; default: the partitions
        counted so far) and is closed (a lingering bar stays open until the next or :meth:`end`)."""
        with self._lock:
            bar = self._bar
            if bar is None:
                return
            n = sum(self._parts.values()) if rows is None else int(rows)
            try:
                self._postfix()
                bar.update(n - bar.n)
                if self._linger:
                    _freeze_rate(bar)
                bar.refresh()
            except Exception as exc:
                logger.debug("duotf: progress bar: %s", exc)
            self._finished = True
        self.close()

    def metrics_changed(self) -> None:
        """New reports arrived: show the latest values (at tqdm's own refresh rate)."""
        with self._lock:
            if self._bar is not None:
                self._postfix()
                self._move_to(self._bar.n)

    def close(self) -> None:
        """Close the bar, but a lingering one whose epoch was fed to its end (see ``linger``)."""
        if self._linger and self._finished:
            return
        self.end()

    def end(self) -> None:
        """Close the bar, lingering or not, showing the latest reports."""
        with self._lock:
            bar, self._bar = self._bar, None
            if bar is None:
                return
            self._postfix(bar)
            self.closed.append((bar.desc, bar.n, bar.total))
            try:
                bar.refresh()
                bar.close()
            except Exception as exc:
                logger.debug("duotf: progress bar: %s", exc)

    # -- under the lock ----------------------------------------------------------------------
    def _move_to(self, n: int) -> None:
        bar = self._bar
        try:
            if n != bar.n:
                bar.update(n - bar.n)  # tqdm redraws at most every mininterval
            else:
                bar.update(0)
        except Exception as exc:
            logger.debug("duotf: progress bar: %s", exc)

    def _postfix(self, bar=None) -> None:
        latest = self._latest()
        if latest:
            try:
                (bar or self._bar).set_postfix_str(describe_metrics(latest), refresh=False)
            except Exception as exc:
                logger.debug("duotf: progress bar: %s", exc)
