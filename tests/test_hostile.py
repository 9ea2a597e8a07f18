"""Unauthenticated clients cannot exhaust a server: hundreds of idle, slow, oversized and garbage
connections against a real rendezvous server and a real feed server cost bounded memory, no
thread each, are dropped at the handshake deadline, are logged as counts, and do not keep a
real client from registering or feeding meanwhile."""

from __future__ import annotations

import logging
import os
import queue
import re
import socket
import struct
import time

import numpy as np
import psutil
import pytest

from duotf._driver.cluster import shutdown_quietly
from duotf._transport import gate
from duotf._transport import rendezvous
from duotf._transport import wire
from duotf._transport.server import FeedServer
from tests.engines import poll_for
from tests.conftest import SECRET

EACH = 200  # hostile connections of each kind
DEADLINE = 0.5  # the servers' handshake timeout in these tests (the default is gate's 5 s)
PENDING = 32  # connections authenticating at once (the default is gate's 128)
PUSH = 512 * 1024  # bytes an "oversized" connection tries to push after its length prefix
# What the flood may add to this process's RSS (both ends' sockets are here). Before the gate:
# +160 MiB for the rendezvous server (oversized frames buffered), +11 MiB for the feed server (a
# thread per connection); with it, under 1 MiB for either.
RSS_BOUND = 5 << 20


class Flood:
    """Hostile client connections, non-blocking, kept open until :meth:`close`."""

    def __init__(self, address, claim: bytes):
        self.socks = {kind: [] for kind in ("idle", "slow", "oversized", "garbage")}
        for _ in range(EACH):  # the kinds in turn: the last ones to wait are of every kind
            for kind, socks in self.socks.items():
                sock = socket.create_connection(address, timeout=10)
                sock.setblocking(False)
                socks.append(sock)
                if kind == "garbage":
                    sock.send(os.urandom(64))  # no MAC under the job's secret
        self.claim = memoryview(claim + bytes(PUSH))  # a huge length prefix, then its bytes
        self.pushed = {sock: 0 for sock in self.socks["oversized"]}
        self.dropped = set()

    def all(self):
        return [sock for socks in self.socks.values() for sock in socks]

    def pump(self) -> bool:
        """One round: a byte on each slow connection, what the kernel takes on each oversized
        one. True once every oversized connection pushed all its bytes or was cut off."""
        for sock in self.socks["slow"]:
            if sock not in self.dropped:
                try:
                    sock.send(b"\x01")
                except OSError:
                    self.dropped.add(sock)
        for sock, done in self.pushed.items():
            if sock in self.dropped or done == len(self.claim):
                continue
            try:
                self.pushed[sock] += sock.send(self.claim[done:])
            except BlockingIOError:
                pass
            except OSError:
                self.dropped.add(sock)
        return all(sock in self.dropped or done == len(self.claim) for sock, done in self.pushed.items())

    def open(self) -> list:
        """The connections the server has not closed yet (the greeting is read and passed over)."""
        for sock in self.all():
            while sock not in self.dropped:
                try:
                    if not sock.recv(4096):
                        self.dropped.add(sock)
                except BlockingIOError:
                    break
                except OSError:
                    self.dropped.add(sock)
        return [sock for sock in self.all() if sock not in self.dropped]

    def close(self) -> None:
        for sock in self.all():
            sock.close()


def _held(port: int) -> int:
    """The server side's connections on ``port`` (this process is both ends)."""
    return sum(1 for c in psutil.Process().net_connections(kind="tcp")
               if c.laddr and c.laddr.port == port and c.status != psutil.CONN_LISTEN)


class Rendezvous:
    claim = struct.pack(">I", rendezvous.MAX_FRAME) + bytes(32)  # a 16 MiB frame, its "MAC"

    def __init__(self):
        self.inbox: "queue.Queue" = queue.Queue()
        self.server = rendezvous.RendezvousServer(
            SECRET, lambda peer, msg: self.inbox.put(msg), lambda peer, exc: None,
            handshake_timeout=DEADLINE, max_pending=PENDING,
        )
        self.address = self.server.address
        self.client = None

    def real_client(self) -> None:
        """A node registers: connect, authenticate, send, the driver receives."""
        self.client = rendezvous.connect(self.address, SECRET, timeout=10)
        self.client.send({"type": "register", "node_id": 0})
        assert self.inbox.get(timeout=10) == {"type": "register", "node_id": 0}

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        self.server.close()


class Feed:
    claim = struct.pack(">I", wire.MAX_HEADER)  # a 1 MiB header

    def __init__(self):
        self.server = FeedServer(SECRET, handshake_timeout=DEADLINE, max_pending=PENDING)
        self.address = ("127.0.0.1", self.server.port)
        self.client = None

    def real_client(self) -> None:
        """A feeding task feeds: connect, authenticate, send a batch and its end, get the ack."""
        self.client = wire.connect(self.address, SECRET, 10)
        wire.send_frame(self.client, wire.Frame.BATCH, {"x": np.arange(5)})
        wire.send_frame(self.client, wire.Frame.END, mode="train", partition=0)
        assert wire.recv_frame(self.client)[0] == {"t": "ack", "rows": 5}
        assert self.server.queue.get(timeout=10)[1]["x"].tolist() == [0, 1, 2, 3, 4]

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        self.server.close()


def _refused(records) -> list:
    """The counts in the refusal warnings."""
    found = [re.search(r"refused (\d+) connection", r.getMessage()) for r in records]
    return [int(m.group(1)) for m in found if m]


@pytest.mark.parametrize("kind", [Rendezvous, Feed], ids=["rendezvous", "feed"])
def test_a_flood_of_hostile_connections_costs_bounded_resources(kind, caplog):
    caplog.set_level(logging.DEBUG, logger="duotf")
    me = psutil.Process()
    target = kind()
    threads, rss = me.num_threads(), me.memory_info().rss
    flood = None
    try:
        flood = Flood(target.address, kind.claim)
        poll_for(flood.pump, 30, interval=0.01, what="the oversized connections pushed or cut off")
        # A real peer is served while all of them are open ...
        target.real_client()
        # ... no thread per connection, bounded memory, at most PENDING of them held at once
        grown = me.memory_info().rss - rss
        assert me.num_threads() <= threads + 4, f"{me.num_threads() - threads} threads more"
        assert grown < RSS_BOUND, f"RSS grew by {grown / 2**20:.1f} MiB"
        assert _held(target.address[1]) <= PENDING + 1  # + the real client
        # every hostile one, slow ones sending a byte each round, is dropped at the deadline
        start = time.monotonic()
        poll_for(lambda: flood.pump() and not flood.open(), 10, what="every hostile connection dropped")
        assert time.monotonic() - start < DEADLINE + 5
        assert _held(target.address[1]) == 1  # the real client's
        target.real_client()  # and served again after
    finally:
        target.close()  # the gate logs the counts it has not logged yet
        if flood is not None:
            flood.close()
    lines = [r for r in caplog.records if r.name.startswith("duotf")]
    assert len(lines) <= 5, f"{len(lines)} log lines for {4 * EACH} refused connections"
    assert sum(_refused(lines)) == 4 * EACH  # every refusal counted, none logged on its own
    text = " ".join(r.getMessage() for r in lines)
    for reason in ("did not authenticate in time", "failed authentication", "made room for newer"):
        assert reason in text


def test_a_real_node_registers_while_the_gate_is_crowded():
    """A real peer that arrives while MAX_PENDING idle connections wait is not turned away: the
    oldest makes room for it."""
    target = Rendezvous()
    idle = []
    try:
        for _ in range(PENDING):
            idle.append(socket.create_connection(target.address, timeout=10))
        poll_for(lambda: target.server.gate.pending == PENDING, 10, what="every idle one pending")
        start = time.monotonic()
        target.real_client()
        assert time.monotonic() - start < DEADLINE  # not after the idle ones timed out
    finally:
        target.close()
        for sock in idle:
            sock.close()


def test_a_connection_closed_without_a_byte_is_a_reachability_check_logged_at_debug(caplog):
    """duotf's own check (can the executors reach a Connect client?) connects and closes: no
    warning for it; a connection closed halfway through its proof still warns."""
    def refused():
        return [r for r in caplog.records if "refused 1 connection" in r.getMessage()]

    caplog.set_level(logging.DEBUG, logger="duotf")
    for partial, level in ((b"", logging.DEBUG), (b"x" * 5, logging.WARNING)):
        caplog.clear()
        target = Rendezvous()
        try:
            with socket.create_connection(target.address, timeout=10) as sock:
                sock.sendall(partial)
            poll_for(refused, 10, what="the connection refused (the first refusal is told at once)")
        finally:
            target.close()
        [record] = refused()
        assert record.levelno == level, record.getMessage()


@pytest.mark.parametrize("kind", [Rendezvous, Feed], ids=["rendezvous", "feed"])
def test_a_client_cut_off_during_the_handshake_retries(kind, monkeypatch):
    """rendezvous.connect and wire.connect try again where the server closed the connection
    during the handshake (crowded out), and raise at once where the secret was refused."""
    target = kind()
    try:
        real = gate.client_hello
        calls = []

        def cut_off_once(*args):
            calls.append(1)
            if len(calls) == 1:
                raise ConnectionError("the server closed the connection during the handshake")
            return real(*args)

        monkeypatch.setattr(gate, "client_hello", cut_off_once)
        target.real_client()
        assert len(calls) == 2
        with pytest.raises(ConnectionError, match="refused this job's secret") as info:
            if kind is Rendezvous:
                rendezvous.connect(target.address, b"x" * 32, timeout=10)
            else:
                wire.connect(target.address, b"x" * 32, 10)
        assert isinstance(info.value, (rendezvous.AuthenticationError, wire.FeedProtocolError))
        assert len(calls) == 3  # not retried
    finally:
        target.close()


def _junk_connection(address) -> None:
    """A connection that sends bytes with no MAC under the job's secret, then hangs up."""
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(os.urandom(64))


def test_a_running_cluster_trains_every_row_through_a_flood_of_hostile_connections(caplog):
    """The driver's rendezvous port and a node's feed port, at their default gates (5 s to
    authenticate, 128 authenticating at once), flooded while ``cluster.train()`` runs on the
    local backend: hundreds of idle and junk connections held open before it starts, more junk
    ones while it runs. Every row arrives once an epoch, the servers hold no more than the gate
    admits, add no thread per connection, and count refusals in a few log lines."""
    import threading

    import duotf
    from tests.suite import mains

    caplog.set_level(logging.WARNING, logger="duotf")
    idle_each, junk_each, rows = 200, 100, 2000
    parts = [[(float(i), i) for i in range(p, rows, 4)] for p in range(4)]
    cluster = duotf.run(mains.feed_train_main, {"batch": 64}, "local", duotf.ClusterSpec(workers=1))
    held, stop, during = [], threading.Event(), []
    flooder = None
    try:
        node = cluster.nodes[0]
        ports = {"rendezvous": cluster.supervisor.server.address,
                 "feed": (node.host, node.feed_port)}
        child = psutil.Process(node.pid)
        me = psutil.Process()
        threads = {"rendezvous": me.num_threads(), "feed": child.num_threads()}
        for name, address in ports.items():
            for _ in range(idle_each):
                sock = socket.create_connection(address, timeout=10)
                sock.setblocking(False)
                held.append((name, sock))
            for _ in range(junk_each):
                _junk_connection(address)

        def flood():  # junk ones while train() runs: a connection every 5 ms, to each port in turn
            while not stop.wait(0.005) and len(during) < 400:
                name = ("rendezvous", "feed")[len(during) % 2]
                try:
                    _junk_connection(ports[name])
                    during.append(name)
                except OSError:
                    during.append(None)

        def still_open(name):
            """The held connections of ``name`` that the server has not closed."""
            count = 0
            for kind, sock in held:
                if kind != name or sock.fileno() < 0:
                    continue
                try:
                    while sock.recv(4096):  # the greeting, passed over
                        pass
                    sock.close()  # closed by the server
                except BlockingIOError:
                    count += 1
                except OSError:
                    sock.close()
            return count

        # the gates close the oldest idle ones past their 128, and add no thread for any
        for name in ports:
            poll_for(lambda: still_open(name) <= gate.MAX_PENDING, 10, what=f"{name}: at most 128 held")
        assert me.num_threads() <= threads["rendezvous"] + 2
        assert child.num_threads() <= threads["feed"] + 2
        flooder = threading.Thread(target=flood, name="test-flood")
        flooder.start()
        report = cluster.train(parts, epochs=2, feed_timeout=60)
        stop.set()
        flooder.join(10)
        results = cluster.wait(timeout=60)
    finally:
        stop.set()
        if flooder is not None:
            flooder.join(10)
        for _, sock in held:
            sock.close()
        shutdown_quietly(cluster)
    assert report["rows_fed"] == 2 * rows
    assert {e: sorted(ids) for e, ids in results[0]["ids"].items()} == {
        e: list(range(rows)) for e in range(results[0]["epochs"])}
    assert results[0]["epochs"] == 2
    assert during.count("rendezvous") > 0 and during.count("feed") > 0, during[:5]
    # refusals in the driver counted, in a few lines; the node's too (its stderr, in its log)
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert 1 <= len(lines) <= 5, lines
    assert sum(_refused(caplog.records)) >= junk_each + during.count("rendezvous")
    node_lines = [line for line in cluster.logs(0).splitlines() if "refused" in line]
    assert 1 <= len(node_lines) <= 5, node_lines
