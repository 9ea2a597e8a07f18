"""The node side of the feed in one process: ``dataset()`` blocks against ``next_batch()``
rules, a fit's dataset of ``(x, y)``, and tensor columns decoded without a copy in the feeding
task. Its neighbours: tests/test_pack_tensors.py (packing on Spark), tests/test_dealing.py (the
plan), tests/test_file_frames.py (frames kept in files), tests/test_feed_server.py (rings and
the order of ranges) and tests/test_feed_refusals.py (what the feed refuses)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from duotf.errors import ConfigError, FeedSchemaError
from duotf._transport import wire
from duotf._transport.columns import decode_tensor, from_arrow
from duotf._transport.datafeed import DataFeed
from duotf._transport.server import FeedServer
from tests.conftest import SECRET


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
