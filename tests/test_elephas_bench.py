"""benchmarks/elephas.py's own parts, so that the benchmark cannot rot between its runs: its
options and a child's command, the data (one seed, the same rows), the accuracy both sides
compute, the venv's reuse, a child's result line and the summary's record. Nothing here runs
elephas, Spark or TensorFlow (the benchmark itself is never run by CI)."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from benchmarks import elephas as bench
from benchmarks.record import Record, load


def test_the_options_reach_a_child_as_they_were_given():
    opts = bench.parse(["--target", "0.82", "--every", "50", "--big-batch", "128",
                        "--frame", "arrow"])
    assert opts.pairs == 3 and opts.modes == list(bench.MODES) and opts.side is None
    opts.data = "/data/rows.npz"
    command = bench.child_command("/venv/bin/python", "duotf", opts, "mwms-big")
    assert command[:3] == ["/venv/bin/python", "-m", "benchmarks.elephas"]
    child = bench.parse(command[3:])
    assert (child.side, child.mode, child.data) == ("duotf", "mwms-big", "/data/rows.npz")
    assert (child.target, child.every, child.big_batch, child.max_epochs) == (0.82, 50, 128, 10)
    assert child.frame == "arrow" and bench.parse([]).frame == "parquet"
    assert bench.parse(bench.child_command("python", "elephas", opts)[3:]).mode is None


@pytest.mark.parametrize("argv, words", [
    (["--pairs", "0"], "must be >= 1"),
    (["--target", "80"], "an accuracy"),
    (["--modes", "async"], "invalid choice"),
])
def test_options_that_cannot_be_measured_are_refused(argv, words, capsys):
    with pytest.raises(SystemExit):
        bench.parse(argv)
    assert words in capsys.readouterr().err


def test_one_seed_makes_the_same_rows_and_they_can_be_learned(tmp_path):
    a = np.load(bench.make_data(str(tmp_path / "a.npz"), rows=3000, test_rows=600))
    b = np.load(bench.make_data(str(tmp_path / "b.npz"), rows=3000, test_rows=600))
    for key in a.files:
        assert np.array_equal(a[key], b[key]), key
    x, y, x_test, y_test = a["x_train"], a["y_train"], a["x_test"], a["y_test"]
    assert x.shape == (3000, 784) and x.dtype == np.float32 and x_test.shape == (600, 784)
    assert 0.0 <= x.min() and x.max() <= 1.0 and set(y) == set(y_test) == set(range(10))
    assert [w.shape for w in bench.initial_weights(a)] == [(784, 128), (128,), (128, 10), (10,)]
    # separable, not trivially: a class's mean row scores well above chance on the held-out
    # rows (drawn from other digits), and the untrained MLP near chance
    centroids = np.stack([x[y == c].mean(axis=0) for c in range(10)])
    nearest = np.argmin(((x_test[:, None, :] - centroids[None]) ** 2).sum(axis=2), axis=1)
    assert 0.5 < np.mean(nearest == y_test) < 0.95
    assert bench.accuracy(bench.initial_weights(a), x_test, y_test) < 0.3


def test_the_accuracy_is_the_mlps_on_its_weights():
    x = np.eye(784, dtype=np.float32)[:20]
    y = np.arange(20) % 10
    w0 = np.zeros((784, 128), np.float32)
    w0[np.arange(20), np.arange(20) % 10] = 1.0  # hidden unit c fires for the rows of class c
    w1 = np.zeros((128, 10), np.float32)
    w1[np.arange(10), np.arange(10)] = 1.0
    weights = [w0, np.zeros(128, np.float32), w1, np.zeros(10, np.float32)]
    assert bench.accuracy(weights, x, y) == 1.0
    assert bench.accuracy(weights, x, (y + 1) % 10) == 0.0
    assert bench.scaled_lr(bench.BATCH) == bench.LR and bench.scaled_lr(256) == 8 * bench.LR


def test_a_venv_is_reused_while_its_marker_names_the_pins_and_made_anew_otherwise(
        tmp_path, monkeypatch):
    folder = tmp_path / "venv"
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "python").write_text("")
    marker = folder / "duotf-bench-pins.txt"
    marker.write_text("\n".join((bench.ELEPHAS,) + bench.ELEPHAS_PINS) + "\n")
    calls = []
    monkeypatch.setattr(bench.subprocess, "run", lambda cmd, check: calls.append(cmd))
    assert bench.ensure_venv(str(folder)) == str(folder / "bin" / "python") and calls == []

    marker.write_text("elephas==7.2.0\n")  # other pins: made again
    bench.ensure_venv(str(folder))
    assert calls[0][1:] == ["-m", "venv", "--clear", str(folder)]
    assert calls[1][-len(bench.ELEPHAS_PINS):] == list(bench.ELEPHAS_PINS)
    assert calls[2][-2:] == ["--no-deps", bench.ELEPHAS]  # elephas's own pins left out
    assert marker.read_text().startswith(bench.ELEPHAS + "\n")


def test_a_childs_result_line_is_read_with_its_times_from_the_start(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(
        "import json, time\nt = time.time()\nprint('>>> Fit model')\n"
        "print('@@ ' + json.dumps({'side': 'elephas', 'marks': {'SparkContext': t + 1}, "
        "'epochs': [[1, t + 2, t + 2.5, 0.81]], 'done': t + 3, 'accuracy': 0.81}))\n")
    result = bench.run_child([sys.executable, str(script)], dict(os.environ), str(tmp_path / "log"))
    assert 3.0 <= result["time"] < 13.0  # the child's start is after the parent's clock started
    assert result["marks"]["SparkContext"] == pytest.approx(result["time"] - 2, abs=1e-6)
    assert result["epochs"][0][0] == 1 and result["epochs"][0][3] == 0.81
    assert bench.reached(result, 0.8) and not bench.reached(result, 0.82)

    failing = tmp_path / "failing.py"
    failing.write_text("import sys\nprint('elephas: no module pyspark', file=sys.stderr)\nsys.exit(3)\n")
    with pytest.raises(RuntimeError, match="failed \\(3\\)(.|\\n)*no module pyspark"):
        bench.run_child([sys.executable, str(failing)], dict(os.environ), str(tmp_path / "log2"))


def _result(seconds, epochs=2, accuracy=0.81, nodes=False):
    result = {"time": seconds, "accuracy": accuracy, "marks": {"SparkSession": 3.0},
              "epochs": [[e, 5.0 + e, 5.1 + e, accuracy] for e in range(1, epochs + 1)]}
    if nodes:
        result.update(nodes=[{"start": 4.0, "tf": 7.0}] * 2, count_seconds=2.0,
                      epoch_seconds=[1.5] * epochs)
    return result


def test_the_summary_prints_each_pairs_ratio_and_their_median_and_records_them(tmp_path, capsys):
    opts = bench.parse(["--modes", "averaging", "mwms", "--pairs", "3"])
    times = {"elephas": [30.0, 20.0, 40.0], "averaging": [12.0, 12.0, 12.0],
             "mwms": [30.0, float("inf"), 30.0]}
    results = {"elephas": [_result(t) for t in times["elephas"]],
               "averaging": [_result(12.0, nodes=True)] * 3,
               "mwms": [_result(30.0, nodes=True), _result(60.0, 10, 0.7, nodes=True),
                        _result(30.0, nodes=True)]}
    record = Record("elephas", vars(opts), argv=["--json", "x.json"])
    bench.summary(opts, times, results, record)
    out = capsys.readouterr().out
    assert "0.40" in out and "0.60" in out and "0.30" in out  # averaging's ratios
    assert "best duotf mode: averaging, median ratio 0.40 (goal <= 0.5: met)" in out
    assert "mwms [2, 10, 2]" in out
    assert "JVM pass 2.0 + epochs 1.5+1.5" in bench.describe(results["averaging"][0])
    path = tmp_path / "elephas.json"
    record.write(str(path))
    doc = load(str(path))
    rows = {row["case"]: row for row in doc["rows"]}
    assert rows["averaging"]["ratio"] == [0.4, 0.6, 0.3] and rows["averaging"]["goal"] == 0.5
    assert rows["mwms"]["reached"] == [True, False, True] and rows["mwms"]["ratio"][1] is None
    assert rows["SparkModel, synchronous"]["values"] == [30.0, 20.0, 40.0]
    assert rows["goal"]["values"] == [15.0] and rows["goal"]["reference"]  # 0.5x elephas's median
    assert rows["averaging"]["label"] == "averaging every 100 steps, batch 32 (local[3])"
    def refuse(constant):
        raise AssertionError(f"not JSON: {constant}")

    json.loads(path.read_text(), parse_constant=refuse)  # no Infinity nor NaN
