"""The errors of a cluster's nodes, worded once: what the supervisor records when a node fails.

Each function builds the error (it raises nothing); :class:`~duotf._driver.supervisor.Supervisor`
decides when a node has failed and records what is built here. Every message names the node
(role, host, pid) and, where one helps, the setting to change.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

from duotf._driver.nodes import NodeInfo, NodeState
from duotf.errors import (DuotfError, NodeFailedError, NodeUnresponsiveError, ReservationTimeoutError,
                          UnsupportedProtocolError)

__all__ = ["show_tail", "node_failure", "lost_connection", "unresponsive", "registered_twice",
           "reservation_error"]


def show_tail(tail: List[str]) -> str:
    """The last lines of a node's output, as an error message ends with them ("" for none)."""
    if not tail:
        return ""
    return f"\n\nLast {len(tail)} lines of its output:\n" + "\n".join(tail)


def _where(node: NodeInfo) -> dict:
    return dict(node_id=node.node_id, role=str(node.role), host=node.host, pid=node.pid)


def node_failure(node: NodeInfo, message: dict, protocol: str, tail: List[str]) -> DuotfError:
    """The error of a node whose agent reported it failed (a ``FAILED`` message): a protocol
    its TensorFlow lacks, a node that stopped responding, or a main that raised or exited."""
    kind = message.get("kind")
    attrs = _where(node)
    text = message.get("message", "")
    if kind == "protocol":
        version = message.get("tf_version", "?")
        return UnsupportedProtocolError(
            f"protocol={protocol!r} is not available in TensorFlow {version} on "
            f"{node.host} ({text}). No user code was run. Use protocol='grpc'; for RDMA between "
            "GPUs use NCCL collectives with MultiWorkerMirroredStrategy(communication_options="
            "tf.distribute.experimental.CommunicationOptions(implementation="
            "tf.distribute.experimental.CommunicationImplementation.NCCL)), or install a "
            f"TensorFlow build that registers the {protocol!r} server.",
            protocol=protocol, tf_version=version, host=node.host,
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
        msg + "\nEvery other node was stopped." + show_tail(tail),
        exitcode=exitcode, remote_type=remote_type, remote_traceback=remote_tb,
        output_tail=tail, **attrs,
    )


def lost_connection(node: NodeInfo, exc, tail: List[str]) -> NodeFailedError:
    """The error of a node whose agent's connection closed before the node ended."""
    return NodeFailedError(
        f"lost the connection to {node.describe()}: its engine task or executor died "
        f"({exc}). Every other node was stopped." + show_tail(tail),
        exitcode=None, remote_type=None, remote_traceback=None, output_tail=tail, **_where(node),
    )


def unresponsive(node: NodeInfo, heartbeat_timeout: float) -> NodeUnresponsiveError:
    """The error of a node that sent no heartbeat for ``heartbeat_timeout`` seconds."""
    return NodeUnresponsiveError(
        f"{node.describe()} sent no heartbeat for more than heartbeat_timeout="
        f"{heartbeat_timeout:g} s (its executor may be lost or stalled). "
        "Every other node was stopped.",
        **_where(node),
    )


def registered_twice(node: NodeInfo, reason: str) -> NodeFailedError:
    """The error of a node that registered again while the cluster ran (``reason`` says how)."""
    return NodeFailedError(
        f"{reason}. duotf never runs two copies of a node; the cluster was stopped.",
        exitcode=None, remote_type=None, remote_traceback=None, output_tail=[], **_where(node),
    )


def reservation_error(nodes: Sequence[NodeInfo], what: str, timeout: float, backend_name: str,
                      address: Tuple[str, int]) -> ReservationTimeoutError:
    """The error of a start in which not every node registered and became ``what`` within
    ``timeout`` (``reservation_timeout``): it names the nodes missing and what to check."""
    expected = len(nodes)
    registered = [x for x in nodes if x.state is not NodeState.PENDING]
    missing = [x for x in nodes if x.state is NodeState.PENDING]
    not_ready = [x for x in nodes if x.state is NodeState.REGISTERED]
    lines = [
        f"only {len(registered)}/{expected} nodes registered"
        + (f" and {expected - len(not_ready) - len(missing)}/{expected} became {what}" if not missing else "")
        + f" within reservation_timeout={timeout:g} s."
    ]
    if missing:
        lines.append("Missing: " + ", ".join(x.describe() for x in missing) + ".")
    if not_ready:
        lines.append("Registered but not ready: " + ", ".join(x.describe() for x in not_ready) + ".")
    host, port = address
    lines.append(
        f"Check that the {backend_name} backend can run {expected} tasks at once, that "
        f"executors can reach the driver at {host}:{port} (driver_host=...), and raise "
        "reservation_timeout=... if nodes are just slow to start."
    )
    return ReservationTimeoutError(
        " ".join(lines), registered=len(registered), expected=expected,
        missing=[x.node_id for x in missing + not_ready], timeout=timeout,
    )
