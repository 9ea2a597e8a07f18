"""benchmarks/scale.py's machinery at 50 simulated nodes, so that the benchmark cannot rot: the
real driver starts them all, hears their heartbeats, ends them and leaves no helper process
behind (and, through the conftest's leak check, no thread or listening port)."""

from __future__ import annotations

from benchmarks.scale import run_once
from benchmarks.simnodes import SimBackend


def test_fifty_simulated_nodes_start_beat_and_end():
    backend = SimBackend(agents_per_process=25)
    result = run_once(50, 25, steady_seconds=1.0, settle=0.2, backend=backend)
    assert result["failure"] is None
    assert result["helpers"] == 2
    assert result["started"] < 30
    assert result["registered"] <= result["ready"] <= result["started"]
    assert result["outcomes"] == ["done"]
    assert result["oldest_beat"] < 5  # every node's heartbeats reached the driver
    assert result["tf_config"] > 50 * len("127.0.0.1:20000")
    procs = [p for job in backend.jobs for p in job.procs]
    assert procs and all(p.returncode == 0 for p in procs)
