"""The authenticated channel: forged, replayed, reflected or oversized frames are refused."""

from __future__ import annotations

import json
import queue
import socket
import struct

import pytest

from duotf._transport import rendezvous
from tests.conftest import SECRET
@pytest.fixture
def server():
    inbox: "queue.Queue" = queue.Queue()
    closed: "queue.Queue" = queue.Queue()
    secret = rendezvous.new_secret()
    srv = rendezvous.RendezvousServer(
        secret, lambda peer, msg: inbox.put((peer, msg)), lambda peer, exc: closed.put(exc)
    )
    try:
        yield srv, secret, inbox, closed
    finally:
        srv.close()


def test_round_trip_both_ways(server):
    srv, secret, inbox, _ = server
    client = rendezvous.connect(srv.address, secret, timeout=5)
    client.send({"type": "register", "n": 1})
    peer, message = inbox.get(timeout=5)
    assert message == {"type": "register", "n": 1}
    peer.send({"type": "start", "ok": True})
    assert client.recv() == {"type": "start", "ok": True}
    client.close()


def test_wrong_secret_is_refused(server, caplog):
    """At the gate: the client is told, the server logs the refusal, and no peer ever existed."""
    srv, _, inbox, closed = server
    with pytest.raises(rendezvous.AuthenticationError, match="refused this job's secret"):
        rendezvous.connect(srv.address, rendezvous.new_secret(), timeout=5)
    srv.close()  # flushes the gate's count of refusals
    assert any("refused 1 connection(s)" in r.getMessage() and "failed authentication" in r.getMessage()
               for r in caplog.records if r.name == "duotf._transport.gate")
    assert inbox.empty() and closed.empty()


def test_a_server_of_another_kind_is_not_retried():
    from duotf._transport.server import FeedServer

    feed = FeedServer(SECRET)  # speaks the feed's handshake, not the rendezvous'
    try:
        with pytest.raises(rendezvous.AuthenticationError, match="does not speak this protocol"):
            rendezvous.connect(("127.0.0.1", feed.port), SECRET, timeout=5)
    finally:
        feed.close()


def test_tampered_frame_is_refused(server):
    srv, secret, inbox, closed = server
    client = rendezvous.connect(srv.address, secret, timeout=5)
    good = {"type": "register", "port": 1}
    body = json.dumps({"type": "register", "port": 2}).encode()
    mac = client._mac(b"C", 0, json.dumps(good, separators=(",", ":")).encode())
    client.sock.sendall(struct.pack(">I", len(body)) + mac + body)
    assert isinstance(closed.get(timeout=5), rendezvous.AuthenticationError)
    assert inbox.empty()


def test_replayed_frame_is_refused(server):
    """The sequence number is under the MAC: sending a captured frame again fails."""
    srv, secret, inbox, closed = server
    client = rendezvous.connect(srv.address, secret, timeout=5)
    body = json.dumps({"type": "heartbeat"}, separators=(",", ":")).encode()
    frame = struct.pack(">I", len(body)) + client._mac(b"C", 0, body) + body
    client.sock.sendall(frame)
    assert inbox.get(timeout=5)[1] == {"type": "heartbeat"}
    client.sock.sendall(frame)
    assert isinstance(closed.get(timeout=5), rendezvous.AuthenticationError)
    assert inbox.empty()


def test_pickle_is_never_accepted(server):
    import pickle

    srv, secret, inbox, closed = server
    client = rendezvous.connect(srv.address, secret, timeout=5)
    body = pickle.dumps({"type": "register"})
    client.sock.sendall(struct.pack(">I", len(body)) + client._mac(b"C", 0, body) + body)
    assert isinstance(closed.get(timeout=5), rendezvous.AuthenticationError)  # not JSON
    assert inbox.empty()


def test_oversized_frame_is_refused_without_reading_it(server):
    srv, secret, _, closed = server
    client = rendezvous.connect(srv.address, secret, timeout=5)
    client.sock.sendall(struct.pack(">I", rendezvous.MAX_FRAME + 1) + b"\0" * 32)
    assert isinstance(closed.get(timeout=5), rendezvous.AuthenticationError)


def test_connect_gives_up_with_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        with pytest.raises(ConnectionError, match="could not reach the duotf driver"):
            rendezvous.connect(("127.0.0.1", port), SECRET, timeout=0.5)


def test_close_releases_port_and_threads(server):
    import threading

    srv, secret, _, _ = server
    client = rendezvous.connect(srv.address, secret, timeout=5)
    srv.close()
    with pytest.raises(ConnectionError):
        client.recv()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(srv.address, timeout=2).close()
    assert not [t for t in threading.enumerate() if t.name.startswith("duotf-rendezvous")]
