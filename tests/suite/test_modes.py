"""The training-mode examples (examples/modes), each on one Spark and one Dask engine with the
digits of scikit-learn: TF2 ParameterServerStrategy with a side-car evaluator, asynchronous
between-graph ps training fed by the engine, and periodic weight averaging (duotf.averaging),
with the end of uneven data."""

from __future__ import annotations

import contextlib
import os

import pytest

import duotf
from duotf.testing import QUIET_TF, poll_for
from examples.modes import async_ps, averaging, common, ps_strategy

common.ship_by_value(common, async_ps, averaging, ps_strategy)


@contextlib.contextmanager
def room_for(backend, engine, slots: int):
    """At least ``slots`` node slots for the test: the suite's engines have room for 2 nodes and
    their feeding; a Dask LocalCluster (one node per worker) grows for the test and shrinks
    back after it."""
    have = backend.slots()
    if have >= slots:
        yield
        return
    cluster = getattr(engine.handle, "cluster", None)
    if cluster is None or not hasattr(cluster, "scale"):
        pytest.fail(f"the engine has {have} slots, the test needs {slots}")
    cluster.scale(slots)
    try:
        poll_for(lambda: backend.slots() >= slots, 60, 0.1, f"{slots} Dask workers")
        yield
    finally:
        cluster.scale(have)
        poll_for(lambda: backend.slots() == have, 60, 0.1, f"back to {have} Dask workers")


# Each example on every engine its --backend names (issue 32, item 9): Spark as a standalone
# cluster (the nodes unpickle the examples' functions in executors that never imported them).
@pytest.mark.engines("spark-standalone", "dask", "local")
def test_ps_strategy_example_trains_and_the_evaluator_scores_every_checkpoint(backend, engine, tmp_path):
    """A chief with ClusterCoordinator, a worker that only serves, a ps, an evaluator scoring the
    chief's checkpoints as they appear. Spark and Dask write their DataFrame as TFRecord files of
    tf.train.Example (the way to a DataFrame here: see docs/guides/training-modes.md), TF reads them on the worker;
    on the embedded backend TF reads the files written from numpy (``--input files``)."""
    data = common.prepare_data(str(tmp_path / "data"))
    epochs = 5
    args = dict(data, batch_size=32, epochs=epochs, lr=0.2, seed=1,
                model_dir=str(tmp_path / "model"), evaluator_timeout=300)
    if engine.handle is not None:
        files = common.engine_files(engine.handle, data["data"], str(tmp_path / "engine-train"))
        assert len(files) == 4
        args.update(train_files=files, examples=True)
    spec = duotf.ClusterSpec(chief=True, workers=1, ps=1, evaluator=True)
    with room_for(backend, engine, spec.num_nodes):
        with duotf.run(ps_strategy.main, args, backend, spec, env=QUIET_TF) as cluster:
            chief, worker, ps, evaluator = cluster.wait(timeout=300)
    assert worker is None and ps is None  # they served; the chief ran the steps on the worker
    assert chief["steps"] == epochs * (data["rows"] // 32)
    assert chief["accuracy"] > 0.9, chief
    scored = evaluator["evaluated"]
    # The side-car saw the final checkpoint, whatever it missed in between, and scored the weights
    # the chief ended with.
    assert scored[-1]["checkpoint"] == f"ckpt-{epochs}"
    assert scored[-1]["step"] == chief["steps"]
    assert scored[-1]["accuracy"] == pytest.approx(chief["accuracy"])
    assert [s["step"] for s in scored] == sorted({s["step"] for s in scored})
    reported = cluster.metrics
    assert list(reported[reported.node == "evaluator:0"]["eval_accuracy"]) == [s["accuracy"] for s in scored]


@pytest.mark.engines("dask", "spark-standalone", "local")
def test_async_ps_example_trains_from_the_engine_feed(backend, engine, tmp_path):
    """tf.compat.v1 between-graph: replica_device_setter, MonitoredTrainingSession, 2 workers
    reading their DataFeed with next_batch, a ps; unbalanced partitions (balance=False)."""
    data = common.prepare_data(str(tmp_path / "data"))
    rows, mapping = common.engine_rows(engine.handle, data["data"])
    args = {"data": data["data"], "feed": mapping, "batch_size": 32, "lr": 0.2, "seed": 1,
            "model_dir": str(tmp_path / "model"), "wait_secs": 300}
    spec = duotf.ClusterSpec(workers=2, ps=1)
    feeding = 0 if engine.feeds_beside_nodes else 1  # a slot for the feeding tasks
    with room_for(backend, engine, spec.num_nodes + feeding):
        with duotf.run(async_ps.main, args, backend, spec, env=QUIET_TF) as cluster:
            report = cluster.train(rows, epochs=5, balance=False)
            chief, other, ps = cluster.wait(timeout=300)
    assert ps is None
    assert report["rows_fed"] == 5 * data["rows"], report
    # every step of both workers went to the ps's global step, and both trained
    assert chief["global_step"] == chief["steps"] + other["steps"]
    assert chief["steps"] > 0 and other["steps"] > 0
    assert chief["accuracy"] > 0.9, chief
    assert any(name.startswith("model.ckpt-") for name in os.listdir(tmp_path / "model"))


def _averaging_args(data: dict, **extra) -> dict:
    return dict({"data": data["data"], "batch_size": 32, "lr": 0.3, "seed": 1, "every": 10,
                 "epochs": 5}, **extra)


def _agree(results) -> None:
    """Every worker ended with the same weights: the last average."""
    assert len({r["checksum"] for r in results}) == 1, results
    assert len({r["accuracy"] for r in results}) == 1, results


@pytest.mark.engines("spark-standalone", "dask", "local")
def test_averaging_example_keras_callback_from_the_engine_feed(backend, engine, tmp_path):
    data = common.prepare_data(str(tmp_path / "data"))
    rows, mapping = common.engine_rows(engine.handle, data["data"])
    args = _averaging_args(data, feed=mapping, keras=True, epochs=8)
    results = averaging.run(backend, args, 2, 8, rows, env=QUIET_TF)
    _agree(results)
    steps = 8 * ((data["rows"] // 2) // 32 + 1)  # balanced: each epoch's last batch is short
    assert [r["steps"] for r in results] == [steps, steps]
    # start, one every 10 steps, and at the end of fit one round where nobody trains, the mean
    assert [r["rounds"] for r in results] == [1 + steps // 10 + 2] * 2
    assert results[0]["accuracy"] > 0.9, results


@pytest.mark.engines("dask")
def test_averaging_with_uneven_data_ends_cleanly_with_one_model(backend, tmp_path):
    """The custom loop, TF reading each worker's share of the file. Worker 0 takes 45 steps, worker 1 runs out after 17: worker 1 keeps joining worker 0's
    rounds (its weights no longer counted) until worker 0 finishes too; then both take the
    last average and return, with equal weights. Nothing hangs."""
    data = common.prepare_data(str(tmp_path / "data"))
    results = averaging.run(backend, _averaging_args(data, steps=[45, 17], every=10),
                            env=QUIET_TF)
    _agree(results)
    assert [r["steps"] for r in results] == [45, 17]
    # worker 0: start + 4 of its own + finish (1 round where nobody trains + the mean);
    # worker 1: start + 1 of its own + 3 of worker 0's + the same 2 at the end
    assert [r["rounds"] for r in results] == [7, 7]
    assert results[0]["accuracy"] > 0.8, results


def test_averager_refuses_a_bad_interval_before_any_tf_work():
    from duotf.averaging import WeightAverager

    for every in (0, -1, 2.5, True):
        with pytest.raises(duotf.ConfigError, match="every must be an int >= 1"):
            WeightAverager([], every=every)
