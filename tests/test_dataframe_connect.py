"""Spark DataFrames <-> TFRecords on a Spark Connect session (``engine.session``: no RDD, no
``sparkContext``): the same functions as on a classic session, by the same ``mapInArrow`` path.

In a module of its own: test_dataframe.py's classic session lives for its whole module, and a
Connect session marks this process "remote" while it lives.
"""

from __future__ import annotations

import gc
import os
import re

import pytest

from duotf.io import dataframe as dfio
from duotf.io.example import Field
from duotf.io.tfrecord import read_records
from tests.test_dataframe import _all_types_frame, _exact_rows

pytestmark = pytest.mark.engines("spark-connect")

#: a column of each kind, nulls in all but ``id``; partition 1 is empty
SCHEMA = {"id": "long", "x": "double", "name": "string", "img": "binary", "flag": "boolean",
          "vec": "array<double>", "tags": "array<string>"}
PARTS = [
    [(0, 0.5, "a", b"\x00\xff", True, [1.5, -2.0], ["t", ""]),
     (1, None, None, None, None, None, None)],
    [],
    [(2, -3.25, "", b"", False, [], []),
     (3, 1e3, "héllo", b"x", True, [0.0], ["u"])],
]


def _rows(df):
    return _exact_rows(r.asDict() for r in df.collect())


def test_a_connect_frame_round_trips_with_every_kind_and_null(backend, engine, tmp_path):
    df = engine.table(PARTS, SCHEMA)
    assert type(engine.session).__module__.startswith("pyspark.sql.connect")
    out = str(tmp_path / "connect")
    files = dfio.spark_to_tfrecords(df, out, compression="GZIP")
    # one file per partition, the empty partition's too (empty), in partition order
    assert [os.path.basename(f) for f in files] == [f"part-{i:05d}.tfrecord.gz" for i in range(3)]
    assert [len(list(read_records(f, "GZIP"))) for f in files] == [2, 0, 2]

    expected = _exact_rows(dict(zip(SCHEMA, row)) for part in PARTS for row in part)
    back = dfio.tfrecords_to_spark(engine.session, out, schema=df.schema)
    assert back.schema == df.schema
    assert _rows(back) == expected

    # inferred: booleans as 0/1 longs, doubles as floats (TF's float32), strings by bytes_as
    inferred = dfio.tfrecords_to_spark(engine.session, out, bytes_as={"name": "string", "tags": "string"})
    assert dict(inferred.dtypes) == {"id": "bigint", "x": "float", "name": "string", "img": "binary",
                                     "flag": "bigint", "vec": "array<float>", "tags": "array<string>"}
    got = _rows(inferred)
    assert [r["flag"] for r in got] == [1, None, 0, 1]
    assert [r["x"] for r in got] == [0.5, None, -3.25, 1e3] and got[0]["vec"] == [1.5, -2.0]
    assert [r["img"] for r in got] == [b"\x00\xff", None, b"", b"x"]
    assert [r["tags"] for r in got] == [["t", ""], None, [], ["u"]]


def test_every_spark_type_round_trips_through_connect(backend, engine, tmp_path):
    df, struct, rows = _all_types_frame(engine.session)
    out = str(tmp_path / "all_types")
    dfio.spark_to_tfrecords(df, out, compression="ZLIB")
    back = dfio.tfrecords_to_spark(engine.session, out, schema=struct)
    assert back.schema == struct
    assert _rows(back) == _exact_rows(dict(zip(struct.names, r)) for r in rows)


def test_connect_reads_name_the_column_that_does_not_fit(backend, engine, tmp_path):
    from pyspark.sql import types as T

    out = str(tmp_path / "wide")
    dfio.spark_to_tfrecords(engine.table([[(1, 300)]], {"id": "long", "n": "long"}), out)
    narrow = T.StructType([T.StructField("id", T.LongType()), T.StructField("n", T.ByteType())])
    with engine.task_failure() as failure:
        dfio.tfrecords_to_spark(engine.session, out, schema=narrow).collect()
    assert re.search(r"SchemaMismatchError: column 'n' \(int8\) of .*part-00000.tfrecord "
                     r"cannot hold 300.*wider type", failure.text), failure.text
    with engine.task_failure() as failure:
        dfio.tfrecords_to_spark(engine.session, out,
                                schema=[Field("id", "int64"), Field("n", "string")]).collect()
    assert re.search("SchemaMismatchError: column 'n'.*the record holds int64 values", failure.text)
    # the Connect client's result iterators that the errors' tracebacks held (each with a
    # thread pool of its own) go now, not whenever the collector next runs
    gc.collect()
