"""Partitions of any engine as columnar batches: ``{name: numpy array | list of str/bytes}``."""

from __future__ import annotations

from typing import Dict, Iterable, Iterator, List

import numpy as np

Columns = Dict[str, object]


def num_rows(cols: Columns) -> int:
    return len(next(iter(cols.values()))) if cols else 0


def slice_cols(cols: Columns, start: int, stop: int) -> Columns:
    return {k: v[start:stop] for k, v in cols.items()}


def concat_cols(parts: List[Columns]) -> Columns:
    if len(parts) == 1:
        return parts[0]
    out = {}
    for key in parts[0]:
        values = [p[key] for p in parts]
        out[key] = np.concatenate(values) if isinstance(values[0], np.ndarray) else sum(values, [])
    return out


def _stack(values: list):
    first = values[0] if values else None
    if isinstance(first, (str, bytes, bytearray)):
        return list(values)
    return np.asarray(values) if not isinstance(first, np.ndarray) else np.stack(values)


def from_rows(rows: list) -> Columns:
    """Rows as tuples/lists (columns "0", "1", ...), dicts (their keys) or scalars (column "0")."""
    if not rows:
        return {}
    first = rows[0]
    if isinstance(first, dict):
        return {k: _stack([r[k] for r in rows]) for k in first}
    if hasattr(first, "asDict"):  # a pyspark Row
        return {k: _stack([r[i] for r in rows]) for i, k in enumerate(first.__fields__)}
    if isinstance(first, (tuple, list)) and not isinstance(first, (str, bytes)):
        return {str(i): _stack([r[i] for r in rows]) for i in range(len(first))}
    return {"0": _stack(rows)}


def from_pandas(df) -> Columns:
    cols = {}
    for name in df.columns:
        series = df[name]
        if series.dtype == object or str(series.dtype) in ("string", "str"):
            values = series.tolist()
            first = values[0] if values else None
            cols[str(name)] = (np.stack([np.asarray(v) for v in values])
                               if isinstance(first, (list, tuple, np.ndarray)) else values)
        else:
            cols[str(name)] = series.to_numpy()
    return cols


TENSOR_KEY = "duotf.tensor"


def tensor_specs(spark_schema) -> Dict[str, tuple]:
    """``{column: (dtype, shape)}`` of the binary tensor columns of a Spark schema (see
    :func:`duotf.spark.pack_tensors`)."""
    specs = {}
    for field in spark_schema.fields:
        meta = (field.metadata or {}).get(TENSOR_KEY)
        if meta:
            specs[field.name] = (meta["dtype"], tuple(meta["shape"]))
    return specs


def decode_tensor(column, name: str, dtype: str, shape: tuple) -> np.ndarray:
    """A binary Arrow column of fixed-size values as an ``(n, *shape)`` array, without a copy."""
    import pyarrow as pa

    dt = np.dtype(dtype)
    width = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    n = len(column)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.null_count:
        raise ValueError(f"tensor column {name!r} has {column.null_count} nulls; a tensor column "
                         "needs a value in every row")
    if not n:
        return np.empty((0, *shape), dtype=dt)
    offsets_type = np.int64 if pa.types.is_large_binary(column.type) else np.int32
    offsets = np.frombuffer(column.buffers()[1], dtype=offsets_type)[column.offset:column.offset + n + 1]
    sizes = np.diff(offsets)
    bad = np.flatnonzero(sizes != width)
    if bad.size:
        raise ValueError(f"tensor column {name!r}: row {int(bad[0])} holds {int(sizes[bad[0]])} bytes "
                         f"but {dtype}{list(shape)} needs {width}; pack the column with "
                         "duotf.spark.pack_tensors")
    data = np.frombuffer(column.buffers()[2], dtype=np.uint8)[offsets[0]:offsets[0] + n * width]
    if data.ctypes.data % dt.alignment:
        data = data.copy()
    return data.view(dt).reshape(n, *shape)


def from_arrow(batch, tensors: Dict[str, tuple] = None) -> Columns:
    import pyarrow as pa

    cols = {}
    for name, column in zip(batch.schema.names, batch.columns):
        t = column.type
        if tensors and name in tensors:
            cols[name] = decode_tensor(column, name, *tensors[name])
        elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            n = len(column)
            flat = column.flatten().to_numpy(zero_copy_only=False)
            cols[name] = flat.reshape(n, -1) if n else flat.reshape(0, 0)
        elif pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t):
            cols[name] = column.to_pylist()
        else:
            cols[name] = column.to_numpy(zero_copy_only=False)
    return cols


def to_columns(part) -> Columns:
    """One partition (or chunk) of any supported kind as columns."""
    if isinstance(part, np.ndarray):
        return {"0": part}
    if hasattr(part, "columns") and hasattr(part, "dtypes"):  # pandas
        return from_pandas(part)
    if hasattr(part, "schema") and hasattr(part, "num_rows"):  # pyarrow RecordBatch
        return from_arrow(part)
    return from_rows(list(part))


def chunked(rows: Iterable, chunk_rows: int) -> Iterator[Columns]:
    """Columns of ``chunk_rows`` rows at a time from a row iterator (bounded memory)."""
    buf = []
    for row in rows:
        buf.append(row)
        if len(buf) >= chunk_rows:
            yield from_rows(buf)
            buf = []
    if buf:
        yield from_rows(buf)


def split(cols: Columns, chunk_rows: int) -> Iterator[Columns]:
    n = num_rows(cols)
    for start in range(0, n, chunk_rows):
        yield slice_cols(cols, start, min(start + chunk_rows, n))
