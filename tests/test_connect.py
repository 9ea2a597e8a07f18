"""What a Spark Connect session does differently, on the suite's real Connect server (the
``spark-connect`` engine of tests/engines.py); the behaviour suite itself runs on that engine as
on the others (tests/suite/)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import duotf
from duotf.backends.spark.client import local_threads
from duotf.errors import ConfigError
from duotf.testing.suite import mains

@pytest.mark.parametrize("master, threads", [
    ("local", 1), ("local[3]", 3), ("local[4, 2]", 4), ("local[*]", None), ("local[*,3]", None),
    ("spark://host:7077", None), ("yarn", None), ("k8s://https://api:6443", None)])
def test_local_masters_give_their_threads_and_others_need_a_probe(master, threads):
    assert local_threads(master) == threads


@pytest.mark.engines("spark-connect")
def test_the_connect_client_counts_slots_and_executors_with_a_probe_job(backend, engine):
    # the server's application: 2 executors of 2 cores (spark.executor.cores=2, cores.max=4)
    assert backend.client.connect and not backend.client.local
    assert backend.slots() == 4
    assert backend._executors() == 2
    assert backend.client.java_version().startswith("17")
    assert backend.default_fs() == "file://"


@pytest.mark.engines("spark-connect")
def test_doctor_reaches_the_cluster_through_an_sc_url(backend, engine):
    # with the relay forced (the direct route's checks: tests/suite/test_doctor.py), which the
    # doctor names as the reason, not executors that cannot reach this process
    env = dict(os.environ, DUOTF_RELAY="1")
    out = subprocess.run([sys.executable, "-m", "duotf", "doctor", *engine.cli_args(),
                          "--workers", "2"], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "connect" in out.stdout.splitlines()[0]  # the backend it checked
    assert "all checks passed" in out.stdout
    assert "through a relay in the cluster (DUOTF_RELAY=1 asks for it" in out.stdout, out.stdout
    assert "cannot open a connection" not in out.stdout
    assert "java" in out.stdout  # the server's Java, read through SQL (the client has none)


_HELPER = """\
def main(args, ctx):
    return f"{ctx.job_name}:{ctx.task_index} ran helper.main"
"""

_SCRIPT = """\
import json, sys
from pyspark.sql import SparkSession
import duotf
from helper import main  # a module beside this script, which the executors do not have

spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
with duotf.run(main, None, spark, duotf.ClusterSpec(workers=2)) as cluster:
    print(json.dumps(cluster.wait(timeout=120)))
"""


@pytest.mark.engines("spark-connect")
def test_a_main_from_a_module_beside_the_script_runs_on_connect(backend, engine, tmp_path):
    """``python train.py`` whose main comes from ``helper.py`` beside it: the executors of a
    Connect server have no path to the script's folder, and the module goes with the job."""
    (tmp_path / "helper.py").write_text(_HELPER)
    (tmp_path / "train.py").write_text(_SCRIPT)
    out = subprocess.run([sys.executable, "train.py", engine.url], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.splitlines()[-1]) == ["worker:0 ran helper.main",
                                                       "worker:1 ran helper.main"]


@pytest.mark.engines("spark-connect")
def test_feed_stream_refuses_a_connect_stream_before_anything_starts(backend, engine, tmp_path):
    from duotf.spark import feed_stream

    stream = engine.session.readStream.format("rate").option("rowsPerSecond", 10).load()
    with duotf.run(mains.argv_main, ["--epochs", "1"], backend, duotf.ClusterSpec(workers=1)) as cluster:
        with pytest.raises(ConfigError, match="foreachBatch runs its function in a Python process "
                                              "of the server"):
            feed_stream(cluster, stream, checkpoint_location=str(tmp_path / "ckpt"))
        [result] = cluster.wait(timeout=120)  # the cluster itself is unharmed
    assert result["args"] == ["--epochs", "1"]
    assert not engine.session.streams.active  # no query was started


@pytest.mark.engines("spark-connect")
def test_an_rdd_cannot_be_asked_of_a_connect_backend(backend):
    with pytest.raises(ConfigError, match="no SparkContext"):
        backend.sc


@pytest.mark.engines("spark-connect")
def test_feed_cache_on_connect_feeds_every_epoch_from_its_frames_and_unpersists(backend, engine):
    from duotf.spark import feed_cache
    from duotf.testing.suite.data import kept_frame_folders

    before = kept_frame_folders()
    df = engine.session.range(0, 400, 1, 4).selectExpr("CAST(id AS DOUBLE) AS x", "id")
    cache = feed_cache(df)  # the index: a locally checkpointed DataFrame (no RDD on Connect)
    try:
        assert cache.rows == 400 and len(cache.parts) == 4
        assert kept_frame_folders() - before  # the frames lie in the executors' local dirs
        with duotf.run(mains.feed_train_main, {"batch": 8}, backend, duotf.ClusterSpec(workers=2)) as cluster:
            report = cluster.train(cache, epochs=2)
            results = cluster.wait(timeout=120)
    finally:
        cache.unpersist()
    assert report["rows_fed"] == 800
    for epoch in (0, 1):  # every id once an epoch, across the two nodes
        assert sorted(i for r in results for i in r["ids"][epoch]) == list(range(400))
    assert not kept_frame_folders() - before
