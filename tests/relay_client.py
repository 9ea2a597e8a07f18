"""A Spark Connect client that the executors cannot reach, run by tests/test_connect_relay.py
inside a network namespace of its own (tests/hosts.py): it trains, reads node output and a
node's failure through the relay (with TLS on), runs `duotf.doctor`, and prints what it saw as one JSON line.

    python tests/relay_client.py sc://127.0.0.1:15002
"""

from __future__ import annotations

import json
import logging
import sys
from collections import Counter

import duotf
from duotf.errors import NodeFailedError

ROWS = 1000


def ids_main(args, ctx):
    """Every id this node is fed, and one line of output and one metric through the relay."""
    print(f"node {ctx.task_index} says hello", flush=True)
    feed = ctx.get_data_feed(train=True)
    seen = []
    while not feed.should_stop():
        seen += [int(i) for i in feed.next_batch(100)]  # one column: its values
    ctx.report(rows=len(seen))
    return seen


def failing_main(args, ctx):
    """Worker 1 fails at its first batch: once the run has started (its ``duotf.run`` has
    returned), so that the job's settings can be read off its cluster first."""
    feed = ctx.get_data_feed(train=True)
    while not feed.should_stop():
        feed.next_batch(100)
        if ctx.task_index == 1:
            raise ValueError("worker 1 fails on purpose")


def main(url: str) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(url).getOrCreate()
    df = spark.range(0, ROWS, numPartitions=4).selectExpr("id")
    out = {}
    with duotf.run(ids_main, backend=spark, spec=duotf.ClusterSpec(workers=2)) as cluster:
        out["relayed"] = cluster.supervisor.relayed
        cluster.train(df, epochs=2)
        seen = Counter(i for ids in cluster.wait() for i in ids)
        out["exactly_twice"] = sorted(seen) == list(range(ROWS)) and set(seen.values()) == {2}
        out["rows"] = sum(seen.values())
        metrics = cluster.metrics
        out["metrics"] = sorted(zip(metrics["node"], metrics["rows"].astype(int)))
    try:  # with TLS: the relay forwards the encrypted control channel as it is
        with duotf.run(failing_main, backend=spark, spec=duotf.ClusterSpec(workers=2),
                       heartbeat_timeout=20, tls=True) as cluster:
            out["tls_relayed"] = cluster.supervisor.relayed and cluster.tls is not None
            cluster.train(df, epochs=1)
            cluster.wait()
    except NodeFailedError as exc:
        out["failure"] = str(exc).splitlines()[0]
    report = duotf.doctor(spark, duotf.ClusterSpec(workers=2))
    out["doctor"] = {check.name: [str(check.status), check.detail] for check in report.checks}
    spark.stop()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
