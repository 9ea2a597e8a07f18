"""The benchmarks are modules that the tests import: importing one must leave the process's
environment as it was (a benchmark sets its own, from its command line). A level set at import
once reached every node the suite started later, and the suite's node-output test saw it."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_importing_every_benchmark_leaves_the_environment_alone():
    names = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem != "__init__")
    assert "one_pass" in names and "feed" in names
    code = (
        "import importlib, json, os, sys\n"
        "before = dict(os.environ)\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module('benchmarks.' + name)\n"
        "after = dict(os.environ)\n"
        "print(json.dumps({k: [before.get(k), after.get(k)] for k in set(before) | set(after)\n"
        "                  if before.get(k) != after.get(k)}))\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    changed = json.loads(out.stdout.strip().splitlines()[-1])
    assert changed == {}, f"importing the benchmarks changed the environment: {changed}"
