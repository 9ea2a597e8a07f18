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

from ..errors import BackendError, ConfigError, InsufficientSlotsError
from ..node import NodeOutcome
from .base import Backend, NodeFunction, NodeGang, ThreadGang

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
        Seconds to wait for executors still registering before giving up on capacity.
    """

    name = "spark"

    def __init__(self, spark, slot_wait: float = 10.0):
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

    def start_nodes(self, fn: NodeFunction, n: int, job_id: str) -> NodeGang:
        group = f"duotf-{job_id}"
        sc = self.sc

        def call() -> List[NodeOutcome]:
            sc.setJobGroup(group, f"duotf nodes ({n})", interruptOnCancel=True)
            try:
                rdd = sc.parallelize(range(n), n).barrier().mapPartitions(_barrier_task(fn))
                return sorted(rdd.collect(), key=lambda o: o.node_id)
            finally:
                sc.setLocalProperty("spark.jobGroup.id", None)

        return ThreadGang(call, cancel=lambda: sc.cancelJobGroup(group), name="spark")

    def feed_hint(self) -> str:
        return "pass a Spark DataFrame or RDD."

    def feed_adapter(self, data, nodes: int):
        from .spark_feed import FeedCache

        if not (hasattr(data, "mapInArrow") or hasattr(data, "mapPartitionsWithIndex")
                or isinstance(data, FeedCache)):
            return super().feed_adapter(data, nodes)
        return _SparkFeed(self, data, nodes)

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


# -- the engine feed ----------------------------------------------------------------------------
def _arrow_counts(batches):
    import pyarrow as pa
    from pyspark import TaskContext

    n = sum(b.num_rows for b in batches)
    yield pa.RecordBatch.from_pydict({"p": [TaskContext.get().partitionId()], "n": [n]})


def _arrow_train(job, tensors):
    def run(batches):
        import pyarrow as pa
        from pyspark import TaskContext

        from ..feed.columns import from_arrow
        from ..feed.feeder import feed_train

        chunks = (from_arrow(batch, tensors) for batch in batches)
        sent = feed_train(job, TaskContext.get().partitionId(), chunks)
        yield pa.RecordBatch.from_pydict({"rows": [sent]})

    return run


def _arrow_infer(job, keep, result_fields, tensors):
    def run(batches):
        import collections

        import pyarrow as pa
        from pyspark import TaskContext
        from pyspark.sql.pandas.types import to_arrow_type

        from ..feed.columns import from_arrow, num_rows
        from ..feed.feeder import feed_infer

        inputs = collections.deque()

        def remember(stream):
            for batch in stream:
                inputs.append(batch)
                yield from_arrow(batch, tensors)

        def take_inputs(n):
            parts = []
            while n:
                head = inputs[0]
                k = min(n, head.num_rows)
                parts.append(head.slice(0, k))
                if k == head.num_rows:
                    inputs.popleft()
                else:
                    inputs[0] = head.slice(k)
                n -= k
            return pa.Table.from_batches(parts).combine_chunks().to_batches()[0]

        types = [(f.name, to_arrow_type(f.dataType)) for f in result_fields]
        for _, results in feed_infer(job, TaskContext.get().partitionId(), remember(batches)):
            rows = num_rows(results)
            kept = take_inputs(rows)
            arrays = [kept.column(kept.schema.get_field_index(name)) for name in keep]
            for name, arrow_type in types:
                values = results.get(name)
                if values is None:
                    raise KeyError(f"the node's results have no column {name!r} "
                                   f"(they have {sorted(results)}); set result_columns=...")
                arrays.append(pa.array(list(values) if getattr(values, "ndim", 1) > 1 else values,
                                       type=arrow_type))
            yield pa.RecordBatch.from_arrays(arrays, names=list(keep) + [n for n, _ in types])

    return run


def _rdd_counts(index, rows):
    yield index, sum(1 for _ in rows)


def _cached_files(job):
    """Feed the cached partitions of this task, up to one per target node at once (a task may
    hold several after coalescing); yield ``(pid, rows sent)``, ``None`` for a file that is on
    another host."""

    def feed(part):
        from ..feed.feeder import feed_train

        opened = part.open()
        if opened is None:
            return part.pid, None
        f, frames = opened
        with f:
            return part.pid, feed_train(job, part.pid, frames)

    def run(parts):
        from concurrent.futures import ThreadPoolExecutor

        parts = list(parts)
        if len(parts) <= 1:
            yield from map(feed, parts)
            return
        # sendfile leaves the GIL: partitions in order, so the ones fed at once go to
        # different nodes (see feeder.balance)
        with ThreadPoolExecutor(min(len(parts), len(job.addresses)), "duotf-feed") as pool:
            yield from pool.map(feed, parts)

    return run


def _frames_of_partition(job):
    def run(items):
        from pyspark import TaskContext

        from ..feed.feeder import feed_train
        from ..feed.wire import Packed

        yield feed_train(job, TaskContext.get().partitionId(), (Packed(n, frame) for n, frame in items))

    return run


class _SparkFeed:
    def __init__(self, backend: SparkBackend, data, nodes: int):
        from .spark_feed import FeedCache

        self.backend = backend
        self.nodes = nodes
        self.sc = backend.sc
        self.cache = data if isinstance(data, FeedCache) else None
        self.df = data if hasattr(data, "mapInArrow") else None
        self.rdd = None if self.df is not None or self.cache is not None else data

    def _job(self, what: str, call):
        group = f"duotf-feed-{id(self)}-{time.monotonic_ns()}"
        sc = self.sc

        def run():
            sc.setJobGroup(group, what, interruptOnCancel=True)
            try:
                return call()
            finally:
                sc.setLocalProperty("spark.jobGroup.id", None)

        return ThreadGang(run, cancel=lambda: sc.cancelJobGroup(group), name="spark-feed")

    def _check_free_slot(self, nodes: int) -> None:
        free = self.backend.slots() - nodes
        if free < 1:
            raise InsufficientSlotsError(
                f"feeding needs a free task slot beside the {nodes} node tasks, but Spark "
                f"({self.sc.master}) has {self.backend.slots()} slots in all. Give each executor "
                "one more core than its nodes use (spark.executor.cores), or run local[N] with "
                "N > number of nodes.",
                needed=nodes + 1, available=self.backend.slots(), backend="spark",
            )

    def counts(self) -> List[int]:
        if self.cache is not None:
            return list(self.cache.counts)
        if self.df is not None:
            from pyspark.sql import functions as F

            # One literal column: Spark reads no data column just to count rows.
            rows = self.df.select(F.lit(0).alias("_")).mapInArrow(_arrow_counts, "p long, n long").collect()
            counts = [0] * self.df.rdd.getNumPartitions()
        else:
            rows = self.rdd.mapPartitionsWithIndex(_rdd_counts).collect()
            counts = [0] * self.rdd.getNumPartitions()
        for p, n in rows:
            counts[p] = n
        return counts

    def train(self, job) -> NodeGang:
        self._check_free_slot(self.nodes)
        if self.cache is not None:
            cache, sc = self.cache, self.sc
            if cache.index is None:
                raise ConfigError(f"{cache!r} was unpersisted; make a new feed_cache()")

            index = cache.index
            free = max(self.backend.slots() - self.nodes, 1)
            if len({part.host for part in cache.parts}) == 1 and len(cache.parts) > free:
                # One host: every file is local to every task. One task per free slot, each
                # feeding a run of partitions, saves Spark's per-task cost, and with no
                # locality preference no task waits for the executor that holds an index
                # entry. Across hosts each partition keeps its own task, which Spark runs where
                # its index entry (and so its file) is.
                per = -(-len(cache.parts) // free)
                runs = [cache.parts[i:i + per] for i in range(0, len(cache.parts), per)]
                index = sc.parallelize(runs, len(runs)).flatMap(lambda run: run)

            def call():
                sent = dict(index.mapPartitions(_cached_files(job)).collect())
                missed = sorted(pid for pid, rows in sent.items() if rows is None)
                if missed:
                    logger.info("duotf: %d cached partitions were on another host; feeding them "
                                "from the DataFrame", len(missed))
                    for pid, rows in zip(missed, sc.runJob(cache.frames, _frames_of_partition(job), missed)):
                        sent[pid] = rows
                return [sent[pid] for pid in sorted(sent)]

            return self._job("duotf feed", call)
        if self.df is not None:
            from ..feed.columns import tensor_specs

            df = self.df
            task = _arrow_train(job, tensor_specs(df.schema))
            return self._job("duotf feed", lambda: [r.rows for r in df.mapInArrow(task, "rows long").collect()])
        from ..feed.driver import train_partition

        rdd = self.rdd
        return self._job("duotf feed", lambda: rdd.mapPartitionsWithIndex(
            lambda i, rows: [train_partition(job, i, rows)]).collect())

    def infer(self, job, keep, result_columns) -> NodeGang:
        if self.cache is not None:
            raise ConfigError("a FeedCache is for training; pass the DataFrame itself to inference()")
        self._check_free_slot(self.nodes)
        if self.df is not None:
            from pyspark.sql import types as T

            df = self.df
            keep = list(df.columns) if keep is None else list(keep)
            spec = result_columns or {"prediction": "double"}
            session = df.sparkSession
            result_fields = session.createDataFrame(
                [], ", ".join(f"`{k}` {v}" for k, v in spec.items())).schema.fields
            schema = T.StructType([df.schema[k] for k in keep] + list(result_fields))

            from ..feed.columns import tensor_specs

            task = _arrow_infer(job, keep, result_fields, tensor_specs(df.schema))

            def run():
                out = df.mapInArrow(task, schema)
                return [out.localCheckpoint(eager=True)]

            return self._job("duotf inference", run)
        from ..feed.driver import infer_partition

        rdd = self.rdd

        def run_rdd():
            out = rdd.mapPartitionsWithIndex(lambda i, rows: infer_partition(job, i, list(rows), keep))
            # Materialize now, while the nodes run. persist() also keeps PySpark from pipelining
            # count() past this RDD, which would leave the checkpoint unfilled.
            from pyspark import StorageLevel

            out.persist(StorageLevel.MEMORY_AND_DISK)
            out.localCheckpoint()
            out.count()
            return [out]

        return self._job("duotf inference", run_rdd)
