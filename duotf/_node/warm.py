"""Warm node processes: a server per host and environment that has imported TensorFlow once and
forks a node process for each agent that asks, so that a run's ``main`` starts with TensorFlow
imported instead of paying its import (seconds of CPU) in every node of every run.

The nodes of the first jobs an agent's process runs in an environment are spawned as always
(``python -m duotf._node.child``); at the second job, the agent also starts the
server, ``python -m duotf._node.warm_server``, which imports what a node imports before ``main``
(duotf's node side and TensorFlow, nothing initialised: no device, no eager context, no thread
of TensorFlow's own) and then listens on an abstract Unix socket named after its environment. Every later node in that environment is forked
by the server: the agent sends the node's pipes, its port reservation and its output pipe
(``SCM_RIGHTS``) with its environment and working directory; the forked process takes them in
a session of its own, sets the environment, reseeds what a fresh process would seed, shows the
command line and environment of a cold node in ``/proc`` (so ``ps`` and duotf's own checks by
pid see a node with its job's tags), replays what TensorFlow printed on import into its own
output, and runs :func:`duotf._node.child.main` exactly as a spawned node does. The server waits
for it and tells the agent its exit status, so the agent supervises it as its own child.

Which nodes share a server: those whose environment agrees on every variable that importing
TensorFlow may read (``TF_CPP_MIN_LOG_LEVEL``, ``CUDA_VISIBLE_DEVICES``, ``PYTHON*`` and the
rest of ``IMPORT_PREFIXES``, less the Spark worker's own ``ENGINE_OWN``) and whose ``PYTHONPATH`` finds the same duotf, TensorFlow, Keras
and numpy, with the same Python, of the same user, in the same network namespace (a host);
every other variable is the node's own, set after the fork. A server exits once the process that started it (its engine
worker: a Spark executor's Python daemon, a Dask worker, the driver for the embedded backend)
is gone, or after ``DUOTF_WARM_IDLE`` seconds without a request (default 900), in both cases
once its last node has ended. ``DUOTF_WARM_NODES=0`` in the nodes' environment
(``duotf.run(env=...)``, or the executors') turns it off: every node is spawned.

Anything that goes wrong on the way to a warm node (no server yet, one still importing, a
refused or broken connection) leaves the agent to spawn the node as always: a node is never
lost to the warm path, only its head start.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence, Set

#: ``0`` turns warm nodes off, for the nodes of an environment that has it
SWITCH = "DUOTF_WARM_NODES"
#: seconds a server lives without a request (its nodes ended), default 900
IDLE = "DUOTF_WARM_IDLE"
#: the most servers of one engine worker, default 2 (each holds an imported TensorFlow: about
#: half a GB); starting one more ends its idle one unused longest
MAX = "DUOTF_WARM_MAX"
#: a node's own tags, never part of what picks its server
PER_NODE = ("DUOTF_NODE_ID", "DUOTF_JOB_ID")
#: the variables that may change what importing TensorFlow, Keras, numpy and duotf does (their
#: libraries, threads, devices, logging, Python's own start-up): a forked node shares its
#: server's import, so these must be the server's. Every other variable is the node's own, set
#: after the fork, as is its PYTHONPATH (the modules the server imported must resolve to the same
#: files: see _origins).
IMPORT_PREFIXES = ("TF_", "TF2_", "CUDA", "NVIDIA_", "XLA_", "KERAS_", "OMP_", "MKL_", "KMP_",
                   "OPENBLAS_", "GOTO", "BLIS_", "TPU_", "HIP_", "ROCM_", "PYTHON", "LD_", "MALLOC_",
                   "GLIBC_", "HDF5_", "LANG", "LC_", "HOME", "DUOTF_WARM_")
#: variables of the engine's own that match IMPORT_PREFIXES but that no import reads: those
#: Spark's JVM sets for its Python workers (a secret and a port per executor among them), so
#: that the nodes of two executors on one host share a server
ENGINE_OWN = ("PYTHON_WORKER_", "PYTHON_UDF_", "PYTHON_DAEMON_", "PYTHON_UNIX_DOMAIN_",
              "PYTHON_FAULTHANDLER_")
#: the modules a server imports, which a forked node must find where its own path would
IMPORTED = ("duotf", "tensorflow", "keras", "numpy")
#: room the server keeps in its environment block for a node's own tags (see _retitle)
ROOM = "DUOTF_WARM_ROOM"
ROOM_BYTES = 512
#: seconds an agent waits for the server's answer before it spawns the node itself
ANSWER_TIMEOUT = 30.0
#: seconds a server still importing holds a node's request (importing at the usual priority
#: from then on) before it tells the agent to spawn the node: less than ANSWER_TIMEOUT
HOLD = 20.0
#: the most fds one request carries: the node's two pipes, its port, its stdout and stderr
MAX_FDS = 5

#: the servers this process started (kept, so that they are reaped when they exit)
_servers: List[subprocess.Popen] = []
#: the jobs whose nodes this process spawned, by server name: a server starts at the second job
#: (a driver script that runs one job, or an executor that runs one, never pays for an import
#: that no node would use)
_spawned: Dict[str, Set[str]] = {}
#: a longer-lived process than this one that the servers should live as long as (set_owner)
_owner: Optional[int] = None


def available(env: Dict[str, str]) -> bool:
    """Whether a node with the environment ``env`` may be forked warm here."""
    return (sys.platform.startswith("linux") and hasattr(socket, "send_fds")
            and hasattr(os, "pidfd_open") and env.get(SWITCH, "1") != "0")


def set_owner(pid: int) -> None:
    """Tie the servers this process starts to ``pid`` (a longer-lived process of the same engine
    worker, such as the Spark Python daemon that forks the task's worker) instead of this one."""
    global _owner
    _owner = pid


def server_environment(env: Dict[str, str]) -> Dict[str, str]:
    """The environment of the server for nodes of ``env``: theirs without the node's own tags."""
    return {k: v for k, v in env.items() if k not in PER_NODE}


def _search_path(cwd: str, pythonpath: str) -> List[str]:
    """Where ``python -m`` started in ``cwd`` with ``PYTHONPATH=pythonpath`` looks for modules
    (this interpreter's own folders last)."""
    entries = [cwd] + [p for p in pythonpath.split(os.pathsep) if p]
    return entries + [p for p in sys.path if p and p not in entries]


def _origins(path: List[str]) -> List[Optional[str]]:
    from importlib.machinery import PathFinder

    found = []
    for name in IMPORTED:
        spec = PathFinder.find_spec(name, path)
        found.append(spec.origin if spec is not None else None)
    return found


def address(env: Dict[str, str], cwd: str) -> str:
    """The abstract socket name of the server for nodes of the environment ``env`` started in
    ``cwd``: the same for every node whose import would be the same."""
    same = sorted((k, v) for k, v in env.items()
                  if k.startswith(IMPORT_PREFIXES) and not k.startswith(ENGINE_OWN)
                  and k not in PER_NODE and k != "PYTHONPATH")
    origins = _origins(_search_path(cwd, env.get("PYTHONPATH", "")))
    key = hashlib.sha256(json.dumps([sys.executable, same, origins]).encode()).hexdigest()[:32]
    return f"\0{_PREFIX}{os.getuid()}-{key}"


_PREFIX = "duotf-warm-"


def _servers_here() -> List[str]:
    """The names of this user's servers listening on this host (its network namespace)."""
    mine = f"@{_PREFIX}{os.getuid()}-"
    names = set()
    try:
        with open("/proc/net/unix") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 8 and parts[7].startswith(mine):
                    names.add("\0" + parts[7][1:])
    except OSError:
        pass
    return sorted(names)


def _ask(name: str, op: str) -> Optional[dict]:
    """Send ``op`` ("ping", "quit") to the server ``name``; its answer, None when it gave none."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.settimeout(5)  # a server answers between two steps of its import: on a busy host, seconds
        sock.connect(name)
        if peer_uid(sock) != os.getuid():
            return None
        sock.send(json.dumps({"op": op}).encode())
        return json.loads(sock.recv(4096) or b"null")
    except (OSError, ValueError):
        return None
    finally:
        sock.close()


def _make_room(mine: str, owner: int) -> None:
    """Keep the servers of the engine worker ``owner`` to ``DUOTF_WARM_MAX``, ``mine``
    (starting) among them, ending its idle ones unused longest if need be."""
    most = max(1, int(os.environ.get(MAX, "2")))
    found = []
    for name in _servers_here():
        if name == mine:
            continue
        answer = _ask(name, "ping")
        if answer and answer.get("owner") == owner:
            found.append((answer.get("idle", 0.0), bool(answer.get("nodes")), name))
    if len(found) < most:
        return
    idle = sorted((seconds, name) for seconds, busy, name in found if not busy)
    for _, name in idle[::-1][:len(found) - most + 1]:
        _ask(name, "quit")


# -- the agent's side -----------------------------------------------------------------------------
class WarmProcess:
    """A node process forked by a server, seen as ``subprocess.Popen`` sees its child: ``pid``,
    ``poll()``, ``wait(timeout)`` and ``returncode`` (negative: the signal that ended it), from
    the status the server sends when it has waited for it."""

    def __init__(self, sock: socket.socket, pid: int):
        self._sock = sock
        self._lock = threading.Lock()
        self.pid = pid
        self.returncode: Optional[int] = None
        self.args = ["duotf._node.warm", str(pid)]

    def _read(self, timeout: Optional[float]) -> bool:
        """Whether the status came, waiting ``timeout`` seconds (None: until it does). Safe to
        call from several threads (the agent's loop and its stopper)."""
        if self.returncode is not None:
            return True
        try:
            ready = select.select([self._sock], [], [], timeout)[0]
        except (OSError, ValueError):  # closed by close(): the agent is done with it
            return self.returncode is not None
        with self._lock:
            if self.returncode is not None:
                return True
            if not ready:
                return False
            try:
                data = self._sock.recv(4096, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return False
            except OSError:
                data = b""
            if data:
                self.returncode = int(json.loads(data)["returncode"])
            else:
                # The server itself was killed: its nodes die with it (PR_SET_PDEATHSIG)
                self._wait_gone()
                self.returncode = -signal.SIGKILL
            return True

    def _wait_gone(self) -> None:
        while True:
            try:
                os.kill(self.pid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.05)

    def poll(self) -> Optional[int]:
        self._read(0)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if not self._read(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def close(self) -> None:
        """Let the connection go (the agent is done with this node)."""
        self._sock.close()


def peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def fork_node(env: Dict[str, str], fds: Sequence[int], log) -> Optional[WarmProcess]:
    """Ask the server for ``env`` to fork a node process that gets ``fds`` (its read pipe, write
    pipe, port reservation, stdout, stderr). None: spawn the node as always, as where none
    serves this environment (then one starts for the next nodes) or the server's import did
    not end within ``HOLD`` seconds of the request. A server still importing holds the request
    and imports at the usual priority from then on: the rest of one import, shared by the
    job's nodes, is less than the whole import each node spawned beside it would make (on 2
    busy cores, nodes spawned while a server imported at low priority each took 13-20 s to
    import TensorFlow, and the server, starved, never finished)."""
    if not available(env):
        return None
    cwd = os.getcwd()
    name = address(env, cwd)
    request = json.dumps({"env": env, "cwd": cwd}).encode()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(name)
    except OSError:
        sock.close()
        jobs = _spawned.setdefault(name, set())
        jobs.add(env.get("DUOTF_JOB_ID", ""))
        if len(jobs) >= 2:
            _start_server(env, name, log)
        return None
    try:
        if peer_uid(sock) != os.getuid():  # another user's socket of that name: never talk to it
            sock.close()
            return None
        sock.settimeout(ANSWER_TIMEOUT)
        socket.send_fds(sock, [request], list(fds))
        answer = json.loads(sock.recv(4096) or b"{}")
    except (OSError, ValueError) as exc:
        log.debug("warm node server %s: %s; spawning the node", name[1:], exc)
        sock.close()
        raise Abandoned() from exc
    if "pid" in answer:
        sock.settimeout(None)
        log.debug("node forked by the warm node server %s", name[1:])
        return WarmProcess(sock, int(answer["pid"]))
    sock.close()  # it forked nothing: the fds are the agent's alone
    log.debug("warm node server %s answered %s; spawning the node", name[1:], answer)
    return None


class Abandoned(Exception):
    """The request went out but no answer came back: its fds may live on in a late fork, so the
    agent spawns the node on new ones (the late fork then finds its pipes closed and exits)."""


def prepare(env: Dict[str, str], log) -> None:
    """After a node of ``env`` ended: start the server for the next ones unless one serves, once
    this process has spawned the nodes of two jobs in ``env`` (see ``_spawned``)."""
    if available(env):
        name = address(env, os.getcwd())
        if len(_spawned.get(name, ())) >= 2:
            _start_server(env, name, log)


def _start_server(env: Dict[str, str], name: str, log) -> None:
    """Start the server for ``env`` on the abstract socket ``name`` unless that is taken: this
    process binds it (the one lock two agents can race for) and hands it to the server."""
    for proc in list(_servers):  # reap those that ended
        if proc.poll() is not None:
            _servers.remove(proc)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        listener.bind(name)
    except OSError:  # one serves or is starting
        listener.close()
        return
    try:
        listener.listen(64)
        owner = _owner or os.getpid()
        _make_room(name, owner)
        server_env = dict(server_environment(env), **{ROOM: "." * ROOM_BYTES})
        _servers.append(subprocess.Popen(
            [sys.executable, "-m", "duotf._node.warm_server", str(listener.fileno()),
             str(owner), "." * 32],  # room for a node's command line (_retitle)
            pass_fds=(listener.fileno(),), env=server_env, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True,
            start_new_session=True,
        ))
        log.debug("started a warm node server for the next nodes (%s)", name[1:])
    except OSError as exc:
        log.debug("could not start a warm node server: %s", exc)
    finally:
        listener.close()
