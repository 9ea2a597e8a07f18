"""Startup and shutdown time of a duotf cluster on each backend, beside a bare TF import.

    python benchmarks/startup.py                     # local, dask, spark local[2]
    python benchmarks/startup.py --spark-master spark://127.0.0.1:7077
    python -m benchmarks.startup --json startup.json  # also the figures as JSON (benchmarks/record.py)

startup   : from calling duotf.run() to every node's main running (its first line)
ready     : from duotf.run() to every main having imported TensorFlow (a TF program's real start)
shutdown  : shutdown() of a 1 worker + 1 ps cluster, called as soon as run() returns: it waits
            for the worker's main, stops the serving ps and releases every process, thread, port
Goal: startup + TF import (ready) <= one TF import + 2 s; shutdown < 2 s. Median of --repeat runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

if not __package__:  # run as a script (python benchmarks/startup.py): benchmarks/ from its root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import duotf  # noqa: E402
from benchmarks.record import Record  # noqa: E402


def tf_import_seconds() -> float:
    code = "import time; t = time.perf_counter(); import tensorflow; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"})
    return float(out.stdout.strip().splitlines()[-1])


def timed_main(args, ctx):
    entered = time.time()
    if args["import_tf"]:
        __import__("tensorflow")  # what a TF program does first
    return entered, time.time()


def measure(backend, import_tf: bool):
    env = {"TF_CPP_MIN_LOG_LEVEL": "3"}
    t0 = time.time()
    with duotf.run(timed_main, {"import_tf": import_tf}, backend, duotf.ClusterSpec(workers=2), env=env) as c:
        stamps = c.wait()
    startup = max(s[0] for s in stamps) - t0
    ready = max(s[1] for s in stamps) - t0
    # run() returns once the ps serves; shutdown() then waits for the worker's main, stops the
    # ps server and releases every process, thread and port.
    cluster = duotf.run(timed_main, {"import_tf": False}, backend, duotf.ClusterSpec(workers=1, ps=1), env=env)
    t1 = time.perf_counter()
    cluster.shutdown()
    assert cluster.nodes[1].state == "stopped"
    return startup, ready, time.perf_counter() - t1


def add_backend_options(parser: argparse.ArgumentParser, repeat: int) -> None:
    """The options that :func:`backends` reads, shared by the benchmarks that use it."""
    parser.add_argument("--repeat", type=int, default=repeat)
    parser.add_argument("--backends", nargs="*", default=["local", "dask", "spark"])
    parser.add_argument("--spark-master", default=None)


def backends(opts):
    if "local" in opts.backends:
        yield "local", None, lambda: None
    if "dask" in opts.backends:
        from distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=None, host="127.0.0.1")
        client = Client(cluster)
        yield "dask", client, lambda: (client.close(), cluster.close())
    if "spark" in opts.backends:
        from pyspark.sql import SparkSession

        master = opts.spark_master or "local[2]"
        session = (SparkSession.builder.master(master).config("spark.ui.enabled", "false")
                   .config("spark.ui.showConsoleProgress", "false")
                   .config("spark.driver.host", "127.0.0.1").getOrCreate())
        session.sparkContext.setLogLevel("ERROR")
        yield f"spark {master}", session, session.stop


def cli():
    parser = argparse.ArgumentParser(description="duotf startup/shutdown benchmark")
    add_backend_options(parser, repeat=3)
    parser.add_argument("--json", metavar="PATH",
                        help="also write every run's seconds and the run's command, settings and "
                             "machine to PATH (benchmarks/record.py)")
    opts = parser.parse_args()
    record = Record("startup", vars(opts)) if opts.json else None

    imports = [tf_import_seconds() for _ in range(opts.repeat)]
    tf_import = statistics.median(imports)
    print(f"bare 'import tensorflow' (fresh process): {tf_import:.2f} s")
    print(f"{'backend':<22}{'startup':>9}{'ready(+TF)':>12}{'goal':>8}{'shutdown':>10}")
    for name, backend, close in backends(opts):
        try:
            measure(backend, import_tf=False)  # warm-up: engine workers, page cache
            runs = [measure(backend, import_tf=True) for _ in range(opts.repeat)]
        finally:
            close()
        startup, ready, shutdown = (statistics.median(r[i] for r in runs) for i in range(3))
        print(f"{name:<22}{startup:>8.2f}s{ready:>11.2f}s{tf_import + 2:>7.2f}s{shutdown:>9.2f}s"
              f"   ready/goal={ready / (tf_import + 2):.2f}")
        if record:
            record_runs(record, name, runs)
    if record:
        record.add("seconds", "s", imports, peer="TensorFlow", case="import tensorflow",
                   chart=STARTED, label="bare 'import tensorflow' (fresh process)")
        record.add("seconds", "s", [tf_import + 2], peer="goal", case="ready", chart=STARTED,
                   label="goal for ready: one TF import + 2 s", reference=True)
        record.add("seconds", "s", [2.0], peer="goal", case="shutdown", chart=SHUTDOWN,
                   label="goal: 2 s", reference=True)
        record.write(opts.json)


#: the charts: run() to every main running (startup) and to every main having imported TF
#: (ready); shutdown() of a 1 worker + 1 ps cluster, called as soon as run() returns
STARTED = "startup and ready (TF imported)"
SHUTDOWN = "shutdown of a serving ps"


def record_runs(record, name: str, runs) -> None:
    """One backend's runs as rows of ``record``: each run's startup, ready and shutdown."""
    for i, (case, chart) in enumerate([("startup", STARTED), ("ready", STARTED),
                                       ("shutdown", SHUTDOWN)]):
        record.add("seconds", "s", [r[i] for r in runs], peer="duotf", backend=name, case=case,
                   chart=chart, label=f"{name}: {case}")


if __name__ == "__main__":
    cli()
