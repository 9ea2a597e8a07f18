"""GPUs per node (``ClusterSpec(gpus_per_node=k)``) on machines without GPUs: the engines hand
out fake devices and each node must see its own. The suite's engines, which have none, refuse
such a spec up front (tests/suite/test_gpus.py); Spark's standalone cluster with fake GPUs runs
the GPU block of docs/guides/gpus.md (tests/test_readme.py)."""

from __future__ import annotations

import os

import pytest

import duotf
from duotf._node.gpus import visible_devices
from duotf.backends import LocalBackend
from tests.suite import mains

SPEC = duotf.ClusterSpec(workers=2, gpus_per_node=1)


def test_an_address_is_the_index_of_a_visible_device():
    assert visible_devices(["1", "0"], None) == ["1", "0"]  # nothing set: the machine's devices
    assert visible_devices(["1"], "4,5,6") == ["5"]
    assert visible_devices(["0", "2"], " GPU-a , GPU-b ,GPU-c") == ["GPU-a", "GPU-c"]
    for addresses, visible in ((["3"], "4,5,6"), (["x"], "4,5"), (["0"], "")):
        with pytest.raises(duotf.ConfigError, match="CUDA_VISIBLE_DEVICES"):
            visible_devices(addresses, visible)
    with pytest.raises(duotf.ConfigError, match="twice"):
        visible_devices(["0", "0"], None)


def test_gpus_per_node_is_a_whole_number():
    assert duotf.ClusterSpec().gpus_per_node == 0
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(duotf.ConfigError, match="gpus_per_node"):
            duotf.ClusterSpec(gpus_per_node=bad)


def test_local_backend_gives_each_node_its_own_visible_devices(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,7,8")  # what the driver process sees
    backend = LocalBackend(gpus=3)
    with duotf.run(mains.describe_main, None, backend, SPEC) as cluster:
        seen = cluster.wait()
        nodes = cluster.nodes
    assert [(s["gpus"], s["cuda_visible_devices"]) for s in seen] == [(["6"], "6"), (["7"], "7")]
    assert [n.gpus for n in nodes] == [("6",), ("7",)]

    with pytest.raises(duotf.InsufficientSlotsError, match="LocalBackend\\(gpus=") as info:
        duotf.run(mains.describe_main, None, backend, duotf.ClusterSpec(workers=2, gpus_per_node=2))
    assert (info.value.needed, info.value.available) == (4, 3)
    with pytest.raises(duotf.ConfigError, match="drop it from env"):
        duotf.run(mains.describe_main, None, backend, SPEC, env={"CUDA_VISIBLE_DEVICES": "0"})

    # an address beyond what the process sees fails that node before any user code runs
    with pytest.raises(duotf.NodeFailedError, match="CUDA_VISIBLE_DEVICES='6,7,8'") as failed:
        duotf.run(mains.describe_main, {"marker": str(tmp_path)}, LocalBackend(gpus=["0", "5"]),
                  SPEC)
    assert failed.value.node_id == 1
    assert not (tmp_path / "ran-1").exists()


# -- Dask: workers that declare GPU resources ----------------------------------------------------
#: each worker's own devices, as dask-cuda gives every worker a CUDA_VISIBLE_DEVICES of its own
WORKER_DEVICES = {"a": "4,5", "b": "6,7"}


@pytest.fixture(scope="module")
def gpu_client():
    """A Dask cluster of 2 worker processes (the parts of a LocalCluster, with one environment
    per worker) that declare ``GPU=2`` each."""
    from distributed import Client, Nanny, Scheduler, SpecCluster

    workers = {
        name: {"cls": Nanny, "options": {"nthreads": 1, "host": "127.0.0.1",
                                         "resources": {"GPU": 2},
                                         "env": {"CUDA_VISIBLE_DEVICES": devices}}}
        for name, devices in WORKER_DEVICES.items()
    }
    scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard": False}}
    with SpecCluster(workers=workers, scheduler=scheduler) as cluster, Client(cluster) as client:
        client.wait_for_workers(len(workers), timeout=60)
        yield client


def test_dask_nodes_hold_gpus_of_their_own_worker(gpu_client):
    devices = gpu_client.run(lambda: os.environ["CUDA_VISIBLE_DEVICES"])  # by worker address
    with duotf.run(mains.describe_main, None, gpu_client, SPEC) as cluster:
        seen = cluster.wait()
        nodes = cluster.nodes
    # one node a worker, on that worker's first device
    assert sorted(s["executor_id"] for s in seen) == sorted(devices)
    for s in seen:
        first = devices[s["executor_id"]].split(",")[0]
        assert (s["gpus"], s["cuda_visible_devices"]) == ([first], first)
    assert [n.gpus for n in nodes] == [tuple(s["gpus"]) for s in seen]

    with pytest.raises(duotf.InsufficientSlotsError, match="--resources GPU=3"):
        duotf.run(mains.describe_main, None, gpu_client, duotf.ClusterSpec(gpus_per_node=3))


def test_dask_nodes_side_by_side_never_share_a_gpu(gpu_client):
    from duotf.backends.dask.backend import DaskBackend

    backend = DaskBackend(gpu_client)
    assert backend.check_gpus(2, 1) == 4  # two workers of GPU=2
    first, second = backend._place_gpus(2, 1), backend._place_gpus(2, 1)
    try:
        assert sorted(first) != sorted(second)
        assert sorted(first + second) == sorted((w, s) for w, _ in first for s in (0, 1))
        with pytest.raises(duotf.InsufficientSlotsError, match="GPUs free now"):
            backend._place_gpus(1, 1)
    finally:
        backend._release([w for w, _ in first], first)
        backend._release([w for w, _ in second], second)
    whole = backend._place_gpus(1, 2)  # all given back: a node of 2 GPUs takes slot 0
    backend._release([w for w, _ in whole], whole)
    assert whole[0][1] == 0
