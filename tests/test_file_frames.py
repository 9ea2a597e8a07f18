"""Feed frames kept in files on the executors: read by a node on their host (whole or sliced)
or sent by a feeding task, counted as crossed only when they come from another host, and
refused when a frame or slice lies outside its file; every numeric column aligned."""

from __future__ import annotations

import numpy as np
import pytest

from duotf._transport import wire
from duotf._transport.datafeed import DataFeed
from duotf._transport.server import FeedServer
from tests.conftest import SECRET


def _cache_file(folder, frames):
    """Write packed frames of ids (row counts ``frames``) to ``folder``; return FileFrames."""
    import os

    os.makedirs(folder, exist_ok=True)
    path, out, offset, start = os.path.join(folder, "part-00000"), [], 0, 0
    with open(path, "wb") as f:
        for n in frames:
            ids = np.arange(start, start + n, dtype=np.int64)
            data = wire.pack_frame({"id": ids})
            f.write(data)
            out.append((n, offset, len(data)))
            offset, start = offset + len(data), start + n
    return path, out


def _drain(server, push, n: int = 7) -> list:
    """The rows a node's feed takes ``next_batch(n)`` at a time while ``push`` feeds ``server``
    from a thread of its own; the server is closed after."""
    import threading

    pusher = threading.Thread(target=push)
    rows = []
    try:
        pusher.start()
        feed = DataFeed(server, train=True)
        while not feed.should_stop():
            rows.extend(feed.next_batch(n))
    finally:
        pusher.join()
        server.close()
    return rows


@pytest.mark.parametrize("folder, node_reads", [("duotf-feedcache-t", True), ("elsewhere", False)])
def test_cached_file_frames_reach_the_node_read_there_or_sent(tmp_path, folder, node_reads):
    from duotf._transport.feeder import FeedJob, feed_train

    path, frames = _cache_file(str(tmp_path / folder), [40, 25, 35])
    server = FeedServer(SECRET, capacity=64)
    # the second frame is split between two "nodes" (one server here: its ranges are seq 0 and 1,
    # as a node never has two ranges of one seq: a second is taken for a retry)
    plan = {0: [(0, 0, 50, 0), (1, 50, 100, 1)]}
    job = FeedJob(SECRET, [("127.0.0.1", server.port)] * 2, ["a", "b"], "train", 30, plan)
    sent = []
    probes = []
    real_reads_files = wire.reads_files

    def spy(sock, frame, *args):
        probes.append(real_reads_files(sock, frame, *args))
        return probes[-1]

    def push():
        with open(path, "rb") as f:
            sent.append(feed_train(job, 0, [wire.FileFrame(n, f, o, length) for n, o, length in frames]))
        sock = wire.connect(("127.0.0.1", server.port), SECRET, 30)
        wire.send_frame(sock, "marker", marker="end")
        wire.recv_frame(sock)
        sock.close()

    wire.reads_files = spy
    try:
        ids = _drain(server, push)
    finally:
        wire.reads_files = real_reads_files
    assert sent == [100] and sorted(ids) == list(range(100))
    # a node on this host reads the file itself when it may (a feed cache folder); else sendfile
    assert probes and set(probes) == {node_reads}


def test_named_file_frames_are_read_by_the_node_whole_or_sliced(tmp_path):
    """The driver's feed of kept frames (FileRef): it never opens the file; the node reads each
    frame, and only the rows of a frame that a range takes where the plan splits it."""

    from duotf._transport.feeder import FeedJob, feed_train

    path, frames = _cache_file(str(tmp_path / "duotf-feedcache-t"), [40, 25, 35])
    server = FeedServer(SECRET, capacity=64)
    plan = {0: [(0, 0, 50, 0), (1, 50, 100, 1)]}  # the second frame's rows 10..25 go to "b"
    job = FeedJob(SECRET, [("127.0.0.1", server.port)] * 2, ["a", "b"], "train", 30, plan)
    sent = []

    def push():
        with wire.connect(("127.0.0.1", server.port), SECRET, 30) as sock:
            assert wire.probe_file(sock, path)
            assert not wire.probe_file(sock, str(tmp_path / "duotf-feedcache-t" / "gone"))
        sent.append(feed_train(job, 0, [wire.FileRef(n, path, o, length) for n, o, length in frames]))
        sock = wire.connect(("127.0.0.1", server.port), SECRET, 30)
        wire.send_frame(sock, "marker", marker="end")
        wire.recv_frame(sock)
        sock.close()

    order = _drain(server, push)
    assert sent == [100] and order == list(range(100))  # in the plan's order, each row once


@pytest.mark.parametrize("named", [True, False])
def test_only_rows_sent_from_another_host_count_as_crossed(tmp_path, monkeypatch, named):
    """A range from a task on another host counts as crossed when its rows came through the
    socket, not when the node read them from a file on its own host: the driver (one host)
    names each kept frame to the node on the file's host, and no row crosses."""

    from duotf._transport import feeder
    from duotf._transport.feeder import FeedJob, feed_train

    path, frames = _cache_file(str(tmp_path / "duotf-feedcache-t"), [40, 25, 35])
    from duotf._transport import shm

    monkeypatch.setattr(feeder, "origin", lambda: {"host": "another-host", "pid": 1})
    monkeypatch.setattr(shm, "same_host", lambda sock: False)  # as from there: TCP, no ring
    server = FeedServer(SECRET, capacity=64)
    job = FeedJob(SECRET, [("127.0.0.1", server.port)], ["a"], "train", 30, {0: [(0, 0, 100, 0)]})
    answer = {}

    def push():
        if named:
            chunks = [wire.FileRef(n, path, o, length) for n, o, length in frames]
        else:
            chunks = [{"id": np.arange(0, 60, dtype=np.int64)}, {"id": np.arange(60, 100, dtype=np.int64)}]
        answer["sent"] = feed_train(job, 0, chunks)
        with wire.connect(("127.0.0.1", server.port), SECRET, 30) as sock:
            wire.send_frame(sock, "marker", marker="end")
            answer["end"] = wire.recv_frame(sock)[0]

    ids = _drain(server, push)
    assert answer["sent"] == 100 and ids == list(range(100))
    assert answer["end"]["across"] == (0 if named else 100)


def test_a_named_slice_outside_its_frame_is_refused(tmp_path):
    path, frames = _cache_file(str(tmp_path / "duotf-feedcache-t"), [40, 25])
    n, offset, length = frames[1]
    files = {}
    try:
        at = {"path": path, "offset": offset, "length": length, "rows": n}
        header, cols = FeedServer._read_file_frame({**at, "start": 5, "stop": 12}, files)
        assert header["rows"] == 7 and list(cols["id"]) == list(range(45, 52))
        for start, stop in ((5, 5), (-1, 3), (0, 26), (3, None), ("0", 2)):
            with pytest.raises(wire.FeedProtocolError, match="rows"):
                FeedServer._read_file_frame({**at, "start": start, "stop": stop}, files)
    finally:
        import os

        for fd, _ in files.values():
            os.close(fd)


def _mixed_columns(rows):
    return {
        "x": np.arange(rows * 7, dtype=np.float32).reshape(rows, 7),  # 28-byte rows: pads
        "id": np.arange(rows, dtype=np.int64),
        "flag": (np.arange(rows) % 2).astype(np.uint8),
        "name": [f"row-{i}" * (i % 3) for i in range(rows)],
        "blob": [bytes([i % 256]) * (i % 5) for i in range(rows)],
    }


def _assert_same(got, want):
    assert list(got) == list(want)
    for name, values in want.items():
        if isinstance(values, np.ndarray):
            assert got[name].dtype == values.dtype and np.array_equal(got[name], values), name
        else:
            assert list(got[name]) == values, name


@pytest.mark.parametrize("rows", [0, 1, 13])
def test_frames_round_trip_with_every_numeric_column_aligned(rows):
    import socket

    want = _mixed_columns(rows)
    a, b = socket.socketpair()
    try:
        wire.send_frame(a, "batch", want, partition=3)
        header, got = wire.recv_frame(b)
    finally:
        a.close()
        b.close()
    assert header["t"] == "batch" and header["partition"] == 3 and header["rows"] == rows
    _assert_same(got, want)
    for name in ("x", "id", "flag"):
        assert got[name].ctypes.data % wire.ALIGN == 0, name  # TF takes such arrays without a copy

    data = wire.pack_frame(want)
    body = wire.aligned_buffer(len(data))
    body[:] = np.frombuffer(data, np.uint8)
    header, got = wire.unpack_frame(body)
    _assert_same(got, want)
    assert all(got[name].ctypes.data % wire.ALIGN == 0 for name in ("x", "id", "flag"))
    with pytest.raises(wire.FeedProtocolError, match="cut short"):
        wire.unpack_frame(data[:-1] if rows else data[:-9])


def test_a_file_frame_outside_its_file_is_refused(tmp_path):
    path, frames = _cache_file(str(tmp_path / "duotf-feedcache-t"), [40, 25])
    files = {}
    try:
        n, offset, length = frames[1]
        header, cols = FeedServer._read_file_frame(
            {"path": path, "offset": offset, "length": length, "rows": n}, files)
        assert list(cols["id"]) == list(range(40, 65))
        for bad in ({"offset": offset, "length": length + 1}, {"offset": -1, "length": 10},
                    {"offset": 0, "length": 0}):
            with pytest.raises(wire.FeedProtocolError, match="outside"):
                FeedServer._read_file_frame({"path": path, "rows": n, **bad}, files)
        with pytest.raises(wire.FeedProtocolError, match="not the one announced"):
            FeedServer._read_file_frame({"path": path, "offset": offset, "length": length, "rows": 40},
                                        files)
        with pytest.raises(wire.FeedProtocolError, match="not a feed cache file"):
            FeedServer._read_file_frame({"path": str(tmp_path / "x"), "offset": 0, "length": 1,
                                         "rows": 1}, files)
    finally:
        import os

        for fd, _ in files.values():
            os.close(fd)
