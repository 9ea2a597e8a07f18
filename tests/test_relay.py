"""The relay (duotf._transport.relay) on its own: a real hub process, a real rendezvous server,
authenticated channels through it; polls made by this process, or failing and repeated as an
engine's retried task would make them. On Spark Connect it runs end to end in
tests/test_connect_relay.py."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading

import pytest

from duotf._transport import rendezvous
from duotf._transport.relay import HELLO, Tunnel, exchange_with_hub
from duotf.testing import poll_for


@pytest.fixture
def hub():
    """A hub started as Spark's task starts one (``python -m``, the token on stdin, detached):
    ``(node address, poll address, pid, token)``; killed if the test left it running."""
    token = "t0ken"
    proc = subprocess.run([sys.executable, "-m", "duotf._transport.relay", "127.0.0.1", "30"],
                          input=token + "\n", capture_output=True, text=True, timeout=60)
    words = proc.stdout.split()
    assert proc.returncode == 0 and words[0] == HELLO, proc.stderr
    node_port, poll_port, pid = int(words[1]), int(words[2]), int(words[3])
    yield ("127.0.0.1", node_port), ("127.0.0.1", poll_port), pid, token
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class _Server:
    def __init__(self, secret):
        self.messages: "queue.Queue" = queue.Queue()
        self.closed = threading.Event()
        self.server = rendezvous.RendezvousServer(secret, lambda peer, m: self.messages.put((peer, m)),
                                                  lambda peer, exc: self.closed.set())


def test_authenticated_channels_cross_the_relay_both_ways_and_close(hub):
    node_address, poll_address, pid, token = hub
    secret = rendezvous.new_secret()
    server = _Server(secret)
    polls = []

    def exchange(request: bytes) -> bytes:
        polls.append(json.loads(request))
        return exchange_with_hub(poll_address, request, 10)

    tunnel = Tunnel(exchange, server.server.address, token, lost_after=30,
                    on_lost=lambda why: pytest.fail(why)).start()
    try:
        channels = [rendezvous.connect(node_address, secret, 20) for _ in range(3)]
        big = "x" * 300_000  # several reads and more than one response's worth of frames
        for i, channel in enumerate(channels):
            channel.send({"type": "register", "node_id": i, "pad": big})
        got = {}
        for _ in channels:
            peer, message = server.messages.get(timeout=20)
            got[message["node_id"]] = (peer, message)
        assert sorted(got) == [0, 1, 2] and all(m["pad"] == big for _, m in got.values())
        for i, (peer, _) in got.items():
            peer.send({"type": "start", "tf_config": f"for {i}"})
        assert [c.recv()["tf_config"] for c in channels] == ["for 0", "for 1", "for 2"]
        channels[0].close()  # a node's end closes the driver's side of it
        poll_for(server.closed.is_set, 20, 0.05, "the server to see the node's connection end")
        got[1][0].close()  # the driver's end closes the node's
        with pytest.raises((ConnectionError, OSError)):
            channels[1].recv()
    finally:
        tunnel.close()
        server.server.close()
    assert polls[-1]["stop"] is True
    poll_for(lambda: not _alive(pid), 20, 0.05, "the hub to end when told")


def test_a_poll_applied_twice_or_lost_repeats_and_loses_no_byte(hub):
    """An engine runs a failed poll's task again: the second copy of a request writes nothing
    twice; a response that never arrived is sent again by the hub."""
    node_address, poll_address, pid, token = hub
    secret = rendezvous.new_secret()
    server = _Server(secret)
    count = [0]

    def exchange(request: bytes) -> bytes:
        count[0] += 1
        if count[0] % 3 == 0:
            exchange_with_hub(poll_address, request, 10)  # applied, its answer lost
            raise ConnectionError("the task's result was lost")
        if count[0] % 3 == 1:
            exchange_with_hub(poll_address, request, 10)  # applied twice
        return exchange_with_hub(poll_address, request, 10)

    tunnel = Tunnel(exchange, server.server.address, token, lost_after=30,
                    on_lost=lambda why: pytest.fail(why)).start()
    try:
        channel = rendezvous.connect(node_address, secret, 30)
        for i in range(40):
            channel.send({"type": "heartbeat", "i": i})
        seen = [server.messages.get(timeout=30)[1]["i"] for _ in range(40)]
        assert seen == list(range(40))  # the channel's sequence MACs would close it otherwise
    finally:
        tunnel.close()
        server.server.close()


def test_a_hub_that_answers_no_poll_is_lost_once_and_named(hub):
    node_address, poll_address, pid, token = hub
    os.kill(pid, signal.SIGKILL)
    lost = []
    tunnel = Tunnel(lambda request: exchange_with_hub(poll_address, request, 1), ("127.0.0.1", 9),
                    token, lost_after=1.0, on_lost=lost.append, where="host-a (pid 1)").start()
    poll_for(lambda: lost, 20, 0.05, "the relay to be declared lost")
    tunnel.close()
    assert len(lost) == 1 and "the relay at host-a (pid 1) answered no poll for" in lost[0]
    assert "ConnectionRefusedError" in lost[0]


def test_a_hub_the_driver_left_ends_by_itself(hub):
    """No orphan: a hub no poll reaches for ``idle`` seconds closes its nodes and ends."""
    proc = subprocess.run([sys.executable, "-m", "duotf._transport.relay", "127.0.0.1", "0.5"],
                          input="x\n", capture_output=True, text=True, timeout=60)
    pid = int(proc.stdout.split()[3])
    poll_for(lambda: not _alive(pid), 20, 0.05, "an idle hub to end")


def test_a_poll_without_the_token_gets_nothing(hub):
    node_address, poll_address, pid, token = hub
    with pytest.raises(ConnectionError):
        exchange_with_hub(poll_address, json.dumps({"token": "wrong", "wait": 0}).encode(), 5)
    answer = json.loads(exchange_with_hub(poll_address, json.dumps({"token": token, "wait": 0}).encode(), 5))
    assert answer == {"streams": {}}
