"""A restart that finds the capacity gone: a Dask worker without a nanny is killed for good; the
restart waits (within reservation_timeout) for a replacement, then fails with
InsufficientSlotsError naming what is missing, and leaves nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

import duotf
from duotf.errors import InsufficientSlotsError
from duotf.testing.suite.test_determinism import seeded_parts as _parts
from duotf.testing.suite.test_restarts import kill_when_ready as _kill_when_ready
from tests.engines import poll_for
from tests.suite import mains


@pytest.fixture
def dask_without_nannies():
    """A scheduler and 2 worker processes started with --no-nanny: a killed one stays dead."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=0, processes=True, dashboard_address=None, host="127.0.0.1")
    workers = [subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_worker", cluster.scheduler_address,
         "--no-nanny", "--nthreads", "2", "--no-dashboard", "--host", "127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(2)]
    client = Client(cluster)
    try:
        poll_for(lambda: len(client.scheduler_info()["workers"]) == 2, 60, what="2 workers")
        yield client
    finally:
        client.close()
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                w.wait(15)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()
        cluster.close()


def test_a_restart_without_the_capacity_it_needs_raises_insufficient_slots(dask_without_nannies, tmp_path):
    from duotf.backends.dask.backend import DaskBackend

    backend = DaskBackend(dask_without_nannies, slot_wait=1.0)
    args = {"width": 3, "batch": 8, "lr": 0.05, "victim": 1, "kill_after": 1,
            "signal_dir": str(tmp_path)}
    box = []
    cluster = duotf.run(mains.sgd_resume_main, args, backend, duotf.ClusterSpec(workers=2),
                        max_restarts=1, reservation_timeout=5)
    box.append(cluster)
    killer, killed = _kill_when_ready(box, str(tmp_path), victim="worker")
    with pytest.raises(InsufficientSlotsError) as raised:
        with cluster:
            cluster.train(dask_rows(), epochs=3)
            cluster.wait(timeout=120)
    killer.join(5)
    assert killed and raised.value.needed == 2 and raised.value.available == 1
    assert "after waiting for the engine to replace" in str(raised.value)
    [restart] = cluster.restarts
    assert restart.cause == "lost" and restart.seconds is None  # it never ran again
    assert os.path.exists(tmp_path / "ready-to-die")


def dask_rows():
    import dask
    import dask.bag as db

    return db.from_delayed([dask.delayed(list)(p) for p in _parts()])
