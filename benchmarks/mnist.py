"""The benchmarks' MNIST-like Spark DataFrame: 784 float32 values (an ``array<float>`` column,
``features``) and an int64 ``label`` a row, 3,144 bytes of data.

Imports only pyspark, when called, so that a peer's own environment (``benchmarks/petastorm_peer.py``,
run in a venv without duotf) builds the very DataFrame that ``benchmarks.feed.spark_data`` feeds
duotf.
"""

from __future__ import annotations

#: the bytes of one row's data: 784 float32 values and an int64 label
ROW_BYTES = 784 * 4 + 8


def mnist_frame(session, rows: int, partitions: int):
    """``rows`` MNIST-like rows in ``partitions`` partitions (row ``i``: every value
    ``(i % 255) / 255``, label ``i % 10``), neither cached nor computed."""
    from pyspark.sql import functions as F

    df = session.range(0, rows, numPartitions=partitions)
    return df.select(F.array_repeat((F.col("id") % 255 / 255.0).cast("float"), 784).alias("features"),
                     (F.col("id") % 10).alias("label"))
