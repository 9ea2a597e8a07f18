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
    with pytest.raises(SchemaMismatchError, match="column 'id'.*expected an integer.*'one'"):
        dfio.write_partition([{"id": "one"}], str(tmp_path / "w"), 0, [Field("id", "int64")], "NONE", None)


def test_unsupported_spark_column_type_is_named(spark, tmp_path):
    from decimal import Decimal

    df = spark.createDataFrame([(Decimal("1.5"),)], "price decimal(10,2)")
    with pytest.raises(duotf.ConfigError, match="column 'price' has type decimal\\(10,2\\)"):
        dfio.spark_to_tfrecords(df, str(tmp_path / "d"))
