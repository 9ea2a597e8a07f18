"""duotf.testing.plugin under pytest-xdist: each worker has a session tag, a temp folder and
Spark local dirs of its own (what the leak check after each test reads, so that it sees its own
worker's jobs only), and its folder is gone when it ends."""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
import textwrap


def test_each_xdist_worker_has_its_own_tag_and_temp_folder_and_leaves_none(tmp_path):
    project, base, out = tmp_path / "project", tmp_path / "tmp", tmp_path / "out"
    for folder in (project, base, out):
        folder.mkdir()
    (project / "conftest.py").write_text(textwrap.dedent("""
        import json, os, tempfile
        pytest_plugins = ["duotf.testing.plugin"]

        def pytest_configure(config):
            worker = os.environ.get("PYTEST_XDIST_WORKER")
            if worker:
                with open(os.path.join(os.environ["OUT"], worker), "w") as f:
                    json.dump({"tag": os.environ["DUOTF_TEST_SESSION"],
                               "tmp": tempfile.gettempdir(),
                               "spark": os.environ["SPARK_LOCAL_DIRS"]}, f)
    """))
    (project / "test_it.py").write_text("def test_one():\n    pass\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PYTEST_") and k not in ("DUOTF_TEST_SESSION", "SPARK_LOCAL_DIRS")}
    env.update(TMPDIR=str(base), OUT=str(out))
    run = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider",
                          "-q"], cwd=project, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    seen = {w: json.loads((out / w).read_text()) for w in sorted(os.listdir(out))}
    assert sorted(seen) == ["gw0", "gw1"], seen
    for worker, it in seen.items():
        assert it["tag"].startswith(f"{worker}/"), it
        assert os.path.dirname(it["tmp"]) == str(base) and it["spark"] == it["tmp"], it
    assert seen["gw0"]["tag"] != seen["gw1"]["tag"] and seen["gw0"]["tmp"] != seen["gw1"]["tmp"]
    # each worker's folder removed at its end (pytest's own, pytest-of-<user>, stays, as ever)
    assert [n for n in os.listdir(base) if n != f"pytest-of-{getpass.getuser()}"] == []
