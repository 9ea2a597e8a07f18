"""The warm node server (:mod:`duotf._node.warm` is the agent's side and says what it is for):
``python -m duotf._node.warm_server LISTENER_FD OWNER_PID``, started by an agent with the
listening socket it bound. It imports what a node imports before ``main`` on a thread of low
priority, forks a node for each agent that asks once the import is done (holding the requests
that come while it runs, which then runs at the usual priority), tells each agent its node's
exit status, and exits once its owner is gone or it was idle ``DUOTF_WARM_IDLE`` seconds, and
its last node has ended.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import socket
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence

from duotf._node import warm

def _proc_stat_fields() -> List[str]:
    with open("/proc/self/stat") as f:
        text = f.read()
    return text[text.rindex(")") + 2:].split()  # from field 3 (state) on


def _region(first: int) -> tuple:
    """The start and end address of this process's argument (``first=48``) or environment
    (``first=50``) block, from /proc/self/stat."""
    fields = _proc_stat_fields()
    return int(fields[first - 3]), int(fields[first - 2])


def _retitle(first: int, items: Sequence[str]) -> bool:
    """Write ``items`` NUL-separated over this process's argument or environment block, which
    /proc/PID/cmdline and /proc/PID/environ show (nothing in the process reads it after start:
    Python keeps its own copies, and libc's environment points elsewhere once os.environ was
    replaced). False, and nothing written, when they do not fit."""
    start, end = _region(first)
    data = b"".join(item.encode() + b"\0" for item in items)
    if len(data) > end - start:
        return False
    ctypes.memmove(start, data + b"\0" * (end - start - len(data)), end - start)
    return True


def _set_comm(name: bytes) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, ctypes.c_char_p(name), 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


class _Server:
    def __init__(self, listener_fd: int, owner: int):
        self.listener: Optional[socket.socket] = socket.socket(fileno=listener_fd)
        self.owner = owner
        self.children: Dict[int, socket.socket] = {}  # pid -> the agent's connection
        self.imported: Optional[bytes] = None  # what the import printed, once it is done
        self.started = time.monotonic()
        self.last_request = self.started
        self.idle = float(os.environ.get(warm.IDLE, "900"))
        self.wakeup = (-1, -1)
        #: fork requests that came while the import ran: (connection, fds, request, deadline)
        self.pending: List[tuple] = []
        self._hurried = False
        self._importer_tid: Optional[int] = None
        self.cwd = os.getcwd()
        self._capture = -1
        self._saved = (-1, -1)
        self._importer: Optional[threading.Thread] = None

    def start_import(self) -> None:
        """Import what a node imports before main, on a thread of low priority (the nodes
        running now come first), its output kept to replay in each node."""
        from duotf._transport import malloc

        malloc.tune()
        self._capture = os.memfd_create("duotf-warm-import")
        self._saved = os.dup(1), os.dup(2)
        os.dup2(self._capture, 1)
        os.dup2(self._capture, 2)
        self._importer = threading.Thread(target=self._import, name="duotf-warm-import",
                                          daemon=True)
        self._importer.start()

    def _import(self) -> None:
        self._importer_tid = threading.get_native_id()
        try:
            _import_node_modules(lambda: self._hurried)
        finally:
            try:  # the loop forks the nodes that wait at once
                os.write(self.wakeup[1], b"i")
            except OSError:
                pass

    def _hurry(self) -> None:
        """A node waits for the import now: back to the usual priority (where this user may
        raise it: an unprivileged user can always reset its session's autogroup)."""
        if self._hurried:
            return
        self._hurried = True
        if self._importer_tid is not None:
            try:
                os.setpriority(os.PRIO_PROCESS, self._importer_tid, 0)
            except OSError:
                pass
        _set_autogroup_nice(0)

    def _imported_yet(self) -> bool:
        if self.imported is not None:
            return True
        assert self._importer is not None  # start_import runs first
        if self._importer.is_alive():
            return False
        self._importer.join()
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self._saved[0], 1)
        os.dup2(self._saved[1], 2)
        os.close(self._saved[0])
        os.close(self._saved[1])
        os.lseek(self._capture, 0, os.SEEK_SET)
        chunks = []
        while True:
            chunk = os.read(self._capture, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(self._capture)
        self.imported = b"".join(chunks)
        return True

    def serve(self) -> None:
        # whether a forked node can show its own tags in /proc (else no node is forked here)
        start, end = _region(50)
        if end - start < warm.ROOM_BYTES or os.environ.get(warm.ROOM) is None:
            return
        try:
            owner: Optional[int] = os.pidfd_open(self.owner)
        except OSError:  # its engine worker is gone already
            return
        # a node's exit, and the import's end, wake the loop at once: an agent hears its
        # node's status, and a node waiting for the import is forked, without delay
        self.wakeup = os.pipe()
        os.set_blocking(self.wakeup[0], False)
        os.set_blocking(self.wakeup[1], False)
        signal.set_wakeup_fd(self.wakeup[1])
        self.start_import()
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        while True:
            self._reap()
            if self.listener is None and not self.children:
                return
            if (self.listener is not None and not self.children
                    and time.monotonic() - self.last_request > self.idle):
                self._stop_listening()
                continue
            waiting = [self.wakeup[0]] + ([owner] if owner is not None else []) \
                + ([self.listener] if self.listener is not None else [])
            ready = select.select(waiting, [], [], 0.2 if self.imported is None else 1.0)[0]
            if self.pending:
                self._serve_pending()
            if self.wakeup[0] in ready:
                try:
                    os.read(self.wakeup[0], 4096)
                except BlockingIOError:
                    pass
            if owner is not None and owner in ready:
                # its engine worker is gone: no new node; it stays until its nodes end (they
                # are supervised by their agents)
                self._stop_listening()
                os.close(owner)
                owner = None
                if self.imported is None:  # nothing to wait for: no node was forked yet
                    os._exit(0)
            if self.listener is not None and self.listener in ready:
                conn, _ = self.listener.accept()
                self._request(conn)

    def _stop_listening(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                try:
                    conn.send(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode())
                except OSError:
                    pass
                conn.close()

    def _request(self, conn: socket.socket) -> None:
        fds: List[int] = []
        try:
            if warm.peer_uid(conn) != os.getuid():
                conn.close()
                return
            conn.settimeout(5)
            message, fds, _, _ = socket.recv_fds(conn, 1 << 20, warm.MAX_FDS)
            request = json.loads(message)
            op = request.get("op")
            if op == "ping":
                idle = 0.0 if self.children else time.monotonic() - self.last_request
                conn.send(json.dumps({"idle": idle, "nodes": len(self.children),
                                      "owner": self.owner,
                                      "imported": self._imported_yet()}).encode())
                conn.close()
                return
            if op == "quit":  # another server needs the room: no new node here (one still
                # importing ends at once: it forked none)
                conn.send(b"{}")
                conn.close()
                self._stop_listening()
                for waiting, waiting_fds, _, _ in self.pending:  # their agents spawn them
                    self._refuse(waiting, waiting_fds)
                self.pending = []
                return
            if not self._imported_yet():
                self._hurry()
                self.pending.append((conn, fds, request, time.monotonic() + warm.HOLD))
                fds = []  # kept for the fork
                return
            self._fork(conn, fds, request)
            fds = []  # closed by _fork
        except (OSError, ValueError) as exc:
            _answer_error(conn, exc)
        finally:
            _close_all(fds)

    def _fork(self, conn: socket.socket, fds: List[int], request: dict) -> None:
        """Fork the node of ``request`` and tell its agent the pid; ``fds`` are closed here."""
        try:
            self.last_request = time.monotonic()
            pid = os.fork()
            if pid == 0:
                self._node(conn, fds, request)  # never returns
            self.children[pid] = conn
            conn.settimeout(None)
            conn.send(json.dumps({"pid": pid}).encode())
        except OSError as exc:
            _answer_error(conn, exc)
        finally:
            _close_all(fds)

    def _refuse(self, conn: socket.socket, fds: List[int]) -> None:
        """Tell the agent to spawn its node itself (no fork here)."""
        try:
            conn.send(json.dumps({"importing": time.monotonic() - self.started}).encode())
        except OSError:
            pass
        conn.close()
        _close_all(fds)

    def _serve_pending(self) -> None:
        """Fork the nodes that waited for the import once it ended; refuse those that waited
        ``warm.HOLD`` seconds."""
        imported = self._imported_yet()
        now = time.monotonic()
        for entry in list(self.pending):  # the others stay listed: a forked node closes them
            conn, fds, request, deadline = entry
            if imported or now >= deadline:
                self.pending.remove(entry)
                if imported and self.listener is not None:
                    self._fork(conn, fds, request)
                else:
                    self._refuse(conn, fds)

    def _node(self, conn: socket.socket, fds: List[int], request: dict) -> None:
        """In the forked process: become the node the agent asked for, run it, exit."""
        code = 70  # EX_SOFTWARE: the node could not be set up
        try:
            os.setsid()
            _die_with_parent()
            for sock in (self.listener, conn):
                if sock is not None:
                    sock.close()
            # nothing of the other nodes' agents: their connections, and the pipes of those
            # still waiting for the import (a copy held here would keep their ends open)
            for other in self.children.values():
                other.close()
            for waiting, waiting_fds, _, _ in self.pending:
                if waiting is not conn:
                    waiting.close()
                    for fd in waiting_fds:
                        if fd not in fds:
                            os.close(fd)
            signal.set_wakeup_fd(-1)
            for fd in self.wakeup:
                os.close(fd)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGPIPE):
                signal.signal(sig, signal.SIG_DFL if sig != signal.SIGPIPE else signal.SIG_IGN)
            rx, tx, _port, out, err = fds
            os.dup2(out, 1)
            os.dup2(err, 2)
            for fd in (out, err):
                if fd > 2:
                    os.close(fd)
            env = request["env"]
            # the module path a node spawned there would have: its folder, its PYTHONPATH,
            # then the interpreter's own folders (this server's path less its folder and its
            # PYTHONPATH)
            own = {self.cwd, *os.environ.get("PYTHONPATH", "").split(os.pathsep)}
            interpreter = [p for p in sys.path if p and p not in own]
            os.environ.clear()
            os.environ.update(env)
            os.chdir(request["cwd"])
            first = [request["cwd"]] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
            sys.path[:] = first + [p for p in interpreter if p not in first]
            import importlib
            import tempfile

            importlib.invalidate_caches()
            tempfile.tempdir = None  # found again from the node's TMPDIR
            _retitle(48, [sys.executable, "-m", "duotf._node.child", str(rx), str(tx)])
            _retitle(50, [f"{k}={v}" for k, v in env.items()])
            _set_comm(os.path.basename(sys.executable).encode()[:15])
            _reseed()
            if self.imported:
                os.write(2, self.imported)
            from duotf._node import child

            code = child.run(["duotf._node.child", str(rx), str(tx)])
        except BaseException:
            try:
                import traceback

                os.write(2, traceback.format_exc().encode(errors="replace"))
            except BaseException:
                pass
        os._exit(code)


def _answer_error(conn: socket.socket, exc: Exception) -> None:
    """Tell the agent what went wrong (it spawns its node itself) and let the connection go."""
    try:
        conn.send(json.dumps({"error": str(exc)}).encode())
    except OSError:
        pass
    conn.close()


def _close_all(fds: List[int]) -> None:
    for fd in fds:
        os.close(fd)


def _set_autogroup_nice(nice: int) -> None:
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(nice))
    except OSError:
        pass


def _import_node_modules(hurried: Callable[[], bool]) -> None:
    """Import what a node imports before main: at low priority (the nodes running now come
    first) until ``hurried()``, when a node waits for it."""
    if not hurried():
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except OSError:
            pass
        # Linux schedules each session as a group (autogroup) whose own priority is what
        # counts against the nodes' sessions: this server's is lowered too (the nodes it forks
        # start sessions of their own, at the usual priority)
        _set_autogroup_nice(10)
        if hurried():  # a node came in between: _hurry may have run before the lowering
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 0)
            except OSError:
                pass
            _set_autogroup_nice(0)
    import duotf._node.child  # noqa: F401 - what every node imports

    try:
        import tensorflow  # noqa: F401 - the point of it all
    except ImportError:
        pass


def _reseed() -> None:
    """What a new process seeds from the OS and a fork copies: numpy's global generator
    (Python's ``random`` reseeds itself after a fork)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def main(argv: Sequence[str]) -> None:
    _set_comm(b"duotf-warm")
    _Server(int(argv[1]), int(argv[2])).serve()


if __name__ == "__main__":
    main(sys.argv)
    os._exit(0)
