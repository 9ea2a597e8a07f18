"""Across separate hosts (an engine whose ``hosts`` is set, such as the project's network
namespaces): where nodes run, which rows cross hosts, and the faults only a network gives: a
host cut off mid-feed and mid-allreduce, and a host lost whole."""

from __future__ import annotations

import os
import threading
import time

import psutil
import pytest

import duotf
from duotf.testing import poll_for, shutdown_quietly
from duotf.testing.suite import mains

pytestmark = pytest.mark.engines("spark-hosts", "dask-hosts")

#: the heartbeat timeout of the fault tests: the driver names a cut-off host within it and a
#: few seconds, and the nodes on that host end within it of losing their driver
HEARTBEAT_TIMEOUT = 4.0
#: what the tests allow beyond it: the watchdog's and the kernel's reaction, a loaded machine
SLACK = 4.0


def _host_rows(engine, parts: int = 6, rows: int = 40):
    return engine.row_sources([mains.HostRows(p * rows, (p + 1) * rows) for p in range(parts)])


def test_nodes_run_one_per_host_and_the_report_counts_the_rows_that_crossed(backend, engine):
    with duotf.run(mains.host_rows_main, {"batch": 8}, backend, duotf.ClusterSpec(workers=2)) as cluster:
        hosts = [engine.hosts.host_of(node.pid) for node in cluster.nodes]
        report = cluster.train(_host_rows(engine), epochs=2)
        results = cluster.wait()
    assert sorted(hosts) == [0, 1], hosts  # one node a host
    assert sorted(r["host"] for r in results) == sorted(engine.hosts.hostnames)
    assert sum(r["rows"] for r in results) == report["rows_fed"] == 2 * 6 * 40
    # what the nodes saw made on another host is what the report says crossed
    assert report["rows_across_hosts"] == sum(r["across"] for r in results)


def _cut_when_started(engine, folder: str, host: int, node: int, when: list) -> threading.Thread:
    def cut():
        poll_for(lambda: os.path.exists(os.path.join(folder, f"node-{node}")), 120,
                 what=f"node {node}'s first step")
        when.append(time.monotonic())
        engine.hosts.cut(host)

    thread = threading.Thread(target=cut, name="test-cut")
    thread.start()
    return thread


def _check_cut(engine, cluster, run, tmp_path):
    """Cut the host of node 1 once it has begun (``run()`` raises then): the error names the
    host within the heartbeat timeout and some slack, and node 1's process is gone within the
    heartbeat timeout (and slack) of the cut, before the link comes back (its agent, in the
    engine's task, runs in a process the engine keeps: a Dask worker, a Spark Python worker)."""
    victim = cluster.nodes[1]
    host = engine.hosts.host_of(victim.pid)
    processes = [psutil.Process(victim.pid)]
    when: list = []
    cutter = _cut_when_started(engine, str(tmp_path), host, 1, when)
    try:
        with pytest.raises(duotf.DuotfError) as info:
            run()
        failed = time.monotonic()
        cutter.join()
        assert failed - when[0] <= HEARTBEAT_TIMEOUT + SLACK, failed - when[0]
        assert victim.host in str(info.value) and "worker:1" in str(info.value), str(info.value)
        psutil.wait_procs(processes, timeout=max(when[0] + HEARTBEAT_TIMEOUT + SLACK - time.monotonic(), 0))
        alive = [p.pid for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not alive, f"still running {time.monotonic() - when[0]:.1f} s after the cut: {alive}"
    finally:
        cutter.join()
        engine.hosts.restore(host)
        shutdown_quietly(cluster)
    return info.value


def test_a_host_cut_off_mid_feed_is_named_and_its_node_ends(backend, engine, tmp_path):
    args = {"batch": 4, "started": str(tmp_path), "pause": 0.05}
    cluster = duotf.run(mains.host_rows_main, args, backend, duotf.ClusterSpec(workers=2),
                        heartbeat_interval=0.5, heartbeat_timeout=HEARTBEAT_TIMEOUT)
    data = _host_rows(engine, rows=2000)
    error = _check_cut(engine, cluster, lambda: cluster.train(data, epochs=50), tmp_path)
    assert isinstance(error, (duotf.NodeUnresponsiveError, duotf.FeedError)), repr(error)


def test_a_host_cut_off_mid_allreduce_is_named_and_its_node_ends(backend, engine, tmp_path):
    cluster = duotf.run(mains.allreduce_main, {"started": str(tmp_path)}, backend,
                        duotf.ClusterSpec(workers=2), heartbeat_interval=0.5,
                        heartbeat_timeout=HEARTBEAT_TIMEOUT)
    error = _check_cut(engine, cluster, cluster.wait, tmp_path)
    assert isinstance(error, duotf.NodeUnresponsiveError), repr(error)


def test_a_host_lost_whole_is_named_and_the_cluster_runs_again_once_it_is_back(backend, engine, tmp_path):
    args = {"batch": 4, "started": str(tmp_path), "pause": 0.05}
    cluster = duotf.run(mains.host_rows_main, args, backend, duotf.ClusterSpec(workers=2),
                        heartbeat_interval=0.5, heartbeat_timeout=HEARTBEAT_TIMEOUT)
    victim = cluster.nodes[1]
    host = engine.hosts.host_of(victim.pid)
    slots = backend.slots()
    try:
        killer = threading.Thread(target=lambda: (
            poll_for(lambda: os.path.exists(tmp_path / "node-1"), 120, what="node 1's first batch"),
            engine.hosts.kill(host)), name="test-kill")
        killer.start()
        t0 = time.monotonic()
        with pytest.raises(duotf.DuotfError) as info:
            cluster.train(_host_rows(engine, rows=2000), epochs=50)
        killer.join()
        assert time.monotonic() - t0 <= 120
        assert victim.host in str(info.value) and "worker:1" in str(info.value), str(info.value)
    finally:
        killer.join()
        shutdown_quietly(cluster)
        engine.hosts.revive(host)
    poll_for(lambda: backend.slots() >= slots, 120, 0.2, "the revived host's engine worker")
    # the host back (its engine worker restarted): a new cluster runs and is fed every row
    with duotf.run(mains.host_rows_main, {"batch": 8}, backend, duotf.ClusterSpec(workers=2)) as again:
        report = again.train(_host_rows(engine), epochs=1)
        results = again.wait()
    assert sum(r["rows"] for r in results) == report["rows_fed"] == 6 * 40


def _engine_back(engine, backend, host: int, slots: int) -> None:
    """After host ``host`` is restored: the engine's slots as many as before. Spark's worker
    there starts an executor again; a Dask worker that lost its scheduler closed itself, and is
    started again as a machine's service manager would."""
    try:
        poll_for(lambda: backend.slots() >= slots, 8, 0.5, "the engine's slots on the restored host")
    except AssertionError:
        engine.hosts.kill(host)
        engine.hosts.revive(host)
        poll_for(lambda: backend.slots() >= slots, 120, 0.5, "the engine's slots on the revived host")


def test_with_restarts_a_job_cut_off_from_its_host_finishes_on_the_hosts_left(backend, engine, tmp_path, caplog):
    # One node: its host is cut off mid-feed (and stays cut), so the restarted node must run on
    # the other host, which the engine alone would not ensure: Spark keeps offering a silent
    # executor until spark.network.timeout (120 s), Dask a silent worker until its worker-ttl
    args = {"batch": 4, "started": str(tmp_path), "pause": 0.01}
    cluster = duotf.run(mains.host_rows_main, args, backend, duotf.ClusterSpec(workers=1),
                        heartbeat_interval=0.5, heartbeat_timeout=HEARTBEAT_TIMEOUT, max_restarts=1)
    host, ip = engine.hosts.host_of(cluster.nodes[0].pid), cluster.nodes[0].host
    slots = backend.slots()
    cutter = _cut_when_started(engine, str(tmp_path), host, 0, [])
    try:
        report = cluster.train(_host_rows(engine, rows=100), epochs=1, feed_timeout=120)
        again = engine.hosts.host_of(cluster.nodes[0].pid)
        results = cluster.wait(timeout=120)
    finally:
        cutter.join()
        engine.hosts.restore(host)
        shutdown_quietly(cluster)
        _engine_back(engine, backend, host, slots)
    assert [r.cause for r in cluster.restarts] in (["hung"], ["lost"]), cluster.restarts
    assert again != host, "the restarted node ran on the host cut off"
    assert f"host {ip} does not answer" in caplog.text  # duotf kept the restarted node off it
    # the restarted attempt fed its epoch whole (no checkpoint: it resumed at epoch 0)
    assert sum(r["rows"] for r in results) == report["rows_fed"] == 6 * 100
