"""The digits example trains on every backend, TF reading its own data."""

from __future__ import annotations

import cloudpickle

import duotf
from examples.digits import train
from tests.conftest import QUIET_TF

cloudpickle.register_pickle_by_value(train)


def test_digits_example_trains(backend, tmp_path):
    args = {
        "data": train.prepare_data(str(tmp_path / "digits.npz")),
        "batch_size": 64, "epochs": 15, "lr": 0.5, "seed": 1,
        "model_dir": str(tmp_path / "model"),
    }
    with duotf.run(train.main, args, backend, duotf.ClusterSpec(workers=2), env=QUIET_TF) as cluster:
        results = cluster.wait()
    assert [r["worker"] for r in results] == [0, 1]
    assert results[0]["accuracy"] == results[1]["accuracy"]  # synchronous replicas agree
    assert results[0]["accuracy"] > 0.9, results
    assert (tmp_path / "model" / "weights.npz").exists()  # saved by the chief before returning


def test_digits_example_trains_from_the_engine_feed(backend, engine, tmp_path):
    """The same program, the rows pushed by the engine: the same accuracy as reading the file."""
    import numpy as np

    data = train.prepare_data(str(tmp_path / "digits.npz"))
    collection, mapping = train.engine_data(engine.handle, data)
    args = {"data": data, "batch_size": 64, "epochs": 15, "lr": 0.5, "seed": 1,
            "model_dir": str(tmp_path / "model"), "feed": mapping}
    with duotf.run(train.main, args, backend, duotf.ClusterSpec(workers=2), env=QUIET_TF) as cluster:
        report = cluster.train(collection, epochs=15)
        results = cluster.wait(timeout=300)
    assert report["rows_per_worker"] == len(np.load(data)["y_train"]) // 2
    assert results[0]["accuracy"] == results[1]["accuracy"]
    assert results[0]["accuracy"] > 0.9, results
