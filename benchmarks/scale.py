"""The driver at a thousand nodes: start, steady heartbeats and shutdown against simulated agents.

    PYTHONPATH=. python benchmarks/scale.py                       # 1000 nodes, 250 per process
    PYTHONPATH=. python benchmarks/scale.py --nodes 250 --steady-seconds 5

The driver is duotf's own, in this process: a :class:`duotf._driver.cluster.Cluster` made and started as
``duotf.run`` makes and starts it (so that the benchmark holds it while it starts), with the
rendezvous server, its gate and HMAC channel, the supervisor and its heartbeat watchdog. The
nodes are simulated agents (:mod:`benchmarks.simnodes`): duotf's protocol code without a node
process or TensorFlow, several hundred per helper process.

registered : from the start (run()) to every node registered (REGISTER handled by the driver)
started    : to every node running (what run() waits for; START sent to each, RUNNING back)
steady CPU : the driver process's CPU time per second over --steady-seconds of heartbeats only
threads, RSS, sockets : the driver process's, in steady state (psutil)
TF_CONFIG  : bytes of the cluster spec JSON one node gets (and of its whole START message)
end        : from every main returning to cluster.wait() returning (RETURNED, RELEASE, DONE)
shutdown   : cluster.shutdown() after that, every thread and connection released
Goals (issue "Fast without knowing the tricks"): every node started within 5 s, steady driver
CPU below 20 % of one core, driver memory below 500 MB.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.simnodes import SimBackend  # noqa: E402
import duotf._driver.planner as planner  # noqa: E402
from duotf._driver.api import check_run_arguments  # noqa: E402
from duotf._driver.cluster import Cluster, shutdown_quietly, start  # noqa: E402
from duotf.spec import ClusterSpec  # noqa: E402
from duotf._driver.nodes import NodeState  # noqa: E402
from duotf._verbosity import node_env  # noqa: E402

GOAL_STARTED_S = 5.0
GOAL_CPU_PERCENT = 20.0
GOAL_RSS_MB = 500.0


def noop_main(args, ctx):  # never runs: the simulated nodes start no process
    return None


class _Watcher:
    """Polls the node table (every 2 ms, from its own thread) for the moment every node has
    registered and every node is ready; a waiter on the supervisor's condition would wake on
    every message and add to what is measured."""

    def __init__(self, cluster: Cluster, t0: float):
        self.cluster, self.t0 = cluster, t0
        self.registered: float = float("nan")
        self.ready: float = float("nan")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scale-watcher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        nodes = self.cluster.nodes
        while not self._stop.wait(0.002):
            states = [n.state for n in nodes]
            now = time.perf_counter() - self.t0
            if self.registered != self.registered and NodeState.PENDING not in states:
                self.registered = now
            if self.ready != self.ready and all(
                    s not in (NodeState.PENDING, NodeState.REGISTERED) for s in states):
                self.ready = now
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def driver_sockets(proc: psutil.Process) -> int:
    return len(proc.net_connections(kind="inet"))


def run_once(nodes: int, agents_per_process: int, steady_seconds: float,
             heartbeat_interval: float = None, settle: float = 2.0,
             backend: SimBackend = None, connect_threads: int = 8) -> dict:
    """One cluster of ``nodes`` simulated nodes, start to shutdown; the figures as a dict."""
    backend = backend if backend is not None else SimBackend(agents_per_process, connect_threads)
    spec, (reservation_timeout, interval, heartbeat_timeout) = check_run_arguments(
        noop_main, ClusterSpec(workers=nodes), heartbeat_interval=heartbeat_interval)
    proc = psutil.Process()
    baseline_rss = proc.memory_info().rss
    cpu_start = proc.cpu_times()
    t0 = time.perf_counter()
    # what duotf.run(noop_main, None, backend, spec) does, holding the Cluster while it starts
    cluster = Cluster(noop_main, None, backend, spec, reservation_timeout=reservation_timeout,
                      heartbeat_interval=interval, heartbeat_timeout=heartbeat_timeout,
                      env=node_env({}), default_fs=None, driver_host=None, owns_backend=False)
    watcher = _Watcher(cluster, t0)
    try:
        start(cluster)
        started = time.perf_counter() - t0
        cpu_started = proc.cpu_times()
    finally:
        watcher.stop()
    start_cpu = (cpu_started.user + cpu_started.system - cpu_start.user - cpu_start.system)
    try:
        time.sleep(settle)  # the START burst's answers are in; what follows is heartbeats only
        cpu0, w0 = proc.cpu_times(), time.perf_counter()
        time.sleep(steady_seconds)
        cpu1, w1 = proc.cpu_times(), time.perf_counter()
        now = time.monotonic()
        oldest_beat = max(now - n.last_seen for n in cluster.nodes)
        cpu = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / (w1 - w0)
        threads, rss, sockets = proc.num_threads(), proc.memory_info().rss, driver_sockets(proc)
        fds = proc.num_fds()
        sim = backend.jobs[-1]
        t1 = time.perf_counter()
        sim.release()
        failure = None
        try:
            cluster.wait(timeout=60)
        except Exception as exc:  # reported in the table: the end did not go as it should
            failure = f"{type(exc).__name__}: {str(exc)[:160]}"
        end = time.perf_counter() - t1
    except BaseException:
        shutdown_quietly(cluster)
        raise
    t2 = time.perf_counter()
    if failure is None:
        cluster.shutdown()
    else:
        shutdown_quietly(cluster, grace_secs=60.0)
    shutdown = time.perf_counter() - t2
    # the feed planner's share of a training epoch at this size: which rows each worker gets
    t3 = time.perf_counter()
    planner.balance([10_000] * (10 * nodes), nodes)
    plan = time.perf_counter() - t3
    outcomes = {o.status.value for o in cluster.supervisor.node_outcomes() or []}
    reports = sim.reports
    return {
        "nodes": nodes, "helpers": len(sim.procs), "registered": watcher.registered,
        "ready": watcher.ready, "started": started, "start_cpu": start_cpu, "cpu": cpu * 100, "threads": threads,
        "rss_mb": rss / 2**20, "rss_added_mb": (rss - baseline_rss) / 2**20, "sockets": sockets,
        "fds": fds, "oldest_beat": oldest_beat, "interval": interval,
        "tf_config": max(r["tf_config_bytes"] for r in reports),
        "start_msg": max(r["start_bytes"] for r in reports),
        "end": end, "shutdown": shutdown, "outcomes": sorted(outcomes),
        "threads_after": proc.num_threads(), "sockets_after": driver_sockets(proc),
        "failure": failure, "plan": plan, "connect_threads": backend.connect_threads,
    }


def print_table(r: dict) -> None:
    def row(what, value, goal="", ok=None):
        mark = "" if ok is None else ("  ok" if ok else "  MISSED")
        print(f"{what:<44}{value:>16}{goal:>14}{mark}")

    print(f"{r['nodes']} simulated nodes in {r['helpers']} helper processes ({r['connect_threads']} "
          f"connecting at once in each), heartbeat every {r['interval']:g} s")
    print(f"{'':<44}{'measured':>16}{'goal':>14}")
    row("run() -> every node registered", f"{r['registered']:.2f} s")
    row("run() -> every node ready", f"{r['ready']:.2f} s")
    row("run() -> every node started (RUNNING)", f"{r['started']:.2f} s",
        f"< {GOAL_STARTED_S:g} s", r["started"] < GOAL_STARTED_S)
    row("driver CPU time of the start", f"{r['start_cpu']:.2f} s")
    row("driver CPU in steady heartbeats", f"{r['cpu']:.1f} % core",
        f"< {GOAL_CPU_PERCENT:g} %", r["cpu"] < GOAL_CPU_PERCENT)
    row("driver RSS (added by the cluster)", f"{r['rss_mb']:.0f} MB ({r['rss_added_mb']:.0f})",
        f"< {GOAL_RSS_MB:g} MB", r["rss_mb"] < GOAL_RSS_MB)
    row("driver threads", f"{r['threads']}")
    row("driver open sockets (inet) / fds", f"{r['sockets']} / {r['fds']}")
    row("oldest heartbeat at the end of steady state", f"{r['oldest_beat']:.2f} s")
    row("TF_CONFIG of one node (its START message)", f"{r['tf_config']} B ({r['start_msg']} B)")
    row(f"feed plan: planner.balance, {10 * r['nodes']} partitions", f"{r['plan'] * 1000:.0f} ms")
    row("mains return -> wait() returns", f"{r['end']:.2f} s")
    row("shutdown()", f"{r['shutdown']:.2f} s")
    row("after shutdown: threads / sockets", f"{r['threads_after']} / {r['sockets_after']}")
    row("node outcomes", ",".join(r["outcomes"]))
    if r["failure"]:
        print(f"the end FAILED: {r['failure']}")


def cli() -> None:
    parser = argparse.ArgumentParser(description="duotf driver scale benchmark (simulated nodes)")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--agents-per-process", type=int, default=250)
    parser.add_argument("--steady-seconds", type=float, default=10.0)
    parser.add_argument("--connect-threads", type=int, default=8,
                        help="agents of a helper process connecting at once")
    parser.add_argument("--heartbeat-interval", type=float, default=None,
                        help="seconds between heartbeats (default: duotf's, 1 s)")
    opts = parser.parse_args()
    result = run_once(opts.nodes, opts.agents_per_process, opts.steady_seconds,
                      opts.heartbeat_interval, connect_threads=opts.connect_threads)
    print_table(result)


if __name__ == "__main__":
    cli()
