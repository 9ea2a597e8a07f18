"""``python -m duotf run``: a main that fails exits 1 with the typed error's message (the runs
that succeed are the block of docs/guides/cli.md, run by tests/test_readme.py on local and Dask)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

import duotf

# where the duotf package imported here lies: the command runs there, and imports the same one
ROOT = pathlib.Path(duotf.__file__).resolve().parents[1]


@pytest.mark.engines("local")
def test_a_failing_main_exits_1_with_the_error_and_its_output(backend, engine):
    out = subprocess.run(
        [sys.executable, "-m", "duotf", "run", "duotf.testing.suite.mains:argv_main", *engine.cli_args(),
         "--workers", "2", "--", "--fail"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr
    assert out.stdout == ""  # no results
    last = out.stderr.strip().splitlines()
    error = next(line for line in last if line.startswith("duotf: error: "))
    assert "worker:1" in error and "RuntimeError" in out.stderr and "asked to fail" in error
    assert "[worker:1] argv_main worker:1 got --fail" in out.stderr  # its output, prefixed


def test_a_main_that_is_not_there_is_a_config_error():
    out = subprocess.run([sys.executable, "-m", "duotf", "run", "duotf.testing.suite.mains:no_such_main"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "duotf: error: duotf.testing.suite.mains has no 'no_such_main'" in out.stderr


_WITH_MAIN = '''\
def main(args, ctx):
    print(f"{ctx.job_name}:{ctx.task_index} got", *args)
    return [ctx.task_index, args]

if __name__ == "__main__":
    raise SystemExit("run as a script, not through its main")
'''

_PLAIN = '''\
import json, os, sys
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
print("plain", index, sys.argv, os.path.isabs(__file__))
if "--fail" in sys.argv and index == 1:
    sys.exit(3)
'''


@pytest.mark.engines("local", "dask")
def test_a_script_file_runs_on_every_node_with_its_argv(backend, engine, tmp_path):
    """``duotf run train.py -- ARGS`` (issue 37, item 8): the script's ``main(args, ctx)`` where
    it defines one (its ``__main__`` block not run), else the whole script with ``sys.argv``;
    a nonzero ``sys.exit`` fails its node."""
    def cli(script, *args):
        path = tmp_path / script
        path.write_text(_WITH_MAIN if script == "train.py" else _PLAIN)
        # run from the script's folder, by its name as typed: that is its sys.argv[0]
        return subprocess.run([sys.executable, "-m", "duotf", "run", path.name, *engine.cli_args(),
                               "--workers", "2", "--", *args],
                              cwd=tmp_path, capture_output=True, text=True, timeout=180)

    out = cli("train.py", "--epochs", "3")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [[0, ["--epochs", "3"]], [1, ["--epochs", "3"]]]
    assert "[worker:1] worker:1 got --epochs 3" in out.stderr
    out = cli("plain.py", "--x")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [None, None]
    assert ("[worker:0] plain 0 ['plain.py', '--x'] True" in out.stderr
            and "[worker:1] plain 1 ['plain.py', '--x'] True" in out.stderr), out.stderr
    out = cli("plain.py", "--fail")
    assert out.returncode == 1 and "worker:1" in out.stderr
    assert "plain.py exited with status 3" in out.stderr


def test_a_script_that_is_not_there_or_does_not_compile_is_a_config_error(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("def main(args, ctx)\n    pass\n")
    for path, words in ((tmp_path / "missing.py", "cannot read the script"),
                        (broken, "line 1: expected ':': the script does not compile")):
        out = subprocess.run([sys.executable, "-m", "duotf", "run", str(path)],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 1 and words in out.stderr, out.stderr
