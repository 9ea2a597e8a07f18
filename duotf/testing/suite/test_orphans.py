"""What is gone, and how fast, after a failure: no node outlives its supervision, the driver's
port closes with the failure, and shutdown does not wait for tasks that cannot end.

Each test prints its figures (``-s`` shows them); docs/internals/how-it-works.md
("Failures: what is gone, and how fast") quotes them.
"""

from __future__ import annotations

import os
import signal
import socket
import time

import psutil
import pytest

import duotf
import duotf._driver.supervisor
from duotf.testing import poll_for, shutdown_quietly
from duotf.testing.suite import mains

HEARTBEAT = dict(heartbeat_interval=0.5, heartbeat_timeout=3)


def _node_processes(job_id: str, node_id: int) -> list:
    """The live (not zombie) processes of one node of one job, by the tags the agent puts in
    the node's environment: the node process and anything it started."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            env = proc.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if env.get("DUOTF_JOB_ID") == job_id and env.get("DUOTF_NODE_ID") == str(node_id):
            found.append(proc)
    return found


def job_folders(job_id: str) -> list:
    """The working folders of a job's attempts left on this host (``<tmp>/duotf-<job id>``,
    ``...-1``, ...: its nodes' working directories, duotf's own log_dir)."""
    import glob
    import tempfile

    root = os.path.join(tempfile.gettempdir(), f"duotf-{job_id}")
    return [p for p in glob.glob(root + "*") if p == root or p[len(root):].lstrip("-").isdigit()]


def node_folder(job_id: str, node_id: int) -> str:
    """Node ``node_id``'s working directory in the job's first attempt (on this host)."""
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"duotf-{job_id}", f"node-{node_id}")


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except ConnectionRefusedError:
        return True
    except (ConnectionResetError, TimeoutError):
        # still listening a moment ago: the connection was queued, then reset as the dying
        # process closed the socket (seen in CI), or never answered; not refused yet: ask again
        return False
    return False


def _bindable(port: int) -> bool:
    """Whether another program could take ``port`` now (the agent's reservation is released)."""
    with socket.socket() as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _figures(name: str, **values: float) -> None:
    print(f"\n[figures] {name}: " + ", ".join(f"{k}={v:.2f} s" for k, v in values.items()))


@pytest.mark.engines("procpool", "dask", "spark-local", "spark-standalone", "spark-connect")
@pytest.mark.parametrize("ender", ["node", "driver"])
def test_a_stalled_engine_task_leaves_no_node_behind(backend, engine, tmp_path, monkeypatch, ender):
    """SIGSTOP of the process running node 1's engine task (a pool worker, the Dask worker, the
    Spark Python worker): the driver gives the node up, and the node process is gone within
    heartbeat_timeout; resumed, the task ends and starts nothing.

    ``ender="node"``: the node process ends itself (its agent's pings stopped), the driver's
    kill of a node on its own host switched off, as for a node on another host.
    ``ender="driver"``: the driver kills it too (every engine here runs on the driver's host).
    """
    if ender == "node":
        monkeypatch.setattr(duotf._driver.supervisor, "kill_node_process", lambda *args: False)
    cluster = duotf.run(mains.block_main, {"release": str(tmp_path / "never")}, backend,
                        duotf.ClusterSpec(workers=2), **HEARTBEAT)
    victim = cluster.nodes[1]
    agent = psutil.Process(victim.agent_pid)
    assert agent.pid not in (os.getpid(), victim.pid)
    assert [p.pid for p in _node_processes(cluster.job_id, 1)] == [victim.pid]
    stalled = False
    try:
        agent.send_signal(signal.SIGSTOP)
        stalled = True
        t0 = time.monotonic()
        with pytest.raises(duotf.NodeUnresponsiveError) as info:
            cluster.wait(timeout=60)
        detected = time.monotonic() - t0
        assert info.value.node_id == 1 and "heartbeat_timeout=3" in str(info.value)
        # Gone means its ports closed too: a killed process's leader shows as a zombie while
        # its other threads are still exiting and its sockets still open (CI saw the feed
        # port accept in that window).
        # And free: the TF port's reservation went with the node process, not with its (still
        # stalled) engine task.
        poll_for(lambda: (not _node_processes(cluster.job_id, 1) and _refused(victim.feed_port)
                          and _refused(victim.port) and _bindable(victim.port)), 3 + 5, 0.1,
                 "the stalled task's node process gone and its ports closed and free")
        gone = time.monotonic() - t0
        if ender == "node":
            # the node process that ended itself removed its working directory: its agent
            # (still stalled) cannot, and the driver may be on another host
            poll_for(lambda: not os.path.exists(node_folder(cluster.job_id, 1)), 5, 0.1,
                     "the node's working directory removed by the node process that ended itself")
        t1 = time.monotonic()
        shutdown_quietly(cluster)
        shutdown = time.monotonic() - t1

        try:
            agent.send_signal(signal.SIGCONT)  # the engine may have killed it by now (Spark)
        except psutil.NoSuchProcess:
            pass
        stalled = False
        # The agent, resumed, ends its task: its port reservation goes with it.
        poll_for(lambda: _bindable(victim.port), 30, 0.1, "the resumed agent's port released")
        assert not _node_processes(cluster.job_id, 1), "a node came back after SIGCONT"
        assert not _node_processes(cluster.job_id, 0)
        poll_for(lambda: not job_folders(cluster.job_id), 10, 0.1, "the job's working folders removed")
    finally:
        if stalled:
            try:
                agent.send_signal(signal.SIGCONT)
            except psutil.NoSuchProcess:
                pass
        shutdown_quietly(cluster)
    kind = engine.__class__.__name__.replace("Engine", "")
    _figures(f"stalled task ({kind}, node ended by the {ender})", detected=detected, node_gone=gone,
             shutdown=shutdown)
    assert detected < 3 + 5 and gone < 3 + 5 and shutdown < 5

    # The engine runs the next cluster (a Spark Python worker killed while stopped is replaced).
    release = tmp_path / "release"
    release.touch()
    with duotf.run(mains.block_main, {"release": str(release)}, backend,
                   duotf.ClusterSpec(workers=2)) as again:
        assert again.wait(timeout=120) == [0, 1]


def test_a_failure_closes_the_rendezvous_port_before_it_is_raised(backend, engine, tmp_path):
    cluster = duotf.run(mains.block_main, {"release": str(tmp_path / "never")}, backend,
                        duotf.ClusterSpec(workers=2))
    port = cluster.supervisor.server.address[1]
    try:
        os.kill(cluster.nodes[0].pid, signal.SIGKILL)
        with pytest.raises(duotf.NodeFailedError):
            cluster.wait(timeout=60)
        assert _refused(port)
        t0 = time.monotonic()
        shutdown_quietly(cluster)
        shutdown = time.monotonic() - t0
    finally:
        shutdown_quietly(cluster)
    _figures(f"node killed ({engine.__class__.__name__.replace('Engine', '')})", shutdown=shutdown)
    assert shutdown < 5


@pytest.mark.engines("dask")
def test_a_lost_dask_worker_closes_the_port_and_shutdown_is_quick(backend, engine, tmp_path):
    """SIGKILL of the Dask worker process running node 1 (its nanny starts a new one)."""
    client = engine.client
    workers = len(client.nthreads())
    cluster = duotf.run(mains.block_main, {"release": str(tmp_path / "never")}, backend,
                        duotf.ClusterSpec(workers=2))
    port = cluster.supervisor.server.address[1]
    victim = cluster.nodes[1]
    try:
        assert victim.agent_pid in client.run(os.getpid).values()
        os.kill(victim.agent_pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(duotf.NodeFailedError) as info:
            cluster.wait(timeout=60)
        detected = time.monotonic() - t0
        assert _refused(port), "the rendezvous port is still open after the failure was raised"
        assert "worker:1" in str(info.value)
        # the node process, its agent gone with the worker, removed its working directory
        poll_for(lambda: not os.path.exists(node_folder(cluster.job_id, 1)), 10, 0.1,
                 "node 1's working directory removed by its node process")
        t1 = time.monotonic()
        shutdown_quietly(cluster)
        shutdown = time.monotonic() - t1
        poll_for(lambda: not _node_processes(cluster.job_id, 1), 10, 0.1, "node 1 gone")
        gone = time.monotonic() - t0
        poll_for(lambda: not job_folders(cluster.job_id), 10, 0.1, "the job's working folders removed")
    finally:
        shutdown_quietly(cluster)
        # the engine is whole again for the tests after this one
        poll_for(lambda: len(client.nthreads()) == workers, 60, 0.1, "the nanny's new worker")
    _figures("lost Dask worker", detected=detected, node_gone=gone, shutdown=shutdown)
    assert shutdown < 1, shutdown
