"""TFRecord I/O: TF byte-compatibility, corruption, compression, and real filesystems."""

from __future__ import annotations

import gzip
import os
import struct

import pytest

from duotf import ConfigError
from duotf.io import tfrecord
from duotf.io.files import expand
from duotf.io.tfrecord import TFRecordCorruptError, read_records, write_records
from tests.servers import http_server, s3_server

RECORDS = [os.urandom(n) for n in (0, 1, 7, 100, 3000, 70_000, 5)] * 20


@pytest.fixture(scope="module")
def tf():
    import tensorflow as tf

    return tf


@pytest.mark.parametrize("codec", ["NONE", "GZIP", "ZLIB"])
def test_tensorflow_reads_what_duotf_writes(tf, tmp_path, codec):
    path = str(tmp_path / "a.tfrecord")
    assert write_records(path, RECORDS, codec) == len(RECORDS)
    ds = tf.data.TFRecordDataset(path, compression_type="" if codec == "NONE" else codec)
    assert [r.numpy() for r in ds] == RECORDS


@pytest.mark.parametrize("codec", ["NONE", "GZIP", "ZLIB"])
def test_duotf_reads_what_tensorflow_writes(tf, tmp_path, codec):
    path = str(tmp_path / "b.tfrecord")
    options = tf.io.TFRecordOptions(compression_type="" if codec == "NONE" else codec)
    with tf.io.TFRecordWriter(path, options=options) as writer:
        for r in RECORDS:
            writer.write(r)
    assert list(read_records(path, codec)) == RECORDS
    if codec == "NONE":
        ours = str(tmp_path / "ours.tfrecord")
        write_records(ours, RECORDS)
        assert open(ours, "rb").read() == open(path, "rb").read()  # byte for byte


def test_compression_is_inferred_from_the_suffix(tmp_path):
    path = str(tmp_path / "c.tfrecord.gz")
    write_records(path, RECORDS[:5], "infer")
    with gzip.open(path) as f:
        assert f.read(8) == struct.pack("<Q", len(RECORDS[0]))
    assert list(read_records(path, "infer")) == RECORDS[:5]
    with pytest.raises(ValueError, match="NONE, GZIP, ZLIB"):
        tfrecord.resolve_compression("snappy")


def test_reader_streams_in_bounded_chunks(tmp_path):
    path = str(tmp_path / "big.tfrecord")
    write_records(path, (b"x" * 1000 for _ in range(5000)))
    reader = tfrecord.TFRecordReader(path)
    sizes = [len(batch) for batch in reader.batches(max_bytes=64 * 1024)]
    assert sum(sizes) == 5000 and max(sizes) <= 64 * 1024 // 1016 + 1 and len(sizes) > 50


def _damage(path, offset, value=b"\xff"):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(value)


def test_corrupt_data_names_url_and_offset_or_is_skipped(tmp_path):
    path = str(tmp_path / "d.tfrecord")
    records = [b"a" * 10, b"b" * 20, b"c" * 30]
    write_records(path, records)
    second = 16 + 10  # offset of the second record
    _damage(path, second + 12 + 5)  # inside its data
    with pytest.raises(TFRecordCorruptError) as info:
        list(read_records(path))
    assert info.value.url == path and info.value.offset == second
    assert f"at byte {second}" in str(info.value) and "skip_corrupt=True" in str(info.value)
    reader = tfrecord.TFRecordReader(path, skip_corrupt=True)
    assert list(reader) == [records[0], records[2]]
    assert reader.skipped == 1


def test_corrupt_length_stops_the_file(tmp_path):
    path = str(tmp_path / "e.tfrecord")
    write_records(path, [b"a" * 10, b"b" * 20])
    _damage(path, 26 + 2)  # the second record's length field
    with pytest.raises(TFRecordCorruptError, match="length field fails its CRC"):
        list(read_records(path))
    reader = tfrecord.TFRecordReader(path, skip_corrupt=True)
    assert list(reader) == [b"a" * 10] and reader.skipped == 1


def test_truncated_file(tmp_path):
    path = str(tmp_path / "f.tfrecord")
    write_records(path, [b"a" * 10, b"b" * 20])
    os.truncate(path, os.path.getsize(path) - 3)
    with pytest.raises(TFRecordCorruptError, match="truncated") as info:
        list(read_records(path))
    assert info.value.offset == 26


def test_damaged_gzip_stream(tmp_path):
    path = str(tmp_path / "g.tfrecord.gz")
    write_records(path, [b"a" * 100] * 100, "GZIP")
    os.truncate(path, os.path.getsize(path) // 2)
    with pytest.raises(TFRecordCorruptError, match="GZIP stream is damaged|truncated"):
        list(read_records(path, "GZIP"))


def test_memory_filesystem():
    url = "memory://duotf-test/x.tfrecord.gz"
    write_records(url, RECORDS, "infer")
    assert list(read_records(url, "infer")) == RECORDS
    (found,) = expand("memory://duotf-test/*.gz")  # fsspec spells it memory:///duotf-test/...
    assert found.endswith("duotf-test/x.tfrecord.gz") and list(read_records(found, "infer")) == RECORDS


def test_http_filesystem(tmp_path):
    write_records(str(tmp_path / "h.tfrecord"), RECORDS)
    with http_server(str(tmp_path)) as base:
        # small blocks: the reader goes through many Range requests
        assert list(read_records(f"{base}/h.tfrecord", storage_options={"block_size": 4096})) == RECORDS


def test_s3_filesystem_through_s3fs():
    with s3_server() as options:
        import s3fs

        s3fs.S3FileSystem(**options).mkdir("bucket")
        for codec in ("NONE", "GZIP"):
            url = f"s3://bucket/dir/{codec}.tfrecord"
            write_records(url, RECORDS, codec, storage_options=options)
            assert list(read_records(url, codec, storage_options=options)) == RECORDS
        assert expand("s3://bucket/dir/*.tfrecord", options) == [
            "s3://bucket/dir/GZIP.tfrecord", "s3://bucket/dir/NONE.tfrecord"
        ]
        s3fs.S3FileSystem.clear_instance_cache()


def test_hdfs_without_libhdfs_says_what_is_needed():
    with pytest.raises(ConfigError) as info:
        list(read_records("hdfs://namenode:8020/data/part-0.tfrecord"))
    message = str(info.value)
    assert "hdfs://namenode:8020/data/part-0.tfrecord" in message
    for needed in ("libhdfs", "CLASSPATH", "HADOOP_HOME", "JAVA_HOME"):
        assert needed in message
    assert message.count("\n") == 0  # one clear line, not pyarrow's list of dlopen attempts
