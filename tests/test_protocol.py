"""Typed protocol: a message or frame of a kind that duotf does not know is a protocol error,
which closes that connection (and only that one) and is logged."""

from __future__ import annotations

import logging
import queue

import pytest

from duotf._transport import rendezvous
from duotf._transport import wire
from duotf._transport.server import FeedServer
from duotf._node.agent import OutcomeStatus
from duotf._transport.rendezvous import Msg
from tests.agents import AgentRun, FakeDriver
from tests.conftest import SECRET


def _warned(caplog, logger: str, *words: str) -> bool:
    return any(r.name == logger and r.levelno == logging.WARNING
               and all(w in r.getMessage() for w in words) for r in caplog.records)


@pytest.mark.parametrize("type_", ["bogus", "Register", None, ["register"]])
def test_rendezvous_closes_a_connection_that_sends_an_unknown_type(caplog, type_):
    inbox: "queue.Queue" = queue.Queue()
    closed: "queue.Queue" = queue.Queue()
    secret = rendezvous.new_secret()
    server = rendezvous.RendezvousServer(
        secret, lambda peer, msg: inbox.put(msg), lambda peer, exc: closed.put(exc)
    )
    try:
        bad = rendezvous.connect(server.address, secret, timeout=5)
        bad.send({"type": type_, "node_id": 0})
        assert isinstance(closed.get(timeout=5), rendezvous.ProtocolError)
        with pytest.raises(ConnectionError):
            bad.recv()
        bad.close()
        assert inbox.empty()  # never handed to on_message
        assert _warned(caplog, "duotf._transport.rendezvous", "unknown rendezvous message type", repr(type_))
        good = rendezvous.connect(server.address, secret, timeout=5)  # the server still serves
        good.send({"type": Msg.HEARTBEAT, "node_id": 0})
        assert inbox.get(timeout=5) == {"type": "heartbeat", "node_id": 0}
        good.close()
    finally:
        server.close()


@pytest.mark.parametrize("kind, fields, words", [
    ("bogus", {}, ["unknown feed frame kind 'bogus'"]),
    ("ack", {}, ["a node takes no 'ack' frame"]),  # a known kind, but never one a node takes
    ("marker", {"marker": "epoc"}, ["unknown feed marker 'epoc'"]),
])
def test_feed_server_closes_a_connection_that_sends_an_unknown_frame(caplog, kind, fields, words):
    server = FeedServer(SECRET)
    try:
        bad = wire.connect(("127.0.0.1", server.port), SECRET, 10)  # authenticated
        wire.send_frame(bad, kind, **fields)
        with pytest.raises(ConnectionError):  # closed, not left waiting (a timeout)
            wire.recv_frame(bad)
        bad.close()
        assert _warned(caplog, "duotf._transport.datafeed", "closing a feed connection", *words)
        good = wire.connect(("127.0.0.1", server.port), SECRET, 10)
        wire.send_frame(good, wire.Frame.END, mode="train", partition=0)
        assert wire.recv_frame(good)[0] == {"t": "ack", "rows": 0}
        good.close()
    finally:
        server.close()


def test_agent_ends_on_an_unknown_message_from_the_driver(tmp_path, caplog):
    driver = FakeDriver()
    run = AgentRun(driver.job(tmp_path))
    try:
        peer, _ = driver.expect(Msg.READY)
        peer.send({"type": "bogus"})
        assert run.join(30), "the agent kept running after a message it does not know"
        assert run.outcome.status is OutcomeStatus.STOPPED  # its node was stopped with it
        assert _warned(caplog, "duotf.node", "node 0", "unknown rendezvous message type 'bogus'")
    finally:
        if run.thread.is_alive():
            peer.send({"type": Msg.STOP, "timeout": 1})
            run.join(30)
        driver.close()
