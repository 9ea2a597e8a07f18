"""Where a default ``cluster.train(df, epochs=N)`` on Spark spends its time: the same 10-epoch run
several times in one session, printing when each epoch's rows had all been read (from the
nodes' own marks), the executors' JVM CPU, and a plain ``mapInArrow`` pass over the DataFrame
with its array column packed in the JVM and not.

    python -m benchmarks.first_epoch --spark-master spark://127.0.0.1:7177 [--rounds 3]

Set ``DUOTF_SPARK_PACK_ARRAYS=0`` to run the training rounds with Spark's own Arrow conversion.
``--inference`` instead runs ``cluster.inference(df)`` keeping every column and keeping only
the label, alternately, to show what carrying the input columns through costs.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time

import duotf
from benchmarks.feed import (BATCH, _when_ready, checkout_on_executors, drain_main, executor_cpu,
                             identity_main, quiet_tf, spark_data)


def _drain(batches):
    import pyarrow as pa

    yield pa.RecordBatch.from_pydict({"n": [sum(b.num_rows for b in batches)]})


def epoch_times(session, df, epochs: int, rows: int):
    ready = tempfile.mkdtemp(prefix="duotf-bench-ready-")
    with duotf.run(drain_main, {"batch": BATCH, "ready": ready}, session,
                   duotf.ClusterSpec(workers=2)) as cluster:
        start = _when_ready(ready, 2)
        jvm = executor_cpu()
        cluster.train(df, epochs=epochs)
        jvm = executor_cpu() - jvm
        results = cluster.wait()
    shutil.rmtree(ready, ignore_errors=True)
    steps = []  # (time, rows read since the mark before) over both nodes
    for result in results:
        before = 0
        for t, n in result["marks"]:
            steps.append((t, n - before))
            before = n
    ends, total, goal = [], 0, rows
    for t, n in sorted(steps):
        total += n
        while total >= goal:
            ends.append(t - start)
            goal += rows
    return ends, jvm


def inference_rate(session, df, keep) -> float:
    ready = tempfile.mkdtemp(prefix="duotf-bench-ready-")
    with duotf.run(identity_main, {"batch": 1000, "ready": ready}, session,
                   duotf.ClusterSpec(workers=2)) as cluster:
        start = _when_ready(ready, 2)
        n = cluster.inference(df, keep=keep, result_columns={"prediction": "double"}).count()
        results = cluster.wait()
    shutil.rmtree(ready, ignore_errors=True)
    return n / (max(r["last"] for r in results) - start)


def main():
    quiet_tf()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spark-master", default="local[3]")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--inference", action="store_true")
    opts = parser.parse_args()
    from pyspark.sql import SparkSession

    from duotf.backends.spark.frames import arrow_source

    session = checkout_on_executors(
        SparkSession.builder.master(opts.spark_master).config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")).getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    df = spark_data(session, opts.rows, False, 8)
    if opts.inference:
        for n in range(opts.rounds):
            for keep in (None, ["label"]):
                print(f"inference round {n + 1}, keep={keep}: "
                      f"{inference_rate(session, df, keep):,.0f} rows/s", flush=True)
        session.stop()
        return
    for n in range(opts.rounds):
        ends, jvm = epoch_times(session, df, opts.epochs, opts.rows)
        gaps = [b - a for a, b in zip([0.0] + ends, ends)]
        print(f"round {n + 1}: {opts.rows * opts.epochs / ends[-1]:,.0f} rows/s; first epoch "
              f"{gaps[0]:.2f} s, later epochs {min(gaps[1:]):.2f}-{max(gaps[1:]):.2f} s; executors' "
              f"JVM CPU {jvm:.2f} s", flush=True)
    packed, _ = arrow_source(df)
    for n in range(opts.rounds):
        for label, data in [("Spark's Arrow conversion", df), ("packed in the JVM", packed)]:
            jvm, t0 = executor_cpu(), time.perf_counter()
            data.mapInArrow(_drain, "n long").collect()
            print(f"mapInArrow pass {n + 1}, {label:25}: {time.perf_counter() - t0:.2f} s, executors' "
                  f"JVM CPU {executor_cpu() - jvm:.2f} s", flush=True)
    session.stop()


if __name__ == "__main__":
    main()
