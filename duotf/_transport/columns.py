"""Partitions of any engine as columnar batches: ``{name: numpy array | list of str/bytes}``."""

from __future__ import annotations

import functools
import itertools
import operator
import os
import re
from typing import TYPE_CHECKING, Any, Collection, Dict, Iterable, Iterator, List, Optional, Tuple, cast

import numpy as np

from duotf._names import public
from duotf.errors import ConfigError, FeedProblem, FeedSchemaError, feed_schema_error

if TYPE_CHECKING:  # TensorFlow is imported where a tensor is made
    import tensorflow as tf

#: a batch's columns by name: numpy arrays, RaggedColumns, or lists (of strings, of bytes)
Columns = Dict[str, Any]


def num_rows(cols: Columns) -> int:
    return len(next(iter(cols.values()))) if cols else 0


def slice_cols(cols: Columns, start: int, stop: int) -> Columns:
    return {k: v[start:stop] for k, v in cols.items()}


def concat_cols(parts: List[Columns]) -> Columns:
    if len(parts) == 1:
        return parts[0]
    out: Columns = {}
    for key in parts[0]:
        values = [p[key] for p in parts]
        if isinstance(values[0], np.ndarray):
            out[key] = np.concatenate(values)
        elif isinstance(values[0], RaggedColumn):
            out[key] = RaggedColumn.concat(values)
        else:
            out[key] = sum(values, [])
    return out


@public("duotf")
class RaggedColumn:
    """A column whose rows hold different numbers of values: how a node receives a column
    declared with ``cluster.train(..., ragged=[name])``.

    ``values`` holds every row's values end to end (1-D), ``row_splits`` (int64, one more
    than the rows) where each row starts and ends: row ``i`` is
    ``values[row_splits[i]:row_splits[i + 1]]``, as in ``tf.RaggedTensor.from_row_splits``.
    ``len()`` is the number of rows; indexing a row gives its values (a numpy view), and
    iterating gives every row's; a slice is a RaggedColumn of its rows (no copy).
    :meth:`to_tensor` makes the ``tf.RaggedTensor``; ``feed.dataset()`` yields one.
    """

    __slots__ = ("_values", "_splits")

    def __init__(self, values: np.ndarray, row_splits: np.ndarray):
        self._values = values  # the slice's rows lie in values[_splits[0]:_splits[-1]]
        self._splits = row_splits

    @classmethod
    def concat(cls, parts: List["RaggedColumn"]) -> "RaggedColumn":
        values = np.concatenate([p.values for p in parts])
        lengths = np.concatenate([p.row_lengths for p in parts])
        splits = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=splits[1:])
        return cls(values, splits)

    def take(self, order: np.ndarray) -> "RaggedColumn":
        """The rows in ``order`` (a copy)."""
        lengths = self.row_lengths[order]
        splits = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(lengths, out=splits[1:])
        starts = self._splits[:-1][order]
        index = (np.repeat(starts - splits[:-1], lengths)
                 + np.arange(int(splits[-1]), dtype=np.int64))
        return type(self)(self._values[index], splits)

    @property
    def values(self) -> np.ndarray:
        return self._values[self._splits[0]:self._splits[-1]]

    @property
    def row_splits(self) -> np.ndarray:
        return self._splits - self._splits[0]

    @property
    def row_lengths(self) -> np.ndarray:
        return np.diff(self._splits)

    @property
    def dtype(self) -> np.dtype:
        return self._values.dtype

    @property
    def nbytes(self) -> int:
        return int(self._splits[-1] - self._splits[0]) * self._values.itemsize + self._splits.nbytes

    def __len__(self) -> int:
        return len(self._splits) - 1

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                raise ValueError("a RaggedColumn slices with step 1 only")
            return RaggedColumn(self._values, self._splits[start:max(start, stop) + 1])
        i = range(len(self))[key]
        return self._values[self._splits[i]:self._splits[i + 1]]

    def __iter__(self):
        values, splits = self._values, self._splits
        return (values[a:b] for a, b in zip(splits[:-1].tolist(), splits[1:].tolist()))

    def to_list(self) -> list:
        return [row.tolist() for row in self]

    def to_tensor(self) -> tf.RaggedTensor:
        """The rows as a ``tf.RaggedTensor`` (``values`` and ``row_splits`` as its components)."""
        import tensorflow as tf

        return tf.RaggedTensor.from_row_splits(self.values, self.row_splits, validate=False)

    def __repr__(self) -> str:
        return f"RaggedColumn({len(self)} rows, {self._splits[-1] - self._splits[0]} {self.dtype} values)"


def ragged_columns(ragged) -> Tuple[str, ...]:
    """The columns declared ragged, as names (a single name, or an iterable of names)."""
    if ragged is None:
        return ()
    names = (ragged,) if isinstance(ragged, (str, int)) else tuple(ragged)
    for name in names:
        if not isinstance(name, (str, int)) or isinstance(name, bool):
            raise ConfigError(f"ragged={ragged!r}: give column names (str; or int for row "
                              "positions, which name the columns \"0\", \"1\", ...)")
    return tuple(str(name) for name in names)


# -- validation at the source: refuse what would otherwise change silently -----------------------
# Every check is one vectorised pass over a chunk's column (null counts, list offsets); the row
# of a problem is looked for only once there is one. Rows are counted within the chunk; the
# feeding task places the error in its partition (FeedSchemaError.located).

#: For benchmarks only (benchmarks/validation.py measures what the checks cost): with the
#: environment variable ``DUOTF_FEED_VALIDATE=0`` in a feeding process, read once when this
#: module is imported, the per-value checks (nulls, one length per array column) are skipped,
#: and such data is changed or fails as it did before validation. The checks of a column's type
#: (arrays of strings, nested arrays), which cost nothing per value, always run. Not an API.
VALIDATE = os.environ.get("DUOTF_FEED_VALIDATE", "1").strip() != "0"

def _null(name: str, row: int, inside: bool = False) -> FeedSchemaError:
    what = ("a null value inside the array at {where}" if inside else "a null at {where}")
    return feed_schema_error(
        name, row, FeedProblem.NULL,
        what + ": nulls are refused rather than converted (to NaN, or an "
        "integer column to float)",
        f"fill or drop them before feeding: df.fillna({{{name!r}: ...}}) or "
        f"df.dropna(subset=[{name!r}]) (Spark, pandas, Dask), or a filter")


def _ragged(name: str, row: int, length: int, expected: int) -> FeedSchemaError:
    return feed_schema_error(
        name, row, FeedProblem.RAGGED,
        f"rows of different lengths: {{where}} holds {length} values where "
        f"the rows before it hold {expected}",
        "a fixed-shape column needs one length in every row: filter or pad the rows to one "
        "length (duotf.spark.pack_tensors then feeds it fastest), or declare the column "
        f"ragged: cluster.train(..., ragged=[{name!r}])")


def _not_numbers(name: str, row: int, kind: str) -> FeedSchemaError:
    return feed_schema_error(
        name, row, FeedProblem.TYPE,
        f"{{where}} holds an array of {kind}: arrays of strings, bytes or "
        "other non-numbers, and nested arrays, cannot be fed (an array column must hold numbers)",
        "encode the values as numbers (e.g. ids from a vocabulary or StringIndexer), or join "
        "each row's values into one string or binary column (which feeds as str/bytes), or "
        "flatten a nested array into one array of numbers per row "
        "(pyspark.sql.functions.flatten) and reshape it in the node")


#: an array of numbers as numpy or Python prints it ("[0. 1. 2.]", "[1, 2]", "[0 1 ... 9]")
_ARRAY_TEXT = re.compile(r"\[[\s0-9.,eE+\-nanif]*[0-9][\s0-9.,eE+\-nanif]*\]")


def _array_text(name: str, row: int, text: str) -> FeedSchemaError:
    """A string column whose strings are printed arrays: Dask's "dataframe.convert-string" made
    them of a column of arrays (pandas keeps such a column as objects), and they cannot be read
    back (numpy prints a long array with "...")."""
    return feed_schema_error(
        name, row, FeedProblem.TYPE,
        f"{{where}} holds the string {text[:40]!r}: an array turned into text, as Dask turns "
        "a column of arrays into strings when it makes a DataFrame (its setting "
        "\"dataframe.convert-string\", on by default); the arrays cannot be read back from it",
        "make the Dask DataFrame with that setting off: "
        "with dask.config.set({\"dataframe.convert-string\": False}): ddf = dd.from_pandas(...) "
        "(or from_delayed, read_parquet, ...)")


def _numpy_kind(arr: np.ndarray) -> str:
    """What a non-numeric array holds, in words."""
    if arr.dtype.kind == "U":
        return "strings"
    if arr.dtype.kind == "S":
        return "bytes"
    first = next((v for v in arr.flat if v is not None), None)
    if isinstance(first, (list, tuple, np.ndarray)):
        return "arrays (a nested array)"
    return f"{type(first).__name__} values" if first is not None else f"{arr.dtype} values"


def _arrow_kind(value_type) -> Optional[str]:
    """What an Arrow list's values are, in words, where they are not numbers; None where they are."""
    import pyarrow as pa

    if pa.types.is_integer(value_type) or pa.types.is_floating(value_type) or pa.types.is_boolean(value_type):
        return None
    if pa.types.is_string(value_type) or pa.types.is_large_string(value_type):
        return "strings"
    if pa.types.is_binary(value_type) or pa.types.is_large_binary(value_type):
        return "bytes"
    if (pa.types.is_list(value_type) or pa.types.is_large_list(value_type)
            or pa.types.is_fixed_size_list(value_type)):
        return f"arrays ({value_type}: a nested array)"
    return f"{value_type} values"


def _inner_ragged(name: str, values: list) -> FeedSchemaError:
    """The rows' arrays hold arrays of different shapes (rows of nested lists or of N-D arrays):
    found on the error path only, where numpy could not stack them."""
    shapes = [np.shape(np.asarray(v, dtype=object)) for v in values]
    row = next((i for i, shape in enumerate(shapes) if shape != shapes[0]), 0)
    return feed_schema_error(
        name, row, FeedProblem.RAGGED,
        f"arrays of different shapes: {{where}} holds an array of shape "
        f"{list(shapes[row])} where the rows before it hold {list(shapes[0])}",
        "every row of an array column needs one shape: filter or pad the rows, or flatten each "
        "row into one array of numbers and declare the column ragged: "
        f"cluster.train(..., ragged=[{name!r}])")


def _uneven(name: str, values: list) -> FeedSchemaError:
    """Why numpy could not stack the rows of an array column (found on the error path only): a
    row of another length, a row that is no array, or arrays of other shapes within rows."""
    lengths = [len(v) if hasattr(v, "__len__") else None for v in values]
    for row, length in enumerate(lengths):
        if length is None:
            return feed_schema_error(
                name, row, FeedProblem.TYPE,
                f"{{where}} holds a {type(values[row]).__name__} value where "
                "the rows before it hold arrays", "give every row of an array column an array of "
                "numbers (a missing value: drop or fill it)")
        if length != lengths[0]:
            return _ragged(name, row, length, cast(int, lengths[0]))  # row 0 holds an array
    return _inner_ragged(name, values)


def _first_true(mask) -> int:
    return int(np.argmax(np.asarray(mask, dtype=bool)))


def _none_mask(values: list) -> list:
    return list(map(operator.is_, values, itertools.repeat(None)))


def _stack(name: str, values: list, ragged: Collection[str] = ()):
    """One column of Python values: a numpy array, a list of str/bytes, or a RaggedColumn."""
    if VALIDATE and any(map(operator.is_, values, itertools.repeat(None))):
        raise _null(name, _first_true(_none_mask(values)))
    first = values[0] if values else None
    if isinstance(first, (str, bytes, bytearray)):
        return list(values)
    if isinstance(first, (list, tuple, np.ndarray)):
        if name in ragged:
            try:
                lengths = np.fromiter(map(len, values), np.int64, len(values))
            except TypeError:  # a row that is no array
                raise _uneven(name, values) from None
            splits = np.zeros(len(values) + 1, dtype=np.int64)
            np.cumsum(lengths, out=splits[1:])
            try:
                flat = (np.concatenate(values) if isinstance(first, np.ndarray)
                        else np.asarray(list(itertools.chain.from_iterable(values))))
            except ValueError:  # rows of nested arrays of different shapes
                flat = np.asarray(list(itertools.chain.from_iterable(values)), dtype=object)
            if flat.dtype == object and any(_none_mask(list(flat.ravel()))):
                raise _null(name, int(np.searchsorted(splits, _first_true(_none_mask(list(flat))),
                                                      side="right") - 1), inside=True)
            if flat.dtype.kind not in "biuf" or flat.ndim > 1:
                row = int(np.searchsorted(splits, 0, side="right") - 1)  # the first row with values
                raise _not_numbers(name, min(row, len(values) - 1),
                                   "arrays (a nested array)" if flat.ndim > 1 else _numpy_kind(flat))
            return RaggedColumn(flat, splits)
        try:
            # numpy refuses rows of different lengths or shapes itself (no pass over the rows
            # here: only the error's row is looked for)
            arr = np.asarray(values) if not isinstance(first, np.ndarray) else np.stack(values)
        except (ValueError, TypeError):
            if not VALIDATE:
                raise
            raise _uneven(name, values) from None
    else:
        arr = np.asarray(values)
    if arr.ndim > 1 and arr.dtype.kind not in "biuf":
        if arr.dtype == object and VALIDATE:  # a None among the values of an array
            rows = [any(map(operator.is_, np.asarray(row, dtype=object).ravel(), itertools.repeat(None)))
                    for row in values]
            if any(rows):
                raise _null(name, _first_true(rows), inside=True)
        raise _not_numbers(name, 0, _numpy_kind(arr))
    return arr


def from_rows(rows: list, ragged: Collection[str] = ()) -> Columns:
    """Rows as tuples/lists (columns "0", "1", ...), dicts (their keys) or scalars (column "0").

    A None is refused (:class:`~duotf.errors.FeedSchemaError`), and so are the rows of an array
    column of different lengths, unless the column is in ``ragged``."""
    if not rows:
        return {}
    first = rows[0]
    if isinstance(first, dict):
        return {k: _stack(k, [r[k] for r in rows], ragged) for k in first}
    if hasattr(first, "asDict"):  # a pyspark Row
        return {k: _stack(k, [r[i] for r in rows], ragged) for i, k in enumerate(first.__fields__)}
    if isinstance(first, (tuple, list)) and not isinstance(first, (str, bytes)):
        return {str(i): _stack(str(i), [r[i] for r in rows], ragged) for i in range(len(first))}
    return {"0": _stack("0", rows, ragged)}


def from_pandas(df, ragged: Collection[str] = ()) -> Columns:
    """A pandas frame's columns. What pandas calls missing (``isna``: None, NaN, NA) is a null,
    and refused, as are ragged array columns not in ``ragged``."""
    import pandas as pd

    cols = {}
    for name in df.columns:
        key = str(name)
        series = df[name]
        dtype = series.dtype
        if dtype == object or pd.api.types.is_string_dtype(dtype):
            values = series.tolist()
            arrays = bool(values) and isinstance(values[0], (list, tuple, np.ndarray))
            if VALIDATE and not arrays:
                missing = series.isna().to_numpy()
                if missing.any():
                    raise _null(key, _first_true(missing))
            if dtype != object and values and isinstance(values[0], str) \
                    and _ARRAY_TEXT.fullmatch(values[0]):
                raise _array_text(key, 0, values[0])
            try:
                cols[key] = _stack(key, values, ragged)
            except FeedSchemaError:
                # a column of arrays is checked for missing values (NaN, NA: None is _stack's)
                # only once it failed: pandas' isna costs as much again as the stacking checks
                missing = series.isna().to_numpy() if arrays else np.zeros(0, bool)
                if missing.any():
                    raise _null(key, _first_true(missing)) from None
                raise
        elif isinstance(dtype, pd.api.extensions.ExtensionDtype):  # Int64, Float64, boolean...
            if VALIDATE:
                missing = series.isna().to_numpy()
                if missing.any():
                    raise _null(key, _first_true(missing))
            numpy_dtype = getattr(dtype, "numpy_dtype", None)
            cols[key] = series.to_numpy(dtype=numpy_dtype) if numpy_dtype is not None else series.to_numpy()
        else:
            values = series.to_numpy()
            if VALIDATE and values.dtype.kind in "fc":
                missing = np.isnan(values)
                if missing.any():
                    raise _null(key, _first_true(missing))
            cols[key] = values
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


def _binary_offsets(column, name: str):
    """``(column, offsets)`` of a binary Arrow column (chunks combined; the ``n + 1`` offsets of
    its slice, None when it has no row); a null row refused."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.null_count:
        raise _null(name, _first_true(column.is_null().to_numpy(zero_copy_only=False)))
    n = len(column)
    if not n:
        return column, None
    kind = np.int64 if pa.types.is_large_binary(column.type) else np.int32
    return column, np.frombuffer(column.buffers()[1], dtype=kind)[column.offset:column.offset + n + 1]


def _binary_values(column, start: int, stop: int, dt: np.dtype) -> np.ndarray:
    """Bytes ``start:stop`` of a binary column's data as ``dt`` values (copied only if unaligned)."""
    data = np.frombuffer(column.buffers()[2], dtype=np.uint8)[start:stop]
    if data.ctypes.data % dt.alignment:
        data = data.copy()
    return data.view(dt)


def decode_tensor(column, name: str, dtype: str, shape: Optional[tuple],
                  ragged: Collection[str] = ()):
    """A binary Arrow column of fixed-size values as an ``(n, *shape)`` array, without a copy.

    ``shape`` None: an array column packed in the JVM (:func:`duotf.backends.spark.jvm.pack`), each value the
    raw elements of one row, decoded as the list column it was (:func:`_list_column`): an
    ``(n, width)`` array, or a RaggedColumn when ``name`` is in ``ragged``; a row of a length
    other than the first row's, a null row and a row with a null element (packed as one byte,
    which no element size divides) are refused as there."""
    dt = np.dtype(dtype)
    if shape is None:
        return _packed_list(column, name, dt, ragged)
    width = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    column, offsets = _binary_offsets(column, name)
    if offsets is None:
        return np.empty((0, *shape), dtype=dt)
    n = len(column)
    sizes = np.diff(offsets)
    bad = np.flatnonzero(sizes != width)
    if bad.size:
        row = int(bad[0])
        raise feed_schema_error(
            name, row, FeedProblem.RAGGED,
            f"{{where}} holds {int(sizes[row])} bytes where {dtype}{list(shape)} "
            f"needs {width}", "pack the column with duotf.spark.pack_tensors")
    return _binary_values(column, offsets[0], offsets[0] + n * width, dt).reshape(n, *shape)


def _packed_list(column, name: str, dt: np.dtype, ragged: Collection[str]):
    column, offsets = _binary_offsets(column, name)
    if offsets is None:
        empty = np.empty(0, dtype=dt)
        return RaggedColumn(empty, np.zeros(1, np.int64)) if name in ragged else empty.reshape(0, 0)
    sizes = np.diff(offsets)
    odd = np.flatnonzero(sizes % dt.itemsize)
    if odd.size:
        raise _null(name, int(odd[0]), inside=True)
    values = _binary_values(column, offsets[0], offsets[-1], dt)
    if name in ragged:
        return RaggedColumn(values, ((offsets - offsets[0]) // dt.itemsize).astype(np.int64))
    width = int(sizes[0])
    bad = np.flatnonzero(sizes != width)
    if bad.size:
        row = int(bad[0])
        raise _ragged(name, row, int(sizes[row]) // dt.itemsize, width // dt.itemsize)
    return values.reshape(len(column), width // dt.itemsize)


@functools.lru_cache(maxsize=16)
def _even_offsets(n: int, width: int, dtype: str) -> bytes:
    """The offsets of ``n`` rows of ``width`` values each, as bytes (batches come in few sizes)."""
    return (np.arange(n + 1, dtype=dtype) * width).tobytes()


def _list_column(name: str, column, ragged: Collection[str]):
    """An Arrow list column as an ``(n, width)`` array, or a RaggedColumn when declared ragged;
    nulls (of rows or of values), rows of different lengths and arrays of anything but numbers
    (strings, bytes, nested arrays) are refused."""
    import pyarrow as pa

    n = len(column)
    if VALIDATE and column.null_count:
        raise _null(name, _first_true(column.is_null().to_numpy(zero_copy_only=False)))
    fixed = pa.types.is_fixed_size_list(column.type)
    offsets: Any = None  # an int32 or int64 array, for a list column of rows
    if not fixed and n:
        # the offsets buffer as it lies (the slice's n + 1 of them), without a pyarrow array
        kind = np.int64 if pa.types.is_large_list(column.type) else np.int32
        offsets = np.frombuffer(column.buffers()[1], kind)[column.offset:column.offset + n + 1]
    not_numbers = _arrow_kind(column.type.value_type)
    if not_numbers:
        # by the column's type, before any value is touched: numpy would hold such values as
        # objects, whose bytes on the wire would be pointers
        row = 0 if fixed or not n else int(np.searchsorted(offsets - offsets[0], 0, side="right") - 1)
        raise _not_numbers(name, min(row, max(n - 1, 0)), not_numbers)
    flat = column.flatten()
    if VALIDATE and flat.null_count:
        first = _first_true(flat.is_null().to_numpy(zero_copy_only=False))
        row = (first // max(column.type.list_size, 1) if fixed else
               int(np.searchsorted(offsets - offsets[0], first, side="right") - 1))
        raise _null(name, row, inside=True)
    values = flat.to_numpy(zero_copy_only=False)
    if fixed:
        return values.reshape(n, column.type.list_size)
    if not n:
        return RaggedColumn(values, np.zeros(1, np.int64)) if name in ragged else values.reshape(0, 0)
    if name in ragged:
        return RaggedColumn(values, (offsets - offsets[0]).astype(np.int64))
    if not VALIDATE:
        return values.reshape(n, -1)  # as before validation: rows of other lengths reshaped
    width = int(offsets[1] - offsets[0])
    # one length in every row: the offsets are 0, w, 2w, ... (one memcmp against a cached copy)
    even = offsets if offsets[0] == 0 else offsets - offsets[0]
    if even.tobytes() != _even_offsets(n, width, offsets.dtype.str):
        sizes = np.diff(offsets)
        row = int(np.flatnonzero(sizes != width)[0])
        raise _ragged(name, row, int(sizes[row]), width)
    return values.reshape(n, width)


def from_arrow(batch, tensors: Optional[Dict[str, Tuple[str, Optional[tuple]]]] = None,
               ragged: Collection[str] = ()) -> Columns:
    """An Arrow record batch's columns: list columns as 2-D arrays (RaggedColumn for those in
    ``ragged``), tensor columns (``tensors``) as their shape. Nulls are refused."""
    import pyarrow as pa

    cols = {}
    for name, column in zip(batch.schema.names, batch.columns):
        t = column.type
        if tensors and name in tensors:
            cols[name] = decode_tensor(column, name, *tensors[name], ragged=ragged)
        elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            cols[name] = _list_column(name, column, ragged)
        elif VALIDATE and column.null_count:
            raise _null(name, _first_true(column.is_null().to_numpy(zero_copy_only=False)))
        elif pa.types.is_decimal(t):
            raise feed_schema_error(
                name, 0, FeedProblem.TYPE,
                f"a {t} column at {{where}}: decimals are refused rather than rounded to "
                "binary floats", f"cast it first: df.withColumn({name!r}, "
                f"df[{name!r}].cast('double')) (Spark), or astype('float64') (pandas, Dask)")
        elif (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
              or pa.types.is_large_binary(t)):
            cols[name] = column.to_pylist()
        else:
            cols[name] = column.to_numpy(zero_copy_only=False)
    return cols


def to_columns(part, ragged: Collection[str] = ()) -> Columns:
    """One partition (or chunk) of any supported kind as columns."""
    if isinstance(part, np.ndarray):
        return {"0": part}
    if hasattr(part, "columns") and hasattr(part, "dtypes"):  # pandas
        return from_pandas(part, ragged)
    if hasattr(part, "schema") and hasattr(part, "num_rows"):  # pyarrow RecordBatch
        return from_arrow(part, ragged=ragged)
    return from_rows(list(part), ragged)


def chunked(rows: Iterable, chunk_rows: int, ragged: Collection[str] = ()) -> Iterator[Columns]:
    """Columns of ``chunk_rows`` rows at a time from a row iterator (bounded memory)."""
    buf = []
    for row in rows:
        buf.append(row)
        if len(buf) >= chunk_rows:
            yield from_rows(buf, ragged)
            buf = []
    if buf:
        yield from_rows(buf, ragged)


def split(cols: Columns, chunk_rows: int) -> Iterator[Columns]:
    n = num_rows(cols)
    for start in range(0, n, chunk_rows):
        yield slice_cols(cols, start, min(start + chunk_rows, n))
