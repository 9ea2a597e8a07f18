"""Keras 3 ``model.predict`` under ``MultiWorkerMirroredStrategy`` on the inference feed: one
prediction per input row, in the input's order, what one process's ``model.predict`` gives."""

from __future__ import annotations

import numpy as np

import duotf
from duotf.testing import QUIET_TF
from duotf.testing.suite import mains

SIZES = [7, 12, 5, 3]  # uneven: worker 0 answers 12 rows (partitions 0, 2), worker 1 15 (1, 3)
ENV = QUIET_TF  # the nodes' environment: that of the rest of the suite (one warm server)


def test_keras_predict_under_mwms_answers_every_row_in_order(backend, engine):
    rng = np.random.default_rng(5)
    weights = [rng.normal(size=(3, 2)), rng.normal(size=2), rng.normal(size=(2, 1)), rng.normal(size=1)]
    x = rng.normal(size=(sum(SIZES), 3)).astype(np.float32)
    parts, start = [], 0
    for size in SIZES:
        parts.append([(start + i, x[start + i].tolist()) for i in range(size)])
        start += size
    df = engine.table(parts, {"id": "long", "features": "array<float>"})
    args = {"weights": [w.tolist() for w in weights], "batch": 4}
    with duotf.run(mains.keras_predict_main, args, backend, duotf.ClusterSpec(workers=2),
                   env=ENV) as cluster:
        out = cluster.inference(df, keep=["id"], result_columns={"prediction": "double"},
                                feed_timeout=120)
        answered = cluster.wait(timeout=120)
    assert sorted(answered) == [12, 15]
    got = engine.to_pandas(out)
    assert got["id"].tolist() == list(range(sum(SIZES)))  # every row, in the input's order
    expected = mains.infer_model(weights).predict(x, verbose=0)[:, 0]
    np.testing.assert_allclose(got["prediction"].to_numpy(), expected, rtol=1e-5, atol=1e-6)
