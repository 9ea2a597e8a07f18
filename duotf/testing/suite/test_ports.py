"""``DUOTF_PORTS`` / ``duotf.run(..., ports=)``: every port a run listens on lies in the range,
on the driver (the rendezvous server) and in every node process (its feed server and its
TensorFlow server, on the port its engine task reserved). ``DUOTF_BIND``: every server but
TensorFlow's own listens on its host's address in the network it names."""

from __future__ import annotations

import ipaddress
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


@pytest.mark.engines("local", "dask", "spark-local", "spark-standalone", "dask-hosts")
def test_duotf_bind_puts_every_server_on_its_hosts_address_in_the_network(backend, engine):
    hosts = getattr(engine, "hosts", None)  # separate hosts: the network they share
    network = ipaddress.ip_network(f"10.213.{hosts.subnet}.0/24" if hosts else "127.0.0.0/8")
    with duotf.run(mains.listening_main, {"addresses": True}, backend, duotf.ClusterSpec(workers=2),
                   env={"DUOTF_BIND": str(network)}) as cluster:
        driver = cluster.supervisor.server.address[0]
        nodes = [(node.host, node.port) for node in cluster.nodes]
        listening = cluster.wait(timeout=120)
    assert ipaddress.ip_address(driver) in network, driver
    for (host, tf_port), sockets in zip(nodes, listening):
        assert ipaddress.ip_address(host) in network, host  # the address a node says it has
        # its feed server on that address; TensorFlow's own server listens on every interface
        ours = [(ip, port) for ip, port in sockets if port != tf_port]
        assert ours and all(ip == host for ip, _ in ours), (host, sockets)
