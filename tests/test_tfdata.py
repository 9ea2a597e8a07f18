"""tf.data integration: native and fsspec readers agree; files are sharded by the node's rank."""

from __future__ import annotations

import pytest

import duotf
from duotf.context import NodeContext
from duotf.io.tfdata import shard_files, tfrecord_dataset
from duotf.io.tfrecord import write_records
from tests.servers import http_server


def _ctx(job, index, cluster):
    return NodeContext(node_id=0, job_name=job, task_index=index,
                       tf_config={"cluster": cluster, "task": {"type": job, "index": index}},
                       working_dir="/tmp", default_fs="file://", protocol="grpc",
                       host="h", port=1, job_id="j")


@pytest.fixture
def files(tmp_path):
    paths = []
    for i in range(5):
        paths.append(str(tmp_path / f"part-{i:05d}.tfrecord.gz"))
        write_records(paths[-1], [f"{i}-{j}".encode() for j in range(10 + i)], "GZIP")
    return paths


def test_native_and_fsspec_readers_give_the_same_records_in_the_same_order(files, tmp_path):
    native = [r.numpy() for r in tfrecord_dataset(str(tmp_path / "*.gz"), reader="native")]
    ours = [r.numpy() for r in tfrecord_dataset(str(tmp_path / "*.gz"), reader="fsspec")]
    assert native == ours
    assert len(native) == sum(10 + i for i in range(5))
    assert native[:5] == [b"0-0", b"1-0", b"2-0", b"3-0", b"0-1"]  # interleaved, 4 at a time


def test_remote_urls_go_through_fsspec(files, tmp_path):
    local = [r.numpy() for r in tfrecord_dataset(files, num_parallel_reads=2)]
    with http_server(str(tmp_path)) as base:
        urls = [f"{base}/part-{i:05d}.tfrecord.gz" for i in range(5)]
        remote = [r.numpy() for r in tfrecord_dataset(urls, num_parallel_reads=2)]
    assert remote == local


def test_sharding_by_rank():
    files = [f"f{i}" for i in range(5)]
    with_chief = {"chief": ["a"], "worker": ["b", "c"], "ps": ["d"]}
    assert shard_files(files, _ctx("chief", 0, with_chief)) == ["f0", "f3"]
    assert shard_files(files, _ctx("worker", 0, with_chief)) == ["f1", "f4"]
    assert shard_files(files, _ctx("worker", 1, with_chief)) == ["f2"]
    assert shard_files(files, _ctx("evaluator", 0, with_chief)) == files
    with pytest.raises(duotf.ConfigError, match="2 file\\(s\\) for 3 workers"):
        shard_files(files[:2], _ctx("worker", 0, with_chief))


@pytest.mark.parametrize("reader", ["native", "fsspec"])
def test_a_node_share_is_not_sharded_again_by_the_strategy(files, reader):
    import tensorflow as tf

    cluster = {"worker": ["a:1", "b:1"]}
    shares = [tfrecord_dataset(files, _ctx("worker", i, cluster), reader=reader) for i in (0, 1)]
    for ds in shares:  # MultiWorkerMirroredStrategy (Keras fit) leaves it as it is
        policy = ds.options().experimental_distribute.auto_shard_policy
        assert policy == tf.data.experimental.AutoShardPolicy.OFF
    assert sum(len(list(ds)) for ds in shares) == sum(10 + i for i in range(5))
    plain = tfrecord_dataset(files).options().experimental_distribute.auto_shard_policy
    assert plain == tf.data.experimental.AutoShardPolicy.AUTO
