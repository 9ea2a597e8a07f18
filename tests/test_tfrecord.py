"""TFRecord I/O: TF byte-compatibility, corruption, compression, and real filesystems."""

from __future__ import annotations

import gzip
import os
import struct

import pytest

from duotf import ConfigError
from duotf.io import tfrecord
from duotf.io.files import expand, open_url
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


def test_a_bad_length_is_skipped_up_to_the_next_whole_record(tmp_path):
    path = str(tmp_path / "e.tfrecord")
    write_records(path, [b"a" * 10, b"b" * 20, b"c" * 30])
    _damage(path, 26 + 2)  # the second record's length field
    with pytest.raises(TFRecordCorruptError, match="length field fails its CRC") as info:
        list(read_records(path))
    assert info.value.offset == info.value.record_offset == 26
    reader = tfrecord.TFRecordReader(path, skip_corrupt=True)
    # the second record cannot be framed: its 36 bytes are counted, not a record count
    assert list(reader) == [b"a" * 10, b"c" * 30]
    assert (reader.skipped, reader.skipped_bytes) == (0, 36)
    assert [(e.offset, e.reason) for e in reader.corruptions] == [(26, "the length field fails its CRC")]


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


def test_reading_a_missing_local_file_makes_no_folder(tmp_path):
    missing = tmp_path / "a" / "b" / "x.tfrecord"
    for url in (str(missing), missing.as_uri()):  # a path, and a file:// URL
        with pytest.raises(FileNotFoundError):
            open_url(url, "rb")
        assert not (tmp_path / "a").exists(), url
    with open_url(str(missing), "wb") as f:  # a writer gets its folders
        f.write(b"x")
    assert missing.read_bytes() == b"x"


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


# -- damaged files, read side by side with TensorFlow's reader --------------------------------
def _tf_read(tf, path, codec, ignore_errors=False):
    """TF's records from ``path`` and its DataLoss message (None when it read to the end)."""
    ds = tf.data.TFRecordDataset(path, compression_type="" if codec == "NONE" else codec)
    if ignore_errors:
        ds = ds.ignore_errors()
    got = []
    try:
        for record in ds:
            got.append(record.numpy())
    except tf.errors.DataLossError as exc:
        return got, exc.message
    return got, None


def _ours(path, codec, **kwargs):
    got = []
    try:
        for record in read_records(path, codec, **kwargs):
            got.append(record)
    except TFRecordCorruptError as exc:
        return got, exc
    return got, None


def _framed(records):
    """The uncompressed bytes of ``records`` and the offset of each record."""
    blob, offsets = b"", []
    for r in records:
        offsets.append(len(blob))
        blob += struct.pack("<Q", len(r)) + struct.pack("<I", tfrecord.masked_crc(struct.pack("<Q", len(r))))
        blob += r + struct.pack("<I", tfrecord.masked_crc(r))
    return blob, offsets


def _compress(blob, codec):
    import zlib

    return {"NONE": blob, "GZIP": gzip.compress(blob), "ZLIB": zlib.compress(blob)}[codec]


DAMAGED = [n.to_bytes(2, "little") * (40 + n % 50) for n in range(3000)]


@pytest.mark.parametrize("codec", ["NONE", "GZIP", "ZLIB"])
@pytest.mark.parametrize("damage", ["body", "length", "length_crc", "data_crc", "truncated"])
def test_damaged_record_stream_matches_tensorflow(tf, tmp_path, codec, damage):
    blob, offsets = _framed(DAMAGED)
    bad = 1234
    start, size = offsets[bad], len(DAMAGED[bad])
    where = {"body": start + 12 + size // 2, "length": start + 1, "length_crc": start + 9,
             "data_crc": start + 12 + size + 1, "truncated": None}[damage]
    if where is None:
        blob = blob[: start + 12 + size // 2]
    else:
        blob = blob[:where] + bytes([blob[where] ^ 0x20]) + blob[where + 1 :]
    path = str(tmp_path / f"x.{codec}")
    with open(path, "wb") as f:
        f.write(_compress(blob, codec))

    theirs, tf_error = _tf_read(tf, path, codec)
    ours, error = _ours(path, codec)
    assert tf_error is not None and error is not None
    assert ours == theirs == DAMAGED[:bad]  # every good record before the damage, in order
    assert error.url == path and error.offset == error.record_offset == start
    assert f"at byte {start}" in str(error) and path in str(error)
    assert str(start) in tf_error or str(start + 12) in tf_error  # TF names the data's offset

    reader = tfrecord.TFRecordReader(path, codec, skip_corrupt=True)
    skipping = list(reader)
    tf_skipping, _ = _tf_read(tf, path, codec, ignore_errors=True)
    assert skipping[: len(tf_skipping)] == tf_skipping  # TF drops the rest of the file
    if damage == "truncated":
        assert skipping == DAMAGED[:bad] and reader.skipped == 0
        assert reader.skipped_bytes == len(blob) - start
    elif damage in ("body", "data_crc"):  # the length is sound: that record alone is skipped
        assert skipping == DAMAGED[:bad] + DAMAGED[bad + 1 :]
        assert (reader.skipped, reader.skipped_bytes) == (1, size + 16)
    else:  # no trustworthy length: skipped up to the next whole record, counted in bytes
        assert skipping == DAMAGED[:bad] + DAMAGED[bad + 1 :]
        assert (reader.skipped, reader.skipped_bytes) == (0, size + 16)
    assert [e.offset for e in reader.corruptions] == [start]


ZRECORDS = [b"%06d" % i * 10 for i in range(12_000)]  # 720 KB: several of TF's 256 KiB buffers


@pytest.mark.parametrize("codec", ["GZIP", "ZLIB"])
@pytest.mark.parametrize("fraction", [0.003, 0.33, 0.5, 0.97, 1.0])
def test_damaged_compressed_stream_keeps_every_record_before_the_damage(tf, tmp_path, codec, fraction):
    path = str(tmp_path / f"z.{codec}")
    write_records(path, ZRECORDS, codec)
    data = bytearray(open(path, "rb").read())
    flip = min(int(len(data) * fraction), len(data) - 3)  # 1.0: inside the trailer's check
    data[flip] ^= 0x10
    open(path, "wb").write(bytes(data))

    theirs, tf_error = _tf_read(tf, path, codec)
    ours, error = _ours(path, codec)
    assert tf_error is not None and isinstance(error, TFRecordCorruptError)
    assert ours == ZRECORDS[: len(ours)] and ours[: len(theirs)] == theirs
    if error.compressed_offset is not None:
        # zlib found the damage: TF drops what its last 256 KiB inflate call had decoded; duotf
        # keeps every record decoded before it and names both positions
        assert "inflate" in tf_error and len(ours) >= len(theirs)
        assert flip <= error.compressed_offset < flip + 64
        assert error.offset >= error.record_offset == sum(len(r) + 16 for r in ours)
        assert f"byte {error.compressed_offset} of the {codec} file" in str(error)
    elif "inflate" in tf_error:
        # the damage first decoded to wrong bytes (a record fails its CRC, where duotf stops),
        # and zlib failed soon after, inside the inflate call whose output TF then dropped
        assert len(ours) >= len(theirs) and "fails its CRC" in error.reason
    else:  # a record fails its CRC, at the offset TF names
        assert ours == theirs and len(ours) > 0
        assert str(error.offset) in tf_error or str(error.offset + 12) in tf_error
    reader = tfrecord.TFRecordReader(path, codec, skip_corrupt=True)
    skipping = list(reader)
    assert skipping[: len(ours)] == ours and reader.corruptions
    assert reader.skipped_bytes > 0 or reader.skipped > 0 or len(skipping) == len(ZRECORDS)


@pytest.mark.parametrize("codec", ["GZIP", "ZLIB"])
def test_truncated_compressed_stream_delivers_what_decodes(tf, tmp_path, codec):
    path = str(tmp_path / f"t.{codec}")
    write_records(path, ZRECORDS, codec)
    os.truncate(path, os.path.getsize(path) // 2 + 7)
    theirs, tf_error = _tf_read(tf, path, codec)
    ours, error = _ours(path, codec)
    assert "truncated" in tf_error and "truncated" in error.reason
    assert ours == theirs == ZRECORDS[: len(ours)] and len(ours) > 1000
    assert error.compressed_offset == os.path.getsize(path)
    assert error.offset > error.record_offset == sum(len(r) + 16 for r in ours)


def test_good_records_before_damage_in_the_same_chunk_are_delivered(tf, tmp_path):
    path = str(tmp_path / "p.tfrecord")
    records = [b"r%05d" % i * 16 for i in range(1000)]  # 112 KB: one read chunk
    write_records(path, records)
    _damage(path, 500 * (96 + 16) + 12 + 40)  # inside the 501st record's data
    theirs, _ = _tf_read(tf, path, "NONE")
    ours, error = _ours(path, "NONE")
    assert len(theirs) == 500 and ours == theirs
    assert error.offset == 500 * 112


@pytest.mark.parametrize("codec,length,reason", [
    ("NONE", 1 << 40, "max_record_bytes=2147483647"), ("GZIP", 1 << 40, "max_record_bytes"),
    ("NONE", 10**6, "runs past the end of the file"),  # the file's size is known
])
def test_absurd_length_is_corruption_not_an_allocation(tmp_path, codec, length, reason):
    blob, offsets = _framed([b"a" * 10, b"b" * 20, b"c" * 30])
    huge = struct.pack("<Q", length)
    crafted = huge + struct.pack("<I", tfrecord.masked_crc(huge))  # a length whose CRC holds
    blob = blob[: offsets[1]] + crafted + blob[offsets[1] + 12 :]
    path = str(tmp_path / f"l.{codec}")
    with open(path, "wb") as f:
        f.write(_compress(blob, codec))
    ours, error = _ours(path, codec)
    assert ours == [b"a" * 10] and error.offset == offsets[1]
    assert reason in error.reason
    reader = tfrecord.TFRecordReader(path, codec, skip_corrupt=True)
    assert list(reader) == [b"a" * 10, b"c" * 30]
    assert (reader.skipped, reader.skipped_bytes) == (0, 36)
    small = tfrecord.TFRecordReader(path, codec, max_record_bytes=25)  # a documented limit
    with pytest.raises(TFRecordCorruptError, match="max_record_bytes=25"):
        list(small)


def test_corrupt_error_pickles_with_its_attributes(tmp_path):
    import pickle

    path = str(tmp_path / "k.tfrecord.gz")
    write_records(path, ZRECORDS[:100], "GZIP")
    os.truncate(path, os.path.getsize(path) - 20)
    _, error = _ours(path, "infer")
    back = pickle.loads(pickle.dumps(error))
    assert isinstance(back, TFRecordCorruptError) and str(back) == str(error)
    assert (back.url, back.offset, back.record_offset, back.compressed_offset) == (
        path, error.offset, error.record_offset, os.path.getsize(path))


def test_gzip_members_in_turn_and_zero_padding(tmp_path):
    first, _ = _framed([b"one", b"two"])
    second, _ = _framed([b"three"])
    path = str(tmp_path / "m.tfrecord.gz")
    with open(path, "wb") as f:
        f.write(gzip.compress(first) + gzip.compress(second) + b"\0" * 10)
    assert list(read_records(path, "infer")) == [b"one", b"two", b"three"]
    with open(path, "ab") as f:
        f.write(b"junk")  # not a gzip member: damage after every record was delivered
    ours, error = _ours(path, "infer")
    assert ours == [b"one", b"two", b"three"] and error.record_offset == len(first + second)
    assert error.compressed_offset is not None and "GZIP stream is damaged" in error.reason
