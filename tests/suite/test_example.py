"""The digits example trains on every backend, TF reading its own data; the pipeline example
fits and scores on Spark and Dask."""

from __future__ import annotations

import os
import subprocess
import sys

import cloudpickle

import duotf
import pytest

from duotf.testing import QUIET_TF
from examples.digits import train
from examples.pipeline import digits as pipeline

cloudpickle.register_pickle_by_value(train)
cloudpickle.register_pickle_by_value(pipeline)


# The example in files mode on one engine and in engine mode on two (CI time; the quickstart of the
# README and docs/getting-started.md runs it too): every engine runs the same training paths in
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


@pytest.mark.engines("spark-standalone", "dask", "spark-connect")
def test_pipeline_example_fits_transforms_and_is_accurate(backend, engine, tmp_path):
    """examples/pipeline: DataFrame -> TFEstimator.fit -> TFModel.transform (Spark, in a
    Pipeline after a VectorAssembler) or TFModel.predict (Dask) -> accuracy."""
    accuracy = pipeline.pipeline(engine.handle, workers=2, epochs=5, model_dir=str(tmp_path), env=QUIET_TF)
    assert accuracy > 0.9, accuracy
    assert len(list(tmp_path.glob("fit-*/model.keras"))) == 1



# -- the examples run as a user runs them: as scripts, their mains pickled from there ----------
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run_script(command, tmp_path) -> str:
    """Run ``command`` as a user's shell would: duotf importable, the examples package not (no
    PYTHONPATH to this checkout: a folder holding only a link to the package)."""
    only_duotf = tmp_path / "site"
    only_duotf.mkdir()
    (only_duotf / "duotf").symlink_to(os.path.dirname(duotf.__file__))
    env = dict(os.environ, PYTHONPATH=str(only_duotf), PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run(command, cwd=str(tmp_path), capture_output=True, text=True, env=env,
                         timeout=300)
    problems = [line for line in out.stderr.splitlines() if " INFO " not in line]
    assert out.returncode == 0, "\n".join(problems[-60:] + out.stdout.splitlines()[-20:])
    return out.stdout


@pytest.mark.slow  # a second Spark application and TF: 50 to 140 s here
def test_the_streaming_script_runs_on_a_standalone_cluster(spark_standalone_master, tmp_path):
    """``spark-submit examples/streaming.py --backend spark`` on a standalone master, into a
    --data-dir that does not exist yet: the digits program it imports reaches the executors
    (1 node: the second application on the suite's master has 2 slots, one to feed from)."""
    data_dir = tmp_path / "new" / "data"
    out = _run_script(["spark-submit", "--master", spark_standalone_master,
                       os.path.join(ROOT, "examples", "streaming.py"), "--backend", "spark",
                       "--workers", "1", "--passes", "2", "--data-dir", str(data_dir), "--quiet"],
                      tmp_path)
    assert "backend=spark workers=1 test accuracy=" in out, out
    assert (data_dir / "digits.npz").exists()


@pytest.mark.engines("spark-standalone")
def test_the_digits_example_on_a_cluster_asks_for_a_folder_every_executor_sees(backend, engine, capsys):
    """Its nodes read digits.npz, which the driver writes: on a master of separate machines (here
    spark-submit's, the session that exists) the driver's temp folder is its own, and the
    example refuses to start without --data-dir rather than fail in every node."""
    with pytest.raises(SystemExit) as exit_info:
        train.cli(["--backend", "spark", "--quiet"])
    assert exit_info.value.code == 2
    said = capsys.readouterr().err
    assert f"--backend spark on {engine.session.sparkContext.master}" in said
    assert "give --data-dir, a folder the driver and every executor see" in said
