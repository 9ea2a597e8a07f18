"""``duotf.doctor`` on every engine: every check passes on the test clusters, and injected faults
(another TensorFlow first on the nodes' PYTHONPATH, an address nobody listens on) give FAIL rows
that name them and say what to change, while the other checks still pass. The command line's
``doctor`` is run by tests/test_readme.py (its block in docs/guides/cli.md), with the same faults."""

from __future__ import annotations

import socket

import pytest

import duotf
from duotf._driver.doctor import CheckStatus

OK, FAIL = CheckStatus.OK, CheckStatus.FAIL


def shadow_tensorflow(folder) -> str:
    """A folder holding a ``tensorflow`` package of version 0.0.injected: first on a node's
    PYTHONPATH, it is the TensorFlow the node imports."""
    package = folder / "shadow" / "tensorflow"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('__version__ = "0.0.injected"\n')
    return str(package.parent)


def closed_port() -> socket.socket:
    """A port bound and never listened on: a connection to it is refused while it is held."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return sock


# CI time (a TensorFlow import per executor): the engines of separate executors; local and
# procpool pass every other check in the test below
@pytest.mark.engines("dask", "spark-standalone", "spark-connect")
def test_every_check_passes_on_the_test_cluster(backend, engine):
    report = duotf.doctor(backend, duotf.ClusterSpec(workers=2))
    assert report.ok, report.table()
    for name in ("slots", "probes", "python", "duotf", "tensorflow", "protocol", "driver port",
                 "node ports", "filesystem", "/dev/shm"):
        assert report[name].status is OK, report.table()
    assert f"on {engine.executors} executor(s)" in report["probes"].detail  # every executor probed
    assert "TensorFlow serves 'grpc'" in report["protocol"].detail
    assert report.table().endswith("all checks passed")


# Three engines of five (CI time): the in-process backend, a Dask worker and a standalone executor.
@pytest.mark.engines("local", "dask", "spark-standalone")
def test_another_tensorflow_and_a_closed_port_fail_with_the_fix(backend, tmp_path):
    shadow = shadow_tensorflow(tmp_path)
    with closed_port() as sock:
        address = "127.0.0.1:%d" % sock.getsockname()[1]
        report = duotf.doctor(backend, duotf.ClusterSpec(workers=2), env={"PYTHONPATH": shadow},
                              reach=[address])
    assert not report.ok
    tf = report["tensorflow"]
    assert tf.status is FAIL and "TensorFlow 0.0.injected" in tf.detail and shadow in tf.detail
    assert "PYTHONPATH" in tf.fix
    reach = report[f"reach {address}"]
    assert reach.status is FAIL and "refused" in reach.detail.lower(), reach
    assert "firewall" in reach.fix
    for name in ("slots", "python", "duotf", "driver port", "node ports", "filesystem"):
        assert report[name].status is OK, report.table()  # the faults are named, nothing else
    table = report.table()
    assert "0.0.injected" in table and "fix: install one TensorFlow" in table
    assert table.endswith(f"{len(report.failed)} check(s) failed")
