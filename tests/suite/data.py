"""The same partitions as a collection of each backend's engine, for the feed tests."""

from __future__ import annotations

from typing import List


def rows_collection(backend_kind: str, backend, parts: List[list]):
    """An RDD / Bag / list whose partition i holds exactly ``parts[i]`` (rows are tuples)."""
    if backend_kind == "local":
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
    if backend_kind == "local":
        return frames
    if backend_kind == "dask":
        import dask
        import dask.dataframe as dd

        with dask.config.set({"dataframe.convert-string": False}):
            return dd.from_delayed([dask.delayed(lambda f: f)(f) for f in frames], meta=frames[0].iloc[:0])
    from pyspark.sql import SparkSession

    rdd = rows_collection(backend_kind, backend, parts)
    return SparkSession(backend.sc).createDataFrame(rdd, list(columns))
