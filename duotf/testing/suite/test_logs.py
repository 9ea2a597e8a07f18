"""The shared suite's node output: every node's stdout and stderr reach the driver, prefixed,
in order, bounded, in a file per node and in a failed node's error."""

from __future__ import annotations

import logging
import re

import pytest

import duotf
from duotf.testing.suite import mains

#: what talk_main writes, in order, through print, sys.stderr, os.write(2) and logging
TALK = ["out-1", "err-2", "fd2-3", "log-4", "out-5"]



def _said(records, node_id: int) -> list:
    """The lines of node ``node_id`` among the ``duotf.node`` records, prefix checked."""
    lines = []
    for r in records:
        if r.name == "duotf.node" and getattr(r, "duotf_node", None) == node_id:
            prefix, _, line = r.getMessage().partition("] ")
            assert prefix == f"[{r.duotf_role}", r.getMessage()
            lines.append(line)
    return lines


def test_node_output_reaches_the_driver_prefixed_in_order_and_bounded(backend, caplog):
    caplog.set_level(logging.INFO, logger="duotf.node")
    n = 30000  # worker:1 floods after its own lines: one cluster for both checks
    with duotf.run(mains.talk_main, {"flood": n, "flood_node": 1}, backend,
                   duotf.ClusterSpec(workers=2)) as cluster:
        values = cluster.wait()
    for node_id in (0, 1):
        me = f"worker-{node_id}"
        expected = [f"{word} {me}" for word in TALK]
        said = [line for line in _said(caplog.records, node_id) if line.endswith(me)]
        assert said == expected, caplog.text
        shown = [r.getMessage() for r in caplog.records if r.name == "duotf.node"]
        assert f"[worker:{node_id}] out-1 {me}" in shown
        kept = [line for line in cluster.logs(node_id).splitlines() if line.endswith(me)]
        assert kept == expected
        assert cluster.logs(f"worker:{node_id}") == cluster.logs(node_id)
        # TensorFlow's C++ start-up notes are hidden unless asked for
        assert values[node_id]["tf_cpp_min_log_level"] == "1"

    # the flood: lines over the rate limit are dropped, and counted
    text = cluster.logs(1)
    got = [int(line.split()[1]) for line in text.splitlines() if line.startswith("flood ")]
    dropped = [int(m) for m in re.findall(r"\[duotf: (\d+) lines dropped", text)]
    assert dropped, "30000 lines at once were all sent: the rate limit did not act"
    assert got == sorted(got) and len(got) + sum(dropped) == n  # every line sent or counted
    assert len(got) < n
    warnings = [r for r in caplog.records if r.name == "duotf.node" and r.levelno == logging.WARNING]
    assert warnings and all("[worker:1]" in r.getMessage() for r in warnings)
    assert "lines dropped" in warnings[0].getMessage()
    assert "flood" not in cluster.logs(0)


def test_failed_node_error_carries_its_last_output(backend, caplog):
    caplog.set_level(logging.INFO, logger="duotf.node")
    with pytest.raises(duotf.NodeFailedError) as info:
        cluster = duotf.run(mains.talk_main, {"fail": 1}, backend, duotf.ClusterSpec(workers=2))
        cluster.wait()
    err = info.value
    assert err.role == "worker:1" and err.remote_type == "RuntimeError"
    # the last 100 lines, complete: main's output reached the driver before its failure did
    assert err.output_tail == [f"last-{i} worker-1" for i in range(50, 150)]
    message = str(err)
    assert "Last 100 lines of its output:" in message
    assert message.rstrip().endswith("last-149 worker-1")
    assert "talked out worker-1" in message


# Three engines of five (CI time): what is not sent is decided by the node agent, the same on
# every engine.
@pytest.mark.engines('local', 'dask', 'spark-standalone')
def test_log_to_driver_false_sends_nothing(backend, caplog):
    caplog.set_level(logging.INFO, logger="duotf.node")
    with duotf.run(mains.talk_main, None, backend, duotf.ClusterSpec(workers=1),
                   log_to_driver=False) as cluster:
        cluster.wait()
    assert not [r for r in caplog.records if r.name == "duotf.node"]
    assert cluster.log_dir is None
    with pytest.raises(duotf.ConfigError, match="log_to_driver=True"):
        cluster.logs(0)


@pytest.mark.engines("local")
def test_log_to_driver_chief_sends_the_chiefs_only(backend, caplog, tmp_path):
    caplog.set_level(logging.INFO, logger="duotf.node")
    with pytest.raises(duotf.ConfigError, match="'chief'"):
        duotf.run(mains.talk_main, None, backend, log_to_driver="all")
    with duotf.run(mains.talk_main, None, backend, duotf.ClusterSpec(workers=2),
                   log_to_driver="chief", log_dir=str(tmp_path)) as cluster:
        cluster.wait()
    assert [line for line in _said(caplog.records, 0) if "worker-0" in line]
    assert not _said(caplog.records, 1)
    with pytest.raises(duotf.ConfigError, match="worker:1"):
        cluster.logs(1)
    # a log_dir named by the user is kept, under the job's id
    assert (tmp_path / cluster.job_id / "worker-0.log").read_text() == cluster.logs(0)
