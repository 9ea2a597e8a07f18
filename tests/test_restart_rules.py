"""The rules of restarts, on their own: which failures restart, and where a restart resumes."""

from __future__ import annotations

import socket

import pytest

from duotf.errors import (BackendError, ConfigError, FeedError, NodeFailedError, NodeUnresponsiveError, ReservationTimeoutError)
from duotf._driver import restarts
from duotf._driver.nodes import NodeInfo
from duotf._driver.restarts import (DEFAULT_RESTART_ON, check_restart_on, failure_cause, lost_host, restartable,
                                    resume_point)


def _failed(**attrs):
    base = dict(node_id=1, role="worker:1", host="h", pid=1, exitcode=None, remote_type=None,
                remote_traceback=None, output_tail=[])
    return NodeFailedError("x", **{**base, **attrs})


def test_each_failure_has_its_cause():
    assert failure_cause(_failed(exitcode=-9)) == "killed"
    assert failure_cause(_failed(exitcode=3)) == "exited"
    assert failure_cause(_failed()) == "lost"
    assert failure_cause(_failed(remote_type="ValueError", remote_traceback="tb")) == "exception"
    assert failure_cause(NodeUnresponsiveError("x", node_id=1, role="worker:1", host="h", pid=1)) == "hung"
    assert failure_cause(BackendError("the job died")) == "lost"
    # what no restart cures
    assert failure_cause(ReservationTimeoutError("x", registered=0, expected=2, missing=[0, 1],
                                                 timeout=1)) is None
    assert failure_cause(FeedError("bad data")) is None


def test_only_a_lost_or_silent_node_whose_host_does_not_answer_has_its_host_avoided(monkeypatch):
    # a port of this host that nothing serves: a refused connection is an answer
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    node = NodeInfo(1, "worker:1", host="127.0.0.1", port=port, executor_id="box:12")
    silent = NodeUnresponsiveError("x", node_id=1, role="worker:1", host="127.0.0.1", pid=1)
    assert lost_host(silent, [node]) == set()
    assert lost_host(_failed(host="127.0.0.1", exitcode=-9), [node]) == set()  # killed: not asked
    # a host that does not answer: a listener whose queue is full drops the SYN, as a host
    # cut off does (probed for HOST_PROBE_TIMEOUT): its address and the node's host name
    monkeypatch.setattr(restarts, "HOST_PROBE_TIMEOUT", 0.5)
    with socket.socket() as full:
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        waiting = []
        while True:  # fill its queue: the next connection gets no answer
            try:
                waiting.append(socket.create_connection(full.getsockname(), timeout=0.2))
            except TimeoutError:
                break
        node.port = full.getsockname()[1]
        try:
            assert lost_host(silent, [node]) == {"127.0.0.1", "box"}
        finally:
            for sock in waiting:
                sock.close()
    assert lost_host(silent, []) == set()  # no port it served: nothing to ask


def test_restart_on_takes_causes_and_exception_classes():
    assert check_restart_on(None) == (DEFAULT_RESTART_ON, ())
    assert "exception" not in DEFAULT_RESTART_ON
    causes, names = check_restart_on(["lost", KeyError, "ResourceExhaustedError"])
    assert causes == {"lost"} and names == ("KeyError", "ResourceExhaustedError")
    bug = _failed(remote_type="ValueError", remote_traceback="tb")
    assert not restartable(bug, *check_restart_on(None))
    assert restartable(bug, *check_restart_on([ValueError]))
    assert restartable(bug, *check_restart_on(["exception"]))
    assert not restartable(_failed(exitcode=-9), *check_restart_on([ValueError]))
    for bad in (["killd"], [3], ["lowercase_name"]):
        with pytest.raises(ConfigError, match="restart_on"):
            check_restart_on(bad)


def test_resume_point_is_the_last_epoch_every_reporting_node_saved():
    assert resume_point({}, range(2)) == (0, {0: None, 1: None})
    # lock step, the chief alone saves: every node restores the chief's checkpoint
    assert resume_point({0: {1: "c1", 2: "c2"}}, range(2)) == (2, {0: "c2", 1: "c2"})
    # independent workers, one ahead: both go back to the epoch the other saved, each its own
    reports = {0: {1: "a1", 2: "a2", 3: "a3"}, 1: {1: "b1", 2: "b2"}}
    assert resume_point(reports, range(2)) == (2, {0: "a2", 1: "b2"})
    # no epoch that both kept: from the start
    assert resume_point({0: {3: "a3"}, 1: {2: "b2"}}, range(2))[0] == 0
