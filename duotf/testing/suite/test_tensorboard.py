"""The shared suite's TensorBoard and engine names: ``duotf.run(..., tensorboard=True)`` serves
the scalars a node wrote to ``ctx.log_dir`` and stops with the cluster; the engine's own UI
(Spark's job descriptions, Dask's task keys) names the job's nodes and feeding epochs."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

import pytest

import duotf
from duotf.testing import poll_for
from duotf.testing.suite import mains

LOSSES = [1.0, 0.5, 0.25]


def _get(url: str):
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _scalars(base: str):
    """The losses TensorBoard serves for the run at the log directory's root, by step; None
    until it has loaded them."""
    tags = _get(base + "data/plugin/scalars/tags")
    if "loss" not in tags.get(".", {}):
        return None
    points = _get(base + "data/plugin/scalars/scalars?run=.&tag=loss")
    return [value for _, _, value in sorted(points, key=lambda p: p[1])] or None


def _refused(base: str) -> bool:
    try:
        urllib.request.urlopen(base, timeout=2).close()
    except urllib.error.URLError as exc:
        return isinstance(exc.reason, ConnectionRefusedError)
    return False


# The real engines only (each names its work its own way); the in-process doubles serve the same
# TensorBoard code path at twice the suite's time for this test. spark-local cut from CI's time
# (11 s; it passed): a classic session names the work as on spark-standalone.
@pytest.mark.engines("spark-standalone", "dask", "spark-connect")
def test_tensorboard_serves_the_scalars_and_the_engine_names_the_work(backend, engine, tmp_path):
    release = str(tmp_path / "release")
    data = engine.rows([[(i, i % 3) for i in range(p * 20, p * 20 + 20)] for p in range(2)])
    with duotf.run(mains.tensorboard_main, {"losses": LOSSES, "release": release}, backend,
                   duotf.ClusterSpec(workers=2), tensorboard=True) as cluster:
        report = cluster.train(data, epochs=2)
        url = cluster.tensorboard_url
        assert url.startswith(f"http://{cluster.nodes[0].host}:") and url.endswith("/")
        got = poll_for(lambda: _scalars(url), 60, 0.2, "the scalars in TensorBoard")
        assert got == LOSSES
        open(release, "w").close()
        values = cluster.wait()
    assert [v["rows"] for v in values] == [40, 40]
    log_dir = values[0]["log_dir"]
    assert cluster.job_id in log_dir
    # TensorBoard stopped with the cluster, and the job's own log directory went with it
    poll_for(lambda: _refused(url), 15, what="TensorBoard gone")
    poll_for(lambda: not os.path.exists(log_dir), 15, what="the job's log directory removed")

    shown = engine.work_names(cluster.job_id)
    # Spark: an RDD converted in epoch 1 (a Spark job), its epoch 2 fed by naming kept frames
    by_reference = report.get("epochs_fed_by_reference", 0)
    assert by_reference == (1 if engine.converts_frames_once else 0), report
    for name in engine.expected_work_names(cluster.job_id, ["worker-0", "worker-1"], epochs=2,
                                           by_reference=by_reference):
        assert any(s.startswith(name) for s in shown), (name, shown)
    assert not any(f"feed epoch {2 - by_reference + 1}/2" in s for s in shown), shown


@pytest.mark.engines("local")
def test_a_tensorboard_that_cannot_start_is_named_and_the_nodes_run_on(backend, tmp_path):
    # A tensorboard package that fails on import, first on the nodes' path: TensorBoard's own
    # process exits before it serves, as where it is not installed.
    broken = tmp_path / "site" / "tensorboard"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('this tensorboard is broken')\n")
    with duotf.run(mains.describe_main, None, backend, duotf.ClusterSpec(workers=1),
                   tensorboard=True, env={"PYTHONPATH": str(broken.parent)}) as cluster:
        with pytest.raises(duotf.TensorBoardError) as info:
            cluster.tensorboard_url
        values = cluster.wait()
    assert values[0]["node_id"] == 0  # the node ran on without it
    message = str(info.value)
    assert "did not start beside worker:0" in message and "pip install tensorboard" in message
    assert "ImportError: this tensorboard is broken" in message
    assert info.value.node.startswith("worker:0")
