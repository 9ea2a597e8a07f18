"""How fast the driver notices a node that died, on each backend, quiet and under CPU load.

    python -m benchmarks.detect [--repeat 5] [--backends local dask spark] [--spark-master URL]
                                [--load 24]

Two cases, each the median (and max) of ``--repeat`` runs:

* **idle**: ``os.kill(node, SIGKILL)`` while the nodes wait, to ``cluster.wait()`` raising
  :class:`~duotf.errors.NodeFailedError`;
* **mid-feed**: a node that exits (``os._exit``) after its first batch of a 50-epoch
  ``cluster.train()``, from the moment it exits (a time it writes to a file first) to
  ``train()`` raising.

``--load N`` runs every case again beside N busy processes (``while True: pass``), alternating
quiet and loaded runs (the VM is noisy). Goal: <= 10 s either way (TensorFlowOnSpark notices
only when its 600 s feed or reservation timeout runs out). A standalone master for ``--spark-master``:
``$SPARK_HOME/sbin/start-master.sh`` and ``start-worker.sh spark://127.0.0.1:7077 --cores 3``
(twice, ``SPARK_WORKER_INSTANCES=2``), with ``PYSPARK_PYTHON`` set to this Python.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import duotf
from duotf._driver.cluster import shutdown_quietly
from benchmarks.startup import add_backend_options, backends


def forever(args, ctx):
    while True:
        time.sleep(1)


def die_mid_feed(args, ctx):
    feed = ctx.get_data_feed(train=True)
    feed.next_batch(10)
    if ctx.task_index == 1:
        with open(args["stamp"], "w") as f:
            f.write(repr(time.time()))
        os._exit(3)  # mid-feed, no exception, no goodbye
    while not feed.should_stop():
        feed.next_batch(10)


def idle(backend) -> float:
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


def _rows(backend, parts):
    if backend is None:
        return parts
    if hasattr(backend, "sparkContext"):
        return backend.sparkContext.parallelize([r for p in parts for r in p], len(parts))
    import dask
    import dask.bag as db

    return db.from_delayed([dask.delayed(list)(p) for p in parts])


def mid_feed(backend) -> float:
    parts = [[(float(i), i) for i in range(p * 20_000, (p + 1) * 20_000)] for p in range(4)]
    data = _rows(backend, parts)
    with tempfile.TemporaryDirectory() as folder:
        stamp = os.path.join(folder, "stamp")
        cluster = duotf.run(die_mid_feed, {"stamp": stamp}, backend, duotf.ClusterSpec(workers=2))
        try:
            try:
                cluster.train(data, epochs=50)
            except duotf.NodeFailedError:
                return time.time() - float(open(stamp).read())
            raise AssertionError("a node that died mid-feed went unnoticed")
        finally:
            shutdown_quietly(cluster)


@contextlib.contextmanager
def busy(n: int):
    """``n`` processes spinning on the CPUs while the block runs."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def cli():
    parser = argparse.ArgumentParser(description="how fast a dead node is noticed")
    add_backend_options(parser, repeat=5)
    parser.add_argument("--load", type=int, default=0, help="busy processes beside the loaded runs")
    opts = parser.parse_args()
    loads = [0, opts.load] if opts.load else [0]
    for name, backend, close in backends(opts):
        try:
            idle(backend), mid_feed(backend)  # warm-up
            runs = {(case, load): [] for case in ("idle", "mid-feed") for load in loads}
            for _ in range(opts.repeat):
                for load in loads:  # quiet and loaded, alternating
                    with busy(load):
                        runs["idle", load].append(idle(backend))
                        runs["mid-feed", load].append(mid_feed(backend))
        finally:
            close()
        for (case, load), seconds in runs.items():
            where = f"beside {load} busy processes" if load else "quiet"
            print(f"{name:<28} {case:<9} {where:<26} detected in median "
                  f"{statistics.median(seconds) * 1000:6.0f} ms, max {max(seconds) * 1000:6.0f} ms "
                  f"(goal <= 10000 ms)")


if __name__ == "__main__":
    cli()
