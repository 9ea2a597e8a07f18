"""The node agent and its node process, against a stand-in driver: threads the agent starts are
its own and joined, and a node whose main returned stays up until it is released."""

from __future__ import annotations

import subprocess
import threading

import cloudpickle
import pytest

from duotf._node import agent as node
from duotf._node import job as job_payload
from duotf._node.agent import ChildMsg, OutcomeStatus
from duotf._transport.rendezvous import Msg
from tests.agents import AgentRun, FakeDriver, node_job


def test_a_stop_runs_on_a_named_agent_thread_joined_before_the_agent_returns(tmp_path):
    driver = FakeDriver()
    before = set(threading.enumerate())
    run = AgentRun(driver.job(tmp_path))
    try:
        peer, _ = driver.expect(Msg.READY)
        peer.send({"type": Msg.STOP, "timeout": 5})
        assert run.join(30) and run.outcome.status is OutcomeStatus.STOPPED
        assert "duotf-agent-stop" in [t.name for t in run.agent.threads]
        assert not [t.name for t in run.agent.threads if t.is_alive()]
    finally:
        driver.close()
        run.join(30)
    assert set(threading.enumerate()) <= before  # compared as sets, not by name


def _next_from_child(agent: node._Agent, kind: ChildMsg, timeout: float = 60) -> tuple:
    while True:
        event = agent.events.get(timeout=timeout)
        if event[0] == "child" and event[1] == kind:
            return event


def test_a_node_whose_main_returned_waits_for_release_however_long(tmp_path):
    job = node_job(tmp_path, payload=job_payload.dumps((lambda args, ctx: 42, None)))
    agent = node._Agent(job, 0, "", 0)
    with node.reserve_port() as reservation:  # as run() does: the node process keeps it
        agent._spawn(reservation)
    try:
        _next_from_child(agent, ChildMsg.READY)
        agent._to_child(ChildMsg.START, {
            "tf_config": {"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}},
            "job": "worker", "index": 0, "host": "127.0.0.1", "port": 1,
        })
        assert cloudpickle.loads(_next_from_child(agent, ChildMsg.RESULT)[2]) == 42
        with pytest.raises(subprocess.TimeoutExpired):  # peers may still need its TF server
            agent.proc.wait(4)
        agent._to_child(ChildMsg.RELEASE)
        assert agent.proc.wait(30) == 0
    finally:
        agent._stop_child(1.0)
        agent.child_tx.close()
        for thread in agent.threads:
            thread.join(5)


def test_a_node_process_ends_itself_when_its_agent_falls_silent(tmp_path):
    """Pinged, a node lives past heartbeat_timeout; once the pings stop (its agent stalled),
    it kills its own process group within heartbeat_timeout, though its pipe is still open."""
    import dataclasses
    import time

    job = dataclasses.replace(node_job(tmp_path), heartbeat_timeout=1.0)
    agent = node._Agent(job, 0, "", 0)
    with node.reserve_port() as reservation:  # as run() does: the node process keeps it
        agent._spawn(reservation)
    try:
        _next_from_child(agent, ChildMsg.READY)
        until = time.monotonic() + 3 * job.heartbeat_timeout
        while time.monotonic() < until:  # what the agent's loop does
            agent._to_child(ChildMsg.PING)
            assert agent.proc.poll() is None, "a pinged node ended"
            threading.Event().wait(job.heartbeat_interval)
        silent = time.monotonic()
        assert agent.proc.wait(10) == -9  # SIGKILL of its own process group
        assert time.monotonic() - silent < job.heartbeat_timeout + 1
    finally:
        agent._stop_child(1.0)
        agent.child_tx.close()
        for thread in agent.threads:
            thread.join(5)


@pytest.mark.parametrize("driver_lost, level", [(True, "INFO"), (False, "WARNING")])
def test_a_node_killed_after_its_stop_timeout_is_a_warning_unless_its_driver_went_first(
        driver_lost, level, caplog):
    # after a lost driver the node is stopped as expected (its main may block on a peer or on a
    # feed that is gone); otherwise a node that outlives its SIGTERM is worth a warning
    import logging
    import sys

    agent = object.__new__(node._Agent)
    agent.node_id, agent.driver_lost = 1, driver_lost
    agent.proc = subprocess.Popen(
        [sys.executable, "-c", "import signal, sys, time\n"
         "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(60)"],
        stdout=subprocess.PIPE, start_new_session=True)
    assert agent.proc.stdout.readline() == b"ready\n"  # SIGTERM ignored from here on
    caplog.set_level(logging.INFO, logger=node.logger.name)
    agent._stop_child(0.5)
    agent.proc.stdout.close()
    assert agent.proc.returncode == -9
    assert [r.levelname for r in caplog.records if "did not stop within" in r.getMessage()] == [level]
