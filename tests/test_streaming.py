"""Streaming input: a running cluster trained from a Spark Structured Streaming query
(``duotf.spark.feed_stream``) and from Dask futures (``duotf.dask.feed_stream``), on real
engines and real TF: the nodes read one continuous stream that ends with it, each micro-batch
is fed once across a restart of the query, and a failed micro-batch fails the query and the
nodes' feed."""

from __future__ import annotations

import os
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import duotf
from duotf.reports import DaskStreamReport, SparkStreamReport
from duotf.testing.suite.typed import mismatches
from examples import streaming
from tests.conftest import QUIET_TF
from tests.engines import poll_for
from tests.suite import mains


@pytest.fixture(scope="module", autouse=True)
def _callback_server(backend):
    """foreachBatch runs its function in the driver through py4j's callback server, which
    pyspark starts on first use and keeps for the session: started here, before the leak check
    of the first test notes the listening ports."""
    sc = getattr(backend, "sc", None)
    if sc is not None and hasattr(sc, "_gateway"):
        from pyspark.java_gateway import ensure_callback_server_started

        ensure_callback_server_started(sc._gateway)


@pytest.mark.engines("spark-local", "dask")
def test_the_streaming_example_trains_digits(backend, engine, tmp_path):
    """examples/streaming.py on small data: the digits program learns from the stream alone
    (one pass of its feed: the stream, until it ends)."""
    out = streaming.train_stream(engine.handle, str(tmp_path), passes=3, files_per_batch=2,
                                 env=QUIET_TF)
    counts = out["counts"]
    rows = 3 * 1438  # 3 passes of the 1,438 training rows (1,797 digits, a fifth held out)
    assert counts["ended"] and not counts["terminated"]
    assert counts["rows_fed"] + counts["rows_dropped"] == rows
    assert counts["rows_dropped"] < 2 * counts["chunks"]  # at most one row per worker a chunk
    if "batches_fed" in counts:  # Spark: 3 files, 2 a micro-batch
        assert counts["batches_fed"] == counts["chunks"] == 2 and counts["batches_skipped"] == 0
    else:
        assert counts["futures"] == 3 * 3
    assert out["accuracy"] >= 0.8, out  # 0.93-0.97 measured; a tenth of this without training


def _write_ids(folder, name: str, first: int, rows: int) -> None:
    pq.write_table(pa.table({"x": pa.array([float(i) for i in range(first, first + rows)]),
                             "id": pa.array(list(range(first, first + rows)), pa.int64())}),
                   os.path.join(folder, name))


def _ids(results) -> list:
    return sorted(i for r in results for ids in r["ids"].values() for i in ids)


@pytest.mark.engines("spark-local")
def test_a_micro_batch_replayed_after_a_restart_is_not_fed_again(backend, engine, tmp_path):
    """The first driver's query feeds three micro-batches, and its record of the last one's
    commit is lost (as when a driver dies after feeding a batch and before Spark commits it):
    the restarted query (same checkpoint, a new cluster) replays it, and skips it, then feeds
    the new file only, until stop() ends it. Every row reaches the nodes once across both."""
    spark = engine.handle
    source, checkpoint = tmp_path / "in", str(tmp_path / "checkpoint")
    source.mkdir()
    for k in range(3):
        _write_ids(source, f"part-{k}.parquet", 100 * k, 40)
    rows = spark.readStream.schema("x double, id long").option("maxFilesPerTrigger", 1).parquet(str(source))

    with duotf.run(mains.feed_train_main, {"batch": 7}, backend, duotf.ClusterSpec(workers=2),
                   env=QUIET_TF) as cluster:
        stream = duotf.spark.feed_stream(cluster, rows, checkpoint_location=checkpoint,
                                         trigger={"availableNow": True})
        first = stream.wait(timeout=240)
        first_ids = _ids(cluster.wait(timeout=120))
    assert first is not None and first["batches_fed"] == 3 and first["batches_skipped"] == 0
    assert first_ids == sorted(i for k in range(3) for i in range(100 * k, 100 * k + 40))
    # the last batch's commit is lost: Spark runs batch 2 again on restart
    for name in ("2", ".2.crc"):
        path = os.path.join(checkpoint, "commits", name)
        if os.path.exists(path):
            os.remove(path)
    _write_ids(source, "part-3.parquet", 300, 40)

    with duotf.run(mains.feed_train_main, {"batch": 7}, backend, duotf.ClusterSpec(workers=2),
                   env=QUIET_TF) as cluster:
        # a query that runs until stopped: stop() ends the nodes' feed after the rows fed
        stream = duotf.spark.feed_stream(cluster, rows, checkpoint_location=checkpoint,
                                         trigger={"processingTime": "100 milliseconds"})
        try:
            poll_for(lambda: stream.batches_fed >= 1, 240, what="the new file fed")
        finally:
            second = stream.stop()
        second_ids = _ids(cluster.wait(timeout=120))
    assert not stream.query.isActive and second["ended"]
    assert mismatches(first, SparkStreamReport) == mismatches(second, SparkStreamReport) == []
    assert second["batches_skipped"] == 1 and second["batches_fed"] == 1
    assert second_ids == list(range(300, 340))  # the replayed batch's rows are not fed again


@pytest.mark.engines("spark-local")
def test_a_micro_batch_that_fails_feeding_fails_the_query_and_the_nodes(backend, engine, tmp_path):
    """A null in a micro-batch: the query fails with the feed's FeedSchemaError, and the
    nodes' reads raise it (no node waits for data that will not come)."""
    spark = engine.handle
    source = tmp_path / "in"
    source.mkdir()
    pq.write_table(pa.table({"x": pa.array([1.0, None, 3.0, 4.0]), "id": pa.array([1, 2, 3, 4])}),
                   str(source / "nulls.parquet"))
    rows = spark.readStream.schema("x double, id long").parquet(str(source))
    with duotf.run(mains.feed_train_main, {"batch": 2}, backend, duotf.ClusterSpec(workers=2),
                   env=QUIET_TF) as cluster:
        stream = duotf.spark.feed_stream(cluster, rows, checkpoint_location=str(tmp_path / "ck"),
                                         trigger={"availableNow": True})
        with pytest.raises(duotf.errors.FeedSchemaError, match="null") as error:
            stream.wait(timeout=240)
        assert not stream.query.isActive and stream.query.exception() is not None
        with pytest.raises(duotf.errors.NodeError, match="null"):
            cluster.wait(timeout=120)
    assert error.value.column == "x"


def _frame(first: int, rows: int):
    import pandas as pd

    return pd.DataFrame({"x": [float(i) for i in range(first, first + rows)],
                         "id": list(range(first, first + rows))})


def _fails():
    raise OSError("the source is gone")


@pytest.mark.engines("dask")
def test_dask_futures_feed_one_stream_and_a_failed_future_fails_it(backend, engine):
    """Futures fed as they complete make one stream, which ends with the iterable; a future
    that fails ends every node's feed with its error."""
    client = engine.client
    with duotf.run(mains.feed_train_main, {"batch": 7}, backend, duotf.ClusterSpec(workers=2),
                   env=QUIET_TF) as cluster:
        futures = [client.submit(_frame, 50 * k, 50, pure=False) for k in range(5)]
        counts = duotf.dask.feed_stream(cluster, iter(futures))
        results = cluster.wait(timeout=120)
    assert counts["futures"] == 5 and counts["rows_fed"] == 250 and counts["ended"]
    assert mismatches(counts, DaskStreamReport) == []
    assert _ids(results) == list(range(250))
    assert all(r["epochs"] == 0 for r in results)  # no epoch marker: one stream

    with duotf.run(mains.feed_train_main, {"batch": 7}, backend, duotf.ClusterSpec(workers=2),
                   env=QUIET_TF) as cluster:
        futures = [client.submit(_frame, 0, 50, pure=False), client.submit(_fails, pure=False)]
        with pytest.raises(duotf.errors.FeedError, match="the source is gone"):
            duotf.dask.feed_stream(cluster, futures)
        with pytest.raises(duotf.errors.NodeError, match="the source is gone"):
            cluster.wait(timeout=120)


def _numbered(first: int, rows: int):
    import pandas as pd

    return pd.DataFrame({"0": [float(i) for i in range(first, first + rows)],
                         "1": list(range(first, first + rows))})


@pytest.mark.engines("dask")
def test_nodes_that_do_not_read_hold_the_stream_back(backend, engine, tmp_path):
    """Backpressure: each node reads one batch and stops reading. A node queues at most 8
    frames (a partition is one frame or more), so a stream of 30 partitions a node cannot be
    fed whole: feed_stream is still feeding when both nodes hold, and ends once they read on."""
    client = engine.client
    args = {"batch": 100, "hold": 100, "held": str(tmp_path / "held"),
            "release": str(tmp_path / "release")}
    with duotf.run(mains.feed_hold_main, args, backend, duotf.ClusterSpec(workers=2),
                   env=QUIET_TF) as cluster:
        futures = [client.submit(_numbered, 100 * k, 100, pure=False) for k in range(60)]
        counts = {}
        feeding = threading.Thread(target=lambda: counts.update(duotf.dask.feed_stream(cluster, futures)))
        feeding.start()
        try:
            poll_for(lambda: all(os.path.exists(f"{args['held']}-{rank}") for rank in (0, 1)),
                     120, what="both nodes holding")
            assert feeding.is_alive() and not counts  # the nodes' queues are full: it waits
        finally:
            open(args["release"], "w").close()
            feeding.join(120)
        assert not feeding.is_alive() and counts["rows_fed"] == 6000 and counts["ended"]
        results = cluster.wait(timeout=120)
    assert sorted(i for r in results for ids in r["ids"].values() for i in ids) == list(range(6000))
