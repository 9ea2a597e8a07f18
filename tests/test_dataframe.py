"""DataFrames <-> TFRecords on Spark and Dask; rows written by one engine read identically by both."""

from __future__ import annotations

import math

import pytest

import duotf
from duotf.io import dataframe as dfio
from duotf.io.example import Field, SchemaMismatchError, encode_example, infer_schema
from duotf.io.tfrecord import write_records


@pytest.fixture(scope="module")
def dask_client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      host="127.0.0.1") as cluster, Client(cluster) as client:
        yield client


def _plain(value):
    if value is None or type(value).__name__ == "NAType":
        return None
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, bytearray):
        return bytes(value)
    if hasattr(value, "item") and not isinstance(value, (bytes, str)) and getattr(value, "ndim", 1) == 0:
        return value.item()
    if isinstance(value, (list, tuple)) or hasattr(value, "tolist"):
        return [_plain(v) for v in (value.tolist() if hasattr(value, "tolist") else value)]
    return value


def _spark_rows(df):
    return sorted(({k: _plain(v) for k, v in r.asDict().items()} for r in df.collect()),
                  key=lambda r: r["id"])


def _dask_rows(ddf):
    pdf = ddf.compute()
    return sorted(({k: _plain(v) for k, v in r.items()} for r in pdf.to_dict("records")),
                  key=lambda r: r["id"])


def test_spark_written_files_read_identically_by_spark_and_dask(spark, dask_client, tmp_path):
    from pyspark.sql import types as T

    schema = T.StructType([
        T.StructField("id", T.LongType(), False),
        T.StructField("x", T.DoubleType(), False),
        T.StructField("label", T.IntegerType(), True),
        T.StructField("name", T.StringType(), True),
        T.StructField("img", T.BinaryType(), True),
        T.StructField("vec", T.ArrayType(T.FloatType(), False), True),
        T.StructField("tags", T.ArrayType(T.StringType(), False), True),
    ])
    rows = [(i, i * 0.1, None if i % 3 == 0 else i % 10, f"n{i}" if i % 4 else None,
             bytes([i % 256, 0, 255]), [float(i), 0.5] if i % 5 else [], ["a", f"t{i}"])
            for i in range(60)]
    df = spark.createDataFrame(rows, schema).repartition(3)
    out = str(tmp_path / "from_spark")
    files = dfio.spark_to_tfrecords(df, out, compression="GZIP")
    assert len(files) == 3 and all(f.endswith(".tfrecord.gz") for f in files)
    with pytest.raises(duotf.ConfigError, match="mode='overwrite'"):
        dfio.spark_to_tfrecords(df, out)

    text = {"name": "string", "tags": "string"}  # img stays binary
    from_spark = _spark_rows(dfio.tfrecords_to_spark(spark, out, bytes_as=text))
    from_dask = _dask_rows(dfio.tfrecords_to_dask(out, bytes_as=text))
    assert from_spark == from_dask
    assert len(from_spark) == 60
    r7 = from_spark[7]
    assert r7["label"] == 7 and r7["name"] == "n7" and r7["img"] == bytes([7, 0, 255])
    assert r7["vec"] == [7.0, 0.5] and r7["tags"] == ["a", "t7"]
    assert from_spark[0]["label"] is None and from_spark[4]["name"] is None
    assert from_spark[5]["vec"] == []
    assert abs(from_spark[3]["x"] - 0.3) < 1e-6  # TF stores float32


def test_dask_written_files_read_identically_by_dask_and_spark(spark, dask_client, tmp_path):
    import dask.dataframe as dd
    import numpy as np
    import pandas as pd

    pdf = pd.DataFrame({
        "id": np.arange(40, dtype=np.int64),
        "score": np.linspace(0, 1, 40).astype(np.float32),
        "word": [f"w{i}" for i in range(40)],
        "ids": [[i, i + 1] for i in range(40)],
    })
    out = str(tmp_path / "from_dask")
    import dask

    # Dask turns object columns into strings by default, lists included: keep them lists.
    with dask.config.set({"dataframe.convert-string": False}):
        ddf = dd.from_pandas(pdf, npartitions=4)
    files = dfio.dask_to_tfrecords(ddf, out)
    assert len(files) == 4
    from_dask = _dask_rows(dfio.tfrecords_to_dask(out, bytes_as="string"))
    from_spark = _spark_rows(dfio.tfrecords_to_spark(spark, out, bytes_as="string"))
    assert from_dask == from_spark
    assert from_dask[3] == {"id": 3, "ids": [3, 4], "score": pytest.approx(3 / 39), "word": "w3"}


def test_schema_inference_reads_past_the_first_record():
    records = [
        encode_example({"a": ("int64", [1]), "b": ("int64", [1]), "s": ("bytes", [b"x"])}),
        encode_example({"a": ("float", [2.5]), "b": ("int64", [1, 2])}),
        encode_example({"a": ("int64", [3]), "b": ("int64", [])}),
    ]
    schema = infer_schema(records, bytes_as="string")
    assert schema == [Field("a", "float", False, False), Field("b", "int64", True, False),
                      Field("s", "string", False, True)]


def test_explicit_schema_and_mismatch_names_the_column(spark, tmp_path):
    path = str(tmp_path / "m" / "part-0.tfrecord")
    write_records(path, [encode_example({"id": ("int64", [1]), "tag": ("bytes", [b"x"])})])
    schema = [Field("id", "int64", nullable=False), Field("tag", "int64")]
    with pytest.raises(Exception) as info:
        dfio.tfrecords_to_spark(spark, path, schema=schema).collect()
    assert "column 'tag'" in str(info.value) and "bytes" in str(info.value)
    rows = dfio.read_rows(path, [Field("id", "int64"), Field("tag", "string")])
    assert rows == [{"id": 1, "tag": "x"}]


def test_a_value_too_wide_for_the_given_spark_type_names_its_column(spark, tmp_path):
    from pyspark.sql import types as T

    path = str(tmp_path / "w" / "part-0.tfrecord")
    write_records(path, [encode_example({"id": ("int64", [1]), "n": ("int64", [300])})])
    narrow = T.StructType([T.StructField("id", T.LongType()), T.StructField("n", T.ByteType())])
    with pytest.raises(Exception) as info:
        dfio.tfrecords_to_spark(spark, path, schema=narrow).collect()
    assert "SchemaMismatchError: column 'n' (int8) of" in str(info.value)
    assert "cannot hold 300" in str(info.value) and "wider type" in str(info.value)


def test_a_spark_read_streams_each_file(spark, tmp_path):
    """tfrecords_to_spark's tasks take a file's rows as they are read: iter_rows decodes a record
    when its row is asked for, and a Spark task hands Spark an Arrow batch for each batch of
    records the reader reads (about 1 MiB), never the whole file first (a 208 MB file of
    784-float rows is 1.2 GB as Python rows)."""
    path = str(tmp_path / "s" / "part-0.tfrecord")
    write_records(path, [encode_example({"id": ("int64", [i])}) for i in range(3)])
    rows = dfio.iter_rows(path, [Field("id", "int64")])
    assert iter(rows) is rows and next(rows) == {"id": 0}  # a generator, not a list
    assert list(rows) == [{"id": 1}, {"id": 2}]
    back = dfio.tfrecords_to_spark(spark, path, schema=[Field("id", "int64")])
    assert [r.id for r in back.collect()] == [0, 1, 2]
    with pytest.raises(SchemaMismatchError, match="column 'id'.*expected an integer.*'one'"):
        dfio.write_partition([{"id": "one"}], str(tmp_path / "w"), 0, [Field("id", "int64")], "NONE", None)


def test_unsupported_spark_column_type_is_named(spark, tmp_path):
    from decimal import Decimal

    df = spark.createDataFrame([(Decimal("1.5"),)], "price decimal(10,2)")
    with pytest.raises(duotf.ConfigError, match="column 'price' has type decimal\\(10,2\\)"):
        dfio.spark_to_tfrecords(df, str(tmp_path / "d"))


# -- values survive round trips: NaN, infinities, nulls, empty lists, every supported type -----
def _exact(value):
    """A value comparable with ==: NaN as "NaN", nulls as None, numpy values as Python ones."""
    if value is None or type(value).__name__ == "NAType":
        return None
    if isinstance(value, (bytes, bytearray, str)):
        return bytes(value) if isinstance(value, bytearray) else value
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_exact(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return value


def _exact_rows(rows):
    return sorted(({k: _exact(v) for k, v in r.items()} for r in rows), key=lambda r: r["id"])


NAN, INF = float("nan"), float("inf")


def _all_types_frame(spark):
    from pyspark.sql import types as T

    def array(t):
        return T.ArrayType(t, containsNull=False)

    struct = T.StructType([
        T.StructField("id", T.LongType(), False),
        T.StructField("flag", T.BooleanType(), True),
        T.StructField("tiny", T.ByteType(), True),
        T.StructField("small", T.ShortType(), True),
        T.StructField("int", T.IntegerType(), True),
        T.StructField("big", T.LongType(), True),
        T.StructField("f32", T.FloatType(), True),
        T.StructField("f64", T.DoubleType(), True),
        T.StructField("text", T.StringType(), True),
        T.StructField("blob", T.BinaryType(), True),
        T.StructField("longs", array(T.LongType()), True),
        T.StructField("doubles", array(T.DoubleType()), True),
        T.StructField("texts", array(T.StringType()), True),
        T.StructField("blobs", array(T.BinaryType()), True),
        T.StructField("flags", array(T.BooleanType()), True),
        T.StructField("never", array(T.IntegerType()), True),  # empty in every row
    ])
    floats = [0.5, NAN, INF, -INF, None, -2.25]  # all exact in float32, which TF stores
    rows = []
    for i in range(12):
        def pick(values):
            return values[i % len(values)]

        rows.append((
            i, pick([True, False, None]), pick([-128, 127, None]), pick([-32768, 7, None]),
            pick([2**31 - 1, -5, None]), pick([2**62, -1, None]), pick(floats), pick(floats[::-1]),
            pick(["héllo", "", None]), pick([b"\x00\xff", b"", None]),
            pick([[], [1], None, [2**40, -3]]), pick([[], [NAN], [INF, -INF, 1.5], None]),
            pick([[], ["a"], None]), pick([[b""], [], None, [b"x", b"\x00"]]),
            pick([[True], [], [False, True], None]), [],
        ))
    return spark.createDataFrame(rows, struct).repartition(3), struct, rows


def test_every_spark_type_round_trips_through_spark_and_dask(spark, dask_client, tmp_path):
    df, struct, rows = _all_types_frame(spark)
    original = _exact_rows(dict(zip(struct.names, r)) for r in rows)
    out = str(tmp_path / "all_types")
    dfio.spark_to_tfrecords(df, out, compression="ZLIB")

    # with the Spark schema the files were written from: the same types and values, exactly
    back = dfio.tfrecords_to_spark(spark, out, schema=struct)
    assert back.schema == struct
    assert _exact_rows(r.asDict() for r in back.collect()) == original

    # inferred: booleans come back as 0/1 longs, every other value unchanged
    def as_int(v):
        return v if v is None else [int(x) for x in v] if isinstance(v, list) else int(v)

    inferred = [dict(r, flag=as_int(r["flag"]), flags=as_int(r["flags"])) for r in original]
    text = {"text": "string", "texts": "string"}
    from_spark = dfio.tfrecords_to_spark(spark, out, bytes_as=text)
    assert _exact_rows(r.asDict() for r in from_spark.collect()) == inferred
    assert dict(from_spark.dtypes)["never"] == "array<bigint>"  # the kind its empty lists carry
    from_dask = dfio.tfrecords_to_dask(out, bytes_as=text).compute()
    assert _exact_rows(from_dask.to_dict("records")) == inferred
    assert str(from_dask["f64"].dtype) == "Float32" and str(from_dask["flag"].dtype) == "Int64"


def test_dask_round_trips_keep_float_lists_nan_and_nulls(dask_client, tmp_path):
    import dask
    import dask.dataframe as dd
    import numpy as np
    import pandas as pd

    scores = pd.arrays.FloatingArray(np.array([0.5, 0, NAN, INF, -INF, 1.5, 0, 2], np.float32),
                                     np.array([0, 1, 0, 0, 0, 0, 1, 0], bool))
    pdf = pd.DataFrame({
        "id": np.arange(8, dtype=np.int64),
        "vec": [[2.0, 0.5], [], None, [NAN, INF, -INF], [1.0], [3.5], [], [0.0]],
        "count": pd.array([1, None, 3, 4, None, 6, 7, 8], dtype="Int64"),
        "score": scores,
        "flag": np.array([True, False] * 4),
        "word": [None, "b", "", "d", "e", "f", "g", "h"],
    })
    assert pdf["word"].isna().tolist() == [True] + [False] * 7
    words = [None, "b", "", "d", "e", "f", "g", "h"]  # pandas' str dtype holds None as NaN
    expected = _exact_rows(dict(r, flag=int(r["flag"]), word=words[r["id"]])
                           for r in pdf.to_dict("records"))
    assert expected[2]["score"] == "NaN" and expected[1]["score"] is None
    with dask.config.set({"dataframe.convert-string": False}):
        ddf = dd.from_pandas(pdf, npartitions=2)
    dfio.dask_to_tfrecords(ddf, str(tmp_path / "one"))
    first = dfio.tfrecords_to_dask(str(tmp_path / "one"), bytes_as="string")
    assert _exact_rows(first.compute().to_dict("records")) == expected
    # a frame read back writes again: its float lists hold Python floats such as 2.0
    dfio.dask_to_tfrecords(first, str(tmp_path / "two"))
    second = dfio.tfrecords_to_dask(str(tmp_path / "two"), bytes_as="string")
    assert _exact_rows(second.compute().to_dict("records")) == expected


def test_empty_list_and_null_rules_of_the_schema(tmp_path):
    from duotf.io.example import _example_classes, example_to_row, row_to_example

    kindless = _example_classes()()
    kindless.features.feature["none"].SetInParent()  # a feature with no list at all
    records = [encode_example({"i": ("int64", []), "f": ("float", []), "b": ("bytes", []),
                               "s": ("bytes", [])}) + kindless.SerializeToString()] * 3
    schema = infer_schema(records, bytes_as={"s": "string"})
    assert [(f.name, f.kind, f.is_list) for f in schema] == [
        ("b", "bytes", True), ("f", "float", True), ("i", "int64", True), ("none", "float", True),
        ("s", "string", True)]
    assert example_to_row(records[0], schema) == {"b": [], "f": [], "i": [], "none": [], "s": []}
    # an empty list reads as an empty list of whatever kind the schema says
    assert example_to_row(records[0], [Field("i", "string", is_list=True)]) == {"i": []}
    floats = [Field("x", "float"), Field("v", "float", is_list=True)]
    row = example_to_row(row_to_example({"x": NAN, "v": [INF, NAN, -INF]}, floats), floats)
    assert math.isnan(row["x"]) and row["v"][0] == INF and math.isnan(row["v"][1])
    assert example_to_row(row_to_example({"x": None, "v": None}, floats), floats) == {"x": None, "v": None}
    with pytest.raises(SchemaMismatchError, match="column 'v'.*a null inside a list"):
        row_to_example({"x": 1.0, "v": [1.0, None]}, floats)
