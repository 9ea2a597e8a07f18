"""What sending the nodes' output and reports to the driver costs: feed throughput, and a node's
printing.

    python -m benchmarks.nodelogs [--rows 2000000 --epochs 5] [--lines 200000] [--repeat 3]

On a Dask LocalCluster (2 workers), alternately in the same run (the settings' order rotating
from one round to the next), median of ``--repeat``:

* feed: the tiny-row array of :mod:`benchmarks.feed` fed to 2 nodes (rows/s while every node
  reads), three ways: ``log_to_driver=False`` (the baseline: the output stays in the engine's
  task output, here a file); ``log_to_driver=True``; and ``log_to_driver=True`` with what a
  training loop sends at a realistic rate: ``ctx.report(step, rows, loss)`` every
  ``--report-every`` batches (default 100) and a printed line an epoch. Neither path has
  per-row work; this checks that the feed does not notice them (the cost is printed beside
  the baseline, in percent).
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
import statistics
import sys
import tempfile

import duotf
from benchmarks.feed import BATCH, dask_data, drain_main, feed_rates, quiet_tf


def print_main(args, ctx):
    import time as _time

    line = "x" * 79
    t0 = _time.perf_counter()
    for _ in range(args["lines"]):
        print(line)
    return _time.perf_counter() - t0


def report_drain_main(args, ctx):
    """:func:`benchmarks.feed.drain_main`'s loop, sending what a training loop sends: a report
    every ``every`` batches and a printed line each epoch."""
    import time as _time

    __import__("tensorflow")

    feed = ctx.get_data_feed(train=True)
    rows, batches, epoch = 0, 0, None
    marks = []
    step = 0
    for batch in feed.dataset(args["batch"]):
        rows += int(next(iter(batch.values())).shape[0])
        batches += 1
        if batches % args["every"] == 0:
            ctx.report(step=batches, rows=rows, loss=1.0 / batches)
        if feed.epoch != epoch:
            epoch = feed.epoch
            print(f"epoch {epoch}: {rows} rows read so far")
        last = _time.time()
        if rows >= step:
            marks.append((last, rows))
            step = rows + 20_000
    marks.append((last, rows))
    return {"rows": rows, "marks": marks, "reports": batches // args["every"]}


#: the feed runs compared: label -> (main, log_to_driver, reports)
FEED_RUNS = {
    "log_to_driver=False          ": (drain_main, False, False),
    "log_to_driver=True           ": (drain_main, True, False),
    "log_to_driver=True + reports ": (report_drain_main, True, True),
}


def feed_rate(client, data, epochs: int, label: str, every: int):
    main, log, reports = FEED_RUNS[label]
    with duotf.run(main, {"batch": BATCH, "every": every}, client, duotf.ClusterSpec(workers=2),
                   log_to_driver=log, progress=False) as cluster:
        cluster.train(data, epochs=epochs)
        results = cluster.wait()
    whole, steady, _ = feed_rates(results)
    got = len(cluster.metrics) if reports else None
    return steady or whole, got


def print_cost(client, lines: int, log: bool):
    with duotf.run(print_main, {"lines": lines}, client, log_to_driver=log) as cluster:
        (seconds,) = cluster.wait()
    if not log:
        return seconds, None
    text = cluster.logs(0)
    return seconds, sum(1 for x in text.splitlines() if x.startswith("xxx"))


def cli():
    quiet_tf()
    parser = argparse.ArgumentParser(description="cost of log_to_driver")
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--report-every", type=int, default=100,
                        help="batches between two reports in the reporting run (default 100)")
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
        feed_rate(client, data, 1, next(iter(FEED_RUNS)), opts.report_every)  # warm-up
        rates = {label: [] for label in FEED_RUNS}
        reports = []
        prints = {False: [], True: []}
        labels = list(FEED_RUNS)
        for r in range(opts.repeat):
            # each setting first, second and last in turn: a Dask worker's state drifts over a
            # run (memory, GC), and a fixed order would charge the drift to the later settings
            for label in labels[r % 3:] + labels[:r % 3]:
                rate, got = feed_rate(client, data, opts.epochs, label, opts.report_every)
                rates[label].append(rate)
                if got is not None:
                    reports.append(got)
            for log in (False, True):
                prints[log].append(print_cost(client, opts.lines, log))
    out.write(f"Dask LocalCluster (2 workers), {opts.rows:,} rows x {opts.epochs} epochs, "
              f"median of {opts.repeat} (the order of the settings rotating):\n")
    base = statistics.median(next(iter(rates.values())))
    for i, (label, runs) in enumerate(rates.items()):
        mid = statistics.median(runs)
        cost = f"  ({(base - mid) / base:+.1%} cost vs the first)" if i else ""
        out.write(f"  feed, tiny rows, {label}: {mid:>12,.0f} rows/s{cost}  "
                  f"(all: {', '.join(f'{r:,.0f}' for r in runs)})\n")
    out.write(f"  (the reporting runs: a report every {opts.report_every} batches of {BATCH} rows "
              f"per node and a line an epoch; {', '.join(map(str, reports))} reports reached "
              "cluster.metrics)\n")
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
