"""The node agent and its node process, against a stand-in driver: threads the agent starts are
its own and joined."""

from __future__ import annotations

import threading

from duotf.rendezvous import Msg
from tests.agents import AgentRun, FakeDriver


def test_a_stop_runs_on_a_named_agent_thread_joined_before_the_agent_returns(tmp_path):
    driver = FakeDriver()
    before = set(threading.enumerate())
    run = AgentRun(driver.job(tmp_path))
    try:
        peer, _ = driver.expect(Msg.READY)
        peer.send({"type": Msg.STOP, "timeout": 5})
        assert run.join(30) and run.outcome.status == "stopped"
        assert "duotf-agent-stop" in [t.name for t in run.agent.threads]
        assert not [t.name for t in run.agent.threads if t.is_alive()]
    finally:
        driver.close()
        run.join(30)
    assert set(threading.enumerate()) <= before  # compared as sets, not by name
