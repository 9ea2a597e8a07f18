"""The shared suite's stalled nodes: a chief or worker that runs on long after its peers returned
(blocked in a collective only it made, as ``model.evaluate`` on the chief alone under
MultiWorkerMirroredStrategy) is named on the driver, and ``wait``'s timeout names only the
nodes still running."""

from __future__ import annotations

import logging

import pytest

import duotf
import duotf._driver.supervisor
from duotf.testing import poll_for
from duotf.testing.suite import mains


def _stall_notes(caplog):
    return [r for r in caplog.records if r.name == "duotf.cluster" and r.levelno == logging.WARNING
            and "still running" in r.getMessage()]


def test_a_node_blocked_after_its_peers_returned_is_named(backend, tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(duotf._driver.supervisor, "STALLED_AFTER", 0.5)
    caplog.set_level(logging.WARNING, logger="duotf.cluster")
    release = tmp_path / "release"
    spec = duotf.ClusterSpec(workers=2)
    with duotf.run(mains.chief_blocks_main, {"release": str(release)}, backend, spec) as cluster:
        poll_for(lambda: _stall_notes(caplog), timeout=120, what="the note on the blocked chief")
        assert cluster.nodes[1].state is duotf.NodeState.RETURNED
        with pytest.raises(TimeoutError) as info:
            cluster.wait(timeout=0.2)
        release.touch()
        assert cluster.wait(timeout=120) == [0, 1]
    # the error names the node still running, not the one that returned
    text = str(info.value)
    assert text.startswith("after 0.2 s these nodes still run: worker:0 ")
    assert "worker:1" not in text
    assert "1 other node returned" in text and "make it on every worker" in text
    # the note: once, naming both, and the likely cause
    notes = _stall_notes(caplog)
    assert len(notes) == 1
    note = notes[0].getMessage()
    assert note.startswith("duotf: worker:0 ") and "still running 0.5 s after worker:1 " in note
    assert "returned" in note and "collective" in note and "model.evaluate" in note
    assert "make the same calls on every worker" in note
