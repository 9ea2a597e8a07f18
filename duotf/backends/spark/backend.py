"""The Spark backend: nodes run as the tasks of one barrier stage (all start, or none).

One node takes one task slot (``spark.task.cpus`` cores) for its whole life. On a standalone or
YARN cluster whose executors have exactly one slot (``spark.executor.cores`` equal to
``spark.task.cpus``) that is one node per executor; in ``local[N]`` mode N nodes share the one
executor, each in a process and a working directory of its own.

With ``ClusterSpec(gpus_per_node=k)`` the barrier stage carries a stage-level resource profile
(task resources only: ``spark.task.cpus`` cores and ``k`` ``gpu``), so Spark gives each node
task ``k`` GPUs of its executor, and only the node tasks: feeding tasks take none. The executors
must have GPUs (``spark.executor.resource.gpu.amount`` and a discovery script); the task's
addresses become the node's ``CUDA_VISIBLE_DEVICES`` (:mod:`duotf._node.gpus`).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import sys
import time
from typing import TYPE_CHECKING, List, Optional, Tuple

from duotf.errors import BackendError, ConfigError, InsufficientSlotsError
from duotf._node.agent import NodeOutcome
from duotf._verbosity import is_verbose, quiet_known_notices
from duotf._deadline import Deadline
from duotf.backends.base import Backend, CheckStatus, EngineJob, NodeFunction, ThreadJob, work_name
from duotf.backends.spark.client import ClassicClient, ConnectClient, SparkClient, client_for, is_connect

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)


def _node_task(fn: NodeFunction, gpus: int = 0):
    def task(partition: int, tc):
        from duotf._node import warm

        executor = f"{socket.gethostname()}:{os.getppid()}"
        # A warm node server lives as long as the executor's Python daemon (this task's worker
        # process may be one of several it forks, and may go before it)
        warm.set_owner(os.getppid())
        if gpus:
            return fn(partition, executor, tc.attemptNumber(), gpus=list(tc.resources()["gpu"].addresses))
        return fn(partition, executor, tc.attemptNumber())

    return task


#: what a Spark application needs for nodes with GPUs, as the errors say it
_GPU_SETTINGS = (
    "spark.executor.resource.gpu.amount=<GPUs per executor> and "
    "spark.executor.resource.gpu.discoveryScript=<a script that prints "
    '{"name": "gpu", "addresses": ["0", ...]}> (on a standalone cluster the workers declare '
    "theirs with spark.worker.resource.gpu.amount and spark.worker.resource.gpu.discoveryScript). "
    "duotf asks for each node task's GPUs itself (a stage-level resource profile): "
    "spark.task.resource.gpu.amount may stay unset, and feeding tasks then take no GPU"
)


class SparkBackend(Backend):
    """Run nodes on the executors of a SparkSession or SparkContext.

    Parameters
    ----------
    spark:
        A ``SparkSession`` (classic or Spark Connect) or a ``SparkContext``.
    slot_wait:
        Seconds to wait for executors still registering before giving up on capacity (a
        fresh ``spark-submit`` application's executors take seconds to start; the wait ends as
        soon as there are slots enough, and local mode never waits).
    """

    name = "spark"

    @classmethod
    def accepts(cls, obj) -> bool:
        """A ``pyspark`` SparkSession (classic or Spark Connect) or SparkContext."""
        return type(obj).__module__.startswith("pyspark") and (
            is_connect(obj) and hasattr(obj, "range")
            or hasattr(obj, "sparkContext") or hasattr(obj, "parallelize"))

    def __init__(self, spark, slot_wait: float = 30.0):
        self.client: SparkClient = client_for(spark)
        self.slot_wait = slot_wait
        self._created_session: Optional[SparkSession] = None
        self._profiles: dict = {}  # GPUs per node -> its resource profile (one per k, reused)
        quiet_known_notices()  # pyspark's pandas notice on every DataFrame feed (duotf._verbosity)

    def __repr__(self) -> str:
        return f"SparkBackend(master={self.client.master!r}{', connect' if self.client.connect else ''})"

    @property
    def sc(self):
        """The classic ``SparkContext`` (what RDDs are made with); a :class:`ConfigError` on a
        Spark Connect session, which has none."""
        if isinstance(self.client, ClassicClient):
            return self.client.sc
        raise ConfigError("a Spark Connect session has no SparkContext (and so no RDD): pass a "
                          "DataFrame, or use a classic SparkSession")

    @classmethod
    def from_name(cls) -> "SparkBackend":
        quiet_known_notices()  # pyspark raises the pandas notice as the session is made already
        from pyspark.sql import SparkSession

        existed = SparkSession.getActiveSession() is not None
        builder = SparkSession.builder.appName("duotf")
        if not is_verbose() and not (sys.stderr is not None and sys.stderr.isatty()):
            # Spark's console progress bar, redrawn for every stage, is decided only here, as a
            # session starts: quiet in a script whose stderr is a file (duotf._verbosity)
            builder = builder.config("spark.ui.showConsoleProgress", "false")
        session = builder.getOrCreate()
        backend = cls(session)
        if not existed:
            backend._created_session = session
        return backend

    def close(self) -> None:
        if self._created_session is not None:
            self._created_session.stop()
            self._created_session = None

    @property
    def _local(self) -> bool:
        return self.client.local

    def _conf(self, key: str, default: str = "") -> str:
        return self.client.conf(key, default)

    def slots(self) -> int:
        return self.client.slots()

    def avoid_hosts(self, hosts) -> int:
        """Remove the executors on ``hosts`` from the application (classic Spark): the driver
        could not reach them, and Spark would otherwise keep offering their cores to the
        restarted nodes' barrier stage until ``spark.network.timeout`` (120 s) passes without a
        heartbeat. The application's executor target is left as it is, so a standalone master
        may start an executor on that host's worker again once it is back. A Connect client
        cannot (no driver JVM): Spark's own timeout then applies."""
        removed = self.client.remove_executors_on(hosts)
        if removed:
            logger.warning("duotf: removed Spark executor(s) %s on %s from the application: "
                           "their host does not answer", ", ".join(removed), ", ".join(sorted(hosts)))
        return self.slots()

    def capacity_hint(self) -> str:
        if self._local:
            return "Run with master local[N] where N is at least the number of nodes."
        return (
            "Each node holds one task slot for its whole life: start more executors "
            "(spark.executor.instances / more workers), or more cores per executor "
            "(spark.executor.cores), or fewer nodes."
        )

    def check_capacity(self, nodes: int) -> None:
        if self._conf("spark.dynamicAllocation.enabled", "false").lower() == "true":
            raise BackendError(
                "duotf runs nodes as a barrier stage, which needs a fixed set of executors: set "
                "spark.dynamicAllocation.enabled=false (and spark.executor.instances)."
            )
        deadline = Deadline.after(0 if self._local else self.slot_wait)
        while True:
            available = self.slots()
            if available >= nodes or deadline.expired:
                break
            time.sleep(0.25)  # executors still registering with the driver
        if available < nodes:
            raise InsufficientSlotsError(
                f"the cluster needs {nodes} nodes running at once but Spark ({self.client.master}) has "
                f"{available} free task slots. {self.capacity_hint()}",
                needed=nodes, available=available, backend=self.name,
            )

    def _expected_executors(self, nodes: int) -> Tuple[int, bool]:
        """How many executors this application will have (at most ``nodes`` counted), and
        whether Spark's settings say so: ``spark.executor.instances`` (YARN, Kubernetes), or a
        standalone master's ``spark.cores.max`` / ``spark.executor.cores``. Without them a
        standalone application takes an executor on every worker, which the driver learns only
        as each registers: ``nodes``, not known."""
        try:
            instances = int(self._conf("spark.executor.instances") or 0)
            if instances:
                return min(instances, nodes), True
            cores_max, cores = (int(self._conf(k) or 0) for k in ("spark.cores.max", "spark.executor.cores"))
        except ValueError:
            return nodes, False
        if cores_max and cores and self.client.master.startswith("spark://"):
            return min(max(cores_max // cores, 1), nodes), True
        return nodes, False

    def _registering_for(self) -> float:
        """Seconds Spark itself gives executors to register after the application starts
        (``spark.scheduler.maxRegisteredResourcesWaitingTime``, 30 s), less the application's
        age: > 0 while executors may still be registering."""
        try:
            started = int(self._conf("spark.app.startTime") or 0) / 1000.0
            window = float(self._conf("spark.scheduler.maxRegisteredResourcesWaitingTime", "30s")
                           .rstrip("s") or 30)
        except ValueError:
            return 0.0
        return started + window - time.time() if started else 0.0

    def await_spread(self, nodes: int, deadline: Deadline) -> None:
        """Wait for executors still registering (a fresh application's take seconds), so that
        Spark, which deals a stage's tasks out over its executors in turn, puts one node on each:
        until ``min(nodes, executors expected)`` have registered, or the application is older than
        ``spark.scheduler.maxRegisteredResourcesWaitingTime`` where the settings do not say how
        many to expect, or ``deadline``. Nodes then share executors only where there are fewer."""
        if self._local or nodes < 2:
            return
        target, known = self._expected_executors(nodes)
        waited = time.monotonic()
        while True:
            registered = self._executors()
            if registered >= target or deadline.expired:
                break
            if not known and self._registering_for() <= 0:
                break
            time.sleep(0.25)  # executors still registering with the driver
        if registered < nodes:
            logger.log(logging.INFO if registered < target else logging.DEBUG,
                       "duotf: %d executors registered for %d nodes after %.1f s: nodes share "
                       "executors", registered, nodes, time.monotonic() - waited)
        if min(registered, nodes) >= 2 and self._registering_for() > 0:
            self._await_started(min(registered, nodes), deadline)

    def _await_started(self, executors: int, deadline: Deadline) -> None:
        """Wait until ``executors`` executors take tasks. One that has registered (and that the
        status tracker lists) takes none until it has started: Spark offers its cores only then,
        and a stage submitted in between goes whole to the executors that have, both of a fresh
        application's nodes to the one that started first. A probe stage of ``executors`` tasks
        (Spark deals them one to each executor that takes tasks) until they run on that many,
        for at most the seconds executors still have to register, plus 10 (and ``deadline``)."""
        left = deadline.remaining
        limit = Deadline.after(min(math.inf if left is None else left, self._registering_for() + 10))
        seen: set = set()
        while not limit.expired:
            seen = set(self.client.spread(_task_executor, executors))
            if len(seen) >= executors:
                return
            time.sleep(0.25)  # an executor still starting
        logger.info("duotf: %d of %d executors took tasks after waiting: nodes may share one",
                    len(seen), executors)

    def check_gpus(self, nodes: int, per_node: int) -> int:
        asked = f"ClusterSpec(gpus_per_node={per_node}) asks for GPUs"
        if self._local:
            raise ConfigError(
                f"{asked}, but Spark in local mode ({self.client.master}) schedules no GPUs for its "
                "tasks: run on a standalone, YARN or Kubernetes cluster whose executors have "
                f"GPUs ({_GPU_SETTINGS}), or set gpus_per_node=0.")
        amount = self._conf("spark.executor.resource.gpu.amount")
        try:
            per_executor = int(float(amount or 0))
        except ValueError:
            per_executor = 0
        if per_executor <= 0:
            raise ConfigError(
                f"{asked}, but this Spark application's executors have no GPUs "
                f"(spark.executor.resource.gpu.amount is {amount or 'unset'}): start the "
                f"session with {_GPU_SETTINGS}; or set gpus_per_node=0.")
        if per_executor < per_node:
            raise ConfigError(
                f"{asked}, but each executor has spark.executor.resource.gpu.amount={amount}: a "
                "node's GPUs are those of its executor. Raise the executors' amount (and the "
                "workers' GPUs) or lower gpus_per_node.")
        executors = self._executors()
        fit = executors * (per_executor // per_node)
        if fit < nodes:
            raise InsufficientSlotsError(
                f"the cluster needs {nodes} nodes of {per_node} GPUs each but Spark "
                f"({self.client.master}) has {executors} executors of {per_executor} GPUs: room for "
                f"{fit}. Start more executors with GPUs, or ask for fewer nodes or GPUs per node.",
                needed=nodes, available=fit, backend=self.name)
        return fit

    def _executors(self) -> int:
        """Executors registered now."""
        return self.client.executors()

    def _gpu_profile(self, per_node: int):
        """Task resources of a node: its cores and ``per_node`` GPUs of its executor."""
        from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests

        if per_node not in self._profiles:
            requests = TaskResourceRequests().cpus(max(int(self._conf("spark.task.cpus", "1")), 1))
            requests.resource("gpu", float(per_node))
            self._profiles[per_node] = ResourceProfileBuilder().require(requests).build
        return self._profiles[per_node]

    def engine_checks(self, nodes: int) -> List[Tuple[str, CheckStatus, str, str]]:
        import pyspark

        rows = []
        try:
            java = self.client.java_version()
        except Exception as exc:  # a gateway that does not answer
            java = f"unknown ({exc})"
        needed = 17 if int(pyspark.__version__.split(".")[0]) >= 4 else 8
        major = java.split(".")[0] if not java.startswith("1.") else java.split(".")[1]
        ok = major.isdigit() and int(major) >= needed
        rows.append(("java", CheckStatus.OK if ok else CheckStatus.FAIL, f"the driver's JVM runs Java {java}",
                     f"pyspark {pyspark.__version__} needs Java {needed} or later (JAVA_HOME)"))
        slots = self.slots()
        if slots <= nodes:
            rows.append(("feed slots", CheckStatus.WARN, f"{slots} task slots for {nodes} nodes: none left "
                         "for the tasks of train() and inference()",
                         "give each executor one core more than its nodes use, or "
                         "local[N] with N > nodes, if you feed through the engine"))
        return rows

    def start_nodes(self, fn: NodeFunction, n: int, job_id: str,
                    gpus_per_node: int = 0, names=None) -> EngineJob:
        # The job group is the job's id, and its description what the Spark UI shows for it
        # (feeding jobs: "duotf <job id>: feed epoch 3/10", see SparkFeed).
        group = f"duotf-{job_id}"
        description = work_name(job_id, f"nodes ({', '.join(names or map(str, range(n)))})")
        client = self.client
        profile = self._gpu_profile(gpus_per_node) if gpus_per_node else None

        def call() -> List[NodeOutcome]:
            outcomes = client.scoped(group, description, lambda: client.barrier(
                _node_task(fn, gpus_per_node), n, profile))
            return sorted(outcomes, key=lambda o: o.node_id)

        return ThreadJob(call, cancel=lambda: client.cancel(group), name="spark")

    def feed_hint(self) -> str:
        return "pass a Spark DataFrame or RDD."

    def feed_adapter(self, data, nodes: int, options=None):
        from duotf.backends.spark.feed import SparkFeed

        if not SparkFeed.accepts(data):
            return super().feed_adapter(data, nodes, options)
        return SparkFeed(self, data, options)

    def driver_host(self) -> str:
        if isinstance(self.client, ConnectClient):
            # the driver is the Connect server's; the rendezvous server is this process's
            return self.client.client_address()
        host = self._conf("spark.driver.host") or socket.gethostname()
        try:
            return socket.gethostbyname(host)
        except OSError:
            return host

    def route(self, address, on_lost, idle, ports=None):
        if isinstance(self.client, ConnectClient):
            from duotf.backends.spark.relay import SparkRelay, needs_relay

            if needs_relay(self.client, address):
                return SparkRelay(self.client, address, on_lost, idle, ports)
        return super().route(address, on_lost, idle, ports)

    def encrypts_traffic(self) -> bool:
        """Spark's RPC encryption or its SSL is on (``spark.network.crypto.enabled``,
        ``spark.ssl.enabled``), as this session's configuration says."""
        return any(self._conf(key, "false").strip().lower() == "true"
                   for key in ("spark.network.crypto.enabled", "spark.ssl.enabled"))

    def default_fs(self) -> str:
        try:
            return self.client.default_fs()
        except Exception:
            return "file://"


def _task_executor() -> str:
    """The executor a task runs in: its host, and its Python daemon (one an executor), or the
    executor's JVM where Spark starts Python workers without one."""
    return f"{socket.gethostname()}/{os.getppid()}"
