"""The one seam between Spark's two clients: a classic ``SparkContext`` (py4j into a JVM driver
in this process) and a Spark Connect session (gRPC to a server that runs the driver elsewhere).

Everything else of the Spark backend is written once, against :class:`SparkClient`. What
differs is here and nowhere else:

================  =======================================  ========================================
                  classic (:class:`ClassicClient`)          Connect (:class:`ConnectClient`)
================  =======================================  ========================================
nodes             a barrier RDD stage                       ``mapInArrow(..., barrier=True)``
                                                            (Spark >= 3.5), outcomes pickled
task slots        the scheduler's ``maxNumConcurrentTasks``  ``local[N]``, or a probe job: each
                                                            executor's cores (its JVM's
                                                            ``--cores``) over ``spark.task.cpus``
                                                            (16 tasks, doubled while each found
                                                            an executor of its own)
grouping, cancel  job groups (``setJobGroup``)             operation tags (``addTag``,
                                                            ``interruptTag``)
settings          ``SparkConf``                            ``spark.conf`` (the server's)
Java version      the driver JVM's ``System`` property     ``reflect()`` in SQL, on the server
default file      Hadoop's ``fs.defaultFS``                ``spark.hadoop.fs.defaultFS``, else
system                                                      ``file://``
================  =======================================  ========================================

A Connect client has no RDDs: the feed takes DataFrames there (an RDD cannot be made), and
the JVM helper (:mod:`duotf.backends.spark.jvm`) is not used (its module says why), so array
columns go through Spark's Arrow writer and the first epoch's frames through Python.
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

logger = logging.getLogger(__name__)

__all__ = ["SparkClient", "ClassicClient", "ConnectClient", "client_for", "is_connect"]


def is_connect(obj: Any) -> bool:
    """Whether ``obj`` is a Spark Connect session (or one of its DataFrames)."""
    return type(obj).__module__.startswith("pyspark.sql.connect")


class SparkClient:
    """What the Spark backend asks of Spark, answered by either client (see the module's table)."""

    #: whether this is a Spark Connect session
    connect = False

    @property
    def master(self) -> str:
        raise NotImplementedError

    @property
    def local(self) -> bool:
        """Whether Spark runs in local mode (one executor: the driver's own process)."""
        return self.master.startswith("local")

    @property
    def key(self) -> int:
        """The same number for every client of one Spark application in this process (fits
        of one application share its task slots)."""
        raise NotImplementedError

    def conf(self, key: str, default: str = "") -> str:
        raise NotImplementedError

    def task_cpus(self) -> int:
        try:
            return max(int(self.conf("spark.task.cpus", "1") or 1), 1)
        except ValueError:
            return 1

    def slots(self) -> int:
        """Tasks that can run at once on the executors registered now."""
        raise NotImplementedError

    def executors(self) -> int:
        """Executors registered now."""
        raise NotImplementedError

    def java_version(self) -> str:
        raise NotImplementedError

    def remove_executors_on(self, hosts) -> List[str]:
        """Remove the executors running on ``hosts`` from the application, at once and without
        lowering its executor target; their ids (none where the client cannot)."""
        return []

    def default_fs(self) -> str:
        raise NotImplementedError

    def scoped(self, group: str, what: str, call: Callable[[], Any]) -> Any:
        """``call()`` with the Spark jobs it starts in ``group`` (cancelled alone by
        :meth:`cancel`), described as ``what`` where the client can say it."""
        raise NotImplementedError

    def cancel(self, group: str) -> None:
        raise NotImplementedError

    def barrier(self, task: Callable[[int, Any], Any], n: int, profile=None) -> List[Any]:
        """The values ``task(partition, barrier task context)`` returns in ``n`` tasks of one
        barrier stage (all start together, or none), in partition order."""
        raise NotImplementedError

    def spread(self, task: Callable[[], Any], n: int) -> List[Any]:
        """``task()`` run by ``n`` tasks of one ordinary stage (one value each), as many at once
        as there are slots: what reaches every executor with a free slot."""
        raise NotImplementedError

    def session(self):
        """The SparkSession (a classic one made from the context where none is active)."""
        raise NotImplementedError


class ClassicClient(SparkClient):
    """A classic ``SparkContext``: the driver's JVM, reached through py4j."""

    def __init__(self, sc):
        self.sc = sc

    def __repr__(self) -> str:
        return f"ClassicClient(master={self.master!r})"

    @property
    def master(self) -> str:
        return self.sc.master

    @property
    def key(self) -> int:
        return id(self.sc)

    def conf(self, key: str, default: str = "") -> str:
        return self.sc.getConf().get(key, default)

    def slots(self) -> int:
        jsc = self.sc._jsc.sc()
        try:
            profile = jsc.resourceProfileManager().defaultResourceProfile()
            return int(jsc.maxNumConcurrentTasks(profile))
        except Exception:  # an older/newer Spark without this internal API
            logger.debug("maxNumConcurrentTasks unavailable; using defaultParallelism", exc_info=True)
            return self.sc.defaultParallelism // self.task_cpus()

    def executors(self) -> int:
        # the driver, which the status tracker lists too, is not one
        return max(len(self.sc._jsc.sc().statusTracker().getExecutorInfos()) - 1, 0)

    def java_version(self) -> str:
        return str(self.sc._jvm.java.lang.System.getProperty("java.version"))

    def remove_executors_on(self, hosts) -> List[str]:
        sc = self.sc._jsc.sc()
        ids: List[str] = []
        try:
            for host in hosts:
                alive = sc.taskScheduler().getExecutorsAliveOnHost(host)
                if alive.isDefined():
                    ids += [i for i in str(alive.get().mkString(",")).split(",") if i]
            if ids:  # no target change, no failure counted, even with tasks running there
                sc.schedulerBackend().killExecutors(self.sc._jvm.PythonUtils.toSeq(ids), False, False, True)
        except Exception:  # a Spark without these internal calls: its own timeout applies
            logger.info("duotf: could not remove the executors on %s", hosts, exc_info=True)
            return []
        return ids

    def default_fs(self) -> str:
        return self.sc._jsc.hadoopConfiguration().get("fs.defaultFS") or "file://"

    def scoped(self, group: str, what: str, call: Callable[[], Any]) -> Any:
        sc = self.sc
        # the calling thread's own group and description (the user's) come back after it
        keys = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
        before = {key: sc.getLocalProperty(key) for key in keys}
        sc.setJobGroup(group, what, interruptOnCancel=True)
        try:
            return call()
        finally:
            for key, value in before.items():
                sc.setLocalProperty(key, value)

    def cancel(self, group: str) -> None:
        self.sc.cancelJobGroup(group)

    def barrier(self, task, n, profile=None):
        def run(partition):
            from pyspark import BarrierTaskContext

            tc = BarrierTaskContext.get()
            yield task(tc.partitionId(), tc)

        rdd = self.sc.parallelize(range(n), n).barrier().mapPartitions(run)
        if profile is not None:
            rdd = rdd.withResources(profile)
        return rdd.collect()

    def spread(self, task, n):
        return self.sc.parallelize(range(n), n).mapPartitions(lambda _: [task()]).collect()

    def session(self):
        from pyspark.sql import SparkSession

        return SparkSession.getActiveSession() or SparkSession(self.sc)


#: the tasks of the first probe job (:meth:`ConnectClient._executor_cores`)
_FIRST_PROBE = 16

#: the probe's answer is reused this long (seconds): check_capacity asks again and again while
#: executors register, and each ask is a Spark job
_PROBE_TTL = 2.0


class ConnectClient(SparkClient):
    """A Spark Connect session: the driver runs on the Connect server; this process reaches it
    through gRPC only (no py4j, no RDD, no ``sparkContext``)."""

    connect = True

    def __init__(self, session):
        import pyspark

        from duotf.errors import ConfigError

        major, minor = (int(part) for part in pyspark.__version__.split(".")[:2])
        if (major, minor) < (3, 5):
            raise ConfigError(f"duotf runs nodes on a Spark Connect session with mapInArrow(..., "
                              f"barrier=True), which pyspark {pyspark.__version__} lacks: install "
                              "pyspark >= 3.5 (and a server as new), or use a classic session")
        self.spark = session
        self._probed: Optional[Tuple[float, Dict[str, int]]] = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ConnectClient(master={self.master!r})"

    @property
    def master(self) -> str:
        return self.conf("spark.master", "unknown")

    @property
    def key(self) -> int:
        return hash(("connect", self.conf("spark.app.id")))

    def conf(self, key: str, default: str = "") -> str:
        value = self.spark.conf.get(key, None)
        return default if value is None else str(value)

    def _executor_cores(self) -> Dict[str, int]:
        """``{executor: cores}`` of the executors that ran a task of a probe job (each
        executor's JVM, found as its Python worker's grandparent, and the ``--cores`` it was
        started with; ``spark.executor.cores`` where that cannot be read)."""
        with self._lock:
            if self._probed is not None and time.monotonic() - self._probed[0] < _PROBE_TTL:
                return self._probed[1]
            fallback = int(self.conf("spark.executor.cores", "1") or 1)
            # Spark's scheduler hands out a stage's tasks one per free executor in turn, so n
            # tasks reach min(n, executors) executors: n is doubled while every task found an
            # executor of its own (there may be more), from 16
            n, found = _FIRST_PROBE, {}
            while True:
                out = self.spark.range(0, n, 1, n).mapInArrow(
                    _probe_executor(fallback), "executor string, cores long").collect()
                found = {row.executor: int(row.cores) for row in out}
                if len(found) < n:
                    break
                n *= 2
            self._probed = (time.monotonic(), found)
            return found

    def slots(self) -> int:
        local = local_threads(self.master)
        if local is not None:
            return local // self.task_cpus()
        return sum(cores // self.task_cpus() for cores in self._executor_cores().values())

    def executors(self) -> int:
        if self.local:
            return 1
        return len(self._executor_cores())

    def java_version(self) -> str:
        row = self.spark.sql("SELECT reflect('java.lang.System', 'getProperty', 'java.version') AS v").first()
        return str(row.v) if row is not None else "unknown"

    def default_fs(self) -> str:
        return self.conf("spark.hadoop.fs.defaultFS") or "file://"

    def scoped(self, group: str, what: str, call: Callable[[], Any]) -> Any:
        # tags are this thread's: operations it starts carry them until removed
        self.spark.addTag(group)
        try:
            return call()
        finally:
            self.spark.removeTag(group)

    def cancel(self, group: str) -> None:
        self.spark.interruptTag(group)

    def barrier(self, task, n, profile=None):
        import cloudpickle

        def run(batches):
            import pyarrow as pa
            from pyspark import BarrierTaskContext

            for _ in batches:
                pass
            tc = BarrierTaskContext.get()
            value = task(tc.partitionId(), tc)
            yield pa.RecordBatch.from_pydict({"p": [tc.partitionId()],
                                              "value": [cloudpickle.dumps(value)]})

        df = self.spark.range(0, n, 1, n)
        kwargs = {"profile": profile} if profile is not None else {}
        rows = df.mapInArrow(run, "p long, value binary", barrier=True, **kwargs).collect()
        return [pickle.loads(row.value) for row in sorted(rows, key=lambda r: r.p)]

    def spread(self, task, n):
        import cloudpickle

        def run(batches):
            import pyarrow as pa

            for _ in batches:
                pass
            yield pa.RecordBatch.from_pydict({"value": [cloudpickle.dumps(task())]})

        rows = self.spark.range(0, n, 1, n).mapInArrow(run, "value binary").collect()
        return [pickle.loads(row.value) for row in rows]

    def session(self):
        return self.spark

    def client_address(self) -> str:
        """This process's address on the route to the Connect server: where executors on the
        server's network reach a rendezvous server in this process (when they can at all)."""
        client = self.spark.client
        host, port = client.host, 15002  # Spark Connect's default port
        try:  # the channel's "host:port" (pyspark's ChannelBuilder)
            port = int(client._builder.endpoint.rsplit(":", 1)[1])
        except (AttributeError, IndexError, ValueError):
            pass
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            probe.connect((socket.gethostbyname(host), port))  # no packet is sent
            return probe.getsockname()[0]
        finally:
            probe.close()


def collect_arrow(df) -> Any:
    """``df`` collected to the driver as one Arrow table: ``toArrow`` (PySpark >= 4.0), or
    classic PySpark 3.5's Arrow collect (its Connect client has neither)."""
    if hasattr(df, "toArrow"):
        return df.toArrow()
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    return pa.Table.from_batches(df._collect_as_arrow(), schema=to_arrow_schema(df.schema))


def local_threads(master: str) -> Optional[int]:
    """N of ``local``, ``local[N]`` or ``local[N,F]``; None for ``local[*]`` (the server's
    cores, which the client does not know: a probe job counts them) and cluster masters."""
    if not master.startswith("local"):
        return None
    if master == "local":
        return 1
    inside = master[master.find("[") + 1:master.find("]")].split(",")[0].strip()
    return int(inside) if inside.isdigit() else None


def _probe_executor(fallback: int):
    def run(batches):
        import pyarrow as pa

        for _ in batches:
            pass
        jvm = _executor_jvm()
        yield pa.RecordBatch.from_pydict({"executor": [f"{socket.gethostname()}:{jvm[0]}"],
                                          "cores": [jvm[1] or fallback]})

    return run


def _executor_jvm() -> Tuple[int, int]:
    """``(pid, cores)`` of the executor JVM that runs this Python worker (pyspark's worker is
    forked by its daemon, which the JVM started); cores 0 where its command line does not say
    (local mode: the driver's JVM)."""
    pid = os.getppid()
    for _ in range(3):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
            with open(f"/proc/{pid}/stat", "rb") as f:
                parent = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        if any(arg.endswith("java") for arg in args[:1]):
            cores = args[args.index("--cores") + 1] if "--cores" in args else "0"
            return pid, int(cores) if cores.isdigit() else 0
        pid = parent
    return os.getppid(), 0


def client_for(spark) -> SparkClient:
    """The client of a SparkSession (classic or Connect) or a SparkContext."""
    if is_connect(spark):
        return ConnectClient(spark)
    return ClassicClient(getattr(spark, "sparkContext", spark))
