"""The door of duotf's servers: a connection proves it knows the job's secret before anything
else is read from it.

The driver's rendezvous server and every node's feed server listen on ports that anyone on the
network can reach; their real peers share a random per-job secret with them. A :class:`Gate`
accepts a server's connections on one thread with a selector and hands a connection on only
once it has authenticated::

    server -> client:  magic (6 bytes) | nonce (16 random bytes)
    client -> server:  HMAC-SHA256(secret, domain | nonce)          (HELLO_LEN = 32 bytes)
    server -> client:  b"OK", and the connection is handed on; or b"NO", and it is closed

Until then the server reads at most :data:`HELLO_LEN` bytes from a connection, gives it
:data:`HANDSHAKE_TIMEOUT` seconds in all (not per byte), and holds at most :data:`MAX_PENDING`
such connections (one past the limit closes the oldest). So any number of idle, slow, garbage
or oversized connections cost one thread and at most ``MAX_PENDING`` sockets of a few hundred
bytes each; only an authenticated connection gets a thread of its own and may send a large
message. Refused connections are counted, and the counts logged as one warning at most every
:data:`LOG_INTERVAL` seconds.
"""

from __future__ import annotations

import collections
import enum
import errno
import hashlib
import hmac
import logging
import os
import selectors
import socket
import ssl
import threading
import time
from typing import Callable, Optional, Tuple

from duotf._deadline import Deadline
from duotf._transport import tls as tls_

logger = logging.getLogger(__name__)

#: seconds a new connection has to authenticate, from its accept to its last hello byte
HANDSHAKE_TIMEOUT = 5.0
#: connections authenticating at once; one more closes the oldest of them
MAX_PENDING = 128
#: seconds between two warnings that count refused connections
LOG_INTERVAL = 30.0
#: the bytes a client sends before it is authenticated: its proof
HELLO_LEN = 32
NONCE_LEN = 16
ACCEPTED, DENIED = b"OK", b"NO"
_ACCEPT_BATCH = 256  # connections accepted per wakeup, so that pending ones are read meanwhile
_PAUSE = 0.1  # seconds accepting waits when the process is out of file descriptors


class Refused(ConnectionError):
    """The server refused this client's proof, or is not the kind of server expected."""


class Refusal(str, enum.Enum):
    """Why a connection was closed before it authenticated (the counts' labels in the log)."""

    FAILED = "failed authentication (wrong job secret?)"
    TIMED_OUT = "did not authenticate in time"
    CROWDED = "made room for newer ones (too many authenticating at once)"
    CLOSED = "closed before authenticating"
    #: connected and closed without a byte: a reachability check (duotf's own, before a Spark
    #: Connect client decides on a relay; a load balancer's), logged at DEBUG when alone
    PROBED = "closed without sending a byte (a reachability check)"

    def __str__(self) -> str:
        return self.value


def proof(secret: bytes, domain: bytes, nonce: bytes) -> bytes:
    """What a client sends to prove it knows ``secret`` (domain keeps the servers' proofs apart)."""
    return hmac.new(secret, domain + nonce, hashlib.sha256).digest()


def client_hello(sock: socket.socket, secret: bytes, magic: bytes, domain: bytes) -> bytes:
    """The client's end of the handshake on a connected blocking socket; returns the nonce.

    Raises :class:`Refused` where the server is not a ``magic`` server or refused the proof,
    and ``ConnectionError`` where it closed the connection before answering (it was out of
    room or time: worth another try)."""
    greeting = _recv_exact(sock, len(magic) + NONCE_LEN)
    if not greeting.startswith(magic):
        raise Refused("the server does not speak this protocol")
    nonce = greeting[len(magic):]
    sock.sendall(proof(secret, domain, nonce))
    if _recv_exact(sock, len(ACCEPTED)) != ACCEPTED:
        raise Refused("the server refused this job's secret")
    return nonce


def open_client(sock: socket.socket, secret: bytes, magic: bytes, domain: bytes,
                tls: Optional["tls_.Material"] = None) -> Tuple[socket.socket, bytes]:
    """:func:`client_hello`, then TLS on the connection where the job has ``tls``
    (:mod:`duotf._transport.tls`): ``(the socket to use, the nonce)``. A server whose
    certificate is not the job's is :class:`Refused`."""
    nonce = client_hello(sock, secret, magic, domain)
    try:
        return tls_.secure(sock, tls, server_side=False), nonce
    except ssl.SSLCertVerificationError as exc:
        raise Refused(f"its TLS certificate is not this job's ({exc.verify_message})") from None


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the server closed the connection during the handshake")
        buf += chunk
    return buf


class _Pending:
    """A connection that has not authenticated yet."""

    __slots__ = ("sock", "nonce", "deadline", "hello")

    def __init__(self, sock: socket.socket, nonce: bytes, deadline: Deadline):
        self.sock = sock
        self.nonce = nonce
        self.deadline = deadline
        self.hello = b""


class _RefusalLog:
    """Counts refusals; logs the counts at most every ``interval`` seconds (the first at once)."""

    def __init__(self, what: str, interval: float):
        self.what = what
        self.interval = interval
        self.counts: "collections.Counter" = collections.Counter()
        self.since = time.monotonic()
        self.next_at = self.since

    def note(self, reason: Refusal, now: float) -> None:
        self.counts[reason] += 1
        if now >= self.next_at:
            self.flush(now)

    def due(self) -> Optional[float]:
        return self.next_at if self.counts else None

    def flush(self, now: float) -> None:
        if self.counts:
            total = sum(self.counts.values())
            why = ", ".join(f"{n} {reason}" for reason, n in self.counts.most_common())
            level = logging.DEBUG if set(self.counts) == {Refusal.PROBED} else logging.WARNING
            logger.log(level, "duotf: refused %d connection(s) to %s in the last %.0f s: %s",
                       total, self.what, now - self.since, why)
            self.counts.clear()
        self.since = now
        self.next_at = now + self.interval


_LISTENER, _WAKE = "listener", "wake"


class Gate:
    """Accepts the connections of ``listener`` and authenticates them on one thread.

    ``on_admit(sock, nonce)`` is called on the gate's thread with each authenticated
    connection (blocking again, ``TCP_NODELAY`` set) and must return quickly: it hands the
    connection to a thread of its own. The gate owns ``listener`` and closes it in
    :meth:`close`. ``what`` names the server in the log.
    """

    def __init__(
        self,
        listener: socket.socket,
        secret: bytes,
        magic: bytes,
        domain: bytes,
        on_admit: Callable[[socket.socket, bytes], None],
        *,
        what: str,
        name: str,
        handshake_timeout: Optional[float] = None,
        max_pending: Optional[int] = None,
        log_interval: Optional[float] = None,
    ):
        self._listener = listener
        self._secret = secret
        self._magic = magic
        self._domain = domain
        self._on_admit = on_admit
        self.handshake_timeout = HANDSHAKE_TIMEOUT if handshake_timeout is None else handshake_timeout
        self.max_pending = MAX_PENDING if max_pending is None else max_pending
        if self.max_pending < 1 or self.handshake_timeout <= 0:
            listener.close()
            raise ValueError("max_pending must be at least 1 and handshake_timeout positive")
        self._log = _RefusalLog(what, LOG_INTERVAL if log_interval is None else log_interval)
        # in accept order, which is deadline order: the oldest is first to expire or make room
        self._pending: "collections.OrderedDict[int, _Pending]" = collections.OrderedDict()
        self._paused_until: Optional[float] = None
        self._closing = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        listener.setblocking(False)
        self._wake_r.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ, _LISTENER)
        self._selector.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """How many connections are authenticating now."""
        return len(self._pending)

    # -- the gate's thread ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._closing:
                ready = self._selector.select(self._timeout())
                # Proofs first, then new connections: a connection whose proof has arrived is
                # never pushed out by newer ones that were waiting beside it.
                accept = False
                for key, _ in ready:
                    if key.data is _LISTENER:
                        accept = True
                    elif key.data is _WAKE:
                        self._drain_wake()
                    elif self._pending.get(key.fd) is key.data:  # not one closed meanwhile
                        self._read(self._pending[key.fd])
                if accept:
                    self._accept()
                now = time.monotonic()
                self._expire(now)
                if self._paused_until is not None and now >= self._paused_until:
                    self._paused_until = None
                    self._selector.register(self._listener, selectors.EVENT_READ, _LISTENER)
                due = self._log.due()
                if due is not None and now >= due:
                    self._log.flush(now)
        except Exception:  # a bug: say so rather than leave the port silently unserved
            logger.exception("duotf: the connection gate of %s failed", self._log.what)
        finally:
            for pending in self._pending.values():
                pending.sock.close()
            self._pending.clear()
            self._selector.close()
            self._listener.close()
            self._wake_r.close()
            self._log.flush(time.monotonic())

    def _timeout(self) -> Optional[float]:
        wakeups = [self._log.due(), self._paused_until]
        if self._pending:
            wakeups.append(next(iter(self._pending.values())).deadline.expires_at)
        due = [w for w in wakeups if w is not None]
        return max(min(due) - time.monotonic(), 0.0) if due else None

    def _drain_wake(self) -> None:
        try:
            self._wake_r.recv(64)
        except OSError:
            pass

    def _accept(self) -> None:
        # No more than there is room for (at least one: when full, the oldest makes room), so
        # that a batch never pushes out connections of its own before their proofs are read:
        # a thousand nodes connecting at once would otherwise push each other out, and retry.
        for _ in range(max(1, min(_ACCEPT_BATCH, self.max_pending - len(self._pending)))):
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    raise
                if self._pending:  # the oldest pending connection makes room
                    self._refuse(next(iter(self._pending.values())), Refusal.CROWDED)
                else:  # try again shortly: the connection waits in the backlog meanwhile
                    logger.debug("duotf: %s is out of file descriptors (%s)", self._log.what, exc)
                    self._selector.unregister(self._listener)
                    self._paused_until = time.monotonic() + _PAUSE
                    return
                continue
            self._greet(sock)

    def _greet(self, sock: socket.socket) -> None:
        now = time.monotonic()
        if len(self._pending) >= self.max_pending:
            # The oldest makes room rather than the newest being turned away: a real peer
            # answers within a round trip, so only max_pending newer connections within that
            # round trip push it out, whereas turning new ones away would let max_pending idle
            # connections shut every real peer out for as long as they are let wait.
            self._refuse(next(iter(self._pending.values())), Refusal.CROWDED)
        nonce = os.urandom(NONCE_LEN)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            greeting = self._magic + nonce
            if sock.send(greeting) != len(greeting):  # a new socket's buffer takes 22 bytes
                raise ConnectionError("greeting not sent")
        except OSError:
            sock.close()
            self._log.note(Refusal.CLOSED, now)
            return
        pending = _Pending(sock, nonce, Deadline.after(self.handshake_timeout))
        self._pending[sock.fileno()] = pending
        self._selector.register(sock, selectors.EVENT_READ, pending)

    def _read(self, pending: _Pending) -> None:
        try:
            data = pending.sock.recv(HELLO_LEN - len(pending.hello))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._refuse(pending, Refusal.CLOSED if pending.hello else Refusal.PROBED)
            return
        pending.hello += data
        if len(pending.hello) < HELLO_LEN:
            return
        if not hmac.compare_digest(pending.hello, proof(self._secret, self._domain, pending.nonce)):
            self._refuse(pending, Refusal.FAILED, DENIED)
            return
        self._forget(pending)
        sock = pending.sock
        try:
            if sock.send(ACCEPTED) != len(ACCEPTED):
                raise ConnectionError("answer not sent")
            sock.setblocking(True)
        except OSError:
            sock.close()
            self._log.note(Refusal.CLOSED, time.monotonic())
            return
        try:
            self._on_admit(sock, pending.nonce)
        except Exception:  # e.g. no thread could be started: this connection only is lost
            logger.exception("duotf: %s could not take an authenticated connection", self._log.what)
            sock.close()

    def _expire(self, now: float) -> None:
        while self._pending:
            oldest = next(iter(self._pending.values()))
            expires_at = oldest.deadline.expires_at
            if expires_at is None or expires_at > now:  # (a pending connection's never is None)
                return
            self._refuse(oldest, Refusal.TIMED_OUT)

    def _forget(self, pending: _Pending) -> None:
        del self._pending[pending.sock.fileno()]
        self._selector.unregister(pending.sock)

    def _refuse(self, pending: _Pending, reason: Refusal, answer: bytes = b"") -> None:
        self._forget(pending)
        if answer:
            try:
                pending.sock.send(answer)  # best effort: it may not be read
            except OSError:
                pass
        pending.sock.close()
        self._log.note(reason, time.monotonic())

    # -- any thread -----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop accepting, close every pending connection and the listener, join the thread."""
        if self._closing:
            return
        self._closing = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is not threading.current_thread():
            self._thread.join(5)
        self._wake_w.close()
