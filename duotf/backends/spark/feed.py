"""The Spark backend's feed: its :class:`SparkFeed` adapter over a DataFrame (read with
``mapInArrow``), an RDD, or a :class:`~duotf.backends.spark.frames.FeedCache`; the functions its
tasks run are in :mod:`.tasks`, the kept frames in :mod:`.frames`.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Dict, List, Optional

from duotf.errors import ConfigError, InsufficientSlotsError
from duotf.reports import FeedAdapterReport
from duotf.backends.base import EngineJob, FeedAdapter, JobError, ThreadJob, work_name
from duotf.backends.spark.errors import job_error, one_line
from duotf.backends.spark.frames import (INDEX_SCHEMA, MIN_FREE_BYTES, MIN_FREE_FRACTION,
                                        CachedPartition, DataFrameKept, FeedCache, JvmKept,
                                        arrow_cached_files, arrow_source,
                                        cached_partition, rdd_spiller, spiller, sweep_here, sweeper,
                                        teed_partition)
from duotf.backends.spark.tasks import (ERROR_COLUMN, arrow_batches,
                                       arrow_counts, arrow_infer, arrow_some, arrow_train,
                                       cached_files, infer_rdd, is_error,
                                       raise_first, rdd_counts, train_rdd)

logger = logging.getLogger(__name__)

__all__ = ["SparkFeed"]


#: Epochs fed from kept frame files (:func:`feed_cache`, or a DataFrame converted once) go
#: without a Spark job where every node can open every file itself (all on one host, as in
#: local mode or a one-machine standalone cluster): the driver names each frame to its node
#: (a "file" frame: path, offset, length), and the node maps it from its own page cache. No
#: data passes through the driver. False: always a Spark job of feeding tasks, as across hosts.
BY_REFERENCE = True


class SparkFeed(FeedAdapter):
    """A Spark DataFrame (read with ``mapInArrow``), an RDD, or a :class:`FeedCache`."""

    @staticmethod
    def accepts(data) -> bool:
        return (hasattr(data, "mapInArrow") or hasattr(data, "mapPartitionsWithIndex")
                or isinstance(data, FeedCache))

    def __init__(self, backend, data, options=None):
        super().__init__(options)
        self.backend = backend
        self.client = backend.client
        if self.client.connect and not (hasattr(data, "mapInArrow") or isinstance(data, FeedCache)):
            raise ConfigError("a Spark Connect session feeds DataFrames only (it has no RDDs): "
                              f"pass a DataFrame of the session, not {type(data).__name__}")
        self.kept = None  # the FeedCache of a DataFrame converted once, in its first epoch
        self._converting = None  # the id of that cache, from the first epoch's start
        self.cache = data if isinstance(data, FeedCache) else None
        self.df = data if hasattr(data, "mapInArrow") else None
        self.rdd = None if self.df is not None or self.cache is not None else data
        self._source = None  # (the DataFrame read with mapInArrow, its tensor specs): arrow_source
        self.converted_in_jvm = False  # the kept frames were written by the JVM (_convert_in_jvm)
        self._by_reference: Optional[bool] = None  # whether the last epoch was fed by naming frames
        self.epochs_by_reference = 0  # epochs fed by naming kept frames (no Spark job)
        if self.cache is not None and self.cache.index is None:
            raise ConfigError(f"{self.cache!r} was unpersisted; make a new feed_cache()")

    def _job(self, job, call, task_partitions=None) -> EngineJob:
        # A group of its own (cancelled alone), described as the Spark UI shows it:
        # "duotf <job id>: feed epoch 3/10".
        group = f"{job.key_prefix}-{time.monotonic_ns()}"
        client, session = self.client, self._session()

        def scoped():
            with arrow_batches(session):
                return client.scoped(group, work_name(job.job_id, job.work), call)

        return ThreadJob(scoped, cancel=lambda: client.cancel(group), name="spark-feed",
                         task_partitions=task_partitions)

    def _session(self):
        """The SparkSession of the DataFrame read (directly or by a cache), else None."""
        source = self.df if self.df is not None else getattr(self.cache, "df", None)
        return getattr(source, "sparkSession", None)

    def _arrow(self):
        if self._source is None:
            self._source = arrow_source(self.df)
        return self._source

    def check_capacity(self, nodes: int) -> None:
        slots = self.backend.slots()
        if slots - nodes < 1:
            raise InsufficientSlotsError(
                f"feeding needs a free task slot beside the {nodes} node tasks, but Spark "
                f"({self.client.master}) has {slots} slots in all. Give each executor "
                "one more core than its nodes use (spark.executor.cores), or run local[N] with "
                "N > number of nodes.",
                needed=nodes + 1, available=slots, backend="spark",
            )

    def job_error(self, exc: BaseException) -> JobError:
        return job_error(exc)

    def counts(self) -> List[int]:
        if self.cache is not None:
            return list(self.cache.counts)
        opts = self.options
        if self.df is not None and opts.convert_once is not False and not opts.ragged:
            counts = self._convert_in_jvm()
            if counts is not None:
                return counts
        if self.df is not None:
            from pyspark.sql import functions as F

            # One literal column: Spark reads no data column just to count rows.
            collect = self.df.select(F.lit(0).alias("_")).mapInArrow(arrow_counts, "p long, n long").collect
            # every partition, empty ones too, answers with a row: a Connect session (no RDD)
            # knows the number of partitions from those rows
            counts = [] if self.client.connect else \
                [0] * self.df.select(F.lit(0)).rdd.getNumPartitions()  # the plan of df itself stays unmade
        else:
            collect = self.rdd.mapPartitionsWithIndex(rdd_counts).collect
            counts = [0] * self.rdd.getNumPartitions()
        # the Spark UI names it: "duotf <job id>: count rows"
        with arrow_batches(self._session()):
            rows = self.client.scoped(f"duotf-count-{self.options.job_id}-{time.monotonic_ns()}",
                                      work_name(self.options.job_id, "count rows"), collect)
        raise_first(n for _, n in rows if isinstance(n, str))
        counts += [0] * (max((p + 1 for p, _ in rows), default=0) - len(counts))
        for p, n in rows:
            counts[p] = n
        return counts

    def _convert_in_jvm(self) -> Optional[List[int]]:
        """The first pass of a DataFrame of numbers (numbers, arrays of numbers, tensor
        columns), fed one epoch or more: the JVM writes
        each partition into a feed frame file in its executor's local dir, and counts its rows,
        in one job (:func:`duotf.backends.spark.jvm.spill`): for one epoch as well, since this
        pass is about twice as fast as Arrow's and replaces the counting job (a local-disk copy
        of the data until ``train`` returns, within ``MIN_FREE_BYTES``). Every epoch is then fed from those files
        (:meth:`_train_cached`), and :meth:`close` deletes them. No row passes through Arrow
        or a Python worker, and no separate count is run. None (nothing done) where the
        DataFrame has another kind of column or the JVM helper is not usable: the first epoch
        then converts through Arrow (:meth:`_train_converting`). A partition the JVM did not
        write (one the feed refuses, or a near-full disk) is read from the DataFrame in every
        epoch, where the feed names a refused row."""
        import uuid

        from duotf.backends.spark import jvm
        cache_id = uuid.uuid4().hex[:16]
        # the DataFrame's plan is made here: under duotf's Arrow batches (its own Arrow steps)
        with arrow_batches(self._session()):
            spilled = jvm.spill(self.df, cache_id, 4 << 20, MIN_FREE_BYTES, MIN_FREE_FRACTION, ERROR_COLUMN)
            if spilled is None:
                return None
            index, kept = spilled[0], JvmKept(spilled[1])
            self._converting = cache_id  # close() sweeps the files of a pass that failed
            try:
                job_id = self.options.job_id
                rows = self.client.scoped(f"duotf-convert-{job_id}-{time.monotonic_ns()}",
                                          work_name(job_id, "convert once (count rows, keep feed frames)"),
                                          index.collect)
            except BaseException:
                kept.unpersist()
                raise
        out = [teed_partition(row) for row in rows]
        parts = sorted((entry for entry, _ in out), key=lambda p: p.pid)
        # each task reading the index runs where its entry, and so its file, is
        self.kept = self.cache = FeedCache(index.rdd.map(cached_partition), self.df, parts,
                                           list(self.df.columns), kept=kept)
        self.converted_in_jvm = True
        dropped = sum(1 for p in parts if not p.path)
        if dropped:
            logger.info("duotf: %d of %d partitions were not written to feed frames by the JVM (the "
                        "feed refuses a row of theirs, or an executor's local disk is near full: "
                        "see duotf.backends.spark.frames MIN_FREE_BYTES); they are read from the "
                        "DataFrame in every epoch", dropped, len(parts))
        counts = [0] * len(parts)
        for entry, rows in out:
            counts[entry.pid] = rows
        return counts

    def train(self, job) -> EngineJob:
        if self.cache is not None:
            if self._nodes_read_files(job):
                return ThreadJob(self._train_by_reference(job), cancel=lambda: None,
                                 name="feed-by-reference")
            return self._job(job, *self._train_cached(job))
        if job.epoch == 1 and job.epochs > 1 and self.options.convert_once is not False:
            return self._job(job, self._train_converting(job))
        if self.df is not None:
            def run_df():
                # packing reads the plan (AQE runs its shuffles then): in the job's group
                df, tensors = self._arrow()
                out = df.mapInArrow(arrow_train(job, tensors), f"rows long, {ERROR_COLUMN} string").collect()
                raise_first(row[ERROR_COLUMN] for row in out)
                return [row.rows for row in out]

            return self._job(job, run_df)
        rdd = self.rdd

        def run_rdd():
            out = rdd.mapPartitionsWithIndex(train_rdd(job)).collect()
            raise_first(error for _, error in out)
            return [sent for sent, _ in out]

        return self._job(job, run_rdd)

    def _nodes_read_files(self, job) -> bool:
        """Whether this epoch's kept frames may be named to the nodes, not sent
        (:data:`BY_REFERENCE`): every partition with a planned row has a kept file, and each
        node says it can open every file it is to read (asked before every epoch: a file can
        go with its executor). Otherwise the epoch is a Spark job, which feeds a partition
        whose file is gone from the DataFrame."""
        from duotf._transport import wire
        if not BY_REFERENCE:
            return False
        wanted: Dict[int, List[str]] = {}
        for part in self.cache.parts:
            for target, *_ in job.plan.get(part.pid, ()):
                if not part.path:
                    return False
                wanted.setdefault(target, []).append(part.path)
        ok = bool(wanted)
        for target, paths in wanted.items():
            try:
                with wire.connect(job.addresses[target], job.secret, job.timeout, job.tls) as sock:
                    ok = all(wire.probe_file(sock, path) for path in paths)
            except (OSError, wire.FeedProtocolError) as exc:
                logger.debug("duotf: asking %s whether it reads the kept frames: %s",
                             job.labels[target], exc)
                ok = False
            if not ok:
                break
        if ok != self._by_reference:
            logger.info("duotf: epoch %d fed from kept frames %s", job.epoch,
                        "by naming each frame to its node (no Spark job)" if ok else
                        "by Spark tasks (a node cannot open every file it is to read)")
        self._by_reference = ok
        return ok

    def _train_by_reference(self, job):
        """The engine call of an epoch fed from kept frames by the driver: for each partition,
        in partition order, the "file" frames of its ranges (a few threads: each range waits
        for its turn on its node, as a feeding task does)."""
        from concurrent.futures import ThreadPoolExecutor

        from duotf._transport.feeder import feed_train
        from duotf._transport.wire import FileRef

        parts = self.cache.parts
        self.epochs_by_reference += 1

        def feed(part):
            sent = feed_train(job, part.pid, [FileRef(rows, part.path, offset, length)
                                              for rows, offset, length in part.frames])
            self.partition_done(part.pid, sent)
            return sent

        def call():
            with ThreadPoolExecutor(max(1, min(len(parts), 2 * len(job.addresses))),
                                    "duotf-feed-ref") as pool:
                return list(pool.map(feed, parts))

        return call

    def _train_cached(self, job):
        """``(the engine call of a cached epoch, each task's partitions where a task feeds
        several)``."""
        cache = self.cache
        index, runs = cache.index, None
        free = max(self.backend.slots() - len(job.addresses), 1)
        if len({part.host for part in cache.parts}) == 1 and len(cache.parts) > free:
            # One host: every file is local to every task. One task per free slot, each
            # feeding a run of partitions, saves Spark's per-task cost, and with no locality
            # preference no task waits for the executor that holds an index entry. Across
            # hosts each partition keeps its own task, which Spark runs where its index entry
            # (and so its file) is.
            per = -(-len(cache.parts) // free)
            runs = [cache.parts[i:i + per] for i in range(0, len(cache.parts), per)]
            if not self.client.connect:
                index = self.backend.sc.parallelize(runs, len(runs)).flatMap(lambda run: run)

        def call():
            if self.client.connect:  # a DataFrame index (no RDD), or a range over the runs
                if runs is None:
                    feeding = index.mapInArrow(arrow_cached_files(job), _CACHED_SCHEMA)
                else:
                    feeding = self._session().range(0, len(runs), 1, len(runs)).mapInArrow(
                        arrow_cached_files(job, runs), _CACHED_SCHEMA)
                out = [(row.pid, row.rows, row[ERROR_COLUMN]) for row in feeding.collect()]
            else:
                out = index.mapPartitions(cached_files(job)).collect()
            raise_first(error for _, _, error in out)
            sent = {pid: rows for pid, rows, _ in out}
            missed = sorted(pid for pid, rows in sent.items() if rows is None)
            if missed:
                logger.info("duotf: %d cached partitions were on another host; feeding them "
                            "from the DataFrame", len(missed))
                source = cache.df  # a DataFrame, or the RDD converted in the first epoch
                if self.client.connect:
                    source, tensors = arrow_source(source)
                    fed = source.mapInArrow(arrow_some(arrow_train(job, tensors), missed),
                                            f"rows long, {ERROR_COLUMN} string").collect()
                    again = [(row.rows, row[ERROR_COLUMN]) for row in fed]
                elif hasattr(source, "mapInArrow"):
                    sc = self.backend.sc
                    source, tensors = arrow_source(source)
                    fed = source.mapInArrow(arrow_train(job, tensors),
                                            f"rows long, {ERROR_COLUMN} string").rdd
                    again = [(row.rows, row[ERROR_COLUMN]) for row in sc.runJob(fed, lambda rows: rows, missed)]
                else:
                    again = self.backend.sc.runJob(source.mapPartitionsWithIndex(train_rdd(job)),
                                                   lambda rows: rows, missed)
                raise_first(error for _, error in again)
                for pid, (rows, _) in zip(missed, again):
                    sent[pid] = rows
            return [sent[pid] for pid in sorted(sent)]

        # a lost task of a run is named by its partitions, not by its index
        return call, ([[part.pid for part in run] for run in runs] if runs else None)

    def _train_converting(self, job):
        """The first epoch of a DataFrame or RDD fed ``epochs > 1`` times: each task converts
        its partition into feed frames, feeds them, and keeps them in a file in its executor's
        local dir, as :func:`feed_cache` does; the later epochs are fed from those files
        (:meth:`_train_cached`), and :meth:`close` deletes them when ``train`` returns."""
        import uuid

        source, cache_id = (self.df if self.df is not None else self.rdd), uuid.uuid4().hex[:16]
        self._converting = cache_id

        def call():
            if self.client.connect:
                return self._convert_df_index(job, cache_id)
            if self.df is not None:
                read, tensors = self._arrow()
                task = spiller(cache_id, tensors, 4 << 20, job.ragged, job=job)
                teed = read.mapInArrow(task, INDEX_SCHEMA).rdd.map(teed_partition)
            else:
                teed = source.mapPartitionsWithIndex(rdd_spiller(cache_id, job.ragged, job)).map(
                    teed_partition)
            # Checkpointed, not just persisted: a lost block is never recomputed, since that
            # would run this epoch's feeding task again. Persisted too: PySpark pipelines a
            # map onto an RDD that is neither cached nor checkpointed (its Python flag), and
            # the index below would then run the feeding task every time it is read.
            from pyspark import StorageLevel

            teed.persist(StorageLevel.MEMORY_AND_DISK)
            teed.localCheckpoint()
            out = teed.collect()
            entries = [entry for entry, _ in out]
            parts = sorted((e for e in entries if isinstance(e, CachedPartition)), key=lambda p: p.pid)
            columns = list(source.columns) if self.df is not None else []
            cache = FeedCache(teed.map(lambda item: item[0]), source, parts, columns, kept=teed)
            errors = sorted((e for e in entries if isinstance(e, str)),
                            key=lambda e: json.loads(e)["partition"])
            if errors:
                cache.unpersist()
                raise_first(errors)
            self.kept = self.cache = cache
            dropped = sum(1 for p in parts if not p.path)
            if dropped:
                logger.warning("duotf: %d of %d partitions were not kept for the later epochs (their "
                               "executors' local disks were near full: see duotf.backends.spark.frames "
                               "MIN_FREE_BYTES); they are read from the DataFrame again",
                               dropped, len(parts))
            rows = {entry.pid: n for entry, n in out if isinstance(entry, CachedPartition)}
            return [rows[pid] for pid in sorted(rows)]

        return call

    def _convert_df_index(self, job, cache_id: str) -> List[int]:
        """The first epoch of :meth:`_train_converting` on a Spark Connect session: the index
        of kept frames is the feeding tasks' output, locally checkpointed as a DataFrame (made
        once, eagerly: a lost block is never recomputed, which would feed the epoch again);
        each later task that reads an entry runs where its block, and so its file, is."""
        read, tensors = self._arrow()
        task = spiller(cache_id, tensors, 4 << 20, job.ragged, job=job)
        index = read.mapInArrow(task, INDEX_SCHEMA).localCheckpoint(eager=True)
        out = [teed_partition(row) for row in index.collect()]
        parts = sorted((e for e, _ in out if isinstance(e, CachedPartition)), key=lambda p: p.pid)
        cache = FeedCache(index, self.df, parts, list(self.df.columns), kept=DataFrameKept(index))
        errors = sorted((e for e, _ in out if isinstance(e, str)), key=lambda e: json.loads(e)["partition"])
        if errors:
            cache.unpersist()
            raise_first(errors)
        self.kept = self.cache = cache
        rows = {entry.pid: n for entry, n in out if isinstance(entry, CachedPartition)}
        return [rows[pid] for pid in sorted(rows)]

    def partition_hosts(self) -> List[Optional[str]]:
        """The hosts of the kept frames (a DataFrame converted once, a ``feed_cache``), by
        their executors' host names; none before they are written."""
        if self.cache is None:
            return []
        hosts: List[Optional[str]] = [None] * (max((p.pid for p in self.cache.parts), default=-1) + 1)
        for part in self.cache.parts:
            hosts[part.pid] = part.host if part.path else None
        return hosts

    def report(self) -> FeedAdapterReport:
        report: FeedAdapterReport = {}
        if self.kept is not None:
            report["converted_once"] = True
            report["converted_in_jvm"] = self.converted_in_jvm
            report["partitions_kept"] = sum(1 for p in self.kept.parts if p.path)
        if self.cache is not None or self.kept is not None:
            report["epochs_fed_by_reference"] = self.epochs_by_reference
        return report

    def close(self) -> None:
        kept, self.kept = self.kept, None
        cache_id, self._converting = self._converting, None
        if kept is not None:
            if self.cache is kept:
                self.cache = None
            try:
                kept.unpersist()
                if cache_id is not None and self.client.local and not self.client.connect:
                    # local mode: the executor is this process's JVM, its dirs this host's; a
                    # task of the pass that wrote the frames may have left their folder
                    sweep_here(cache_id)
                return
            except Exception as exc:  # its index lived on an executor that is gone (a restart)
                index_error = exc
        elif cache_id is None:
            return
        else:
            index_error = None  # the first epoch failed: its tasks (some cancelled mid-write) kept no index
        try:
            # One sweeping task per slot, twice over, reaches every executor with a free slot;
            # Spark deletes its executors' local dirs, and what is left with them, when the
            # application ends (a lost executor's went with it).
            if cache_id is not None:
                n = 2 * max(self.backend.slots(), 1)
                self.backend.sc.parallelize(range(n), n).mapPartitions(sweeper(cache_id)).collect()
        except Exception as exc:  # Spark stopped under it: its local dirs go with the app
            index_error = exc
        if index_error is not None:
            logger.warning("duotf: could not delete every frame kept for the feed (duotf-feedcache-%s "
                           "in the executors' local dirs; Spark deletes them when the application "
                           "ends): %s", cache_id, one_line(index_error))

    def infer(self, job, keep, result_columns) -> EngineJob:
        if self.cache is not None:
            raise ConfigError("a FeedCache is for training; pass the DataFrame itself to inference()")
        if self.df is not None:
            return self._job(job, self._infer_df(job, keep, result_columns))
        rdd = self.rdd

        def run_rdd():
            from pyspark import StorageLevel

            out = rdd.mapPartitionsWithIndex(infer_rdd(job, keep))
            # Materialize now, while the nodes run. persist() also keeps PySpark from pipelining
            # count() past this RDD, which would leave the checkpoint unfilled.
            out.persist(StorageLevel.MEMORY_AND_DISK)
            out.localCheckpoint()
            raise_first(error for _, error in out.filter(is_error).take(1))
            return out.filter(lambda item: not is_error(item))

        return self._job(job, run_rdd)

    def _infer_df(self, job, keep, result_columns):
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        from duotf.backends.spark import jvm
        source = self.df
        keep = list(source.columns) if keep is None else list(keep)
        spec = result_columns or {"prediction": "double"}
        result_fields = source.sparkSession.createDataFrame(
            [], ", ".join(f"`{k}` {v}" for k, v in spec.items())).schema.fields

        def fields(schema):  # nullable: a task's error comes back as a row of nulls beside its message
            kept = [T.StructField(f.name, f.dataType, True, f.metadata) for f in (schema[k] for k in keep)]
            return kept + list(result_fields) + [T.StructField(ERROR_COLUMN, T.StringType(), True)]

        def answered(out):
            """``out`` computed once (the nodes answer while it is), locally checkpointed, and
            without its error column; the first error record a task returned raised."""
            out = out.localCheckpoint(eager=True)
            failed = out.where(F.col(ERROR_COLUMN).isNotNull()).select(ERROR_COLUMN).limit(1).collect()
            raise_first(row[0] for row in failed)
            return out.drop(ERROR_COLUMN)

        def run():
            missing = [name for name in keep if name not in source.columns]
            if missing:
                raise ConfigError(f"keep= names {missing}, which the DataFrame does not have "
                                  f"(it has {source.columns})")
            # array columns packed in the JVM (in the job's group)
            df, tensors = self._arrow()
            answers_only = T.StructType(list(result_fields) + [T.StructField(ERROR_COLUMN, T.StringType(), True)])
            answers = df.mapInArrow(arrow_infer(job, [], result_fields, tensors), answers_only)
            pair = jvm.answers_beside(source, keep, answers) if keep else (lambda out: out)
            if pair is not None:
                # Only the answers are kept; the kept columns are read from the DataFrame beside
                # them, never through Python, each time the result is read.
                return pair(answered(answers))
            # A DataFrame that may not give the same rows again: its kept columns go through the
            # nodes' tasks and are kept beside the answers (packed there, unpacked on the way out).
            schema, unpacked = T.StructType(fields(df.schema)), T.StructType(fields(source.schema))
            task = arrow_infer(job, schema.fields[:len(keep)], result_fields, tensors)
            out = answered(df.mapInArrow(task, schema))
            return jvm.unpack(out, T.StructType(unpacked.fields[:-1])) if unpacked != schema else out

        return run


#: what :func:`~duotf.backends.spark.frames.arrow_cached_files` yields
_CACHED_SCHEMA = f"pid long, rows long, {ERROR_COLUMN} string"
