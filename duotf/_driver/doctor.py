"""``duotf.doctor``: check a cluster before the first job, and say what to fix.

The first hour with a new cluster goes to mismatched versions, unreachable ports and too few
slots, found one failed job at a time. :func:`doctor` finds them at once: it counts the slots
as ``duotf.run`` does, then runs a probe (:mod:`duotf._node.probe`) in a task of every slot through
the backend's own way of starting nodes, and turns what the probes saw into one table of checks,
each ``OK``, ``WARN`` (works, but slower or fragile) or ``FAIL`` (a job would fail), with the fix.
``python -m duotf doctor`` prints it (:mod:`duotf._driver.cli`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import platform
import sys
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Tuple

from duotf._names import public
from duotf._deadline import Deadline
from duotf.backends.base import CheckStatus
from duotf.errors import ConfigError, DuotfError, PortRangeError
from duotf.spec import ClusterSpec, parse_address, seconds

if TYPE_CHECKING:  # (imported by ``import duotf``: the transport only where it runs)
    from duotf._transport.rendezvous import Channel

logger = logging.getLogger(__name__)

__all__ = ["doctor", "DoctorReport", "Check", "CheckStatus"]

#: below this much free ``/dev/shm`` the feed's shared memory rings may not fit (Docker gives
#: 64 MiB), and feeding falls back to TCP
SHM_WANTED = 256 << 20


@dataclasses.dataclass(frozen=True)
class Check:
    """One row of the report: what was checked, how it went, what was seen, what to change."""

    name: str
    status: CheckStatus
    detail: str
    fix: str = ""


@public("duotf")
@dataclasses.dataclass
class DoctorReport:
    """What :func:`doctor` found. ``ok`` is False when any check failed; ``str(report)`` and
    :meth:`table` give the table that ``python -m duotf doctor`` prints."""

    backend: str
    spec: ClusterSpec
    checks: List[Check]
    #: each probe's own report (one per slot probed), for a closer look
    probes: List[dict] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def failed(self) -> List[Check]:
        return [c for c in self.checks if c.status is CheckStatus.FAIL]

    def __getitem__(self, name: str) -> Check:
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(f"no check {name!r}; checks: {', '.join(c.name for c in self.checks)}")

    def table(self) -> str:
        width = max([len(c.name) for c in self.checks] + [5])
        s = self.spec
        lines = [f"duotf doctor: {self.backend}, spec workers={s.workers} ps={s.ps} "
                 f"chief={s.chief} evaluator={s.evaluator} protocol={s.protocol}",
                 f"{'check'.ljust(width)}  {'result':6}  detail"]
        pad = " " * (width + 10)
        for c in self.checks:
            detail = c.detail.splitlines() or [""]
            lines.append(f"{c.name.ljust(width)}  {c.status:6}  {detail[0]}")
            lines += [pad + more for more in detail[1:]]
            if c.fix and c.status is not CheckStatus.OK:
                lines.append(pad + "fix: " + c.fix)
        failed = len(self.failed)
        lines.append("all checks passed" if not failed else f"{failed} check(s) failed")
        return "\n".join(lines)

    __str__ = table


def doctor(backend: Any = None, spec: Optional[ClusterSpec] = None, *, url: Optional[str] = None,
           reach: Iterable = (), env: Optional[Dict[str, str]] = None,
           driver_host: Optional[str] = None, connect_timeout: float = 10.0,
           timeout: float = 180.0) -> DoctorReport:
    """Check that ``backend`` can run ``spec``; return a :class:`DoctorReport` (never raises
    for what it finds).

    Parameters
    ----------
    backend:
        As for :func:`duotf.run`: a SparkSession/SparkContext, a ``distributed.Client``, a name,
        a Backend, or None for the embedded local backend.
    spec:
        The cluster to check the slots for (default ``ClusterSpec()``) and its protocol.
    url:
        A folder URL every node must write and read (``s3://bucket/tmp``, ``hdfs://nn/x``);
        default: where a node's relative paths go (``ctx.absolute_path``).
    reach:
        More ``"host:port"`` addresses every executor must reach (a namenode, a data service).
    env:
        The ``env`` you give ``duotf.run``: the node checks run with it (PYTHONPATH included).
    driver_host:
        The driver's address as the executors reach it, as for ``duotf.run``.
    connect_timeout:
        Seconds a probe tries to reach the driver before that check fails.
    timeout:
        Seconds for the whole check (importing TensorFlow on busy executors takes a while).
    """
    spec = spec if spec is not None else ClusterSpec()
    if not isinstance(spec, ClusterSpec):
        raise ConfigError(f"spec must be a duotf.ClusterSpec, got {type(spec).__name__}")
    timeout = seconds(timeout, "timeout")
    connect_timeout = seconds(connect_timeout, "connect_timeout")
    targets = tuple(_address(a) for a in reach)
    env = {str(k): str(v) for k, v in (env or {}).items()}
    from duotf.backends import resolve_backend

    try:
        backend_obj, owns = resolve_backend(backend)
    except Exception as exc:
        name = backend if isinstance(backend, str) else type(backend).__name__
        checks = [Check("backend", CheckStatus.FAIL, f"cannot start the {name} backend: {exc}",
                        "see the error; the engine must start on this machine first")]
        if name == "spark":
            checks.append(java_check())
        return DoctorReport(str(name), spec, checks)
    try:
        return _Doctor(backend_obj, spec, url, targets, env, driver_host, connect_timeout,
                       timeout).run()
    finally:
        if owns:
            backend_obj.close()


def _address(value) -> Tuple[str, int]:
    try:
        if isinstance(value, (tuple, list)):
            return str(value[0]), int(value[1])
        return parse_address(str(value))
    except (ValueError, IndexError):
        raise ConfigError(f"reach={value!r}: give addresses as 'host:port'") from None


def java_check() -> Check:
    """Java for Spark, found as ``spark-submit`` finds it (JAVA_HOME, else ``java`` on PATH)."""
    import os
    import shutil
    import subprocess

    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    fix = "install Java 17 (apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
    if not java or not os.path.exists(java):
        return Check("java", CheckStatus.FAIL, "no java: JAVA_HOME is not set and no java on PATH", fix)
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("java", CheckStatus.FAIL, f"{java} does not run: {exc}", fix)
    first = (out.stderr or out.stdout).strip().splitlines()[:1]
    return Check("java", CheckStatus.OK if out.returncode == 0 else CheckStatus.FAIL,
                 f"{java}: {first[0] if first else 'exit ' + str(out.returncode)}", fix)


def _driver_version(package: str) -> Optional[str]:
    """The version this driver has of ``package``: the imported module's, else the installed
    distribution's that provides it (never imports it: TensorFlow takes seconds)."""
    module = sys.modules.get(package)
    if module is not None and getattr(module, "__version__", None):
        return str(module.__version__)
    from importlib import metadata

    for dist in metadata.packages_distributions().get(package, []):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


class _Exchange:
    """The driver's side of the probes' rendezvous: who registered, where, who is done.

    Probes register; :meth:`start` answers every one with the addresses of one probe per
    executor (the first to register there, which also runs the node checks: probes x executors
    connections, not probes squared); :meth:`stop` lets them close their ports. A probe that
    registers late is answered at once with what the others got.
    """

    def __init__(self, secret: bytes, host: str, ports=None):
        from duotf._transport import rendezvous
        self.cond = threading.Condition()
        self.registered: Dict[int, Tuple[Channel, dict]] = {}  # by node id: (its channel, REGISTER)
        self.done: set = set()
        self.closed: set = set()
        self.first_seen: Optional[float] = None
        self.leads: Optional[Dict[str, int]] = None  # executor -> its probe; set by start()
        self.peers: list = []
        self.stopped = False
        self.server = rendezvous.RendezvousServer(secret, self._on_message, self._on_close, host=host,
                                                  ports=ports)

    def _on_message(self, peer, message: dict) -> None:
        from duotf._transport.rendezvous import Msg

        with self.cond:
            node_id = message.get("node_id")
            if message["type"] == Msg.REGISTER and isinstance(node_id, int):
                self.registered[node_id] = (peer, message)
                self.first_seen = self.first_seen or time.monotonic()
                if self.leads is not None:  # late: answer as the others were answered
                    key = _executor_key(message)
                    self.leads.setdefault(key, node_id)
                    self._send(node_id, {"type": Msg.START, "peers": self.peers,
                                         "lead": self.leads[key] == node_id})
                    if self.stopped:
                        self._send(node_id, {"type": Msg.STOP})
            elif message["type"] == Msg.DONE:
                self.done.add(node_id)
            self.cond.notify_all()

    def _on_close(self, peer, exc) -> None:
        with self.cond:
            self.closed.update(i for i, (p, _) in self.registered.items() if p is peer)
            self.cond.notify_all()

    def wait(self, predicate, deadline: Deadline) -> bool:
        with self.cond:
            while not predicate():
                if deadline.expired:
                    return False
                left = deadline.remaining
                self.cond.wait(1.0 if left is None else min(left, 1.0))
            return True

    def start(self) -> None:
        from duotf._transport.rendezvous import Msg

        with self.cond:
            self.leads = {}
            for i in sorted(self.registered):
                self.leads.setdefault(_executor_key(self.registered[i][1]), i)
            self.peers = [[i, self.registered[i][1]["host"], self.registered[i][1]["port"]]
                          for i in sorted(self.leads.values())]
            for i, (_, message) in self.registered.items():
                self._send(i, {"type": Msg.START, "peers": self.peers,
                               "lead": self.leads[_executor_key(message)] == i})

    def all_done(self) -> bool:
        return set(self.registered) <= self.done | self.closed

    def stop(self) -> None:
        from duotf._transport.rendezvous import Msg

        with self.cond:
            self.stopped = True
            for i in self.registered:
                self._send(i, {"type": Msg.STOP})

    def _send(self, node_id: int, message: dict) -> None:
        try:
            self.registered[node_id][0].send(message)
        except OSError as exc:
            logger.debug("doctor: probe %d is gone: %s", node_id, exc)

    def notify(self) -> None:
        with self.cond:
            self.cond.notify_all()


class _Doctor:
    def __init__(self, backend, spec, url, reach, env, driver_host, connect_timeout, timeout):
        self.relayed = False  # the probes reached this process through a relay
        self.relayed_why = ""  # and why (Route.why)
        self.backend = backend
        self.spec = spec
        self.url = url
        self.reach = reach
        from duotf._driver.api import job_ports
        from duotf._transport.ports import configured as configured_ports

        # the range duotf.run would listen in (env's DUOTF_PORTS, else the driver's): the
        # probes listen in it, and say where they cannot
        self.env = job_ports(env, None)
        self.ports = configured_ports(self.env)
        self.driver_host = driver_host or backend.driver_host()
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self.checks: List[Check] = []

    def add(self, name: str, status: CheckStatus, detail: str, fix: str = "") -> None:
        self.checks.append(Check(name, status, detail, fix))

    def verdict(self, name: str, bad: List[str], ok: str, fix: str, driver: str = "") -> None:
        """A check that fails where ``bad`` lists what was wrong (and ``driver``, what the
        driver has, to compare), and else says ``ok``."""
        self.add(name, CheckStatus.FAIL if bad else CheckStatus.OK,
                 "\n".join(bad + ([driver] if driver else [])) if bad else ok, fix)

    def run(self) -> DoctorReport:
        deadline = Deadline.after(self.timeout)
        for name, status, detail, fix in self.backend.engine_checks(self.spec.num_nodes):
            self.add(name, CheckStatus(status), detail, fix)
        slots = self._slots()
        probes: List[dict] = []
        if slots:
            probes = self._probe(slots, deadline)
        if probes:
            self._judge(probes)
        return DoctorReport(repr(self.backend), self.spec, self.checks, probes)

    # -- slots ----------------------------------------------------------------------------------
    def _slots(self) -> int:
        n = self.spec.num_nodes
        try:
            self.backend.check_capacity(n)  # what duotf.run counts, InsufficientSlotsError and all
        except DuotfError as exc:
            self.add("slots", CheckStatus.FAIL, str(exc))
        else:
            self.add("slots", CheckStatus.OK, f"{self.backend.slots()} slots for {n} nodes")
        slots = self.backend.slots()
        if not slots:
            self.add("probes", CheckStatus.FAIL, "no slot to run a probe in: nothing else was checked",
                     self.backend.capacity_hint())
        return slots

    # -- the probes -----------------------------------------------------------------------------
    def _probe(self, n: int, deadline: Deadline) -> List[dict]:
        from duotf._transport import rendezvous
        from duotf._node.probe import ProbeJob, run_probe

        job_id = "doctor-" + uuid.uuid4().hex[:8]
        secret = rendezvous.new_secret()
        try:
            exchange = _Exchange(secret, self.driver_host, self.ports)
        except ConfigError as exc:  # a driver_host that is not this machine's, a full range
            full = isinstance(exc, PortRangeError)
            self.add("driver port", CheckStatus.FAIL, str(exc),
                     "widen the range (DUOTF_PORTS), or run fewer jobs on this host at once"
                     if full else "set driver_host (--driver-host; Spark: spark.driver.host) to "
                     "an address of this machine the executors can reach")
            return []
        try:  # directly, or through a relay where the executors cannot reach this process
            route = self.backend.route(exchange.server.address, lambda why: exchange.notify(), 60.0)
        except Exception as exc:
            exchange.server.close()
            self.add("driver port", CheckStatus.FAIL, f"the executors cannot reach {self.driver_host}, "
                     f"and the relay through the cluster did not start: {exc}",
                     "run the driver where the executors can reach it (driver_host=...)")
            return []
        self.relayed, self.relayed_why = route.relayed, route.why
        if route.relayed and n > 1:
            n -= 1  # a slot for the relay's polls, which the probes' exchanges go through
        job = ProbeJob(
            job_id=job_id, driver_address=route.address, secret=secret,
            connect_timeout=self.connect_timeout,
            exchange_timeout=self.connect_timeout + 30.0,
            protocol=self.spec.protocol, env=self.env, url=self.url,
            default_fs=self.backend.default_fs(), reach=self.reach,
        )
        try:
            engine_job = self.backend.start_nodes(functools.partial(run_probe, job), n, job_id)
        except Exception as exc:
            exchange.server.close()
            route.close()
            self.add("probes", CheckStatus.FAIL, f"the {self.backend.name} backend could not start "
                     f"{n} probe tasks: {exc}", self.backend.capacity_hint())
            return []
        engine_job.add_done_callback(exchange.notify)
        try:
            # Every probe registers, or those that can reach the driver have had their time.
            exchange.wait(lambda: len(exchange.registered) == n or engine_job.done() or (
                exchange.first_seen is not None
                and time.monotonic() > exchange.first_seen + self.connect_timeout + 2), deadline)
            exchange.start()
            exchange.wait(lambda: exchange.all_done() or engine_job.done(), deadline)
            exchange.stop()
            engine_job.join(deadline.remaining)
            if not engine_job.done():
                engine_job.cancel()
                self.add("probes", CheckStatus.FAIL,
                         f"the probes did not finish within timeout={self.timeout:g} s",
                         "raise timeout, or free the executors' slots (another job holds them?)")
                return []
            try:
                outcomes = engine_job.result()
            except Exception as exc:
                self.add("probes", CheckStatus.FAIL, f"the probe tasks failed: {exc}",
                         "see the engine's error")
                return []
        finally:
            exchange.server.close()
            route.close()
        return [json.loads(o.payload) for o in sorted(outcomes, key=lambda o: o.node_id)]

    # -- what the probes saw --------------------------------------------------------------------
    def _judge(self, probes: List[dict]) -> None:
        leads = [p for p in probes if p.get("lead")]
        executors = len({(p["hostname"], p["executor_id"]) for p in probes})
        nodes = [(p, p["node"]) for p in leads if "error" not in p["node"]]
        broken = [(p, p["node"]["error"]) for p in leads if "error" in p["node"]]
        self.add("probes", CheckStatus.OK if not broken else CheckStatus.FAIL,
                 f"{len(probes)} probe tasks on {executors} executor(s)" + "".join(
                     f"\n{_where(p)}: the node process checks failed: {e}" for p, e in broken),
                 "install duotf (the driver's version) and its dependencies on every executor")
        self._versions(probes, nodes)
        self._protocol(nodes)
        self._driver_port(probes)
        self._node_ports(probes)
        self._port_range(probes)
        self._bind_address(probes)
        for host, port in self.reach:
            key = f"{host}:{port}"
            bad = [f"{_where(p)}: {p['reach'][key]}" for p in probes if p["reach"].get(key)]
            self.verdict(f"reach {key}", bad,
                         f"reachable from {len(probes)} probe tasks",
                         f"let every executor open TCP connections to {key} (firewall, security "
                         "group, the service's bind address)")
        self._filesystem(nodes)
        self._shm(nodes)

    def _versions(self, probes, nodes) -> None:
        from duotf._version import __version__ as duotf_version

        driver_py = platform.python_version()
        rows = [(_where(p), "engine task", p["engine"]["python"]) for p in probes if p.get("lead")]
        rows += [(_where(p), "node process", n["python"]) for p, n in nodes]
        bad = [f"{w} ({what}): Python {v}" for w, what, v in rows if _minor(v) != _minor(driver_py)]
        self.verdict("python", bad,
                     f"{_minor(driver_py)} on the driver ({driver_py}) and every executor",
                     "run the driver and the executors on the same Python minor version "
                     "(PYSPARK_PYTHON / PYSPARK_DRIVER_PYTHON, the Dask workers' environment)",
                     driver=f"driver: Python {driver_py}")
        seen = [(_where(p), p["engine"]["duotf"]) for p in probes if p.get("lead")]
        seen += [(_where(p), n["duotf"]) for p, n in nodes]
        bad = sorted({f"{w}: duotf {v}" for w, v in seen if v != duotf_version})
        self.verdict("duotf", bad,
                     f"{duotf_version} on the driver and every executor",
                     f"install duotf {duotf_version} on every executor",
                     driver=f"driver: duotf {duotf_version}")
        self._tensorflow(nodes)
        # the engine, what the feed reads data with (engine tasks), Keras (node processes)
        for package, where in (("pyspark", "engine"), ("distributed", "engine"), ("pyarrow", "engine"),
                               ("pandas", "engine"), ("keras", "node")):
            seen = [(_where(p), p["engine"][package]) for p in probes
                    if p.get("lead") and where == "engine" and p["engine"].get(package)]
            seen += [(_where(p), n[package]) for p, n in nodes if where == "node" and n.get(package)]
            if not seen:
                continue
            mine = _driver_version(package)
            if mine is None and package not in ("pyspark", "distributed"):
                continue  # a driver without Keras (or pandas) is fine: the executors use theirs
            bad = sorted({f"{w}: {package} {v}" for w, v in seen if v != mine})
            self.verdict(package, bad,
                         f"{mine} on the driver and every executor",
                         f"install {package} {mine} on every executor (or the executors' version "
                         "on the driver)",
                         driver=f"driver: {package} {mine}")

    def _tensorflow(self, nodes) -> None:
        mine = _driver_version("tensorflow")
        missing = [f"{_where(p)}: {n.get('tensorflow_error')}" for p, n in nodes if not n.get("tensorflow")]
        versions = {n["tensorflow"] for _, n in nodes if n.get("tensorflow")}
        bad = [f"{_where(p)}: TensorFlow {n['tensorflow']} ({n.get('tensorflow_path')})"
               for p, n in nodes if n.get("tensorflow")
               and (len(versions) > 1 or (mine is not None and n["tensorflow"] != mine))]
        driver = f"driver: TensorFlow {mine}" if mine else "driver: no TensorFlow (fine for a driver)"
        if missing or bad:
            self.add("tensorflow", CheckStatus.FAIL, "\n".join(missing + bad + [driver]),
                     f"install one TensorFlow{' (' + mine + ')' if mine else ''} on every "
                     "executor and check the nodes' PYTHONPATH (duotf.run env=...) for another copy")
        elif versions:
            self.add("tensorflow", CheckStatus.OK,
                     f"{versions.pop()} on every executor; {driver}")

    def _protocol(self, nodes) -> None:
        protocol = self.spec.protocol
        bad = [f"{_where(p)}: {n['protocol_error']}" for p, n in nodes
               if n.get("tensorflow") and n.get("protocol_error")]
        checked = [p for p, n in nodes if n.get("tensorflow")]
        if bad and any(n.get("tensorflow_broken") for _, n in nodes):
            self.add("protocol", CheckStatus.FAIL, "\n".join(bad),
                     "the TensorFlow the nodes import fails to make a server: reinstall it (see "
                     "the tensorflow row)")
        elif bad:
            self.add("protocol", CheckStatus.FAIL, "\n".join(bad),
                     f"use protocol='grpc' (stock TensorFlow serves only grpc) or a TensorFlow "
                     f"build with {protocol!r} on every executor")
        elif checked:
            self.add("protocol", CheckStatus.OK,
                     f"TensorFlow serves {protocol!r} on {len(checked)} executor(s)")

    def _driver_port(self, probes) -> None:
        address = "the driver"
        bad = [f"{_where(p)}: {p['driver_error']}" for p in probes if p.get("driver_error")]
        bad += [f"{_where(p)}: {p['exchange_error']}" for p in probes if p.get("exchange_error")]
        how = (f" through a relay in the cluster ({self.relayed_why}: each exchange is a Spark "
               "job, so nodes start a few seconds later)" if self.relayed else "")
        self.verdict("driver port", bad,
                     f"{len(probes)} probe tasks reached {address} at {self.driver_host}{how}",
                     "set driver_host (--driver-host; Spark: spark.driver.host) to an address of this "
                     "machine the executors can reach, and let them connect to its ports")

    def _node_ports(self, probes) -> None:
        checked = [p for p in probes if p.get("peers") is not None]
        if len(probes) < 2:
            return
        if not checked:
            self.add("node ports", CheckStatus.FAIL, "not checked: no probe reached the driver",
                     "fix the driver port first")
            return
        bad = [f"{_where(p)} -> {address}: {error}" for p in checked
               for address, error in sorted(p["peers"].items()) if error]
        pairs = sum(len(p["peers"]) for p in checked)
        self.verdict("node ports", bad,
                     f"{pairs} connections between probe tasks opened",
                     "let the executors open TCP connections to each other on any port (each "
                     "TensorFlow node listens on a port of its own, from the ephemeral range)")

    def _bind_address(self, probes) -> None:
        bound = [p for p in probes if p.get("bind")]
        if not bound:
            return  # no DUOTF_BIND: every interface
        bad = [f"{_where(p)}: {p['bind_error']}" for p in bound if p.get("bind_error")]
        addresses = ", ".join(sorted({p["bind_address"] for p in bound if p.get("bind_address")}))
        self.verdict("bind address", bad,
                     f"{len(bound)} probe tasks listened on DUOTF_BIND={bound[0]['bind']}: {addresses}",
                     "give DUOTF_BIND a network every executor's host has an address in, or the "
                     "name of an interface each of them has (docs/cluster.md, Ports and firewalls)")

    def _port_range(self, probes) -> None:
        ranged = [p for p in probes if p.get("ports")]
        if not ranged:
            return  # no DUOTF_PORTS: the kernel picks, checked by "node ports"
        bad = [f"{_where(p)}: {p['ports_error']}" for p in ranged if p.get("ports_error")]
        seen = sorted({p["ports"] for p in ranged})
        self.verdict("port range", bad,
                     f"{len(ranged)} probe tasks listened in DUOTF_PORTS={', '.join(seen)}",
                     "widen the range (each node takes 2 ports on its host: docs/cluster.md, Ports "
                     "and firewalls), or set a well-formed DUOTF_PORTS=low-high")

    def _filesystem(self, nodes) -> None:
        found = [(p, n["fs"]) for p, n in nodes if n.get("fs")]
        if not found:
            return
        bad = [f"{_where(p)}: {fs['url']}: {fs['error']}" for p, fs in found if fs["error"]]
        where = self.url or f"the default filesystem ({self.backend.default_fs()})"
        self.verdict("filesystem", bad,
                     f"wrote, read and removed a file in {where} on {len(found)} executor(s)",
                     "give a folder every node can write (url=..., --url), with the filesystem's "
                     "package and credentials on every executor")

    def _shm(self, nodes) -> None:
        if not nodes:
            return
        small = []
        for p, n in nodes:
            shm = n.get("shm")
            if shm is None:
                small.append(f"{_where(p)}: no /dev/shm")
            elif shm["free"] < SHM_WANTED:
                small.append(f"{_where(p)}: /dev/shm has {shm['free'] >> 20} MiB free of "
                             f"{shm['total'] >> 20} MiB")
        free = min((n["shm"]["free"] for _, n in nodes if n.get("shm")), default=0)
        self.add("/dev/shm", CheckStatus.WARN if small else CheckStatus.OK,
                 "\n".join(small) if small else f"at least {free >> 20} MiB free on every executor",
                 f"feeding falls back to TCP (slower) where a ring does not fit: give /dev/shm "
                 f"{SHM_WANTED >> 20} MiB or more (docker run --shm-size=1g)")


def _executor_key(message: dict) -> str:
    return f"{message.get('host')}|{message.get('executor_id')}"


def _where(probe: dict) -> str:
    host = probe.get("host") or probe.get("hostname")
    executor = probe.get("executor_id") or ""
    return f"{host} ({executor})" if executor and executor != host else str(host)

