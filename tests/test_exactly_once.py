"""Each row of an epoch reaches its node once, or the epoch fails: the node's side (FeedServer)
against engine retries of feeding tasks, and the driver's "fail" marker. No engine here: the
shared suite kills real feeding processes (tests/suite/test_feed_kill.py)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from duotf.errors import FeedError
from duotf._transport import wire
from duotf._transport.datafeed import DataFeed
from duotf._transport.server import FeedServer
from duotf._transport.feeder import FeedJob, feed_train
from tests.conftest import SECRET, poll_for


def _ids(start, stop):
    return {"id": np.arange(start, stop, dtype=np.int64)}


def _job(server, plan):
    return FeedJob(SECRET, [("127.0.0.1", server.port)], ["worker:0"], "train", 30, plan)


def _marker(server, marker, **fields):
    sock = wire.connect(("127.0.0.1", server.port), SECRET, 30)
    try:
        wire.send_frame(sock, wire.Frame.MARKER, marker=marker, **fields)
        return wire.recv_frame(sock)[0]["t"]
    finally:
        sock.close()


def _dying_attempt(server, seq, pid, rows):
    """A first attempt that takes its turn, delivers ``rows`` rows and dies (no END)."""
    sock = wire.connect(("127.0.0.1", server.port), SECRET, 30)
    wire.send_frame(sock, wire.Frame.ORDER, seq=seq, partition=pid)
    assert wire.recv_frame(sock)[0]["t"] == wire.Frame.TURN
    if rows:
        wire.send_frame(sock, wire.Frame.BATCH, _ids(0, rows))
    sock.close()


def _read_all(feed, until):
    seen = []
    while len(seen) < until:
        seen.extend(feed.next_batch(50)["id"])
    return seen


def test_a_retry_of_a_range_delivered_whole_sends_nothing_again():
    """A task acknowledged by the node, then run again by the engine (Dask recomputes a lost
    result, Spark retries a task whose executor died after it fed): the node says the range was
    delivered, the retry sends no row and reports the rows the first attempt delivered."""
    server = FeedServer(SECRET, capacity=64)
    job = _job(server, {0: [(0, 0, 100, 0)], 1: [(0, 0, 100, 1)]})
    try:
        assert feed_train(job, 0, [_ids(0, 100)]) == 100
        assert feed_train(job, 0, [_ids(0, 100)]) == 100  # the retry: nothing sent
        assert feed_train(job, 1, [_ids(100, 200)]) == 100
        assert _marker(server, wire.Marker.EPOCH) == wire.Frame.ACK
        assert feed_train(job, 0, [_ids(0, 100)]) == 100  # a new epoch delivers the range again
        assert _marker(server, wire.Marker.END) == wire.Frame.ACK
        feed = DataFeed(server, train=True, input_mapping={"id": "id"})
        seen = []
        while not feed.should_stop():
            seen.extend(feed.next_batch(64)["id"])
    finally:
        server.close()
    assert sorted(seen) == sorted(list(range(200)) + list(range(100)))


def test_a_retry_of_a_range_that_died_before_its_first_row_takes_its_turn():
    server = FeedServer(SECRET, capacity=64)
    job = _job(server, {0: [(0, 0, 100, 0)], 1: [(0, 0, 100, 1)]})
    later = threading.Thread(target=feed_train, args=(job, 1, [_ids(100, 200)]))
    try:
        later.start()  # waits for range 0
        _dying_attempt(server, 0, 0, rows=0)
        assert feed_train(job, 0, [_ids(0, 100)]) == 100
        later.join(30)
        feed = DataFeed(server, train=True, input_mapping={"id": "id"})
        seen = _read_all(feed, 200)
    finally:
        server.close()
    assert seen == list(range(200))


def test_a_range_that_broke_after_delivering_rows_fails_the_epoch_at_once():
    """The first attempt delivered 30 rows and died: the node tells its driver at once, refuses
    the engine's retry (it would send the 30 rows again) and every later range of the epoch,
    and no range waits on the dead one's turn."""
    reports = []
    server = FeedServer(SECRET, capacity=64, on_failure=reports.append)
    job = _job(server, {0: [(0, 0, 100, 0)], 3: [(0, 0, 100, 1)]})
    errors = []

    def later():
        try:
            feed_train(job, 3, [_ids(100, 200)])
        except FeedError as exc:
            errors.append(exc)

    waiting = threading.Thread(target=later)
    try:
        assert _marker(server, wire.Marker.EPOCH) == wire.Frame.ACK  # this is epoch 2
        waiting.start()
        _dying_attempt(server, 0, 0, rows=30)
        poll_for(lambda: reports, 10, what="the node's report")
        with pytest.raises(FeedError) as info:
            feed_train(job, 0, [_ids(0, 100)])  # the engine's retry
        waiting.join(30)
    finally:
        server.close()
    assert reports == [{"why": reports[0]["why"], "epoch": 2, "partition": 0, "seq": 0, "rows": 30}]
    assert "partition 0 of epoch 2 stopped after it delivered 30 rows" in reports[0]["why"]
    err = info.value
    first = str(err).splitlines()[0]
    assert first.startswith("feeding epoch 2 failed on worker:0: the engine retried the task "
                            "feeding partition 0 of epoch 2 after its first attempt died having "
                            "delivered 30 rows"), first
    assert (err.epoch, err.partition, err.node) == (2, 0, "worker:0")
    assert not waiting.is_alive() and len(errors) == 1
    assert "partition 0 of epoch 2 stopped after it delivered 30 rows" in str(errors[0])


def test_a_fail_marker_ends_the_nodes_reads_and_refuses_waiting_ranges():
    server = FeedServer(SECRET, capacity=64)
    job = _job(server, {0: [(0, 0, 100, 0)], 1: [(0, 0, 100, 1)]})
    errors = []

    def later():
        try:
            feed_train(job, 1, [_ids(100, 200)])
        except FeedError as exc:
            errors.append(exc)

    waiting = threading.Thread(target=later)
    feed = DataFeed(server, train=True, input_mapping={"id": "id"})
    try:
        waiting.start()  # waits for range 0, which never comes
        why = "feeding epoch 1 failed: KilledWorker: the worker died"
        assert _marker(server, wire.Marker.FAIL, why=why) == wire.Frame.ACK
        waiting.join(30)
        for read in (lambda: feed.next_batch(10), feed.should_stop):
            with pytest.raises(FeedError, match="the driver ended the feed: feeding epoch 1 failed: "
                                                "KilledWorker: the worker died"):
                read()
    finally:
        server.close()
    assert not waiting.is_alive() and len(errors) == 1 and why in str(errors[0])


def test_a_passed_turn_is_no_delivery_its_rows_come_late():
    """Spark's feed cache: a task whose file is on another host passes its turn; the partition
    is fed later from the DataFrame, on the same range, and delivered once."""
    from duotf._transport.feeder import pass_turn

    server = FeedServer(SECRET, capacity=64)
    job = _job(server, {0: [(0, 0, 100, 0)], 1: [(0, 0, 100, 1)]})
    try:
        pass_turn(job, 0)
        assert feed_train(job, 1, [_ids(100, 200)]) == 100
        assert feed_train(job, 0, [_ids(0, 100)]) == 100  # late, out of order
        assert feed_train(job, 0, [_ids(0, 100)]) == 100  # a retry of it: nothing sent
        feed = DataFeed(server, train=True, input_mapping={"id": "id"})
        seen = _read_all(feed, 200)
        assert server.queue.empty()
    finally:
        server.close()
    assert seen == list(range(100, 200)) + list(range(100))


def test_a_fail_marker_ends_reads_even_in_the_middle_of_a_frame():
    """Regression (CI, Spark standalone): a node that had read part of a frame when the fail
    marker came saw should_stop() true, so its main returned normally and wait() did not raise."""
    server = FeedServer(SECRET, capacity=64)
    job = _job(server, {0: [(0, 0, 100, 0)]})
    feed = DataFeed(server, train=True, input_mapping={"id": "id"})
    try:
        assert feed_train(job, 0, [_ids(0, 100)]) == 100
        assert list(feed.next_batch(10)["id"]) == list(range(10))  # 90 rows of the frame left
        assert _marker(server, wire.Marker.FAIL, why="feeding epoch 1 failed: lost") == wire.Frame.ACK
        for read in (feed.should_stop, lambda: feed.next_batch(10)):
            with pytest.raises(FeedError, match="the driver ended the feed: feeding epoch 1 failed"):
                read()
    finally:
        server.close()
