"""A Spark Connect client that the executors cannot reach (issue 33, part 2), for real: the
client runs in a network namespace of its own (tests/hosts.py) that can open connections to
the Connect server's port and nothing else, and no executor can open one to it. duotf finds
that out by itself, runs the nodes' rendezvous through a relay in the cluster
(duotf/_transport/relay.py, duotf/backends/spark/relay.py), and the job runs as it would
beside the cluster: every row once an epoch, node output and metrics at the client, a node's
failure raised there; `duotf.doctor` says it relays; no relay process is left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from duotf.testing import poll_for
from tests import hosts

UNAVAILABLE = hosts.unavailable()
pytestmark = [pytest.mark.skipif(UNAVAILABLE is not None, reason=str(UNAVAILABLE)),
              pytest.mark.timeout(420)]

HERE = os.path.dirname(os.path.abspath(__file__))


def _relays() -> list:
    out = subprocess.run(["pgrep", "-f", "duotf._transport.relay"], capture_output=True, text=True)
    return out.stdout.split()


def test_a_client_the_executors_cannot_reach_trains_through_the_relay(spark_connect_server):
    port = int(spark_connect_server.rsplit(":", 1)[1])
    root = os.path.dirname(HERE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    env.pop("DUOTF_RELAY", None)  # the client must find out by itself
    with hosts.client_namespace(port) as namespace:
        done = subprocess.run(hosts.in_namespace(namespace, [sys.executable, os.path.join(HERE, "relay_client.py"),
                                                             "sc://127.0.0.1:15002"]),
                              capture_output=True, text=True, env=env, timeout=400, cwd=root)
    assert done.returncode == 0, done.stderr[-6000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    log = done.stderr
    assert "the executors cannot reach this client" in log, log[-4000:]
    assert "the nodes reach this client through a relay on" in log
    assert out["relayed"] is True
    assert out["exactly_twice"] is True and out["rows"] == 2000
    assert out["metrics"] == [["worker:0", out["metrics"][0][1]], ["worker:1", out["metrics"][1][1]]]
    assert sum(rows for _, rows in out["metrics"]) == 2000
    assert "[worker:1] node 1 says hello" in log and "[worker:0] node 0 says hello" in log
    assert "worker:1" in out["failure"] and "worker 1 fails on purpose" in out["failure"]
    assert out["tls_relayed"] is True  # that failure came through the relay, encrypted
    status, detail = out["doctor"]["driver port"]
    assert status.lower() == "ok" and "through a relay in the cluster" in detail, out["doctor"]
    poll_for(lambda: not _relays(), 30, 0.1, "every relay hub to end")
