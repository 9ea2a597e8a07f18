"""Separate hosts on this one machine, for tests: Linux network namespaces (root only).

:func:`client_namespace` makes a namespace with nothing but its own loopback, and lets it open
connections to one port of this machine's loopback and to nothing else: a forwarder pair joins a
TCP port inside the namespace to the outside through a Unix socket (namespaces share the file
system). A process run in it (:func:`in_namespace`) is a client on a network of its own: it
reaches the server's port, and no process outside can open a connection to it, which is a
laptop's view of a managed cluster's Spark Connect server.

Run as a script, this module is the forwarder::

    python tests/hosts.py unix-to-tcp PATH HOST PORT    # outside: PATH -> HOST:PORT
    python tests/hosts.py tcp-to-unix HOST PORT PATH    # inside: HOST:PORT -> PATH
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from typing import Iterator, List, Optional

HERE = os.path.abspath(__file__)


def unavailable() -> Optional[str]:
    """Why network namespaces cannot be made here (None: they can)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    name = f"duotf-probe-{uuid.uuid4().hex[:8]}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, timeout=30)
    if made.returncode:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def in_namespace(name: str, argv: List[str]) -> List[str]:
    """``argv`` run inside namespace ``name``."""
    return ["ip", "netns", "exec", name, *argv]


def _started(argv: List[str]) -> subprocess.Popen:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise RuntimeError(f"forwarder did not start: {line}{proc.stderr.read()}")
    return proc


@contextlib.contextmanager
def client_namespace(server_port: int, port_inside: int = 15002) -> Iterator[str]:
    """A namespace whose ``127.0.0.1:port_inside`` reaches this machine's
    ``127.0.0.1:server_port``, and nothing else reaches or is reached; yields its name.
    Removed, with its forwarders, on the way out."""
    name = f"duotf-client-{uuid.uuid4().hex[:8]}"
    folder = tempfile.mkdtemp(prefix="duotf-hosts-")
    path = os.path.join(folder, "server.sock")
    procs: List[subprocess.Popen] = []
    _ip("netns", "add", name)
    try:
        _ip("-n", name, "link", "set", "lo", "up")
        procs.append(_started([sys.executable, HERE, "unix-to-tcp", path, "127.0.0.1", str(server_port)]))
        procs.append(_started(in_namespace(name, [sys.executable, HERE, "tcp-to-unix", "127.0.0.1",
                                                  str(port_inside), path])))
        yield name
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        shutil.rmtree(folder, ignore_errors=True)


# -- the forwarder -------------------------------------------------------------------------------
def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            chunk = src.recv(1 << 16)
            if not chunk:
                break
            dst.sendall(chunk)
    except OSError:
        pass
    for sock in (src, dst):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _serve(listener: socket.socket, connect) -> None:
    print("ready", flush=True)
    while True:
        inbound, _ = listener.accept()
        try:
            outbound = connect()
        except OSError:
            inbound.close()
            continue
        for a, b in ((inbound, outbound), (outbound, inbound)):
            threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def main(argv: List[str]) -> None:
    mode = argv[0]
    if mode == "unix-to-tcp":
        path, host, port = argv[1], argv[2], int(argv[3])
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(64)
        _serve(listener, lambda: socket.create_connection((host, port)))
    elif mode == "tcp-to-unix":
        host, port, path = argv[1], int(argv[2]), argv[3]

        def connect():
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)
            return sock

        _serve(socket.create_server((host, port)), connect)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
