"""The shared suite's metrics and progress: ``ctx.report`` reaches ``cluster.metrics`` and the
``on_report`` callbacks in each node's order, bounded in rate; the progress bar of every epoch
ends at the rows the epoch fed. (The Keras callback is checked in ``test_keras``, on its fit.)"""

from __future__ import annotations

import io
import logging
import re

import duotf
from duotf.testing.suite import mains
from duotf.testing.suite.data import row_parts

ORDERED, FLOOD = 200, 3000


def test_reports_arrive_in_order_in_metrics_and_callbacks_and_bars_end_at_the_epoch_rows(
        backend, engine, caplog):
    caplog.set_level(logging.INFO, logger="duotf")
    data = engine.rows(row_parts())  # 45 rows: 22 per worker, 44 an epoch
    bars = io.StringIO()
    got, calls = [], []

    def broken(report):
        calls.append(report.step)
        raise ValueError("a user callback that fails")

    args = {"batch": 4, "ordered": ORDERED, "flood": FLOOD, "flood_node": 1}
    with duotf.run(mains.report_main, args, backend, duotf.ClusterSpec(workers=2),
                   progress=bars) as cluster:
        cluster.on_report(broken)
        cluster.on_report(got.append)
        cluster.train(data, epochs=2)
        first, second = cluster.wait(timeout=120)
    # shutdown waited for the callbacks: they saw every report, each node's in its order
    df = cluster.metrics
    assert list(df.columns[:3]) == ["node", "step", "time"]
    assert set(df.columns[3:]) == {"rows", "epoch", "value", "square", "flood"}
    for node_id, result in enumerate((first, second)):
        me = f"worker:{node_id}"
        rows = df[df["node"] == me]
        fed = rows[rows["rows"].notna()]
        assert fed["step"].tolist() == list(range(1, result["batches"] + 1))
        assert fed["rows"].tolist()[-1] == result["rows"] == 44  # 22 rows an epoch, 2 epochs
        assert sorted(set(fed["epoch"])) == [0, 1]
        ordered = rows[rows["value"].notna()]
        assert ordered["value"].tolist() == list(range(ORDERED))
        assert ordered["square"].tolist() == [float(i * i) for i in range(ORDERED)]
        # without a step, a report's step is the node's count of reports so far
        assert ordered["step"].tolist() == list(range(result["batches"], result["batches"] + ORDERED))
        assert rows["time"].is_monotonic_increasing
        mine = [r for r in got if r.node == me]
        assert [(r.step, r.metrics) for r in mine] == [
            (int(s), {k: v for k, v in row.items() if v == v})
            for s, row in zip(rows["step"], rows.drop(columns=["node", "step", "time"]).to_dict("records"))]
        # not a number, not a whole step, no metric: typed errors that say what to do
        refused = result["refused"]
        assert len(refused) == 3
        assert "metric values must be numbers" in refused[0] and "not str" in refused[0]
        assert "step must be a whole number" in refused[1]
        assert "got no metrics" in refused[2]
    assert len(got) == len(df) == len(calls)
    errors = [r for r in caplog.records
              if r.levelno == logging.ERROR and "on_report callback" in r.getMessage()]
    assert len(errors) == len(calls)
    assert str(errors[0].exc_info[1]) == "a user callback that fails"

    # the flood: over the rate, dropped and counted, never waited for
    flood = df[df["flood"].notna()]
    assert set(flood["node"]) == {"worker:1"} and first["admitted"] is None
    admitted = second["admitted"]
    assert 0 < admitted < FLOOD and len(flood) == admitted
    assert flood["step"].is_monotonic_increasing
    counts = [int(m) for r in caplog.records
              for m in re.findall(r"\[worker:1\] (\d+) reports dropped", r.getMessage())]
    assert sum(counts) == FLOOD - admitted

    # one bar an epoch, each ending at the rows that epoch fed
    text = bars.getvalue()
    for epoch in (1, 2):
        states = [s for s in re.split(r"[\r\n]", text) if f"feed epoch {epoch}/2" in s]
        assert states, text
        assert re.search(r"\b44/44\b", states[-1]), states[-1]
        assert "rows/s" in states[-1]


def test_bars_count_rows_queued_and_tag_each_metric_with_its_step(backend, engine, tmp_path):
    data = engine.rows(row_parts())  # 44 rows an epoch
    bars = io.StringIO()
    release = tmp_path / "release"
    args = {"batch": 4, "release": str(release)}
    with duotf.run(mains.epoch_report_main, args, backend, duotf.ClusterSpec(workers=2),
                   progress=bars) as cluster:
        cluster.train(data, epochs=3)
        when_fed = bars.getvalue()
        release.touch()  # the nodes' training goes on after the feed: its last report comes now
        assert cluster.wait(timeout=120) == [2, 2]
    text = bars.getvalue()
    states = [s for s in re.split(r"[\r\n]", text) if s.strip()]
    # the bars count the rows handed to the nodes, and say so
    assert all("(rows queued)" in s for s in states if "feed epoch" in s), text
    # every value shown is tagged with the step (here: the epoch) of the report it came from
    tagged = re.findall(r"loss=([0-9.e-]+) \(step (\d+)\)", text)
    assert tagged, text
    assert all(float(value) == 0.5 ** int(step) for value, step in tagged), tagged
    # the last bar stayed open after the feed, and shows the last report of training
    assert "loss=0.25 (step 2)" not in when_fed
    assert "feed epoch 3/3 (rows queued)" in states[-1] and re.search(r"\b44/44\b", states[-1])
    assert states[-1].rstrip().endswith("reported: loss=0.25 (step 2)]"), states[-1]
