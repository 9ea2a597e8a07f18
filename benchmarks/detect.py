"""How fast the driver notices a node killed with SIGKILL, on each backend.

    python benchmarks/detect.py [--repeat 5] [--spark-master spark://...]

Latency: from os.kill(node, SIGKILL) to cluster.wait() raising NodeFailedError. Goal: <= 10 s
(TensorFlowOnSpark notices only when its 600 s feed or reservation timeout runs out).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import time

from duotf._driver.cluster import shutdown_quietly
import duotf
from benchmarks.startup import add_backend_options, backends


def forever(args, ctx):
    while True:
        time.sleep(1)


def once(backend) -> float:
    cluster = duotf.run(forever, None, backend, duotf.ClusterSpec(workers=2))
    try:
        t0 = time.perf_counter()
        os.kill(cluster.nodes[1].pid, signal.SIGKILL)
        try:
            cluster.wait()
        except duotf.NodeFailedError:
            return time.perf_counter() - t0
        raise AssertionError("a killed node went unnoticed")
    finally:
        shutdown_quietly(cluster)


def cli():
    parser = argparse.ArgumentParser(description="kill -9 detection latency")
    add_backend_options(parser, repeat=5)
    opts = parser.parse_args()
    for name, backend, close in backends(opts):
        try:
            once(backend)  # warm-up
            runs = [once(backend) for _ in range(opts.repeat)]
        finally:
            close()
        print(f"{name:<24} kill -9 detected in median {statistics.median(runs) * 1000:.0f} ms, "
              f"max {max(runs) * 1000:.0f} ms (goal <= 10000 ms)")


if __name__ == "__main__":
    cli()
