"""TLS on duotf's own connections, on every engine: a job run with ``tls=True`` feeds every row
over encrypted connections. A node's feed server takes only TLS from then on, so the rows
arriving prove that the engine's feeding tasks encrypted them; the driver's end of each node
agent's control channel is a TLS socket (the wire itself is read in tests/test_tls.py)."""

from __future__ import annotations

import pytest

import duotf
from duotf._transport import tls
from duotf.testing.suite import mains
from duotf.testing.suite.data import fed_every_epoch, frames, row_parts


@pytest.mark.also_on("spark-hosts", "dask-hosts")
def test_a_job_with_tls_feeds_every_row_over_encrypted_connections(backend, engine):
    df = engine.frame(frames(row_parts(), ["x", "y"]))
    with duotf.run(mains.feed_train_main, {"batch": 4}, backend, duotf.ClusterSpec(workers=2),
                   tls=True) as cluster:
        assert cluster.tls is not None
        peers = list(cluster.supervisor.server._peers.values())
        assert len(peers) == 2 and all(tls.encrypted(p.sock) for p in peers), peers
        report = cluster.train(df, epochs=2)
        first, second = cluster.wait(timeout=120)
    assert report["rows_fed"] == 2 * 44 and first["epochs"] == second["epochs"] == 2
    assert fed_every_epoch([i for r in (first, second) for ids in r["ids"].values() for i in ids], 2)
