"""The TCP ports duotf listens on, bounded for a firewall: ``DUOTF_PORTS=lo-hi``.

Every socket duotf listens on takes its port from one range when one is set: the driver's
rendezvous server, each node's feed server and TensorFlow server port, the Spark Connect relay's
two ports, the doctor's probes and a node's TensorBoard. Unset, the kernel picks (an ephemeral
port). The range is read from the environment of the process that listens (the driver; the
engine's executors or workers, where ``spark.executorEnv.DUOTF_PORTS`` or a Dask worker's
environment sets it) or given to ``duotf.run(..., ports="lo-hi")``, which sets it for the job's
engine tasks and nodes too. A range with no free port left is a :class:`PortRangeError` naming
it.

``DUOTF_BIND`` picks the address they listen on, where a host has several networks and only one
may carry duotf's traffic: a network (``10.20.0.0/16``: each host takes its own address in it),
an interface (``eth1``: its address on each host) or one address (for one host). Each node then
says that address to the others, and the driver listens on its own there unless ``driver_host``
names one. Unset, they listen on every interface and the nodes say the address they reach the
driver from. TensorFlow's own server listens on every interface whatever is set: no setting of
TensorFlow picks its address (its port is in the range).

Binding scans the range from a random place, so that the processes of one host rarely try the
same port at once; a port another process holds is skipped. TensorFlow's port is held by a
socket that never listens until the node's server takes it (``SO_REUSEPORT``): those are picked
under a lock per host, so that two of them never share a port.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import socket
import sys
import tempfile
import time
from typing import Dict, Iterator, Mapping, Optional, Tuple

from duotf.errors import ConfigError, PortRangeError

__all__ = ["PORTS_ENV", "BIND_ENV", "PortRange", "parse", "configured", "bind_address",
           "create_server", "reserve", "free_port"]

#: the environment variable of the range: ``"41000-41300"`` (both ends included)
PORTS_ENV = "DUOTF_PORTS"
#: the environment variable of the address to listen on: a network, an interface or an address
BIND_ENV = "DUOTF_BIND"

#: seconds to wait for the host's lock on picking a reserved port (each holder takes microseconds)
_LOCK_WAIT = 10.0


class PortRange:
    """Ports ``low`` to ``high``, both included."""

    def __init__(self, low: int, high: int):
        self.low, self.high = low, high

    def __str__(self) -> str:
        return f"{self.low}-{self.high}"

    def __repr__(self) -> str:
        return f"PortRange({self.low}, {self.high})"

    def __eq__(self, other) -> bool:
        return isinstance(other, PortRange) and (self.low, self.high) == (other.low, other.high)

    def __hash__(self) -> int:
        return hash((self.low, self.high))

    def __len__(self) -> int:
        return self.high - self.low + 1

    def __contains__(self, port: int) -> bool:
        return self.low <= port <= self.high

    def scan(self) -> Iterator[int]:
        """Every port of the range once, from a random one on, wrapping around."""
        start = random.randrange(len(self))
        for i in range(len(self)):
            yield self.low + (start + i) % len(self)


def parse(text: Optional[str], where: str = PORTS_ENV) -> Optional[PortRange]:
    """The range ``"lo-hi"`` (or one port, ``"41000"``); None for None or an empty string. A
    malformed range is a :class:`~duotf.errors.ConfigError` naming ``where`` it came from."""
    if text is None or not str(text).strip():
        return None
    low, sep, high = str(text).strip().partition("-")
    try:
        lo, hi = int(low), int(high if sep else low)
    except ValueError:
        lo = hi = -1
    if not 1024 <= lo <= hi <= 65535:
        raise ConfigError(f"{where}={text!r}: give a range of ports as 'low-high', both between "
                          "1024 and 65535, low <= high (e.g. '41000-41300')", param="ports")
    return PortRange(lo, hi)


def configured(env: Optional[Mapping[str, str]] = None) -> Optional[PortRange]:
    """The range ``env`` (default: this process's environment) sets, or None."""
    return parse((os.environ if env is None else env).get(PORTS_ENV))


def _interfaces() -> Dict[str, str]:
    """This host's interfaces and their IPv4 address (Linux; elsewhere through psutil where it
    is installed, else none)."""
    found: Dict[str, str] = {}
    if sys.platform.startswith("linux"):
        import fcntl
        import struct

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for _, name in socket.if_nameindex():
                try:  # SIOCGIFADDR: the interface's (first) IPv4 address
                    packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
                except OSError:
                    continue  # no IPv4 address
                found[name] = socket.inet_ntoa(packed[20:24])
        return found
    try:
        import psutil
    except ImportError:
        return found
    for name, addresses in psutil.net_if_addrs().items():
        for address in addresses:
            if address.family == socket.AF_INET:
                found.setdefault(name, address.address)
    return found


def bind_address(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The address of this host that ``DUOTF_BIND`` in ``env`` (default: this process's
    environment) picks, or None where it is unset (every interface). One that names no address
    here is a :class:`~duotf.errors.ConfigError` saying the host's addresses."""
    import ipaddress

    text = ((os.environ if env is None else env).get(BIND_ENV) or "").strip()
    if not text:
        return None
    interfaces = _interfaces()
    if text in interfaces:
        return interfaces[text]
    host = socket.gethostname()
    here = ", ".join(f"{name} {address}" for name, address in sorted(interfaces.items()))
    try:
        network = ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise ConfigError(f"{BIND_ENV}={text!r} is no network, interface or address of {host}: give "
                          f"a network ('10.20.0.0/16'), an interface or an address (here: {here})",
                          param="bind", host=host) from None
    for _, address in sorted(interfaces.items()):
        if ipaddress.ip_address(address) in network:
            return address
    raise ConfigError(f"{BIND_ENV}={text!r}: no address of {host} is in it (here: {here}); give a "
                      "network every host of the cluster has an address in", param="bind", host=host)


def _exhausted(ports: PortRange, what: str) -> PortRangeError:
    host = socket.gethostname()
    return PortRangeError(
        f"no free port for {what} on {host} in {PORTS_ENV}={ports}: all {len(ports)} are taken "
        "(by other duotf jobs or other programs); widen the range, or run fewer jobs on this "
        "host at once", ports=str(ports), host=host, what=what)


def create_server(host: str = "0.0.0.0", *, backlog: int = 128, what: str = "a duotf server",
                  ports: Optional[PortRange] = None,
                  env: Optional[Mapping[str, str]] = None) -> socket.socket:
    """A listening TCP socket on ``host`` (every interface: the address ``DUOTF_BIND`` in ``env``
    picks, where set): on a port of ``ports`` (default: :func:`configured` from ``env``), else on
    one the kernel picks."""
    if host in ("0.0.0.0", ""):
        host = bind_address(env) or "0.0.0.0"
    ports = ports if ports is not None else configured(env)
    if ports is None:
        try:
            return socket.create_server((host, 0), backlog=backlog)
        except OSError as exc:
            raise _not_here(host, what) if exc.errno == errno.EADDRNOTAVAIL else exc
    for port in ports.scan():
        # Without SO_REUSEADDR (which socket.create_server sets): with it, Linux lets a socket
        # bind and listen on a port that a reservation (:func:`reserve`, SO_REUSEADDR, not
        # listening) holds, and the node's TensorFlow server then cannot bind its own port.
        # A port with connections in TIME_WAIT is skipped as taken.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((host, port))
            sock.listen(backlog)
            return sock
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRNOTAVAIL:
                raise _not_here(host, what) from None
            if exc.errno not in (errno.EADDRINUSE, errno.EACCES):
                raise
    raise _exhausted(ports, what)


def _not_here(host: str, what: str) -> ConfigError:
    """The error of a server asked to listen on ``host``, which is no address of this machine
    (a ``driver_host`` the executors reach through a forwarded or translated address, or a
    mistyped one)."""
    here = ", ".join(f"{name} {address}" for name, address in sorted(_interfaces().items()))
    return ConfigError(
        f"{what} cannot listen on {host}: it is not an address of {socket.gethostname()} "
        f"({os.strerror(errno.EADDRNOTAVAIL)}; its addresses: {here or 'unknown'}). Give "
        "driver_host (Spark: spark.driver.host) an address of this machine that the executors "
        "can reach",
        param="driver_host", host=host)


@contextlib.contextmanager
def _host_lock() -> Iterator[None]:
    """Held while a port is picked for a reservation: one process of this host (of its network
    namespace, whose ports these are) at a time. On Linux an abstract Unix socket's name, which
    leaves no file behind and goes with its process; elsewhere a lock file in the temp folder."""
    if sys.platform.startswith("linux"):
        lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        deadline = time.monotonic() + _LOCK_WAIT
        try:
            while True:
                try:
                    lock.bind("\0duotf-ports-lock")
                    break
                except OSError as exc:
                    if exc.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                        raise
                    time.sleep(0.002)  # another process picks a port: a few microseconds
            yield
        finally:
            lock.close()
        return
    import fcntl

    fd = os.open(os.path.join(tempfile.gettempdir(), "duotf-ports.lock"), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _reserving_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if hasattr(socket, "SO_REUSEPORT"):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    return sock


def reserve(*, what: str = "a TensorFlow server", ports: Optional[PortRange] = None,
            env: Optional[Mapping[str, str]] = None) -> socket.socket:
    """A socket bound to a port on every interface that never listens, with ``SO_REUSEADDR``
    and ``SO_REUSEPORT``, so that TensorFlow's gRPC server (which sets both) can bind the port
    while the socket holds it, and any other program is refused it. In a range, the port is
    one no socket holds: a socket that holds it refuses a plain bind, reserving or not."""
    ports = ports if ports is not None else configured(env)
    host = bind_address(env) or "0.0.0.0"  # TensorFlow's server itself listens on every interface
    if ports is None:
        sock = _reserving_socket()
        sock.bind((host, 0))
        return sock
    with _host_lock():
        for port in ports.scan():
            if not _free(port):
                continue
            sock = _reserving_socket()
            try:
                sock.bind((host, port))
                return sock
            except OSError:
                sock.close()
    raise _exhausted(ports, what)


def _free(port: int) -> bool:
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.bind(("0.0.0.0", port))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def free_port(*, what: str, ports: Optional[PortRange] = None,
              env: Optional[Mapping[str, str]] = None) -> Tuple[int, bool]:
    """``(port, chosen)``: a port of the range that is free now, for a program that binds it
    itself (TensorBoard), with ``chosen`` true; ``(0, False)`` without a range (the program
    asks the kernel). Another program may take it before it is bound: the program's own error
    says so."""
    ports = ports if ports is not None else configured(env)
    if ports is None:
        return 0, False
    with _host_lock():
        for port in ports.scan():
            if _free(port):
                return port, True
    raise _exhausted(ports, what)
