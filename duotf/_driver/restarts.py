"""Restarts from a checkpoint: which failures restart a cluster, and where it resumes.

``duotf.run(..., max_restarts=N)`` restarts the whole gang after a node fails, up to ``N``
times (as Ray Train's ``FailureConfig(max_failures=N)`` does); :class:`~duotf._driver.cluster.Cluster`
runs the restart. Here are the rules it follows, kept apart so they can be read (and tested)
on their own:

* :func:`failure_cause`: what kind of failure an error is (a :class:`Cause`: ``"killed"``,
  ``"exited"``, ``"lost"``, ``"hung"``, ``"exception"``), or None for a failure no restart can cure (a
  protocol TensorFlow lacks, nodes that never registered, bad data);
* :func:`lost_host`: the host of a node lost with its network (its driver cannot reach it),
  which the restarted nodes are kept off where the engine can (``Backend.avoid_hosts``);
* :func:`resume_point`: from the checkpoints the nodes reported with
  ``ctx.report_checkpoint(epoch, path)``, the epoch every node can resume at, and the
  checkpoint each node restores.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import socket
import threading
from typing import Dict, FrozenSet, Iterable, Optional, Set, Tuple, Type, Union

from duotf._deadline import Deadline
from duotf.errors import (BackendError, ConfigError, FeedError, InsufficientSlotsError, NodeFailedError,
                          NodeUnresponsiveError)

logger = logging.getLogger(__name__)

__all__ = ["CAUSES", "Cause", "DEFAULT_RESTART_ON", "REPLACEMENT_WAIT", "Restart", "RestartOn",
           "avoid_lost_host", "await_capacity", "check_restart_on", "failure_cause", "lost_host",
           "resume_point"]

#: one item of ``duotf.run(restart_on=...)``: a cause (``"killed"``, ...), or an exception class or
#: its name
RestartOn = Union[str, Type[BaseException]]

class Cause(str, enum.Enum):
    """What kind of failure a node's was (``restart_on`` names them by their values)."""

    KILLED = "killed"  # a signal ended the node process
    EXITED = "exited"  # the node process exited before main returned
    LOST = "lost"  # its engine task, executor or worker went away (or the engine job failed)
    HUNG = "hung"  # no heartbeat for heartbeat_timeout
    EXCEPTION = "exception"  # main raised

    # the plain value in str(), f-strings and log lines, on every Python
    __str__ = str.__str__
    __format__ = str.__format__  # type: ignore[assignment]  # as in duotf._enum


#: every cause of a node failure, as :attr:`Restart.cause` names it
CAUSES = tuple(Cause)
#: what restarts by default: a process or its host going away is bad luck; a Python exception
#: raised by ``main`` is usually a bug, which a restart would only repeat
DEFAULT_RESTART_ON: FrozenSet[Cause] = frozenset({Cause.KILLED, Cause.EXITED, Cause.LOST, Cause.HUNG})


@dataclasses.dataclass(frozen=True)
class Restart:
    """One failure that restarted the cluster (``cluster.restarts``)."""

    attempt: int  #: the attempt that failed (0: the first run)
    cause: Cause  #: what kind of failure it was
    node: Optional[str]  #: the role of the node that failed first ("worker:1"), if one did
    error: str  #: the first line of the error a run without restarts would have raised
    failed_at: float  #: ``time.time()`` when the failure reached the driver
    resume_epoch: int  #: the epoch the next attempt resumes at (0: from the start)
    #: seconds from the failure to every ``main`` of the next attempt running (None: it did not)
    seconds: Optional[float] = None


def check_restart_on(restart_on) -> Tuple[FrozenSet[Cause], Tuple[str, ...]]:
    """``restart_on`` as ``(causes, exception type names)``: an iterable of causes
    (:data:`CAUSES`) and exception classes or their names (a ``main`` that raised one of them
    restarts; matched by class name, as the node's error carries it)."""
    if restart_on is None:
        return DEFAULT_RESTART_ON, ()
    if isinstance(restart_on, (str, type)):
        restart_on = (restart_on,)
    causes, names = set(), []
    try:
        items = list(restart_on)
    except TypeError:
        items = [restart_on]
    for item in items:
        if isinstance(item, type) and issubclass(item, BaseException):
            names.append(item.__name__)
        elif isinstance(item, str) and item in CAUSES:
            causes.add(Cause(item))
        elif isinstance(item, str) and item.isidentifier() and item[:1].isupper():
            names.append(item)
        else:
            raise ConfigError(
                f"restart_on: {item!r} is neither a cause ({', '.join(CAUSES)}) nor an exception "
                "class (or its name, e.g. 'ResourceExhaustedError')")
    return frozenset(causes), tuple(names)


def failure_cause(error: BaseException) -> Optional[Cause]:
    """The cause of a cluster's failure, or None where a restart cannot help."""
    if isinstance(error, NodeUnresponsiveError):
        return Cause.HUNG
    if isinstance(error, NodeFailedError):
        if getattr(error, "remote_traceback", None) and getattr(error, "remote_type", None):
            return Cause.EXCEPTION
        code = getattr(error, "exitcode", None)
        if isinstance(code, int):
            return Cause.KILLED if code < 0 else Cause.EXITED
        return Cause.LOST  # its engine task, executor or worker went away with it
    if isinstance(error, BackendError):
        return Cause.LOST  # the engine job running the nodes failed
    if isinstance(error, FeedError) and error.lost:
        return Cause.LOST  # the engine lost a feeding task's process mid-range
    return None


def restartable(error: BaseException, causes: FrozenSet[Cause], names: Tuple[str, ...]) -> bool:
    """Whether ``error`` restarts a cluster run with ``restart_on`` (as :func:`check_restart_on`
    gives it: its causes and exception names)."""
    cause = failure_cause(error)
    if cause is None:
        return False
    if cause is Cause.EXCEPTION and names and getattr(error, "remote_type", None) in names:
        return True
    return cause in causes


def resume_point(reports: Dict[int, Dict[int, Optional[str]]], nodes: Iterable[int]
                 ) -> Tuple[int, Dict[int, Optional[str]]]:
    """``(epoch, {node id: checkpoint path})``: where the next attempt resumes.

    ``reports`` holds, by node id, the checkpoints each node reported (``{epoch: path}``).
    The epoch is the last one that every reporting node saved (nodes that train in lock step
    report the same epochs; a node ahead of the others goes back to theirs); 0 when no node
    reported one. Each node restores its own checkpoint of that epoch, or, if it saved none
    (under a synchronous strategy often only the chief saves), the first reporting node's."""
    reporting = {node: epochs for node, epochs in reports.items() if epochs}
    if not reporting:
        return 0, {node: None for node in nodes}
    epoch = min(max(epochs) for epochs in reporting.values())
    # an epoch every reporter saved: the latest of those not after ``epoch``
    common = set.intersection(*(set(e for e in epochs if e <= epoch) for epochs in reporting.values()))
    epoch = max(common) if common else 0
    if epoch == 0:
        return 0, {node: None for node in nodes}
    first = min(reporting)
    return epoch, {node: (reports.get(node) or reports[first]).get(epoch, reports[first][epoch])
                   for node in nodes}


#: seconds a restart waits at most for the engine to replace lost executors or workers
REPLACEMENT_WAIT = 60.0


def await_capacity(backend, n: int, want: int, deadline: Deadline, reservation_timeout: float) -> None:
    """Before a restart of ``n`` nodes: wait for the executors or workers lost with the failed
    attempt to be replaced (the engine's slots back to ``want``, what they were at the first
    start), up to :data:`REPLACEMENT_WAIT` seconds or ``deadline`` (the attempt's
    ``reservation_timeout``); then restart on what there
    is, or raise the engine's :class:`InsufficientSlotsError` when that is fewer than ``n``."""
    pause = threading.Event()
    bound = deadline.sooner(REPLACEMENT_WAIT)
    while True:
        available = backend.slots()
        if available >= want or bound.expired:
            break
        pause.wait(0.25)
    if available < want:
        logger.warning("duotf: the %s backend has %d slots, %d before the failure; restarting "
                       "on what is left", backend.name, available, want)
    try:
        backend.check_capacity(n)
    except InsufficientSlotsError as exc:
        raise InsufficientSlotsError(
            f"{exc} (after waiting for the engine to replace what the failed attempt lost, "
            f"{min(REPLACEMENT_WAIT, reservation_timeout):g} s)", **exc.attributes) from exc


#: seconds a restart waits for a failed node's host to answer before it counts the host as lost
HOST_PROBE_TIMEOUT = 2.0


def lost_host(error: BaseException, nodes: Iterable) -> Set[str]:
    """The host of the node that failed first, where it was lost with its host's network: the
    failure is a lost or silent node (``"lost"``, ``"hung"``), and a TCP connection to the port
    it served on that host neither opens nor is refused within :data:`HOST_PROBE_TIMEOUT`
    (a refusal is an answer: the host is up, only the node's process is gone). Else None. The
    driver already reached that port to feed the node, so no firewall in between can make a
    healthy host look lost. The host's names: its address and the name the node's process
    gave (engines name executors by either); empty where it is not lost."""
    host, node_id = getattr(error, "host", None), getattr(error, "node_id", None)
    if not host or failure_cause(error) not in (Cause.LOST, Cause.HUNG):
        return set()
    found = [n for n in nodes if n.node_id == node_id]
    ports = [p for n in found for p in (n.feed_port, n.port) if p]
    if not ports:
        return set()
    try:
        socket.create_connection((host, ports[0]), timeout=HOST_PROBE_TIMEOUT).close()
    except ConnectionRefusedError:
        return set()
    except OSError as exc:  # no answer: timed out, unreachable
        logger.warning("duotf: %s's host %s does not answer (%s): the restarted nodes are kept "
                       "off it where the engine can", getattr(error, "role", "the node"), host, str(exc))
        # "hostname:pid" of the process running the node's engine task
        return {host} | {n.executor_id.rsplit(":", 1)[0] for n in found if n.executor_id}
    return set()


def avoid_lost_host(backend, error: BaseException, nodes: Iterable, engine_slots: int) -> int:
    """Before a restart: keep the restarted nodes off the host of a node lost with its network
    (:func:`lost_host`, ``backend.avoid_hosts``); the engine slots a restart waits for then
    (``engine_slots``, or fewer: a Spark executor removed there is not coming back)."""
    lost = lost_host(error, nodes)
    return min(engine_slots, backend.avoid_hosts(lost)) if lost else engine_slots
