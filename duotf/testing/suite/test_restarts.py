"""Restarts from a checkpoint (``duotf.run(..., max_restarts=N)``), on every engine.

A node is killed with SIGKILL from outside while it trains (the test waits for the node to say
it has saved epoch 2, then kills it); the cluster restarts, every node resumes from the
checkpoint the driver names, and the engine feed gives the restarted nodes the epochs after it,
each once. Since the feed plan is deterministic and the checkpoint holds whole epochs, the
result must equal an uninterrupted run's exactly (engine feed: bit for bit against the numpy
reference of test_determinism; TF reading its files under MultiWorkerMirroredStrategy: the
tolerance of test_lifecycle's reference test, 1e-5, float32 all-reduce sums).
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
from typing import Optional

import numpy as np
import psutil
import pytest

import duotf
from duotf.errors import NodeFailedError
from duotf.reports import TrainReport
from duotf.testing import QUIET_TF, poll_for
from duotf.testing.suite import mains
from duotf.testing.suite.data import kept_frame_folders
from duotf.testing.suite.test_orphans import job_folders
from duotf.testing.suite.typed import mismatches
from duotf.testing.suite.test_determinism import (BATCH, EPOCHS, LR, WIDTH, one_process_reference,
                                                  seeded_parts)


class _Killer(threading.Thread):
    """:func:`kill_when_ready`'s thread. A test ends it with :meth:`finish` in a ``finally``:
    it never outlives its test (a failed test would leave it waiting, and pytest would blame
    its error on a later test), and what it raised fails the test that started it."""

    def __init__(self, kill):
        super().__init__(name="duotf-test-killer", daemon=True)
        self._kill = kill
        self.cancelled = threading.Event()
        self.error: Optional[BaseException] = None

    def run(self):
        try:
            self._kill(self.cancelled)
        except BaseException as exc:  # noqa: BLE001 - raised again by finish(), in the test
            self.error = exc

    def finish(self, timeout: float = 30.0) -> None:
        """Stop waiting for the node (the test is over), join the thread, and raise what it
        raised: where the kill failed, that is why the test failed (a node never killed holds
        its cluster until wait() times out)."""
        self.cancelled.set()
        self.join(timeout)
        if self.is_alive():
            raise AssertionError(f"the killer thread still runs {timeout:g} s after its test")
        if self.error is not None:
            # its traceback runs through kill_when_ready's run(); raised in a test's finally,
            # the test's own error (a wait() that timed out) shows above it
            raise self.error


def kill_when_ready(cluster_box, signal_dir, victim: str = "node"):
    """A thread that waits for the node's "ready-to-die" file, then SIGKILLs the node process
    (``victim="node"``), its Spark executor's JVM (``"executor"``) or its Dask worker process
    (``"worker"``). Returns the thread (end it with ``finish()`` in a ``finally``) and a list
    that receives what was killed."""
    killed = []

    def run(cancelled: threading.Event):
        path = os.path.join(signal_dir, "ready-to-die")
        poll_for(lambda: cancelled.is_set() or os.path.exists(path), 120,
                 what="the node to save epoch 2")
        if not os.path.exists(path):
            return  # the test ended first
        pid = int(open(path).read())
        target = psutil.Process(pid)
        if victim == "executor":
            # From the node's agent (its task's Python worker) -> daemon -> the executor's JVM.
            # Not from the node process: a node forked by a warm node server (duotf._node.warm)
            # is that server's child, and the server the child of the Python worker that
            # started it at an earlier job, or of init once that worker has exited (no JVM
            # above the node: nothing was killed, and the node held its cluster for ever).
            node = [n for n in cluster_box[0].nodes if n.pid == pid]
            assert node and node[0].agent_pid, f"no node of pid {pid} in {cluster_box[0].nodes}"
            agent = psutil.Process(node[0].agent_pid)
            chain = [agent] + agent.parents()
            jvm = [p for p in chain if p.name() == "java"]
            assert jvm, f"no JVM above the node's agent: {[(p.pid, p.name()) for p in chain]}"
            target = jvm[0]
        elif victim == "worker":  # the Dask worker process runs the agent
            target = psutil.Process(cluster_box[0].nodes[1].agent_pid)
        killed.append((victim, target.pid))
        os.kill(target.pid, signal.SIGSTOP if victim == "hang" else signal.SIGKILL)

    thread = _Killer(run)
    thread.start()
    return thread, killed


def _restarted_feed_run(backend, engine, tmp_path, victim="node", **run_options):
    parts = seeded_parts()
    expected = one_process_reference(parts)
    args = {"width": WIDTH, "batch": BATCH, "lr": LR, "victim": 1, "kill_after": 2,
            "signal_dir": str(tmp_path)}
    box, data = [], engine.rows(parts)  # before the killer thread: an engine may skip here
    with duotf.run(mains.sgd_resume_main, args, backend, duotf.ClusterSpec(workers=2),
                   max_restarts=1, **run_options) as cluster:
        box.append(cluster)
        killer, killed = kill_when_ready(box, str(tmp_path), victim)
        try:
            report = cluster.train(data, epochs=EPOCHS)
            got = cluster.wait(timeout=180)
        finally:
            killer.finish()
        # the failed attempt left no working folder, the lost node's included (its process,
        # or its agent, removed it; not the driver, which may be on another host)
        first = os.path.join(tempfile.gettempdir(), f"duotf-{cluster.job_id}")
        poll_for(lambda: not os.path.exists(first), 10, 0.1, "the failed attempt's folders removed")
    assert killed and killed[0][0] == victim
    poll_for(lambda: not job_folders(cluster.job_id), 10, 0.1, "the job's working folders removed")
    [restart] = cluster.restarts
    assert restart.attempt == 0 and restart.node == "worker:1", restart
    assert restart.cause == {"node": "killed", "hang": "hung"}.get(victim, "lost"), restart
    assert restart.seconds is not None and restart.seconds > 0
    # bit for bit the uninterrupted run's weights
    assert [{"w": g["w"], "b": g["b"]} for g in got] == expected
    # resumed while train() fed (it returns the restarted feed's report) or after it returned
    assert mismatches(report, TrainReport) == []
    assert report.get("resumed_at_epoch", restart.resume_epoch) == restart.resume_epoch
    # the restarted attempt read each epoch after the checkpoint once, whole, and no other
    per = report["rows_per_worker"]
    for g in got:
        assert g["attempt"] == 1
        assert g["resumed_at"] == restart.resume_epoch
        assert g["epochs_read"] == [per] * (EPOCHS - restart.resume_epoch), g
    assert 1 <= restart.resume_epoch <= 2
    return cluster


@pytest.mark.also_on("spark-hosts", "dask-hosts")
def test_a_node_killed_mid_training_restarts_and_its_feed_resumes(backend, engine, tmp_path):
    cluster = _restarted_feed_run(backend, engine, tmp_path)
    # node 1 reported epoch 2 before it said it was ready to die: it resumes there
    assert cluster.restarts[0].resume_epoch == 2
    assert not os.path.exists(cluster.checkpoint_dir)  # duotf's own, removed at shutdown


@pytest.mark.engines("local")
def test_a_hung_node_is_killed_and_the_cluster_restarts(backend, engine, tmp_path):
    """SIGSTOP: the node falls silent; after heartbeat_timeout it counts as hung, is killed,
    and the gang restarts from its checkpoint."""
    _restarted_feed_run(backend, engine, tmp_path, victim="hang", heartbeat_interval=0.5,
                        heartbeat_timeout=3)


@pytest.mark.engines("spark-standalone", "spark-connect")
def test_an_executor_jvm_killed_mid_training_restarts_on_a_replacement(backend, engine, tmp_path,
                                                                       caplog):
    before = kept_frame_folders()
    with caplog.at_level(logging.WARNING, logger="duotf"):
        _restarted_feed_run(backend, engine, tmp_path, victim="executor")
    # the frames kept by the failed attempt's feed: those on the surviving executor deleted, a
    # word on what could not be (the lost executor's) in one line, no Java stack trace
    notes = [r.getMessage() for r in caplog.records if "frame kept for the feed" in r.getMessage()
             or "frames kept for the feed" in r.getMessage()]
    assert all("\n" not in note and "duotf-feedcache-" in note for note in notes), notes
    assert len(kept_frame_folders() - before) <= 1, kept_frame_folders() - before
    # the standalone master replaced the executor: the suite's later tests have their slots
    poll_for(lambda: backend.slots() >= engine.slots, 60, what="the replacement executor")


@pytest.mark.engines("dask")
def test_a_dask_worker_killed_mid_training_restarts_on_its_replacement(backend, engine, tmp_path):
    _restarted_feed_run(backend, engine, tmp_path, victim="worker")


def _feeders_of(engine, cluster):
    """The processes of the engine's feeding tasks holding a connection to the node's feed port
    that host no node (neither a node's process nor its agent's): the task feeding it now and
    those waiting their turn."""
    nodes = {pid for node in cluster.nodes for pid in (node.pid, node.agent_pid)}
    procs = engine.feeding_processes()
    found = []
    for proc in procs() if callable(procs) else procs:
        try:
            if proc.pid not in nodes and any(
                    c.raddr and c.raddr.port == cluster.nodes[0].feed_port
                    and c.status == psutil.CONN_ESTABLISHED for c in proc.net_connections(kind="tcp")):
                found.append(proc)
        except psutil.Error:  # a process that just exited
            pass
    return found


FEEDER_ROWS, FEEDER_PARTS = 48_000, 4  # 2 KiB rows: a partition's range is 6 frames of 4 MiB


@pytest.mark.slow
@pytest.mark.engines("dask", "spark-standalone", "spark-connect")
@pytest.mark.parametrize("max_restarts", [1, 0])
def test_a_feeding_process_lost_mid_range_restarts_once_or_names_the_feeder(
        backend, engine, tmp_path, max_restarts):
    """Issue 32, item 8: the processes of the feeding tasks that run beside no node (a Dask
    worker, Spark's Python workers) are killed while one is mid-range in epoch 2. With max_restarts=1 the job restarts
    once (cause "lost", no node) at the checkpoint of epoch 1 and every later epoch reaches the
    node exactly once; without restarts train() and wait() both raise the FeedError that names
    the feeding task's partition and process, not the node's main."""
    slots = backend.slots()
    args = {"batch": 500, "hold": FEEDER_ROWS + 1_000, "hold_epoch": 2,
            "held": str(tmp_path / "held"), "release": str(tmp_path / "release")}
    with duotf.run(mains.ids_resume_main, args, backend, duotf.ClusterSpec(workers=1),
                   env=QUIET_TF, max_restarts=max_restarts) as cluster:
        data = engine.away_from_nodes(engine.constant_features(
            FEEDER_ROWS, FEEDER_PARTS, width=512, chunk=FEEDER_ROWS // FEEDER_PARTS, ids=True), cluster)
        outcome: dict = {}
        trainer = threading.Thread(target=_train_into, args=(cluster, data, outcome))
        trainer.start()
        try:
            poll_for(lambda: os.path.exists(args["held"]) or not trainer.is_alive(), 180,
                     what="the node holding in epoch 2")
            assert trainer.is_alive(), f"train() ended before the kill: {outcome}"
            for victim in poll_for(lambda: _feeders_of(engine, cluster), 30,
                                   what="a feeder beside no node"):
                victim.kill()  # the one mid-range among them (a task waiting its turn is retried)
        finally:
            (tmp_path / "release").touch()
            trainer.join(180)
        assert not trainer.is_alive(), "train() hung after its feeding process was lost"
        if max_restarts:
            assert "error" not in outcome, outcome
            results = cluster.wait(timeout=120)
        else:
            error = outcome.get("error")
            assert isinstance(error, duotf.FeedError) and error.lost, repr(error)
            with pytest.raises(duotf.FeedError) as waited:
                cluster.wait(timeout=60)
    # the engine replaced what was killed (or is mended where it did not): later tests have their slots
    engine.mend()
    poll_for(lambda: backend.slots() >= slots, 90, what="the replacement worker")
    if not max_restarts:
        first = str(waited.value).splitlines()[0]
        assert first.startswith("feeding epoch 2 failed on worker:0") and "partition" in first, first
        assert "the driver ended the feed" not in first, first
        assert cluster.restarts == []
        return
    [restart] = cluster.restarts
    assert (restart.cause, restart.node, restart.resume_epoch) == ("lost", None, 1), restart
    assert restart.error.startswith("feeding epoch 2 failed"), restart.error
    [got] = results
    assert got["attempt"] == 1 and got["resumed_at"] == 1, got
    assert sorted(got["ids"]) == [2, 3], sorted(got["ids"])
    for epoch, ids in got["ids"].items():
        assert sorted(ids) == list(range(FEEDER_ROWS)), f"epoch {epoch}: rows lost or repeated"


def _train_into(cluster, data, outcome):
    try:
        # every epoch read from the data by a task (not Spark's kept frames, fed from the JVM)
        outcome["report"] = cluster.train(data, epochs=3, feed_timeout=120, convert_once=False)
    except duotf.DuotfError as exc:
        outcome["error"] = exc


# TensorFlow in every node of two attempts (CI time): the in-process engine, a standalone
# executor and a Dask worker; the engine-fed restart above runs on every engine.
@pytest.mark.engines("local", "spark-standalone", "dask")
def test_tf_reading_files_resumes_from_the_chiefs_checkpoint(backend, tmp_path):
    data = mains.make_regression(str(tmp_path / "data.npz"))
    args = {"data": data, "batch": 32, "lr": 0.05, "epochs": 3, "steps_per_epoch": 5,
            "victim": 1, "kill_after": 2, "signal_dir": str(tmp_path)}
    box = []
    with duotf.run(mains.mwms_resume_main, args, backend, duotf.ClusterSpec(workers=2),
                   env=QUIET_TF, max_restarts=1) as cluster:
        box.append(cluster)
        killer, killed = kill_when_ready(box, str(tmp_path))
        try:
            results = cluster.wait(timeout=240)
        finally:
            killer.finish()
    [restart] = cluster.restarts
    assert restart.cause == "killed" and restart.node == "worker:1"
    assert restart.resume_epoch in (1, 2)  # the chief's report of epoch 2 may come after the kill
    assert [r["attempt"] for r in results] == [1, 1]
    ref_w, ref_b = mains.reference_weights(data, 32, 15, 0.05)
    assert results[0]["w"] == results[1]["w"]
    np.testing.assert_allclose(results[0]["w"], ref_w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(results[0]["b"], ref_b, rtol=1e-5, atol=1e-5)


def test_a_node_that_always_fails_stops_after_max_restarts_with_its_own_error(backend, tmp_path):
    args = {"victim": 1, "signal_dir": str(tmp_path)}
    cluster = duotf.run(mains.always_exit_main, args, backend, duotf.ClusterSpec(workers=2),
                        max_restarts=2)
    (tmp_path / "go").write_text("")
    with pytest.raises(NodeFailedError) as raised:
        with cluster:
            cluster.wait(timeout=120)
    # the error a run without restarts raises: the node's own exit
    assert raised.value.exitcode == 3 and raised.value.role == "worker:1"
    assert "exited with code 3" in str(raised.value)
    assert [(r.attempt, r.cause, r.node) for r in cluster.restarts] == [
        (0, "exited", "worker:1"), (1, "exited", "worker:1")]
    assert cluster.attempt == 2


def test_an_exception_in_main_restarts_only_when_restart_on_names_it(backend, tmp_path):
    spec = duotf.ClusterSpec(workers=2)
    args = {"victim": 0, "signal_dir": str(tmp_path)}
    cluster = duotf.run(mains.raise_main, args, backend, spec, max_restarts=3)
    (tmp_path / "go").write_text("")
    with pytest.raises(NodeFailedError) as raised:
        with cluster:
            cluster.wait(timeout=60)
    assert raised.value.remote_type == "ValueError"
    assert cluster.restarts == []  # a bug is not bad luck: no restart by default
    with duotf.run(mains.raise_main, dict(args, raise_until=1), backend, spec,
                   max_restarts=3, restart_on=["killed", ValueError]) as cluster:
        assert cluster.wait(timeout=60) == [1, 1]
    assert [(r.cause, r.node) for r in cluster.restarts] == [("exception", "worker:0")]


def test_a_checkpoint_dir_given_to_run_is_made_for_the_job(backend, tmp_path):
    """duotf.run(..., checkpoint_dir=D): ctx.checkpoint_dir is D/<job id>, made by duotf on the
    nodes, so the restart example (docs/guides/restarts.md) saves into it on its first attempt, fails, restarts
    and finds its file there."""
    where = tmp_path / "ck"  # does not exist: duotf makes it, and the job's folder in it
    with duotf.run(mains.save_then_fail_main, {}, backend, duotf.ClusterSpec(workers=2),
                   checkpoint_dir=str(where), max_restarts=1, restart_on=[ValueError]) as cluster:
        results = cluster.wait(timeout=120)
    job_dir = str(where / cluster.job_id)
    assert cluster.checkpoint_dir == job_dir
    assert [(r.cause, r.attempt) for r in cluster.restarts] == [("exception", 0)]
    assert results == [{"attempt": 1, "w": [0.0, 1.0, 2.0], "dir": job_dir}] * 2
    assert any(name.endswith(".npz") for name in os.listdir(job_dir))  # the user's: kept


def test_a_checkpoint_dir_that_cannot_be_made_fails_the_node_saying_so(backend, tmp_path):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(NodeFailedError) as raised:
        with duotf.run(mains.save_then_fail_main, {}, backend, duotf.ClusterSpec(workers=1),
                       checkpoint_dir=str(tmp_path / "a-file")) as cluster:
            cluster.wait(timeout=60)
    assert raised.value.remote_type == "ConfigError"
    assert "checkpoint_dir: cannot make" in str(raised.value)
    assert "a folder that every node can write" in str(raised.value)


@pytest.mark.engines("local")
def test_keras_fit_resumes_from_its_checkpoint_callback(backend, engine, tmp_path):
    """duotf.keras.CheckpointCallback + restore + initial_epoch=ctx.resume_epoch: the killed
    and restarted fit ends with the weights of an uninterrupted fit (float32, 1e-6)."""
    rng = np.random.default_rng(3)
    blocks = []
    for _ in range(3):
        x = rng.normal(size=(32, 3)).astype(np.float32)
        blocks.append({"x": x, "y": (x @ np.array([1.0, -2.0, 0.5], np.float32) + 0.25)})
    data, mapping = engine.arrays(blocks)
    args = {"width": 3, "lr": 0.05, "batch": 8, "epochs": 4, "mapping": mapping,
            "victim": 1, "kill_after": 2, "signal_dir": str(tmp_path)}
    results = []
    for kill in (False, True):
        box = []
        run_args = dict(args, victim=1 if kill else -1)
        with duotf.run(mains.keras_resume_main, run_args, backend, duotf.ClusterSpec(workers=2),
                       env=QUIET_TF, max_restarts=1) as cluster:
            box.append(cluster)
            killer, killed = kill_when_ready(box, str(tmp_path)) if kill else (None, None)
            try:
                cluster.train(data, epochs=4)
                results.append(cluster.wait(timeout=240))
            finally:
                if killer is not None:
                    killer.finish()
        assert len(cluster.restarts) == int(kill)
    plain, resumed = results
    [restart] = cluster.restarts
    assert [r["attempt"] for r in resumed] == [1, 1] and all(r["restored"] for r in resumed)
    # the restarted fit ran the epochs after the checkpoint only
    assert len(resumed[0]["steps"]) == 4 - restart.resume_epoch
    np.testing.assert_allclose(resumed[0]["w"], plain[0]["w"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(resumed[0]["b"], plain[0]["b"], rtol=1e-6, atol=1e-6)
