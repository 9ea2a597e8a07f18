"""One pass over a cached DataFrame, and inference, beside Spark's own fastest pass over it.

    python -m benchmarks.one_pass [--rows 1000000] [--pairs 3] [--partitions N]
                                  [--spark-master local[3] | --standalone]
                                  [--with-tfos [WHEEL] [--tfos-rows N]] [--limit-rows N]
                                  [--json PATH]

One Spark session caches the MNIST-like DataFrame (``benchmarks.mnist``: 784 float32 in an
``array<float>`` column and an int64 label, ``benchmarks.feed.spark_data``) and computes it
before any timing; then ``--pairs`` rounds each run, in an order that turns by one place a
round, these five on it:

- **scan**: Spark's own fastest pass over the cached DataFrame, ``df.mapInArrow(f, "n long")``
  with an ``f`` that discards its Arrow batches and yields one row, their count, collected:
  the physical limit of getting the rows out of Spark into Python; from the call to the
  collect's return;
- **one pass**: ``cluster.train(df, epochs=1)`` into 2 nodes that drain
  ``ctx.get_data_feed().dataset(100)`` (``benchmarks.feed.run_duotf`` and ``drain_main``):
  from ``train()`` (called once both nodes have imported TensorFlow) to the last batch a node
  read; beside it the seconds from ``train()`` and from ``duotf.run()`` to every node's first
  batch, the rate of the whole job from ``duotf.run()`` (the nodes' start and TF's import in
  it) and ``train()``'s report's ``count_seconds``;
- **scan + write back**: the scan with one double a row written back, the shape of
  inference's answers: ``df.mapInArrow(g, "prediction double")`` with a ``g`` that answers each
  row with its label, its output written with Spark's ``noop`` format;
- **inference**: ``cluster.inference(df)`` into 2 nodes that answer each row with its label
  (``benchmarks.feed.run_inference`` and ``identity_main``), every column kept (the default),
  its output written with the ``noop`` format as the scan's is: from ``inference()`` to that
  write's return. The ``noop`` write runs every partition of the plan to its end and keeps
  every column in it, where a ``count()`` may leave columns out; both sides are written alike.
  The rate to the nodes' last answer (what ``benchmarks.feed`` reports) is printed beside it;
- **limit**: the in-process ``tf.data`` limit (``benchmarks.feed.limit``:
  ``from_tensor_slices((x, y)).batch(100)`` drained here, warm, best of two), on
  ``--limit-rows`` rows (default: ``--rows``, at most 250,000, so that its arrays stay under
  800 MB) repeated to drain as many rows as the DataFrame holds.

Each round prints its five rates and its pairs' ratios (one pass / scan, inference / scan with
write back, one pass / limit); the end prints the medians of the rates and of the pairs'
ratios, against the goals of issue 36: one pass >= 80 % of the scan at 1,000,000 rows,
inference >= 80 % of the scan with write back, and >= 50x TensorFlowOnSpark. The session's
first run of each Spark case comes before the rounds as its warm-up, printed and not counted
(it starts the executors' Python workers and compiles the JVMs' paths).

``--with-tfos [WHEEL]``: after the rounds (the session stopped), TensorFlowOnSpark 2.2.5's
inference (``benchmarks.tfos_feed``, InputMode.SPARK, ``batch_results``) on the same
DataFrame's rows (``df.rdd`` as tuples, cached) on the same standalone cluster, on
``--tfos-rows`` rows (default ``--rows``; TFoS answers about 2,000 rows/s, so 1,000,000 rows
take over 8 minutes: a smaller count is said beside its rate); printed: duotf's inference over
TFoS's. TFoS needs a standalone master (``--standalone`` or ``--spark-master spark://...``).

``--standalone`` starts a standalone master and 2 workers of 2 cores on 127.0.0.1 for the run
(the shape of issue 36's figures; ``tests.conftest.standalone_cluster``) and stops them after.
``--json PATH`` writes every figure, the command, settings and machine to PATH
(``benchmarks/record.py``; ``benchmarks/charts.py`` draws them).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from benchmarks.feed import (checkout_on_executors, limit, quiet_tf, run_duotf, run_inference,
                             spark_data, tfos_wheel)
from benchmarks.first_epoch import _drain
from benchmarks.mnist import ROW_BYTES
from benchmarks.record import Record

#: the cases of a round, in the first round's order (each later round starts one place on)
CASES = ("scan", "one pass", "scan + write back", "inference", "limit")
#: the pairs whose ratios are printed: (name, numerator, denominator, goal or None)
PAIRS = (("one pass / scan", "one pass", "scan", 0.8),
         ("inference / scan with write back", "inference", "scan + write back", 0.8),
         ("one pass / limit", "one pass", "limit", None))
#: duotf's inference over TFoS's, the goal of issue 36 (item 3)
TFOS_GOAL = 50.0
#: the rows at which issue 36 sets the one-pass goal
GOAL_ROWS = 1_000_000
TFOS = "TensorFlowOnSpark 2.2.5"


def _answer(batches):
    """Each row answered with its label as a double: the identity model's answers, in Arrow."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for batch in batches:
        yield pa.RecordBatch.from_arrays([pc.cast(batch.column("label"), pa.float64())],
                                         ["prediction"])


def write_noop(out) -> None:
    """Compute every partition of ``out`` to its end, every column kept, writing nothing."""
    out.write.format("noop").mode("overwrite").save()


def scan(df, rows: int) -> dict:
    """Spark's own pass: every Arrow batch to a Python worker and discarded; collected."""
    t0 = time.perf_counter()
    got = sum(row[0] for row in df.mapInArrow(_drain, "n long").collect())
    seconds = time.perf_counter() - t0
    assert got == rows, (got, rows)
    return {"rate": rows / seconds, "seconds": seconds}


def scan_write_back(df, rows: int) -> dict:
    """The scan with one double a row written back (``noop``)."""
    t0 = time.perf_counter()
    write_noop(df.mapInArrow(_answer, "prediction double"))
    seconds = time.perf_counter() - t0
    return {"rate": rows / seconds, "seconds": seconds}


def one_pass(session, df, rows: int) -> dict:
    figures: dict = {}
    run_duotf(session, df, 1, ROW_BYTES, "", quiet=True, figures=figures)
    assert figures["rows"] == rows, (figures["rows"], rows)
    figures["count_seconds"] = figures.pop("report")["count_seconds"]
    return figures


def inference(session, df, rows: int) -> dict:
    def written(out):  # the output written; every row was answered (run_inference checks)
        write_noop(out)
        return rows

    figures: dict = {}
    run_inference(session, df, ROW_BYTES, "", written, quiet=True, figures=figures)
    figures["to_last_answer"] = figures["rate"]
    figures["seconds"] = figures["call_seconds"] + figures["read_seconds"]
    figures["rate"] = rows / figures["seconds"]
    return figures


def describe(case: str, got: dict) -> str:
    """One case's line."""
    line = f"{case:<18} {got['rate']:>10,.0f} rows/s in {got['seconds']:6.2f} s"
    if case == "one pass":
        line += (f" (train() to the last batch); every node's first batch {got['first_after_call']:.2f} s "
                 f"after train(), {got['first_after_run']:.2f} s after duotf.run(); whole job from "
                 f"duotf.run() {got['job_seconds']:.2f} s = {got['job_rate']:,.0f} rows/s; train()'s "
                 f"count_seconds {got['count_seconds']:.2f}")
    elif case == "inference":
        line += (f" (inference() {got['call_seconds']:.2f} s + writing its output "
                 f"{got['read_seconds']:.2f} s); to the nodes' last answer {got['to_last_answer']:,.0f} "
                 f"rows/s; every node's first answer {got['first_after_call']:.2f} s after "
                 f"inference(), {got['first_after_run']:.2f} s after duotf.run()")
    elif case == "limit":
        line += f" ({got['limit_rows']:,} rows x {got['epochs']} epochs)"
    return line


def order(round_: int) -> tuple:
    """The cases of round ``round_`` (0-based): ``CASES`` turned by ``round_`` places."""
    k = round_ % len(CASES)
    return CASES[k:] + CASES[:k]


def verdict(value: float, goal: float, note: str = "", unit: str = "") -> str:
    return f"goal >= {goal:g}{unit}: {'met' if value >= goal else 'NOT met'}{note}"


def rounds(session, df, opts, x, y) -> dict:
    """The warm-up, then ``opts.pairs`` rounds; every case's figures, a list a case."""
    epochs = max(1, round(opts.rows / len(x)))

    def run(case):
        if case == "scan":
            return scan(df, opts.rows)
        if case == "one pass":
            return one_pass(session, df, opts.rows)
        if case == "scan + write back":
            return scan_write_back(df, opts.rows)
        if case == "inference":
            return inference(session, df, opts.rows)
        rate = limit(x, y, epochs)
        return {"rate": rate, "seconds": len(x) * epochs / rate, "limit_rows": len(x), "epochs": epochs}

    print("warm-up, the session's first run of each Spark case (not counted):", flush=True)
    for case in CASES[:-1]:
        print(f"  {describe(case, run(case))}", flush=True)
    got: dict = {case: [] for case in CASES}
    for r in range(opts.pairs):
        print(f"round {r + 1} of {opts.pairs}:", flush=True)
        for case in order(r):
            got[case].append(run(case))
            print(f"  {describe(case, got[case][-1])}", flush=True)
        print("  " + "; ".join(f"{name} = {got[a][-1]['rate'] / got[b][-1]['rate']:.2f}"
                               for name, a, b, _ in PAIRS), flush=True)
    return got


def summary(opts, got: dict, tfos) -> None:
    """The medians, the pairs' ratios, and each goal met or not."""
    print(f"summary, {opts.rows:,} rows, {opts.pairs} rounds (median rows/s; each round's in brackets):")
    for case in CASES:
        rates = [g["rate"] for g in got[case]]
        print(f"  {case:<18} {statistics.median(rates):>10,.0f}  "
              f"({', '.join(f'{x:,.0f}' for x in rates)})")
    runs = got["one pass"]
    for key, what in [("first_after_call", "s from train() to every node's first batch"),
                      ("first_after_run", "s from duotf.run() to every node's first batch"),
                      ("job_rate", "rows/s, the whole job from duotf.run()"),
                      ("count_seconds", "s, train()'s count_seconds")]:
        values = [g[key] for g in runs]
        fmt = "{:,.0f}" if key == "job_rate" else "{:.2f}"
        print(f"  one pass: {fmt.format(statistics.median(values)):>8} {what} "
              f"({', '.join(fmt.format(v) for v in values)})")
    values = [g["to_last_answer"] for g in got["inference"]]
    print(f"  inference: {statistics.median(values):,.0f} rows/s to the nodes' last answer "
          f"({', '.join(f'{v:,.0f}' for v in values)})")
    print("ratios, by pair (median):")
    for name, a, b, goal in PAIRS:
        ratios = [x["rate"] / y["rate"] for x, y in zip(got[a], got[b])]
        median = statistics.median(ratios)
        line = f"  {name:<34} {median:5.2f}  ({', '.join(f'{x:.2f}' for x in ratios)})"
        if goal is not None:
            note = ""
            if a == "one pass" and opts.rows != GOAL_ROWS:
                note = f" (issue 36 sets it at {GOAL_ROWS:,} rows; this run has {opts.rows:,})"
            line += f"  {verdict(median, goal, note)}"
        print(line)
    if tfos is not None:
        rate, rows = tfos
        ours = statistics.median(g["rate"] for g in got["inference"])
        last = statistics.median(g["to_last_answer"] for g in got["inference"])
        fewer = f", measured on {rows:,} rows, fewer than duotf's {opts.rows:,}" if rows != opts.rows else ""
        print(f"  duotf inference / TFoS inference {ours / rate:5.1f}x  (TFoS {rate:,.0f} rows/s{fewer}; "
              f"duotf to its output written; to its last answer, as TFoS is timed, "
              f"{last / rate:.1f}x)  {verdict(ours / rate, TFOS_GOAL, unit='x')}")


def record_all(record: Record, opts, got: dict, tfos, master: str) -> None:
    """Every figure as rows of ``record``, a chart a comparison, each titled with the rows and
    the master (``standalone`` for a ``spark://`` one), so that runs of one size on two masters
    draw into files of their own."""
    rows = opts.rows
    where = f"{rows:,} rows on {'standalone' if master.startswith('spark://') else master}"
    chart = f"{where}: one pass and inference beside Spark's scan"
    labels = {"scan": ("Spark", "Spark's scan: mapInArrow, batches discarded"),
              "one pass": ("duotf", "train(df, epochs=1), 2 nodes"),
              "scan + write back": ("Spark", "Spark's scan + a double a row written back (noop)"),
              "inference": ("duotf", "inference(df), output written (noop)"),
              "limit": ("in-process limit", "from_tensor_slices(...).batch(100)")}
    for case in CASES:
        peer, label = labels[case]
        extra = {}
        if case == "one pass":
            extra = {k: [g[k] for g in got[case]] for k in
                     ("first_after_call", "first_after_run", "job_seconds", "job_rate", "count_seconds")}
        elif case == "inference":
            extra = {k: [g[k] for g in got[case]] for k in
                     ("to_last_answer", "call_seconds", "read_seconds", "first_after_call", "first_after_run")}
        record.add("rows/s", "rows/s", [g["rate"] for g in got[case]], peer=peer, backend="spark",
                   case=case, chart=chart, label=label, **extra)
    ratios = f"{where}: ratios by pair"
    for name, a, b, _ in PAIRS:
        record.add("ratio", "x", [x["rate"] / y["rate"] for x, y in zip(got[a], got[b])], peer="duotf",
                   backend="spark", case=name, chart=ratios, label=name)
    record.add("ratio", "x", [0.8], peer="goal", case="goal", chart=ratios, label="goal: 0.8",
               reference=True)
    first = f"{where}: one pass, to every node's first batch"
    for key, label in [("first_after_call", "from train()"), ("first_after_run", "from duotf.run()"),
                       ("count_seconds", "train()'s count_seconds")]:
        record.add("seconds", "s", [g[key] for g in got["one pass"]], peer="duotf", backend="spark",
                   case=key, chart=first, label=label)
    if tfos is not None:
        rate, tfos_rows = tfos
        versus = f"{where}: inference, duotf and TFoS"
        record.add("rows/s", "rows/s", [g["rate"] for g in got["inference"]], peer="duotf",
                   backend="spark", case="inference", chart=versus, label=labels["inference"][1])
        record.add("rows/s", "rows/s", [rate], peer=TFOS, backend="spark", case="tfos-inference",
                   chart=versus, label=f"inference, df.rdd, {tfos_rows:,} rows", rows=tfos_rows)
        over = f"{where}: duotf's inference over TFoS's"
        record.add("duotf / TFoS", "x", [g["rate"] / rate for g in got["inference"]], peer="duotf",
                   backend="spark", case="inference / TFoS", chart=over, label="inference / TFoS")
        record.add("duotf / TFoS", "x", [TFOS_GOAL], peer="goal", case="goal", chart=over,
                   label=f"goal: {TFOS_GOAL:g}x", reference=True)


def measure(opts, master: str, record) -> None:
    from pyspark.sql import SparkSession

    limit_rows = opts.limit_rows or min(opts.rows, 250_000)
    x = np.random.default_rng(0).random((limit_rows, 784), dtype=np.float32)
    y = np.arange(limit_rows, dtype=np.int64) % 10
    session = checkout_on_executors(
        SparkSession.builder.master(master).config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")).getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    try:
        t0 = time.perf_counter()
        df = spark_data(session, opts.rows, False, opts.partitions)
        print(f"Spark {master} (its defaults; the executors' PYTHONPATH names this checkout), "
              f"{opts.rows:,} MNIST-like rows in {opts.partitions} partitions, cached and computed "
              f"in {time.perf_counter() - t0:.1f} s", flush=True)
        got = rounds(session, df, opts, x, y)
        df.unpersist()
    finally:
        session.stop()
    del x, y
    tfos = None
    if opts.with_tfos is not None:
        from benchmarks import tfos_feed

        tfos_rows = opts.tfos_rows or opts.rows
        print(f"TensorFlowOnSpark 2.2.5, inference on {tfos_rows:,} of the DataFrame's rows"
              + ("" if tfos_rows == opts.rows else f" (fewer than {opts.rows:,}: --tfos-rows)") + ":",
              flush=True)
        tfos = (tfos_feed.run(master, tfos_wheel(opts.with_tfos), tfos_rows, "frame", inference=True),
                tfos_rows)
    summary(opts, got, tfos)
    if record is not None:
        record.settings.update(spark_master_used=master, limit_rows=limit_rows,
                               tfos_rows=tfos and tfos[1])
        record_all(record, opts, got, tfos, master)
        record.write(opts.json)


def parse(argv=None) -> argparse.Namespace:
    """The options (``sys.argv[1:]`` by default), ``partitions`` chosen where not given."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="MNIST-like rows in the DataFrame")
    parser.add_argument("--pairs", type=int, default=3, help="rounds of the five cases")
    parser.add_argument("--partitions", type=int, default=0,
                        help="the DataFrame's partitions (default: 8, or one a 25,000 rows past "
                             "200,000 rows, so that caching fits Spark's default 1 GiB heap)")
    parser.add_argument("--spark-master", default="local[3]")
    parser.add_argument("--standalone", action="store_true",
                        help="start a standalone master and 2 workers of 2 cores on 127.0.0.1 for "
                             "the run (instead of --spark-master), stopped after")
    parser.add_argument("--with-tfos", nargs="?", const="", default=None, metavar="WHEEL",
                        help="also run TensorFlowOnSpark 2.2.5's inference (optionally from this wheel)")
    parser.add_argument("--tfos-rows", type=int, default=0,
                        help="rows of TFoS's inference (default: --rows)")
    parser.add_argument("--limit-rows", type=int, default=0,
                        help="rows of the limit's arrays (default: --rows, at most 250,000)")
    parser.add_argument("--json", metavar="PATH",
                        help="also write every figure and the run's command, settings and machine "
                             "to PATH (benchmarks/record.py)")
    opts = parser.parse_args(argv)
    if opts.pairs < 1 or opts.rows < 1:
        parser.error("--pairs and --rows must be positive")
    opts.partitions = opts.partitions or (8 if opts.rows <= 200_000 else opts.rows // 25_000)
    if opts.with_tfos is not None and not (opts.standalone or opts.spark_master.startswith("spark://")):
        parser.error("--with-tfos needs a standalone master (TFoS has no local mode): "
                     "--standalone or --spark-master spark://...")
    return opts


def main() -> None:
    quiet_tf()
    opts = parse()
    record = Record("one_pass", vars(opts)) if opts.json else None
    if not opts.standalone:
        measure(opts, opts.spark_master, record)
        return
    from tests.conftest import standalone_cluster

    cluster = standalone_cluster(workers=2, cores=2)
    master = next(cluster)
    try:
        print(f"a standalone master and 2 workers of 2 cores on 127.0.0.1: {master}", flush=True)
        measure(opts, master, record)
    finally:
        next(cluster, None)  # stops them


if __name__ == "__main__":
    main()
