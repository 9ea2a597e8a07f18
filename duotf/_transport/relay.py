"""A relay for a driver that the engine's tasks cannot reach: the nodes connect to a hub in
the cluster, and the driver reaches the hub through the engine's own jobs.

A Spark Connect client (a laptop, a notebook outside the cluster's network) opens connections
to the Connect server, but executors often cannot open one back to it. The nodes' rendezvous
channel (:mod:`duotf._transport.rendezvous`) is the only connection that runs from a task to
the driver, so it alone is relayed, byte for byte::

    node agents --TCP--> hub (a process on an executor) <--TCP-- poll task (a 1-task engine job)
                                                                     ^ request / v response
    driver: Tunnel --local TCP--> the rendezvous server      (through the engine: gRPC)

* :class:`Hub` runs on an executor (``python -m duotf._transport.relay``, started by a
  one-task job, detached from it). It accepts the nodes' connections on one port and the poll
  tasks' on another; it ends when no poll has come for ``idle`` seconds, or when told to.
* :class:`Tunnel` runs in the driver. It calls ``exchange(request) -> response`` (the backend
  runs it as a short engine job whose task talks to the hub) over and over; for every
  connection the hub accepted it opens one to the rendezvous server, and copies bytes both ways.

The rendezvous channel is authenticated end to end (HMAC on every frame, under a secret the
hub never holds), so the hub forwards bytes it cannot read or forge. A poll authenticates with
a random token. Requests and responses are JSON (bytes in base64), never unpickled. Every byte
carries its stream offset and every response acknowledges what arrived, so a poll that fails,
or whose task the engine runs twice, neither loses nor repeats a byte.

What flows through it: registration and ``TF_CONFIG`` (START), heartbeats, node states and
failures, node output (LOG), metrics (REPORT), checkpoints, stop requests. What does not: node
results and feed outcomes (engine job results), the feed's rows (feeding tasks to nodes, inside
the cluster).
"""

from __future__ import annotations

import base64
import hmac
import json
import logging
import os
import socket
import struct
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Set, Tuple

from duotf._transport.ports import create_server

logger = logging.getLogger(__name__)

__all__ = ["Hub", "Tunnel", "exchange_with_hub", "HELLO"]

HELLO = "duotf-relay"  #: the first line a hub writes: ``duotf-relay <node port> <poll port> <pid>``
_LEN = struct.Struct(">I")
MAX_MESSAGE = 64 << 20
#: bytes from the nodes a response carries at most (the rest comes with the next poll)
RESPONSE_BYTES = 4 << 20
#: bytes the hub holds from one node before it stops reading it (until the driver acknowledges)
BUFFER_BYTES = 16 << 20
#: seconds a poll waits at the hub for something to carry back when it carries nothing out
LONG_POLL = 0.5
#: seconds the driver waits for the rendezvous server's answer to bytes it just handed it
ANSWER_WAIT = 0.02
MAX_CONNECTIONS = 1024


def _send(sock: socket.socket, obj: dict) -> None:
    body = json.dumps(obj).encode()
    sock.sendall(_LEN.pack(len(body)) + body)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise ConnectionError("the relay's peer closed the connection")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _recv(sock: socket.socket) -> dict:
    (length,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if length > MAX_MESSAGE:
        raise ConnectionError(f"a relay message of {length} bytes (at most {MAX_MESSAGE})")
    message = json.loads(_recv_exact(sock, length))
    if not isinstance(message, dict):
        raise ConnectionError("a relay message that is not a JSON object")
    return message


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _shut(sock: socket.socket) -> None:
    """Close ``sock`` so that its peer and a thread reading it both see the end (a plain
    ``close`` while another thread reads it sends nothing)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def _drain(sock: socket.socket, take: Callable[[bytes], None]) -> None:
    """Read ``sock`` to its end, handing ``take`` each chunk, and ``b""`` once at the end (or
    at an error, which ends it the same way)."""
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except OSError:
            chunk = b""
        take(chunk)
        if not chunk:
            return


def exchange_with_hub(address: Tuple[str, int], request: bytes, timeout: float) -> bytes:
    """One poll, as an engine task makes it: send ``request`` (JSON bytes, from
    :meth:`Tunnel`) to the hub at ``address``, return its response's JSON bytes."""
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(_LEN.pack(len(request)) + request)
        (length,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
        if length > MAX_MESSAGE:
            raise ConnectionError(f"a relay response of {length} bytes")
        return _recv_exact(sock, length)


# -- the hub: a process on an executor ---------------------------------------------------------
class _Pending:
    """The bytes read from one relayed connection that the other end has not acknowledged
    (``pending``, from stream offset ``base``); ``ended`` once it closed."""

    def __init__(self, ended: bool = False):
        self.pending = bytearray()
        self.base = 0  # the stream offset of pending[0]
        self.ended = ended

    def take(self, chunk: bytes) -> None:
        """What :func:`_drain` read (``b""``: the end); called under its owner's lock."""
        if chunk:
            self.pending += chunk
        else:
            self.ended = True


class _Stream(_Pending):
    """One node's connection at the hub (``ended``: the node closed its side, or it failed),
    and how much of the driver's bytes it was given."""

    def __init__(self, sock: socket.socket):
        super().__init__()
        self.sock = sock
        self.written = 0  # bytes of the driver's stream written to the node
        self.writing = threading.Lock()  # one poll's bytes at a time (an engine may run a poll twice)


class Hub:
    """The relay's end in the cluster (see the module docstring). ``host``: the address to
    listen on (one the nodes and the poll tasks reach); ``token``: what a poll must carry;
    ``idle``: seconds without a poll after which the hub closes everything and ends."""

    def __init__(self, host: str, token: str, idle: float):
        self.token = token
        self.idle = idle
        self.nodes = create_server(host, what="the relay's port for the nodes")  # DUOTF_PORTS
        self.polls = create_server(host, what="the relay's port for its polls")
        self.streams: Dict[int, _Stream] = {}
        self._next_id = 0
        self._cond = threading.Condition()
        self.last_poll = time.monotonic()
        self.stopped = False

    @property
    def ports(self) -> Tuple[int, int]:
        return self.nodes.getsockname()[1], self.polls.getsockname()[1]

    def serve(self) -> None:
        """Accept and relay until told to stop or idle for ``idle`` seconds; then close all."""
        for listener, serve in ((self.nodes, self._node), (self.polls, self._poll)):
            threading.Thread(target=self._accept, args=(listener, serve), daemon=True).start()
        with self._cond:
            while not self.stopped:
                left = self.last_poll + self.idle - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            self.stopped = True
            for stream in self.streams.values():
                _shut(stream.sock)
        for listener in (self.nodes, self.polls):
            listener.close()

    def _accept(self, listener: socket.socket, serve: Callable[[socket.socket], None]) -> None:
        """Hand every connection ``listener`` accepts to ``serve`` on a thread of its own."""
        while not self.stopped:
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(sock,), daemon=True).start()

    def _node(self, sock: socket.socket) -> None:
        with self._cond:
            if len(self.streams) >= MAX_CONNECTIONS:
                sock.close()
                return
            sid, self._next_id = self._next_id, self._next_id + 1
            stream = self.streams[sid] = _Stream(sock)
            self._cond.notify_all()
        self._read_node(stream)

    def _read_node(self, stream: _Stream) -> None:
        def take(chunk: bytes) -> None:
            with self._cond:
                stream.take(chunk)
                self._cond.notify_all()
                # back-pressure: the node is not read while the driver is behind
                while len(stream.pending) >= BUFFER_BYTES and not self.stopped:
                    self._cond.wait()

        _drain(stream.sock, take)

    def _poll(self, sock: socket.socket) -> None:
        request: dict = {}
        with sock:
            try:
                sock.settimeout(30)
                request = _recv(sock)
                if not hmac.compare_digest(str(request.get("token", "")), self.token):
                    return  # not the driver's: nothing to say to it
                with self._cond:
                    self.last_poll = time.monotonic()
                self._apply(request)
                _send(sock, self._collect(float(request.get("wait", 0))))
            except (OSError, ValueError, ConnectionError) as exc:
                logger.debug("relay poll failed: %s", exc)
            if request.get("stop"):
                with self._cond:
                    self.stopped = True
                    self._cond.notify_all()

    def _apply(self, request: dict) -> None:
        """The driver's bytes (each from its stream offset: a byte already written is not
        written again), its acknowledgements, and the connections it closed."""
        with self._cond:
            for key, offset in request.get("ack", {}).items():
                stream = self.streams.get(int(key))
                if stream is not None and offset > stream.base:
                    del stream.pending[:offset - stream.base]
                    stream.base = offset
            self._cond.notify_all()
        for key, (offset, data) in request.get("send", {}).items():
            stream = self.streams.get(int(key))
            data = base64.b64decode(data)
            if stream is None:
                continue
            with stream.writing:
                if offset > stream.written:
                    continue  # a gap (never sent by a tunnel): nothing can be written
                fresh = data[stream.written - offset:]
                try:
                    stream.sock.sendall(fresh)
                    stream.written += len(fresh)
                except OSError:
                    with self._cond:
                        stream.ended = True
        with self._cond:
            for key in request.get("close", []):
                stream = self.streams.pop(int(key), None)
                if stream is not None:
                    _shut(stream.sock)
            self._cond.notify_all()

    def _collect(self, wait: float) -> dict:
        """Wait up to ``wait`` seconds for something to carry back, then carry every stream's
        state: the bytes not yet acknowledged (from their offset), and how many were written."""
        deadline = time.monotonic() + wait
        with self._cond:
            while not self.stopped:
                if any(s.pending or s.ended for s in self.streams.values()):
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            budget, streams = RESPONSE_BYTES, {}
            for sid, stream in self.streams.items():
                part = bytes(stream.pending[:budget])
                budget -= len(part)
                done = stream.ended and len(part) == len(stream.pending)
                streams[str(sid)] = [stream.base, _b64(part), stream.written, done]
            return {"streams": streams}


def _serve(argv: List[str]) -> None:
    """``python -m duotf._transport.relay HOST IDLE`` (the token on stdin): start a hub, write
    its :data:`HELLO` line, detach (a process of its own session, its parent gone), serve."""
    host, idle = argv[0], float(argv[1])
    token = sys.stdin.readline().strip()
    hub = Hub(host, token, idle)
    pid = os.fork()
    if pid:
        print(HELLO, *hub.ports, pid, flush=True)
        os._exit(0)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    hub.serve()
    os._exit(0)


# -- the tunnel: the driver's end --------------------------------------------------------------
class _Local(_Pending):
    """One relayed connection at the driver: its socket to the rendezvous server (``ended``:
    its server side ended, and the hub is told to close the node's), and the bytes received."""

    def __init__(self, sock: Optional[socket.socket]):
        super().__init__(ended=sock is None)
        self.sock = sock
        self.received = 0


class Tunnel:
    """The driver's end of a relay (see the module docstring).

    Parameters
    ----------
    exchange:
        ``exchange(request bytes) -> response bytes``: one poll, run through the engine.
    target:
        The rendezvous server's address, which the tunnel connects to for every node.
    token:
        The hub's token.
    lost_after:
        Seconds without a completed poll after which the relay is lost: ``on_lost(why)`` is
        called once and the tunnel ends.
    """

    def __init__(self, exchange: Callable[[bytes], bytes], target: Tuple[str, int], token: str, *,
                 lost_after: float, on_lost: Callable[[str], None], where: str = "the hub"):
        self._exchange = exchange
        self._target = target
        self._token = token
        self._lost_after = lost_after
        self._on_lost = on_lost
        self.where = where
        self._locals: Dict[int, _Local] = {}
        self._gone: Set[int] = set()  # streams the hub no longer holds
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._last = time.monotonic()
        self.polls = 0
        self._thread = threading.Thread(target=self._run, name="duotf-relay", daemon=True)

    def start(self) -> "Tunnel":
        self._thread.start()
        return self

    def clock(self) -> float:
        """``time.monotonic()`` of the last completed poll: what the driver has heard from the
        nodes by then is all they said (the heartbeat watchdog measures silence up to it)."""
        return self._last

    def close(self, timeout: float = 10.0) -> None:
        """Close every relayed connection, tell the hub to end, stop polling."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)

    def _request(self, final: bool) -> bytes:
        with self._lock:
            send, ack, close = {}, {}, []
            for sid, local in self._locals.items():
                ack[str(sid)] = local.received
                if local.pending:
                    send[str(sid)] = [local.base, _b64(bytes(local.pending))]
                if (local.ended or final) and not local.pending:
                    close.append(sid)
            busy = bool(send or close)
        return json.dumps({"token": self._token, "send": send, "ack": ack, "close": close,
                           "wait": 0 if busy or final else LONG_POLL, "stop": final}).encode()

    def _run(self) -> None:
        while True:
            final = self._stop.is_set()
            try:
                response = json.loads(self._exchange(self._request(final)))
            except Exception as exc:  # noqa: BLE001 - a failed poll is retried until lost_after
                if final:
                    break
                silent = time.monotonic() - self._last
                if silent > self._lost_after:
                    self._close_locals()
                    self._on_lost(f"the relay at {self.where} answered no poll for {silent:.0f} s "
                                  f"(the last: {type(exc).__name__}: {exc})")
                    return
                logger.debug("duotf: relay poll failed (retrying): %s", exc)
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            self._last = time.monotonic()
            self.polls += 1
            if final:
                break
            if self._take(response.get("streams", {})):
                # bytes just handed to the rendezvous server: its answer usually follows within
                # milliseconds, and would otherwise wait out the next long poll
                self._wake.wait(ANSWER_WAIT)
            self._wake.clear()
        self._close_locals()

    def _take(self, streams: Dict[str, list]) -> bool:
        """Apply a response; whether it handed the rendezvous server any bytes."""
        held, wrote = set(), False
        for key, (base, data, written, done) in streams.items():
            sid = int(key)
            held.add(sid)
            with self._lock:
                local = self._locals.get(sid)
                if local is None:
                    if sid in self._gone:
                        continue
                    local = self._locals[sid] = _Local(self._connect())
                    if local.sock is not None:
                        threading.Thread(target=self._read_local, args=(sid, local), daemon=True,
                                         name="duotf-relay-local").start()
                if written > local.base:  # the hub wrote these to the node
                    del local.pending[:written - local.base]
                    local.base = written
            data = base64.b64decode(data)
            fresh = data[local.received - base:] if base <= local.received else b""
            if fresh and local.sock is not None and not local.ended:
                try:
                    local.sock.sendall(fresh)
                    wrote = True
                except OSError:
                    local.ended = True
            local.received += len(fresh)
            if done and local.received >= base + len(data):
                local.ended = True  # the node's side ended and every byte of it arrived
                self._shut(local)
        with self._lock:
            for sid in [s for s in self._locals if s not in held]:
                self._shut(self._locals.pop(sid))
                self._gone.add(sid)
        return wrote

    def _connect(self) -> Optional[socket.socket]:
        try:
            return socket.create_connection(self._target, timeout=10)
        except OSError as exc:
            logger.debug("duotf: relay could not reach the rendezvous server: %s", exc)
            return None

    def _read_local(self, sid: int, local: _Local) -> None:
        def take(chunk: bytes) -> None:
            with self._lock:
                local.take(chunk)
            self._wake.set()

        assert local.sock is not None
        local.sock.settimeout(None)
        _drain(local.sock, take)

    @staticmethod
    def _shut(local: _Local) -> None:
        if local.sock is not None:
            _shut(local.sock)

    def _close_locals(self) -> None:
        with self._lock:
            for local in self._locals.values():
                local.ended = True
                self._shut(local)


if __name__ == "__main__":
    _serve(sys.argv[1:])
