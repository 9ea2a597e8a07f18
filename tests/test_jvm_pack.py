"""duotf's JVM helper (``duotf.backends.spark.jvm``): numeric array columns packed in the JVM reach the feed as
the same arrays, refused with the same errors, and come back unchanged; the shipped jar is the
one its source builds.

The Spark tests take the shared suite's ``backend`` fixture, narrowed to its Spark kinds, so
the jar is loaded into the suite's own sessions (local: the driver's JVM runs the tasks;
standalone: the executors fetch it).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from duotf.backends.spark import jvm
from duotf.backends.spark.frames import arrow_source
from duotf.errors import FeedSchemaError
from duotf._transport.columns import from_arrow

TYPES = ["float", "double", "int", "bigint", "smallint", "tinyint"]


@pytest.mark.parametrize("line", sorted(jvm.LINES))
def test_each_shipped_jar_is_built_from_the_current_sources(tmp_path, line):
    with zipfile.ZipFile(jvm.jar(line)) as z:
        assert z.read(jvm.DIGEST_ENTRY).decode() == jvm.source_digest(line), (
            f"duotf-jvm-{line}.jar is older than its sources: run python -m duotf.backends.spark.jvm "
            "(see its --help for the other line)")
        shipped = sorted(n for n in z.namelist() if n.endswith(".class"))
    import pyspark

    if shutil.which("javac") is None or jvm.line_of(pyspark.__version__) != line:
        pytest.skip(f"a rebuild of the {line} jar needs a JDK and that line's pyspark: the "
                    "sources' digest is checked")
    rebuilt = tmp_path / "rebuilt.jar"
    subprocess.run([sys.executable, "-m", "duotf.backends.spark.jvm", "--into", str(rebuilt)],
                   check=True, timeout=120)
    with zipfile.ZipFile(rebuilt) as z:
        assert sorted(n for n in z.namelist() if n.endswith(".class")) == shipped


def test_a_spark_of_no_line_is_never_given_a_jar():
    assert jvm.line_of("3.5.9") == "spark3" and jvm.line_of("4.0.5") == jvm.line_of("4.3.0") == "spark4"
    assert jvm.line_of("3.4.4") is None and jvm.line_of("5.0.0") is None


def _batches(df, specs):
    """Each partition's Arrow batches decoded as the feed decodes them."""
    return [from_arrow(b, specs) for b in df._collect_as_arrow()]


pytestmark_spark = pytest.mark.engines("spark-local", "spark-standalone")


@pytestmark_spark
def test_array_columns_of_every_number_type_reach_the_feed_as_the_same_arrays(backend, engine):
    from pyspark.sql import functions as F

    rows = [([i * 3 + k - 5 for k in range(3)], f"r{i}", i) for i in range(7)]
    base = engine.session.createDataFrame(rows, "a array<int>, s string, i int").coalesce(1)
    df = base.select(*[F.col("a").cast(f"array<{t}>").alias(f"a_{t}") for t in TYPES], "s", "i")
    packed, specs = arrow_source(df)
    assert {name for name, (_, shape) in specs.items() if shape is None} == {f"a_{t}" for t in TYPES}
    assert [f.dataType.simpleString() for f in packed.schema.fields[:len(TYPES)]] == ["binary"] * len(TYPES)
    got, = _batches(packed, specs)
    want, = _batches(df, {})
    assert set(got) == set(want)
    for name in want:
        if isinstance(want[name], np.ndarray):
            assert got[name].dtype == want[name].dtype, name
            np.testing.assert_array_equal(got[name], want[name])
        else:
            assert got[name] == want[name]
    # and back: unpacking gives the DataFrame's rows and schema
    back = jvm.unpack(packed, df.schema)
    assert back.schema.simpleString() == df.schema.simpleString()
    assert back.collect() == df.collect()


@pytestmark_spark
@pytest.mark.parametrize("rows, row, problem", [
    ([[1.0, 2.0], [3.0, None], [5.0, 6.0]], 1, "null"),  # a null element
    ([[1.0, 2.0], [3.0, 4.0], None], 2, "null"),  # a null row
    ([[1.0, 2.0], [3.0, 4.0], [5.0]], 2, "ragged"),
])
def test_packed_arrays_are_refused_as_spark_arrays_are(backend, engine, rows, row, problem):
    df = engine.session.createDataFrame([(r, i) for i, r in enumerate(rows)], "x array<float>, i int").coalesce(1)
    packed, specs = arrow_source(df)
    assert specs == {"x": ("float32", None)}
    errors = []
    for data, spec in [(packed, specs), (df, {})]:
        with pytest.raises(FeedSchemaError) as caught:
            _batches(data, spec)
        errors.append(caught.value)
    assert [(e.column, e.row, e.problem) for e in errors] == [("x", row, problem)] * 2
    assert str(errors[0]) == str(errors[1])


@pytestmark_spark
def test_packing_is_off_when_asked(backend, engine, monkeypatch):
    df = engine.session.createDataFrame([([1.0], 1)], "x array<float>, i int")
    monkeypatch.setenv("DUOTF_SPARK_PACK_ARRAYS", "0")
    assert arrow_source(df) == (df, {})
    monkeypatch.delenv("DUOTF_SPARK_PACK_ARRAYS")
    assert arrow_source(df)[1] == {"x": ("float32", None)}


@pytestmark_spark
def test_the_jvm_writes_each_partition_as_the_frames_the_feed_would_send(backend, engine):
    import json
    import os
    import uuid

    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql import functions as F

    from duotf.backends.spark.frames import CachedPartition
    from duotf.backends.spark.tasks import ERROR_COLUMN as _ERROR
    from duotf._transport import wire
    from duotf._transport.columns import split

    from duotf._transport.columns import tensor_specs
    from duotf.spark import pack_tensors

    # every number type, as a column and as an array column, and a tensor column (pack_tensors);
    # 3 partitions of 7 or 8 rows
    df = engine.session.range(0, 23, 1, 3).select(
        *[(F.col("id") * 3 - 7).cast(t).alias(t) for t in TYPES],
        *[F.array(*[(F.col("id") * 5 + k - 40).cast(t) for k in range(3)]).alias(f"a_{t}") for t in TYPES],
        F.array(*[(F.col("id") / 4 + k).cast("double") for k in range(4)]).alias("t"))
    df = pack_tensors(df, "t", dtype="float64")
    assert jvm.spillable(df.schema)
    block = 200  # a few rows a frame: each partition is several frames
    cache_id = f"test-{uuid.uuid4().hex[:8]}"
    index, kept = jvm.spill(df, cache_id, block, 0, 0.0, _ERROR)
    entries = sorted(index.collect(), key=lambda e: e.pid)
    assert sorted(index.collect()) == sorted(entries)  # the index is kept: written once

    # what the Python side would have sent: each partition's Arrow rows as the feed decodes
    # them, cut into frames of block // row bytes rows
    table = pa.Table.from_batches(df.withColumn("_p", F.spark_partition_id())._collect_as_arrow())
    parts = []
    try:
        assert [e.pid for e in entries] == [0, 1, 2]
        for entry in entries:
            assert entry[_ERROR] is None and entry.path
            assert os.path.basename(os.path.dirname(entry.path)) == f"duotf-feedcache-{cache_id}"
            part = CachedPartition(entry.pid, entry.host, entry.path,
                                   [tuple(f) for f in json.loads(entry.frames)])
            parts.append(part)
            rows = table.filter(pc.equal(table["_p"], entry.pid)).drop_columns(["_p"])
            cols = from_arrow(rows.combine_chunks().to_batches()[0], tensor_specs(df.schema))
            assert cols["t"].shape == (rows.num_rows, 4) and cols["t"].dtype == np.float64
            row_bytes = sum(v.nbytes // len(v) for v in cols.values())
            want = [wire.pack_frame(piece) for piece in split(cols, block // row_bytes)]
            assert entry.rows == rows.num_rows == part.rows and len(want) > 2
            with open(entry.path, "rb") as f:
                data = f.read()
            got = [data[offset:offset + length] for _, offset, length in part.frames]
            assert [n for n, _, _ in part.frames] == [len(next(iter(p.values())))
                                                     for p in split(cols, block // row_bytes)]
            assert got == want  # byte for byte
            assert all(offset % 4096 == 0 for _, offset, _ in part.frames)
    finally:
        for entry in entries:
            CachedPartition(entry.pid, entry.host, entry.path, []).remove()
        kept.unpersist(False)
    assert not os.path.exists(os.path.dirname(entries[0].path))


@pytestmark_spark
@pytest.mark.parametrize("value", [None, [1.0, None], [1.0, 2.0, 3.0], []],
                         ids=["null", "null-inside", "ragged", "empty"])
def test_the_jvm_leaves_a_partition_the_feed_refuses_to_the_dataframe_and_counts_it(backend, engine, value):
    import uuid

    from duotf.backends.spark.frames import CachedPartition
    from duotf.backends.spark.tasks import ERROR_COLUMN as _ERROR

    rows = [[(i, [float(i), i + 0.5]) for i in range(p * 4, p * 4 + 4)] for p in range(3)]
    rows[1][2] = (6, value)
    df = engine.table(rows, {"id": "long", "v": "array<float>"})
    index, kept = jvm.spill(df, f"test-{uuid.uuid4().hex[:8]}", 1 << 20, 0, 0.0, _ERROR)
    entries = sorted(index.collect(), key=lambda e: e.pid)
    try:
        assert [(e.pid, e.rows, bool(e.path), e[_ERROR]) for e in entries] == \
            [(0, 4, True, None), (1, 4, False, None), (2, 4, True, None)]
        assert entries[1].frames == "[]"
    finally:
        for entry in entries:
            CachedPartition(entry.pid, entry.host, entry.path, []).remove()
        kept.unpersist(False)


def test_the_jvm_writes_only_dataframes_of_numbers(spark):
    from pyspark.sql.types import StructType

    def schema(ddl):  # (StructType.fromDDL is pyspark 4's)
        return spark.createDataFrame([], ddl).schema

    assert jvm.spillable(schema("a float, b array<double>, c tinyint, d array<bigint>"))
    for other in ["s string", "b binary", "t boolean", "d decimal(10,2)", "n array<array<float>>",
                  "m array<string>", "st struct<a: float>"]:
        assert not jvm.spillable(schema(f"a float, {other}")), other
    assert not jvm.spillable(StructType([]))
