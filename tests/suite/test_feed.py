"""The engine feed, on every backend: epochs, balance, inference order, termination, failures."""

from __future__ import annotations

import time

import pytest

import duotf
from tests.suite import mains
from tests.suite.data import frame_collection, rows_collection, tensor_collection

# uneven, empty and more partitions than nodes: 45 rows in 5 partitions
SIZES = [10, 3, 0, 25, 7]
# Balanced over 2 workers, partitions are dealt in the order 0, 2, 4, 1, 3: the one row left
# over is the last of partition 3, row 37.
FED = [i for i in range(45) if i != 37]


def _fed_every_epoch(ids, epochs):
    """Every row but one (which one depends on how the engine keeps an empty partition), once an
    epoch."""
    import collections

    seen = collections.Counter(ids)
    return len(seen) == 44 and set(seen) <= set(range(45)) and set(seen.values()) == {epochs}


def _parts():
    parts, i = [], 0
    for size in SIZES:
        parts.append([(float(i) / 10, i) for i in range(i, i + size)])
        i += size
    return parts


def test_train_epochs_balanced_across_workers(backend, backend_kind):
    data = rows_collection(backend_kind, backend, _parts())
    with duotf.run(mains.feed_train_main, {"batch": 4}, backend, duotf.ClusterSpec(workers=2)) as cluster:
        report = cluster.train(data, epochs=3)
        first, second = cluster.wait(timeout=120)
    assert report["rows"] == 45 and report["rows_per_worker"] == 22
    assert report["rows_dropped_per_epoch"] == 1 and report["rows_fed"] == 3 * 44
    for result in (first, second):
        assert result["epochs"] == 3
        assert sorted(result["ids"]) == [0, 1, 2]
        assert all(len(ids) == 22 for ids in result["ids"].values())  # same steps on every worker
    for epoch in range(3):
        got = sorted(first["ids"][epoch] + second["ids"][epoch])
        assert got == FED  # every row but the remainder, once per epoch


def test_inference_one_result_per_input_in_order(backend, backend_kind):
    data = rows_collection(backend_kind, backend, _parts())
    with duotf.run(mains.feed_infer_main, {"batch": 4}, backend, duotf.ClusterSpec(workers=2)) as cluster:
        out = cluster.inference(data)
        assert sorted(cluster.wait(timeout=60)) == [0, 1]
    if backend_kind in ("local", "procpool"):
        results = [x for part in out for x in part]
        assert [len(part) for part in out] == SIZES
    elif backend_kind == "dask":
        results = out.compute()
        assert out.npartitions == len(SIZES)
    else:
        results = out.collect()
        assert out.getNumPartitions() == len(SIZES)
    assert results == [i / 10 * 2 + i for i in range(45)]


def test_dataframe_inference_keeps_chosen_columns(backend, backend_kind):
    df = frame_collection(backend_kind, backend, _parts(), ["x", "y"])
    with duotf.run(mains.feed_infer_main, {"batch": 8}, backend, duotf.ClusterSpec(workers=2)) as cluster:
        out = cluster.inference(df, keep=["y"], result_columns={"prediction": "double"})
        cluster.wait(timeout=60)
    if backend_kind in ("local", "procpool"):
        import pandas as pd

        pdf = pd.concat(out, ignore_index=True)
    elif backend_kind == "dask":
        pdf = out.compute().reset_index(drop=True)
    else:
        pdf = out.toPandas()
    assert list(pdf.columns) == ["y", "prediction"]
    assert pdf["y"].tolist() == list(range(45))
    assert pdf["prediction"].tolist() == [i / 10 * 2 + i for i in range(45)]


def test_dataset_fast_path(backend, backend_kind):
    df = frame_collection(backend_kind, backend, _parts(), ["x", "y"])
    with duotf.run(mains.feed_dataset_main, {"batch": 5}, backend, duotf.ClusterSpec(workers=2),
                   env={"TF_CPP_MIN_LOG_LEVEL": "3"}) as cluster:
        cluster.train(df, epochs=2)
        first, second = cluster.wait(timeout=120)
    # 22 rows per epoch in batches of 5: 5 steps an epoch (the last of 2 rows), on both workers
    assert first["rows"] == second["rows"] == 44 and first["steps"] == second["steps"] == 10
    assert first["sum"] + second["sum"] == pytest.approx(2 * sum(i / 10 for i in FED))


def test_tensor_column_arrives_as_a_2d_array(backend, backend_kind):
    data, mapping = tensor_collection(backend_kind, backend, SIZES, width=6)
    with duotf.run(mains.feed_tensor_main, {"batch": 4, "mapping": mapping}, backend,
                   duotf.ClusterSpec(workers=2), env={"TF_CPP_MIN_LOG_LEVEL": "3"}) as cluster:
        cluster.train(data, epochs=2)
        first, second = cluster.wait(timeout=120)
    for result in (first, second):
        assert result["dtypes"] == ["float32"] and result["shapes"] == [(6,)]
        assert result["wrong"] == 0
    assert _fed_every_epoch(first["ids"] + second["ids"], 2)


def test_feed_cache_trains_like_the_dataframe(backend, backend_kind):
    if not backend_kind.startswith("spark"):
        pytest.skip("feed_cache holds a Spark DataFrame")
    from duotf.spark import feed_cache

    df, _ = tensor_collection(backend_kind, backend, SIZES, width=6, packed=False)
    cache = feed_cache(df, block_bytes=64)  # a few rows per frame: frames split between workers
    try:
        assert cache.counts == SIZES and cache.columns == ["x", "id"]
        with duotf.run(mains.feed_tensor_main, {"batch": 4, "mapping": None}, backend,
                       duotf.ClusterSpec(workers=2), env={"TF_CPP_MIN_LOG_LEVEL": "3"}) as cluster:
            report = cluster.train(cache, epochs=3)
            with pytest.raises(duotf.ConfigError, match="FeedCache is for training"):
                cluster.inference(cache)
            first, second = cluster.wait(timeout=120)
    finally:
        cache.unpersist()
    assert report["rows_fed"] == 3 * 44 and report["rows_dropped_per_epoch"] == 1
    for result in (first, second):
        assert result["dtypes"] == ["float32"] and result["shapes"] == [(6,)]
        assert result["wrong"] == 0 and len(result["ids"]) == 3 * 22
    assert sorted(first["ids"] + second["ids"]) == sorted(FED * 3)


def test_feed_cache_file_not_on_the_host_is_fed_from_the_dataframe(backend, backend_kind):
    if not backend_kind.startswith("spark"):
        pytest.skip("feed_cache holds a Spark DataFrame")
    import os

    from duotf.spark import feed_cache

    df, _ = tensor_collection(backend_kind, backend, SIZES, width=6, packed=False)
    cache = feed_cache(df, block_bytes=64)
    try:
        assert all(os.path.exists(part.path) for part in cache.parts)
        for part in cache.parts[::2]:  # as if partitions 0, 2 and 4 lay on a lost host
            os.remove(part.path)
        with duotf.run(mains.feed_tensor_main, {"batch": 4, "mapping": None}, backend,
                       duotf.ClusterSpec(workers=2), env={"TF_CPP_MIN_LOG_LEVEL": "3"}) as cluster:
            report = cluster.train(cache, epochs=2)
            cache.unpersist()
            assert not any(os.path.exists(part.path) for part in cache.parts)
            with pytest.raises(duotf.ConfigError, match="unpersisted"):
                cluster.train(cache)
            first, second = cluster.wait(timeout=120)
    finally:
        cache.unpersist()
    assert report["rows_fed"] == 2 * 44
    assert _fed_every_epoch(first["ids"] + second["ids"], 2)


def test_terminate_stops_the_feed_and_train_returns(backend, backend_kind):
    parts = [[(float(i), i) for i in range(p * 5000, (p + 1) * 5000)] for p in range(4)]
    data = rows_collection(backend_kind, backend, parts)
    with duotf.run(mains.feed_terminate_main, {"batch": 10}, backend, duotf.ClusterSpec(workers=2)) as cluster:
        report = cluster.train(data, epochs=5)
        got = cluster.wait(timeout=60)
    # The first terminate() ends train() for the cluster (synchronous workers cannot go on
    # without one of them): the other node gets its end of data, with or without a first batch.
    assert report["terminated"] and report["epochs"] < 5
    assert max(got) == 10 and set(got) <= {0, 10}


def test_node_dying_mid_feed_fails_train_fast(backend, backend_kind):
    parts = [[(float(i), i) for i in range(p * 20000, (p + 1) * 20000)] for p in range(4)]
    data = rows_collection(backend_kind, backend, parts)
    cluster = duotf.run(mains.feed_die_main, {"batch": 10}, backend, duotf.ClusterSpec(workers=2))
    try:
        t0 = time.monotonic()
        with pytest.raises(duotf.NodeFailedError) as info:
            cluster.train(data, epochs=50)
        assert time.monotonic() - t0 < 10 + 5
        assert info.value.role == "worker:1" and info.value.exitcode == 3
    finally:
        cluster.shutdown(grace_secs=0, _raise=False)
