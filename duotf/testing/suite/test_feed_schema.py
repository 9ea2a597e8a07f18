"""Data the feed would change silently is refused at the source, on every engine: a null, an
array column whose rows differ in length, or an array of strings, gives a FeedSchemaError that
names the column, the partition and the row. A column declared ragged is delivered as it is."""

from __future__ import annotations

import pytest

import duotf
from duotf.testing import QUIET_TF, shutdown_quietly
from duotf.testing.suite import mains
from duotf.testing.suite.data import kept_frame_folders

SCHEMA = {"id": "long", "x": "double", "s": "string", "v": "array<float>"}
PART, ROW = 1, 2  # where the one bad value lies
STRINGS = object()  # a "value" that makes every row's array of column v hold strings


def _parts(bad=None, value=None):
    """3 partitions of 4 rows ``(id, id / 4, "s<id>", [id, id + 0.25])``; with ``bad``, the
    column ``bad`` of row ROW of partition PART holds ``value`` instead (with ``STRINGS``,
    every row's ``v`` holds strings)."""
    names = list(SCHEMA)
    parts = []
    for p in range(3):
        rows = []
        for r in range(4):
            i = p * 4 + r
            row = [i, i / 4, f"s{i}", [float(i), i + 0.25]]
            if value is STRINGS:
                row[names.index(bad)] = [f"{i}", f"{i}.25"]
            elif (p, r) == (PART, ROW) and bad is not None:
                row[names.index(bad)] = value
            rows.append(tuple(row))
        parts.append(rows)
    return parts


def _data(engine, shape, parts, schema):
    """The rows as the engine's rows (columns named by position) or DataFrame; the name of
    each column as the feed knows it."""
    if shape == "rows":
        return engine.rows(parts), {name: str(i) for i, name in enumerate(schema)}
    return engine.table(parts, schema), {name: name for name in schema}


#: case: (column, value, the start of what the first line says after the column's name, where
#: the error is: (partition, row), or None where every partition holds the problem at row 0)
CASES = {
    # 12 values in 4 rows of a width-2 column: what a reshape would have taken without a word
    "ragged": ("v", [5.0] * 6, "rows of different lengths: row 2 of partition 1 holds 6 values "
               "where the rows before it hold 2", (PART, ROW)),
    "null-long": ("id", None, "a null at row 2 of partition 1", (PART, ROW)),
    "null-double": ("x", None, "a null at row 2 of partition 1", (PART, ROW)),
    "null-string": ("s", None, "a null at row 2 of partition 1", (PART, ROW)),
    "null-array": ("v", None, "a null at row 2 of partition 1", (PART, ROW)),
    # array<string>: its objects' pointers were sent as the values
    "type-array-of-strings": ("v", STRINGS, "row 0 of partition {partition} holds an array of "
                              "strings", None),
}


# the array<string> case as a DataFrame only (CI time): the Arrow path on Spark, where the pointers
# went out; rows (and pandas) of lists of str are refused by the same code, tested in
# tests/test_feed_refusals.py
# Three engines of five (CI time): the in-process feed, a Dask task and a Spark mapInArrow task, the
# three feeding paths; procpool and Spark standalone feed through the same task code.
@pytest.mark.engines("local", "dask", "spark-local")
@pytest.mark.parametrize("case,shape", [(case, shape) for case in CASES for shape in ("rows", "table")
                                        if not (case.startswith("type") and shape == "rows")])
def test_refused_data_gives_a_feed_schema_error(backend, engine, tmp_path, case, shape):
    bad, value, what, where = CASES[case]
    schema = {**SCHEMA, "v": "array<string>"} if value is STRINGS else SCHEMA
    data, names = _data(engine, shape, _parts(bad, value), schema)
    column = names[bad]
    before = kept_frame_folders()
    cluster = duotf.run(mains.block_main, {"release": str(tmp_path / "release")}, backend,
                        duotf.ClusterSpec(workers=1))
    try:
        with pytest.raises(duotf.FeedSchemaError) as info:
            # 2 epochs: a Spark DataFrame's first epoch then also keeps what it converted,
            # which the refusal must delete
            cluster.train(data, epochs=2, feed_timeout=60)
        assert not kept_frame_folders() - before
    finally:
        (tmp_path / "release").touch()
        shutdown_quietly(cluster)
    err = info.value
    assert isinstance(err, duotf.FeedError)
    # every partition holds an array of strings: whichever is converted first is named
    assert (err.column, err.partition, err.row) == (column, *(where or (err.partition, 0)))
    assert err.partition in range(3)
    assert err.problem == case.split("-")[0]
    first = str(err).splitlines()[0]
    # what is wrong, where, and what to do: on the first line, not under an engine's traceback
    assert first.startswith(f"column {column!r}: {what.format(partition=err.partition)}"), first
    if err.problem == "ragged":
        assert f"ragged=[{column!r}]" in first and "pack_tensors" in first
    elif err.problem == "type":
        assert "encode the values as numbers" in first
    else:
        assert "fillna" in first and "dropna" in first


# Three engines of five (CI time): the in-process feed, a Dask task and a Spark mapInArrow task, the
# three feeding paths; procpool and Spark standalone feed through the same task code.
@pytest.mark.engines("local", "dask", "spark-local")
@pytest.mark.parametrize("reader", ["next_batch", "dataset"])
@pytest.mark.parametrize("shape", ["rows", "table"])
def test_a_column_declared_ragged_arrives_row_by_row(backend, engine, reader, shape):
    # rows of 0 to 3 values; partition 2 is split between the two workers
    parts = [[(i, [i + k / 4 for k in range(i % 4)]) for i in range(p * 4, p * 4 + 4)] for p in range(3)]
    schema = {"id": "long", "v": "array<float>"}
    if shape == "rows":
        data, names = engine.rows(parts), {"id": "0", "v": "1"}  # columns named by position
    else:
        data, names = engine.table(parts, schema), {"id": "id", "v": "v"}
    args = {"batch": 3, "reader": reader, **names}
    with duotf.run(mains.feed_ragged_main, args, backend, duotf.ClusterSpec(workers=2),
                   env=QUIET_TF) as cluster:
        report = cluster.train(data, epochs=1, ragged=[args["v"]])
        first, second = cluster.wait(timeout=120)
    assert report["rows_fed"] == 12
    assert first["kinds"] == second["kinds"] == (["RaggedTensor"] if reader == "dataset"
                                                 else ["RaggedColumn"])
    assert len(first["rows"]) == len(second["rows"]) == 6
    got = {**first["rows"], **second["rows"]}
    assert got == {i: v for part in parts for i, v in part}


def test_inference_refuses_a_null_and_names_it(backend, engine):
    data = engine.table(_parts("x", None), SCHEMA)
    # the node answers the other partitions (id * 2 + x); the one with the null never reaches it
    cluster = duotf.run(mains.feed_infer_main, {"batch": 4}, backend, duotf.ClusterSpec(workers=1))
    try:
        with pytest.raises(duotf.FeedSchemaError) as info:
            cluster.inference(data, keep=["id"], feed_timeout=60)
    finally:
        shutdown_quietly(cluster)
    err = info.value
    assert (err.column, err.partition, err.row, err.problem) == ("x", PART, ROW, "null")
    assert str(err).splitlines()[0].startswith("column 'x': a null at row 2 of partition 1")


def test_inference_takes_a_column_declared_ragged(backend, engine):
    parts = [[(i, [i + k / 4 for k in range(i % 4)]) for i in range(p * 4, p * 4 + 4)] for p in range(3)]
    data = engine.table(parts, {"id": "long", "v": "array<float>"})
    with duotf.run(mains.ragged_infer_main, {"batch": 3}, backend, duotf.ClusterSpec(workers=2)) as cluster:
        out = cluster.inference(data, keep=["id"], result_columns={"prediction": "double"},
                                ragged=["v"])
        cluster.wait(timeout=60)
    pdf = engine.to_pandas(out)
    assert pdf["id"].tolist() == list(range(12))
    assert pdf["prediction"].tolist() == [1000.0 * len(v) + sum(v) for part in parts for _, v in part]
