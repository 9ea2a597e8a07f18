"""benchmarks/one_pass.py's own logic: its options, the rounds' turns, the summary's ratios and
verdicts, and the JSON document it writes (which benchmarks/charts.py reads), on made-up figures.
No Spark, no TensorFlow: well under a second."""

from __future__ import annotations

import pytest

from benchmarks import charts
from benchmarks import one_pass as bench
from benchmarks.record import Record, load


def test_the_options_default_to_the_issues_case():
    opts = bench.parse([])
    assert (opts.rows, opts.pairs, opts.spark_master, opts.partitions) == (1_000_000, 3, "local[3]", 40)
    assert bench.parse(["--rows", "100000"]).partitions == 8
    assert bench.parse(["--standalone", "--with-tfos"]).with_tfos == ""
    for bad in (["--pairs", "0"], ["--with-tfos"], ["--with-tfos", "--spark-master", "local[2]"]):
        with pytest.raises(SystemExit):
            bench.parse(bad)


def test_each_round_turns_the_order_by_one_place():
    orders = [bench.order(r) for r in range(len(bench.CASES) + 1)]
    assert orders[0] == bench.CASES and orders[-1] == bench.CASES
    assert [o[0] for o in orders[:-1]] == list(bench.CASES)  # each case leads one round
    assert all(sorted(o) == sorted(bench.CASES) for o in orders)


def _figures(scale: float) -> dict:
    """Made-up figures of one round: the one pass at ``scale`` times the scan."""
    return {
        "scan": {"rate": 100.0, "seconds": 1.0},
        "one pass": {"rate": 100.0 * scale, "seconds": 1.0, "first_after_call": 0.5,
                     "first_after_run": 5.0, "job_seconds": 8.0, "job_rate": 12.5,
                     "count_seconds": 0.0},
        "scan + write back": {"rate": 50.0, "seconds": 2.0},
        "inference": {"rate": 45.0, "seconds": 2.2, "to_last_answer": 60.0, "call_seconds": 2.0,
                      "read_seconds": 0.2, "first_after_call": 0.3, "first_after_run": 4.0},
        "limit": {"rate": 1000.0, "seconds": 0.1, "limit_rows": 100, "epochs": 1},
    }


def test_the_summary_gives_the_median_of_the_pairs_ratios_and_each_goal(capsys):
    rounds = [_figures(s) for s in (0.7, 0.9, 0.85)]
    got = {case: [r[case] for r in rounds] for case in bench.CASES}
    opts = bench.parse(["--rows", "100000", "--pairs", "3"])
    bench.summary(opts, got, (0.5, 20_000))
    out = capsys.readouterr().out
    assert "one pass / scan                     0.85  (0.70, 0.90, 0.85)  goal >= 0.8: met" in out
    assert "this run has 100,000" in out  # the one-pass goal is set at 1,000,000 rows
    assert "inference / scan with write back    0.90  (0.90, 0.90, 0.90)  goal >= 0.8: met" in out
    assert "90.0x" in out and "measured on 20,000 rows, fewer than duotf's 100,000" in out
    assert "goal >= 50x: met" in out


def test_the_document_holds_every_figure_and_draws(tmp_path):
    rounds = [_figures(s) for s in (0.7, 0.9)]
    got = {case: [r[case] for r in rounds] for case in bench.CASES}
    opts = bench.parse(["--rows", "1000", "--pairs", "2", "--standalone", "--with-tfos"])
    record = Record("one_pass", vars(opts), argv=["--rows", "1000"])
    bench.record_all(record, opts, got, (0.5, 1000), "spark://127.0.0.1:7077")
    path = tmp_path / "one_pass.json"
    record.write(str(path))
    doc = load(str(path))
    rows = {(r["chart"], r["case"]): r for r in doc["rows"]}
    ratio = rows["1,000 rows on standalone: ratios by pair", "one pass / scan"]
    assert ratio["values"] == pytest.approx([0.7, 0.9])
    one = rows["1,000 rows on standalone: one pass and inference beside Spark's scan", "one pass"]
    assert one["count_seconds"] == [0.0, 0.0] and one["first_after_call"] == [0.5, 0.5]
    assert rows["1,000 rows on standalone: duotf's inference over TFoS's", "inference / TFoS"]["values"] == [90.0, 90.0]
    # rates, ratios, first batch, TFoS's rates and ratio: five charts, five files
    names = {charts.file_name(doc, chart, unit) for chart, unit in charts.comparisons(doc)}
    assert len(names) == 5, names
    local = Record("one_pass", vars(opts), argv=["--rows", "1000"])  # the same size on local[3]
    bench.record_all(local, opts, got, None, "local[3]")
    others = {charts.file_name(local.document(), row["chart"], row["unit"]) for row in local.rows}
    assert len(others) == 3 and not others & names, others
