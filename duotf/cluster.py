"""The driver-side handle of a running TensorFlow cluster: start, supervise, wait, shut down."""

from __future__ import annotations

import atexit
import dataclasses
import enum
import functools
import logging
import threading
import time
import uuid
import weakref
from typing import Any, Callable, Dict, List, Optional

from . import rendezvous
from .errors import (
    BackendError,
    ClusterClosedError,
    DuotfError,
    NodeError,
    NodeFailedError,
    NodesStoppedError,
    NodeUnresponsiveError,
    ReservationTimeoutError,
    UnsupportedProtocolError,
)
from .node import NodeJob, default_workdir_root, run_node
from .spec import ClusterSpec, Role

logger = logging.getLogger(__name__)

__all__ = ["Cluster", "ClusterStatus", "NodeInfo"]


class ClusterStatus(str, enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    FINISHED = "finished"  # every node ended on its own (mains returned, servers stopped)
    FAILED = "failed"
    CLOSED = "closed"


_TERMINAL = ("done", "failed", "stopped")
#: states in which a node's main has ended (a "returned" node waits to be released)
_ENDED = _TERMINAL + ("returned",)


@dataclasses.dataclass
class NodeInfo:
    """One node as the driver sees it. ``state`` goes pending -> registered -> ready ->
    running | serving -> done | failed | stopped."""

    node_id: int
    role: Role
    host: Optional[str] = None
    port: Optional[int] = None
    pid: Optional[int] = None
    executor_id: str = ""
    feed_port: Optional[int] = None
    feed_terminated: bool = False
    state: str = "pending"
    last_seen: float = 0.0
    peer: Any = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def describe(self) -> str:
        where = f" on {self.host}" if self.host else ""
        pid = f", pid {self.pid}" if self.pid else ""
        return f"{self.role}{where} (node {self.node_id}{pid})"


def _is_server(node: NodeInfo) -> bool:
    """ps nodes serve from the start; other nodes once they called ``ctx.serve()``."""
    return node.role.job == "ps" or node.state == "serving"


_live: "weakref.WeakSet[Cluster]" = weakref.WeakSet()


@atexit.register
def _sweep() -> None:
    for cluster in list(_live):
        logger.warning("duotf: shutting down a cluster that was never shut down: %r", cluster)
        try:
            cluster.shutdown(grace_secs=0, _raise=False)
        except Exception:  # best effort at interpreter exit
            logger.exception("duotf: atexit shutdown failed")


class Cluster:
    """A TensorFlow cluster running on an engine. Create it with :func:`duotf.run`.

    Use it as a context manager, or call :meth:`wait` and :meth:`shutdown`.
    """

    def __init__(
        self,
        main: Callable,
        args: Any,
        backend,
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
    ):
        import cloudpickle

        self.spec = spec
        self.backend = backend
        self.job_id = uuid.uuid4().hex[:12]
        self.reservation_timeout = reservation_timeout
        self.heartbeat_timeout = heartbeat_timeout
        self.stop_timeout = stop_timeout
        self.status = ClusterStatus.STARTING
        self.nodes: List[NodeInfo] = [NodeInfo(i, r) for i, r in enumerate(spec.roles())]
        self._owns_backend = owns_backend
        self._cond = threading.Condition()
        self._error: Optional[DuotfError] = None
        self._error_delivered = False
        self._stopper: Optional[threading.Thread] = None
        self._monitor: Optional[threading.Thread] = None
        self._gang = None
        self._results: Optional[List[Any]] = None
        self._server: Optional[rendezvous.RendezvousServer] = None
        self._payload = cloudpickle.dumps((main, args))
        self._env = {str(k): str(v) for k, v in (env or {}).items()}
        self._default_fs = default_fs if default_fs is not None else backend.default_fs()
        self._driver_host = driver_host or backend.driver_host()
        self._heartbeat_interval = heartbeat_interval
        self.startup_seconds: Optional[float] = None

    def __repr__(self) -> str:
        return (
            f"<duotf.Cluster {self.job_id} {self.status.value} nodes={len(self.nodes)} "
            f"backend={self.backend.name}>"
        )

    # -- start ----------------------------------------------------------------------------
    def _start(self) -> "Cluster":
        t0 = time.monotonic()
        n = len(self.nodes)
        self.backend.check_capacity(n)
        self._secret = secret = rendezvous.new_secret()
        self._server = rendezvous.RendezvousServer(
            secret, self._on_message, self._on_close, host=self._driver_host
        )
        _live.add(self)
        job = NodeJob(
            job_id=self.job_id,
            driver_address=self._server.address,
            secret=secret,
            payload=self._payload,
            protocol=self.spec.protocol,
            heartbeat_interval=self._heartbeat_interval,
            heartbeat_timeout=self.heartbeat_timeout,
            connect_timeout=max(self.reservation_timeout, 10.0),
            env=self._env,
            default_fs=self._default_fs,
            workdir_root=default_workdir_root(self.job_id),
            stop_timeout=self.stop_timeout,
        )
        logger.info("duotf: starting %d nodes on %s (job %s)", n, self.backend.name, self.job_id)
        self._gang = self.backend.start_nodes(functools.partial(run_node, job), n, self.job_id)
        self._monitor = threading.Thread(target=self._watch, name="duotf-monitor", daemon=True)
        self._monitor.start()

        deadline = t0 + self.reservation_timeout
        self._wait_until(lambda: all(x.state in ("ready",) + _TERMINAL for x in self.nodes), deadline, "ready")
        addresses = [node.address for node in self.nodes]
        for node in self.nodes:
            self._send(node, {
                "type": "start",
                "tf_config": self.spec.tf_config(addresses, node.node_id),
                "job": node.role.job,
                "index": node.role.index,
                "host": node.host,
                "port": node.port,
            })
        self._wait_until(
            lambda: all(x.state not in ("registered", "ready") for x in self.nodes), deadline, "started"
        )
        with self._cond:
            if self.status is ClusterStatus.STARTING:
                self.status = ClusterStatus.RUNNING
        self.startup_seconds = time.monotonic() - t0
        logger.info("duotf: %d nodes running after %.2f s", n, self.startup_seconds)
        return self

    def _wait_until(self, predicate, deadline: float, what: str) -> None:
        with self._cond:
            while True:
                self._raise_if_failed()
                if predicate():
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(min(remaining, 0.5))
        self._fail(self._reservation_error(what))
        self._raise_if_failed()

    def _reservation_error(self, what: str) -> ReservationTimeoutError:
        expected = len(self.nodes)
        registered = [x for x in self.nodes if x.state != "pending"]
        missing = [x for x in self.nodes if x.state == "pending"]
        not_ready = [x for x in self.nodes if x.state == "registered"]
        lines = [
            f"only {len(registered)}/{expected} nodes registered"
            + (f" and {expected - len(not_ready) - len(missing)}/{expected} became {what}" if not missing else "")
            + f" within reservation_timeout={self.reservation_timeout:g} s."
        ]
        if missing:
            lines.append("Missing: " + ", ".join(x.describe() for x in missing) + ".")
        if not_ready:
            lines.append("Registered but not ready: " + ", ".join(x.describe() for x in not_ready) + ".")
        lines.append(
            f"Check that the {self.backend.name} backend can run {expected} tasks at once, that "
            f"executors can reach the driver at {self._server.address[0]}:{self._server.address[1]} "
            "(driver_host=...), and raise reservation_timeout=... if nodes are just slow to start."
        )
        return ReservationTimeoutError(
            " ".join(lines),
            registered=len(registered),
            expected=expected,
            missing=[x.node_id for x in missing + not_ready],
            timeout=self.reservation_timeout,
        )

    # -- messages from the nodes -------------------------------------------------------------
    def _send(self, node: NodeInfo, message: dict) -> None:
        if node.peer is None:
            return
        try:
            node.peer.send(message)
        except OSError as exc:
            logger.debug("could not send %s to %s: %s", message["type"], node.describe(), exc)

    def _on_message(self, peer, message: dict) -> None:
        kind = message["type"]
        node_id = message.get("node_id")
        if not isinstance(node_id, int) or not 0 <= node_id < len(self.nodes):
            logger.warning("duotf: message for unknown node %r ignored", node_id)
            return
        node = self.nodes[node_id]
        failure = None
        with self._cond:
            if kind == "register":
                if node.peer is not None or self.status is not ClusterStatus.STARTING:
                    reason = (
                        f"{node.describe()} registered a second time (attempt "
                        f"{message.get('attempt')}); the engine started it again"
                        if node.peer is not None
                        else f"the cluster is {self.status.value}"
                    )
                    try:
                        peer.send({"type": "reject", "reason": reason})
                    except OSError:
                        pass
                    if node.peer is not None and self.status in (ClusterStatus.STARTING, ClusterStatus.RUNNING):
                        failure = NodeFailedError(
                            f"{reason}. duotf never runs two copies of a node; the cluster was stopped.",
                            node_id=node_id, role=str(node.role), host=node.host, pid=node.pid,
                            exitcode=None, remote_type=None, remote_traceback=None,
                        )
                else:
                    node.peer = peer
                    peer.node_id = node_id
                    node.host = message["host"]
                    node.port = message["port"]
                    node.pid = message["pid"]
                    node.executor_id = message.get("executor_id", "")
                    node.state = "registered"
                    node.last_seen = time.monotonic()
            elif getattr(peer, "node_id", None) != node_id:
                logger.warning("duotf: %s message from a connection of another node ignored", kind)
                return
            else:
                node.last_seen = time.monotonic()
                if kind == "feed_terminated":
                    node.feed_terminated = True
                elif kind in ("ready", "running", "serving", "returned", "done", "stopped"):
                    if node.state not in _TERMINAL:
                        node.state = kind
                    if kind == "ready":
                        node.feed_port = message.get("feed_port")
                elif kind == "failed":
                    node.state = "failed"
                    failure = self._node_failure(node, message)
            self._cond.notify_all()
        if failure is not None:
            self._fail(failure)
        elif kind in ("returned", "done", "serving"):
            self._stop_servers_when_finished()

    def _on_close(self, peer, exc) -> None:
        node_id = getattr(peer, "node_id", None)
        if node_id is None:
            return
        node = self.nodes[node_id]
        with self._cond:
            lost = node.state not in _TERMINAL and self.status in (ClusterStatus.STARTING, ClusterStatus.RUNNING)
            if lost:
                node.state = "failed"
            self._cond.notify_all()
        if lost:
            self._fail(NodeFailedError(
                f"lost the connection to {node.describe()}: its engine task or executor died "
                f"({exc}). Every other node was stopped.",
                node_id=node_id, role=str(node.role), host=node.host, pid=node.pid,
                exitcode=None, remote_type=None, remote_traceback=None,
            ))

    def _node_failure(self, node: NodeInfo, message: dict) -> DuotfError:
        kind = message.get("kind")
        attrs = dict(node_id=node.node_id, role=str(node.role), host=node.host, pid=node.pid)
        text = message.get("message", "")
        if kind == "protocol":
            version = message.get("tf_version", "?")
            return UnsupportedProtocolError(
                f"protocol={self.spec.protocol!r} is not available in TensorFlow {version} on "
                f"{node.host} ({text}). No user code was run. Use protocol='grpc'; for RDMA between "
                "GPUs use NCCL collectives with MultiWorkerMirroredStrategy(communication_options="
                "tf.distribute.experimental.CommunicationOptions(implementation="
                "tf.distribute.experimental.CommunicationImplementation.NCCL)), or install a "
                f"TensorFlow build that registers the {self.spec.protocol!r} server.",
                protocol=self.spec.protocol, tf_version=version, host=node.host,
            )
        if kind == "unresponsive":
            return NodeUnresponsiveError(
                f"{node.describe()} stopped responding: {text}. It was killed and every other "
                "node was stopped; raise heartbeat_timeout=... if main blocks the interpreter "
                "for longer.",
                **attrs,
            )
        remote_tb = message.get("traceback")
        remote_type = message.get("remote_type")
        exitcode = message.get("exitcode")
        if remote_tb:
            summary = f"{remote_type}: {text}" if text else str(remote_type)
            where = "main raised" if kind == "exception" else f"could not run ({kind})"
            msg = f"{node.describe()} {where} {summary}\n\nRemote traceback:\n{remote_tb.rstrip()}"
        else:
            msg = f"{node.describe()} failed: {text}"
        return NodeFailedError(
            msg + "\nEvery other node was stopped.",
            exitcode=exitcode, remote_type=remote_type, remote_traceback=remote_tb, **attrs,
        )

    # -- supervision ------------------------------------------------------------------------
    def _watch(self) -> None:
        """Heartbeat and engine-job watchdog; runs until the cluster is closed."""
        while True:
            with self._cond:
                if self.status in (ClusterStatus.STARTING, ClusterStatus.RUNNING):
                    self._cond.wait(0.5)
                if self.status not in (ClusterStatus.STARTING, ClusterStatus.RUNNING):
                    return  # finished, failed (the stopper takes over) or closed
                now = time.monotonic()
                stale = [
                    x for x in self.nodes
                    if x.state not in ("pending",) + _TERMINAL and now - x.last_seen > self.heartbeat_timeout
                ]
                gang_exc = self._gang.exception() if self._gang.done() else None
                gang_done = self._gang.done()
            if stale:
                node = stale[0]
                self._fail(NodeUnresponsiveError(
                    f"{node.describe()} sent no heartbeat for more than heartbeat_timeout="
                    f"{self.heartbeat_timeout:g} s (its executor may be lost or stalled). "
                    "Every other node was stopped.",
                    node_id=node.node_id, role=str(node.role), host=node.host, pid=node.pid,
                ))
            elif gang_exc is not None:
                err = BackendError(
                    f"the {self.backend.name} job running the nodes failed: "
                    f"{type(gang_exc).__name__}: {gang_exc}"
                )
                err.__cause__ = gang_exc
                self._fail(err)
            elif gang_done:
                self._finish()

    def _finish(self) -> None:
        finished = False
        with self._cond:
            if self.status in (ClusterStatus.STARTING, ClusterStatus.RUNNING):
                if any(x.state not in _TERMINAL for x in self.nodes):
                    pending = [x.describe() for x in self.nodes if x.state not in _TERMINAL]
                    self._cond.notify_all()
                    err = BackendError(
                        f"the {self.backend.name} job ended while nodes had not: {', '.join(pending)}"
                    )
                else:
                    self.status = ClusterStatus.FINISHED
                    self._cond.notify_all()
                    finished = True
            else:
                return
        if finished:
            self._server.close()  # every node has ended: nothing more to hear from them
            return
        self._fail(err)

    def _stop_servers_when_finished(self) -> None:
        """Once every non-serving node has returned, serving nodes (ps) have nothing to serve."""
        with self._cond:
            # A ps node is a server from the start, even before it reports "serving".
            servers = [x for x in self.nodes if _is_server(x)]
            others = [x for x in self.nodes if x not in servers]
            if not all(x.state in _ENDED for x in others):
                return
            servers = [x for x in servers if x.state not in _TERMINAL]
            waiting = [x for x in others if x.state == "returned"]
        for node in waiting:  # every main has returned: their processes may exit together
            self._send(node, {"type": "release"})
        for node in servers:
            self._send(node, {"type": "stop", "timeout": self.stop_timeout})

    def _fail(self, error: DuotfError) -> None:
        with self._cond:
            if self._error is not None or self.status is ClusterStatus.CLOSED:
                return
            self._error = error
            self.status = ClusterStatus.FAILED
            self._cond.notify_all()
        logger.error("duotf: %s", str(error).splitlines()[0])
        self._stopper = threading.Thread(target=self._stop_all, name="duotf-stopper", daemon=True)
        self._stopper.start()

    def _stop_all(self) -> None:
        for node in self.nodes:
            self._send(node, {"type": "stop", "timeout": self.stop_timeout})
        deadline = time.monotonic() + self.stop_timeout + 5
        while not self._gang.done() and time.monotonic() < deadline:
            with self._cond:
                self._cond.wait(0.2)
        if not self._gang.done():
            logger.warning("duotf: engine tasks still running after stop; cancelling them")
        self._gang.cancel()
        # A failed cluster releases its port and threads by itself, shut down or not.
        self._server.close()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            self._error_delivered = True
            raise self._error
        if self.status is ClusterStatus.CLOSED:
            raise ClusterClosedError(f"{self!r} is shut down")

    # -- public -------------------------------------------------------------------------------
    def wait(self, timeout: Optional[float] = None) -> List[Any]:
        """Wait until every node has ended; return the values of ``main``, by node id.

        ps nodes (and nodes that called ``ctx.serve()``) give ``None``; they are stopped as soon
        as every other node has returned. Raises the first node failure as a
        :class:`~duotf.errors.NodeError`, or ``TimeoutError`` after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self.status in (ClusterStatus.STARTING, ClusterStatus.RUNNING):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    running = [x.describe() for x in self.nodes if x.state not in _TERMINAL]
                    raise TimeoutError(f"after {timeout:g} s these nodes still run: {', '.join(running)}")
                self._cond.wait(0.5 if remaining is None else min(remaining, 0.5))
            if self._error is not None:
                self._raise_if_failed()
            if self._gang is None or not self._gang.done():
                raise ClusterClosedError(f"{self!r} was shut down before its nodes ended")
        return self._collect()

    def train(self, data, epochs: int = 1, *, feed_timeout: float = 600.0,
              balance: bool = True) -> dict:
        """Push ``data`` into the chief and workers, ``epochs`` times; return when all is queued.

        ``data``: a Spark DataFrame or RDD, a Dask DataFrame, Bag or Array, or (local backend) a
        list of partitions. Nodes read it with ``ctx.get_data_feed()``. With ``balance=True``
        every worker gets the same number of rows per epoch (see ``duotf.feed.feeder.balance``),
        so synchronous workers run the same number of steps. Raises the node's error within
        moments if a node dies, and :class:`~duotf.errors.FeedError` if a node takes no data for
        ``feed_timeout`` seconds. Returns counts: rows fed, rows per worker, rows left over.
        """
        from .feed import driver

        return driver.train(self, data, epochs, feed_timeout, balance)

    def inference(self, data, *, keep=None, result_columns=None, feed_timeout: float = 600.0):
        """Push ``data`` through the nodes and return their results, one per input, in order.

        The result is a collection of the input's engine, materialized while the cluster runs:
        a DataFrame gives a DataFrame with the result columns beside the input columns in
        ``keep`` (default: all); an RDD, Bag or Array gives one result per element.
        ``result_columns`` (Spark DataFrames): ``{name: Spark SQL type}``, default
        ``{"prediction": "double"}``.
        """
        from .feed import driver

        return driver.inference(self, data, keep, result_columns, feed_timeout)

    def _collect(self) -> List[Any]:
        if self._results is None:
            import cloudpickle

            values: List[Any] = [None] * len(self.nodes)
            for outcome in self._gang.outcomes():
                if outcome.status == "done" and outcome.payload is not None:
                    values[outcome.node_id] = cloudpickle.loads(outcome.payload)
            self._results = values
        return list(self._results)

    def shutdown(self, grace_secs: float = 60.0, *, _raise: bool = True) -> None:
        """Stop the cluster; idempotent.

        Waits up to ``grace_secs`` for every ``main`` to return (a chief still saving its model
        is given that time), then stops every node, ps included, and releases every process,
        thread and port. Raises :class:`~duotf.errors.NodesStoppedError` if a ``main`` had to be
        stopped, and a node failure that no earlier call raised.
        """
        with self._cond:
            if self.status is ClusterStatus.CLOSED:
                return
            deadline = time.monotonic() + grace_secs
            while self.status is ClusterStatus.RUNNING and time.monotonic() < deadline:
                if all(x.state in _ENDED or _is_server(x) for x in self.nodes):
                    break
                self._cond.wait(min(0.5, max(deadline - time.monotonic(), 0.01)))
            cut_off = [
                x for x in self.nodes
                if self.status is ClusterStatus.RUNNING and x.state not in _ENDED
                and not _is_server(x) and x.state != "pending"
            ]
        for node in self.nodes:
            if node.state not in _TERMINAL:
                self._send(node, {"type": "stop", "timeout": self.stop_timeout})
        if self._gang is not None:
            deadline = time.monotonic() + self.stop_timeout + 5
            with self._cond:
                while not self._gang.done() and time.monotonic() < deadline:
                    self._cond.wait(0.1)
            if not self._gang.done():
                logger.warning("duotf: engine tasks did not end after stop; cancelling them")
            self._gang.cancel()
            self._gang.join(10)
        if self._stopper is not None:
            self._stopper.join(self.stop_timeout + 10)
        with self._cond:
            self.status = ClusterStatus.CLOSED
            self._cond.notify_all()
        if self._server is not None:
            self._server.close()
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(5)
        _live.discard(self)
        if self._owns_backend:
            self.backend.close()
        logger.info("duotf: cluster %s shut down", self.job_id)
        if not _raise:
            return
        if self._error is not None and not self._error_delivered:
            self._error_delivered = True
            raise self._error
        if cut_off:
            names = [str(x.role) for x in cut_off]
            raise NodesStoppedError(
                f"shutdown stopped {', '.join(x.describe() for x in cut_off)}: main had not returned "
                f"within grace_secs={grace_secs:g}. Its work may be incomplete (a model not saved); "
                "call cluster.wait() first or raise grace_secs.",
                stopped=names, grace_secs=grace_secs,
            )

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.shutdown()
        else:
            # Something already went wrong in the caller: stop at once and keep their error.
            self.shutdown(grace_secs=0, _raise=False)
