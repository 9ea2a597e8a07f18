"""``DUOTF_PORTS`` / ``duotf.run(..., ports=)``: every port a run listens on lies in the range,
on the driver (the rendezvous server) and in every node process (its feed server and its
TensorFlow server, on the port its engine task reserved)."""

from __future__ import annotations

import random

import pytest

import duotf
from duotf.testing.suite import mains


# the engines whose nodes start differently: in the driver's threads, on a Dask worker, on a
# Spark executor (standalone: its own hosts' env; Connect's executors are the same)
@pytest.mark.engines("local", "dask", "spark-local", "spark-standalone")
def test_every_port_a_run_listens_on_lies_in_its_range(backend, engine):
    low = random.randrange(42000, 48000, 100)  # a range of its own beside parallel tests
    with duotf.run(mains.listening_main, None, backend, duotf.ClusterSpec(workers=2),
                   ports=f"{low}-{low + 99}") as cluster:
        rendezvous = cluster.supervisor.server.address[1]
        listening = cluster.wait(timeout=120)
    assert low <= rendezvous <= low + 99, rendezvous
    for ports in listening:
        # the feed server and the TensorFlow server at least
        assert len(ports) >= 2 and all(low <= p <= low + 99 for p in ports), (low, listening)
    assert len({p for ports in listening for p in ports}) == sum(map(len, listening))  # none shared
