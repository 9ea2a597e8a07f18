"""Separate hosts on this one machine, for tests: Linux network namespaces (root only).

:class:`Network` makes real separate hosts: a bridge in this (the driver's) namespace and, for
each host, a network namespace joined to it by a veth pair, with an address of its own on a
private subnet. A process started on a host (:meth:`Network.start`) also gets a hostname, a
``/dev/shm`` (a tmpfs) and a mount namespace of its own, so that a feeding task and a node on
different hosts cannot share memory, as on two machines; the file system is shared (as an NFS
home is), but for each host's local disk (``Network.local_dirs``, where the engines keep their
files). :meth:`Network.cut` takes a host's link down (no FIN, no RST: a partition) and
:meth:`Network.restore` brings it back; :meth:`Network.kill` kills every process of a host at
once (a host lost). :func:`spark_cluster` and :func:`dask_cluster` start a Spark standalone
cluster and a Dask cluster whose workers are on the hosts, with the master or scheduler (and
the driver) on the bridge. Everything is removed on the way out, processes included.

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
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Callable, Dict, Iterator, List, Optional

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


# -- separate hosts on a bridge ------------------------------------------------------------------
#: what a host runs first: its own hostname, /etc/hosts (every host's name, so that nothing
#: waits on a DNS server it cannot reach), /dev/shm and local disk (a tmpfs each), in a mount
#: namespace of its own
_HOST_SHELL = ('hostname "$1" && mount --bind "$2" /etc/hosts && '
               'mount -t tmpfs -o size=4g,mode=1777 duotf-shm /dev/shm && '
               'mount -t tmpfs -o size=4g,mode=1777 duotf-local "$3" && shift 3 && exec "$@"')
#: the same, with a ``/tmp`` of the host's own ($4: the paths under /tmp it still sees, one a
#: line): the machine's /tmp is mounted aside (in the host's /dev/shm), a tmpfs goes over /tmp,
#: and each kept path is mounted back where it was, then the host's local disk as above
_PRIVATE_TMP_SHELL = (
    'hostname "$1" && mount --bind "$2" /etc/hosts && '
    'mount -t tmpfs -o size=4g,mode=1777 duotf-shm /dev/shm && '
    'mkdir /dev/shm/.machine-tmp && mount --bind /tmp /dev/shm/.machine-tmp && '
    'mount -t tmpfs -o size=4g,mode=1777 duotf-tmp /tmp && '
    'printf "%s\n" "$4" | while IFS= read -r kept; do [ -z "$kept" ] || { '
    'mkdir -p "$kept" && mount --bind "/dev/shm/.machine-tmp/${kept#/tmp/}" "$kept"; } || exit 1; '
    'done && umount -l /dev/shm/.machine-tmp && rmdir /dev/shm/.machine-tmp && '
    'mkdir -p "$3" && mount -t tmpfs -o size=4g,mode=1777 duotf-local "$3" && shift 4 && exec "$@"')


def _free_subnet(start: int) -> int:
    """A ``10.213.<n>.0/24`` that no interface of this machine uses now (another Network's)."""
    used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True,
                          timeout=30).stdout
    for i in range(200):
        n = 10 + (start + i) % 200
        if f" 10.213.{n}." not in used:
            return n
    raise RuntimeError("no free 10.213.<n>.0/24 subnet for the hosts")


class Network:
    """``hosts`` separate hosts on a bridge of this machine (see the module's docstring).

    The driver (this process) is ``driver_ip``, the bridge's address; host ``i`` (from 0) is
    ``ips[i]`` in namespace ``names[i]``. Use it as a context manager: every process started on a
    host is killed, and the namespaces and the bridge removed, on the way out.
    """

    def __init__(self, hosts: int = 2, private_tmp: bool = False,
                 cpus: Optional[List[int]] = None):
        """``private_tmp``: each host has a ``/tmp`` of its own (as machines do), in which it
        sees nothing of this machine's but the folders Python and duotf run from, where they
        are under /tmp (a checkout or venv made there); by default /tmp is shared, as the
        rest of the file system is. ``cpus``: host ``i`` runs on this machine's CPU
        ``cpus[i]`` alone (as a machine of one core); by default every host runs on all."""
        tag = uuid.uuid4().hex[:6]
        self.private_tmp = private_tmp
        self.cpus = cpus
        self.subnet = _free_subnet(int(tag[:2], 16))  # 10.213.<subnet>.0/24
        self.bridge = f"dtb{tag}"
        self.driver_ip = f"10.213.{self.subnet}.1"
        self.names = [f"duotf-host{i}-{tag}" for i in range(hosts)]
        self.ips = [f"10.213.{self.subnet}.{11 + i}" for i in range(hosts)]
        self.hostnames = [f"duotf-host{i}" for i in range(hosts)]
        self._links = [f"dtv{tag}{i}" for i in range(hosts)]  # the bridge's end of each host's pair
        self._procs: List[subprocess.Popen] = []
        #: host -> starts its engine worker again (set by spark_cluster, dask_cluster)
        self.revivers: Dict[int, Callable[[], None]] = {}
        self.folder = tempfile.mkdtemp(prefix="duotf-hosts-")
        #: each host's local disk: a folder that only processes on that host see the files of
        self.local_dirs = [os.path.join(self.folder, f"host{i}") for i in range(hosts)]
        for folder in self.local_dirs:
            os.makedirs(folder)
        self.hosts_file = os.path.join(self.folder, "hosts")
        with open(self.hosts_file, "w") as f:
            f.write(f"127.0.0.1 localhost\n{self.driver_ip} duotf-driver\n")
            f.writelines(f"{ip} {name}\n" for ip, name in zip(self.ips, self.hostnames))

    def __enter__(self) -> "Network":
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.driver_ip}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for name, ip, link in zip(self.names, self.ips, self._links):
                _ip("netns", "add", name)
                _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", name)
                _ip("link", "set", link, "master", self.bridge, "up")
                _ip("-n", name, "addr", "add", f"{ip}/24", "dev", "eth0")
                _ip("-n", name, "link", "set", "eth0", "up")
                _ip("-n", name, "link", "set", "lo", "up")
                _ip("-n", name, "route", "add", "default", "via", self.driver_ip)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self, host: int, argv: List[str], env: Optional[dict] = None,
              log: Optional[str] = None) -> subprocess.Popen:
        """``argv`` started on host ``host`` (in a session of its own), its output to ``log``.
        Each call makes the host's ``/dev/shm`` and local disk anew: start one process tree a
        host (a Spark or Dask worker, whose children share them)."""
        out = open(log or os.devnull, "ab")
        pinned = ["taskset", "-c", str(self.cpus[host])] if self.cpus else []
        try:
            proc = subprocess.Popen(
                in_namespace(self.names[host], [*pinned, "unshare", "-m", "-u", "--propagation", "private",
                                                "sh", "-c", self._shell(), "host",
                                                self.hostnames[host], self.hosts_file,
                                                self.local_dirs[host], *self._kept(), *argv]),
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        finally:
            out.close()
        self._procs.append(proc)
        return proc

    def _shell(self) -> str:
        return _PRIVATE_TMP_SHELL if self.private_tmp else _HOST_SHELL

    def _kept(self) -> List[str]:
        """The private /tmp's argument: the folders under /tmp that Python and duotf run from
        (this interpreter's prefix, duotf's checkout or install, a pyspark), one a line."""
        if not self.private_tmp:
            return []
        import duotf
        import pyspark

        roots = {sys.prefix, os.path.dirname(os.path.dirname(os.path.abspath(duotf.__file__))),
                 os.path.dirname(os.path.abspath(pyspark.__file__))}
        # the duotf that a Python started elsewhere imports (an executor's): an installed
        # checkout may be another than the one this process imported from its working folder
        found = subprocess.run([sys.executable, "-c", "import importlib.util as u; "
                                "print(u.find_spec('duotf').origin)"], cwd="/",
                               capture_output=True, text=True, timeout=60).stdout.strip()
        if found:
            roots.add(os.path.dirname(os.path.dirname(found)))
        kept = sorted(r for r in map(os.path.realpath, roots) if r.startswith("/tmp/"))
        # a folder inside another kept one comes with it
        kept = [r for r in kept if not any(r.startswith(o + "/") for o in kept)]
        return ["\n".join(kept)]

    def pids(self, host: int) -> List[int]:
        """Every process on host ``host`` now."""
        found = subprocess.run(["ip", "netns", "pids", self.names[host]], capture_output=True,
                               text=True, timeout=30)
        return [int(word) for word in found.stdout.split()]

    def host_of(self, pid: int) -> Optional[int]:
        """The host process ``pid`` runs on (None: this, the driver's, namespace)."""
        inode = os.stat(f"/proc/{pid}/ns/net").st_ino
        for host, name in enumerate(self.names):
            if os.stat(f"/run/netns/{name}").st_ino == inode:
                return host
        return None

    def kill(self, host: int) -> None:
        """Kill every process of host ``host`` at once (SIGKILL): the host is lost."""
        for pid in self.pids(host):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass

    def revive(self, host: int) -> None:
        """After :meth:`kill`: the host's engine worker started again (a machine rebooted)."""
        self.revivers[host]()

    def cut(self, host: int) -> None:
        """Take host ``host``'s link down: its packets go nowhere, no connection is told."""
        _ip("link", "set", self._links[host], "down")

    def restore(self, host: int) -> None:
        """Bring host ``host``'s link back up."""
        _ip("link", "set", self._links[host], "up")

    def close(self) -> None:
        for host in range(len(self.names)):
            with contextlib.suppress(Exception):
                self.kill(host)
        for proc in self._procs:
            with contextlib.suppress(Exception):
                os.killpg(proc.pid, 9)
            with contextlib.suppress(Exception):
                proc.wait(10)
        for name, link in zip(self.names, self._links):
            subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=30)
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=30)
        shutil.rmtree(self.folder, ignore_errors=True)


def _log_text(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def _wait_for(what: str, found, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        time.sleep(0.1)
    raise RuntimeError(f"{what}: not within {timeout:g} s")


@contextlib.contextmanager
def daemon(argv: List[str], log: str, pattern: str, what: str,
            env: Optional[dict] = None) -> Iterator[str]:
    """``argv`` started on this machine's side (a session of its own, its output to ``log``);
    yields the first group of ``pattern`` once its log shows it (a ``RuntimeError`` with the
    log's end if it exits first); SIGTERM, then SIGKILL, to its process group on the way out.
    The Spark master, the Dask scheduler and tests/conftest.py's Spark Connect server."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    try:
        def started():
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited:\n" + _log_text(log)[-3000:])
            found = re.search(pattern, _log_text(log))
            return found and found.group(1)

        yield _wait_for(f"{what}'s start", started)
    finally:
        for sig, wait in ((15, 15), (9, 10)):
            with contextlib.suppress(Exception):
                os.killpg(proc.pid, sig)
                proc.wait(wait)


@contextlib.contextmanager
def spark_cluster(net: Network, cores: int = 2, memory: str = "2g") -> Iterator[str]:
    """A Spark standalone master on the driver's address and a worker of ``cores`` cores on
    every host of ``net``; yields the master URL. Stopped (with its executors) on the way out."""
    import pyspark

    home = os.path.dirname(pyspark.__file__)
    spark_class = os.path.join(home, "bin", "spark-class")
    base = dict(os.environ, SPARK_HOME=home, PYSPARK_PYTHON=sys.executable, SPARK_NO_DAEMONIZE="1")
    with daemon([spark_class, "org.apache.spark.deploy.master.Master", "--host", net.driver_ip,
                  "--port", "0", "--webui-port", "0"], os.path.join(net.folder, "master.log"),
                 r"Starting Spark master at (spark://\S+)", "the Spark master",
                 env=dict(base, SPARK_LOCAL_IP=net.driver_ip)) as master_url:

        def start(host: int) -> Callable[[], None]:
            log = os.path.join(net.folder, f"spark-worker{host}-{uuid.uuid4().hex[:6]}.log")
            local, ip = net.local_dirs[host], net.ips[host]
            env = dict(base, SPARK_LOCAL_IP=ip, SPARK_LOCAL_DIRS=os.path.join(local, "spark"))
            net.start(host, [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", ip,
                             "--port", "0", "--webui-port", "0", "--cores", str(cores),
                             "--memory", memory, "--work-dir",
                             os.path.join(local, "spark-work"), master_url],
                      env=env, log=log)
            return lambda: _wait_for(f"the Spark worker of host {host} registering",
                                     lambda: "Successfully registered with master" in _log_text(log))

        for registered in [start(host) for host in range(len(net.ips))]:
            registered()
        for host in range(len(net.ips)):
            net.revivers[host] = lambda host=host: start(host)()
        yield master_url


@contextlib.contextmanager
def dask_cluster(net: Network, threads: int = 2, workers: int = 1) -> Iterator[str]:
    """A Dask scheduler on the driver's address and ``workers`` workers of ``threads`` threads
    on every host of ``net`` (started by one ``dask worker`` process a host, so that they share
    the host's ``/dev/shm``); yields the scheduler's address."""
    with daemon([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", net.driver_ip,
                  "--port", "0", "--no-dashboard"], os.path.join(net.folder, "dask-scheduler.log"),
                 r"Scheduler at:\s+(tcp://\S+)", "the Dask scheduler") as found:

        def start(host: int) -> None:
            net.start(host, [sys.executable, "-m", "distributed.cli.dask_worker", found,
                             "--host", net.ips[host], "--nthreads", str(threads), "--nworkers", str(workers),
                             "--no-dashboard", "--name", net.hostnames[host],
                             "--local-directory", os.path.join(net.local_dirs[host], "dask")],
                      log=os.path.join(net.folder, f"dask-worker{host}-{uuid.uuid4().hex[:6]}.log"))

        for host in range(len(net.ips)):
            start(host)
            net.revivers[host] = lambda host=host: start(host)
        yield found


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
