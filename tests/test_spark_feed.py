"""Spark-only feed behaviour: ``duotf.spark.feed_cache``, and a train with no free task slot.

The tests take the shared suite's ``backend`` fixture, narrowed by the ``engines`` marker to
its Spark kinds, so they run in the suite's own Spark sessions (one at a time).
"""

from __future__ import annotations

import os
import time

import pytest

from duotf._driver.cluster import shutdown_quietly
import duotf
from duotf.spark import feed_cache
from duotf.testing import QUIET_TF
from tests.suite import mains
from tests.suite.data import FED, SIZES, fed_every_epoch, tensor_blocks

pytestmark = pytest.mark.engines("spark-local", "spark-standalone")


@pytest.fixture
def tensor_frame(engine):
    """``tensor_blocks(SIZES, 6)`` as a Spark DataFrame with an ``array<float>`` column ``x``."""
    df, _ = engine.arrays(tensor_blocks(SIZES, width=6), packed=False)
    return df


@pytest.mark.parametrize("by_reference", [True, False], ids=["named", "spark-tasks"])
def test_feed_cache_trains_like_the_dataframe(backend, tensor_frame, by_reference, monkeypatch):
    # each epoch fed by the driver naming the frames (files and nodes on one host, the default),
    # or by Spark's feeding tasks (as across hosts): the same rows either way
    import duotf.backends.spark.feed as spark_feed
    monkeypatch.setattr(spark_feed, "BY_REFERENCE", by_reference)
    cache = feed_cache(tensor_frame, block_bytes=64)  # a few rows per frame: frames split between workers
    try:
        assert cache.counts == SIZES and cache.columns == ["x", "id"]
        with duotf.run(mains.feed_tensor_main, {"batch": 4, "mapping": None}, backend,
                       duotf.ClusterSpec(workers=2), env=QUIET_TF) as cluster:
            report = cluster.train(cache, epochs=3)
            with pytest.raises(duotf.ConfigError, match="FeedCache is for training"):
                cluster.inference(cache)
            first, second = cluster.wait(timeout=120)
    finally:
        cache.unpersist()
    assert report["rows_fed"] == 3 * 44 and report["rows_dropped_per_epoch"] == 1
    assert report["epochs_fed_by_reference"] == (3 if by_reference else 0), report
    for result in (first, second):
        assert result["dtypes"] == ["float32"] and result["shapes"] == [(6,)]
        assert result["wrong"] == 0 and len(result["ids"]) == 3 * 22
    assert sorted(first["ids"] + second["ids"]) == sorted(FED * 3)


def test_feed_cache_file_not_on_the_host_is_fed_from_the_dataframe(backend, tensor_frame):
    cache = feed_cache(tensor_frame, block_bytes=64)
    try:
        assert all(os.path.exists(part.path) for part in cache.parts)
        for part in cache.parts[::2]:  # as if partitions 0, 2 and 4 lay on a lost host
            os.remove(part.path)
        with duotf.run(mains.feed_tensor_main, {"batch": 4, "mapping": None}, backend,
                       duotf.ClusterSpec(workers=2), env=QUIET_TF) as cluster:
            report = cluster.train(cache, epochs=2)
            cache.unpersist()
            assert not any(os.path.exists(part.path) for part in cache.parts)
            with pytest.raises(duotf.ConfigError, match="unpersisted"):
                cluster.train(cache)
            first, second = cluster.wait(timeout=120)
    finally:
        cache.unpersist()
    assert report["rows_fed"] == 2 * 44
    assert fed_every_epoch(first["ids"] + second["ids"], 2)
    # a node cannot open a file that is gone: each epoch is a Spark job, which feeds those
    # partitions from the DataFrame, not the driver naming frames
    assert report["epochs_fed_by_reference"] == 0, report


def test_feed_cache_checks_its_data_and_caches_a_column_declared_ragged(backend, engine, tmp_path):
    parts = [[(i, [i + k / 4 for k in range(i % 4)]) for i in range(p * 4, p * 4 + 4)] for p in range(3)]
    df = engine.table(parts, {"id": "long", "v": "array<float>"})
    with pytest.raises(duotf.FeedSchemaError) as info:
        feed_cache(df)
    err = info.value
    assert (err.column, err.partition, err.row, err.problem) == ("v", 0, 1, "ragged")
    assert str(err).startswith("column 'v': rows of different lengths: row 1 of partition 0 holds 1 values")
    nulls = engine.table([[(0, [1.0])], [(1, [1.0]), (2, None)]], {"id": "long", "v": "array<float>"})
    with pytest.raises(duotf.FeedSchemaError, match="column 'v': a null at row 1 of partition 1"):
        feed_cache(nulls)
    cache = feed_cache(df, ragged=["v"])
    try:
        args = {"batch": 3, "reader": "dataset", "id": "id", "v": "v"}
        with duotf.run(mains.feed_ragged_main, args, backend, duotf.ClusterSpec(workers=2),
                       env=QUIET_TF) as cluster:
            cluster.train(cache, epochs=1)
            first, second = cluster.wait(timeout=120)
    finally:
        cache.unpersist()
    assert {**first["rows"], **second["rows"]} == {i: v for part in parts for i, v in part}


def test_train_with_every_slot_taken_raises_before_any_spark_job(backend, engine, tmp_path):
    # one core per executor (TensorFlowOnSpark's usual setting) leaves no slot to feed from
    nodes = backend.slots()
    sc = engine.session.sparkContext
    data = engine.rows([[(1.0, 1)], [(2.0, 2)]])
    cluster = duotf.run(mains.block_main, {"release": str(tmp_path / "release")}, backend,
                        duotf.ClusterSpec(workers=nodes))
    try:
        jobs = set(sc.statusTracker().getJobIdsForGroup(None))
        t0 = time.monotonic()
        with pytest.raises(duotf.InsufficientSlotsError, match="feeding needs a free task slot"):
            cluster.train(data)
        assert time.monotonic() - t0 < 10
        assert set(sc.statusTracker().getJobIdsForGroup(None)) == jobs  # no count, no feed
    finally:
        (tmp_path / "release").touch()
        cluster.shutdown(grace_secs=30)


def test_duotf_jobs_cut_arrow_batches_at_4_mib_and_leave_the_session_as_it_was(backend, engine):
    from pyspark.sql import functions as F

    from duotf.backends.spark.tasks import ARROW_BATCH_BYTES, arrow_batches

    def batch_rows(batches):  # (local functions: pickled by value, for standalone's workers)
        import pyarrow as pa

        for batch in batches:
            yield pa.RecordBatch.from_pydict({"n": [batch.num_rows], "bytes": [batch.nbytes]})

    def tell_batch_rows(batches):
        import pyarrow as pa

        for batch in batches:
            yield pa.RecordBatch.from_arrays(
                [batch.column(0), pa.array([batch.num_rows] * batch.num_rows, pa.int64())], ["x", "rows"])

    session = engine.session
    conf = session._jsparkSession.sessionState().conf()
    key, records = "spark.sql.execution.arrow.maxBytesPerBatch", "spark.sql.execution.arrow.maxRecordsPerBatch"
    assert not conf.contains(key) and not conf.contains(records)
    # 3,000 rows of 784 floats (9.4 MB) in one partition: one batch at Spark's 10,000 records
    df = session.range(0, 3000, numPartitions=1).select(
        F.array_repeat(F.col("id").cast("float"), 784).alias("x"))

    def batches():
        return [tuple(r) for r in df.mapInArrow(batch_rows, "n long, bytes long").collect()]

    assert [n for n, _ in batches()] == [3000]
    if int(session.version.split(".")[0]) < 4:
        # Spark 3.5 cuts batches by records only: duotf's jobs leave the session alone there
        with arrow_batches(session):
            assert not conf.contains(key) and not conf.contains(records)
            assert [n for n, _ in batches()] == [3000]
        return
    with arrow_batches(session):
        with arrow_batches(session):  # a second duotf job of the session meanwhile
            pass
        assert session.conf.get(key) == str(ARROW_BATCH_BYTES)  # still held by the first
        cut = batches()
    assert not conf.contains(key)
    assert sum(n for n, _ in cut) == 3000 and len(cut) >= 3
    assert all(size <= ARROW_BATCH_BYTES + 784 * 4 + 1024 for _, size in cut), cut

    # a session that sets its batches keeps them
    session.conf.set(records, "1000")
    try:
        with arrow_batches(session):
            assert not conf.contains(key)
            assert [n for n, _ in batches()] == [1000, 1000, 1000]
        assert session.conf.get(records) == "1000"
    finally:
        session.conf.unset(records)

    # train()'s jobs run with it (its converting epoch too, an RDD job), and leave the session
    # as they found it: an Arrow step of the user's own DataFrame tells each row the size of
    # the batch it came in
    with duotf.run(mains.feed_train_main, {"batch": 500}, backend, duotf.ClusterSpec(workers=2),
                   env=QUIET_TF) as cluster:
        cluster.train(df.mapInArrow(tell_batch_rows, "x array<float>, rows long"), epochs=2)
        results = cluster.wait(timeout=120)
    seen = [v for r in results for epoch in r["ids"].values() for v in epoch]
    assert len(seen) == 6000 and max(seen) < 3000 and sum(seen) < 6000 * 3000, sorted(set(seen))
    assert not conf.contains(key) and not conf.contains(records)


@pytest.mark.engines("spark-local")
@pytest.mark.parametrize("column, value, problem", [
    ("id", None, "null"), ("x", None, "null"), ("v", None, "null"), ("v", [1.0, None], "null"),
    ("v", [1.0, 2.0, 3.0], "ragged"),
])
def test_a_dataframe_of_numbers_written_by_the_jvm_still_names_a_refused_row(backend, engine, tmp_path,
                                                                            column, value, problem):
    from tests.suite.data import kept_frame_folders

    # numbers only: the JVM writes the frames (duotf.backends.spark.jvm.spill); partition 1 holds the bad row,
    # which it leaves to the DataFrame's own feed, where the row is named
    parts = [[(i, i / 4, [float(i), i + 0.25]) for i in range(p * 4, p * 4 + 4)] for p in range(3)]
    row = list(parts[1][2])
    row[["id", "x", "v"].index(column)] = value
    parts[1][2] = tuple(row)
    schema = {"id": "long", "x": "double", "v": "array<float>"}
    before = kept_frame_folders()
    cluster = duotf.run(mains.block_main, {"release": str(tmp_path / "release")}, backend,
                        duotf.ClusterSpec(workers=1))
    try:
        with pytest.raises(duotf.FeedSchemaError) as info:
            cluster.train(engine.table(parts, schema), epochs=2, feed_timeout=60)
        assert not kept_frame_folders() - before
    finally:
        (tmp_path / "release").touch()
        shutdown_quietly(cluster)
    err = info.value
    assert (err.column, err.partition, err.row, err.problem) == (column, 1, 2, problem)


def _lineage(df) -> str:
    return df._jdf.queryExecution().toRdd().toDebugString()


@pytest.mark.parametrize("paired", [True, False], ids=["paired-in-jvm", "kept-through-tasks"])
def test_answers_that_span_several_arrow_batches_stay_beside_their_rows(backend, engine, paired,
                                                                        monkeypatch):
    """Keep every column: each answer goes out beside the very input row it answers, where a
    node's block of answers (8 rows) spans several of the task's Arrow batches (3 rows each,
    the session's own setting, which duotf keeps). Both ways: the kept columns paired with the
    kept answers in the JVM (a DataFrame that gives the same rows again), or sent back by the
    feeding tasks beside the answers (any other)."""
    from duotf.backends.spark import jvm
    from tests.suite.data import frames, row_parts

    if not paired:
        monkeypatch.setattr(jvm, "answers_beside", lambda *args: None)
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    engine.session.conf.set(key, "3")
    try:
        df = engine.frame(frames(row_parts(), ["x", "y"]))
        with duotf.run(mains.feed_infer_main, {"batch": 8}, backend, duotf.ClusterSpec(workers=2)) as cluster:
            out = cluster.inference(df, result_columns={"prediction": "double"})
            cluster.wait(timeout=60)
        pdf = engine.to_pandas(out)
    finally:
        engine.session.conf.unset(key)
    assert ("ZippedPartitionsRDD2" in _lineage(out)) == paired
    assert list(pdf.columns) == ["x", "y", "prediction"]
    assert pdf["y"].tolist() == list(range(45))
    assert pdf["prediction"].tolist() == [x * 2 + y for x, y in zip(pdf["x"], pdf["y"])]
    assert pdf["prediction"].tolist() == [i / 10 * 2 + i for i in range(45)]


def _plain_frame(engine):
    from tests.suite.data import frames, row_parts

    return engine.frame(frames(row_parts(), ["x", "y"]))


def _noisy_frame(engine):
    """``row_parts()`` as a DataFrame of ``x`` (drawn anew each time the DataFrame is computed:
    a UDF declared nondeterministic) and ``y``."""
    import random

    from pyspark.sql import functions as F

    draw = F.udf(lambda y: random.random() + y, "double").asNondeterministic()
    return _plain_frame(engine).withColumn("x", draw(F.col("y")))


@pytest.mark.parametrize("source", ["drawn-anew", "shuffled"])
def test_inference_of_a_dataframe_that_may_differ_keeps_the_rows_it_answered(backend, engine, source):
    """A DataFrame that gives other rows each time it is computed (a column drawn at random),
    or may give them in another order (a shuffle): the rows the nodes answered are the rows kept
    beside the answers, however often the result is read, never a second draw beside the first
    draw's answers."""
    df = _noisy_frame(engine)
    if source == "shuffled":
        from pyspark.sql import functions as F

        df = _plain_frame(engine).repartition(3, "y").withColumn("x", F.col("x") + 0.5)
    with duotf.run(mains.feed_infer_main, {"batch": 8}, backend, duotf.ClusterSpec(workers=2)) as cluster:
        out = cluster.inference(df, result_columns={"prediction": "double"})
        cluster.wait(timeout=60)
    assert "ZippedPartitionsRDD2" not in _lineage(out)
    first, second = engine.to_pandas(out), engine.to_pandas(out)
    assert sorted(first["y"].tolist()) == list(range(45))
    assert first["prediction"].tolist() == [x * 2 + y for x, y in zip(first["x"], first["y"])]
    assert first.equals(second)


def test_inference_result_read_after_its_dataframe_changed_fails_naming_the_partition(
        backend, engine, tmp_path):
    """The kept columns are read from the DataFrame again beside the kept answers. A DataFrame
    that passes for repeatable (a UDF that does not declare that it reads a file) but comes back
    with fewer rows fails the read, naming the partition: no row is left beside another's answer."""
    from pyspark.sql import functions as F

    gone = str(tmp_path / "gone")
    keep_row = F.udf(lambda y: not (y == 3 and os.path.exists(gone)), "boolean")
    df = _plain_frame(engine).where(keep_row(F.col("y")))
    with duotf.run(mains.feed_infer_main, {"batch": 8}, backend, duotf.ClusterSpec(workers=2)) as cluster:
        out = cluster.inference(df, keep=["y"], result_columns={"prediction": "double"})
        cluster.wait(timeout=60)
    assert "ZippedPartitionsRDD2" in _lineage(out)
    assert engine.to_pandas(out)["y"].tolist() == list(range(45))
    open(gone, "w").close()
    with pytest.raises(Exception) as info:
        engine.to_pandas(out)
    assert "duotf: partition 0 of the DataFrame given to inference()" in str(info.value)
    assert "persist()" in str(info.value)


def test_inference_keeping_a_column_the_dataframe_lacks_is_refused_by_name(backend, engine):
    with duotf.run(mains.feed_infer_main, {"batch": 8}, backend, duotf.ClusterSpec(workers=2)) as cluster:
        try:
            with pytest.raises(duotf.ConfigError, match=r"\['nope'\]"):
                cluster.inference(_plain_frame(engine), keep=["y", "nope"])
        finally:
            shutdown_quietly(cluster)


def test_a_failed_spark_job_says_its_python_error_and_the_task_it_lost(engine):
    # The planner reads a failed feed or count job only through SparkFeed.job_error: here real
    # Spark jobs whose task of partition 2 raises: the Python error is named (pyspark relays it
    # without the task, as a PythonException). A lost task's text (which names the task and so
    # its partition) is read in tests/test_feed_failures.py. A task that killed its Python worker
    # here was left out: in the 3.5 leg, a later task of the same session then failed with a
    # closed socket in PythonRunner.
    from duotf.backends.spark.errors import job_error

    def fail_row(x):
        if x == 2:
            raise ValueError("row 2 is bad")
        return x

    with pytest.raises(Exception) as info:
        engine.session.sparkContext.parallelize(range(4), 4).map(fail_row).collect()
    assert job_error(info.value).cause.startswith("ValueError: row 2 is bad"), job_error(info.value)

    def fail(batches):
        for batch in batches:
            if batch.num_rows and batch.column(0)[0].as_py() == 2:
                raise ValueError("row 2 is bad")
            yield batch

    df = engine.session.range(0, 4, 1, 4)
    with pytest.raises(Exception) as info:
        df.mapInArrow(fail, df.schema).collect()
    assert job_error(info.value).cause.startswith("ValueError: row 2 is bad"), job_error(info.value)
