"""docs/CONVERTING.md: the TensorFlowOnSpark program of examples/tfos_convert and its duotf
conversion differ in at most 10 lines (the guide shows the diff as it is), the TFoS program has
TFoS's shape, and the converted program trains on Spark."""

from __future__ import annotations

import ast
import difflib
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLDER = ROOT / "examples" / "tfos_convert"
GUIDE = ROOT / "docs" / "CONVERTING.md"


def _lines(name: str):
    return (FOLDER / name).read_text().splitlines()


def _changed():
    """The lines ``diff`` removes from the TFoS program and adds to the duotf one."""
    diff = list(difflib.unified_diff(_lines("tfos_digits.py"), _lines("duotf_digits.py"), n=0,
                                     lineterm=""))
    removed = [line[1:] for line in diff if line.startswith("-") and not line.startswith("---")]
    added = [line[1:] for line in diff if line.startswith("+") and not line.startswith("+++")]
    return removed, added


def test_the_conversion_changes_at_most_10_lines_and_the_guide_shows_them():
    removed, added = _changed()
    assert 0 < len(removed) + len(added) <= 10, (removed, added)
    # every TFoS name is gone, and what replaced it is duotf's
    code = ast.parse((FOLDER / "duotf_digits.py").read_text())
    names = {node.id for node in ast.walk(code) if isinstance(node, ast.Name)}
    names |= {node.attr for node in ast.walk(code) if isinstance(node, ast.Attribute)}
    names |= {alias.name for node in ast.walk(code) if isinstance(node, (ast.Import, ast.ImportFrom))
              for alias in node.names}
    names |= {node.module for node in ast.walk(code) if isinstance(node, ast.ImportFrom)}
    assert not names & {"TFCluster", "TFNode", "tensorflowonspark", "mgr"}
    assert "import duotf" in added
    # the guide's diff block is the diff of the two files as they are
    guide = GUIDE.read_text()
    (shown,) = re.findall(r"```diff\n(.*?)```", guide, re.S)
    assert [line[1:] for line in shown.splitlines() if line.startswith("-")] == removed
    assert [line[1:] for line in shown.splitlines() if line.startswith("+")] == added
    assert "docs/CONVERTING.md" in (ROOT / "README.md").read_text()


def test_the_tfos_program_has_the_shape_of_a_tfos_program():
    """Not run (TensorFlowOnSpark is no dependency): its calls are TFoS's documented ones."""
    source = (FOLDER / "tfos_digits.py").read_text()
    tree = ast.parse(source)
    calls = {ast.unparse(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    assert {"TFCluster.run", "cluster.train", "cluster.shutdown", "TFNode.DataFeed",
            "feed.next_batch", "feed.should_stop", "feed.terminate", "ctx.absolute_path"} <= calls
    assert "TFCluster.InputMode.SPARK" in source and "ctx.mgr" in source
    (run,) = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
              and ast.unparse(n.func) == "TFCluster.run"]
    # TFCluster.run(sc, map_fun, tf_args, num_executors, num_ps, tensorboard, input_mode)
    assert [ast.unparse(a) for a in run.args][:3] == ["sc", "main_fun", "args"] and len(run.args) == 7


@pytest.mark.engines("spark-local")
def test_the_converted_program_trains_digits_on_spark(backend, engine, tmp_path):
    from examples.tfos_convert import duotf_digits

    args = duotf_digits.parse(["--epochs", "5", "--model-dir", str(tmp_path / "model")])
    accuracy = duotf_digits.train(engine.handle.sparkContext, args)
    assert accuracy >= 0.85  # about 0.95 measured; a tenth without training
