"""The node agent: what runs inside the engine's task (a Spark barrier task, a Dask task, a thread).

For one node it reserves the TF port, spawns the node process (:mod:`duotf._node.child`), registers
with the driver over the authenticated channel, relays the cluster spec, heartbeats both ways,
and reports how the node ended. It returns only when its node process is gone.

The agent never raises for a failure of the node itself (the driver already knows, through the
channel): an engine that retries failed tasks (Spark retries barrier stages) must not start a
node again behind the driver's back.
"""

from __future__ import annotations

import dataclasses
import enum
import errno
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from typing import Dict, List, Optional, Sequence, Tuple, Union

from duotf._transport import ports, rendezvous
from duotf._node import warm
from duotf._node.gpus import visible_devices
from duotf._node.output import OutputRelay, tf_noise
from duotf.errors import ConfigError
from duotf._transport.rendezvous import Msg
from duotf._transport.tls import Material

logger = logging.getLogger("duotf.node")  # the agent's records, beside its output


class ChildMsg(str, enum.Enum):
    """What the agent and its node process (:mod:`duotf._node.child`) say on their pipe: tuples
    ``(kind, payload...)``, pickled (the pipe joins a process to its own child, never a host to
    another)."""

    # agent -> node process
    INIT = "init"  # the job, a ChildJob: payload, protocol, secret, heartbeat_interval, ...
    START = "start"  # the driver's start message: this node's role and the cluster's TF_CONFIG
    RELEASE = "release"  # every main returned: a node whose main returned may exit
    PING = "ping"  # every heartbeat_interval: the agent lives; silence for heartbeat_timeout
    #                ends the node process (its agent is lost or stalled)
    # node process -> agent
    HEARTBEAT = "hb"
    READY = "ready"  # {"feed_port": ...}: TensorFlow serves the protocol, the job loaded
    RUNNING = "running"
    SERVING = "serving"
    FEED_TERMINATED = "feed_terminated"
    FEED_FAILED = "feed_failed"  # {"why", "epoch", "partition", "seq", "rows"}
    TENSORBOARD = "tensorboard"  # {"port": n} once the TensorBoard it started serves, or {"error"}
    REPORT = "report"  # {"reports": [...], "dropped": n}: what main gave ctx.report (duotf._node.reports)
    CHECKPOINT = "checkpoint"  # {"epoch": n, "path": p}: what main gave ctx.report_checkpoint
    RESULT = "result"  # main's return value, cloudpickled
    ERROR = "error"  # {"kind", "remote_type", "message", "traceback", ...}

    def __str__(self) -> str:
        return self.value


class ChildExit(enum.IntEnum):
    """The exit codes of a node process (:mod:`duotf._node.child`). Each but ``OK`` follows a
    ``ChildMsg.ERROR`` that says why when there was a way to say it; the agent reports that
    error rather than the code, which ``main`` may also use (``os._exit(3)``)."""

    OK = 0  # main returned and the node was released, or a ps node's server was stopped
    FAILED = 1  # main raised or exited non-zero, its result did not pickle, or its agent is gone
    PROTOCOL = 3  # TensorFlow cannot serve the cluster's protocol
    LOAD = 4  # the job (main and args) does not unpickle in the node process
    GPUS = 5  # the engine's GPU addresses name no device this task sees


#: the fields of :class:`ChildJob` the agent passes on from the driver's :class:`NodeJob` as they are
_FROM_NODE_JOB = ("payload", "protocol", "heartbeat_interval", "heartbeat_timeout", "job_id",
                  "default_fs", "secret", "tls", "log_dir", "resume_epoch", "checkpoint_dir",
                  "keep_workdir", "owns_log_dir")


@dataclasses.dataclass(frozen=True)
class ChildJob:
    """What the agent tells its node process first (``ChildMsg.INIT``): the job, and this node's
    part of it. Pickled over the pipe (a process to its own child)."""

    payload: bytes  # (main, args) and its source (duotf._node.job): unpickled only by the node process
    protocol: str
    heartbeat_interval: float
    heartbeat_timeout: float  # 0 or None: the node process keeps no watch on its agent
    node_id: int
    job_id: str
    working_dir: str
    default_fs: str
    secret: bytes  # the job's: the node's feed server checks its feeders with it
    tls: Optional[Material] = None  # the job's, where its feed is encrypted
    executor_id: str = ""
    output_captured: bool = False  # fd 1 is a pipe to the agent (see duotf._node.output)
    gpus: List[str] = dataclasses.field(default_factory=list)  # CUDA_VISIBLE_DEVICES entries
    gpu_error: Optional[str] = None  # why the engine's GPU addresses could not be used
    log_dir: str = ""
    tensorboard: bool = False  # this node process starts TensorBoard on ``log_dir``
    attempt: int = 0
    resume_epoch: int = 0
    checkpoint_dir: str = ""
    checkpoint: Optional[str] = None  # the checkpoint this node restores
    make_checkpoint_dir: bool = False  # the user's checkpoint_dir: made on the node's host
    #: as NodeJob's: a node process that outlives its agent removes its working directory (and
    #: the job's folder, ``log_dir`` with it where duotf owns it) unless ``keep_workdir``
    keep_workdir: bool = False
    owns_log_dir: bool = False


# What the node process says that the agent passes on to the driver as it is.
_RELAYED = {
    ChildMsg.READY: Msg.READY,
    ChildMsg.RUNNING: Msg.RUNNING,
    ChildMsg.SERVING: Msg.SERVING,
    ChildMsg.FEED_TERMINATED: Msg.FEED_TERMINATED,
    ChildMsg.FEED_FAILED: Msg.FEED_FAILED,
    ChildMsg.TENSORBOARD: Msg.TENSORBOARD,
    ChildMsg.REPORT: Msg.REPORT,
    ChildMsg.CHECKPOINT: Msg.CHECKPOINT,
}


@dataclasses.dataclass(frozen=True)
class NodeJob:
    """Everything a node agent needs; shipped to the engine's tasks by the engine itself."""

    job_id: str
    driver_address: Tuple[str, int]
    secret: bytes
    payload: bytes  # (main, args) and its source (duotf._node.job); only the node process unpickles it
    protocol: str
    heartbeat_interval: float
    heartbeat_timeout: float
    connect_timeout: float
    env: Dict[str, str]
    default_fs: str
    workdir_root: str
    stop_timeout: float = 5.0
    keep_workdir: bool = False  # else each node's working directory goes with its process
    #: the nodes whose output (fd 1 and 2) goes to the driver; the others' goes where the
    #: engine task's own output goes
    log_nodes: frozenset = frozenset()
    #: every node's ``ctx.log_dir`` (a path or URL; '' for none)
    log_dir: str = ""
    #: ``log_dir`` is duotf's own (under ``workdir_root``): removed with the job's last node
    owns_log_dir: bool = False
    #: the node whose process starts TensorBoard on ``log_dir`` (-1: none)
    tensorboard_node: int = -1
    #: the cluster's attempt (0 first; ``max_restarts``), the epoch it resumes at, the job's
    #: checkpoint location, and the checkpoint each node restores (node id -> path)
    restart: int = 0
    resume_epoch: int = 0
    checkpoint_dir: str = ""
    checkpoints: Dict[int, Optional[str]] = dataclasses.field(default_factory=dict)
    #: ``checkpoint_dir`` is duotf's own, made and removed by the driver on its host; a
    #: ``checkpoint_dir`` the user gave is made by each node before its main runs
    owns_checkpoint_dir: bool = False
    #: the job's TLS material where its feed and control channel are encrypted
    #: (:mod:`duotf._transport.tls`), else None
    tls: Optional[Material] = None


class OutcomeStatus(str, enum.Enum):
    """How a node ended, as its engine task reports it (str-valued: it reads as its value)."""

    DONE = "done"  # main returned (its value is the outcome's payload)
    FAILED = "failed"  # main raised, or the node process exited or was killed
    STOPPED = "stopped"  # stopped by the driver (shutdown, a peer's failure) or with the agent
    REJECTED = "rejected"  # the driver turned the node away before it started (a late retry)


@dataclasses.dataclass(frozen=True)
class NodeOutcome:
    """What the engine's task returns for a node: its id and how it ended."""

    node_id: int
    status: OutcomeStatus
    payload: Optional[bytes] = None  # cloudpickled return value of main when status is DONE


def reserve_port(env: Optional[Dict[str, str]] = None) -> socket.socket:
    """Bind a port on every interface and keep it (in ``DUOTF_PORTS``, from ``env`` or this
    process's environment, where set: :func:`duotf._transport.ports.reserve`).

    The socket never listens, so it receives no connection, and it carries SO_REUSEADDR and
    SO_REUSEPORT so that TensorFlow's gRPC server (which sets both) can bind the same port while
    the agent still holds it. Any other program asking for the port is refused until it is let
    go, so the port cannot be stolen between reservation and use. The agent hands it to the node
    process it spawns and closes its own copy: the port is free when the node is gone, even
    while the agent's engine task is stalled.
    """
    return ports.reserve(what="a node's TensorFlow server", env=env)


class _Agent:
    def __init__(self, job: NodeJob, node_id: int, executor_id: str, attempt: int,
                 gpus: Sequence[str] = ()):
        self.job = job
        self.node_id = node_id
        self.executor_id = executor_id
        self.attempt = attempt
        self.gpu_addresses = [str(a) for a in gpus]
        self.gpus: List[str] = []  # the node's CUDA_VISIBLE_DEVICES entries
        self.events: "queue.Queue[tuple]" = queue.Queue()
        self.proc: Optional[Union[subprocess.Popen, warm.WarmProcess]] = None
        self.child_tx: Optional[Connection] = None
        self.channel: Optional[rendezvous.Channel] = None
        self.result: Optional[bytes] = None
        self.reported_failure = False
        self.stop_requested = False
        self.driver_lost = False  # the stop under way follows the driver's loss (see _driver_gone)
        self.stopper: Optional[threading.Thread] = None
        self.child_reader: Optional[threading.Thread] = None
        self.serving = False
        self.threads: list = []
        self.output: Optional[OutputRelay] = None
        self.env: Optional[Dict[str, str]] = None  # the node process's

    # -- plumbing -------------------------------------------------------------------------
    def _thread(self, target, name) -> threading.Thread:
        """Start ``target`` on a thread of this agent's, joined before :meth:`run` returns."""
        thread = threading.Thread(target=target, name=f"duotf-agent-{name}", daemon=True)
        thread.start()
        self.threads.append(thread)
        return thread

    def _read_child(self, rx: Connection) -> None:
        while True:
            try:
                message = rx.recv()
            except (EOFError, OSError):
                self.events.put(("child-eof",))
                return
            self.events.put(("child",) + tuple(message))

    def _read_driver(self) -> None:
        channel = self.channel
        assert channel is not None  # run() connects before it starts this thread
        while True:
            try:
                message = channel.recv()
            except rendezvous.ProtocolError as exc:
                logger.warning("node %d: closing the connection to the driver: %s", self.node_id, exc)
                self.events.put(("driver-eof", exc))
                return
            except (ConnectionError, OSError) as exc:
                self.events.put(("driver-eof", exc))
                return
            self.events.put(("driver", message))

    def _send(self, type_: Msg, **fields) -> None:
        assert self.channel is not None  # run() connects before anything is sent
        try:
            self.channel.send({"type": type_, "node_id": self.node_id, **fields})
        except OSError as exc:
            logger.debug("node %d: could not send %s to the driver: %s", self.node_id, type_, exc)

    def _send_output(self, lines, dropped: int) -> None:
        """The output relay's way to the driver (its sender thread; raises when it is gone)."""
        assert self.channel is not None  # run() connects before the node process starts
        self.channel.send({"type": Msg.LOG, "node_id": self.node_id, "lines": lines,
                           "dropped": dropped})

    def _drain_output(self, timeout: float) -> None:
        """Let the node's output written so far reach the driver before its end is reported
        (the node process has ended or is ending: its pipe closes)."""
        if self.output is not None and not self.output.drain(timeout):
            logger.debug("node %d: output still open after %.1f s", self.node_id, timeout)

    def _to_child(self, *message) -> None:
        assert self.child_tx is not None  # _spawn sets it before any message goes to the child
        try:
            self.child_tx.send(message)
        except OSError:
            pass  # the child is gone; its exit is reported through the child-eof path

    # -- lifecycle ------------------------------------------------------------------------
    def _spawn(self, reservation: socket.socket) -> None:
        job = self.job
        env = node_environment(job.env)
        env["DUOTF_NODE_ID"] = str(self.node_id)
        env["DUOTF_JOB_ID"] = job.job_id
        gpu_error = None
        if self.gpu_addresses:
            # The engine's addresses pick devices of what this task's process sees (the driver
            # refuses a CUDA_VISIBLE_DEVICES in job.env when the spec asks for GPUs).
            try:
                self.gpus = visible_devices(self.gpu_addresses, os.environ.get("CUDA_VISIBLE_DEVICES"))
                env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus)
            except ConfigError as exc:
                gpu_error = str(exc)  # the node process reports it, as it reports a bad protocol
                env["CUDA_VISIBLE_DEVICES"] = ""  # and, until it exits, sees no GPU
        captured = self.node_id in job.log_nodes
        self.env = env
        try_warm = True
        while True:
            a_rx, c_tx = os.pipe()  # child -> agent
            c_rx, a_tx = os.pipe()  # agent -> child
            out_r = out_w = None
            if captured:
                # One pipe as fd 1 and fd 2: the output of the process, its children and its C
                # code, in the order written (see duotf._node.output).
                out_r, out_w = os.pipe()
            try:
                # Forked by a warm server (TensorFlow imported already) where one serves this
                # environment, else spawned: see duotf._node.warm.
                if try_warm:
                    out = out_w if out_w is not None else 1
                    self.proc = warm.fork_node(env, [c_rx, c_tx, reservation.fileno(), out,
                                                     out_w if out_w is not None else 2], logger)
            except warm.Abandoned:  # its fds may live on in a late fork: new ones for the spawn
                for fd in (a_rx, c_tx, c_rx, a_tx, out_r, out_w):
                    if fd is not None:
                        os.close(fd)
                try_warm = False
                continue
            break
        try:
            if self.proc is None:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "duotf._node.child", str(c_rx), str(c_tx)],
                    # The child holds the port's reservation from here on (it never reads it):
                    # the port is free once the node process is gone, even while this agent is
                    # stalled.
                    pass_fds=(c_rx, c_tx, reservation.fileno()),
                    env=env,
                    close_fds=True,
                    start_new_session=True,
                    stdout=out_w,
                    stderr=out_w,
                )
        finally:
            if out_w is not None:
                os.close(out_w)
        os.close(c_rx)
        os.close(c_tx)
        if out_r is not None:  # captured
            self.output = OutputRelay(out_r, self._send_output, hide=tf_noise(env))
        self.child_tx = Connection(a_tx, readable=False, writable=True)
        workdir = node_workdir(job.workdir_root, self.node_id)
        same = {name: getattr(job, name) for name in _FROM_NODE_JOB}  # as the driver sent them
        self._to_child(ChildMsg.INIT, ChildJob(
            **same, node_id=self.node_id, working_dir=workdir, executor_id=self.executor_id,
            output_captured=captured, gpus=self.gpus, gpu_error=gpu_error,
            tensorboard=self.node_id == job.tensorboard_node, attempt=job.restart,
            checkpoint=job.checkpoints.get(self.node_id),
            make_checkpoint_dir=not job.owns_checkpoint_dir,
        ))
        self.child_reader = self._thread(
            lambda: self._read_child(Connection(a_rx, readable=True, writable=False)), "child")

    def _kill_child(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _stop_child(self, timeout: float) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; returns when the child has exited."""
        if self.proc is None:
            return
        self._kill_child(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            # expected where the driver went first (main blocked on a peer, or on the feed it
            # no longer has): said at the level that said the driver was gone
            (logger.info if self.driver_lost else logger.warning)(
                "node %d did not stop within %.1f s; killing it", self.node_id, timeout)
            self._kill_child(signal.SIGKILL)
            self.proc.wait()
        else:
            self._kill_child(signal.SIGKILL)  # anything left in its process group

    def _reap_group(self) -> None:
        """End what the node process left in its process group once it is gone (a
        subprocess of main's, TensorBoard after a crash): nothing outlives its node. The
        group's id names no other group while one of its processes lives."""
        if self.proc is not None and self.proc.poll() is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _driver_gone(self, exc: BaseException) -> None:
        """The driver is gone or closed the job: nothing may run unsupervised. The node ends
        through "child-eof" (reported as stopped; the driver hears no more). Cut off from it
        (what this agent sent went unacknowledged for the heartbeat timeout, or no route: a
        network partition), the node is killed at once: the driver has given up on it by now,
        and a restart may be starting its successor."""
        cut = isinstance(exc, OSError) and exc.errno in _CUT_OFF
        if not self.stop_requested:
            self.driver_lost = True
            logger.info("node %d: driver connection %s; stopping the node", self.node_id,
                        "lost (unacknowledged for heartbeat_timeout)" if cut else "closed")
        self._begin_stop(0 if cut else self.job.stop_timeout)

    def _begin_stop(self, timeout: float) -> None:
        """Stop the child on a thread of its own (once: a second SIGTERM would cut its
        clean-up short), so that this loop keeps pinging it while it winds down."""
        self.stop_requested = True
        if self.stopper is None:
            def stop():
                self._stop_child(timeout)
                # The child is gone. Its pipe's EOF normally says so first (after what the child
                # wrote last); should a process it left hold the pipe open, this says it instead.
                if self.child_reader is not None:
                    self.child_reader.join(2)
                self.events.put(("child-eof",))

            self.stopper = self._thread(stop, "stop")

    def run(self) -> NodeOutcome:
        job = self.job
        reservation = reserve_port({**os.environ, **job.env})
        port = reservation.getsockname()[1]
        try:
            self.channel = rendezvous.connect(job.driver_address, job.secret, job.connect_timeout, job.tls)
            _lose_silent_driver(self.channel.sock, job)
            # The address the driver reached us from is the one the other nodes can use too,
            # unless DUOTF_BIND picks the one this host listens on.
            host = (ports.bind_address({**os.environ, **job.env})
                    or self.channel.sock.getsockname()[0])
            self._spawn(reservation)
            assert self.proc is not None  # _spawn started it
            reservation.close()  # the node process's copy keeps the port (see _spawn)
            self._send(
                Msg.REGISTER,
                host=host,
                port=port,
                pid=self.proc.pid,
                agent_pid=os.getpid(),
                executor_id=self.executor_id,
                attempt=self.attempt,
                gpus=self.gpus,
            )
            self._thread(self._read_driver, "driver")
            return self._loop()
        finally:
            self._stop_child(1.0)
            self._reap_group()
            if self.channel is not None:
                self.channel.close()
            reservation.close()
            if not job.keep_workdir:
                remove_workdir(job.workdir_root, self.node_id,
                               job.log_dir if job.owns_log_dir else None)
            if self.child_tx is not None:
                self.child_tx.close()
            for thread in self.threads:
                thread.join(5)
            if self.output is not None:
                self.output.join(2)
            if isinstance(self.proc, warm.WarmProcess):
                self.proc.close()
            if self.env is not None:  # the next node of this environment starts warm
                warm.prepare(self.env, logger)

    def _fail(self, kind: str, **fields) -> None:
        if not self.reported_failure:
            self.reported_failure = True
            self._send(Msg.FAILED, kind=kind, **fields)

    def _loop(self) -> NodeOutcome:
        job = self.job
        interval = job.heartbeat_interval
        child_seen = time.monotonic()
        next_beat = 0.0
        child_open = True
        while True:
            now = time.monotonic()
            if now >= next_beat:
                self._send(Msg.HEARTBEAT)
                # Sent by this loop, not by a thread of its own: a ping says that the agent
                # still supervises its node. The node process ends itself when pings stop (the
                # engine task stalled: a stopped or swapped-out executor), so no node outlives
                # its supervision by more than heartbeat_timeout.
                if child_open:
                    self._to_child(ChildMsg.PING)
                next_beat = now + interval
            if child_open and now - child_seen > job.heartbeat_timeout and not self.stop_requested:
                self._fail(
                    "unresponsive",
                    message=f"no heartbeat from the node process for {now - child_seen:.1f} s "
                    f"(heartbeat_timeout={job.heartbeat_timeout:g})",
                )
                self._kill_child(signal.SIGKILL)
            try:
                event = self.events.get(timeout=min(interval, max(next_beat - now, 0.01)))
            except queue.Empty:
                continue
            kind = event[0]
            if kind == "child":
                child_seen = time.monotonic()
                what = event[1]
                if what is ChildMsg.HEARTBEAT:
                    continue
                if what in _RELAYED:
                    self.serving = self.serving or what is ChildMsg.SERVING
                    self._send(_RELAYED[what], **(event[2] if len(event) > 2 else {}))
                elif what is ChildMsg.RESULT:
                    self.result = event[2]
                    self._send(Msg.RETURNED)
                elif what is ChildMsg.ERROR:
                    if self.stop_requested:
                        # main unwinding from our own stop request: reported as "stopped"
                        logger.debug("node %d stopped: %s", self.node_id, event[2].get("message"))
                    else:
                        # The process exits right after saying this: its last output first.
                        self._drain_output(_OUTPUT_GRACE)
                        self._fail(**event[2])
            elif kind == "child-eof":
                if not child_open:
                    continue
                child_open = False
                assert self.proc is not None  # a child-eof comes from a started process
                code = self.proc.wait()
                self._drain_output(_OUTPUT_GRACE)
                if self.result is not None:  # main returned; how the process ended after is moot
                    self._send(Msg.DONE)
                    return NodeOutcome(self.node_id, OutcomeStatus.DONE, self.result)
                if self.stop_requested:
                    self._send(Msg.STOPPED, exitcode=code)
                    return NodeOutcome(self.node_id, OutcomeStatus.STOPPED)
                self._fail("exit", exitcode=code, message=_describe_exit(code))
                return NodeOutcome(self.node_id, OutcomeStatus.FAILED)
            elif kind == "driver":
                message = event[1]
                type_ = message["type"]
                if type_ == Msg.START:
                    self._to_child(ChildMsg.START, message)
                elif type_ == Msg.RELEASE:
                    self._to_child(ChildMsg.RELEASE)
                elif type_ == Msg.STOP:
                    self._begin_stop(message.get("timeout", job.stop_timeout))
                elif type_ == Msg.REJECT:
                    logger.warning("node %d rejected by the driver: %s", self.node_id, message.get("reason"))
                    return NodeOutcome(self.node_id, OutcomeStatus.REJECTED)
            elif kind == "driver-eof":
                self._driver_gone(event[1])


#: how a connection to a driver that this host can no longer reach fails: unacknowledged for
#: TCP_USER_TIMEOUT, or the route gone (the link down, as a partition is seen from its side)
_CUT_OFF = (errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH)


def _lose_silent_driver(sock: socket.socket, job: NodeJob) -> None:
    """Make the connection to the driver fail (ETIMEDOUT) once what this agent sent has gone
    unacknowledged for about ``heartbeat_timeout`` (Linux's ``TCP_USER_TIMEOUT``): a partition
    sends no FIN and no RST, and without it a node cut off from its driver would run on
    until TCP gave up, many minutes later. The agent sends a heartbeat every
    ``heartbeat_interval``, so one is in flight when the link goes: the timeout counts from then."""
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if not job.heartbeat_timeout or option is None:
        return
    after = max(job.heartbeat_timeout - job.heartbeat_interval, 1.0)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, option, int(after * 1000))
    except OSError as exc:  # not TCP (a test's socket pair), or a kernel without it
        logger.debug("TCP_USER_TIMEOUT not set: %s", exc)


#: seconds the agent waits for a node's last output before it reports the node's end (a process
#: the node left behind may hold the pipe open)
_OUTPUT_GRACE = 1.0


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"node process was killed by {name}"
    return f"node process exited with code {code} before main returned"


def node_environment(extra: Dict[str, str]) -> Dict[str, str]:
    """The environment of a node process started from this engine task, with ``extra`` (the
    job's ``env``) on top. :mod:`duotf._node.probe` starts its checks with the same one."""
    env = dict(os.environ)
    env.update(extra)
    # The user's own PYTHONPATH first, then what this task can import (duotf, user modules).
    env["PYTHONPATH"] = os.pathsep.join(
        [extra.get("PYTHONPATH", "")] + [p for p in sys.path if p]
    ).strip(os.pathsep)
    env.pop("TF_CONFIG", None)
    # TensorFlow's C++ start-up notes (INFO) are noise on every node; warnings still show.
    # A user who wants them sets TF_CPP_MIN_LOG_LEVEL=0 (env=... or the executor's own).
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    return env


def run_node(job: NodeJob, node_id: int, executor_id: str = "", attempt: int = 0,
             gpus: Sequence[str] = ()) -> NodeOutcome:
    """Run node ``node_id`` of ``job`` to its end. Called by every backend, once per node.

    ``gpus``: the addresses of the GPUs the engine holds for this node (see
    :mod:`duotf._node.gpus`); the node process sees only those devices. Empty: GPUs are left alone.
    """
    return _Agent(job, node_id, executor_id, attempt, gpus).run()


def default_workdir_root(job_id: str) -> str:
    # Not "<tmp>/duotf": that directory would shadow the package for a program run from <tmp>.
    return os.path.join(tempfile.gettempdir(), f"duotf-{job_id}")


def node_workdir(root: str, node_id: int) -> str:
    return os.path.join(root, f"node-{node_id}")


def default_log_dir(root: str) -> str:
    """``ctx.log_dir`` when the user names none: beside the nodes' working directories."""
    return os.path.join(root, "logs")


def job_dir_under(tensorboard_dir, job_id: str, name: str = "tensorboard_dir") -> str:
    """``<tensorboard_dir>/<job id>``, the job's folder in a directory the user named (``name``:
    which): a URL as given, a path made absolute on the driver (the nodes' current directory is
    their own)."""
    import posixpath

    where = os.fspath(tensorboard_dir) if isinstance(tensorboard_dir, (str, os.PathLike)) else None
    if not isinstance(where, str) or not where:
        readers = "TensorBoard read" if name == "tensorboard_dir" else "every attempt read"
        raise ConfigError(f"{name}={tensorboard_dir!r}: give a directory path or a URL "
                          f"(hdfs://..., gs://...) that every node can write and {readers}")
    if "://" in where:
        return posixpath.join(where, job_id)
    return os.path.join(os.path.abspath(where), job_id)


def remove_workdir(root: str, node_id: int, log_dir: Optional[str] = None) -> None:
    """Remove a node's working directory once its process is gone, and the job's directory
    (and ``log_dir``, duotf's own, inside it) with the last node's on this host (several nodes
    share it where they share a host)."""
    import glob
    import shutil

    shutil.rmtree(node_workdir(root, node_id), ignore_errors=True)
    if log_dir and not glob.glob(os.path.join(root, "node-*")):
        shutil.rmtree(log_dir, ignore_errors=True)
    try:
        os.rmdir(root)
    except OSError:
        pass  # another node's directory is still there, or it is gone already
