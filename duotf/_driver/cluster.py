"""The driver-side handle of a running TensorFlow cluster: start, wait, feed, shut down.

Supervision (the node table, failures, the stop sequence) is :mod:`duotf._driver.supervisor`; feeding
is planned by :mod:`duotf._driver.planner`. This module is the public face and the start sequence:
:func:`start` (what :func:`duotf.run` calls) and :func:`shutdown_quietly` (for a caller that
already has an error of its own) are for duotf's own modules, not on :class:`Cluster`.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import logging
import shutil
import time
import uuid
import weakref
from typing import (IO, TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Literal, Optional, Sequence,
                    Union, cast)

from duotf._names import public
from duotf._deadline import Deadline
from duotf.errors import (ClusterClosedError, ConfigError, DuotfError, FeedError, NodesStoppedError,
                          TensorBoardError)
from duotf._driver import leftovers
from duotf._driver.metrics import NodeMetrics
from duotf._transport import tls as tls_
from duotf._transport.ports import PORTS_ENV, bind_address, configured as configured_ports
from duotf._node import job as job_payload
from duotf._node.agent import (NodeJob, OutcomeStatus, default_log_dir, default_workdir_root, job_dir_under,
                               run_node)
from duotf._driver.nodelogs import NodeLogs, log_node_ids
from duotf._driver.progress import FeedProgress, check_progress
from duotf._transport.rendezvous import Msg
from duotf._driver.restarts import (Cause, Restart, RestartOn, avoid_lost_host, await_capacity, check_restart_on,
                                    failure_cause, restartable, resume_point)
from duotf.reports import TrainReport
from duotf.spec import ClusterSpec, seconds
from duotf._driver.nodes import TERMINAL, ClusterStatus, NodeInfo, NodeState, still_running
from duotf._driver.supervisor import Supervisor

if TYPE_CHECKING:  # the planner and pandas are imported where they are used
    import pandas as pd

    from duotf._driver.planner import Stream
    from duotf.backends.base import Backend

logger = logging.getLogger("duotf.cluster")  # with the supervisor's and the metrics'

__all__ = ["Cluster", "ClusterStatus", "NodeInfo", "NodeState", "start", "shutdown_quietly"]

_live: "weakref.WeakSet[Cluster]" = weakref.WeakSet()

#: seconds ``Cluster.tensorboard_url`` waits for the chief's report on its TensorBoard. It comes
#: before the chief is ready unless TensorBoard took more than the chief waits for it (60 s: a
#: machine so loaded that importing TensorFlow takes that long)
TENSORBOARD_WAIT = 120.0
#: seconds the nodes of a failed attempt are given to stop (SIGTERM, then SIGKILL) where the
#: cluster may restart: their state is thrown away (the next attempt resumes from the last
#: checkpoint reported, never from a save cut short), and a node blocked in a collective with
#: the dead one (MultiWorkerMirroredStrategy) would otherwise hold the restart for stop_timeout
RESTART_STOP_TIMEOUT = 0.25


@atexit.register
def _sweep() -> None:
    for cluster in list(_live):
        logger.warning("duotf: shutting down a cluster that was never shut down: %r", cluster)
        try:
            shutdown_quietly(cluster)
        except Exception:  # best effort at interpreter exit
            logger.exception("duotf: atexit shutdown failed")


@public("duotf")
class Cluster:
    """A TensorFlow cluster running on an engine. Create it with :func:`duotf.run`.

    Use it as a context manager, or call :meth:`wait` and :meth:`shutdown`.
    """

    def __init__(
        self,
        main: Callable,
        args: Any,
        backend: Backend,
        spec: ClusterSpec,
        *,
        reservation_timeout: float,
        heartbeat_interval: float,
        heartbeat_timeout: float,
        env: Dict[str, str],
        default_fs: Optional[str],
        driver_host: Optional[str],
        owns_backend: bool,
        stop_timeout: float = 5.0,
        keep_workdir: bool = False,
        log_to_driver: Union[bool, Literal["chief"]] = True,
        log_dir: Optional[str] = None,
        tensorboard: bool = False,
        tensorboard_dir: Optional[str] = None,
        progress: Union[bool, IO[str], None] = None,
        max_restarts: int = 0,
        restart_on: Union[RestartOn, Iterable[RestartOn], None] = None,
        checkpoint_dir: Optional[str] = None,
        tls: Optional[bool] = None,
    ):
        self.spec = spec
        self.backend = backend
        self.job_id = uuid.uuid4().hex[:12]
        self.reservation_timeout = reservation_timeout
        self.heartbeat_timeout = heartbeat_timeout
        self.stop_timeout = stop_timeout
        self.startup_seconds: Optional[float] = None
        self._owns_backend = owns_backend
        self._keep_workdir = bool(keep_workdir)
        for name, value in (("main", main), ("args", args)):
            job_payload.check_sendable(value, name, f"Pass {name} something picklable: create "
                                       "locks, sessions, clients and open files inside main instead.")
        self._payload = job_payload.dumps((main, args))  # with the source of its code
        self._stopped: Optional[NodesStoppedError] = None
        self._env = {str(k): str(v) for k, v in (env or {}).items()}
        if spec.gpus_per_node and "CUDA_VISIBLE_DEVICES" in self._env:
            raise ConfigError(
                f"env sets CUDA_VISIBLE_DEVICES={self._env['CUDA_VISIBLE_DEVICES']!r}, but with "
                f"ClusterSpec(gpus_per_node={spec.gpus_per_node}) duotf sets it on each node to "
                "the GPUs the engine holds for that node: drop it from env (or set "
                "gpus_per_node=0 to choose devices yourself)")
        self._default_fs = default_fs if default_fs is not None else backend.default_fs()
        self._heartbeat_interval = heartbeat_interval
        self._results: Optional[List[Any]] = None
        self._closed = False
        self._log_nodes = log_node_ids(spec.roles(), log_to_driver)
        if not isinstance(tensorboard, bool):
            raise ConfigError(f"tensorboard={tensorboard!r}: give True (TensorBoard beside the "
                              "chief, reading ctx.log_dir) or False")
        chief = sorted(log_node_ids(spec.roles(), "chief"))
        self._tensorboard_node: Optional[int] = chief[0] if tensorboard and chief else None
        if tensorboard and not chief:
            raise ConfigError("tensorboard=True needs a chief or a worker to run beside: the "
                              "spec has neither")
        self._workdir_root = default_workdir_root(self.job_id)
        if tensorboard_dir is None:
            self._node_log_dir, self._owns_log_dir = default_log_dir(self._workdir_root), True
        else:
            self._node_log_dir, self._owns_log_dir = job_dir_under(tensorboard_dir, self.job_id), False
        self._tensorboard_url: Optional[str] = None
        self._own_temp_folders(log_dir, checkpoint_dir)
        check_progress(progress)
        self._progress = progress
        self._shown: Optional[FeedProgress] = None  # the bar still open (see _end_bar)
        self._metrics = NodeMetrics(spec.roles())
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise ConfigError(f"max_restarts={max_restarts!r}: give a whole number, 0 or more")
        self.max_restarts = max_restarts
        self._restart_on = check_restart_on(restart_on)
        #: 0 on the first run, then 1, 2, ... after each restart
        self.attempt = 0
        #: every failure that restarted the cluster, in order (:class:`duotf._driver.restarts.Restart`)
        self.restarts: List[Restart] = []
        self._checkpoints: Dict[int, Dict[int, Optional[str]]] = {}  # every attempt's reports
        self._resume_epoch = 0
        self._resume_paths: Dict[int, Optional[str]] = {}
        self._feed_call: Optional[dict] = None  # the latest train(): a restart feeds it on
        self._feed_error: Optional[FeedError] = None  # its feeder lost: why the nodes failed
        self._engine_slots = 0  # the engine's slots at the first start (restarts wait for them)
        self._driver_host = driver_host or bind_address(self._env) or backend.driver_host()
        #: the job's TLS material where its feed and control channel are encrypted, else None
        self.tls = tls_.for_job() if tls_.wanted(tls, backend.encrypts_traffic()) else None
        self.supervisor = self._new_supervisor()

    def _own_temp_folders(self, log_dir: Optional[str], checkpoint_dir: Optional[str]) -> None:
        """The job's lock (duotf._driver.leftovers: released last), a sweep of the folders of
        drivers that died on this host, the node logs and the checkpoint folder."""
        lock = leftovers.JobLock(self.job_id)
        weakref.finalize(self, lock.release)  # registered first: the last to run
        leftovers.sweep()
        self._logs: Optional[NodeLogs] = None
        if self._log_nodes:
            self._logs = NodeLogs(self.spec.roles(), self.job_id, log_dir)
            # The files outlive shutdown (cluster.logs() after the run), not the Cluster object.
            weakref.finalize(self, self._logs.remove)
        if checkpoint_dir is None:
            self.checkpoint_dir, self._owns_checkpoint_dir = self._workdir_root + "-checkpoints", True
            # shutdown removes it; so does the end of a Cluster never shut down (a failed wait())
            weakref.finalize(self, shutil.rmtree, self.checkpoint_dir, True)
        else:
            self.checkpoint_dir = job_dir_under(checkpoint_dir, self.job_id, "checkpoint_dir")
            self._owns_checkpoint_dir = False

    def _new_supervisor(self) -> Supervisor:
        return Supervisor(
            self.spec, self.backend.name, reservation_timeout=self.reservation_timeout,
            heartbeat_timeout=self.heartbeat_timeout, stop_timeout=self.stop_timeout,
            driver_host=self._driver_host, job_id=self.job_id,
            logs=self._logs, metrics=self._metrics,
            ports=configured_ports(self._env) or configured_ports(), tls=self.tls,
            # a failed attempt's nodes are restarted from a checkpoint: they need no grace
            failure_stop_timeout=min(RESTART_STOP_TIMEOUT, self.stop_timeout) if self.max_restarts else None,
        )

    @property
    def status(self) -> ClusterStatus:
        """``starting``, ``running``, ``stopping``, ``finished``, ``failed`` or ``closed``."""
        return self.supervisor.status

    @property
    def nodes(self) -> List[NodeInfo]:
        """Role, host, port, pid and state of every node, by node id."""
        return self.supervisor.nodes

    @property
    def log_dir(self) -> Optional[str]:
        """The directory of the nodes' output files (``<role>-<index>.log``); None when no
        node's output goes to the driver (``log_to_driver=False``)."""
        return self._logs.directory if self._logs is not None else None

    @property
    def tensorboard_url(self) -> Optional[str]:
        """The address of the TensorBoard that ``duotf.run(..., tensorboard=True)`` started
        beside the chief (or ``worker:0``), ``http://<host>:<port>/``; None without
        ``tensorboard=True``. It reads the nodes' ``ctx.log_dir`` and stops with the cluster.

        TensorBoard starts with the nodes and takes seconds (it imports TensorFlow); the
        chief's ``main`` starts once it serves (at most 60 s later), so the address is known
        when :func:`duotf.run` returns. Raises :class:`~duotf.errors.TensorBoardError` when it
        did not start (not installed where the chief runs, exited), or did not serve within
        60 s more (:data:`TENSORBOARD_WAIT` in all); the nodes run on regardless.
        """
        node_id = self._tensorboard_node
        if node_id is None or self._tensorboard_url is not None:
            return self._tensorboard_url
        report = self.supervisor.tensorboard(node_id, Deadline.after(TENSORBOARD_WAIT))
        where = self.nodes[node_id].describe()
        if report is None:
            raise TensorBoardError(
                f"TensorBoard beside {where} did not say it serves within {TENSORBOARD_WAIT:g} s "
                f"(the cluster is {self.status.value}); its node's output (cluster.logs) may "
                "say why", node=where)
        if "error" in report:
            raise TensorBoardError(
                f"TensorBoard did not start beside {where}: {report['error']}\nInstall it where "
                "the nodes run (pip install tensorboard, or duotf[tensorboard]); the nodes run "
                "on without it.", node=where)
        self._tensorboard_url = report["url"]
        return self._tensorboard_url

    def logs(self, node: Union[int, str]) -> str:
        """Everything node ``node`` (a node id, or a role such as ``"worker:1"``) wrote to its
        stdout and stderr so far, as it reached the driver; also after :meth:`shutdown`.

        Lines are cut at 8 KiB, and a node that writes faster than the rate limit has lines
        dropped, noted as ``[duotf: N lines dropped ...]``.
        """
        names = [str(x.role) for x in self.nodes]
        if isinstance(node, int) and not isinstance(node, bool) and 0 <= node < len(names):
            node_id = node
        elif str(node) in names:
            node_id = names.index(str(node))
        else:
            raise ConfigError(f"no node {node!r}: give a node id (0 to {len(names) - 1}) or a "
                              f"role ({', '.join(names)})")
        if node_id not in self._log_nodes:
            raise ConfigError(f"the output of {names[node_id]} does not go to the driver: run "
                              "with log_to_driver=True (or 'chief' for the chief's)")
        assert self._logs is not None  # a node whose output goes to the driver: it has logs
        return self._logs.text(node_id)

    @property
    def metrics(self) -> pd.DataFrame:
        """Every node's ``ctx.report`` so far, as a pandas DataFrame: columns ``node`` (the
        role, ``"worker:1"``), ``step``, ``time`` (seconds since the epoch, when the node
        reported), then one per metric (NaN where a report lacks it); each node's rows in the
        order it reported. Complete for a node once its ``main`` has returned; also after
        :meth:`shutdown`."""
        return self._metrics.frame()

    def on_report(self, callback: Callable[..., None]) -> None:
        """Call ``callback(report)`` with every :class:`duotf.Report` that arrives from now on
        (``node``, ``node_id``, ``step``, ``time``, ``metrics``), each node's in its order, on
        a driver thread of duotf's (``duotf-on-report``), so a slow callback holds up no node.
        A callback that raises is logged (``duotf._driver.cluster``, ERROR) and called again for the
        next report. :meth:`shutdown` waits for the callbacks of the reports that arrived."""
        self._metrics.on_report(callback)

    def _bar(self, linger: bool = False) -> FeedProgress:
        self._end_bar()
        bar = FeedProgress(self._progress, self._metrics.latest_steps, linger=linger)
        if bar.enabled:
            self._metrics.listener = bar.metrics_changed
            self._shown = bar
        return bar

    def _end_bar(self) -> None:
        """Close the bar still shown (the last of a train() call), with the latest reports."""
        bar, self._shown = self._shown, None
        self._metrics.listener = None
        if bar is not None:
            bar.end()

    def __repr__(self) -> str:
        return (
            f"<duotf.Cluster {self.job_id} {self.status.value} nodes={len(self.nodes)} "
            f"backend={self.backend.name}>"
        )

    # -- start ----------------------------------------------------------------------------
    def _start_once(self) -> "Cluster":
        """:func:`start`: the first attempt, restarted where a node fails while it starts."""
        sup = self.supervisor
        if sup.status is not ClusterStatus.STARTING or self.startup_seconds is not None:
            raise ClusterClosedError(f"{self!r} was started already")
        try:
            try:
                return self._start(Deadline.after(self.reservation_timeout))
            except DuotfError:
                # a node that fails while the nodes start restarts the gang as later failures do
                if self.supervisor.error is None or not self._restart():
                    raise
                return self
        except BaseException:
            self._shutdown(grace_secs=0)
            raise

    def _attempt_id(self, attempt: int) -> str:
        """The name of an attempt's engine job and working directories."""
        return self.job_id if not attempt else f"{self.job_id}-{attempt}"

    def _start(self, deadline: Deadline) -> "Cluster":
        """Start one attempt: every node ready and running by ``deadline`` (its ``reservation_timeout``)."""
        sup = self.supervisor
        n = len(self.nodes)
        if self.attempt:
            await_capacity(self.backend, n, max(n, self._engine_slots), deadline,
                           self.reservation_timeout)
        else:
            self.backend.await_spread(n, deadline)
            self.backend.check_capacity(n)
            self._engine_slots = self.backend.slots() if self.max_restarts else n
        if self._owns_checkpoint_dir:
            import os

            os.makedirs(self.checkpoint_dir, exist_ok=True)
        gpus = self.spec.gpus_per_node
        if gpus:
            self.backend.check_gpus(n, gpus)
        _live.add(self)
        # each attempt its own working directories and engine job: an old attempt's task that
        # ends late removes or cancels nothing of the new one's
        attempt_id = self._attempt_id(self.attempt)
        workdir_root = default_workdir_root(attempt_id)
        log_dir = default_log_dir(workdir_root) if self._owns_log_dir else self._node_log_dir
        job = NodeJob(
            job_id=self.job_id,
            driver_address=sup.open_route(functools.partial(self.backend.route, ports=self._env.get(PORTS_ENV))),
            secret=sup.secret,
            payload=self._payload,
            protocol=self.spec.protocol,
            heartbeat_interval=self._heartbeat_interval,
            heartbeat_timeout=self.heartbeat_timeout,
            connect_timeout=max(self.reservation_timeout, 10.0),
            env=self._env,
            default_fs=self._default_fs,
            workdir_root=workdir_root,
            stop_timeout=self.stop_timeout,
            keep_workdir=self._keep_workdir,
            log_nodes=self._log_nodes,
            log_dir=log_dir,
            owns_log_dir=self._owns_log_dir,
            tensorboard_node=-1 if self._tensorboard_node is None else self._tensorboard_node,
            restart=self.attempt,
            resume_epoch=self._resume_epoch,
            checkpoint_dir=self.checkpoint_dir,
            checkpoints=dict(self._resume_paths),
            owns_checkpoint_dir=self._owns_checkpoint_dir,
            tls=sup.tls,
        )
        logger.info("duotf: starting %d nodes on %s (job %s)", n, self.backend.name, self.job_id)
        names = [str(node.role).replace(":", "-") for node in self.nodes]  # "worker-1"
        # Only a GPU run passes gpus_per_node: a backend that holds no GPUs keeps the plain call.
        sup.watch(self.backend.start_nodes(functools.partial(run_node, job), n, attempt_id,
                                           names=names,
                                           **({"gpus_per_node": gpus} if gpus else {})))

        sup.await_nodes(lambda s: s is NodeState.READY or s in TERMINAL, deadline, "ready")
        tf_configs = self.spec.tf_configs([node.address for node in self.nodes])
        for node in self.nodes:
            sup.send(node, Msg.START, tf_config=tf_configs[node.node_id],
                     job=node.role.job, index=node.role.index, host=node.host, port=node.port)
        sup.await_nodes(lambda s: s not in (NodeState.REGISTERED, NodeState.READY), deadline, "started")
        sup.mark_running()
        self.startup_seconds = deadline.elapsed
        logger.info("duotf: %d nodes running after %.2f s", n, self.startup_seconds)
        return self

    # -- public -------------------------------------------------------------------------------
    def wait(self, timeout: Optional[float] = None) -> List[Any]:
        """Wait until every node has ended; return the values of ``main``, by node id.

        ps nodes (and nodes that called ``ctx.serve()``) give ``None``; they are stopped as soon
        as every other node has returned. Raises the first node failure as a
        :class:`~duotf.errors.NodeError`, or ``TimeoutError`` after ``timeout`` seconds.
        """
        if timeout is not None:
            seconds(timeout, "timeout", zero=True)
        deadline = Deadline.after(timeout)
        if self._stopped is not None:
            raise self._stopped
        live = (ClusterStatus.STARTING, ClusterStatus.RUNNING)
        while True:
            sup = self.supervisor
            if not sup.wait_for(lambda: sup.status not in live, deadline):
                # (a deadline with no timeout never expires)
                raise TimeoutError(still_running(self.nodes, cast(float, timeout)))
            self._end_bar()  # every main has ended: the last bar shows their last reports
            if sup.error is None:
                return self._collect()
            if not self._restart():
                self._raise_failure(sup)
            if self._feed_call is not None:
                # the restarted nodes are fed the epochs of the latest train() not yet saved
                self._feed(self._resume_epoch)

    def _raise_failure(self, sup: Supervisor) -> None:
        """Raise the nodes' failure; where their mains raised only because the driver ended a
        feed whose feeding task the engine lost, that feed's error (naming the feeder)."""
        try:
            sup.raise_if_failed()
        except DuotfError as error:
            if self._feed_error is not None and self._ended_by_feed(error):
                raise self._feed_error from error
            raise

    def _ended_by_feed(self, error) -> bool:
        """Whether ``error`` (a node's) is only its main raising as the driver ended its feed
        after train() raised ``self._feed_error``."""
        return self._feed_error is not None and getattr(error, "remote_type", None) == "FeedError"

    # -- restarts -----------------------------------------------------------------------------
    def _restart(self, cause: Optional[DuotfError] = None) -> bool:
        """After this attempt failed: start the gang again (True) if ``max_restarts`` and
        ``restart_on`` allow, resuming at the last epoch every reporting node saved; False
        where the failure is to be raised. The failure is the supervisor's (a node's), or
        ``cause``: a feed whose feeding task the engine lost (``FeedError.lost``). A restart
        whose start fails counts as an attempt of its own; when no more is allowed, its error
        is raised here, as a run without restarts raises it."""
        tried = False
        while True:
            sup = self.supervisor
            error, cause = cause or sup.error, None
            if (error is None or self._closed or self.attempt >= self.max_restarts
                    or not restartable(error, *self._restart_on)):
                if tried:
                    sup.raise_if_failed()
                return False
            tried = True
            failed_at = sup.failed_at if sup.failed_at is not None else time.monotonic()
            for node_id, epochs in sup.checkpoints().items():
                self._checkpoints.setdefault(node_id, {}).update(epochs)
            sup.stop_nodes(sup.failure_stop_timeout)
            self._engine_slots = avoid_lost_host(self.backend, error, sup.nodes, self._engine_slots)
            sup.close()  # its error is this restart's cause, kept in cluster.restarts
            epoch, paths = resume_point(self._checkpoints, range(len(self.nodes)))
            record = Restart(
                attempt=self.attempt, cause=cast(Cause, failure_cause(error)),  # restartable
                node=getattr(error, "role", None),
                error=str(error).splitlines()[0], failed_at=time.time() - (time.monotonic() - failed_at),
                resume_epoch=epoch)
            self.attempt += 1
            logger.warning("duotf: restarting the cluster (restart %d of max_restarts=%d) after "
                           "%s: %s; resuming at epoch %d", self.attempt, self.max_restarts,
                           record.cause, record.error, epoch)
            self._resume_epoch, self._resume_paths = epoch, paths
            self._tensorboard_url = None
            self.supervisor = self._new_supervisor()
            try:
                self._start(Deadline.after(self.reservation_timeout))
            except DuotfError:
                self.restarts.append(record)
                if self.supervisor.error is None:
                    raise  # not a node failure (no capacity, no registration): as it is
                continue  # a node failed while starting: this attempt failed too
            self.restarts.append(dataclasses.replace(record, seconds=time.monotonic() - failed_at))
            return True

    def train(self, data: Any, epochs: int = 1, *, feed_timeout: float = 600.0,
              balance: bool = True, ragged: Sequence[str] = (),
              convert_once: Optional[bool] = None, shuffle: bool = False, seed: Optional[int] = None,
              shuffle_buffer: Optional[int] = None, initial_epoch: int = 0, locality: bool = False) -> TrainReport:
        """Push ``data`` into the chief and workers, ``epochs`` times; return when all is queued.

        ``data``: a Spark DataFrame or RDD, a Dask DataFrame, Bag or Array, or (local backend) a
        list of partitions. Nodes read it with ``ctx.get_data_feed()``. With ``balance=True``
        every worker gets the same number of rows per epoch (see :func:`duotf._driver.planner.balance`),
        so synchronous workers run the same number of steps. Raises the node's error within
        moments if a node dies, and :class:`~duotf.errors.FeedError` if a node takes no data for
        ``feed_timeout`` seconds. Returns a :class:`~duotf.reports.TrainReport`: the rows fed
        and where the time went. Shows a progress bar per epoch as ``duotf.run(progress=...)`` says.

        Data the feed would otherwise change is refused with a
        :class:`~duotf.errors.FeedSchemaError` naming the column, partition and row: a null
        (fill or drop them first), or an array column whose rows differ in length. ``ragged``
        names the array columns whose rows may differ in length (for rows without names, their
        positions: ``"0"``, ``"1"``, ...): a node receives such a column as a
        :class:`~duotf._transport.columns.RaggedColumn` (``values`` and ``row_splits``) from
        ``next_batch``, and as a ``tf.RaggedTensor`` from ``dataset()``.

        ``convert_once``: a Spark DataFrame fed ``epochs > 1`` times (one of numbers: any) is
        converted into feed frames once, first, kept in files in its executors' local dirs (as
        :func:`duotf.spark.feed_cache` does, never filling a disk past
        ``duotf.backends.spark.frames.MIN_FREE_BYTES``/``MIN_FREE_FRACTION``) that feed the later
        epochs and are deleted when ``train`` returns. ``False`` reads the DataFrame every epoch.

        ``shuffle=True`` shuffles each epoch by ``seed`` (drawn, reported as ``shuffle_seed``,
        if not given), nodes permuting windows of ``shuffle_buffer`` rows (default ~30 MiB): the
        same order on every engine and run (:mod:`duotf._transport.shuffle`). ``initial_epoch=k``
        feeds epochs ``k + 1`` to ``epochs`` alone, numbered (and shuffled) as in a whole run.
        ``locality=True`` deals each epoch's partitions to the workers on the hosts holding them
        where the balance allows (:func:`duotf._driver.planner.local_order`): fewer rows cross
        hosts, but which worker gets which rows then depends on where the engine put them."""
        from duotf._driver.planner import check_feed_args, shuffle_seed
        check_feed_args(epochs, feed_timeout, convert_once, initial_epoch, locality, shuffle)
        self._feed_error = None
        self._feed_call = dict(data=data, epochs=epochs, feed_timeout=feed_timeout, balance=balance,
                               ragged=ragged, convert_once=convert_once, shuffle_buffer=shuffle_buffer
                               or 0, shuffle=shuffle_seed(shuffle, seed, shuffle_buffer), local=locality)
        return self._feed(initial_epoch)

    def _feed(self, first_epoch: int) -> TrainReport:
        """Feed the latest train() call from ``first_epoch`` on; a restart (where allowed)
        feeds the restarted nodes from the epoch they resume at."""
        from duotf._driver import planner
        call = self._feed_call
        assert call is not None  # train() set it
        while True:
            # The last epoch's bar stays open after the feed (training goes on behind it), showing
            # the reports as they come, until wait() or shutdown has them all (_end_bar).
            bar = self._bar(linger=True)
            try:
                report = planner.train(self.supervisor, self.backend, call["data"], call["epochs"],
                                       call["feed_timeout"], call["balance"], call["ragged"], bar,
                                       call["convert_once"], first_epoch=first_epoch,
                                       shuffle=call["shuffle"], shuffle_rows=call["shuffle_buffer"],
                                       local=call["local"])
            except BaseException as exc:
                self._end_bar()
                # a feeding task lost with its process (the nodes are well, but their feed
                # broke mid-range): a failure as a lost node's is; any other with a node's error
                lost = exc if isinstance(exc, FeedError) and exc.lost else None
                if lost is not None:
                    self._feed_error = lost
                if (not isinstance(exc, DuotfError) or (lost is None and self.supervisor.error is None)
                        or not self._restart(lost)):
                    raise
                self._feed_error, first_epoch = None, max(first_epoch, self._resume_epoch)
                continue
            if first_epoch:
                report["resumed_at_epoch"] = first_epoch
            return report

    def open_stream(self, *, feed_timeout: float = 600.0, balance: bool = True,
                    ragged: Sequence[str] = ()) -> Stream:
        """Open a training feed that stays open between chunks: a
        :class:`duotf._driver.planner.Stream`. ``stream.feed(data)`` feeds one chunk (anything
        :meth:`train` takes) and returns once the nodes have its rows queued;
        ``stream.end()`` ends every node's feed. The nodes read one continuous stream: their
        ``next_batch`` takes rows across chunks, and ``should_stop()`` / ``dataset()`` end
        only with ``end()``. ``balance`` applies per chunk (its few rows left over are not
        fed); ``feed_timeout`` and ``ragged`` as in :meth:`train`.
        :func:`duotf.spark.feed_stream` and :func:`duotf.dask.feed_stream` feed a Spark
        streaming DataFrame or Dask futures through one."""
        from duotf._driver import planner
        planner.check_feed_args(1, feed_timeout)
        return planner.Stream(self.supervisor, self.backend, feed_timeout, balance, ragged)

    def inference(self, data: Any, *, keep: Optional[Sequence[str]] = None,
                  result_columns: Optional[Dict[str, str]] = None, feed_timeout: float = 600.0,
                  ragged: Sequence[str] = ()) -> Any:
        """Push ``data`` through the nodes and return their results, one per input, in order.

        The result is a collection of the input's engine, its answers materialized while the
        cluster runs: a DataFrame gives a DataFrame with the result columns beside the input
        columns in ``keep`` (default: all); an RDD, Bag or Array gives one result per element.
        A Spark DataFrame that gives the same rows each time it is computed (every expression
        deterministic, no shuffle of unfixed order) keeps only the answers: its ``keep`` columns
        are read from it again beside them whenever the result is read, as any Spark
        transformation's output is (a partition that comes back with other rows fails the read);
        any other DataFrame's ``keep`` columns are kept with the answers.
        ``result_columns`` (Spark DataFrames): ``{name: Spark SQL type}``, default
        ``{"prediction": "double"}``. Nulls and ``ragged`` columns: as in :meth:`train`.
        """
        from duotf._driver import planner
        planner.check_feed_args(1, feed_timeout)
        while True:
            bar = self._bar()
            try:
                return planner.inference(self.supervisor, self.backend, data, keep,
                                         result_columns, feed_timeout, ragged, bar)
            except DuotfError:
                if self.supervisor.error is None or not self._restart():
                    raise
                # the restarted nodes answer every row again (a result is all or nothing)
            finally:
                self._end_bar()

    def _collect(self) -> List[Any]:
        if self._results is None:
            import cloudpickle

            outcomes = self.supervisor.node_outcomes()
            if outcomes is None:
                raise ClusterClosedError(f"{self!r} was shut down before its nodes ended")
            values: List[Any] = [None] * len(self.nodes)
            for outcome in outcomes:
                if outcome.status is OutcomeStatus.DONE and outcome.payload is not None:
                    values[outcome.node_id] = cloudpickle.loads(outcome.payload)
            self._results = values
        return list(self._results)

    def shutdown(self, grace_secs: float = 60.0) -> None:
        """Stop the cluster; idempotent.

        Waits up to ``grace_secs`` for every ``main`` to return (a chief still saving its model
        is given that time), then stops every node, ps included, and releases every process,
        thread and port. Raises :class:`~duotf.errors.NodesStoppedError` if a ``main`` had to be
        stopped, and a node failure that no earlier call raised.
        """
        unraised = self._shutdown(grace_secs)
        if unraised is not None:
            raise unraised

    def _shutdown(self, grace_secs: float) -> Optional[DuotfError]:
        """:meth:`shutdown`, returning the error it would raise (None the second time)."""
        if self._closed:
            return None
        seconds(grace_secs, "grace_secs", zero=True)
        self._closed = True
        sup = self.supervisor
        cut_off = sup.begin_shutdown(grace_secs)
        sup.stop_nodes()
        unraised = sup.close()
        if self._ended_by_feed(unraised):
            unraised = None  # train() raised why: the feed's error
        self._metrics.close()  # every report has arrived: the callbacks get the last ones
        self._end_bar()
        if self._logs is not None:
            self._logs.close()
        if self._owns_checkpoint_dir:
            shutil.rmtree(self.checkpoint_dir, ignore_errors=True)
        if not self._keep_workdir:
            # Every node is stopped or given up: what a node killed with its agent (or a node
            # process and its agent both) left on this host goes (other hosts' nodes remove theirs)
            for attempt in range(self.attempt + 1):
                shutil.rmtree(default_workdir_root(self._attempt_id(attempt)), ignore_errors=True)
        _live.discard(self)
        if self._owns_backend:
            self.backend.close()
        logger.info("duotf: cluster %s shut down", self.job_id)
        if cut_off:
            names = [str(x.role) for x in cut_off]
            self._stopped = NodesStoppedError(
                f"shutdown stopped {', '.join(x.describe() for x in cut_off)}: main had not returned "
                f"within grace_secs={grace_secs:g}. Its work may be incomplete (a model not saved); "
                "call cluster.wait() first or raise grace_secs.",
                stopped=names, grace_secs=grace_secs,
            )
        return unraised if unraised is not None else self._stopped

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.shutdown()
        else:
            # Something already went wrong in the caller: stop at once and keep their error.
            self._shutdown(grace_secs=0)


def start(cluster: Cluster) -> Cluster:
    """Reserve every node of ``cluster``, hand each its TF_CONFIG, and return it once every
    main runs (:func:`duotf.run` calls it; a cluster starts once). A start that fails stops
    whatever it started before it raises."""
    return cluster._start_once()


def shutdown_quietly(cluster: Cluster, grace_secs: float = 0) -> None:
    """:meth:`Cluster.shutdown` raising no node failure nor :class:`~duotf.errors.NodesStoppedError`
    (the atexit sweep, a caller with an error of its own); default: no grace."""
    cluster._shutdown(grace_secs)
