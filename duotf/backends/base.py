"""The backend contract: the only engine-specific code in duotf.

Two small interfaces, written down here and implemented once per engine:

- :class:`Backend`, the lifecycle: which engine objects it runs on (:meth:`Backend.accepts`),
  how many nodes can run at once, start one long-running function per node as a gang (all or
  none), and close; a backend that can hold GPUs for its nodes also says whether it can
  (:meth:`Backend.check_gpus`) and hands each node its devices' addresses.
- :class:`FeedAdapter`, the feed: a collection of the engine as the driver's feed planner sees
  it: rows per partition, and the engine job that runs one epoch's feeding tasks or the
  inference tasks, one task per partition. What a task does with its partition is
  :mod:`duotf._transport.tasks` (the task side); epochs, balance and markers are planned on the
  driver (:mod:`duotf._driver.planner`). A backend calls down into the task side, never up.

Both hand back an :class:`EngineJob`, whose :meth:`~EngineJob.result` is the engine call's own
value. Reservation, roles, TF_CONFIG, supervision and shutdown are written once above this line.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import socket
import threading
import time
from typing import Any, Callable, List, Optional, Sequence, Set, Tuple

from duotf._deadline import Deadline
from duotf._enum import StrEnum
from duotf.errors import ConfigError, FeedError, InsufficientSlotsError, cause_of
from duotf._node.agent import NodeOutcome
from duotf.reports import FeedAdapterReport

logger = logging.getLogger("duotf.feed")

__all__ = ["Backend", "FeedAdapter", "JobError", "EngineJob", "ThreadJob", "NodeFunction", "Route",
           "routable_ip", "work_name", "count_error"]


#: ``fn(node_id, executor_id, attempt, gpus=()) -> NodeOutcome``; runs a node to its end.
#: ``gpus``: the addresses of the GPUs the engine holds for the node (see :mod:`duotf._node.gpus`).
NodeFunction = Callable[..., NodeOutcome]


class Route:
    """How the nodes reach the driver's rendezvous server: at its own address (this class), or
    through a relay in the cluster when the engine's tasks cannot reach the driver
    (:mod:`duotf._transport.relay`; Spark Connect)."""

    relayed = False
    #: why the route is relayed, in words ("" for a direct one)
    why = ""

    def __init__(self, address: Tuple[str, int]):
        #: the address the nodes connect to
        self.address = address

    def clock(self) -> float:
        """``time.monotonic()`` up to which the driver has heard all the nodes said (now,
        for a direct route; a relay's last completed exchange): the heartbeat watchdog
        measures a node's silence up to it."""
        return time.monotonic()

    def run(self, call: Callable[[], Any]) -> Any:
        """``call()`` where the nodes' ports can be reached (here, for a direct route; in an
        engine task, for a relay): how the driver sends them feed markers."""
        return call()

    def close(self) -> None:
        """Release the route (idempotent); called when the rendezvous server closes."""


class EngineJob(abc.ABC):
    """The driver's handle on a job the engine runs for duotf: the node gang (its result: one
    :class:`~duotf._node.agent.NodeOutcome` per node) or a feed job (its result: what the
    :class:`FeedAdapter` method says)."""

    #: a feed job whose engine tasks each feed several partitions: task i's partitions, as
    #: the planner names them when the engine reports task i lost; None where task i feeds
    #: partition i
    task_partitions: Optional[List[List[int]]] = None

    @abc.abstractmethod
    def done(self) -> bool:
        """True once the engine call returned or failed."""

    @abc.abstractmethod
    def exception(self) -> Optional[BaseException]:
        """The engine's error once done, else None."""

    @abc.abstractmethod
    def result(self) -> Any:
        """The engine call's value; waits until done and raises its error."""

    @abc.abstractmethod
    def cancel(self) -> None:
        """Cancel whatever still runs; idempotent."""

    @abc.abstractmethod
    def join(self, timeout: Optional[float] = None) -> None:
        """Wait until done (or ``timeout``)."""

    @abc.abstractmethod
    def add_done_callback(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` once done (at once if already done), so that no waiter polls."""


class ThreadJob(EngineJob):
    """An engine job whose engine call blocks: it runs in a driver thread until it returns."""

    def __init__(self, call: Callable[[], Any], cancel: Callable[[], None], name: str,
                 task_partitions: Optional[List[List[int]]] = None):
        self.task_partitions = task_partitions
        self._call = call
        self._cancel = cancel
        self._value: Any = None
        self._exc: Optional[BaseException] = None
        self._cancelled = False
        self._callbacks: Optional[List[Callable[[], None]]] = []
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"duotf-{name}-job", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._call()
        except BaseException as exc:  # reported through exception(); the thread must not die loud
            self._exc = exc
        finally:
            self._finished.set()
            with self._lock:
                callbacks, self._callbacks = self._callbacks or [], None
            for fn in callbacks:
                fn()

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if self._callbacks is not None:
                self._callbacks.append(fn)
                return
        fn()

    def done(self) -> bool:
        return self._finished.is_set()

    def exception(self) -> Optional[BaseException]:
        return self._exc if self._finished.is_set() else None

    def result(self) -> Any:
        self._thread.join()
        if self._exc is not None:
            raise self._exc
        return self._value

    def cancel(self) -> None:
        with self._lock:
            if self._cancelled or self._finished.is_set():
                return
            self._cancelled = True
        self._cancel()

    def join(self, timeout: Optional[float] = None) -> None:
        self._thread.join(timeout)


class CheckStatus(StrEnum):
    """How a check of :func:`duotf.doctor` went (a backend's :meth:`Backend.engine_checks` rows
    say it too)."""

    OK = "OK"
    WARN = "WARN"  # a job runs, but slower or more fragile than it could
    FAIL = "FAIL"  # a job would fail


@dataclasses.dataclass(frozen=True)
class FeedOptions:
    """What the feed planner decided for one feed, handed to :meth:`Backend.feed_adapter` when
    the adapter is made (never set on it afterwards).

    Attributes
    ----------
    job_id : str
        The duotf job whose feed this is: an engine that names its work names the count by it
        (a Spark job description "duotf <job id>: count rows", Dask keys
        "duotf-count-<job id>-part-<i>-<token>").
    epochs : int
        The epochs this ``train`` feeds (an adapter that converts once may do it while counting).
    ragged : tuple
        The feed's ragged columns.
    convert_once : bool or None
        Whether data the engine converts again every epoch may be converted once, in the first
        of several epochs, and fed from what was kept for the later ones
        (``cluster.train(convert_once=...)``; None: where the adapter can, False: never). What
        is kept goes with :meth:`FeedAdapter.close`.
    on_partition : callable or None
        ``fn(pid, rows)``, the progress bar: an adapter that learns a partition's result as its
        task ends passes it to :meth:`FeedAdapter.partition_done`; one that learns every result
        with the job's own need not.
    """

    job_id: str = ""
    epochs: int = 1
    ragged: tuple = ()
    convert_once: Optional[bool] = None
    on_partition: Optional[Callable[[int, int], None]] = None


@dataclasses.dataclass(frozen=True)
class JobError:
    """What an engine's failed feed job says about itself (:meth:`FeedAdapter.job_error`):
    ``cause``, why in one line (the user's exception where a task raised one); the
    ``partition`` whose task the engine lost, and ``task``, that task as the engine names it
    (its attempt, host or executor), where the error says."""

    cause: str
    partition: Optional[int] = None
    task: Optional[str] = None


class FeedAdapter(abc.ABC):
    """A collection of the engine, as the feed planner on the driver sees it.

    A backend makes one with :meth:`Backend.feed_adapter`. Partitions are numbered ``0..n-1``
    in the collection's own order; every method keeps that order.
    """

    #: what the planner decided for this feed; read, never set after the adapter is made (the
    #: class default serves an adapter of an older backend that never calls this __init__)
    options: FeedOptions = FeedOptions()

    def __init__(self, options: Optional[FeedOptions] = None):
        self.options = options if options is not None else FeedOptions()

    def report(self) -> FeedAdapterReport:
        """What the adapter adds to ``cluster.train``'s counts (e.g. what it kept): keys of
        :class:`~duotf.reports.FeedAdapterReport` only (a key of its own is declared there
        first, with its type and meaning)."""
        return {}

    def close(self) -> None:
        """Release what the adapter kept for the feed; called once ``train`` ends, however it
        ends. Never raises."""

    def partition_done(self, pid: int, rows: int) -> None:
        """Partition ``pid``'s task ended, having sent ``rows`` rows (training: its value in
        the job's result; inference: the rows answered). Never raises."""
        fn = self.options.on_partition
        if fn is not None:
            try:
                fn(pid, rows)
            except Exception as exc:  # progress is never worth a failed feed
                logger.debug("duotf: on_partition(%d, %d) raised %r", pid, rows, exc)

    def check_capacity(self, nodes: int) -> None:
        """Raise :class:`~duotf.errors.InsufficientSlotsError` at once when feeding tasks
        cannot run beside the ``nodes`` running node tasks. Called before anything else."""

    def partition_hosts(self) -> List[Optional[str]]:
        """The host holding each partition's data now, in partition order (None: not known or
        not held: read from its source wherever the engine runs the task); asked before every
        epoch of ``train(locality=True)``. The default knows none."""
        return []

    def job_error(self, exc: BaseException) -> JobError:
        """What ``exc``, the error of a feed or count job of this engine, says: why in one line
        and, where the engine names it, the task it lost and that task's partition. The
        planner builds the user's :class:`~duotf.errors.FeedError` from it, so that an engine's
        text is read only in its backend. The default knows no engine's text."""
        return JobError(cause_of(exc))

    @abc.abstractmethod
    def counts(self) -> List[int]:
        """Rows in each partition, in partition order. A partition whose source fails raises
        :func:`count_error` where the adapter knows which partition it is; any other error
        is the planner's to translate (it ends every node's feed either way)."""

    @abc.abstractmethod
    def train(self, job) -> EngineJob:
        """Start one epoch: a task per partition runs
        ``duotf._transport.tasks.train_partition(job, pid, partition)``. The job's result is the list
        of rows each partition sent, in partition order."""

    @abc.abstractmethod
    def infer(self, job, keep: Optional[List[str]], result_columns: Optional[dict]) -> EngineJob:
        """Start inference: a task per partition runs ``duotf._transport.tasks.infer_partition`` (or
        the engine's columnar equivalent). The job's result is a collection of the input's
        engine and kind with one output partition per input partition, computed while the
        cluster runs and left where the engine keeps it."""


def count_error(pid: int, exc: BaseException) -> FeedError:
    """The error of :meth:`FeedAdapter.counts` for a partition whose rows could not be counted:
    its data source raised ``exc``."""
    cause = cause_of(exc)
    return FeedError(f"counting the rows of partition {pid} failed: {cause}", partition=pid,
                     cause=cause)


class Backend(abc.ABC):
    """An engine that can run duotf nodes."""

    name: str = "backend"

    @classmethod
    def accepts(cls, obj) -> bool:
        """True when ``obj`` (a SparkSession, a Client, ...) is an engine handle this backend
        runs on; :func:`duotf.backends.resolve_backend` then calls ``cls(obj)``."""
        return False

    @classmethod
    def from_name(cls) -> "Backend":
        """The backend duotf creates when it is asked for by name (and then owns)."""
        return cls()

    @abc.abstractmethod
    def slots(self) -> int:
        """How many nodes can run at once right now."""

    def await_spread(self, nodes: int, deadline: Deadline) -> None:
        """Before a cluster's first start: wait, until ``deadline`` (``reservation_timeout``)
        at most, for the engine's executors still registering, so that ``nodes`` run one per
        executor (host) where the engine has that many. The default waits for nothing."""

    def avoid_hosts(self, hosts: Set[str]) -> int:
        """Before a restart: keep the restarted nodes off ``hosts``, whose node was lost with
        the host's network (:func:`duotf._driver.restarts.lost_host`), where the engine lets
        duotf choose; the engine's slots after it (:meth:`slots`). The default chooses nothing."""
        return self.slots()

    def check_capacity(self, nodes: int) -> None:
        """Raise :class:`InsufficientSlotsError` quickly when ``nodes`` cannot all run at once."""
        available = self.slots()
        if available < nodes:
            raise InsufficientSlotsError(
                f"the cluster needs {nodes} nodes running at once but the {self.name} backend "
                f"has {available} slots. {self.capacity_hint()}",
                needed=nodes, available=available, backend=self.name,
            )

    def capacity_hint(self) -> str:
        return "Ask for fewer nodes or give the backend more capacity."

    def check_gpus(self, nodes: int, per_node: int) -> int:
        """Raise at once when ``nodes`` nodes of ``per_node`` GPUs each (``per_node`` > 0)
        cannot all run: :class:`ConfigError` where the engine has no GPUs configured (the
        message names the setting to add), :class:`InsufficientSlotsError` where it has too
        few. Else return how many nodes of ``per_node`` GPUs can run at once (what
        :func:`duotf.run_parallel` divides among its runs). Called after
        :meth:`check_capacity`.

        A backend that passes this check takes ``start_nodes(..., gpus_per_node=per_node)`` and
        calls each node's function with ``gpus=[address, ...]``. This default has no GPUs.
        """
        raise ConfigError(
            f"ClusterSpec(gpus_per_node={per_node}) asks for GPUs, but the {self.name} backend "
            "cannot hold GPUs for its nodes: run on Spark or Dask (see docs/guides/gpus.md"
            "), use duotf.backends.LocalBackend(gpus=...), or set gpus_per_node=0."
        )

    @abc.abstractmethod
    def start_nodes(self, fn: NodeFunction, n: int, job_id: str, gpus_per_node: int = 0,
                    names: Optional[Sequence[str]] = None) -> EngineJob:
        """Start ``fn(node_id, executor_id, attempt)`` for node ids ``0..n-1``, all at once.
        The job's result is the list of the functions' :class:`NodeOutcome`. ``names``: each
        node's name (``"worker-1"``), for what the engine's own UI shows (:func:`work_name`).

        Called with ``gpus_per_node=k`` (k > 0) only on a backend whose :meth:`check_gpus`
        passed: each node then holds ``k`` GPUs of the engine's and its function gets their
        addresses as ``gpus=[...]``."""

    def engine_checks(self, nodes: int) -> List[Tuple[str, "CheckStatus", str, str]]:
        """What :func:`duotf.doctor` should check of this engine itself, for ``nodes`` nodes:
        rows ``(name, CheckStatus, what was seen, the fix)``."""
        return []

    def feed_adapter(self, data, nodes: int, options: Optional[FeedOptions] = None) -> FeedAdapter:
        """The engine's view of ``data`` to feed while ``nodes`` node tasks run, made with what
        the planner decided for this feed (``options``)."""
        raise ConfigError(
            f"the {self.name} backend cannot feed a {type(data).__name__}; " + self.feed_hint()
        )

    def feed_hint(self) -> str:
        return ""

    def driver_host(self) -> str:
        """The driver address that the engine's tasks can reach."""
        return "127.0.0.1"

    def route(self, address: Tuple[str, int], on_lost: Callable[[str], None], idle: float,
              ports: Optional[str] = None) -> Route:
        """How the nodes reach the rendezvous server at ``address``: directly, unless the
        engine's tasks cannot (then a relay: ``on_lost(why)`` once if it is lost, its hub
        ending after ``idle`` seconds without the driver, listening in ``ports``, the job's
        ``DUOTF_PORTS``, where given)."""
        return Route(address)

    def default_fs(self) -> str:
        return "file://"

    def encrypts_traffic(self) -> bool:
        """Whether the engine encrypts its own network traffic: duotf's connections then use
        TLS too, unless the job says otherwise (:mod:`duotf._transport.tls`)."""
        return False

    def close(self) -> None:
        """Release what the backend created (only called on backends duotf created)."""


def work_name(job_id: str, what: str) -> str:
    """How an engine's UI names duotf's work (a Spark job description):
    ``"duotf <job id>: nodes (worker-0, worker-1)"``, ``"duotf <job id>: feed epoch 3/10"``."""
    return f"duotf {job_id}: {what}"


def routable_ip(target_host: str) -> str:
    """This machine's address on the route to ``target_host`` (no packet is sent)."""
    try:
        infos = socket.getaddrinfo(target_host, 9, socket.AF_INET, socket.SOCK_DGRAM)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(infos[0][4])
            return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"
