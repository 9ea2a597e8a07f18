"""The reports duotf returns are the TypedDicts of :mod:`duotf.reports`: every key a real feed
puts in one is declared there with the type its value has, and every required key is present.

A real train() and a real stream on the local backend (two workers, a few rows: seconds), checked
with :func:`duotf.testing.suite.typed.mismatches`; the shared suite checks the reports of the
other engines the same way (Spark's converted-once keys, a restart's ``resumed_at_epoch``).
"""

from __future__ import annotations

import re
import typing

import pytest

import duotf
import duotf.dask
import duotf.spark
from duotf.reports import (DaskStreamReport, FeedAdapterReport, SparkStreamReport, StreamReport,
                           TrainReport)
from duotf.testing.suite import mains
from duotf.testing.suite.data import row_parts
from duotf.testing.suite.typed import _fits, mismatches

SPEC = duotf.ClusterSpec(workers=2)


def test_a_train_report_declares_every_key_it_holds():
    with duotf.run(mains.feed_train_main, {"batch": 4}, "local", SPEC) as cluster:
        report = cluster.train(row_parts(), epochs=2)
        cluster.wait(timeout=120)
    assert mismatches(report, TrainReport) == []
    assert set(TrainReport.__required_keys__) <= set(report)
    assert report["rows"] == 45 and report["epochs"] == 2  # a real feed, not an empty report
    # unbalanced: no rows per worker (None), every row fed
    with duotf.run(mains.feed_train_main, {"batch": 4}, "local", SPEC) as cluster:
        uneven = cluster.train(row_parts(), balance=False)
        cluster.wait(timeout=120)
    assert mismatches(uneven, TrainReport) == []
    assert uneven["rows_per_worker"] is None and uneven["rows_fed"] == 45


def test_a_stream_report_declares_every_key_it_holds():
    with duotf.run(mains.feed_train_main, {"batch": 4}, "local", SPEC) as cluster:
        stream = cluster.open_stream()
        assert stream.feed(row_parts()) == 44
        stream.end()
        report = stream.report()
        cluster.wait(timeout=120)
    assert mismatches(report, StreamReport) == []
    assert report["chunks"] == 1 and report["rows_fed"] == 44 and report["ended"]


def test_mismatches_finds_an_undeclared_key_a_wrong_type_and_a_missing_key():
    # the check the tests above rely on: it fails on what a careless change to a report does
    good: TrainReport = {"epochs": 1, "rows": 4, "rows_fed": 4, "rows_per_worker": 2,
                         "rows_dropped_per_epoch": 0, "terminated": False, "seconds": 1.5,
                         "count_seconds": 1, "epoch_seconds": [0.5]}
    assert mismatches(good, TrainReport) == []
    assert mismatches({**good, "resumed_at_epoch": 2, "converted_once": True}, TrainReport) == []
    [extra] = mismatches({**good, "rows_cached": 3}, TrainReport)
    assert "'rows_cached' is not declared in TrainReport" in extra and "duotf/reports.py" in extra
    assert mismatches({**good, "epochs": True}, TrainReport) == ["'epochs': True is not <class 'int'>"]
    assert len(mismatches({**good, "epoch_seconds": [0.5, "1"]}, TrainReport)) == 1
    assert len(mismatches({**good, "rows_per_worker": "2"}, TrainReport)) == 1
    assert len(mismatches({**good, "partitions_kept": None}, TrainReport)) == 1
    missing = dict(good)
    del missing["rows_fed"]
    assert mismatches(missing, TrainReport) == ["'rows_fed' is missing (required by TrainReport)"]


@pytest.mark.parametrize("report", [TrainReport, FeedAdapterReport, StreamReport, SparkStreamReport,
                                    DaskStreamReport])
def test_every_report_is_documented_and_checkable(report):
    """Each key is described in the class's docstring (its entry under Attributes), and its
    type is one mismatches() has a rule for."""
    assert report.__module__ == "duotf.reports"
    for key, expected in typing.get_type_hints(report).items():
        assert re.search(rf"^ +(\w+, )*{key}\b", report.__doc__ or "", re.MULTILINE), \
            f"{report.__name__}'s docstring does not describe {key!r}"
        _fits(object(), expected)  # raises TypeError for a type it has no rule for


def test_the_reports_are_exported_and_are_what_the_calls_return():
    assert duotf.TrainReport is TrainReport and duotf.StreamReport is StreamReport
    assert duotf.spark.SparkStreamReport is SparkStreamReport
    assert duotf.dask.DaskStreamReport is DaskStreamReport
    from duotf._driver.cluster import Cluster
    from duotf._driver.planner import Stream, train
    from duotf.backends.base import FeedAdapter
    from duotf.backends.spark.feed import SparkFeed
    from duotf.dask._stream import feed_stream as dask_feed_stream
    from duotf.spark._stream import SparkStream

    # (the annotations are strings: ``from __future__ import annotations``)
    returns = {fn: fn.__annotations__["return"] for fn in
               (Cluster.train, train, Stream.report, FeedAdapter.report, SparkFeed.report,
                SparkStream.report, SparkStream.stop, SparkStream.wait, dask_feed_stream)}
    assert returns == {Cluster.train: "TrainReport", train: "TrainReport",
                       Stream.report: "StreamReport", FeedAdapter.report: "FeedAdapterReport",
                       SparkFeed.report: "FeedAdapterReport", SparkStream.report: "SparkStreamReport",
                       SparkStream.stop: "SparkStreamReport",
                       SparkStream.wait: "Optional[SparkStreamReport]",
                       dask_feed_stream: "DaskStreamReport"}
