"""TLS on duotf's own connections, on every engine: a job run with ``tls=True`` feeds every row
over encrypted connections. The driver's rendezvous server and each node's feed server then
take only TLS, so the nodes registering prove that their agents' control channels were
encrypted, and the rows arriving that the engine's feeding tasks' connections were (the wire
itself is read in tests/test_tls.py)."""

from __future__ import annotations

import pytest

import duotf
from duotf.testing.suite import mains
from duotf.testing.suite.data import fed_every_epoch, frames, row_parts


@pytest.mark.also_on("spark-hosts", "dask-hosts")
def test_a_job_with_tls_feeds_every_row_over_encrypted_connections(backend, engine):
    df = engine.frame(frames(row_parts(), ["x", "y"]))
    with duotf.run(mains.feed_train_main, {"batch": 4}, backend, duotf.ClusterSpec(workers=2),
                   tls=True) as cluster:
        assert cluster.tls is not None
        report = cluster.train(df, epochs=2)
        first, second = cluster.wait(timeout=120)
    assert report["rows_fed"] == 2 * 44 and first["epochs"] == second["epochs"] == 2
    assert fed_every_epoch([i for r in (first, second) for ids in r["ids"].values() for i in ids], 2)
