"""benchmarks/wire.py's own logic: its cases and verdicts, and where it puts the nodes.

duotf spreads a job's nodes over hosts; the benchmark needs both on its node host, and stopped
("ran elsewhere than planned") once duotf began to spread them, with no test to say so. The
placement test asks the real two-host Dask cluster of the suite's ``dask-hosts`` engine (a
session fixture) where two nodes go, with duotf's own backend and with the benchmark's."""

from __future__ import annotations

import argparse

import pytest

from benchmarks import wire


def test_each_drain_has_both_paths_and_the_copy_ends_a_round():
    assert wire.cases(["arrays", "dataset"]) == ["cross-host/arrays", "cross-host-tls/arrays",
                                                 "same-host/arrays", "cross-host/dataset",
                                                 "cross-host-tls/dataset", "same-host/dataset",
                                                 "socket copy"]
    assert wire.cases(["dataset"]) == ["cross-host/dataset", "cross-host-tls/dataset",
                                       "same-host/dataset", "socket copy"]
    assert wire.placed("cross-host-tls") == "cross-host"  # the same rows, on the same host
    assert wire.label("cross-host/arrays") == "duotf feed, across hosts (TCP), next_batch(100), numpy"


def test_the_summary_judges_each_drain_against_the_same_copy(capsys):
    got = {"cross-host/arrays": [300.0, 260.0, 280.0], "cross-host-tls/arrays": [240.0, 130.0, 210.0],
           "same-host/arrays": [400.0, 400.0, 400.0],
           "cross-host/dataset": [100.0, 120.0, 110.0], "cross-host-tls/dataset": [90.0, 108.0, 99.0],
           "same-host/dataset": [200.0, 200.0, 200.0], "socket copy": [500.0, 520.0, 560.0]}
    cpu = {case: {"part": [1.0, 1.0, 1.0]} for case in got}
    copy, same = wire.ratios(got, "arrays")
    assert copy == pytest.approx([0.6, 0.5, 0.5]) and same == pytest.approx([0.75, 0.65, 0.7])
    wire.summary(got, cpu, argparse.Namespace(drains=["arrays", "dataset"]), None)
    lines = capsys.readouterr().out.splitlines()
    arrays = next(line for line in lines if line.startswith("  next_batch(100), numpy: cross-host"))
    dataset = next(line for line in lines if line.startswith("  dataset(100), TF: cross-host"))
    assert "socket copy: 0.50" in arrays and "goal >= 0.5: met" in arrays
    assert "socket copy: 0.20" in dataset and "goal >= 0.5: NOT met" in dataset
    # the TLS feed over the plain one, round by round: 0.80, 0.50, 0.75 (median 0.75)
    assert "TLS / plain cross-host feed: 0.75 (rounds: 0.80, 0.50, 0.75); goal >= 0.7: met" in arrays
    assert "TLS / plain cross-host feed: 0.90" in dataset


def test_the_benchmarks_nodes_stay_on_the_node_host_where_duotf_would_spread_them(dask_hosts_scheduler):
    from distributed import Client

    from duotf.backends.dask.backend import DaskBackend, _host

    net, address = dask_hosts_scheduler
    with Client(address) as client:
        client.wait_for_workers(2, timeout=60)
        spread = DaskBackend(client)
        chosen = spread._place(spread._workers(), 2)
        assert sorted(_host(w) for w in chosen) == sorted(net.ips)  # one node a host
        spread._release(chosen)
        pinned = wire.node_host_backend(client, net)
        assert [_host(w) for w in pinned._workers()] == [net.ips[wire.NODE_HOST]]
