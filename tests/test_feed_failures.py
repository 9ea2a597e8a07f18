"""What a failed feed says: a feeding task whose data source raises, a connection that fails,
a node's report that names where the task ran, keepalive on feed connections, and Spark's
errors named by their cause. No engine here: tests/suite/test_feed_errors.py runs the same
failures in every engine's own tasks."""

from __future__ import annotations

import os
import socket
import threading

import numpy as np
import pytest

from duotf.errors import FeedError
from duotf._transport import wire
from duotf._transport.server import FeedServer
from duotf._transport.feeder import FeedJob, feed_train
from duotf.backends.spark.errors import job_error
from tests.conftest import SECRET, poll_for


def _job(port, plan, epoch=3):
    return FeedJob(SECRET, [("127.0.0.1", port)], ["worker:0 on here"], "train", 30, plan,
                   epoch=epoch)


def _source(start, stop, fail_at, chunk=10):
    """Chunks of ``chunk`` ids, a frame each; raises when the chunk at ``fail_at`` is due. (A
    node holds a feeding process's frames in its shared memory ring's 4 slots until they are
    read: no test here sends more than 4 frames unread.)"""
    for a in range(start, stop, chunk):
        if a - start == fail_at:
            raise RuntimeError(f"injected at {a}")
        yield {"id": np.arange(a, a + chunk, dtype=np.int64)}


def test_a_source_failing_mid_range_names_epoch_partition_node_rows_and_cause():
    reports = []
    server = FeedServer(SECRET, capacity=64, on_failure=reports.append)
    try:
        with pytest.raises(FeedError) as info:
            feed_train(_job(server.port, {0: [(0, 0, 100, 0)]}), 0, _source(0, 100, 30))
        poll_for(lambda: reports, 10, what="the node's report")
    finally:
        server.close()
    err = info.value
    assert str(err) == ("feeding epoch 3 failed on worker:0 on here: the task feeding partition 0 "
                        "failed after it sent 30 rows, its data source raised RuntimeError: "
                        "injected at 30")
    assert (err.epoch, err.partition, err.node, err.rows) == (3, 0, "worker:0 on here", 30)
    assert err.cause == "RuntimeError: injected at 30"
    assert isinstance(err.__cause__, RuntimeError)
    # the node's report names where the task ran: this process, on this host
    why = reports[0]["why"]
    assert (reports[0]["partition"], reports[0]["rows"]) == (0, 30)
    assert f"partition 0 of epoch 1 (pid {os.getpid()} on {socket.gethostname()}) stopped " \
           "after it delivered 30 rows" in why, why


def test_a_source_failing_before_its_first_row_gives_its_turn_back():
    reports = []
    server = FeedServer(SECRET, capacity=64, on_failure=reports.append)
    job = _job(server.port, {0: [(0, 0, 100, 0)], 1: [(0, 0, 100, 1)]}, epoch=1)
    later = threading.Thread(target=feed_train, args=(job, 1, _source(100, 200, None, 100)))
    try:
        later.start()  # waits for range 0
        with pytest.raises(FeedError) as info:
            feed_train(job, 0, _source(0, 100, 0, 100))
        assert feed_train(job, 0, _source(0, 100, None, 100)) == 100  # the engine's retry
        later.join(30)
        assert not later.is_alive()
    finally:
        server.close()
    err = info.value
    assert str(err).startswith("feeding epoch 1 failed on worker:0 on here: the task feeding "
                               "partition 0 failed before its first row, its data source raised "
                               "RuntimeError: injected at 0"), str(err)
    assert (err.epoch, err.partition, err.rows) == (1, 0, 0)
    assert reports == []  # nothing delivered: nothing to fail


def test_a_connection_that_fails_names_the_epoch():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens there now
    with pytest.raises(FeedError) as info:
        feed_train(_job(port, {2: [(0, 0, 10, 0)]}, epoch=4), 2, _source(0, 10, None))
    err = info.value
    assert str(err).startswith("feeding epoch 4 failed on worker:0 on here: feeding partition 2, "
                               "the connection failed (ConnectionRefusedError"), str(err)
    assert (err.epoch, err.partition, err.node) == (4, 2, "worker:0 on here")


def test_feed_connections_keep_alive_with_short_probes():
    """A feeding host lost without a FIN or RST would hold its range's turn for ever: the
    kernel probes an idle feed connection and fails its reads within about 25 s."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    try:
        wire.keepalive(server)
        assert server.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        if hasattr(socket, "TCP_KEEPIDLE"):  # Linux
            assert server.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == wire.KEEPALIVE_IDLE
            assert server.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == wire.KEEPALIVE_INTERVAL
            assert server.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == wire.KEEPALIVE_COUNT
        assert wire.KEEPALIVE_IDLE + wire.KEEPALIVE_INTERVAL * wire.KEEPALIVE_COUNT <= 30
    finally:
        for sock in (client, server, listener):
            sock.close()


class Py4JJavaError(Exception):
    """What py4j raises for a failed Spark job, as its text reads (a real one needs a JVM)."""


_PYTHON_FAILED = """An error occurred while calling o207.collectToPython.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 3.0 failed 1 times, most recent failure: Lost task 0.0 in stage 3.0 (TID 7) (127.0.0.1 executor driver): org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/usr/local/lib/python3.11/site-packages/pyspark/python/lib/pyspark.zip/pyspark/worker.py", line 2083, in main
    process()
  File "/tmp/job.py", line 12, in parse
    raise ValueError("bad record at offset 4096")
ValueError: bad record at offset 4096

\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:624)
\tat org.apache.spark.sql.execution.python.PythonArrowOutput$$anon$1.read(PythonArrowOutput.scala:118)
\tat org.apache.spark.scheduler.Task.run(Task.scala:147)
\tat java.base/java.lang.Thread.run(Thread.java:840)

Driver stacktrace:
\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:2898)
\tat org.apache.spark.scheduler.DAGScheduler.$anonfun$abortStage$2(DAGScheduler.scala:2834)
Caused by: org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/tmp/job.py", line 12, in parse
    raise ValueError("bad record at offset 4096")
ValueError: bad record at offset 4096
"""

_EXECUTOR_LOST = """An error occurred while calling o312.collectToPython.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage 5.0 failed 4 times, most recent failure: Lost task 1.3 in stage 5.0 (TID 23) (10.0.0.7 executor 2): ExecutorLostFailure (executor 2 exited caused by one of the running tasks) Reason: Remote RPC client disassociated. Likely due to containers exceeding thresholds, or network issues. Check driver logs for WARN messages.
Driver stacktrace:
\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:2898)
\tat org.apache.spark.scheduler.DAGScheduler.handleTaskSetFailed(DAGScheduler.scala:2833)
\tat org.apache.spark.util.EventLoop$$anon$1.run(EventLoop.scala:49)
"""


def test_spark_errors_are_named_by_their_cause_and_task():
    said = job_error(Py4JJavaError(_PYTHON_FAILED))
    assert said.cause == "ValueError: bad record at offset 4096"
    assert (said.partition, said.task) == (0, "Spark task 0.0 of stage 3.0 (TID 7) on 127.0.0.1 "
                                              "executor driver")
    said = job_error(Py4JJavaError(_EXECUTOR_LOST))
    assert said.cause == (
        "Lost task 1.3 in stage 5.0 (TID 23) (10.0.0.7 executor 2): ExecutorLostFailure "
        "(executor 2 exited caused by one of the running tasks) Reason: Remote RPC client "
        "disassociated. Likely due to containers exceeding thresholds, or network issues. Check "
        "driver logs for WARN messages.")
    assert (said.partition, said.task) == (1, "Spark task 1.3 of stage 5.0 (TID 23) on 10.0.0.7 "
                                              "executor 2")
    said = job_error(Py4JJavaError("py4j.protocol.Py4JNetworkError: Answer from Java side is empty"))
    assert said.cause == "Py4JJavaError: py4j.protocol.Py4JNetworkError: Answer from Java side is empty"
    assert (said.partition, said.task) == (None, None)
