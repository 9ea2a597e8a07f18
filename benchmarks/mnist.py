"""The benchmarks' MNIST-like Spark DataFrame: 784 float32 values (an ``array<float>`` column,
``features``) and an int64 ``label`` a row, 3,144 bytes of data.

Imports only pyspark, when called, so that a peer's own environment (``benchmarks/petastorm_peer.py``,
run in a venv without duotf) builds the very DataFrame that ``benchmarks.feed.spark_data`` feeds
duotf.
"""

from __future__ import annotations

#: the bytes of one row's data: 784 float32 values and an int64 label
ROW_BYTES = 784 * 4 + 8


#: each of a row's 784 values of its own, in [0, 1): a multiplicative hash of the row's id and
#: the value's place (exact in a long up to 4 million rows)
VARIED = ("transform(sequence(0, 783), j -> cast(((id * 784 + j) * 2654435761L % 4294967296L) "
          "/ 4294967296.0 as float))")


def mnist_frame(session, rows: int, partitions: int, varied: bool = False):
    """``rows`` MNIST-like rows in ``partitions`` partitions, neither cached nor computed: row
    ``i`` holds label ``i % 10`` and 784 times the value ``(i % 255) / 255`` (what
    ``benchmarks.feed`` feeds), or with ``varied`` 784 values of its own (``VARIED``), which a
    columnar file cannot encode in a few bytes a row as it does a repeated value."""
    from pyspark.sql import functions as F

    df = session.range(0, rows, numPartitions=partitions)
    features = (F.expr(VARIED) if varied else
                F.array_repeat((F.col("id") % 255 / 255.0).cast("float"), 784))
    return df.select(features.alias("features"), (F.col("id") % 10).alias("label"))
