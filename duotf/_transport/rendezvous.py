"""The authenticated channel between the driver and its nodes.

A connection first authenticates at the server's gate (:mod:`duotf._transport.gate`)::

    server -> client:  b"DUOTF2" + 16-byte random nonce
    client -> server:  HMAC-SHA256(secret, b"duotf-rendezvous" | nonce)    (32 bytes)
    server -> client:  b"OK" (or b"NO", and the connection is closed)

Until then the server reads nothing else from it, gives it a few seconds, and holds only a
bounded number of such connections (see :mod:`duotf._transport.gate`). Then frames, both directions::

    frame:  4-byte big-endian body length | 32-byte HMAC-SHA256 | body (UTF-8 JSON object)

The MAC covers ``nonce | direction | sequence number | body`` under a random per-job secret, so a
frame cannot be forged without the secret, replayed into another connection, reordered, or sent
back the other way. Bodies are JSON: nothing received on a socket is ever unpickled. A frame
that fails its check, or whose ``"type"`` is not a :class:`Msg`, closes the connection.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
import logging
import random
import secrets
import socket
import struct
import threading
import time
from typing import Callable, Dict, Optional, Tuple

from duotf._deadline import Deadline
from duotf._transport import gate
from duotf._transport import tls as tls_
from duotf._transport.ports import PortRange, create_server
logger = logging.getLogger(__name__)


class Msg(str, enum.Enum):
    """The rendezvous message types (a message's ``"type"``). A frame of any other type is a
    protocol error: the connection is closed and the refusal logged."""

    # node agent -> driver
    REGISTER = "register"
    HEARTBEAT = "heartbeat"
    READY = "ready"
    RUNNING = "running"
    SERVING = "serving"
    RETURNED = "returned"
    DONE = "done"
    STOPPED = "stopped"
    FAILED = "failed"
    FEED_TERMINATED = "feed_terminated"
    FEED_FAILED = "feed_failed"  # a training range broke after delivering rows (see FeedServer)
    LOG = "log"  # {"lines": [...], "dropped": n}: the node's output (see duotf._node.output)
    TENSORBOARD = "tensorboard"  # {"port": n} once its TensorBoard serves, or {"error": why}
    REPORT = "report"  # {"reports": [[step, time, {name: number}], ...], "dropped": n}: ctx.report
    CHECKPOINT = "checkpoint"  # {"epoch": n, "path": p}: ctx.report_checkpoint (restarts resume there)
    # driver -> node agent
    START = "start"
    RELEASE = "release"
    STOP = "stop"
    REJECT = "reject"

    def __str__(self) -> str:  # the value, as on the wire, in messages and logs
        return self.value


_MAGIC = b"DUOTF2"
_DOMAIN = b"duotf-rendezvous"
_MAC_LEN = 32
_HEADER = struct.Struct(">I")
MAX_FRAME = 16 * 1024 * 1024  # an authenticated peer's message; nothing is read before that


def new_secret() -> bytes:
    return secrets.token_bytes(32)


class AuthenticationError(ConnectionError):
    """A frame failed its HMAC check, or the peer did not speak the protocol."""


class ProtocolError(AuthenticationError):
    """An authenticated frame carries a message type that is not a :class:`Msg`."""


class Channel:
    """One authenticated, framed, bidirectional connection. ``send`` is thread-safe."""

    def __init__(self, sock: socket.socket, secret: bytes, nonce: bytes, is_server: bool):
        self.sock = sock
        self._secret = secret
        self._nonce = nonce
        self._send_dir, self._recv_dir = (b"S", b"C") if is_server else (b"C", b"S")
        self._send_seq = 0
        self._recv_seq = 0
        self._send_lock = threading.Lock()
        self._closed = False

    def _mac(self, direction: bytes, seq: int, body: bytes) -> bytes:
        msg = self._nonce + direction + seq.to_bytes(8, "big") + body
        return hmac.new(self._secret, msg, hashlib.sha256).digest()

    def send(self, message: dict) -> None:
        body = json.dumps(message, separators=(",", ":")).encode()
        if len(body) > MAX_FRAME:
            raise ValueError(f"rendezvous message of {len(body)} bytes exceeds {MAX_FRAME}")
        with self._send_lock:
            mac = self._mac(self._send_dir, self._send_seq, body)
            self._send_seq += 1
            self.sock.sendall(_HEADER.pack(len(body)) + mac + body)

    def recv(self) -> dict:
        """Block for the next message. Raises ``ConnectionError`` (EOF) or ``AuthenticationError``."""
        header = _recv_exact(self.sock, _HEADER.size + _MAC_LEN)
        (length,) = _HEADER.unpack(header[: _HEADER.size])
        if length > MAX_FRAME:
            raise AuthenticationError(f"frame of {length} bytes announced; limit is {MAX_FRAME}")
        body = _recv_exact(self.sock, length)
        expected = self._mac(self._recv_dir, self._recv_seq, body)
        if not hmac.compare_digest(expected, header[_HEADER.size :]):
            raise AuthenticationError("rendezvous frame failed its HMAC check (wrong job secret?)")
        self._recv_seq += 1
        try:
            message = json.loads(body)
        except ValueError as exc:  # includes UnicodeDecodeError
            raise AuthenticationError(f"rendezvous frame is not JSON: {exc}") from None
        if not isinstance(message, dict) or "type" not in message:
            raise AuthenticationError("rendezvous frame is not a duotf message")
        try:
            Msg(message["type"])
        except ValueError:
            raise ProtocolError(f"unknown rendezvous message type {message['type']!r}") from None
        return message

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("rendezvous connection closed")
        buf += chunk
    return bytes(buf)


def connect(
    address: Tuple[str, int], secret: bytes, timeout: float = 30.0,
    tls: Optional[tls_.Material] = None,
) -> Channel:
    """Connect to a rendezvous server and authenticate (then encrypt, where the job has
    ``tls``), retrying with jittered backoff until ``timeout`` (a server that closes the
    connection during the handshake, crowded by other connections, is tried again; one that
    refuses the secret is not)."""
    deadline = Deadline.after(timeout)
    delay = 0.05
    last_exc: Optional[BaseException] = None
    while True:
        sock = None
        try:
            remaining = max(deadline.remaining or 0.0, 0.1)  # (a bounded deadline: never None)
            sock = socket.create_connection(address, timeout=min(remaining, 10.0))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                sock, nonce = gate.open_client(sock, secret, _MAGIC, _DOMAIN, tls)
            except gate.Refused as exc:
                raise AuthenticationError(
                    f"{address[0]}:{address[1]} is not this job's duotf rendezvous server: {exc}"
                ) from None
            sock.settimeout(None)
            return Channel(sock, secret, nonce, is_server=False)
        except AuthenticationError:
            if sock is not None:
                sock.close()
            raise
        except OSError as exc:
            if sock is not None:
                sock.close()
            last_exc = exc
            if (deadline.remaining or 0.0) < delay:  # no time left for another try
                raise ConnectionError(
                    f"could not reach the duotf driver at {address[0]}:{address[1]} within "
                    f"{timeout:.0f} s; is the driver host reachable from the executors "
                    f"(set driver_host=...)?"
                ) from last_exc
            logger.debug("rendezvous connect to %s failed (%s); retrying", address, exc)
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 1.0)


class RendezvousServer:
    """A threaded server that hands every authenticated message to ``on_message``.

    Connections authenticate at a :class:`duotf._transport.gate.Gate` (one thread for all of them, a
    deadline and a bounded number at once; refusals logged as counts); each authenticated one
    gets a reader thread. A message of an unknown type (:class:`ProtocolError`), like one that
    fails its check, is never handed on: it closes its connection with a warning, and
    ``on_close`` is told why. A connection that never authenticated is no peer: ``on_close``
    is not called for it.

    ``on_message(peer, message)`` and ``on_close(peer, exc)`` run on the connection's reader
    thread; ``peer`` is the :class:`Channel`, stable for the connection's life.
    ``handshake_timeout`` and ``max_pending`` default to the gate's.
    """

    def __init__(
        self,
        secret: bytes,
        on_message: Callable[[Channel, dict], None],
        on_close: Callable[[Channel, Optional[BaseException]], None],
        host: str = "127.0.0.1",
        bind_host: Optional[str] = None,
        *,
        handshake_timeout: Optional[float] = None,
        max_pending: Optional[int] = None,
        ports: Optional[PortRange] = None,
        tls: Optional[tls_.Material] = None,
    ):
        self._secret = secret
        self._tls = tls
        self._on_message = on_message
        self._on_close = on_close
        # on a port of ``ports``, else of DUOTF_PORTS, else the kernel's pick
        listener = create_server(bind_host or host, backlog=1024, what="the rendezvous server",
                                 ports=ports)
        self.address: Tuple[str, int] = (host, listener.getsockname()[1])
        self._peers: Dict[int, Channel] = {}
        self._threads: list = []
        self._lock = threading.Lock()
        self._closing = False
        self.gate = gate.Gate(
            listener, secret, _MAGIC, _DOMAIN, self._admit,
            what=f"the rendezvous server at {host}:{self.address[1]}", name="duotf-rendezvous-gate",
            handshake_timeout=handshake_timeout, max_pending=max_pending,
        )

    def _admit(self, sock: socket.socket, nonce: bytes) -> None:
        peer = Channel(sock, self._secret, nonce, is_server=True)
        thread = threading.Thread(
            target=self._serve, args=(peer,), name="duotf-rendezvous-conn", daemon=True
        )
        with self._lock:
            if self._closing:
                peer.close()
                return
            self._peers[id(peer)] = peer
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
            thread.start()  # under the lock: close() joins only started threads

    def _serve(self, peer: Channel) -> None:
        exc: Optional[BaseException] = None
        try:
            try:
                peer.sock = tls_.secure(peer.sock, self._tls, server_side=True)
            except OSError as err:  # ssl.SSLError is one: no peer yet, on_close is not told
                logger.warning("closing rendezvous connection: its TLS handshake failed (%s)", err)
                with self._lock:
                    self._peers.pop(id(peer), None)
                peer.close()
                return
            while True:
                message = peer.recv()
                self._on_message(peer, message)
        except AuthenticationError as err:
            logger.warning("closing rendezvous connection: %s", err)
            exc = err
        except (ConnectionError, OSError) as err:
            exc = err
        finally:
            with self._lock:
                self._peers.pop(id(peer), None)
            peer.close()
            if not self._closing:
                self._on_close(peer, exc)

    def stop_accepting(self) -> None:
        """Close the listening port (every later connection is refused); the connections
        already made stay open. Idempotent."""
        self.gate.close()

    def close(self) -> None:
        """Stop accepting, close every connection and join the server's threads."""
        if self._closing:
            return
        with self._lock:
            self._closing = True
        self.gate.close()
        with self._lock:
            peers = list(self._peers.values())
            threads = list(self._threads)
        for peer in peers:
            peer.close()
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(5)
