"""TLS on duotf's own connections (duotf._transport.tls): the job's certificate, the settings
that ask for it, and what crosses the network, read off the wire by a forwarder between a real
feeding connection and a real node feed server. The shared suite's
test_a_dataframe_fed_several_epochs_arrives_once_an_epoch_and_leaves_nothing (test_feed) runs a
whole job with TLS on every engine."""

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
            assert tls.encrypted(channel.sock)
            channel.send({"type": "heartbeat", "node_id": 0})
            deadline = threading.Event()
            for _ in range(100):
                if got:
                    break
                deadline.wait(0.05)
            peer, message = got[0]
            assert message["type"] == "heartbeat" and tls.encrypted(peer.sock)
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


ENCRYPTING_ENGINE = """
import sys

import duotf


def main(args, ctx):
    feed = ctx.get_data_feed()
    rows = 0
    while not feed.should_stop():
        rows += len(feed.next_batch(10))
    return rows


def spark():
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[3]").config("spark.ui.enabled", "false")
               .config("spark.authenticate", "true").config("spark.authenticate.secret", "not-secret")
               .config("spark.network.crypto.enabled", "true").getOrCreate())
    return session, session.range(100).selectExpr("cast(id as double) as x").repartition(4)


def dask():
    import dask.dataframe as dd
    import pandas as pd
    from distributed import Client, LocalCluster
    from distributed.security import Security

    security = Security.temporary()
    client = Client(LocalCluster(n_workers=2, threads_per_worker=2, security=security,
                                 dashboard_address=None), security=security)
    return client, dd.from_pandas(pd.DataFrame({"x": [float(i) for i in range(100)]}), npartitions=4)


if __name__ == "__main__":
    engine, data = spark() if sys.argv[1] == "spark" else dask()
    with duotf.run(main, None, engine, duotf.ClusterSpec(workers=2)) as cluster:
        print("TLS", cluster.tls is not None)
        cluster.train(data)
        print("RESULT", sum(cluster.wait(timeout=120)))
"""


# a driver script each: a Spark session of its own with Spark's RPC encryption on, a Dask
# cluster whose scheduler and workers speak TLS (distributed's Security.temporary)
@pytest.mark.slow
@pytest.mark.parametrize("engine", ["spark", "dask"])
def test_an_engine_that_encrypts_its_own_traffic_gets_tls_without_asking(tmp_path, engine):
    import os
    import subprocess
    import sys

    script = tmp_path / "driver.py"
    script.write_text(ENCRYPTING_ENGINE)
    env = {k: v for k, v in os.environ.items() if k != tls.TLS_ENV}
    env["PYSPARK_PYTHON"] = sys.executable
    done = subprocess.run([sys.executable, str(script), engine], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-2:] == ["TLS True", "RESULT 100"], done.stdout


def test_a_tls_connection_is_read_and_written_from_several_threads_at_once():
    """Each end of duotf's connections reads on one thread while others write (heartbeats beside
    messages, replies beside frames): every byte arrives, in each writer's order. An
    ssl.SSLSocket used so fails its records' MACs (DECRYPTION_FAILED_OR_BAD_RECORD_MAC)."""
    material = tls.make()
    left, right = socket.socketpair()
    ends = {}
    server = threading.Thread(target=lambda: ends.update(right=tls.secure(right, material, True)))
    server.start()
    ends["left"] = tls.secure(left, material, False)
    server.join()
    n, size = 300, 4099  # records of several sizes, a message spanning several of them

    def write(sock, tag):
        for i in range(n):
            sock.sendall(bytes([tag]) + i.to_bytes(4, "big") + bytes([i % 251]) * size)

    def read(sock, into):
        buf = bytearray()
        while len(buf) < 2 * n * (5 + size):
            chunk = sock.recv(1 << 16)
            assert chunk, "closed early"
            buf += chunk
        into.append(bytes(buf))

    got: dict = {"left": [], "right": []}
    threads = [threading.Thread(target=read, args=(ends[side], got[side])) for side in ends]
    # two writers an end, each its own messages; a writer's sendall is never interleaved
    threads += [threading.Thread(target=write, args=(ends[side], tag))
                for side in ends for tag in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for side in ends:
        data = got[side][0]
        seen = {1: [], 2: []}
        for at in range(0, len(data), 5 + size):
            message = data[at:at + 5 + size]
            i = int.from_bytes(message[1:5], "big")
            assert message[5:] == bytes([i % 251]) * size
            seen[message[0]].append(i)
        assert seen == {1: list(range(n)), 2: list(range(n))}
    for sock in ends.values():
        sock.close()


def _secured_pair(material, server_thread_name="tls-server"):
    """Both ends of a socket pair with TLS on them (the server's made on a thread of its own,
    named ``server_thread_name``): ``(client, server)``."""
    left, right = socket.socketpair()
    ends = {}
    server = threading.Thread(target=lambda: ends.update(right=tls.secure(right, material, True)),
                              name=server_thread_name)
    server.start()
    ends["left"] = tls.secure(left, material, False)
    server.join(30)
    return ends["left"], ends["right"]


def _sending(sock, data):
    """A thread that sends ``data`` on ``sock``, started."""
    thread = threading.Thread(target=sock.sendall, args=(data,), daemon=True)
    thread.start()
    return thread


def _read_exactly(sock, size, chunk=1 << 16):
    buf = bytearray()
    while len(buf) < size:
        got = sock.recv(min(chunk, size - len(buf)))
        assert got, "closed early"
        buf += got
    return bytes(buf)


def test_a_frame_goes_in_bulk_records_opened_straight_into_the_readers_buffer():
    """Where both ends have cryptography's AESGCM.encrypt_into, the bytes after the handshake
    go in records of up to BULK_RECORD bytes: a reader who asks for a whole record gets it in
    one call, and one who asks for less gets the rest of it in order."""
    client, server = _secured_pair(tls.make())
    try:
        assert client._bulk is not None and server._bulk is not None
        data = np.random.default_rng(0).integers(0, 256, 3 * tls.BULK_RECORD + 77, np.uint8).tobytes()
        writer = _sending(client, data)
        whole = bytearray(tls.BULK_RECORD)
        assert server.recv_into(whole) == tls.BULK_RECORD  # one record, one call
        assert bytes(whole) == data[:tls.BULK_RECORD]
        assert _read_exactly(server, len(data) - tls.BULK_RECORD, chunk=1000) == data[tls.BULK_RECORD:]
        writer.join(10)
    finally:
        client.close()
        server.close()


def test_an_end_without_bulk_records_keeps_tls_records_and_the_bytes_still_arrive(monkeypatch):
    """cryptography before encrypt_into, or none on an executor: that end offers no bulk
    records, and both ends keep TLS's own."""
    real = tls._aead
    monkeypatch.setattr(tls, "_aead", lambda: None if threading.current_thread().name == "old"
                        else real())
    client, server = _secured_pair(tls.make(), server_thread_name="old")
    try:
        assert client._bulk is None and server._bulk is None
        data = bytes(range(256)) * 2000
        writer = _sending(client, data)  # more than the socket holds: read while it is sent
        server.sendall(data[:1000])
        assert _read_exactly(server, len(data)) == data
        assert _read_exactly(client, 1000) == data[:1000]
        writer.join(10)
    finally:
        client.close()
        server.close()


class _Tamper:
    """A socket that hands what is sent to ``change`` first (a network on the way)."""

    def __init__(self, sock, change):
        self.sock, self.change = sock, change

    def sendall(self, data):
        self.sock.sendall(self.change(bytearray(data)))


def test_a_record_changed_on_the_way_fails_its_check():
    client, server = _secured_pair(tls.make())

    def flip(record):
        record[100] ^= 1  # one bit of the ciphertext
        return record

    client._bulk.sock = _Tamper(client._bulk.sock, flip)
    try:
        client.sendall(b"x" * 1000)
        with pytest.raises(ssl.SSLError, match="failed its check"):
            server.recv(1000)
    finally:
        client.close()
        server.close()


def test_a_read_cut_by_the_sockets_timeout_resumes_inside_the_record():
    """A connection read with a timeout (a reader that checks for a stop between reads) may
    time out with half a record in: the next read goes on from there."""
    client, server = _secured_pair(tls.make())
    halves = threading.Event()

    class Halves:
        def __init__(self, sock):
            self.sock = sock

        def sendall(self, data):
            half = len(data) // 2
            self.sock.sendall(data[:half])
            halves.wait(10)  # until the reader has timed out once
            self.sock.sendall(data[half:])

    client._bulk.sock = Halves(client._bulk.sock)
    data = bytes(range(256)) * 100
    writer = threading.Thread(target=client.sendall, args=(data,))
    writer.start()
    try:
        server.settimeout(0.3)
        with pytest.raises(socket.timeout):
            server.recv(len(data))
        halves.set()
        server.settimeout(10)
        assert _read_exactly(server, len(data)) == data
    finally:
        writer.join(10)
        client.close()
        server.close()


def test_both_ends_move_to_the_next_key_at_the_same_record(monkeypatch):
    """Every _REKEY records each end derives its next key: the bytes still arrive, and a record
    sealed under the old key after the move fails."""
    monkeypatch.setattr(tls, "_REKEY", 3)
    client, server = _secured_pair(tls.make())
    try:
        data = bytes(range(256)) * 40
        for i in range(10):  # 10 records: three moves
            client.sendall(data[i:])
            assert _read_exactly(server, len(data) - i) == data[i:]
        stale = tls._Key(tls._aead(), client._bulk._tx._key)  # the key in use, as at the start
        client._bulk._tx = stale  # its count restarts: nonce 0 under the current key
        client.sendall(b"late")
        with pytest.raises(ssl.SSLError, match="failed its check"):
            server.recv(4)
    finally:
        client.close()
        server.close()
