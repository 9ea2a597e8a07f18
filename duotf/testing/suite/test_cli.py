"""``python -m duotf run``: a main that fails exits 1 with the typed error's message (the runs
that succeed are the block of docs/guides/cli.md, run by tests/test_readme.py on local and Dask)."""

from __future__ import annotations

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
