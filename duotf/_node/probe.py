"""The doctor's probe: what runs inside an engine task for :func:`duotf.doctor`.

Every backend starts it the way it starts node agents (``Backend.start_nodes``, one task per
slot, as a gang), so it stands where a node's agent would stand and sees what a node would see.
A probe:

1. notes the engine task's own Python and packages (``pyspark``, ``distributed``, duotf);
2. listens on a port of every interface, as a node's TensorFlow server does;
3. connects to the driver's rendezvous server with the job's secret (the driver's port,
   reachable or not), registers its address, and gets every other probe's address back; it
   connects to each of them (the node ports between executors) and to the ``reach``
   addresses, says "done" and waits for "stop", so that its port stays open while the others
   connect to it;
4. on the first probe of each executor only (the driver says which), runs
   ``python -m duotf._node.probe`` as the node process would run (:func:`duotf._node.agent.node_environment`:
   the job's ``env`` and PYTHONPATH): the Python version, duotf's, TensorFlow's (imported),
   whether that TensorFlow serves the protocol, ``/dev/shm``, and a file written, read back and
   removed on the filesystem to check.

The report goes back as the engine task's result (a :class:`~duotf._node.agent.NodeOutcome` whose
payload is JSON), so a probe that cannot reach the driver still reports why. Nothing here
raises: every failure is a finding.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import platform
import socket
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from duotf._transport import ports, rendezvous
from duotf.errors import ConfigError
from duotf._node.agent import NodeOutcome, OutcomeStatus, node_environment
from duotf._transport.rendezvous import Msg

#: seconds a probe's connection to one address may take before it counts as unreachable
CONNECT_TIMEOUT = 3.0
#: seconds the node-process checks may take (importing TensorFlow on a busy executor)
NODE_CHECK_TIMEOUT = 180.0
#: the engine-side packages whose versions must match the driver's
ENGINE_PACKAGES = ("pyspark", "distributed")
#: what the feed reads data with, beside the engine: the same on the driver and every executor
DATA_PACKAGES = ("pyarrow", "pandas")


@dataclasses.dataclass(frozen=True)
class ProbeJob:
    """What every probe needs; shipped to the engine's tasks by the engine itself."""

    job_id: str
    driver_address: Tuple[str, int]
    secret: bytes
    connect_timeout: float
    exchange_timeout: float  # seconds to wait for the driver's answers once connected
    protocol: str
    env: Dict[str, str]
    url: Optional[str]  # the folder to write a file into and read it back; None: see fs_folder
    default_fs: str = "file://"
    reach: Tuple[Tuple[str, int], ...] = ()


def _versions_here() -> dict:
    from duotf._version import __version__

    found: Dict[str, Any] = {
             "python": platform.python_version(), "executable": sys.executable,
             "duotf": __version__, "duotf_path": os.path.dirname(os.path.abspath(__file__))}
    for name in ENGINE_PACKAGES:
        module = sys.modules.get(name)
        if module is not None:
            found[name] = getattr(module, "__version__", "?")
    for name in DATA_PACKAGES:  # the installed version: importing them costs the task seconds
        found[name] = _installed(name)
    return found


def _installed(distribution: str) -> Optional[str]:
    """The installed version of ``distribution`` (None: not installed), read without importing it."""
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def try_connect(address: Tuple[str, int], timeout: float = CONNECT_TIMEOUT) -> Optional[str]:
    """None when a TCP connection to ``address`` opens within ``timeout``, else why not."""
    try:
        with socket.create_connection(address, timeout=timeout):
            return None
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _connect_all(addresses: List[Tuple[str, int]]) -> Dict[str, Optional[str]]:
    if not addresses:
        return {}
    with concurrent.futures.ThreadPoolExecutor(min(len(addresses), 16),
                                               thread_name_prefix="duotf-probe-connect") as pool:
        errors = list(pool.map(try_connect, addresses))
    return {f"{h}:{p}": e for (h, p), e in zip(addresses, errors)}


def _recv(channel: rendezvous.Channel, kind: Msg) -> dict:
    while True:
        message = channel.recv()
        if message["type"] == kind:
            return message


def run_probe(job: ProbeJob, node_id: int, executor_id: str = "", attempt: int = 0) -> NodeOutcome:
    """Probe this engine task's place; the report is the outcome's JSON payload."""
    report: dict = {"node_id": node_id, "executor_id": executor_id, "hostname": socket.gethostname(),
                    "engine": _versions_here(), "driver_error": None, "peers": None}
    lead = True
    env = {**os.environ, **job.env}
    report["ports"] = env.get(ports.PORTS_ENV)  # the range this task's nodes would listen in
    report["bind"] = env.get(ports.BIND_ENV)  # and the address they would listen on
    try:
        report["bind_address"] = ports.bind_address(env)
    except ConfigError as exc:  # none of this host's: said, and the rest checked
        report["bind_error"] = str(exc)
        env = {k: v for k, v in env.items() if k != ports.BIND_ENV}
    try:
        listener = ports.create_server("0.0.0.0", backlog=128, what="the doctor's probe", env=env)
    except ConfigError as exc:  # a range malformed, or full here: said, and the rest checked
        report["ports_error"] = str(exc)
        listener = socket.create_server(("0.0.0.0", 0), backlog=128)
    channel = None
    try:
        try:
            channel = rendezvous.connect(job.driver_address, job.secret, job.connect_timeout)
        except (OSError, ConnectionError) as exc:
            report["driver_error"] = str(exc)
        if channel is not None:
            try:
                channel.sock.settimeout(job.exchange_timeout)
                # the address the driver reached us from, or the one DUOTF_BIND picks
                host = report.get("bind_address") or channel.sock.getsockname()[0]
                report["host"] = host
                channel.send({"type": Msg.REGISTER, "node_id": node_id, "host": host,
                              "port": listener.getsockname()[1], "executor_id": executor_id})
                start = _recv(channel, Msg.START)
                lead = bool(start.get("lead", True))
                peers = [(h, p) for i, h, p in start["peers"] if i != node_id]
                report["peers"] = _connect_all(peers)
                channel.send({"type": Msg.DONE, "node_id": node_id})
                _recv(channel, Msg.STOP)  # the others are done connecting to this port
            except (OSError, ConnectionError) as exc:
                report["exchange_error"] = f"{type(exc).__name__}: {exc}"
    finally:
        listener.close()
        if channel is not None:
            channel.close()
    report["reach"] = _connect_all(list(job.reach))
    report["lead"] = lead
    if lead:
        report["node"] = _node_checks(job, node_id)
    return NodeOutcome(node_id, OutcomeStatus.DONE, json.dumps(report).encode())


def fs_folder(job: ProbeJob) -> str:
    """Where the filesystem check writes: ``job.url``, else where a node's relative paths go
    (``ctx.absolute_path``): the temporary folder on a local default filesystem, the user's
    home on a remote one."""
    if job.url:
        return job.url
    default = job.default_fs.rstrip("/")
    if default in ("", "file:", "file://"):
        import tempfile

        return tempfile.gettempdir()
    import getpass

    return f"{default}/user/{getpass.getuser()}"


def _node_checks(job: ProbeJob, node_id: int) -> dict:
    """Run this module as a node process would run; its findings, or why it could not run."""
    fs_file = fs_folder(job).rstrip("/") + f"/duotf-doctor-{job.job_id}-{node_id}.tmp"
    command = [sys.executable, "-m", "duotf._node.probe", job.protocol, fs_file]
    try:
        out = subprocess.run(command, env=node_environment(job.env), capture_output=True,
                             text=True, timeout=NODE_CHECK_TIMEOUT, start_new_session=True)
    except subprocess.TimeoutExpired:
        return {"error": f"the node process checks took more than {NODE_CHECK_TIMEOUT:g} s"}
    except OSError as exc:
        return {"error": f"could not start {sys.executable}: {exc}"}
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        tail = "\n".join(out.stderr.strip().splitlines()[-5:])
        return {"error": f"{' '.join(command[:3])} exited with {out.returncode}: {tail}"}
    for line in reversed(lines):  # the findings are the last JSON line; TF may print too
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict):
            return found
    return {"error": f"{' '.join(command[:3])} printed no findings: {lines[-1][:200]}"}


# -- the node process side ---------------------------------------------------------------------
def _tensorflow(protocol: str) -> dict:
    try:
        import tensorflow as tf
    except BaseException as exc:  # a broken install can raise anything, SystemExit included
        return {"tensorflow": None, "tensorflow_error": f"{type(exc).__name__}: {exc}"}
    found = {"tensorflow": getattr(tf, "__version__", "?"),
             "tensorflow_path": os.path.dirname(getattr(tf, "__file__", "") or ""),
             "keras": _installed("keras")}
    try:
        from duotf._node.child import check_protocol

        error = check_protocol(protocol)
        found["protocol_error"] = None if error is None else error["message"]
    except BaseException as exc:  # not TensorFlow's "no such protocol": a broken TensorFlow
        found["protocol_error"] = f"{type(exc).__name__}: {exc}"
        found["tensorflow_broken"] = True
    return found


def _shm() -> Optional[dict]:
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return {"total": st.f_blocks * st.f_frsize, "free": st.f_bavail * st.f_frsize}


def _filesystem(url: str) -> dict:
    from duotf.io.files import filesystem, open_url

    data = f"duotf doctor {os.getpid()} {time.time()}".encode()
    step = "write"
    try:
        with open_url(url, "wb") as f:
            f.write(data)
        step = "read"
        with open_url(url, "rb") as f:
            back = f.read()
        if back != data:
            return {"url": url, "error": f"read back {len(back)} bytes that differ from the "
                                        f"{len(data)} written"}
        step = "remove"
        fs, path = filesystem(url)
        fs.rm_file(path)
    except BaseException as exc:
        return {"url": url, "error": f"{step}: {type(exc).__name__}: {exc}"}
    return {"url": url, "error": None}


def node_main(argv: List[str]) -> int:
    from duotf._version import __version__

    protocol, fs_file = argv[1], argv[2]
    found: Dict[str, Any] = {
             "python": platform.python_version(), "executable": sys.executable,
             "duotf": __version__, "duotf_path": os.path.dirname(os.path.abspath(__file__)),
             "shm": _shm(), "fs": _filesystem(fs_file)}
    found.update(_tensorflow(protocol))
    sys.stdout.write("\n" + json.dumps(found) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(node_main(sys.argv))
