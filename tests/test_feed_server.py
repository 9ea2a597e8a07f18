"""The node's feed server in one process: frames to a node on this host through a reused
shared memory ring (or over TCP where it cannot open one), and the ranges queued in plan order
whichever feeding task comes first."""

from __future__ import annotations

import numpy as np
import pytest

from duotf._transport import wire
from duotf._transport.datafeed import DataFeed
from duotf._transport.server import FeedServer
from tests.conftest import SECRET


def _feed_partitions(server, partitions, monkeypatch, frame_bytes=64 << 10, between=None):
    """Feed ``partitions`` (lists of chunks) to one node in turn, as separate feeding tasks, in
    a thread (calling ``between()`` after each); return the thread and the rows each sent."""
    import threading

    from duotf._transport import feeder
    monkeypatch.setattr(feeder, "FRAME_BYTES", frame_bytes)
    counts = [sum(wire.unpack_frame(c.data)[0]["rows"] if isinstance(c, wire.Packed) else len(c["id"])
                  for c in chunks) for chunks in partitions]
    job = feeder.FeedJob(SECRET, [("127.0.0.1", server.port)], ["node"], "train", 30,
                         {pid: [(0, 0, n, pid)] for pid, n in enumerate(counts)})
    sent = []

    def push():
        for pid, chunks in enumerate(partitions):
            sent.append(feeder.feed_train(job, pid, chunks))
            if between:
                between()
        sock = wire.connect(("127.0.0.1", server.port), SECRET, 30)
        wire.send_frame(sock, "marker", marker="end")
        wire.recv_frame(sock)
        sock.close()

    pusher = threading.Thread(target=push)
    pusher.start()
    return pusher, sent


def _read_ids(server, pusher):
    """Every id the node reads until the feed ends; then the pusher is joined, the server closed."""
    feed = DataFeed(server, train=True, input_mapping={"id": "id"})
    seen = []
    try:
        while not feed.should_stop():
            seen.extend(feed.next_batch(1000)["id"])
    finally:
        pusher.join()
        server.close()
    return seen


def _ids(start, stop):
    ids = np.arange(start, stop, dtype=np.int64)
    return {"id": ids, "x": np.repeat(ids[:, None], 5, axis=1).astype(np.float32)}


def test_frames_to_a_node_on_this_host_go_through_a_reused_shared_memory_ring(monkeypatch):
    import collections
    import os

    from duotf._transport import shm
    shm.close_idle()
    before = set(os.listdir(shm.SHM_DIR))
    big = wire.Packed(20_000, wire.pack_frame(_ids(30_000, 50_000)))  # 480 kB: over a slot
    partitions = [[_ids(0, 15_000)], [_ids(15_000, 30_000), big]]
    server = FeedServer(SECRET, capacity=2)
    pusher, sent = _feed_partitions(server, partitions, monkeypatch)
    feed = DataFeed(server, train=True, input_mapping={"id": "id", "x": "x"})
    held = collections.deque()  # the last batches read, still views of their frames
    seen = []
    try:
        while not feed.should_stop():
            batch = feed.next_batch(500)
            held.append((batch, batch["id"].copy()))
            if len(held) > 2:  # a slot is written again only once no batch refers to it
                old, ids = held.popleft()
                assert np.array_equal(old["id"], ids) and np.array_equal(old["x"][:, 4], ids)
                seen.extend(ids)
    finally:
        pusher.join()
    seen.extend(i for _, ids in held for i in ids)
    held.clear()
    assert sent == [15_000, 35_000] and seen == list(range(50_000))
    # one ring served both feeds (the second took it back from the pool), and every slot is free
    assert len(server._rings) == 1 and not next(iter(server._rings.values())).held
    # unlinked as soon as the node opened it (this test's ring alone: tests beside it on other
    # xdist workers make rings of their own in the same /dev/shm)
    names = list(server._rings)
    assert names and all(name for name in names)
    mine = [f for f in set(os.listdir(shm.SHM_DIR)) - before if any(name in f for name in names)]
    assert not mine, mine
    assert shm.close_idle() == 1
    server.close()


def test_a_node_that_cannot_open_a_ring_is_fed_over_tcp(monkeypatch):
    from duotf._transport import shm
    def refuse(header):
        raise OSError(f"{header['path']}: not visible from this node")

    monkeypatch.setattr(FeedServer, "_open_ring", staticmethod(refuse))
    monkeypatch.setattr(shm, "_refused", {})
    server = FeedServer(SECRET)
    pusher, sent = _feed_partitions(server, [[_ids(0, 10_000)], [_ids(10_000, 20_000)]], monkeypatch)
    seen = _read_ids(server, pusher)
    assert sent == [10_000, 10_000] and seen == list(range(20_000))
    assert not server._rings and len(shm._refused) == 1  # asked once, then TCP only


def test_a_node_that_refused_a_ring_is_asked_again_once_the_refusal_expired(monkeypatch):
    from duotf._transport import shm
    asked = []

    def refuse(header):
        asked.append(header["ring"])
        raise OSError(f"{header['path']}: not visible from this node")

    monkeypatch.setattr(FeedServer, "_open_ring", staticmethod(refuse))
    monkeypatch.setattr(shm, "_refused", type(shm._refused)())
    server = FeedServer(SECRET)
    refusal = iter([0.0, 3600.0])  # after the first feed: expired at once; after the second: not

    def between():
        monkeypatch.setattr(shm, "REFUSAL_S", next(refusal, 3600.0), raising=False)

    partitions = [[_ids(0, 10_000)], [_ids(10_000, 20_000)], [_ids(20_000, 30_000)]]
    pusher, sent = _feed_partitions(server, partitions, monkeypatch, between=between)
    seen = _read_ids(server, pusher)
    assert sent == [10_000] * 3 and seen == list(range(30_000))
    assert len(asked) == 2  # refused, asked again once that expired, then fed over TCP


def test_a_ring_the_node_let_go_is_replaced_by_a_new_one(monkeypatch):
    from duotf._transport import shm
    shm.close_idle()
    server = FeedServer(SECRET)
    rings = []

    def forget():  # what the node does with idle rings beyond the newest few
        rings.extend(server._rings)
        server._rings.clear()

    pusher, sent = _feed_partitions(server, [[_ids(0, 10_000)], [_ids(10_000, 20_000)]], monkeypatch,
                                    between=forget)
    seen = _read_ids(server, pusher)
    assert sent == [10_000, 10_000] and seen == list(range(20_000))
    assert len(rings) == 2 and rings[0] != rings[1]  # the pooled ring was refused, a new one taken
    assert shm.close_idle() == 1  # the new one; the refused one was closed at once


@pytest.mark.parametrize("path", ["/tmp/duotf-feedshm-x", "/dev/shm/other-x", None])
def test_a_node_opens_only_rings_in_dev_shm(path):
    with pytest.raises(wire.FeedProtocolError, match="not a feed ring|not known here"):
        FeedServer._open_ring({"ring": "x", "path": path, "slots": 1, "slot_bytes": 4096})


def test_a_node_queues_its_ranges_in_plan_order_whichever_task_comes_first():
    """Two feeding tasks of one epoch: the later range's task connects first, and waits."""
    import threading

    from duotf._transport.feeder import FeedJob, feed_train

    server = FeedServer(SECRET, capacity=2)
    job = FeedJob(SECRET, [("127.0.0.1", server.port)], ["node"], "train", 30,
                  {0: [(0, 0, 100, 0)], 1: [(0, 0, 100, 1)]})
    second = threading.Thread(target=feed_train, args=(job, 1, [_ids(100, 200)]))
    second.start()  # seq 1 first: the node does not read it before seq 0 is queued
    first = threading.Thread(target=feed_train, args=(job, 0, [_ids(0, 100)]))
    first.start()
    feed = DataFeed(server, train=True, input_mapping={"id": "id"})
    seen = []
    try:
        while len(seen) < 200:
            seen.extend(feed.next_batch(25)["id"])
    finally:
        first.join(30)
        second.join(30)
        server.close()
    assert seen == list(range(200))


def test_a_range_waiting_longer_than_feed_timeout_for_its_turn_is_not_failed(monkeypatch):
    """The node says it waits while an earlier range is still read: feed_timeout counts only a
    node that says nothing (the earlier range here takes 2.5 s; feed_timeout is 1 s)."""
    import threading

    import duotf._transport.wire as feed_wire
    from duotf._transport.feeder import FeedJob, feed_train

    monkeypatch.setattr(feed_wire, "WAIT_S", 0.2)
    server = FeedServer(SECRET, capacity=2)
    job = FeedJob(SECRET, [("127.0.0.1", server.port)], ["node"], "train", 1.0,
                  {0: [(0, 0, 100, 0)], 1: [(0, 0, 100, 1)]})
    release = threading.Event()
    errors = []

    def slow_partition():
        release.wait(30)  # the first range's rows are not there yet
        yield _ids(0, 100)

    def feed(pid, chunks):
        try:
            feed_train(job, pid, chunks)
        except Exception as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    second = threading.Thread(target=feed, args=(1, [_ids(100, 200)]))
    second.start()
    first = threading.Thread(target=feed, args=(0, slow_partition()))
    first.start()
    timer = threading.Timer(2.5, release.set)
    timer.start()
    feed_ = DataFeed(server, train=True, input_mapping={"id": "id"})
    seen = []
    try:
        while len(seen) < 200 and not errors:
            seen.extend(feed_.next_batch(25)["id"])
    finally:
        timer.join()
        first.join(30)
        second.join(30)
        server.close()
    assert not errors and seen == list(range(200))
