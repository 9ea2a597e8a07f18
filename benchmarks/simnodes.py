"""Simulated node agents, and a benchmark-only backend that starts them: the driver at scale.

A simulated agent speaks duotf's real rendezvous protocol, with duotf's own code
(:func:`duotf._transport.rendezvous.connect`, :class:`~duotf._transport.rendezvous.Channel`, :class:`~duotf._transport.rendezvous.Msg`):
it authenticates at the driver's gate, sends ``REGISTER`` and ``READY``, a ``HEARTBEAT`` every
``heartbeat_interval``, ``RUNNING`` once it gets ``START`` (it keeps the size of the TF_CONFIG it
got), ``RETURNED`` when its "main" returns, ``DONE`` when released, ``STOPPED`` when stopped. It
starts no node process and no TensorFlow: several hundred agents share one helper process, on
one thread with a selector (and a few threads that only connect), so 1,000 fit on 2 cores.

:class:`SimBackend` is the engine: ``start_nodes`` starts the helper processes, each with a
share of the node ids, and hands them what a real agent gets (the driver's address, the job's
secret and id, the heartbeat interval), as a JSON line on their stdin (never on a command line).
Its :meth:`SimJob.release` makes every "main" return; closing a helper's stdin ends its agents
the way an engine's cancel ends real ones.

The seam: a backend's ``start_nodes(fn, n, job_id)`` gets only an opaque node function (the
driver passes ``functools.partial(duotf._node.agent.run_node, job)``), so this backend reads the
:class:`~duotf._node.agent.NodeJob` out of that partial (:func:`node_job_of`) instead of calling it.
"""

from __future__ import annotations

import functools
import heapq
import json
import os
import queue
import selectors
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional

from duotf._transport import rendezvous
from duotf.backends import Backend, ThreadJob
from duotf._node.agent import NodeJob, NodeOutcome, OutcomeStatus, run_node
from duotf._transport.rendezvous import Msg

__all__ = ["SimBackend", "SimJob", "node_job_of", "helper_main"]


def node_job_of(fn) -> NodeJob:
    """The :class:`NodeJob` inside the node function the driver hands ``start_nodes``."""
    while isinstance(fn, functools.partial):
        if fn.func is run_node and fn.args and isinstance(fn.args[0], NodeJob):
            return fn.args[0]
        fn = fn.func
    raise TypeError(f"not duotf's node function (functools.partial(run_node, job)): {fn!r}")


# -- the driver's side: the backend -------------------------------------------------------------
class SimJob(ThreadJob):
    """The helper processes running the simulated agents; its result: one NodeOutcome a node."""

    def __init__(self, procs: List[subprocess.Popen], n: int):
        self.procs = procs
        self.n = n
        self.reports: List[dict] = []  # each helper's last line: outcomes and what it counted
        self._stdin_lock = threading.Lock()
        super().__init__(self._collect, self._cancel, name="sim")

    def _collect(self) -> List[NodeOutcome]:
        outcomes: Dict[int, NodeOutcome] = {}
        try:
            for proc in self.procs:
                out = proc.stdout.read()  # until the helper exits (its agents all ended)
                proc.wait()
                if proc.returncode != 0 or not out.strip():
                    raise RuntimeError(f"simulated-agent helper {proc.pid} exited with "
                                       f"{proc.returncode} without its report")
                report = json.loads(out.decode().strip().splitlines()[-1])
                self.reports.append(report)
                for node_id, status in report["outcomes"]:
                    outcomes[node_id] = NodeOutcome(node_id, OutcomeStatus(status))
        finally:
            self._close_pipes()
        return [outcomes[i] for i in sorted(outcomes)]

    def _write(self, line: str) -> None:
        with self._stdin_lock:
            for proc in self.procs:
                try:
                    proc.stdin.write(line.encode() + b"\n")
                    proc.stdin.flush()
                except (OSError, ValueError):  # gone, or closed by cancel
                    pass

    def release(self) -> None:
        """Every simulated main returns now (each node sends RETURNED)."""
        self._write("return")

    def _cancel(self) -> None:
        """End the agents as an engine's cancel does: close the helpers' stdin (each closes its
        connections and exits), kill what is left after a few seconds."""
        with self._stdin_lock:
            for proc in self.procs:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
        deadline = time.monotonic() + 5
        for proc in self.procs:
            try:
                proc.wait(max(deadline - time.monotonic(), 0))
            except subprocess.TimeoutExpired:
                proc.kill()

    def _close_pipes(self) -> None:
        with self._stdin_lock:
            for proc in self.procs:
                for pipe in (proc.stdin, proc.stdout):
                    try:
                        pipe.close()
                    except OSError:
                        pass


class SimBackend(Backend):
    """Starts ``n`` simulated agents in helper processes of ``agents_per_process`` agents each."""

    name = "sim"

    def __init__(self, agents_per_process: int = 250, connect_threads: int = 8):
        self.agents_per_process = max(1, int(agents_per_process))
        self.connect_threads = connect_threads
        self.jobs: List[SimJob] = []

    def slots(self) -> int:
        return 1 << 20

    def start_nodes(self, fn, n: int, job_id: str, gpus_per_node: int = 0,
                    names=None) -> SimJob:
        job = node_job_of(fn)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        procs = []
        try:
            for first in range(0, n, self.agents_per_process):
                node_ids = list(range(first, min(first + self.agents_per_process, n)))
                proc = subprocess.Popen([sys.executable, "-m", "benchmarks.simnodes"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
                procs.append(proc)
                config = {
                    "address": list(job.driver_address), "secret": job.secret.hex(),
                    "job_id": job.job_id, "node_ids": node_ids,
                    "heartbeat_interval": job.heartbeat_interval,
                    "connect_timeout": job.connect_timeout,
                    "connect_threads": self.connect_threads,
                }
                proc.stdin.write(json.dumps(config).encode() + b"\n")
                proc.stdin.flush()
        except BaseException:
            for proc in procs:
                proc.kill()
                proc.wait()
            raise
        sim = SimJob(procs, n)
        self.jobs.append(sim)
        return sim


# -- a helper process: hundreds of agents on one selector loop ------------------------------------
class _Agent:
    __slots__ = ("node_id", "channel", "state", "outcome", "beats")

    def __init__(self, node_id: int, channel: rendezvous.Channel):
        self.node_id = node_id
        self.channel = channel
        self.state = "ready"
        self.outcome: Optional[str] = None
        self.beats = 0

    def send(self, type_: Msg, **fields) -> None:
        try:
            self.channel.send({"type": type_, "node_id": self.node_id, **fields})
        except OSError:
            pass  # the driver closed it: its recv says so


class _Helper:
    def __init__(self, config: dict):
        self.config = config
        self.address = tuple(config["address"])
        self.secret = bytes.fromhex(config["secret"])
        self.interval = float(config["heartbeat_interval"])
        self.node_ids = config["node_ids"]
        self.agents: Dict[int, _Agent] = {}
        self.outcomes: Dict[int, str] = {}
        self.tf_config_bytes = 0
        self.start_bytes = 0
        self.beats = 0
        self.selector = selectors.DefaultSelector()
        self.arrived: "queue.Queue[tuple]" = queue.Queue()
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        os.set_blocking(0, False)
        self.selector.register(0, selectors.EVENT_READ, "control")
        self.control = b""
        self.returning = False
        self.cancelled = False
        self.beat_heap: list = []

    # connecting threads: what a real agent does before its loop
    def _connect(self, node_id: int) -> None:
        try:
            channel = rendezvous.connect(self.address, self.secret, self.config["connect_timeout"])
            host = channel.sock.getsockname()[0]
            agent = _Agent(node_id, channel)
            agent.send(Msg.REGISTER, host=host, port=20000 + node_id, pid=os.getpid(),
                       agent_pid=os.getpid(), executor_id=f"sim-{os.getpid()}", attempt=0, gpus=[])
            agent.send(Msg.READY, feed_port=40000 + node_id)
            self.arrived.put((node_id, agent))
        except Exception as exc:  # could not connect: the driver's reservation timeout says so
            print(f"simulated node {node_id}: {type(exc).__name__}: {exc}", file=sys.stderr)
            self.arrived.put((node_id, None))
        try:
            self.wake_w.send(b"x")
        except OSError:
            pass

    def run(self) -> dict:
        pool = ThreadPoolExecutor(self.config.get("connect_threads", 8),
                                  thread_name_prefix="sim-connect")
        for node_id in self.node_ids:
            pool.submit(self._connect, node_id)
        pool.shutdown(wait=False)
        connecting = len(self.node_ids)
        while connecting or self.agents:
            timeout = None
            if self.beat_heap:
                timeout = max(self.beat_heap[0][0] - time.monotonic(), 0)
            for key, _ in self.selector.select(timeout):
                if key.data == "wake":
                    try:
                        self.wake_r.recv(4096)
                    except BlockingIOError:
                        pass
                    while True:
                        try:
                            node_id, agent = self.arrived.get_nowait()
                        except queue.Empty:
                            break
                        connecting -= 1
                        if agent is None:
                            self.outcomes[node_id] = OutcomeStatus.FAILED.value
                        elif self.cancelled:
                            self._end(agent, OutcomeStatus.STOPPED)
                        else:
                            self.agents[node_id] = agent
                            self.selector.register(agent.channel.sock, selectors.EVENT_READ, agent)
                            heapq.heappush(self.beat_heap, (time.monotonic(), node_id))
                elif key.data == "control":
                    self._control()
                elif isinstance(key.data, _Agent) and key.data.node_id in self.agents:
                    self._from_driver(key.data)
            now = time.monotonic()
            while self.beat_heap and self.beat_heap[0][0] <= now:
                due, node_id = heapq.heappop(self.beat_heap)
                agent = self.agents.get(node_id)
                if agent is None:
                    continue
                agent.send(Msg.HEARTBEAT)
                self.beats += 1
                # on schedule, not drifting; a loop that fell far behind skips missed beats
                heapq.heappush(self.beat_heap, (max(due + self.interval, now), node_id))
        pool.shutdown(wait=True)
        self.selector.close()
        self.wake_r.close()
        self.wake_w.close()
        return {"outcomes": sorted(self.outcomes.items()), "tf_config_bytes": self.tf_config_bytes,
                "start_bytes": self.start_bytes, "heartbeats": self.beats}

    def _control(self) -> None:
        try:
            data = os.read(0, 4096)
        except BlockingIOError:
            return
        if not data:  # the backend cancelled: end every agent as its driver-eof would
            self.cancelled = True
            self.selector.unregister(0)
            for agent in list(self.agents.values()):
                self._end(agent, OutcomeStatus.STOPPED)
            return
        self.control += data
        while b"\n" in self.control:
            line, self.control = self.control.split(b"\n", 1)
            if line.strip() == b"return":
                self.returning = True
                for agent in self.agents.values():
                    if agent.state == "running":
                        agent.state = "returned"
                        agent.send(Msg.RETURNED)

    def _from_driver(self, agent: _Agent) -> None:
        try:
            # One frame, read with duotf's own Channel (its HMAC and sequence checks); the rest
            # of a frame that arrived in pieces is waited for here.
            message = agent.channel.recv()
        except (ConnectionError, OSError):  # the driver closed it: a real agent stops its node
            self._end(agent, OutcomeStatus.STOPPED)
            return
        type_ = message["type"]
        if type_ == Msg.START:
            self.tf_config_bytes = max(self.tf_config_bytes, len(json.dumps(message["tf_config"])))
            self.start_bytes = max(self.start_bytes, len(json.dumps(message)))
            agent.state = "running"
            agent.send(Msg.RUNNING)
            if self.returning:
                agent.state = "returned"
                agent.send(Msg.RETURNED)
        elif type_ == Msg.RELEASE:
            agent.send(Msg.DONE)
            self._end(agent, OutcomeStatus.DONE)
        elif type_ == Msg.STOP:
            agent.send(Msg.STOPPED, exitcode=-15)
            self._end(agent, OutcomeStatus.STOPPED)
        elif type_ == Msg.REJECT:
            self._end(agent, OutcomeStatus.REJECTED)

    def _end(self, agent: _Agent, status: OutcomeStatus) -> None:
        self.outcomes[agent.node_id] = status.value
        if self.agents.pop(agent.node_id, None) is not None:
            self.selector.unregister(agent.channel.sock)
        agent.channel.close()


def _read_config() -> dict:
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(0, 1)  # byte by byte: what follows the line stays in the pipe
        if not chunk:
            raise SystemExit("simulated-agent helper: no configuration on stdin")
        line += chunk
    return json.loads(line)


def helper_main() -> None:
    report = _Helper(_read_config()).run()
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    helper_main()
