"""The shared behaviour suite of the core lifecycle: every test runs on every backend."""

from __future__ import annotations

import os

import numpy as np

import duotf
from duotf.testing import QUIET_TF
from duotf.testing.suite import mains


def test_results_context_and_tf_config(backend, engine, tmp_path):
    spec = duotf.ClusterSpec(workers=2)
    with duotf.run(mains.describe_main, {"marker": str(tmp_path)}, backend, spec) as cluster:
        results = cluster.wait()
    assert [r["node_id"] for r in results] == [0, 1]
    addresses = [f"{n.host}:{n.port}" for n in cluster.nodes]
    for i, r in enumerate(results):
        assert r["tf_config"] == {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": i}}
        assert r["job"] == "worker" and r["index"] == i
        assert r["num_workers"] == 2
        assert r["is_chief"] is (i == 0)
        assert r["cwd"] == r["working_dir"]
        assert r["relative"] == os.path.join(r["working_dir"], "model")
        assert r["absolute"] == "/data/x"
        assert r["url"] == "s3://bucket/k"
        assert r["pid"] == cluster.nodes[i].pid
        assert (tmp_path / f"ran-{i}").exists()
    assert results[0]["working_dir"] != results[1]["working_dir"]
    for r in results:  # removed with the node, unless asked for (see below)
        assert not os.path.exists(r["working_dir"]), r["working_dir"]
    assert not os.path.exists(os.path.dirname(results[0]["working_dir"]))
    assert len({r["port"] for r in results}) == 2
    # one node per executor, while there are executors enough
    assert len({r["executor_id"] for r in results}) == min(engine.executors, 2)
    assert cluster.status is duotf.ClusterStatus.CLOSED


def test_tf_config_for_every_role(backend, tmp_path):
    # chief + worker + ps + evaluator is 4 nodes; the backends here have 2 slots, so two runs.
    spec = duotf.ClusterSpec(workers=1, chief=True)
    with duotf.run(mains.describe_main, None, backend, spec) as cluster:
        chief, worker = cluster.wait()
    assert chief["tf_config"]["task"] == {"type": "chief", "index": 0}
    assert worker["tf_config"]["task"] == {"type": "worker", "index": 0}
    assert set(chief["cluster_spec"]) == {"chief", "worker"}
    assert chief["is_chief"] and not worker["is_chief"]
    assert chief["num_workers"] == 2

    spec = duotf.ClusterSpec(workers=1, evaluator=True)
    with duotf.run(mains.describe_main, None, backend, spec) as cluster:
        worker, evaluator = cluster.wait()
    assert evaluator["tf_config"]["task"] == {"type": "evaluator", "index": 0}
    # TensorFlow keeps the evaluator out of the cluster it trains with.
    assert evaluator["tf_config"]["cluster"] == {"worker": [cluster.nodes[0].address]}


def test_mwms_training_matches_reference(backend, tmp_path):
    data = mains.make_regression(str(tmp_path / "data.npz"))
    args = {"data": data, "batch": 32, "steps": 20, "lr": 0.05}
    with duotf.run(mains.mwms_main, args, backend, duotf.ClusterSpec(workers=2), env=QUIET_TF) as cluster:
        results = cluster.wait()
    ref_w, ref_b = mains.reference_weights(data, 32, 20, 0.05)
    assert [r["rank"] for r in results] == [0, 1]
    assert results[0]["w"] == results[1]["w"]  # synchronous: identical on every worker
    np.testing.assert_allclose(results[0]["w"], ref_w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(results[0]["b"], ref_b, rtol=1e-5, atol=1e-5)


def test_parameter_server_training(backend):
    spec = duotf.ClusterSpec(workers=1, ps=1)
    with duotf.run(mains.ps_between_graph_main, {"steps": 7}, backend, spec, env=QUIET_TF) as cluster:
        worker, ps = cluster.wait()
    assert worker == {"total": 7.0, "device": "/job:ps/task:0"}
    assert ps is None  # ps nodes serve; they have no main
    assert cluster.nodes[1].role == duotf.Role("ps", 0)


def test_ps_is_stopped_when_workers_finish_before_it_serves(backend):
    """Regression: a worker that returns before the ps serves must not leave wait() hanging."""
    spec = duotf.ClusterSpec(workers=1, ps=1)
    with duotf.run(mains.describe_main, None, backend, spec, env=QUIET_TF) as cluster:
        worker, ps = cluster.wait(timeout=60)
    assert worker["job"] == "worker" and ps is None
    assert [n.state for n in cluster.nodes] == ["done", "stopped"]


def test_nodes_read_their_share_of_tfrecord_files(backend, tmp_path):
    from duotf.io.tfrecord import write_records

    expected = set()
    for i in range(4):
        records = [f"{i}-{j}" for j in range(3)]
        write_records(str(tmp_path / f"part-{i}.tfrecord"), [r.encode() for r in records])
        expected.update(records)
    glob = str(tmp_path / "*.tfrecord")
    with duotf.run(mains.read_shard_main, {"glob": glob}, backend, duotf.ClusterSpec(workers=2),
                   env=QUIET_TF) as cluster:
        first, second = cluster.wait()
    assert not set(first) & set(second)
    assert set(first) | set(second) == expected
    assert {r.split("-")[0] for r in first} == {"0", "2"}


def test_keep_workdir_keeps_what_main_wrote(backend, tmp_path):
    import shutil

    spec = duotf.ClusterSpec(workers=1)
    with duotf.run(mains.describe_main, {"marker": str(tmp_path)}, backend, spec,
                   keep_workdir=True) as cluster:
        (result,) = cluster.wait()
    try:
        assert os.path.isdir(result["working_dir"])
    finally:
        shutil.rmtree(os.path.dirname(result["working_dir"]), ignore_errors=True)


_BY_VALUE = '''\
def main(args, ctx):
    import tensorflow as tf

    @tf.function
    def step(x):
        if tf.reduce_sum(x) > 0:  # a Python if over a tensor: a tf.cond only once converted
            return x * 2.0
        return x - 1.0

    return [float(v) for v in step(tf.constant(args)).numpy()]
'''


def test_autograph_converts_a_function_sent_by_value_whose_file_the_node_lacks(backend, tmp_path):
    """A main sent by value (as a script's or a notebook's are) keeps its source for ``inspect``
    in the node, so AutoGraph converts its ``tf.function``: here one whose file is gone before
    the run, as it is on another host, and whose source only the driver's ``linecache`` holds,
    as a notebook cell's."""
    import importlib.util
    import linecache
    import sys

    import cloudpickle

    path = tmp_path / "by_value_main.py"
    path.write_text(_BY_VALUE)
    name = f"duotf_by_value_{os.getpid()}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    cloudpickle.register_pickle_by_value(module)
    assert linecache.getlines(str(path))  # read while the file is there, then kept: a cell
    path.unlink()
    try:
        with duotf.run(module.main, [1.0, 2.0], backend, duotf.ClusterSpec(workers=1)) as cluster:
            assert cluster.wait(timeout=120) == [[2.0, 4.0]]
        with duotf.run(module.main, [-1.0, -2.0], backend, duotf.ClusterSpec(workers=1)) as cluster:
            assert cluster.wait(timeout=120) == [[-2.0, -3.0]]
    finally:
        cloudpickle.unregister_pickle_by_value(module)
        del sys.modules[name]
        linecache.cache.pop(str(path), None)
