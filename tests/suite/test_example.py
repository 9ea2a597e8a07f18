"""The digits example trains on every backend, TF reading its own data; the pipeline example
fits and scores on Spark and Dask."""

from __future__ import annotations

import cloudpickle

import duotf
import pytest

from duotf.testing import QUIET_TF
from examples.digits import train
from examples.pipeline import digits as pipeline

cloudpickle.register_pickle_by_value(train)
cloudpickle.register_pickle_by_value(pipeline)


# The example in files mode on one engine and in engine mode on two (CI time; the README's
# quickstart runs it too): every engine runs the same training paths in
# test_lifecycle, test_determinism and test_keras (files and engine feed).
@pytest.mark.engines("spark-standalone")
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


@pytest.mark.engines("local", "dask")
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
    # the chief's per-epoch progress, as in the files mode
    progress = [line for line in cluster.logs(0).splitlines() if line.startswith("epoch ")]
    assert [line.split(":")[0] for line in progress] == [f"epoch {e}" for e in range(1, 16)]


@pytest.mark.engines("spark-local", "dask")
def test_pipeline_example_fits_transforms_and_is_accurate(backend, engine, tmp_path):
    """examples/pipeline: DataFrame -> TFEstimator.fit -> TFModel.transform (Spark, in a
    Pipeline after a VectorAssembler) or TFModel.predict (Dask) -> accuracy."""
    accuracy = pipeline.pipeline(engine.handle, workers=2, epochs=5, model_dir=str(tmp_path), env=QUIET_TF)
    assert accuracy > 0.9, accuracy
    assert len(list(tmp_path.glob("fit-*/model.keras"))) == 1
