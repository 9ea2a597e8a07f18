"""The mistakes a new user makes, each with the words that tell them what to change (issue 32).

Each test makes one mistake on the engines where it can be made and asserts what the user sees:
a typo in ``input_mapping``, a Dask DataFrame whose array column Dask turned into strings, a
column of strings fed to a model of numbers, a ``main`` that never reads the feed that
``cluster.train`` fills, and less data than nodes.
"""

from __future__ import annotations

import re
import time

import numpy as np
import pandas as pd
import pytest

import duotf
from duotf.testing import shutdown_quietly
from duotf.testing.suite import mains

SPEC = duotf.ClusterSpec(workers=2)


def _frames(parts=2, rows=8):
    return [pd.DataFrame({"features": np.arange(p * rows, (p + 1) * rows, dtype=np.float64),
                          "label": np.ones(rows)}) for p in range(parts)]


def _train_fails(backend, main, args, data, **train):
    """``cluster.train(data)`` with ``main`` on two workers: the error it raised (or that
    ``cluster.wait`` raised after it), and the seconds it took."""
    cluster = duotf.run(main, args, backend, SPEC)
    try:
        t0 = time.monotonic()
        with pytest.raises(duotf.DuotfError) as info:
            cluster.train(data, epochs=1, **train)
            cluster.wait(timeout=120)
        return info.value, time.monotonic() - t0
    finally:
        shutdown_quietly(cluster)


# -- a key of input_mapping that names no column --------------------------------------------------
@pytest.mark.engines("local", "procpool", "dask", "spark-local", "spark-standalone")
def test_mistake_input_mapping_typo_names_the_key_and_the_columns(backend, engine):
    mapping = {"featurez": "x", "label": "y"}  # a typo for "features"
    err, took = _train_fails(backend, mains.feed_columns_main, {"mapping": mapping},
                             engine.frame(_frames()))
    # the node's main raised the ConfigError at its first read, before it got any row
    assert isinstance(err, duotf.NodeFailedError), repr(err)
    assert err.remote_type.endswith("ConfigError"), err.remote_type
    message = str(err)
    assert ("get_data_feed(input_mapping=...): no column 'featurez' in the feed (its columns: "
            "'features', 'label'); did you mean 'features'?") in message, message
    assert took < 90, f"took {took:.0f} s"


@pytest.mark.engines("local", "procpool", "dask", "spark-local", "spark-standalone")
def test_mistake_input_mapping_of_existing_columns_still_selects(backend, engine):
    with duotf.run(mains.feed_columns_main, {"mapping": {"features": "x"}}, backend,
                   SPEC) as cluster:
        cluster.train(engine.frame(_frames()), epochs=1)
        results = cluster.wait(timeout=120)
    assert [r["columns"] for r in results] == [["x"], ["x"]]
    assert sum(r["rows"] for r in results) == 16


# -- Dask turned a column of arrays into strings --------------------------------------------------
@pytest.mark.engines("dask")
def test_mistake_dask_array_column_made_strings_names_the_setting(backend, engine):
    import dask
    import dask.dataframe as dd

    pdf = pd.DataFrame({"x": [np.arange(3.0) + i for i in range(16)], "y": np.ones(16)})
    with dask.config.set({"dataframe.convert-string": True}):  # Dask's default
        ddf = dd.from_pandas(pdf, npartitions=2)
    assert pd.api.types.is_string_dtype(ddf.dtypes["x"])  # what Dask made of the arrays
    err, took = _train_fails(backend, mains.feed_columns_main, {"mapping": {"x": "x", "y": "y"}},
                             ddf)
    assert isinstance(err, duotf.FeedSchemaError), repr(err)
    assert err.column == "x" and err.problem == "type"
    message = str(err)
    assert "column 'x': row 0 of partition" in message, message
    assert re.search(r"holds the string '\[ ?\d+\. +\d+\. +\d+\.\]': an array turned into text",
                     message), message
    assert 'dask.config.set({"dataframe.convert-string": False})' in message, message
    assert took < 90, f"took {took:.0f} s"


# -- what else a new user gets wrong --------------------------------------------------------------
@pytest.mark.engines("local", "procpool", "dask", "spark-local", "spark-standalone")
def test_mistake_strings_fed_to_a_model_of_numbers(backend, engine):
    # Strings feed as strings (a text model takes them): Keras refuses them, in TF's words
    parts = [[(str(0.5 * i), 1.0) for i in range(8)] for _ in range(2)]
    data = engine.table(parts, {"x": "string", "y": "double"})
    err, _ = _train_fails(backend, mains.keras_columns_main,
                          {"mapping": None, "width": 1, "batch": 4}, data)
    assert isinstance(err, duotf.NodeFailedError), repr(err)
    assert "main raised UnimplementedError" in str(err).splitlines()[0], str(err)[:500]
    assert "Cast string to float is not supported" in str(err), str(err)[:2000]


@pytest.mark.engines("local", "procpool", "dask", "spark-local", "spark-standalone")
def test_mistake_main_returns_without_reading_its_feed(backend, engine, tmp_path):
    (tmp_path / "release").touch()  # block_main returns at once
    err, took = _train_fails(backend, mains.block_main, {"release": str(tmp_path / "release")},
                             engine.frame(_frames(parts=4)), feed_timeout=5)
    assert isinstance(err, duotf.FeedError), repr(err)
    first = str(err).splitlines()[0]
    assert first.startswith(f"feeding epoch 1 failed on {err.node}: its main returned without "
                            "reading its feed to the end"), first
    assert "while not feed.should_stop()" in first and "feed.terminate()" in first, first
    assert "may have died" not in first, first
    assert took < 60, f"took {took:.0f} s"


# every engine but the separate hosts' (the same engines' code): the fast tier runs it on one
# of local, Dask and Spark local[3], the full tier on each
@pytest.mark.engines("local", "procpool", "dask", "spark-local", "spark-standalone", "spark-connect")
def test_mistake_busy_main_never_reads_its_feed(backend, engine, tmp_path):
    # 10 partitions a node, its queue holds 8 frames: a range finds no room. The node is named
    # within one feed_timeout and the engine's own seconds, not one feed_timeout a partition
    # (at least 10 x 5 = 50 s here; 30 s on Spark local[3] at feed_timeout=2 before: its one
    # free slot fed the partitions one after another). The engine's seconds are those of 40
    # tasks on one slot: 2 s alone, 8-9 s on Spark with 3 tests beside it on 2 cores, 17 s on
    # Spark Connect in CI on 2026-12-07 (a VM about twice as slow): the bound is 5 + 25 s,
    # below the 50 s of a feed_timeout a partition
    try:
        err, took = _train_fails(backend, mains.block_main, {"release": str(tmp_path / "release")},
                                 engine.frame(_frames(parts=20, rows=50)), feed_timeout=5)
    finally:
        (tmp_path / "release").touch()
    assert isinstance(err, duotf.FeedError), repr(err)
    first = str(err).splitlines()[0]
    assert ("the node took no data for feed_timeout=5 s (alive but stuck: is its main reading "
            "its feed?)") in first, first
    assert took < 5 + 25, f"took {took:.0f} s"


@pytest.mark.engines("local", "procpool", "dask", "spark-local", "spark-standalone")
def test_mistake_fewer_rows_than_workers(backend, engine):
    cluster = duotf.run(mains.feed_columns_main, {}, backend, SPEC)
    try:
        with pytest.raises(duotf.ConfigError) as info:
            cluster.train(engine.frame(_frames(parts=1, rows=1)), epochs=1)
    finally:
        shutdown_quietly(cluster)
    assert str(info.value) == ("1 rows cannot be shared by 2 synchronous workers: each needs at "
                               "least one row. Feed more data, or pass balance=False.")


@pytest.mark.engines("local", "procpool", "dask", "spark-local", "spark-standalone")
def test_mistake_one_partition_for_more_nodes_is_shared(backend, engine):
    # fewer partitions than nodes is no mistake: a partition's rows are shared out
    with duotf.run(mains.feed_columns_main, {}, backend, SPEC) as cluster:
        report = cluster.train(engine.frame(_frames(parts=1, rows=10)), epochs=1)
        results = cluster.wait(timeout=120)
    assert report["rows_per_worker"] == 5 and report["rows_fed"] == 10
    assert [r["rows"] for r in results] == [5, 5]


# -- a main from a package the nodes cannot import -------------------------------------------------
@pytest.mark.engines("dask")  # its workers' path is theirs (the embedded engine's is the driver's)
def test_mistake_main_from_a_package_the_nodes_lack_names_it_and_the_fix(backend, tmp_path, monkeypatch):
    """A main imported from a package of the driver's path alone (not installed where the nodes
    run, not a one-file module beside a script): the node's error names the module and both
    fixes, installing it or ``cloudpickle.register_pickle_by_value``."""
    import importlib

    package = tmp_path / "mytrainer"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "steps.py").write_text("def main(args, ctx):\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # the driver's path, not the nodes'
    steps = importlib.import_module("mytrainer.steps")
    try:
        with pytest.raises(duotf.NodeFailedError) as info:
            with duotf.run(steps.main, None, backend, SPEC) as cluster:
                cluster.wait(timeout=120)
    finally:
        for name in ("mytrainer.steps", "mytrainer"):
            monkeypatch.delitem(__import__("sys").modules, name, raising=False)
    first = str(info.value).splitlines()[0]
    assert "No module named 'mytrainer'" in first, first
    assert "Install it where the nodes run" in first, first
    assert "cloudpickle.register_pickle_by_value(mytrainer)" in first, first
