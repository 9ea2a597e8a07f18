"""The node table's types: a cluster's and a node's states, what the driver knows of a node.

:class:`~duotf._driver.supervisor.Supervisor` keeps one :class:`NodeInfo` per node and moves
their states; everything here is the vocabulary it (and ``cluster.nodes``) speaks, plus
:func:`kill_node_process`, the one way the driver ends a node process itself.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import signal
from typing import Any, Optional, Tuple

from duotf._names import public
from duotf._transport.rendezvous import Msg
from duotf.spec import Job, Role

__all__ = ["ClusterStatus", "NodeState", "NodeInfo", "FeedTarget", "LIVE", "TERMINAL", "ENDED",
           "REPORTED", "kill_node_process", "still_running"]


@public("duotf")
class ClusterStatus(str, enum.Enum):
    """A cluster's state: ``starting``, ``running``, then ``finished``, ``failed`` or
    ``stopping`` (shutdown), and at last ``closed``."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"  # shutdown is stopping the nodes: a connection closing is no failure
    FINISHED = "finished"  # every node ended on its own (mains returned, servers stopped)
    FAILED = "failed"
    CLOSED = "closed"


#: the states in which the nodes start or run (the watchdog watches, a failure counts)
LIVE = (ClusterStatus.STARTING, ClusterStatus.RUNNING)


@public("duotf")
class NodeState(str, enum.Enum):
    """A node's state as the driver sees it: ``pending -> registered -> ready -> running |
    serving -> returned -> done``, or ``failed`` / ``stopped`` from any state."""

    PENDING = "pending"
    REGISTERED = "registered"
    READY = "ready"
    RUNNING = "running"
    SERVING = "serving"
    RETURNED = "returned"  # main returned; the process waits to be released with its peers
    DONE = "done"
    FAILED = "failed"
    STOPPED = "stopped"


#: states a node never leaves
TERMINAL = frozenset({NodeState.DONE, NodeState.FAILED, NodeState.STOPPED})
#: states in which a node's main has ended
ENDED = TERMINAL | {NodeState.RETURNED}
#: the node states that a node reports by a message of the same name
REPORTED = {Msg.READY: NodeState.READY, Msg.RUNNING: NodeState.RUNNING,
             Msg.SERVING: NodeState.SERVING, Msg.RETURNED: NodeState.RETURNED,
             Msg.DONE: NodeState.DONE, Msg.STOPPED: NodeState.STOPPED}


@public("duotf")
@dataclasses.dataclass
class NodeInfo:
    """One node as the driver sees it (``cluster.nodes``)."""

    node_id: int
    role: Role
    host: Optional[str] = None
    port: Optional[int] = None
    pid: Optional[int] = None
    #: the process running the node's engine task (its agent): a Spark Python worker, a Dask
    #: worker, the driver itself on the local backend
    agent_pid: Optional[int] = None
    executor_id: str = ""
    #: the GPUs the engine holds for the node, as its CUDA_VISIBLE_DEVICES names them
    gpus: Tuple[str, ...] = ()
    feed_port: Optional[int] = None
    feed_terminated: bool = False
    feed_failure: Optional[dict] = None  # what the node's feed server reported (FEED_FAILED)
    tensorboard: Optional[dict] = None  # its TensorBoard's report: {"url": ...} or {"error": why}
    checkpoints: dict = dataclasses.field(default_factory=dict)  # ctx.report_checkpoint: {epoch: path}
    state: NodeState = NodeState.PENDING
    last_seen: float = 0.0
    peer: Any = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def is_server(self) -> bool:
        """ps nodes serve from the start; other nodes once they called ``ctx.serve()``."""
        return self.role.job is Job.PS or self.state is NodeState.SERVING

    def describe(self) -> str:
        where = f" on {self.host}" if self.host else ""
        pid = f", pid {self.pid}" if self.pid else ""
        return f"{self.role}{where} (node {self.node_id}{pid})"


@dataclasses.dataclass(frozen=True)
class FeedTarget:
    """A node that the engine feed sends rows to (a chief or worker), by feed rank."""

    node_id: int
    label: str
    address: Tuple[str, int]


def kill_node_process(pid: int, job_id: str, node_id: int) -> bool:
    """SIGKILL the process group of node ``node_id`` of job ``job_id`` if ``pid``, on this
    host, is that node's process: its environment carries the tags its agent gave it
    (``DUOTF_JOB_ID``, ``DUOTF_NODE_ID``), so a pid reused by another process is left alone.
    The pid is pinned by a pidfd while it is checked. True when the signal was sent."""
    pidfd = None
    try:
        if hasattr(os, "pidfd_open"):
            pidfd = os.pidfd_open(pid)  # from here the number cannot name another process
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
        if (env.get(b"DUOTF_JOB_ID") != job_id.encode()
                or env.get(b"DUOTF_NODE_ID") != str(node_id).encode()):
            return False
        if os.getpgid(pid) == pid:  # its own session, as the agent starts it
            os.killpg(pid, signal.SIGKILL)
        elif pidfd is not None:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
        return True
    except OSError:  # gone already, another user's, or no /proc here
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)


def still_running(nodes, timeout: float) -> str:
    """What ``cluster.wait()`` says at its timeout: the nodes whose main has not ended (a node
    that returned only waits to be released with its peers), and why that may be."""
    running = [x.describe() for x in nodes if x.state not in ENDED]
    returned = sum(1 for x in nodes if x.state is NodeState.RETURNED)
    text = f"after {timeout:g} s these nodes still run: {', '.join(running)}"
    if returned:
        text += (f" ({returned} other node{'s' if returned > 1 else ''} returned: a node blocked "
                 "in a collective, such as model.evaluate or another tf.distribute call, that "
                 "not every worker made waits for ever; make it on every worker)")
    return text
