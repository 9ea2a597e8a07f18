"""What sending the nodes' output to the driver costs: feed throughput, and a node's printing.

    python -m benchmarks.nodelogs [--rows 2000000 --epochs 5] [--lines 200000] [--repeat 2]

On a Dask LocalCluster (2 workers), each measured with ``log_to_driver=False`` (the baseline:
the output stays in the engine's task output, here a file) and ``True``, alternately, in the
same run; best of ``--repeat``:

* feed: the tiny-row array of :mod:`benchmarks.feed` fed to 2 nodes (rows/s while every node
  reads). The output path has no per-row work; this checks that the feed does not notice it.
* printing: one node prints ``--lines`` lines of 80 bytes as fast as it can; the seconds its
  loop takes (the node is never made to wait for the driver: what is over the rate limit is
  dropped and counted), and the lines that reached the driver.

The benchmark's own stdout and stderr are sent to a temporary file while it runs (the nodes'
baseline output goes there, as an engine's task log); the figures are printed to the terminal.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import duotf  # noqa: E402
from benchmarks.feed import BATCH, dask_data, drain_main, feed_rates  # noqa: E402


def print_main(args, ctx):
    import time as _time

    line = "x" * 79
    t0 = _time.perf_counter()
    for _ in range(args["lines"]):
        print(line)
    return _time.perf_counter() - t0


def feed_rate(client, data, epochs: int, log: bool) -> float:
    with duotf.run(drain_main, {"batch": BATCH}, client, duotf.ClusterSpec(workers=2),
                   log_to_driver=log) as cluster:
        cluster.train(data, epochs=epochs)
        results = cluster.wait()
    whole, steady, _ = feed_rates(results)
    return steady or whole


def print_cost(client, lines: int, log: bool):
    with duotf.run(print_main, {"lines": lines}, client, log_to_driver=log) as cluster:
        (seconds,) = cluster.wait()
    if not log:
        return seconds, None
    text = cluster.logs(0)
    return seconds, sum(1 for x in text.splitlines() if x.startswith("xxx"))


def cli():
    parser = argparse.ArgumentParser(description="cost of log_to_driver")
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=2)
    opts = parser.parse_args()

    out = os.fdopen(os.dup(1), "w", buffering=1)
    sink = tempfile.TemporaryFile()
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(sink.fileno(), 1)
    os.dup2(sink.fileno(), 2)
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=None,
                      host="127.0.0.1") as lc, Client(lc) as client:
        data = dask_data(opts.rows, True, 250_000)
        feed_rate(client, data, 1, False)  # warm-up
        rates = {False: [], True: []}
        prints = {False: [], True: []}
        for _ in range(opts.repeat):
            for log in (False, True):
                rates[log].append(feed_rate(client, data, opts.epochs, log))
                prints[log].append(print_cost(client, opts.lines, log))
    out.write(f"Dask LocalCluster (2 workers), best of {opts.repeat}:\n")
    for log in (False, True):
        label = "log_to_driver=True " if log else "log_to_driver=False"
        out.write(f"  feed, tiny rows, {label}: {max(rates[log]):>12,.0f} rows/s  "
                  f"(all: {', '.join(f'{r:,.0f}' for r in rates[log])})\n")
    for log in (False, True):
        label = "log_to_driver=True " if log else "log_to_driver=False"
        seconds, got = min(prints[log])
        extra = "" if got is None else f"; {got:,} lines reached the driver, the rest dropped and counted"
        out.write(f"  {opts.lines:,} prints in a node, {label}: {seconds:.3f} s"
                  f" ({opts.lines / seconds:,.0f} lines/s){extra}\n")
    sink.seek(0)
    dropped = re.findall(rb"(\d+) lines dropped", sink.read())
    if dropped:
        out.write(f"  (the driver's log also holds {len(dropped)} 'lines dropped' notes)\n")


if __name__ == "__main__":
    cli()
