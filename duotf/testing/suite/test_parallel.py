"""``duotf.run_parallel`` on every engine: independent runs side by side, each one's outcome in its
slot, a failure kept to its run, and nothing left behind when the driver is interrupted."""

from __future__ import annotations

import logging
import os
import signal
import threading

import pytest

import duotf
from duotf.testing import poll_for
from duotf.testing.suite import mains


def _most_at_once(intervals) -> int:
    """The most intervals ``(start, end)`` that overlap at one moment."""
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    now = most = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def test_runs_side_by_side_each_result_in_its_slot(backend, tmp_path):
    # Each node waits until 2 nodes have entered: with one run at a time the first never returns.
    grid = [{"trial": i, "gate": str(tmp_path), "together": 2, "gate_timeout": 30} for i in range(4)]
    runs = duotf.run_parallel(mains.trial_main, grid, backend, max_concurrent=2)
    assert [r.index for r in runs] == [0, 1, 2, 3]
    assert all(r.ok for r in runs), [r.error for r in runs]
    assert [r.args for r in runs] == grid
    assert [r.value[0]["trial"] for r in runs] == [0, 1, 2, 3]
    assert [r.result()[0]["score"] for r in runs] == [0, 10, 20, 30]
    assert len({r.job_id for r in runs}) == 4 and all(r.seconds > 0 for r in runs)
    # The nodes' own clocks: two runs overlapped, never three (run k+2 starts after one ended).
    assert _most_at_once([(r.value[0]["entered"], r.value[0]["left"]) for r in runs]) == 2


def test_a_failed_run_keeps_to_its_slot(backend, tmp_path):
    # The held run takes one slot until its timeout; the others pass through the second slot
    # (each run has the timeout too: on busy cores a node's start alone took more than 4 s).
    grid = [{"trial": 0, "mode": "hold", "release": str(tmp_path / "never")}, {"trial": 1},
            {"trial": 2, "mode": "raise"}, {"trial": 3, "mode": "kill"}, {"trial": 4}]
    runs = duotf.run_parallel(mains.trial_main, grid, backend, max_concurrent=2, timeout=15)
    assert [r.ok for r in runs] == [False, True, False, False, True]
    assert runs[1].value[0]["score"] == 10 and runs[4].value[0]["score"] == 40
    held, raised, killed = runs[0].error, runs[2].error, runs[3].error
    assert isinstance(raised, duotf.NodeFailedError) and raised.remote_type == "ValueError"
    assert "trial 2: bad hyperparameters" in str(raised)
    assert isinstance(killed, duotf.NodeFailedError) and killed.exitcode == -signal.SIGKILL
    assert type(held) is TimeoutError and "timeout=15 s" in str(held) and "args_list[0]" in str(held)
    assert runs[2].value is None
    with pytest.raises(duotf.NodeFailedError):
        runs[2].result()


def test_a_failed_run_is_its_outcome_not_an_error_in_the_log(backend, caplog):
    """A run that raises is handed back in its RunResult: its cluster does not log an ERROR
    ("worker:0 main raised ...") on top, while a plain duotf.run's failure still does."""
    caplog.set_level(logging.DEBUG, logger="duotf")
    runs = duotf.run_parallel(mains.trial_main, [{"trial": 0, "mode": "raise"}, {"trial": 1}],
                              backend)
    assert [r.ok for r in runs] == [False, True]
    raised = [r for r in caplog.records
              if r.name == "duotf.cluster" and "main raised" in r.getMessage()]
    assert raised and all(r.levelno == logging.DEBUG for r in raised), caplog.text
    caplog.clear()
    with pytest.raises(duotf.NodeFailedError):
        with duotf.run(mains.trial_main, {"trial": 2, "mode": "raise"}, backend) as cluster:
            cluster.wait()
    raised = [r for r in caplog.records
              if r.name == "duotf.cluster" and "main raised" in r.getMessage()]
    assert [r.levelno for r in raised] == [logging.ERROR], caplog.text


def test_a_two_node_run_in_parallel(backend):
    spec = duotf.ClusterSpec(workers=2)
    runs = duotf.run_parallel(mains.trial_main, [{"trial": 0}, {"trial": 1}], backend, spec)
    for i, r in enumerate(runs):
        assert r.ok, r.error
        assert [(v["trial"], v["node"], v["workers"]) for v in r.value] == [(i, 0, 2), (i, 1, 2)]


@pytest.mark.parametrize("kwargs, words", [
    ({"max_concurrent": 0}, "max_concurrent=0: give a whole number of runs, 1 or more"),
    ({"max_concurrent": 1.5}, "max_concurrent=1.5"),
    ({"max_concurrent": True}, "max_concurrent=True"),
    ({"timeout": -1}, "timeout=-1"),
    ({"heartbeat_timeout": 1}, "heartbeat_timeout=1 must exceed twice"),
    ({"grace_secs": 1}, "unknown keyword(s) grace_secs"),
])
def test_a_setting_that_fails_every_run_fails_before_any_starts(backend, tmp_path, kwargs, words):
    grid = [{"trial": i, "gate": str(tmp_path)} for i in range(2)]
    with pytest.raises(duotf.ConfigError) as info:
        duotf.run_parallel(mains.trial_main, grid, backend, **kwargs)
    assert words in str(info.value)
    assert not list(tmp_path.iterdir()), "a run started"


def test_runs_that_can_never_start_fail_before_any_starts(backend, tmp_path):
    grid = [{"trial": 0, "gate": str(tmp_path)}]
    too_big = duotf.ClusterSpec(workers=backend.slots() + 1)
    with pytest.raises(duotf.InsufficientSlotsError) as info:
        duotf.run_parallel(mains.trial_main, grid, backend, too_big)
    assert info.value.needed == too_big.num_nodes
    with pytest.raises(duotf.ConfigError, match=r"args_list\[1\] cannot be sent to the nodes"):
        duotf.run_parallel(mains.trial_main, grid + [{"lock": threading.Lock()}], backend)
    assert not list(tmp_path.iterdir()), "a run started"
    assert duotf.run_parallel(mains.trial_main, [], backend) == []


def test_an_interrupted_driver_stops_every_run(backend, tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()
    grid = [{"trial": i, "mode": "hold", "gate": str(gate), "release": str(tmp_path / "never")}
            for i in range(3)]
    main_thread = threading.main_thread().ident

    def interrupt():
        poll_for(lambda: len(os.listdir(gate)) >= 2, 60, what="two runs in main")
        signal.pthread_kill(main_thread, signal.SIGINT)

    # A process started in the background by a non-interactive shell ignores SIGINT (so would
    # this test's driver): the interrupt must raise KeyboardInterrupt however pytest was started.
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    sender = threading.Thread(target=interrupt, name="test-interrupt")
    sender.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            duotf.run_parallel(mains.trial_main, grid, backend, max_concurrent=2)
    finally:
        sender.join()
        signal.signal(signal.SIGINT, previous)
    started = sorted(os.listdir(gate))
    assert started == ["in-0-0", "in-1-0"], "the third run started after the interrupt"
    # Each node's working directory goes with its cluster. On Spark, pyspark's own SIGINT
    # handler cancels every job before the KeyboardInterrupt reaches run_parallel, so the agents
    # may still be removing theirs as it is raised.
    workdirs = [(gate / name).read_text() for name in started]
    poll_for(lambda: not any(os.path.exists(d) for d in workdirs), 15, what="workdirs removed")


@pytest.mark.engines("dask")
def test_runs_side_by_side_on_dask_get_a_worker_each(backend, engine, tmp_path):
    grid = [{"trial": i, "gate": str(tmp_path), "together": 2, "gate_timeout": 30} for i in range(2)]
    runs = duotf.run_parallel(mains.trial_main, grid, backend, max_concurrent=2)
    assert sorted(r.value[0]["executor"] for r in runs) == sorted(engine.client.nthreads())
