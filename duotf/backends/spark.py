"""The Spark backend: nodes run as the tasks of one barrier stage (all start, or none).

One node takes one task slot (``spark.task.cpus`` cores) for its whole life. On a standalone or
YARN cluster whose executors have exactly one slot (``spark.executor.cores`` equal to
``spark.task.cpus``) that is one node per executor; in ``local[N]`` mode N nodes share the one
executor, each in a process and a working directory of its own.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import List

from ..errors import BackendError, InsufficientSlotsError
from ..node import NodeOutcome
from .base import Backend, EngineJob, NodeFunction, ThreadJob, work_name

logger = logging.getLogger(__name__)


def _barrier_task(fn: NodeFunction):
    def task(_partition):
        from pyspark import BarrierTaskContext

        tc = BarrierTaskContext.get()
        executor = f"{socket.gethostname()}:{os.getppid()}"
        yield fn(tc.partitionId(), executor, tc.attemptNumber())

    return task


class SparkBackend(Backend):
    """Run nodes on the executors of a SparkSession or SparkContext.

    Parameters
    ----------
    spark:
        A ``SparkSession`` or ``SparkContext``.
    slot_wait:
        Seconds to wait for executors still registering before giving up on capacity (a
        fresh ``spark-submit`` application's executors take seconds to start; the wait ends as
        soon as there are slots enough, and local mode never waits).
    """

    name = "spark"

    @classmethod
    def accepts(cls, obj) -> bool:
        """A ``pyspark`` SparkSession or SparkContext."""
        return type(obj).__module__.startswith("pyspark") and (
            hasattr(obj, "sparkContext") or hasattr(obj, "parallelize"))

    def __init__(self, spark, slot_wait: float = 30.0):
        self.sc = getattr(spark, "sparkContext", spark)
        self.slot_wait = slot_wait
        self._created_session = None

    def __repr__(self) -> str:
        return f"SparkBackend(master={self.sc.master!r})"

    @classmethod
    def from_name(cls) -> "SparkBackend":
        from pyspark.sql import SparkSession

        existed = SparkSession.getActiveSession() is not None
        session = SparkSession.builder.appName("duotf").getOrCreate()
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
        return self.sc.master.startswith("local")

    def _conf(self, key: str, default: str = "") -> str:
        return self.sc.getConf().get(key, default)

    def slots(self) -> int:
        jsc = self.sc._jsc.sc()
        try:
            profile = jsc.resourceProfileManager().defaultResourceProfile()
            return int(jsc.maxNumConcurrentTasks(profile))
        except Exception:  # an older/newer Spark without this internal API
            logger.debug("maxNumConcurrentTasks unavailable; using defaultParallelism", exc_info=True)
            return self.sc.defaultParallelism // max(int(self._conf("spark.task.cpus", "1")), 1)

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
        deadline = time.monotonic() + (0 if self._local else self.slot_wait)
        while True:
            available = self.slots()
            if available >= nodes or time.monotonic() >= deadline:
                break
            time.sleep(0.25)  # executors still registering with the driver
        if available < nodes:
            raise InsufficientSlotsError(
                f"the cluster needs {nodes} nodes running at once but Spark ({self.sc.master}) has "
                f"{available} free task slots. {self.capacity_hint()}",
                needed=nodes, available=available, backend=self.name,
            )

    def start_nodes(self, fn: NodeFunction, n: int, job_id: str, names=None) -> EngineJob:
        # The job group is the job's id, and its description what the Spark UI shows for it
        # (feeding jobs: "duotf <job id>: feed epoch 3/10", see SparkFeed).
        group = f"duotf-{job_id}"
        description = work_name(job_id, f"nodes ({', '.join(names or map(str, range(n)))})")
        sc = self.sc

        def call() -> List[NodeOutcome]:
            sc.setJobGroup(group, description, interruptOnCancel=True)
            try:
                rdd = sc.parallelize(range(n), n).barrier().mapPartitions(_barrier_task(fn))
                return sorted(rdd.collect(), key=lambda o: o.node_id)
            finally:
                sc.setLocalProperty("spark.jobGroup.id", None)

        return ThreadJob(call, cancel=lambda: sc.cancelJobGroup(group), name="spark")

    def feed_hint(self) -> str:
        return "pass a Spark DataFrame or RDD."

    def feed_adapter(self, data, nodes: int):
        from .spark_feed import SparkFeed

        if not SparkFeed.accepts(data):
            return super().feed_adapter(data, nodes)
        return SparkFeed(self, data)

    def driver_host(self) -> str:
        host = self._conf("spark.driver.host") or socket.gethostname()
        try:
            return socket.gethostbyname(host)
        except OSError:
            return host

    def default_fs(self) -> str:
        try:
            return self.sc._jsc.hadoopConfiguration().get("fs.defaultFS") or "file://"
        except Exception:
            return "file://"
