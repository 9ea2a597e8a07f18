"""A killed driver's temp folders (its node logs, its checkpoints, its nodes' working folders on
its host) are removed by the next duotf run on the host, and no live run's folder is touched
(duotf/_driver/leftovers.py). The driver here is a real process on the local engine, killed
with SIGKILL; the shared suite's resume test does the same on Dask and Spark Connect."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

import pytest

import duotf
from duotf._driver import leftovers
from duotf.testing import poll_for
from duotf.testing.suite import mains

_DRIVER = """
import sys, time
import duotf
from duotf.testing.suite import mains

with duotf.run(mains.sleep_main, 600, "local", duotf.ClusterSpec(workers=1),
               heartbeat_interval=0.5, heartbeat_timeout=3) as cluster:
    print(cluster.job_id, flush=True)
    time.sleep(600)
"""


def _entries(root) -> set:
    return {name for name in os.listdir(root) if name.startswith("duotf-")}


def test_a_killed_drivers_folders_go_with_the_next_run_and_a_live_runs_stay(tmp_path, monkeypatch):
    root = tmp_path / "tmp"
    root.mkdir()
    (root / "duotf-0123456789ab").mkdir()  # no lock file: not known to be a dead driver's
    driver = subprocess.Popen([sys.executable, "-c", _DRIVER], env=dict(os.environ, TMPDIR=str(root)),
                              stdout=subprocess.PIPE, text=True)
    try:
        job = driver.stdout.readline().strip()
        assert len(job) == 12, job
        poll_for(lambda: os.path.isdir(root / f"duotf-{job}" / "node-0"), 60, 0.1,
                 "the killed driver's node to start")
        left = _entries(root) - {"duotf-0123456789ab"}
        assert {f"duotf-{job}.lock", f"duotf-{job}"} <= left
        assert any(name.startswith(f"duotf-logs-{job}-") for name in left), left
        driver.send_signal(signal.SIGKILL)
        driver.wait(30)
    finally:
        if driver.poll() is None:
            driver.kill()
        driver.stdout.close()
    # its node ends by itself; what the driver made stays until the next run
    poll_for(lambda: not os.path.exists(root / f"duotf-{job}" / "node-0"), 30, 0.2,
             "the killed driver's node to end")
    assert _entries(root) - {f"duotf-{job}"} == left - {f"duotf-{job}"} | {"duotf-0123456789ab"}

    monkeypatch.setattr(tempfile, "tempdir", str(root))
    release = tmp_path / "release"
    with duotf.run(mains.block_main, {"release": str(release)}, "local",
                   duotf.ClusterSpec(workers=1)) as live:
        assert _entries(root) & left == set()  # the dead driver's: gone
        assert "duotf-0123456789ab" in _entries(root)
        mine = _entries(root)
        assert f"duotf-{live.job_id}.lock" in mine
        with duotf.run(mains.argv_main, [], "local", duotf.ClusterSpec(workers=1)) as other:
            other.wait(timeout=60)
            assert mine <= _entries(root)  # a live run's folders: untouched by another's sweep
        release.touch()
        live.wait(timeout=60)
    del live, other
    import gc

    gc.collect()
    assert _entries(root) == {"duotf-0123456789ab"}  # both runs' own: removed by themselves


def test_a_lock_is_held_until_released_and_only_a_free_one_is_swept(tmp_path):
    lock = leftovers.JobLock("aaaaaaaaaaaa", root=str(tmp_path))
    (tmp_path / "duotf-aaaaaaaaaaaa-checkpoints").mkdir()
    (tmp_path / "duotf-logs-aaaaaaaaaaaa-x1").mkdir()
    assert leftovers.sweep(str(tmp_path)) == []  # held by this process: live
    with pytest.raises(OSError):
        leftovers.JobLock("aaaaaaaaaaaa", root=str(tmp_path))  # a second holder is refused
    # a dead holder: the file stays, nobody holds it
    (tmp_path / "duotf-bbbbbbbbbbbb.lock").write_text("12345\n")
    (tmp_path / "duotf-bbbbbbbbbbbb-1").mkdir()
    (tmp_path / "duotf-logs-bbbbbbbbbbbb-y2").mkdir()
    (tmp_path / "duotf-bbbbbbbbbbbbb").mkdir()  # another job's name, one character longer
    removed = leftovers.sweep(str(tmp_path))
    assert sorted(os.path.basename(p) for p in removed) == ["duotf-bbbbbbbbbbbb-1",
                                                            "duotf-logs-bbbbbbbbbbbb-y2"]
    assert sorted(os.listdir(tmp_path)) == ["duotf-aaaaaaaaaaaa-checkpoints", "duotf-aaaaaaaaaaaa.lock",
                                           "duotf-bbbbbbbbbbbbb", "duotf-logs-aaaaaaaaaaaa-x1"]
    lock.release()
    lock.release()  # idempotent
    assert not (tmp_path / "duotf-aaaaaaaaaaaa.lock").exists()
