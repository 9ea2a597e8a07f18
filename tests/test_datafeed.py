"""The node side of the feed in one process: dataset() blocks against next_batch() rules, and
tensor columns (packed on Spark, decoded without a copy in the feeding task)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from duotf.errors import ConfigError, FeedSchemaError
from duotf._transport import wire
from duotf._transport.columns import TENSOR_KEY, decode_tensor, from_arrow, tensor_specs
from duotf._transport.datafeed import DataFeed
from duotf._transport.server import FeedServer
from duotf._driver.planner import balance, local_order

SECRET = b"k" * 32


def _push(server: FeedServer, epochs):
    """Send each epoch's frames (row counts) of ids in order, with epoch and end markers."""
    sock = wire.connect(("127.0.0.1", server.port), SECRET, 30)
    start = 0
    for e, frames in enumerate(epochs):
        for n in frames:
            ids = np.arange(start, start + n, dtype=np.int64)
            wire.send_frame(sock, "batch", {"id": ids, "x": np.repeat(ids[:, None], 3, axis=1).astype(np.float32)})
            start += n
        wire.send_frame(sock, "marker", marker="epoch" if e + 1 < len(epochs) else "end")
        assert wire.recv_frame(sock)[0]["t"] == "ack"
    sock.close()


@pytest.mark.parametrize("block_bytes", [64, 1 << 20])
def test_dataset_blocks_follow_next_batch_rules(block_bytes):
    import threading

    server = FeedServer(SECRET, capacity=64)
    epochs = [[7, 13, 250, 5], [95, 5]]  # 275 rows, then 100
    pusher = threading.Thread(target=_push, args=(server, epochs))
    pusher.start()
    feed = DataFeed(server, train=True)
    sizes, ids = [], []
    try:
        for batch in feed.dataset(10, block_bytes=block_bytes):
            sizes.append(int(batch["id"].shape[0]))
            ids.extend(batch["id"].numpy().tolist())
            assert (batch["x"].numpy() == batch["id"].numpy()[:, None]).all()
    finally:
        pusher.join()
        server.close()
    # a batch never spans two epochs: epoch 0 ends with a short batch of 5
    assert sizes == [10] * 27 + [5] + [10] * 10
    assert ids == list(range(375))


@pytest.mark.parametrize("block_bytes", [64, 1 << 20])
def test_a_fit_dataset_yields_x_y_one_epoch_per_iteration(block_bytes):
    import threading

    import tensorflow as tf

    server = FeedServer(SECRET, capacity=64)
    epochs = [[7, 13, 250, 5], [95, 5], [3]]  # 275 rows, then 100, then 3
    pusher = threading.Thread(target=_push, args=(server, epochs))
    pusher.start()
    feed = DataFeed(server, train=True)
    try:
        ds = feed.dataset(10, features="x", label="id")
        policy = ds.options().experimental_distribute.auto_shard_policy
        iterations = []
        for _ in range(4):  # as fit(ds, epochs=4) does: the fourth finds the data's end
            sizes, ids = [], []
            for x, y in ds:
                assert x.shape[1:] == (3,) and (x.numpy() == y.numpy()[:, None]).all()
                sizes.append(int(y.shape[0]))
                ids.extend(y.numpy().tolist())
            iterations.append((sizes, ids))
    finally:
        pusher.join()
        server.close()
    assert policy == tf.data.experimental.AutoShardPolicy.OFF
    assert iterations == [([10] * 27 + [5], list(range(275))),
                          ([10] * 10, list(range(275, 375))), ([3], [375, 376, 377]), ([], [])]
    assert feed.epoch == 2


def test_a_fit_dataset_names_a_column_the_feed_lacks():
    import threading

    server = FeedServer(SECRET, capacity=64)
    pusher = threading.Thread(target=_push, args=(server, [[4]]))
    pusher.start()
    try:
        with pytest.raises(ConfigError, match="no column 'z' in the feed .*'id', 'x'"):
            DataFeed(server, train=True).dataset(2, features=["x", "z"], label="id")
    finally:
        pusher.join()
        server.close()


def test_tensor_column_decodes_without_a_copy():
    x = np.arange(40, dtype=np.float32).reshape(10, 4)
    column = pa.array([row.tobytes() for row in x], pa.binary())
    out = decode_tensor(column, "x", "float32", (4,))
    assert out.dtype == np.float32 and out.shape == (10, 4) and (out == x).all()
    assert np.shares_memory(out, np.frombuffer(column.buffers()[2], np.uint8))
    sliced = decode_tensor(column.slice(3, 5), "x", "float32", (2, 2))
    assert (sliced == x[3:8].reshape(5, 2, 2)).all()
    batch = pa.RecordBatch.from_arrays([column, pa.array(range(10))], ["x", "id"])
    cols = from_arrow(batch, {"x": ("float32", (4,))})
    assert (cols["x"] == x).all() and cols["id"].tolist() == list(range(10))
    assert isinstance(from_arrow(batch)["x"], list)  # without the spec: bytes, as before


def test_tensor_column_of_the_wrong_width_names_the_row():
    column = pa.array([b"\0" * 16, b"\0" * 16, b"\0" * 12], pa.binary())
    with pytest.raises(FeedSchemaError, match=r"'x': row 2 holds 12 bytes where float32\[4\] needs 16"):
        decode_tensor(column, "x", "float32", (4,))
    with pytest.raises(FeedSchemaError, match="'x': a null at row 1") as info:
        decode_tensor(pa.array([b"\0" * 16, None], pa.binary()), "x", "float32", (4,))
    assert info.value.column == "x" and info.value.row == 1 and info.value.problem == "null"


def test_pack_tensors_stores_raw_values_and_their_shape(spark):
    from duotf.spark import pack_tensors

    rows = [([i + 0.5, i * 2.0, -float(i)], i) for i in range(50)]
    df = spark.createDataFrame(rows, "v array<double>, id long").repartition(3)
    packed = pack_tensors(df, "v", dtype="float64")
    assert packed.schema["v"].dataType.simpleString() == "binary"
    assert packed.schema["v"].metadata[TENSOR_KEY] == {"dtype": "float64", "shape": [3]}
    assert tensor_specs(packed.schema) == {"v": ("float64", (3,))}
    got = {r.id: np.frombuffer(r.v, np.float64).tolist() for r in packed.collect()}
    assert got == {i: v for v, i in rows}
    assert tensor_specs(packed.select("v").cache().schema) == {"v": ("float64", (3,))}


def test_pack_tensors_refuses_ragged_rows_and_other_types(spark):
    from duotf.spark import pack_tensors

    ragged = spark.createDataFrame([([1.0, 2.0],), ([1.0],)], "v array<double>").coalesce(1)
    with pytest.raises(Exception, match="column 'v' has a row of 1 values where the first row has 2"):
        pack_tensors(ragged, "v").collect()
    with pytest.raises(ConfigError, match="'s' is string; it must be an array of numbers"):
        pack_tensors(spark.createDataFrame([("a",)], "s string"), "s")
    with pytest.raises(ConfigError, match="no column 'w'"):
        pack_tensors(ragged, "w")


@pytest.mark.parametrize("counts, targets", [
    ([10, 3, 0, 25, 7], 2), ([20_000] * 13, 2), ([5, 0, 0, 1, 9, 4, 4], 3), ([7], 4), ([0, 3, 1], 2),
])
def test_balance_gives_every_target_the_same_rows_once(counts, targets):
    plan, per, dropped = balance(counts, targets)
    assert per == sum(counts) // targets and dropped == sum(counts) % targets
    got = {t: 0 for t in range(targets)}
    seqs = {t: [] for t in range(targets)}
    for pid, n in enumerate(counts):
        covered = []
        for target, a, b, seq in plan[pid]:
            assert 0 <= a < b <= n
            got[target] += b - a
            covered.append((a, b))
            seqs[target].append(seq)
        # a partition's ranges are consecutive, from its first row on
        if covered:
            assert [a for a, _ in covered] == [0] + [b for _, b in covered[:-1]]
    assert got == {t: per for t in range(targets)}
    # every target's ranges are numbered 0, 1, 2, ... in partition order: the order it queues them
    assert all(s == list(range(len(s))) for s in seqs.values())


def test_balance_feeds_different_targets_from_partitions_that_run_together():
    plan, _, _ = balance([1000] * 8, 2)
    # engines start tasks in partition order: partitions 0 and 1 run first, then 2 and 3...
    assert [plan[p][0][0] for p in range(8)] == [0, 1, 0, 1, 0, 1, 0, 1]
    assert all(len(plan[p]) == 1 for p in range(8))
    plan, _, _ = balance([1000] * 8, 2, drop_remainder=False)
    assert [plan[p] for p in range(3)] == [[(0, 0, 1000, 0)], [(1, 0, 1000, 0)], [(0, 0, 1000, 1)]]


def _crossing(plan, hosts, names):
    """Rows the plan sends to a target on another host than the partition's."""
    return sum(stop - start for pid, ranges in plan.items() for t, start, stop, _ in ranges
               if hosts[pid] not in names[t])


def test_local_order_deals_each_worker_the_rows_of_its_own_host():
    names = [{"10.0.0.2", "a"}, {"10.0.0.3", "b"}]
    # partitions 0 and 1 on b, 2 and 3 on a: the plain order crosses hosts with half the rows
    counts, hosts = [100] * 4, ["b", "b", "a", "a"]
    assert _crossing(balance(counts, 2)[0], hosts, names) == 200
    plan, per, dropped = balance(counts, 2, order=local_order(counts, hosts, names))
    assert (per, dropped, _crossing(plan, hosts, names)) == (200, 0, 0)
    # a host holding more than its worker's share: only the excess crosses, and the unknown
    # partition fills the other worker's share
    counts, hosts = [100, 100, 100, 50, 50], ["a", "a", "a", None, "10.0.0.3"]
    plan, per, _ = balance(counts, 2, order=local_order(counts, hosts, names))
    assert per == 200 and _crossing(plan, hosts, names) == 100 + 50  # a's excess, the unknown one
    # two workers on one host share its partitions by rows
    order = local_order([100] * 4, ["a"] * 4, [{"a"}, {"a"}])
    assert sorted(order) == [0, 1, 2, 3]


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
    assert set(os.listdir(shm.SHM_DIR)) == before  # unlinked as soon as the node opened it
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


def test_from_arrow_refuses_nulls_and_ragged_rows_and_names_them():
    def refused(batch, **kw):
        with pytest.raises(FeedSchemaError) as info:
            from_arrow(batch, **kw)
        return info.value

    list_f = pa.list_(pa.float32())
    for column in (pa.array([1, 2, None], pa.int64()), pa.array([1.0, 2.0, None]),
                   pa.array([True, False, None]), pa.array(["a", "b", None]),
                   pa.array([[1.0], [2.0], None], list_f), pa.array([[1.0], [2.0], [None]], list_f)):
        err = refused(pa.RecordBatch.from_arrays([column], ["c"]))
        assert (err.column, err.row, err.problem, err.partition) == ("c", 2, "null", None), column.type
        assert str(err).startswith("column 'c': a null") and "fillna" in str(err)
    ragged = pa.array([[1.0, 2.0], [3.0, 4.0], [5.0], [6.0, 7.0, 8.0]], list_f)  # 8 values, 4 rows
    err = refused(pa.RecordBatch.from_arrays([ragged], ["v"]))
    assert (err.row, err.problem) == (2, "ragged")
    assert "row 2 holds 1 values where the rows before it hold 2" in str(err)
    assert "ragged=['v']" in str(err)
    sliced = pa.RecordBatch.from_arrays([ragged], ["v"]).slice(2)  # rows of 1 and 3 values
    assert refused(sliced).row == 1
    declared = from_arrow(sliced, ragged=("v",))["v"]
    assert declared.to_list() == [[5.0], [6.0, 7.0, 8.0]] and declared.row_splits.tolist() == [0, 1, 4]
    even = pa.RecordBatch.from_arrays([ragged], ["v"]).slice(0, 2)
    assert from_arrow(even)["v"].tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_ragged_column_travels_in_frames_and_slices_without_copies():
    from duotf import RaggedColumn
    from duotf._transport.columns import concat_cols, from_rows

    cols = from_rows([(0, [1.0]), (1, [2.0, 3.0]), (2, []), (3, [4.0, 5.0, 6.0])], ragged=("1",))
    column = cols["1"]
    assert isinstance(column, RaggedColumn) and len(column) == 4
    assert column.row_lengths.tolist() == [1, 2, 0, 3] and column[3].tolist() == [4.0, 5.0, 6.0]
    part = column[1:4]
    assert np.shares_memory(part.values, column.values) and part.row_splits.tolist() == [0, 2, 2, 5]
    _, back = wire.unpack_frame(wire.pack_frame({"0": cols["0"][1:4], "1": part}))
    assert isinstance(back["1"], RaggedColumn) and back["1"].to_list() == [[2.0, 3.0], [], [4.0, 5.0, 6.0]]
    assert back["0"].tolist() == [1, 2, 3]
    joined = concat_cols([{"1": column[3:]}, {"1": column[:2]}])["1"]
    assert joined.to_list() == [[4.0, 5.0, 6.0], [1.0], [2.0, 3.0]]
    assert [r.tolist() for r in joined] == joined.to_list()


def test_a_refusal_is_placed_in_its_partition_and_widths_hold_across_chunks():
    import pickle

    from duotf._transport.columns import from_rows
    from duotf._transport.feeder import validated

    def chunks():
        yield from_rows([(0, [1.0, 2.0])] * 5)
        yield from_rows([(1, [1.0, 2.0]), (2, None)])

    with pytest.raises(FeedSchemaError) as info:
        list(validated(chunks(), 7))
    err = pickle.loads(pickle.dumps(info.value))  # as it crosses from an executor
    assert (err.column, err.partition, err.row, err.problem) == ("1", 7, 6, "null")
    assert str(err).startswith("column '1': a null at row 6 of partition 7")

    def widths():
        yield from_rows([(0, [1.0, 2.0])] * 3)
        yield from_rows([(1, [1.0, 2.0, 3.0])])  # every row of this chunk alike, but not like before

    with pytest.raises(FeedSchemaError, match="row 3 of partition 2 holds 3 values where the rows "
                                              "before it hold 2"):
        list(validated(widths(), 2))


def test_a_refusals_problem_is_a_feed_problem_that_prints_and_pickles_as_its_string():
    import pickle

    from duotf.errors import FeedProblem
    from duotf._transport.columns import from_rows

    with pytest.raises(FeedSchemaError) as info:
        from_rows([(0, [1.0, 2.0]), (1, [1.0])])
    err = pickle.loads(pickle.dumps(info.value.located(4, 10)))
    assert err.problem is FeedProblem.RAGGED and err.problem == "ragged"
    assert (str(err.problem), f"{err.problem}", "%s" % err.problem) == ("ragged",) * 3
    # rebuilt from its attributes (the JVM feed's JSON records): the string becomes the member
    again = FeedSchemaError(err.message, **{**err.attributes, "problem": "ragged"})
    assert again.problem is FeedProblem.RAGGED and again.row == 11 and again.partition == 4


def test_pandas_nulls_are_what_pandas_calls_missing():
    import pandas as pd

    from duotf._transport.columns import from_pandas

    for frame in (pd.DataFrame({"a": pd.array([1, None], "Int64")}), pd.DataFrame({"a": [1.0, np.nan]}),
                  pd.DataFrame({"a": ["x", None]}), pd.DataFrame({"a": [[1.0], None]})):
        with pytest.raises(FeedSchemaError, match="column 'a': a null at row 1"):
            from_pandas(frame)
    for ragged in ((), ("a",)):  # a NaN among arrays: found once stacking them failed
        with pytest.raises(FeedSchemaError, match="column 'a': a null at row 1"):
            from_pandas(pd.DataFrame({"a": [[1.0], np.nan, [2.0]]}), ragged=ragged)
    cols = from_pandas(pd.DataFrame({"a": pd.array([1, 2], "Int64"), "v": [[1.0, 2.0], [3.0, 4.0]]}))
    assert cols["a"].dtype == np.int64 and cols["v"].shape == (2, 2)


def test_a_feed_schema_error_record_comes_back_typed():
    from duotf.backends.spark.tasks import error_json as _error_json, guarded as _guarded, raise_first as _raise_first
    from duotf.errors import feed_schema_error

    def refuse():
        raise feed_schema_error("x", 4, "null", "a null at {where}", "fill it").located(3, 10)

    _, record = _guarded(refuse)
    with pytest.raises(FeedSchemaError) as info:
        _raise_first([None, record])
    err = info.value
    assert (err.column, err.partition, err.row, err.problem) == ("x", 3, 14, "null")
    assert str(err) == "column 'x': a null at row 14 of partition 3; fill it"
    assert _error_json(err) == record


def test_arrays_of_strings_or_nested_arrays_are_refused_not_sent_as_pointers():
    """An Arrow list of strings, bytes or lists became a 2-D array of objects, whose bytes went
    on the wire as pointers: the node got garbage. Every path refuses such a column with a
    FeedSchemaError naming it (declared ragged or not), and the wire refuses arrays of objects."""
    import pandas as pd

    from duotf._transport.columns import from_pandas, from_rows

    def refused(convert, *args, **kw):
        with pytest.raises(FeedSchemaError) as info:
            convert(*args, **kw)
        err = info.value
        assert (err.column, err.problem, err.partition) == ("c", "type", None), str(err)
        first = str(err).splitlines()[0]
        assert first.startswith(f"column 'c': row {err.row} holds an array of ") and "encode" in first
        return err

    def batch(values, value_type):
        return pa.RecordBatch.from_arrays([pa.array(values, pa.list_(value_type))], ["c"])

    strings = batch([["a", "b"], ["c", "d"]], pa.string())
    for arrow in (strings, batch([[b"a", b"b"], [b"c", b"d"]], pa.binary()),
                  batch([[[1.0], [2.0]], [[3.0], [4.0]]], pa.list_(pa.float32()))):
        for ragged in ((), ("c",)):
            assert refused(from_arrow, arrow, ragged=ragged).row == 0
    assert "strings" in str(refused(from_arrow, strings))
    assert "nested array" in str(refused(from_arrow, batch([[[1.0]], [[2.0]]], pa.list_(pa.float32()))))
    # declared ragged: the first row that holds a value is named
    assert refused(from_arrow, batch([[], ["x"], ["y", "z"]], pa.string()), ragged=("c",)).row == 1
    for ragged in ((), ("c",)):
        for rows in ([(0, ["a", "b"]), (1, ["c", "d"])], [(0, [b"a"]), (1, [b"b"])]):
            cols = [{"id": i, "c": v} for i, v in rows]
            assert refused(from_rows, cols, ragged=ragged).row == 0
        frame = pd.DataFrame({"c": [["a", "b"], ["c", "d"]]})
        assert "strings" in str(refused(from_pandas, frame, ragged=ragged))
    assert refused(from_rows, [{"c": []}, {"c": ["x", "y"]}], ragged=("c",)).row == 1
    # rows of nested numbers of one shape are stacked; of different inner shapes, refused
    assert from_rows([{"c": [[1, 2], [3, 4]]}, {"c": [[5, 6], [7, 8]]}])["c"].shape == (2, 2, 2)
    with pytest.raises(FeedSchemaError, match=r"column 'c': arrays of different shapes: row 1 "
                                              r"holds an array of shape \[2\]") as info:
        from_rows([{"c": [[1, 2], [3, 4]]}, {"c": [[5, 6], [7]]}])
    assert (info.value.row, info.value.problem) == (1, "ragged")
    # the wire, behind them: never the bytes of an object
    with pytest.raises(TypeError, match="column 'c': an array of object values"):
        wire.pack_frame({"c": np.array([["a", "b"], ["c", "d"]], dtype=object)})
    arrays = np.empty(2, dtype=object)
    arrays[0], arrays[1] = np.zeros(2), np.ones(2)
    with pytest.raises(TypeError, match="column 'c': a ndarray value in a column of str/bytes"):
        wire.pack_frame({"c": arrays})


def test_a_decimal_column_is_refused_with_the_cast_to_make():
    """Spark SQL makes ``long * 1.0`` a decimal: the feed refuses it by name rather than fail
    on its Decimal objects or round them silently."""
    from decimal import Decimal

    batch = pa.RecordBatch.from_pydict({"id": [1, 2], "x": pa.array([Decimal("1.5"), Decimal("2.0")],
                                                                   pa.decimal128(5, 1))})
    with pytest.raises(FeedSchemaError) as info:
        from_arrow(batch)
    err = info.value
    assert (err.column, err.problem, err.row) == ("x", "type", 0)
    assert "decimal128(5, 1)" in str(err) and "cast('double')" in err.hint
