"""benchmarks/petastorm.py's own logic, without petastorm (which runs only in the benchmark's
venv): its options, the pairs' turns and ratios, the checks of a petastorm run's rows, the venv
it reuses or refuses, the peer's line protocol; and the "before" block of
docs/guides/petastorm.md, which the venv runs (``--guide``), found and made of petastorm's
calls. No Spark, no TensorFlow: well under a second."""

from __future__ import annotations

import ast
import io
import pathlib
import re

import pytest

from benchmarks import petastorm as bench
from benchmarks import petastorm_peer as peer

ROOT = pathlib.Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guides" / "petastorm.md"


def test_the_options_default_to_the_issues_cases():
    opts = bench.parse([])
    assert opts.rows == [100_000] and opts.epochs == [1, 10] and opts.pairs == 3
    opts = bench.parse(["--rows", "100000", "1000000", "--pairs", "4", "--json", "x.json"])
    assert opts.rows == [100_000, 1_000_000] and opts.pairs == 4 and opts.json == "x.json"
    for bad in (["--pairs", "0"], ["--guide", "--json", "x.json"]):
        with pytest.raises(SystemExit):
            bench.parse(bad)


def test_pairs_take_turns_and_their_ratios_are_duotf_over_petastorm():
    assert [bench.order(i) for i in range(3)] == [("duotf", "petastorm"), ("petastorm", "duotf"),
                                                 ("duotf", "petastorm")]
    assert bench.ratios([300.0, 400.0], [100.0, 200.0]) == [3.0, 2.0]
    with pytest.raises(ValueError, match="pairs"):
        bench.ratios([1.0], [])
    assert bench.verdict(3.0).endswith(": met") and "NOT met" in bench.verdict(2.9)


def test_a_petastorm_run_must_read_every_row_of_every_epoch():
    run = {"launched": 0.0, "ready": [1.0, 1.2], "start": 2.0, "converted": 1.5, "rows": 100,
           "shards": [{"rows": 120, "first": 4.0, "last": 6.0},
                      {"rows": 80, "first": 4.1, "last": 7.0}]}
    got = bench.peer_rate(run, 2)
    assert got["rate"] == 200 / 5.0 and got["job"] == 7.0 and got["shard_rows"] == [120, 80]
    with pytest.raises(AssertionError, match="200 rows, not 100 x 3"):
        bench.peer_rate(run, 3)


def test_the_venv_is_reused_only_with_the_same_pins_and_a_foreign_folder_is_refused(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / bench.MARKER).write_text("a==1\nb==2\n")
    assert bench.ensure_venv(str(venv), ("a==1", "b==2"), python="/nonexistent") == str(venv / "bin" / "python")
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    with pytest.raises(SystemExit, match="not a venv made by this benchmark"):
        bench.ensure_venv(str(foreign), ("a==1",), python="/nonexistent")
    assert (foreign / "notes.txt").read_text() == "keep"


def test_the_peer_env_leaves_duotf_spark_out(monkeypatch):
    monkeypatch.setenv("SPARK_HOME", "/opt/spark-4")
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    env = bench.peer_env()
    assert "SPARK_HOME" not in env and env["PYTHONPATH"] == bench.ROOT


def test_the_peer_hears_only_marked_lines(capsys):
    stream = io.StringIO("spark says hello\n" + peer.MARK + '{"ready": 1.5}\n')
    assert peer.hear(stream) == {"ready": 1.5}
    assert capsys.readouterr().err == "spark says hello\n"
    with pytest.raises(EOFError):
        peer.hear(io.StringIO("nothing marked\n"))


def test_the_guides_petastorm_block_is_the_one_the_venv_runs_and_calls_petastorm():
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    for line, (data, result) in peer.GUIDE_BLOCKS.items():
        (code,) = [b for b in blocks if line in b]
        assert all(old in code for old in data)
        tree = ast.parse(code)
        calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        assert {"make_spark_converter", "converter.make_tf_dataset", "converter.delete",
                "spark.conf.set"} <= calls
        assert re.search(rf"^{result} = ", code, re.M)
    assert "petastorm.spark.converter.parentCacheDirUrl" in GUIDE.read_text()
