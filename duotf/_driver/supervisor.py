"""Supervision on the driver: the node table, the nodes' messages, failure -> stop every node.

The :class:`Supervisor` owns the rendezvous server and one condition that every change of a
node or of the cluster's status notifies (but a heartbeat's: the watchdog alone reads when a
node was last heard from, at its own deadline); every wait in duotf's driver is a wait on that
condition with a deadline, never a fixed poll. ``benchmarks/scale.py`` measures the driver at
a thousand (simulated) nodes. What the rest of the driver needs from it (the
cluster's start and shutdown, the feed planner, and later restarts and log streaming) is a
documented method here; nobody else reads its fields.

Its vocabulary (the node and cluster states, :class:`NodeInfo`) is :mod:`duotf._driver.nodes`,
its heartbeat watchdog :mod:`duotf._driver.watchdog`, and the wording of a node's failure
:mod:`duotf._driver.failures`.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from typing import Any, Callable, List, Optional, Tuple, cast

from duotf._deadline import Deadline
from duotf._driver import failures
from duotf._driver.nodes import (ENDED, LIVE, REPORTED, TERMINAL, ClusterStatus, FeedTarget, NodeInfo,
                                 NodeState, kill_node_process)
from duotf._driver.watchdog import Watchdog
from duotf._transport import rendezvous
from duotf.backends.base import Route
from duotf._transport.rendezvous import Msg
from duotf.errors import BackendError, ClusterClosedError, DuotfError
from duotf.spec import ClusterSpec, Job

logger = logging.getLogger("duotf.cluster")

__all__ = ["JobStopped", "Supervisor", "WAIT_NOTE_AFTER", "STALLED_AFTER", "FAILURES_REPORTED"]

#: True where the caller hands every failure back itself (run_parallel: a run's error is its
#: outcome): a cluster made in that context logs its failure at DEBUG, not ERROR
FAILURES_REPORTED: "contextvars.ContextVar[bool]" = contextvars.ContextVar(
    "duotf_failures_reported", default=False)


def _tensorboard_report(node: NodeInfo, message: dict) -> dict:
    """A node's TensorBoard report as ``{"url": ...}`` (its host as the driver reaches it) or
    ``{"error": why}``; logged either way, since a URL is what a person looks for."""
    port = message.get("port")
    if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536:
        url = f"http://{node.host}:{port}/"
        logger.info("duotf: TensorBoard at %s (beside %s)", url, node.role)
        return {"url": url}
    why = str(message.get("error") or f"an unusable report {message!r}")
    logger.warning("duotf: TensorBoard did not start beside %s: %s", node.describe(), why)
    return {"error": why}


#: seconds of waiting for the nodes at start after which the wait is logged
WAIT_NOTE_AFTER = 2.0
#: seconds a chief or worker may run on after another one's main returned before the driver
#: warns (once) that it may be blocked in a collective its returned peers will never join: a
#: chief saving its model runs on too, so this is generous
STALLED_AFTER = 120.0
#: the jobs whose nodes take part in a MultiWorkerMirroredStrategy's collectives
_COLLECTIVE = (Job.CHIEF, Job.WORKER)


class JobStopped(Exception):
    """:meth:`Supervisor.run_job` cancelled the job because ``stop_if()`` became true."""


class Supervisor:
    """The driver's view of a cluster's nodes.

    Parameters
    ----------
    spec, backend_name:
        What runs, and on which engine (for messages).
    reservation_timeout:
        Seconds for every node to register and start (for the error that names the missing).
    heartbeat_timeout, stop_timeout:
        Seconds of silence after which a node counts as lost, and that a node is given to stop
        before it is killed.
    driver_host:
        The address the rendezvous server announces to the nodes.
    job_id:
        The job's id (its nodes carry it in ``DUOTF_JOB_ID``): with it, an unresponsive node on
        the driver's own host is killed by the driver too.
    logs:
        Where the nodes' output goes (:class:`~duotf._driver.nodelogs.NodeLogs`); None: nowhere.
    metrics:
        Where the nodes' reports go (:class:`~duotf._driver.metrics.NodeMetrics`); None: nowhere.
    """

    def __init__(self, spec: ClusterSpec, backend_name: str, *, reservation_timeout: float,
                 heartbeat_timeout: float, stop_timeout: float, driver_host: str,
                 job_id: Optional[str] = None, logs=None, metrics=None,
                 failure_stop_timeout: Optional[float] = None, ports=None, tls=None):
        self.spec = spec
        self.logs = logs
        self.metrics = metrics
        self.job_id = job_id
        self._driver_host = driver_host
        self.reservation_timeout = reservation_timeout
        self.backend_name = backend_name
        self.heartbeat_timeout = heartbeat_timeout
        self.stop_timeout = stop_timeout
        #: what the nodes are given to stop after a failure (default ``stop_timeout``): a
        #: cluster that restarts from a checkpoint keeps nothing of the failed attempt
        self.failure_stop_timeout = stop_timeout if failure_stop_timeout is None else failure_stop_timeout
        self.status = ClusterStatus.STARTING
        self._failure_level = logging.DEBUG if FAILURES_REPORTED.get() else logging.ERROR
        self.nodes: List[NodeInfo] = [NodeInfo(i, r) for i, r in enumerate(spec.roles())]
        #: the job's secret: authenticates the rendezvous and the feed connections
        self.secret = rendezvous.new_secret()
        #: the job's TLS material where its feed and control channel are encrypted, else None
        self.tls = tls
        self.error: Optional[DuotfError] = None
        self.failed_at: Optional[float] = None  # time.monotonic() when the error was recorded
        self._error_delivered = False
        self._cond = threading.Condition()
        self._gang = None
        self._disconnected: set = set()  # node ids whose agent's connection has ended
        self._released: set = set()  # node ids sent RELEASE, or STOP as a server with no peers
        #: seconds after the first chief or worker returned at which those still running are
        #: named (a WARNING, once); read when the watch starts
        self.stalled_after = STALLED_AFTER
        self._first_return: Optional[float] = None  # time.monotonic() of it
        self._threads: List[threading.Thread] = []
        self.server = rendezvous.RendezvousServer(self.secret, self._on_message, self._on_close,
                                                  host=driver_host, ports=ports, tls=tls)
        self._route: Optional[Route] = None

    def open_route(self, route_to: Callable[..., Route]) -> Tuple[str, int]:
        """The address the nodes reach the rendezvous server at: ``route_to`` (the backend's
        :meth:`~duotf.backends.base.Backend.route`) decides, directly or through a relay
        that fails the cluster if it is lost. Closed with the server."""
        idle = max(2 * self.heartbeat_timeout, 60.0)
        self._route = route_to(self.server.address, lambda why: self.fail(BackendError(why)), idle)
        return self._route.address

    def reach(self, call: Callable[[], Any]) -> Any:
        """``call()`` where the nodes' own ports can be reached: in this process, or in an
        engine task when a relay stands between (the driver cannot reach the nodes)."""
        return call() if self._route is None else self._route.run(call)

    @property
    def relayed(self) -> bool:
        """Whether the nodes reach the driver through a relay (the driver cannot reach them)."""
        return self._route is not None and self._route.relayed

    def _close_server(self) -> None:
        self.server.close()
        if self._route is not None:
            self._route.close()

    # -- waiting ------------------------------------------------------------------------------
    def wait_for(self, predicate: Callable[[], bool], deadline: Deadline, *,
                 failure_ends: bool = True) -> bool:
        """Wait until ``predicate()`` (called under the lock) is true or, with ``failure_ends``,
        a failure was recorded: True; False once ``deadline`` has expired
        (``Deadline.never()`` waits for ever)."""
        with self._cond:
            while not predicate():
                if failure_ends and self.error is not None:
                    return True
                if deadline.expired:
                    return False
                self._cond.wait(deadline.remaining)
            return True

    def notify(self) -> None:
        """Wake every waiter (a callback of an engine job calls it when the job ends)."""
        with self._cond:
            self._cond.notify_all()

    def raise_if_failed(self) -> None:
        """Raise the cluster's first failure (once it is raised, ``shutdown`` does not raise it
        again), or :class:`ClusterClosedError` once closed."""
        if self.error is not None:
            self._error_delivered = True
            raise self.error
        if self.status is ClusterStatus.CLOSED:
            raise ClusterClosedError("the cluster is shut down")

    def check_running(self, what: str) -> None:
        """Raise unless the nodes run: the failure that stopped them, or ClusterClosedError."""
        if self.status is not ClusterStatus.RUNNING:
            self.raise_if_failed()
            raise ClusterClosedError(f"cannot {what}: the cluster is {self.status.value}")

    def expect_failure(self, within: float) -> None:
        """Something the nodes take part in failed: give a node's own failure ``within`` seconds
        to arrive (over the rendezvous it takes milliseconds) and raise it if it does."""
        self.wait_for(lambda: self.error is not None, Deadline.after(within))
        if self.error is not None:
            self.raise_if_failed()

    # -- engine jobs --------------------------------------------------------------------------
    def run_job(self, job, *, stop_if: Optional[Callable[[], bool]] = None,
                on_stop: Optional[Callable[[], None]] = None,
                node_error_grace: float = 3.0) -> Any:
        """The result of an engine job run while the nodes run.

        A node failure wins: the job is cancelled and the node's error raised. When
        ``stop_if()`` becomes true the job is cancelled and :class:`JobStopped` raised. When the
        job itself fails, a node that died is usually why: its error is raised (chained) if it
        arrives within ``node_error_grace`` seconds, else the job's own error. ``on_stop()`` is
        called before a stopped job is cancelled (to release tasks that wait on the nodes).
        """
        job.add_done_callback(self.notify)
        stopped = lambda: stop_if is not None and stop_if()  # noqa: E731
        self.wait_for(lambda: job.done() or stopped() or self.status is ClusterStatus.CLOSED,
                      Deadline.never())
        if self.error is not None or self.status is ClusterStatus.CLOSED:
            broken = job.exception() if job.done() else None
            job.cancel()
            if broken is not None and self.error is not None:
                self._error_delivered = True
                raise self.error from broken
            self.raise_if_failed()
        if stopped():
            if on_stop is not None:
                on_stop()
            job.cancel()
            job.join(30)
            raise JobStopped()
        exc = job.exception()
        if exc is None:
            return job.result()
        try:
            self.expect_failure(node_error_grace)
        except DuotfError as node_error:
            raise node_error from exc
        raise exc

    # -- the nodes, for the feed ----------------------------------------------------------------
    def feed_targets(self) -> List[FeedTarget]:
        """The chief and workers, in feed rank order, with their feed addresses."""
        targets = [n for n in self.nodes if n.role.job in (Job.CHIEF, Job.WORKER)]
        missing = [n.describe() for n in targets if n.feed_port is None]
        if missing:
            raise ClusterClosedError(f"no feed port known for {', '.join(missing)}")
        # registered nodes: each host is known, and each feed port (checked above)
        return [FeedTarget(n.node_id, n.describe(), (cast(str, n.host), cast(int, n.feed_port)))
                for n in targets]

    def feed_terminated(self) -> bool:
        """True once a node called ``feed.terminate()``."""
        return any(n.feed_terminated for n in self.nodes)

    def feed_failure(self) -> Optional[Tuple[str, dict]]:
        """``(node label, report)`` of the first node whose feed server saw a training range
        break after it delivered rows (``why``, ``epoch``, ``partition``, ``rows``), else None."""
        for node in self.nodes:
            if node.feed_failure is not None:
                return node.describe(), node.feed_failure
        return None

    def checkpoints(self) -> dict:
        """``{node id: {epoch: path}}``: the checkpoints each node reported so far."""
        with self._cond:
            return {n.node_id: dict(n.checkpoints) for n in self.nodes if n.checkpoints}

    def takes_no_feed(self, node_id: int) -> bool:
        """True when a node needs no more feed markers: its main ended or it terminated its feed."""
        node = self.nodes[node_id]
        return node.state in ENDED or node.feed_terminated

    def tensorboard(self, node_id: int, deadline: Deadline) -> Optional[dict]:
        """What node ``node_id`` reported of the TensorBoard it started: ``{"url": ...}`` or
        ``{"error": why}``; waits until ``deadline`` for the report,
        less when the cluster fails or closes; None when there is none by then."""
        node = self.nodes[node_id]
        self.wait_for(lambda: node.tensorboard is not None or self.status is ClusterStatus.CLOSED
                      or node.state in TERMINAL, deadline)
        return node.tensorboard

    # -- messages from the nodes -------------------------------------------------------------
    def send(self, node: NodeInfo, type_: Msg, **fields) -> None:
        """Send a message to a node's agent; a node already gone is skipped (its end is known
        by its connection)."""
        if node.peer is None:
            return
        try:
            node.peer.send({"type": type_, **fields})
        except OSError as exc:
            logger.debug("could not send %s to %s: %s", type_.value, node.describe(), exc)

    def _on_message(self, peer, message: dict) -> None:
        kind = Msg(message["type"])  # the channel closes a connection that sends another type
        node_id = message.get("node_id")
        if not isinstance(node_id, int) or not 0 <= node_id < len(self.nodes):
            logger.warning("duotf: message for unknown node %r ignored", node_id)
            return
        node = self.nodes[node_id]
        failure = None
        if kind is Msg.LOG:
            # Not under the lock: the lines go to files and handlers; this connection's thread
            # is the only one that waits for them.
            if getattr(peer, "node_id", None) == node_id and self.logs is not None:
                node.last_seen = time.monotonic()
                lines = message.get("lines")
                if isinstance(lines, list):
                    self.logs.add(node_id, [str(x) for x in lines], int(message.get("dropped") or 0))
            return
        if kind is Msg.REPORT:
            # Not under the lock either: the reports are stored and handed to the callbacks'
            # own thread; nothing here waits for a user callback.
            if getattr(peer, "node_id", None) == node_id and self.metrics is not None:
                node.last_seen = time.monotonic()
                reports = message.get("reports")
                if isinstance(reports, list):
                    self.metrics.add(node_id, reports, int(message.get("dropped") or 0))
            return
        if kind is Msg.HEARTBEAT:
            # Neither under the lock nor notified: only the watchdog reads last_seen, and it
            # wakes at its own deadline. Notifying would wake every waiter, each of which looks
            # at every node: a thousand nodes' heartbeats, a million looks a second.
            if getattr(peer, "node_id", None) == node_id:
                node.last_seen = time.monotonic()
            else:
                logger.warning("duotf: %s message from a connection of another node ignored", kind.value)
            return
        with self._cond:
            if kind is Msg.REGISTER:
                failure = self._register(node, peer, message)
            elif getattr(peer, "node_id", None) != node_id:
                logger.warning("duotf: %s message from a connection of another node ignored", kind.value)
                return
            else:
                node.last_seen = time.monotonic()
                if kind is Msg.FEED_TERMINATED:
                    node.feed_terminated = True
                elif kind is Msg.TENSORBOARD:
                    node.tensorboard = _tensorboard_report(node, message)
                elif kind is Msg.CHECKPOINT:
                    epoch, path = message.get("epoch"), message.get("path")
                    if isinstance(epoch, int) and (path is None or isinstance(path, str)):
                        node.checkpoints[epoch] = path
                elif kind is Msg.FEED_FAILED:
                    if node.feed_failure is None:
                        node.feed_failure = {k: message.get(k) for k in
                                             ("why", "epoch", "partition", "seq", "rows")}
                elif kind in REPORTED:
                    if node.state not in TERMINAL:
                        node.state = REPORTED[kind]
                    if (kind is Msg.RETURNED and self._first_return is None
                            and node.role.job in _COLLECTIVE):
                        self._first_return = node.last_seen
                    if kind is Msg.READY:
                        node.feed_port = message.get("feed_port")
                elif kind is Msg.FAILED:
                    node.state = NodeState.FAILED
                    failure = failures.node_failure(node, message, self.spec.protocol,
                                                    self.output_tail(node.node_id))
            self._cond.notify_all()
        if failure is not None:
            self.fail(failure)
        elif kind in (Msg.RETURNED, Msg.DONE, Msg.SERVING):
            self._release_when_finished()

    def _register(self, node: NodeInfo, peer, message: dict) -> Optional[DuotfError]:
        if node.peer is None and self.status is ClusterStatus.STARTING:
            node.peer = peer
            peer.node_id = node.node_id
            node.host = message["host"]
            node.port = message["port"]
            node.pid = message["pid"]
            node.agent_pid = message.get("agent_pid")
            node.executor_id = message.get("executor_id", "")
            node.gpus = tuple(message.get("gpus") or ())
            node.state = NodeState.REGISTERED
            node.last_seen = time.monotonic()
            return None
        again = node.peer is not None
        reason = (f"{node.describe()} registered a second time (attempt {message.get('attempt')}); "
                  "the engine started it again" if again else f"the cluster is {self.status.value}")
        try:
            peer.send({"type": Msg.REJECT, "reason": reason})
        except OSError:
            pass
        if again and self.status in LIVE:
            return failures.registered_twice(node, reason)
        return None

    def _on_close(self, peer, exc) -> None:
        node_id = getattr(peer, "node_id", None)
        if node_id is None:
            return
        node = self.nodes[node_id]
        with self._cond:
            self._disconnected.add(node_id)
            lost = node.state not in TERMINAL and self.status in LIVE
            if lost:
                node.state = NodeState.FAILED
            self._cond.notify_all()
        if lost:
            self.fail(failures.lost_connection(node, exc, self.output_tail(node_id)))

    def output_tail(self, node_id: int) -> List[str]:
        """The last lines of a node's output that reached the driver (none when it sends none)."""
        return self.logs.tail(node_id) if self.logs is not None else []

    def _release_when_finished(self) -> None:
        """Once every non-serving node has returned, the returned ones may exit together and
        serving nodes (ps) have nothing left to serve."""
        with self._cond:
            servers = [x for x in self.nodes if x.is_server]
            others = [x for x in self.nodes if not x.is_server]
            if not all(x.state in ENDED for x in others):
                return
            # Each once: every later RETURNED or DONE finds them all ended again, and sending
            # again to each would be n * n messages. (A node with no connection yet is sent
            # nothing, and so is not counted as sent.)
            servers = [x for x in servers if x.state not in TERMINAL and x.peer is not None
                       and x.node_id not in self._released]
            waiting = [x for x in others if x.state is NodeState.RETURNED and x.peer is not None
                       and x.node_id not in self._released]
            self._released.update(x.node_id for x in servers + waiting)
        for node in waiting:
            self.send(node, Msg.RELEASE)
        for node in servers:
            self.send(node, Msg.STOP, timeout=self.stop_timeout)

    # -- the nodes' engine job and the watchdog ------------------------------------------------
    def node_outcomes(self) -> Optional[list]:
        """Every node function's :class:`~duotf._node.agent.NodeOutcome` once the engine job running
        them has ended without an error of its own; None before (or after such an error)."""
        gang = self._gang
        if gang is None or not gang.done() or gang.exception() is not None:
            return None
        return gang.result()


    def watch(self, gang) -> None:
        """Supervise the engine job running the nodes: its end, and every node's heartbeats."""
        self._gang = gang
        gang.add_done_callback(self.notify)
        stalled_after = self.stalled_after
        watchdog = Watchdog(self._cond, self.nodes, lambda: self.status, gang, self.heartbeat_timeout,
                            on_stale=self._give_up, on_job_failed=self._job_failed,
                            on_job_ended=self._finish,
                            stall_due=lambda: (None if self._first_return is None
                                               else self._first_return + stalled_after),
                            on_stall=self._note_stalled,
                            clock=self._route.clock if self._route is not None else time.monotonic)
        self._threads.append(watchdog.start())

    def _note_stalled(self) -> None:
        """``stalled_after`` seconds after a chief or worker returned: name those still running.
        A node blocked in a collective (``model.evaluate`` or another ``tf.distribute`` call
        made on the chief alone) waits for peers that have returned, silently and for ever."""
        with self._cond:
            if self.status not in LIVE:
                return
            nodes = [x for x in self.nodes if x.role.job in _COLLECTIVE]
            running = [x.describe() for x in nodes if x.state not in ENDED and not x.is_server]
            returned = [x.describe() for x in nodes if x.state in ENDED]
        if running and returned:
            logger.warning(
                "duotf: %s still running %g s after %s returned. If %s blocked in a "
                "collective (model.fit, model.evaluate or another tf.distribute call under "
                "MultiWorkerMirroredStrategy) that only some workers made, it waits for ever: "
                "make the same calls on every worker, or end them on every worker together",
                ", ".join(running), self.stalled_after, ", ".join(returned),
                "it is" if len(running) == 1 else "they are")

    def _give_up(self, node: NodeInfo) -> None:
        """The watchdog found ``node`` silent for ``heartbeat_timeout``: the cluster fails."""
        with self._cond:
            node.state = NodeState.FAILED
            self._cond.notify_all()
        self.fail(failures.unresponsive(node, self.heartbeat_timeout))
        # Given up: an agent that wakes up finds its connection closed and ends. Its node
        # process ends itself when its agent falls silent; on this host the driver need not
        # count on that (a node stuck in C code holding its interpreter runs no watchdog).
        if node.peer is not None:
            node.peer.close()
        if self.job_id and node.pid and node.host in ("127.0.0.1", self._driver_host):
            if kill_node_process(node.pid, self.job_id, node.node_id):
                logger.info("duotf: killed %s", node.describe())

    def _job_failed(self, gang_exc: BaseException) -> None:
        # A node that died is usually why the engine job failed: its own error (over the
        # rendezvous it takes milliseconds) says more than the engine's.
        self.wait_for(lambda: False, Deadline.after(1.0))
        err = BackendError(f"the {self.backend_name} job running the nodes failed: "
                           f"{type(gang_exc).__name__}: {gang_exc}")
        err.__cause__ = gang_exc
        self.fail(err)

    def _finish(self) -> None:
        # The agents report each node's end before their engine tasks return: give those
        # messages, already on their way, a moment to arrive. A node marked failed has its
        # failure on the way too (the thread that marked it records it just after, outside the
        # lock): it is waited for, never taken for a finished cluster.
        self.wait_for(lambda: self.status not in LIVE or all(
            x.state in TERMINAL and x.state is not NodeState.FAILED for x in self.nodes),
            Deadline.after(5))
        with self._cond:
            if self.status not in LIVE or any(x.state is NodeState.FAILED for x in self.nodes):
                return
            pending = [x.describe() for x in self.nodes if x.state not in TERMINAL]
            if not pending:
                self.status = ClusterStatus.FINISHED
                self._cond.notify_all()
        if pending:
            self.fail(BackendError(
                f"the {self.backend_name} job ended while nodes had not: {', '.join(pending)}"))
        else:
            self._close_server()  # every node has ended: nothing more to hear from them

    def behind(self, work: Callable[[], None], name: str) -> None:
        """Run ``work`` in a thread of its own, which :meth:`close` joins (a failure's
        clean-up that the error need not wait for); what it raises is logged."""
        def run():
            try:
                work()
            except Exception:
                logger.warning("duotf: %s failed", name, exc_info=True)

        thread = threading.Thread(target=run, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    # -- failure and stopping ---------------------------------------------------------------------
    def fail(self, error: DuotfError) -> None:
        """Record the cluster's first failure and stop every node (in the background). The
        rendezvous port is closed before the failure is recorded: nobody may join a failed
        cluster, and its port is released by the time its error is raised."""
        if self.status is not ClusterStatus.CLOSED:
            self.server.stop_accepting()
        with self._cond:
            if self.error is not None or self.status in (ClusterStatus.CLOSED, ClusterStatus.STOPPING):
                return
            self.error = error
            self.failed_at = time.monotonic()
            self.status = ClusterStatus.FAILED
            self._cond.notify_all()
        # a main that raised because the driver ended its feed: the driver raises the feed's own
        # error (or restarts on it), which says more; this is its echo
        echo = (getattr(error, "remote_type", None) == "FeedError"
                and "raised FeedError: the driver ended the feed" in str(error).splitlines()[0])
        logger.log(logging.INFO if echo else self._failure_level, "duotf: %s", str(error).splitlines()[0])
        thread = threading.Thread(target=self.stop_nodes, args=(self.failure_stop_timeout,),
                                  name="duotf-stopper", daemon=True)
        self._threads.append(thread)
        thread.start()

    def begin_shutdown(self, grace_secs: float) -> List[NodeInfo]:
        """Give every main up to ``grace_secs`` to return, then mark the cluster as stopping;
        return the nodes whose main had to be cut off."""
        deadline = Deadline.after(grace_secs)

        def settled():
            return self.status is not ClusterStatus.RUNNING or all(
                x.state in ENDED or x.is_server for x in self.nodes)

        self.wait_for(settled, deadline)
        with self._cond:
            cut_off = []
            if self.status is ClusterStatus.RUNNING:
                cut_off = [x for x in self.nodes if x.state not in ENDED and not x.is_server
                           and x.state is not NodeState.PENDING]
            if self.status in LIVE:
                self.status = ClusterStatus.STOPPING
            self._cond.notify_all()
        return cut_off

    def _agents_gone(self) -> bool:
        """Every node has ended and every agent's connection is closed (an agent closes it on
        its way out; a lost one's closed when it died or was given up): nothing more is to
        come from the engine's tasks but their return."""
        return all(x.state in TERMINAL and x.node_id in self._disconnected for x in self.nodes)

    def stop_nodes(self, timeout: Optional[float] = None) -> None:
        """The one stop sequence (failure and shutdown): ask every node to stop, give the
        engine job ``stop_timeout`` (+5 s) to end, cancel it, and close the rendezvous server.
        Idempotent; returns when done.

        After a failure the wait ends early once every agent is gone (:meth:`_agents_gone`):
        the tasks get a moment to return, and a task that cannot (its worker died, its
        executor is stopped) is cancelled instead of waited for."""
        timeout = self.stop_timeout if timeout is None else timeout
        for node in self.nodes:
            if node.state not in TERMINAL:
                self.send(node, Msg.STOP, timeout=timeout)
        gang = self._gang
        if gang is not None:
            self.wait_for(lambda: gang.done() or (self.error is not None and self._agents_gone()),
                          Deadline.after(timeout + 5), failure_ends=False)
            given_up = not gang.done() and self.error is not None and self._agents_gone()
            if given_up:
                # A failed cluster: tasks whose agents returned end within milliseconds, and
                # nothing is to be kept from them; a lost node's task may never end.
                gang.join(0.2)
            if not gang.done():
                logger.warning("duotf: engine tasks still running after stop; cancelling them")
            gang.cancel()
            # An engine that cannot cancel a running task (a stopped process's) is not waited
            # for long: every agent is gone, and a stalled one ends by itself when it resumes.
            gang.join(1 if given_up else 5)
        # A failed cluster releases its port and threads by itself, shut down or not.
        self._close_server()

    def close(self) -> Optional[DuotfError]:
        """After :meth:`stop_nodes`: join the supervisor's threads and mark the cluster closed.
        Returns a failure that nobody has raised yet."""
        for thread in list(self._threads):
            if thread is not threading.current_thread():
                thread.join(self.stop_timeout + 10)
        with self._cond:
            self.status = ClusterStatus.CLOSED
            self._cond.notify_all()
        self._close_server()
        if self.error is not None and not self._error_delivered:
            self._error_delivered = True
            return self.error
        return None

    # -- start --------------------------------------------------------------------------------
    def await_nodes(self, reached: Callable[[NodeState], bool], deadline: Deadline, what: str) -> None:
        """Wait until every node's state is ``reached``; raise the cluster's failure, or at
        ``deadline`` a :class:`ReservationTimeoutError` that names the nodes missing."""
        def all_reached():
            return all(reached(x.state) for x in self.nodes)

        arrived = self.wait_for(all_reached, deadline.sooner(WAIT_NOTE_AFTER))
        if not arrived and not deadline.expired:
            # Slots or registrations are slow (a busy engine, executors still starting): say
            # so once, then keep waiting until the deadline.
            with self._cond:
                missing = [x for x in self.nodes if not reached(x.state)]
                pending = sum(1 for x in missing if x.state is NodeState.PENDING)
            why = (f"{pending} not registered yet: the {self.backend_name} backend has not "
                   "started their tasks (no free slots?), or they cannot reach the driver"
                   if pending else "every node registered; their processes are starting")
            logger.info("duotf: waiting for %d of %d nodes to be %s (%s); giving up %.0f s from "
                        "now (reservation_timeout=%g)", len(missing), len(self.nodes), what, why,
                        deadline.remaining, self.reservation_timeout)
            arrived = self.wait_for(all_reached, deadline)
        self.raise_if_failed()
        if not arrived:
            self.fail(failures.reservation_error(self.nodes, what, self.reservation_timeout,
                                                 self.backend_name, self.server.address))
            self.raise_if_failed()

    def mark_running(self) -> None:
        with self._cond:
            if self.status is ClusterStatus.STARTING:
                self.status = ClusterStatus.RUNNING
            self._cond.notify_all()
