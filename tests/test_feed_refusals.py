"""What the feed refuses, and how it says so: nulls, ragged rows, strings or nested arrays
where numbers are expected, decimals; each refusal placed in its partition and row, typed
(``FeedSchemaError``) across the wire and in pickles."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from duotf.errors import FeedSchemaError
from duotf._transport import wire
from duotf._transport.columns import from_arrow


def test_from_arrow_refuses_nulls_and_ragged_rows_and_names_them():
    def refused(batch, **kw):
        with pytest.raises(FeedSchemaError) as info:
            from_arrow(batch, **kw)
        return info.value

    list_f = pa.list_(pa.float32())
    for column in (pa.array([1, 2, None], pa.int64()), pa.array([1.0, 2.0, None]),
                   pa.array([True, False, None]), pa.array(["a", "b", None]),
                   pa.array([[1.0], [2.0], None], list_f), pa.array([[1.0], [2.0], [None]], list_f)):
        err = refused(pa.RecordBatch.from_arrays([column], ["c"]))
        assert (err.column, err.row, err.problem, err.partition) == ("c", 2, "null", None), column.type
        assert str(err).startswith("column 'c': a null") and "fillna" in str(err)
    ragged = pa.array([[1.0, 2.0], [3.0, 4.0], [5.0], [6.0, 7.0, 8.0]], list_f)  # 8 values, 4 rows
    err = refused(pa.RecordBatch.from_arrays([ragged], ["v"]))
    assert (err.row, err.problem) == (2, "ragged")
    assert "row 2 holds 1 values where the rows before it hold 2" in str(err)
    assert "ragged=['v']" in str(err)
    sliced = pa.RecordBatch.from_arrays([ragged], ["v"]).slice(2)  # rows of 1 and 3 values
    assert refused(sliced).row == 1
    declared = from_arrow(sliced, ragged=("v",))["v"]
    assert declared.to_list() == [[5.0], [6.0, 7.0, 8.0]] and declared.row_splits.tolist() == [0, 1, 4]
    even = pa.RecordBatch.from_arrays([ragged], ["v"]).slice(0, 2)
    assert from_arrow(even)["v"].tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_ragged_column_travels_in_frames_and_slices_without_copies():
    from duotf import RaggedColumn
    from duotf._transport.columns import concat_cols, from_rows

    cols = from_rows([(0, [1.0]), (1, [2.0, 3.0]), (2, []), (3, [4.0, 5.0, 6.0])], ragged=("1",))
    column = cols["1"]
    assert isinstance(column, RaggedColumn) and len(column) == 4
    assert column.row_lengths.tolist() == [1, 2, 0, 3] and column[3].tolist() == [4.0, 5.0, 6.0]
    part = column[1:4]
    assert np.shares_memory(part.values, column.values) and part.row_splits.tolist() == [0, 2, 2, 5]
    _, back = wire.unpack_frame(wire.pack_frame({"0": cols["0"][1:4], "1": part}))
    assert isinstance(back["1"], RaggedColumn) and back["1"].to_list() == [[2.0, 3.0], [], [4.0, 5.0, 6.0]]
    assert back["0"].tolist() == [1, 2, 3]
    joined = concat_cols([{"1": column[3:]}, {"1": column[:2]}])["1"]
    assert joined.to_list() == [[4.0, 5.0, 6.0], [1.0], [2.0, 3.0]]
    assert [r.tolist() for r in joined] == joined.to_list()


def test_a_refusal_is_placed_in_its_partition_and_widths_hold_across_chunks():
    import pickle

    from duotf._transport.columns import from_rows
    from duotf._transport.feeder import validated

    def chunks():
        yield from_rows([(0, [1.0, 2.0])] * 5)
        yield from_rows([(1, [1.0, 2.0]), (2, None)])

    with pytest.raises(FeedSchemaError) as info:
        list(validated(chunks(), 7))
    err = pickle.loads(pickle.dumps(info.value))  # as it crosses from an executor
    assert (err.column, err.partition, err.row, err.problem) == ("1", 7, 6, "null")
    assert str(err).startswith("column '1': a null at row 6 of partition 7")

    def widths():
        yield from_rows([(0, [1.0, 2.0])] * 3)
        yield from_rows([(1, [1.0, 2.0, 3.0])])  # every row of this chunk alike, but not like before

    with pytest.raises(FeedSchemaError, match="row 3 of partition 2 holds 3 values where the rows "
                                              "before it hold 2"):
        list(validated(widths(), 2))


def test_a_refusals_problem_is_a_feed_problem_that_prints_and_pickles_as_its_string():
    import pickle

    from duotf.errors import FeedProblem
    from duotf._transport.columns import from_rows

    with pytest.raises(FeedSchemaError) as info:
        from_rows([(0, [1.0, 2.0]), (1, [1.0])])
    err = pickle.loads(pickle.dumps(info.value.located(4, 10)))
    assert err.problem is FeedProblem.RAGGED and err.problem == "ragged"
    assert (str(err.problem), f"{err.problem}", "%s" % err.problem) == ("ragged",) * 3
    # rebuilt from its attributes (the JVM feed's JSON records): the string becomes the member
    again = FeedSchemaError(err.message, **{**err.attributes, "problem": "ragged"})
    assert again.problem is FeedProblem.RAGGED and again.row == 11 and again.partition == 4


def test_pandas_nulls_are_what_pandas_calls_missing():
    import pandas as pd

    from duotf._transport.columns import from_pandas

    for frame in (pd.DataFrame({"a": pd.array([1, None], "Int64")}), pd.DataFrame({"a": [1.0, np.nan]}),
                  pd.DataFrame({"a": ["x", None]}), pd.DataFrame({"a": [[1.0], None]})):
        with pytest.raises(FeedSchemaError, match="column 'a': a null at row 1"):
            from_pandas(frame)
    for ragged in ((), ("a",)):  # a NaN among arrays: found once stacking them failed
        with pytest.raises(FeedSchemaError, match="column 'a': a null at row 1"):
            from_pandas(pd.DataFrame({"a": [[1.0], np.nan, [2.0]]}), ragged=ragged)
    cols = from_pandas(pd.DataFrame({"a": pd.array([1, 2], "Int64"), "v": [[1.0, 2.0], [3.0, 4.0]]}))
    assert cols["a"].dtype == np.int64 and cols["v"].shape == (2, 2)


def test_a_feed_schema_error_record_comes_back_typed():
    from duotf.backends.spark.tasks import error_json as _error_json, guarded as _guarded, raise_first as _raise_first
    from duotf.errors import feed_schema_error

    def refuse():
        raise feed_schema_error("x", 4, "null", "a null at {where}", "fill it").located(3, 10)

    _, record = _guarded(refuse)
    with pytest.raises(FeedSchemaError) as info:
        _raise_first([None, record])
    err = info.value
    assert (err.column, err.partition, err.row, err.problem) == ("x", 3, 14, "null")
    assert str(err) == "column 'x': a null at row 14 of partition 3; fill it"
    assert _error_json(err) == record


def test_arrays_of_strings_or_nested_arrays_are_refused_not_sent_as_pointers():
    """An Arrow list of strings, bytes or lists became a 2-D array of objects, whose bytes went
    on the wire as pointers: the node got garbage. Every path refuses such a column with a
    FeedSchemaError naming it (declared ragged or not), and the wire refuses arrays of objects."""
    import pandas as pd

    from duotf._transport.columns import from_pandas, from_rows

    def refused(convert, *args, **kw):
        with pytest.raises(FeedSchemaError) as info:
            convert(*args, **kw)
        err = info.value
        assert (err.column, err.problem, err.partition) == ("c", "type", None), str(err)
        first = str(err).splitlines()[0]
        assert first.startswith(f"column 'c': row {err.row} holds an array of ") and "encode" in first
        return err

    def batch(values, value_type):
        return pa.RecordBatch.from_arrays([pa.array(values, pa.list_(value_type))], ["c"])

    strings = batch([["a", "b"], ["c", "d"]], pa.string())
    for arrow in (strings, batch([[b"a", b"b"], [b"c", b"d"]], pa.binary()),
                  batch([[[1.0], [2.0]], [[3.0], [4.0]]], pa.list_(pa.float32()))):
        for ragged in ((), ("c",)):
            assert refused(from_arrow, arrow, ragged=ragged).row == 0
    assert "strings" in str(refused(from_arrow, strings))
    assert "nested array" in str(refused(from_arrow, batch([[[1.0]], [[2.0]]], pa.list_(pa.float32()))))
    # declared ragged: the first row that holds a value is named
    assert refused(from_arrow, batch([[], ["x"], ["y", "z"]], pa.string()), ragged=("c",)).row == 1
    for ragged in ((), ("c",)):
        for rows in ([(0, ["a", "b"]), (1, ["c", "d"])], [(0, [b"a"]), (1, [b"b"])]):
            cols = [{"id": i, "c": v} for i, v in rows]
            assert refused(from_rows, cols, ragged=ragged).row == 0
        frame = pd.DataFrame({"c": [["a", "b"], ["c", "d"]]})
        assert "strings" in str(refused(from_pandas, frame, ragged=ragged))
    assert refused(from_rows, [{"c": []}, {"c": ["x", "y"]}], ragged=("c",)).row == 1
    # rows of nested numbers of one shape are stacked; of different inner shapes, refused
    assert from_rows([{"c": [[1, 2], [3, 4]]}, {"c": [[5, 6], [7, 8]]}])["c"].shape == (2, 2, 2)
    with pytest.raises(FeedSchemaError, match=r"column 'c': arrays of different shapes: row 1 "
                                              r"holds an array of shape \[2\]") as info:
        from_rows([{"c": [[1, 2], [3, 4]]}, {"c": [[5, 6], [7]]}])
    assert (info.value.row, info.value.problem) == (1, "ragged")
    # the wire, behind them: never the bytes of an object
    with pytest.raises(TypeError, match="column 'c': an array of object values"):
        wire.pack_frame({"c": np.array([["a", "b"], ["c", "d"]], dtype=object)})
    arrays = np.empty(2, dtype=object)
    arrays[0], arrays[1] = np.zeros(2), np.ones(2)
    with pytest.raises(TypeError, match="column 'c': a ndarray value in a column of str/bytes"):
        wire.pack_frame({"c": arrays})


def test_a_decimal_column_is_refused_with_the_cast_to_make():
    """Spark SQL makes ``long * 1.0`` a decimal: the feed refuses it by name rather than fail
    on its Decimal objects or round them silently."""
    from decimal import Decimal

    batch = pa.RecordBatch.from_pydict({"id": [1, 2], "x": pa.array([Decimal("1.5"), Decimal("2.0")],
                                                                   pa.decimal128(5, 1))})
    with pytest.raises(FeedSchemaError) as info:
        from_arrow(batch)
    err = info.value
    assert (err.column, err.problem, err.row) == ("x", "type", 0)
    assert "decimal128(5, 1)" in str(err) and "cast('double')" in err.hint
