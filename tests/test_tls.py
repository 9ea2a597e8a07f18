"""TLS on duotf's own connections (duotf._transport.tls): the job's certificate, the settings
that ask for it, and what crosses the network, read off the wire by a forwarder between a real
feeding connection and a real node feed server. The shared suite's test_tls runs whole jobs
with TLS on every engine."""

from __future__ import annotations

import socket
import ssl
import threading

import numpy as np
import pytest

from duotf.errors import ConfigError
from duotf._transport import rendezvous, tls, wire
from duotf._transport.server import FeedServer

#: a value whose bytes stand out in a capture: 512 of them make the batch
MARKED = np.full(512, 12345.678, dtype=np.float64)


class Forwarder:
    """A TCP forwarder to ``target`` on a port of its own, keeping every byte the client sent."""

    def __init__(self, target):
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.seen = bytearray()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self):
        client, _ = self.listener.accept()
        server = socket.create_connection(self.target)
        for source, sink, keep in ((client, server, True), (server, client, False)):
            thread = threading.Thread(target=self._pump, args=(source, sink, keep), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _pump(self, source, sink, keep):
        try:
            while True:
                data = source.recv(1 << 16)
                if not data:
                    break
                if keep:
                    self.seen += data
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.listener.close()


def _feed_through_a_forwarder(material):
    """One batch of MARKED sent to a feed server (TLS ``material`` on both ends, or none)
    through a :class:`Forwarder`: ``(the bytes the client sent, the column the node got, the
    node's end of the connection was TLS)``."""
    secret = rendezvous.new_secret()
    server = FeedServer(secret, tls=material)
    forwarder = Forwarder(("127.0.0.1", server.port))
    try:
        with wire.connect(("127.0.0.1", forwarder.port), secret, 10, material) as sock:
            assert tls.encrypted(sock) == (material is not None)
            wire.send_frame(sock, wire.Frame.BATCH, {"x": MARKED})
            _, cols, conn = server.queue.get(timeout=10)
        return bytes(forwarder.seen), cols["x"], tls.encrypted(conn.sock)
    finally:
        forwarder.close()
        server.close()


def test_the_feed_crosses_the_network_encrypted_with_tls_and_in_clear_without():
    seen, got, encrypted = _feed_through_a_forwarder(tls.make())
    np.testing.assert_array_equal(got, MARKED)
    assert encrypted
    assert MARKED[:8].tobytes() not in seen  # not one float of the batch in clear
    seen, got, encrypted = _feed_through_a_forwarder(None)  # the same capture catches it in clear
    np.testing.assert_array_equal(got, MARKED)
    assert not encrypted and MARKED.tobytes() in seen


def test_a_feed_server_refuses_a_peer_whose_certificate_is_not_the_jobs():
    secret = rendezvous.new_secret()
    server = FeedServer(secret, tls=tls.make())
    try:
        with pytest.raises(wire.FeedProtocolError, match="its TLS certificate is not this job's"):
            wire.connect(("127.0.0.1", server.port), secret, 10, tls.make())
    finally:
        server.close()


def test_the_control_channel_is_encrypted_both_ways():
    material = tls.make()
    got = []
    server = rendezvous.RendezvousServer(rendezvous.new_secret(), lambda peer, m: got.append((peer, m)),
                                         lambda peer, exc: None, tls=material)
    try:
        channel = rendezvous.connect(server.address, server._secret, 10, material)
        try:
            assert isinstance(channel.sock, ssl.SSLSocket)
            channel.send({"type": "heartbeat", "node_id": 0})
            deadline = threading.Event()
            for _ in range(100):
                if got:
                    break
                deadline.wait(0.05)
            peer, message = got[0]
            assert message["type"] == "heartbeat" and isinstance(peer.sock, ssl.SSLSocket)
        finally:
            channel.close()
    finally:
        server.close()


def test_a_certificate_is_made_by_openssl_where_cryptography_is_missing(monkeypatch):
    def missing():
        raise ImportError("no cryptography here")

    monkeypatch.setattr(tls, "_make_with_cryptography", missing)
    material = tls.make()
    assert material.cert.startswith(b"-----BEGIN CERTIFICATE-----") and material.ca == material.cert
    server_side, client_side = tls.contexts(material)
    assert server_side.verify_mode == client_side.verify_mode == ssl.CERT_REQUIRED


@pytest.mark.parametrize("value, engine_encrypts, expected", [
    (None, False, False), (None, True, True), ("1", False, True), ("0", True, False),
    ("on", False, True), ("off", True, False)])
def test_tls_is_on_where_asked_else_where_the_engine_encrypts(value, engine_encrypts, expected):
    environ = {} if value is None else {tls.TLS_ENV: value}
    assert tls.wanted(None, engine_encrypts, environ) is expected
    assert tls.wanted(not expected, engine_encrypts, environ) is (not expected)  # the keyword wins


def test_a_tls_setting_that_means_nothing_is_refused():
    with pytest.raises(ConfigError, match="DUOTF_TLS='maybe': use 1"):
        tls.wanted(None, False, {tls.TLS_ENV: "maybe"})


def test_a_given_certificate_is_used_and_a_half_given_one_refused(tmp_path):
    made = tls.make()
    (tmp_path / "cert.pem").write_bytes(made.cert)
    (tmp_path / "key.pem").write_bytes(made.key)
    given = tls.for_job({tls.CERT_ENV: str(tmp_path / "cert.pem"), tls.KEY_ENV: str(tmp_path / "key.pem")})
    assert given == made  # its own CA: the certificate itself
    with pytest.raises(ConfigError, match="DUOTF_TLS_CERT and DUOTF_TLS_KEY go together"):
        tls.for_job({tls.CERT_ENV: str(tmp_path / "cert.pem")})
    (tmp_path / "other.pem").write_bytes(tls.make().key)
    with pytest.raises(ConfigError, match="cannot be used"):
        tls.for_job({tls.CERT_ENV: str(tmp_path / "cert.pem"), tls.KEY_ENV: str(tmp_path / "other.pem")})
    assert "PRIVATE" not in repr(given)  # the key never shows in a log
