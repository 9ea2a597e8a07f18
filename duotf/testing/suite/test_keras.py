"""Keras 3 ``model.fit`` under ``MultiWorkerMirroredStrategy`` in duotf nodes (``duotf.keras``):
on the engine feed and on files TF reads itself, with the weights one process trains on the
same global batches."""

from __future__ import annotations

import numpy as np
import pytest

import duotf
from duotf._driver.planner import balance
from duotf.testing import QUIET_TF
from duotf.testing.suite import mains

SIZES = [20, 4, 16, 24]  # uneven, more partitions than workers: ranges split across workers
WIDTH, BATCH, LR, EPOCHS, FILE_EPOCHS, WORKERS = 3, 8, 0.05, 3, 2, 2
TRUE_W = np.array([1.5, -2.0, 0.5])
ENV = QUIET_TF


def _blocks():
    rng = np.random.default_rng(11)
    blocks = []
    for size in SIZES:
        x = rng.normal(size=(size, WIDTH)).astype(np.float32)
        y = (x @ TRUE_W + 0.3 + rng.normal(scale=0.1, size=size)).astype(np.float32)
        blocks.append({"x": x, "y": y})
    return blocks


def _reference(rows, epochs):
    """One process, plain SGD on mean squared error, float64: global step k takes each worker's
    k-th ``BATCH // WORKERS`` rows (under the strategy Keras's batch is the global batch, and
    TF splits each worker's batches into that many rows a step)."""
    w, b = np.zeros(WIDTH), 0.0
    per_step = BATCH // WORKERS
    steps = len(rows[0][0]) // per_step
    for _ in range(epochs):
        for k in range(steps):
            x = np.concatenate([xs[k * per_step:(k + 1) * per_step] for xs, _ in rows])
            y = np.concatenate([ys[k * per_step:(k + 1) * per_step] for _, ys in rows])
            err = x.astype(np.float64) @ w + b - y
            w = w - LR * 2 * (x.T @ err) / len(y)
            b = b - LR * 2 * float(err.mean())
    return w, b, steps


def _fed_rows(blocks):
    """Each worker's rows in the order the balanced plan feeds them."""
    plan, _, _ = balance([len(b["y"]) for b in blocks], WORKERS)
    rows = [([], []) for _ in range(WORKERS)]
    for pid in sorted(plan):
        for target, a, c, _ in plan[pid]:
            rows[target][0].append(blocks[pid]["x"][a:c])
            rows[target][1].append(blocks[pid]["y"][a:c])
    return [(np.concatenate(x), np.concatenate(y)) for x, y in rows]


def _write_files(tmp_path, worker_rows):
    paths = []
    for i, (x, y) in enumerate(worker_rows):
        path = tmp_path / f"part-{i}.csv"
        path.write_text("".join(",".join(repr(float(v)) for v in (*r, t)) + "\n"
                                for r, t in zip(x.tolist(), y.tolist())))
        paths.append(str(path))
    return paths


# Three engines of five (CI time): in-process, a Dask worker and a standalone executor; every engine
# trains under MultiWorkerMirroredStrategy in test_lifecycle and test_determinism.
@pytest.mark.engines("local", "dask", "spark-standalone")
def test_keras_fit_on_the_engine_feed_and_on_files(backend, engine, tmp_path):
    blocks = _blocks()
    fed = _fed_rows(blocks)
    assert [len(y) for _, y in fed] == [32, 32]
    # files: one per worker (auto-shard FILE), other rows than the feed's
    file_rows = [(x[::-1].copy(), y[::-1].copy()) for x, y in fed]
    data, mapping = engine.arrays(blocks)
    args = {"width": WIDTH, "batch": BATCH, "lr": LR, "epochs": EPOCHS, "mapping": mapping,
            "files": _write_files(tmp_path, file_rows), "file_epochs": FILE_EPOCHS,
            "model": str(tmp_path / "linear.keras")}
    with duotf.run(mains.keras_fit_main, args, backend, duotf.ClusterSpec(workers=WORKERS),
                   env=ENV) as cluster:
        cluster.train(data, epochs=EPOCHS)
        first, second = cluster.wait(timeout=300)
    # duotf.keras.ReportCallback: each fit epoch's logs, as history has them, from both workers
    metrics = cluster.metrics
    for node_id, node in enumerate((first, second)):
        rows = metrics[metrics["node"] == f"worker:{node_id}"]
        assert rows["step"].tolist() == list(range(EPOCHS))
        assert rows["loss"].tolist() == node["feed"]["loss"]

    for node in (first, second):
        # the fix applied: at once in a warm node (Keras imported with TensorFlow before main),
        # else when main imported Keras (a hook waited for it)
        assert node["fixed"] is True
        assert node["hooks"] == (0 if node["keras_before"] else 1), node
    for mode, rows, epochs in (("feed", fed, EPOCHS), ("files", file_rows, FILE_EPOCHS)):
        w, b, steps = _reference(rows, epochs)
        for got in (first[mode], second[mode]):
            # no steps_per_epoch: every epoch ran every step, on both workers alike
            assert got["steps"] == [steps] * epochs, mode
            np.testing.assert_allclose(got["w"], w, rtol=1e-4, atol=1e-5, err_msg=mode)
            np.testing.assert_allclose(got["b"], b, rtol=1e-4, atol=1e-5, err_msg=mode)
        assert first[mode]["w"] == second[mode]["w"] and first[mode]["b"] == second[mode]["b"]
        assert first[mode]["loss"] == second[mode]["loss"] and len(first[mode]["loss"]) == epochs
    assert first["feed"]["feed_epochs"] == second["feed"]["feed_epochs"] == EPOCHS
    assert abs(np.mean(w := np.array(first["files"]["w"])) - np.mean(TRUE_W)) < 1  # it learned

    # evaluate: the mean squared error over every worker's rows; predict: every worker's rows
    x = np.concatenate([x for x, _ in file_rows]).astype(np.float64)
    y = np.concatenate([y for _, y in file_rows])
    pred = x @ w + first["files"]["b"]
    assert first["evaluate"] == second["evaluate"]
    np.testing.assert_allclose(first["evaluate"], np.mean((pred - y) ** 2), rtol=1e-4)
    np.testing.assert_allclose(sorted(first["predict"]), sorted(pred), rtol=1e-4, atol=1e-5)
    assert first["saved_equal"] is True and "saved_equal" not in second


@pytest.mark.engines("local")
def test_an_unsupported_keras_fails_fit_with_a_config_error_saying_what_to_install(backend):
    with duotf.run(mains.keras_unsupported_main, None, backend, duotf.ClusterSpec(workers=2),
                   env=dict(ENV, DUOTF_KERAS_FIX="0")) as cluster:
        results = cluster.wait(timeout=300)
    for out in results:
        assert out["fixed"] is False  # DUOTF_KERAS_FIX=0 leaves Keras as it is
        kind, message = out["fit"]
        assert kind == "ConfigError" and out["iterations"] == 0  # before any step
        for text in (out["enable"], message):
            assert "reduce_per_replica" in text and "pip install 'keras==3.15.*'" in text
            assert "pip install tf-keras" in text and "TF_USE_LEGACY_KERAS" in text
