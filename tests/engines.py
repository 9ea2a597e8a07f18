"""The project's own engines for the shared suite (:mod:`duotf.testing.suite`): one class per kind
of the ``backend`` fixture of :mod:`duotf.testing.plugin`, declared by tests/conftest.py.

:class:`duotf.testing.Engine` says what an engine is; the in-process one
(:class:`duotf.testing.LocalEngine`) ships with it. Here: the test-only procpool backend, found
by its name through its entry point only (as a third-party backend would be), Dask's
``LocalCluster``, and Spark's local and standalone sessions.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TYPE_CHECKING, Dict, List, Sequence, Type

import psutil
import pytest

import duotf.backends
from duotf.testing import Engine, LocalEngine, pandas_frames, poll_for

if TYPE_CHECKING:
    import numpy as np


class ProcessPoolEngine(LocalEngine):
    """The test-only backend of tests/procpool_backend.py, known to duotf through nothing but its
    entry point: node agents and feeding tasks run in the processes of a pool; a collection is
    a list of partitions, as for the local backend."""

    executors = 4  # each node's agent runs in a pool process of its own
    gpu_setting = "cannot hold GPUs"  # the contract's default: a backend that never heard of GPUs
    feeds_beside_nodes = True  # a pool whose worker dies ends every worker, agents included

    @classmethod
    @contextlib.contextmanager
    def start(cls, request):
        backend = duotf.backends.resolve_backend("procpool")[0]  # by name: registry, entry point
        try:
            # the pool's own threads start with its first task: here, not inside a test
            backend.pool.submit(os.getpid).result(timeout=120)
            yield cls(backend)
        finally:
            backend.close()

    def cli_args(self):
        return super(LocalEngine, self).cli_args()  # its pool lives in this process

    def feeding_processes(self):
        return self.backend.pool.processes  # a callable: the pool's current workers, agents included


class DaskEngine(Engine):
    """A ``LocalCluster`` of 2 worker processes: Bags, DataFrames and Arrays through its Client."""

    executors = 2
    gpu_setting = "--resources GPU=n"
    feeds_beside_nodes = True  # a worker process runs a node's task and feeding tasks

    @classmethod
    @contextlib.contextmanager
    def start(cls, request):
        import dask
        from distributed import Client, LocalCluster

        # A LocalCluster closes the nanny of a worker that has been gone from the scheduler
        # for distributed.deploy.lost-worker-timeout (15 s). The tests that kill a worker wait
        # for its nanny's new one; on a loaded 2-core CI machine that one once took longer to
        # register, its nanny was closed, and every later Dask test had 1 worker of 2.
        with dask.config.set({"distributed.deploy.lost-worker-timeout": "180s"}), LocalCluster(
            n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None,
            host="127.0.0.1",
        ) as cluster, Client(cluster) as client:
            engine = cls(duotf.backends.resolve_backend(client)[0], client)
            engine.cluster = cluster
            yield engine

    @property
    def client(self):
        return self.handle

    def mend(self, wait=60):
        """A worker killed by a test comes back through its nanny in about a second. Where
        one did not (a nanny's restart can fail on a loaded machine: distributed logs "Failed to
        restart worker after its process exited" and keeps the nanny without a worker, which
        once left the rest of a CI run with 1 worker of 2), that nanny is closed and the
        cluster starts a new one in its place."""
        if getattr(self, "cluster", None) is None or len(self.client.nthreads()) >= self.executors:
            return None  # (the separate hosts' workers are no LocalCluster's: their tests revive them)
        try:
            self.client.wait_for_workers(self.executors, timeout=wait)
            return None
        except TimeoutError:
            pass
        live = set(self.client.run_on_scheduler(
            lambda dask_scheduler: [ws.name for ws in dask_scheduler.workers.values()]))
        gone = [name for name in self.cluster.workers if name not in live]
        for name in gone:
            self.cluster.sync(self.cluster.workers.pop(name).close, timeout=30)
        self.cluster.sync(self.cluster._correct_state)  # starts the spec's workers it lacks
        self.client.wait_for_workers(self.executors, timeout=60)
        return (f"worker(s) {gone} gone for {wait} s without their nanny's replacement: "
                "their nannies were closed and new ones started")

    def rows(self, parts):
        import dask
        import dask.bag as db

        return db.from_delayed([dask.delayed(list)(p) for p in parts])

    def frame(self, frames):
        import dask
        import dask.dataframe as dd

        with dask.config.set({"dataframe.convert-string": False}):
            return dd.from_delayed([dask.delayed(lambda f: f)(f) for f in frames], meta=frames[0].iloc[:0])

    def table(self, parts, schema):
        return self.frame(pandas_frames(parts, schema))

    def row_sources(self, sources):
        import dask
        import dask.bag as db

        # a Bag's partition is the source itself (it has len): the feeding task calls it
        return db.from_delayed([dask.delayed(lambda source: source)(s) for s in sources])

    def arrays(self, blocks):
        import dask.array as da

        names = list(blocks[0])
        columns = tuple(
            da.concatenate([da.from_array(b[name], chunks=(max(len(b[name]), 1),) + b[name].shape[1:])
                            for b in blocks])
            for name in names
        )
        return columns, {str(i): name for i, name in enumerate(names)}

    def constant_features(self, rows, parts, width, chunk, ids=False):
        import dask.array as da
        import numpy as np

        x = da.full((rows, width), 0.5, dtype=np.float32, chunks=(chunk, width))
        y = da.arange(rows, chunks=chunk, dtype=np.int64) % (rows if ids else 10)
        return (x, y)

    def partitions(self, out):
        return [list(p) for p in self.client.compute(out.to_delayed(), sync=True)]

    def to_pandas(self, out):
        return self.client.compute(out, sync=True).reset_index(drop=True)

    def cli_args(self):
        return ["--dask-scheduler", self.client.scheduler.address]

    def feeding_processes(self):
        return [psutil.Process(pid) for pid in self.client.run(os.getpid).values()]

    def away_from_nodes(self, data, cluster):
        # Dask arrays (constant_features): a task runs where its data is (the block may go elsewhere once its worker is lost)
        self.client.wait_for_workers(self.executors, timeout=60)  # a killed one's replacement
        agents = {node.agent_pid for node in cluster.nodes}
        others = [a for a, pid in self.client.run(os.getpid).items() if pid not in agents]
        import uuid

        import numpy as np

        # keys of their own: blocks of the same keys that a worker already holds stay where they are
        arrays = data if isinstance(data, tuple) else (data,)
        fresh = [a.map_blocks(np.copy, dtype=a.dtype, name=f"apart-{uuid.uuid4().hex}") for a in arrays]
        kept = self.client.persist(fresh, workers=others, allow_other_workers=True)
        return tuple(kept) if isinstance(data, tuple) else kept[0]

    def work_names(self, job_id):
        """The task keys of the job among the scheduler's recent transitions."""
        def keys(dask_scheduler):
            return sorted({str(t[0]) for t in dask_scheduler.transition_log})

        return [key for key in self.client.run_on_scheduler(keys) if job_id in key]

    def expected_work_names(self, job_id, nodes, epochs, by_reference=0):
        return ([f"duotf-node-{name}-{job_id}" for name in nodes]
                + [f"duotf-count-{job_id}-part-"]
                + [f"duotf-feed-{job_id}-epoch-{e}-part-" for e in range(1, epochs + 1)])

    def score(self, df, model, **kwargs):
        import duotf.dask

        return duotf.dask.predict(df, model, **kwargs)

    def score_every_way(self, df, model, output, return_type="double", batch_size=1024):
        return {"duotf.dask.predict": self.score(df, model, output=output, batch_size=batch_size)}

    def scoring_stats(self):
        import duotf._ml.scoring

        return self.client.run(duotf._ml.scoring.cache_stats)

    def ml_stages(self):
        import duotf.dask

        return duotf.dask.TFEstimator, duotf.dask.TFModel, {"client": self.client}

    def ml_name(self, name):
        import re

        return re.sub(r"(?<=[a-z])([A-Z])", r"_\1", name).lower()

    def model_at(self, path, **params):
        import duotf.dask

        return duotf.dask.TFModel(path, **params)

    def apply_model(self, model, df):
        return model.predict(df)

    def model_path(self, model):
        return model.model_path

    def save_and_load(self, model, folder):
        model.save(folder)
        return type(model).load(folder)


#: the executors of the standalone cluster's applications (its engine's, Spark Connect's)
#: compile with the client compiler only, as the suite's drivers do (tests/spark-conf); not
#: those of the separate hosts, whose locality test failed with it
EXECUTOR_C1 = {"spark.executor.defaultJavaOptions": "-XX:TieredStopAtLevel=1"}


def _spark_session(master: str, **conf):
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName("duotf-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config("spark.pyspark.python", sys.executable)
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


_SPARK_TYPES = {"float32": "float", "float64": "double", "int32": "int", "int64": "long",
                "bool": "boolean", "object": "string", "string": "string"}


def _spark_schema(columns: Dict[str, np.dtype], tensors: Sequence[str] = ()) -> str:
    """A DDL schema for numpy/pandas dtypes; the ``tensors`` columns are arrays of their dtype."""
    fields = []
    for name, dtype in columns.items():
        kind = _SPARK_TYPES[str(dtype)]
        fields.append(f"`{name}` " + (f"array<{kind}>" if name in tensors else kind))
    return ", ".join(fields)


class SparkEngine(Engine):
    """A Spark session: RDDs of rows and DataFrames. Subclasses say where it runs."""

    #: the task slots Spark has once every executor registered
    slots = 0
    converts_frames_once = True
    converts_in_jvm = True
    gpu_setting = "spark.executor.resource.gpu.amount="

    @classmethod
    def _session(cls, request):
        raise NotImplementedError

    @classmethod
    @contextlib.contextmanager
    def start(cls, request):
        from duotf.backends.spark.backend import SparkBackend

        session = cls._session(request)
        try:
            backend = SparkBackend(session, slot_wait=3.0)
            poll_for(lambda: backend.slots() >= cls.slots, 90, 0.2, "Spark executors")
            yield cls(backend, session)
        finally:
            session.stop()

    @property
    def session(self):
        return self.handle

    def _rdd(self, parts: List[list]):
        sc = self.session.sparkContext
        if not parts:  # parallelize cannot make no partition
            return sc.emptyRDD()
        return sc.parallelize(parts, len(parts)).flatMap(lambda part: part)

    def rows(self, parts):
        return self._rdd(parts)

    def row_sources(self, sources):
        # one Python task reads the RDD (Spark pipelines flatMap into the count and the feed)
        return self.session.sparkContext.parallelize(sources, len(sources)).flatMap(
            lambda source: source())

    def frame(self, frames):
        parts = [list(zip(*(f[c].tolist() for c in f.columns))) for f in frames]
        return self.session.createDataFrame(self._rdd(parts), _spark_schema(dict(frames[0].dtypes)))

    def table(self, parts, schema):
        ddl = ", ".join(f"`{name}` {kind}" for name, kind in schema.items())
        return self.session.createDataFrame(self._rdd([list(p) for p in parts]), ddl)

    def arrays(self, blocks, packed: bool = True):
        """As ``Engine.arrays``; tensor columns are packed (``pack_tensors``) unless ``packed``
        is false, which leaves them ``array<...>``."""
        from duotf.spark import pack_tensors

        first = blocks[0]
        tensors = [name for name, a in first.items() if a.ndim == 2]
        schema = _spark_schema({name: a.dtype for name, a in first.items()}, tensors)
        parts = [list(zip(*(a.tolist() for a in b.values()))) for b in blocks]
        df = self.session.createDataFrame(self._rdd(parts), schema)
        for name in tensors if packed else ():
            df = pack_tensors(df, name, dtype=str(first[name].dtype))
        return df, None

    def constant_features(self, rows, parts, width, chunk, ids=False):
        from pyspark.sql import functions as F

        return self.session.range(0, rows, numPartitions=parts).select(
            F.array_repeat(F.lit(0.5).cast("float"), width).alias("0"),
            (F.col("id") % (rows if ids else 10)).alias("1"))

    def work_names(self, job_id):
        """The descriptions of the Spark jobs (Spark's status store: what its UI shows) whose
        group belongs to the job."""
        store = self.session.sparkContext._jsc.sc().statusStore()
        names = []
        jobs = store.jobsList(None)  # a Scala Seq
        for job in (jobs.apply(i) for i in range(jobs.size())):
            group, description = job.jobGroup(), job.description()
            if group.isDefined() and job_id in group.get() and description.isDefined():
                names.append(description.get())
        return names

    def expected_work_names(self, job_id, nodes, epochs, by_reference=0):
        return ([f"duotf {job_id}: nodes ({', '.join(nodes)})", f"duotf {job_id}: count rows"]
                + [f"duotf {job_id}: feed epoch {e}/{epochs}" for e in range(1, epochs - by_reference + 1)])

    def partitions(self, out):
        return out.glom().collect()

    def to_pandas(self, out):
        return out.toPandas()

    def _app_id(self) -> str:
        return self.session.sparkContext.applicationId

    def feeding_processes(self):
        app = None if self.backend.client.local else self._app_id()

        def ours(proc) -> bool:
            """Whether a Python worker is this application's: its executor JVM (an ancestor)
            was started for it (``--app-id``). Another application of the same standalone
            cluster (the Spark Connect server's) has workers under this process too."""
            if app is None:  # local mode: the executor is this process's own JVM
                return True
            for parent in proc.parents():
                if parent.name() == "java":
                    return app in parent.cmdline()
            return False

        def python_workers():
            """Spark's Python workers under this process (they come and go with the tasks)."""
            found = []
            for proc in psutil.Process().children(recursive=True):
                try:
                    if "pyspark.daemon" in " ".join(proc.cmdline()) and ours(proc):
                        found.append(proc)
                except psutil.Error:  # a worker that just exited
                    pass
            return found

        return python_workers

    def score(self, df, model, **kwargs):
        import duotf.spark

        return duotf.spark.predict(df, model, **kwargs)

    def score_every_way(self, df, model, output, return_type="double", batch_size=1024):
        import duotf.spark

        from pyspark.sql import functions

        packed = duotf.spark.pack_tensors(df, "features")
        ways = {"predict on pack_tensors": self.score(packed, model, output=output,
                                                      return_type=return_type, batch_size=batch_size)}
        if hasattr(functions, "arrow_udf"):  # predict_udf: PySpark >= 4.1 (tests/test_spark_scoring.py
            # checks what it says below)
            udf = duotf.spark.predict_udf(model, return_type, batch_size=batch_size)
            ways["predict_udf on array<float>"] = df.withColumn(output, udf("features"))
        return ways

    def scoring_stats(self):
        import json

        from duotf.testing.suite import mains

        # one report per Python worker that runs a task of this job: as many tasks as there
        # are slots, at once, so each idle worker takes one
        reports = self.session.range(0, 64, numPartitions=16).mapInArrow(
            mains.scoring_stats, "pid long, stats string").collect()
        return {r.pid: json.loads(r.stats) for r in reports}

    def ml_stages(self):
        from duotf.spark import TFEstimator, TFModel

        return TFEstimator, TFModel, {}

    def model_at(self, path, **params):
        from duotf.spark import TFModel

        return TFModel(modelPath=path, **params)

    def apply_model(self, model, df):
        return model.transform(df)

    def model_path(self, model):
        return model.getModelPath()

    def save_and_load(self, model, folder):
        model.write().save(folder)
        # as the ml-pipelines guide saves: over the folder just written (on Connect too)
        model.write().overwrite().save(folder)
        return type(model).load(folder)

    def _task_error_text(self, exc):
        from pyspark.errors import PythonException

        # toPandas warns (an error, in the tests) with the task's error as its context
        found = exc
        while found is not None and not isinstance(found, PythonException):
            found = found.__cause__ or found.__context__
        if found is None:  # not a task's error: the test shows it
            raise exc
        return str(found)  # the task's traceback text: "duotf.errors.X: message" within


class SparkLocalEngine(SparkEngine):
    """Spark ``local[3]``: 2 nodes and 1 slot to feed them, all in one executor."""

    slots = 3

    @classmethod
    def _session(cls, request):
        return _spark_session("local[3]")


class SparkStandaloneEngine(SparkEngine):
    """A real standalone master and 2 workers (``spark_standalone_master``): 2 executors of 2
    cores, one for a node and one for the tasks that feed it."""

    slots = 4
    executors = 2

    @classmethod
    def _session(cls, request):
        url = request.getfixturevalue("spark_standalone_master")
        return _spark_session(url, **{"spark.executor.cores": "2", "spark.cores.max": "4",
                                      "spark.executor.memory": "1g", **EXECUTOR_C1})


class SparkConnectEngine(SparkEngine):
    """A Spark Connect session (``sc://``) of a real Connect server (``spark_connect_server``)
    whose application has 2 executors of 2 cores on the standalone cluster. No RDD, no
    ``sparkContext``: DataFrames are made from local data, a task a partition."""

    slots = 4
    executors = 2
    converts_in_jvm = False  # duotf's jar is not used on Connect: the frames come from Arrow

    @classmethod
    @contextlib.contextmanager
    def start(cls, request):
        # pyspark marks the whole process "remote" (SPARK_CONNECT_MODE_ENABLED) as a Connect
        # session starts, and its functions and ML classes then take the Connect path: unmarked
        # after, so that classic sessions later in this process work as before
        marked = "SPARK_CONNECT_MODE_ENABLED" in os.environ
        try:
            with super(SparkConnectEngine, cls).start(request) as engine:
                yield engine
        finally:
            if not marked:
                os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)

    @classmethod
    def _session(cls, request):
        from pyspark.sql import SparkSession

        cls.url = request.getfixturevalue("spark_connect_server")
        return SparkSession.builder.remote(cls.url).getOrCreate()

    def cli_args(self):
        return ["--spark-master", self.url]

    def _app_id(self) -> str:
        return self.session.conf.get("spark.app.id")

    def _df(self, parts: List[list], ddl: str):
        """A DataFrame of ``parts`` in as many partitions, in order: partition ``i`` of a
        ``range`` of ``len(parts)`` partitions makes the rows of ``parts[i]`` (local relations
        joined by ``union`` are merged into one partition by Spark's optimizer)."""
        from pyspark.sql.pandas.types import to_arrow_schema

        schema = self.session.createDataFrame([], ddl).schema
        arrow_schema = to_arrow_schema(schema)
        names = schema.names

        def make(batches):
            import pyarrow as pa
            from pyspark import TaskContext

            for _ in batches:
                pass
            rows = parts[TaskContext.get().partitionId()]
            if rows:
                yield pa.RecordBatch.from_pylist([dict(zip(names, row)) for row in rows],
                                                 schema=arrow_schema)

        n = max(len(parts), 1)
        if not parts:
            parts = [[]]
        # made once, kept where it was made: reading it runs no Python (a task of a later
        # mapInArrow then has one Python worker, as on a classic DataFrame of local rows)
        return self.session.range(0, n, 1, n).mapInArrow(make, schema).localCheckpoint(eager=True)

    def rows(self, parts):
        pytest.skip("a Spark Connect session has no RDD: rows feed as RDDs on classic Spark only")

    def row_sources(self, sources):
        pytest.skip("a Spark Connect session has no RDD: rows feed as RDDs on classic Spark only")

    def frame(self, frames):
        parts = [list(zip(*(f[c].tolist() for c in f.columns))) for f in frames]
        return self._df(parts, _spark_schema(dict(frames[0].dtypes)))

    def table(self, parts, schema):
        ddl = ", ".join(f"`{name}` {kind}" for name, kind in schema.items())
        return self._df([list(p) for p in parts], ddl)

    def arrays(self, blocks, packed: bool = True):
        from duotf.spark import pack_tensors

        first = blocks[0]
        tensors = [name for name, a in first.items() if a.ndim == 2]
        schema = _spark_schema({name: a.dtype for name, a in first.items()}, tensors)
        df = self._df([list(zip(*(a.tolist() for a in b.values()))) for b in blocks], schema)
        for name in tensors if packed else ():
            df = pack_tensors(df, name, dtype=str(first[name].dtype))
        return df, None

    def partitions(self, out):
        from pyspark.sql import Row
        from pyspark.sql import functions as F

        from duotf.backends.spark.tasks import arrow_counts

        n = len(out.select(F.lit(0).alias("_")).mapInArrow(arrow_counts, "p long, n long").collect())
        parts: List[list] = [[] for _ in range(n)]
        for row in out.withColumn("__partition", F.spark_partition_id()).collect():
            values = row.asDict()
            parts[values.pop("__partition")].append(Row(**values))
        return parts

    def work_names(self, job_id):
        pytest.skip("a Spark Connect client sees no job of the server's Spark UI")


class SparkHostsEngine(SparkStandaloneEngine):
    """A standalone cluster across 2 separate hosts (``spark_hosts_master``): one executor of 2
    cores on each, the driver on the bridge. Opt-in: it runs the tests that name it, those of
    feeding, inference, restarts and failures across hosts, not the whole suite."""

    opt_in = True

    @classmethod
    def _session(cls, request):
        cls.hosts, url = request.getfixturevalue("spark_hosts_master")
        ip = cls.hosts.driver_ip
        return _spark_session(url, **{"spark.executor.cores": "2", "spark.cores.max": "4",
                                      "spark.executor.memory": "1g", "spark.driver.host": ip,
                                      "spark.driver.bindAddress": ip})


class DaskHostsEngine(DaskEngine):
    """A Dask scheduler on the bridge and a worker on each of 2 separate hosts
    (``dask_hosts_scheduler``). Opt-in, as :class:`SparkHostsEngine`."""

    opt_in = True

    @classmethod
    @contextlib.contextmanager
    def start(cls, request):
        from distributed import Client

        cls.hosts, address = request.getfixturevalue("dask_hosts_scheduler")
        with Client(address) as client:
            client.wait_for_workers(cls.executors, timeout=120)
            yield cls(duotf.backends.resolve_backend(client)[0], client)


#: the ``backend`` fixture's params, in the order the suite runs them
ENGINES: Dict[str, Type[Engine]] = {
    "local": LocalEngine,
    "procpool": ProcessPoolEngine,
    "dask": DaskEngine,
    "spark-local": SparkLocalEngine,
    "spark-standalone": SparkStandaloneEngine,
    "spark-connect": SparkConnectEngine,
    "spark-hosts": SparkHostsEngine,
    "dask-hosts": DaskHostsEngine,
}
