"""``duotf.run_parallel``: independent TensorFlow runs side by side (a hyperparameter search).

Each run is a cluster of its own, started with :func:`duotf.run` on one shared backend, so a run
is exactly what ``duotf.run`` would give: its own rendezvous server, job id, node processes and
working directories. Up to ``max_concurrent`` runs live at once; the next starts as soon as one
ends. A run that fails is an outcome, not an exception: the others go on.

Starting clusters from several driver threads is safe on every shipped backend: each cluster
owns its supervisor and rendezvous server; Spark runs each barrier stage in a job group set in
the thread that submits it (pyspark's pinned threads keep local properties per thread) and
cancels only that group; the Dask client accepts submissions from any thread, and
:class:`~duotf.backends.dask.backend.DaskBackend` spreads concurrent clusters over its workers. Nothing
is serialised here.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
import time
from typing import Any, Callable, Iterable, List, Optional, Set

from duotf._names import public
from duotf._driver.api import check_run_arguments, run
from duotf.backends import resolve_backend
from duotf._driver.cluster import Cluster
from duotf._driver.supervisor import FAILURES_REPORTED
from duotf.errors import ConfigError, DuotfError
from duotf.spec import ClusterSpec, seconds

logger = logging.getLogger(__name__)

__all__ = ["run_parallel", "RunResult"]

#: keyword arguments of :func:`duotf.run` that run_parallel passes on to every run
_RUN_KEYWORDS = ("reservation_timeout", "heartbeat_interval", "heartbeat_timeout", "env",
                 "default_fs", "driver_host", "keep_workdir", "log_to_driver", "log_dir", "ports")


@public("duotf")
@dataclasses.dataclass(frozen=True)
class RunResult:
    """The outcome of one run of :func:`run_parallel`.

    Attributes
    ----------
    index:
        The run's place in ``args_list``.
    args:
        The args it ran with.
    value:
        What ``main`` returned on each node, by node id (as ``Cluster.wait`` gives it); None
        when the run failed.
    error:
        Why the run failed (a :class:`~duotf.errors.NodeFailedError` when a node raised or was
        killed, a :class:`~duotf.errors.ReservationTimeoutError`, a ``TimeoutError`` past
        ``timeout``, ...); None when it succeeded.
    seconds:
        Wall time of the run, from its start to its shutdown.
    job_id:
        The cluster's job id (as in duotf's log lines); None if no cluster was made.
    """

    index: int
    args: Any
    value: Optional[List[Any]] = None
    error: Optional[BaseException] = None
    seconds: float = 0.0
    job_id: Optional[str] = None

    @property
    def ok(self) -> bool:
        """True when every node's ``main`` returned."""
        return self.error is None

    def result(self) -> List[Any]:
        """``value``, or raise ``error``."""
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


def run_parallel(
    main: Callable[[Any, Any], Any],
    args_list: Iterable[Any],
    backend: Any = None,
    spec: Optional[ClusterSpec] = None,
    *,
    max_concurrent: Optional[int] = None,
    timeout: Optional[float] = None,
    **run_kwargs: Any,
) -> List[RunResult]:
    """Run ``main`` once per element of ``args_list``, each as an independent cluster of ``spec``,
    up to ``max_concurrent`` at once; return every run's :class:`RunResult`, in ``args_list``
    order.

    Parameters
    ----------
    main, backend, spec:
        As for :func:`duotf.run`; every run has the same ``spec`` (default one worker). A
        backend given by name (or None) is created once for all runs and closed at the end.
    args_list:
        One element per run, passed to its ``main`` as ``args``.
    max_concurrent:
        How many runs may live at once; default: the backend's slots divided by the nodes of a
        run (at least 1). More than the engine has room for makes the runs beyond it wait for
        slots inside ``reservation_timeout``.
    timeout:
        Seconds each run may take from its start; a run still going then is stopped and its
        outcome is a ``TimeoutError``. Default: no limit.
    **run_kwargs:
        ``reservation_timeout``, ``heartbeat_interval``, ``heartbeat_timeout``, ``env``,
        ``default_fs``, ``driver_host``, ``keep_workdir``, ``log_to_driver``, ``log_dir``,
        ``ports``: as for :func:`duotf.run`, for every run.

    Raises
    ------
    ConfigError
        Before anything starts: a bad ``main``, ``spec``, ``max_concurrent``, ``timeout`` or
        run setting, or an element of ``args_list`` that cannot be pickled (named by index).
    InsufficientSlotsError
        Before anything starts: a run has more nodes than the backend has slots.
    KeyboardInterrupt
        (or any error of the driver while it waits) after every running cluster was shut down.
    """
    import cloudpickle

    args_list = list(args_list)
    unknown = sorted(set(run_kwargs) - set(_RUN_KEYWORDS))
    if unknown:
        raise ConfigError(f"run_parallel got unknown keyword(s) {', '.join(unknown)}; it passes "
                          f"these on to duotf.run: {', '.join(_RUN_KEYWORDS)}")
    timeouts = {k: run_kwargs.get(k) for k in _RUN_KEYWORDS[:3]}
    spec, _ = check_run_arguments(main, spec, **timeouts)
    if max_concurrent is not None and (isinstance(max_concurrent, bool)
                                       or not isinstance(max_concurrent, int) or max_concurrent < 1):
        raise ConfigError(f"max_concurrent={max_concurrent!r}: give a whole number of runs, 1 or "
                          "more (or None: the backend's slots divided by the nodes of a run)")
    if timeout is not None:
        timeout = seconds(timeout, "timeout")
    for i, args in enumerate(args_list):
        try:
            cloudpickle.dumps(args)
        except Exception as exc:
            raise ConfigError(
                f"args_list[{i}] cannot be sent to the nodes: cloudpickle refused it "
                f"({type(exc).__name__}: {exc}). Give every run picklable args.") from exc
    if not args_list:
        return []

    backend_obj, owns = resolve_backend(backend)
    try:
        nodes = spec.num_nodes
        backend_obj.check_capacity(nodes)  # a run that can never start fails here, not N times
        capacity = backend_obj.slots()
        if spec.gpus_per_node:  # each run's nodes hold GPUs too: as many runs as both allow
            capacity = min(capacity, backend_obj.check_gpus(nodes, spec.gpus_per_node))
        width = max_concurrent or max(capacity // nodes, 1)
        width = min(width, len(args_list))
        logger.info("duotf: %d runs of %d node(s) on %s, up to %d at once",
                    len(args_list), nodes, backend_obj.name, width)
        return _Runs(main, args_list, backend_obj, spec, timeout, run_kwargs).run(width)
    finally:
        if owns:
            backend_obj.close()


class _Runs:
    """The runs of one :func:`run_parallel` call and the clusters alive now."""

    def __init__(self, main, args_list, backend, spec, timeout, run_kwargs):
        self.main = main
        self.args_list = args_list
        self.backend = backend
        self.spec = spec
        self.timeout = timeout
        self.run_kwargs = run_kwargs
        self._lock = threading.Lock()
        self._live: Set[Cluster] = set()
        self._stopping = False

    def run(self, width: int) -> List[RunResult]:
        pool = concurrent.futures.ThreadPoolExecutor(width, thread_name_prefix="duotf-parallel")
        try:
            futures = [pool.submit(self._one, i, args) for i, args in enumerate(self.args_list)]
            concurrent.futures.wait(futures)
            results = [f.result() for f in futures]
        except BaseException:
            # KeyboardInterrupt (or anything else) in the driver: start nothing more, stop what
            # runs, and let the threads end before raising. Queued runs go first, so that no
            # thread freed by a stopped cluster takes one.
            with self._lock:
                self._stopping = True
            pool.shutdown(wait=False, cancel_futures=True)
            self._stop_all()
            pool.shutdown(wait=True)
            raise
        pool.shutdown(wait=True)
        return results

    def _stop_all(self) -> None:
        with self._lock:
            live = list(self._live)
        logger.warning("duotf: run_parallel interrupted; shutting down %d running cluster(s)",
                       len(live))
        for cluster in live:
            _shutdown_now(cluster)

    def _one(self, index: int, args) -> RunResult:
        t0 = time.monotonic()
        cluster = None
        value = None
        error: Optional[BaseException] = None
        # a run's failure is its outcome, in its RunResult: its cluster does not log it as an error
        reported = FAILURES_REPORTED.set(True)
        try:
            with self._lock:
                if self._stopping:  # taken from the queue as the driver was interrupted
                    raise DuotfError(f"run {index} was not started: run_parallel was interrupted")
            cluster = run(self.main, args, self.backend, self.spec, **self.run_kwargs)
            with self._lock:
                stopping = self._stopping
                if not stopping:
                    self._live.add(cluster)
            if stopping:  # the driver was interrupted while this run started
                _shutdown_now(cluster)
                raise DuotfError(f"run {index} was stopped: run_parallel was interrupted")
            with cluster:  # on an error: shut down at once, keeping the error
                value = cluster.wait(self._left(t0))
        except TimeoutError as exc:
            if isinstance(exc, DuotfError) or self.timeout is None:  # a reservation timeout
                error = exc
            else:
                error = TimeoutError(
                    f"run {index} (args_list[{index}]) still ran after timeout={self.timeout:g} s "
                    f"and was stopped ({exc})")
                error.__cause__ = exc
        except Exception as exc:  # the run's outcome; the other runs go on
            error = exc
        finally:
            FAILURES_REPORTED.reset(reported)
            if cluster is not None:
                with self._lock:
                    self._live.discard(cluster)
        seconds_ = time.monotonic() - t0
        if error is not None:
            logger.info("duotf: run %d failed after %.2f s: %s: %s", index, seconds_,
                        type(error).__name__, error)
        return RunResult(index, args, value, error, seconds_,
                         cluster.job_id if cluster is not None else None)

    def _left(self, t0: float) -> Optional[float]:
        if self.timeout is None:
            return None
        return max(self.timeout - (time.monotonic() - t0), 0.0)


def _shutdown_now(cluster: Cluster) -> None:
    """Stop ``cluster`` at once; its error (if any) is its run's, reported there."""
    try:
        cluster.shutdown(grace_secs=0)
    except DuotfError as exc:
        logger.debug("duotf: shutdown of %s: %s", cluster.job_id, exc)
