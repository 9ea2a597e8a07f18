"""The same partitions as a collection of each backend's engine, for the feed tests."""

from __future__ import annotations

from typing import List


def rows_collection(backend_kind: str, backend, parts: List[list]):
    """An RDD / Bag / list whose partition i holds exactly ``parts[i]`` (rows are tuples)."""
    if backend_kind in ("local", "procpool"):  # a list of partitions
        return [list(p) for p in parts]
    if backend_kind == "dask":
        import dask
        import dask.bag as db

        return db.from_delayed([dask.delayed(list)(p) for p in parts])
    sc = backend.sc
    return sc.parallelize(parts, len(parts)).flatMap(lambda part: part)


def frame_collection(backend_kind: str, backend, parts: List[list], columns: List[str]):
    """A DataFrame (pandas partitions for local) with ``parts[i]`` as partition i."""
    import pandas as pd

    dtypes = pd.DataFrame(next(p for p in parts if p), columns=columns).dtypes
    frames = [pd.DataFrame(p or None, columns=columns).astype(dtypes) for p in parts]
    if backend_kind in ("local", "procpool"):  # a list of partitions
        return frames
    if backend_kind == "dask":
        import dask
        import dask.dataframe as dd

        with dask.config.set({"dataframe.convert-string": False}):
            return dd.from_delayed([dask.delayed(lambda f: f)(f) for f in frames], meta=frames[0].iloc[:0])
    from pyspark.sql import SparkSession

    rdd = rows_collection(backend_kind, backend, parts)
    return SparkSession(backend.sc).createDataFrame(rdd, list(columns))


def tensor_collection(backend_kind: str, backend, sizes: List[int], width: int, packed: bool = True):
    """Partitions of rows ``x = id * 10 + [0, 1, ..., width)`` (float32) and ``id``, as each engine
    holds a tensor column best: a packed tensor column (Spark), a 2-D array (Dask), columns
    (local). Returns ``(data, input_mapping)``; ``packed=False`` leaves Spark's ``array<float>``."""
    import numpy as np

    bounds = np.cumsum([0] + list(sizes))

    def block(p):
        ids = np.arange(bounds[p], bounds[p + 1], dtype=np.int64)
        return (ids[:, None] * 10 + np.arange(width)).astype(np.float32), ids

    if backend_kind in ("local", "procpool"):  # a list of partitions
        return [dict(zip(("x", "id"), block(p))) for p in range(len(sizes))], None
    if backend_kind == "dask":
        import dask.array as da

        xs, ids = zip(*(block(p) for p in range(len(sizes))))
        x = da.concatenate([da.from_array(b, chunks=(max(len(b), 1), width)) for b in xs])
        i = da.concatenate([da.from_array(b, chunks=max(len(b), 1)) for b in ids])
        return (x, i), {"0": "x", "1": "id"}
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from duotf.spark import pack_tensors

    parts = [[(row.tolist(), int(i)) for row, i in zip(*block(p))] for p in range(len(sizes))]
    rdd = backend.sc.parallelize(parts, len(parts)).flatMap(lambda part: part)
    df = SparkSession(backend.sc).createDataFrame(rdd, "x array<float>, id long")
    return (pack_tensors(df, "x") if packed else df), None
