"""Engine feed throughput: rows/s and MB/s pushed from Spark or Dask into TF nodes.

    python -m benchmarks.feed [--spark-master spark://HOST:PORT] [--with-tfos [WHEEL]]
                              [--rows 250000 --epochs 50] [--tiny-rows 4000000 --tiny-epochs 20]
                              [--rdd-rows 100000 --rdd-epochs 10] [--backends spark dask]
                              [--json PATH]
    python -m benchmarks.feed --malloc ROUNDS [--rows N --epochs E]
    python -m benchmarks.feed --arrow-batches ROUNDS --spark-master URL [--rows N --epochs E]
    python -m benchmarks.feed --rounds ROUNDS --spark-master URL [--rows N --epochs E]
    python -m benchmarks.feed --jar ROUNDS --spark-master spark://HOST:PORT [--rows N --epochs E]
    python -m benchmarks.feed --shuffle ROUNDS [--spark-master URL] [--rows N --epochs E]

Each of 2 worker nodes drains ``ctx.get_data_feed().dataset(100)`` (feed only, no model). A
node first imports TensorFlow and says so; the driver starts the feed once both have, and a
rate is every row fed over the whole run: from the ``train`` call to the last batch a node
read (the count, a first epoch that converts, every epoch's start included). The rate while
every node was reading is printed beside it, and under it the time from ``train`` (and
from ``duotf.run``) to every node's first batch and the rate of the whole job from
``duotf.run`` to the last batch, as a user waits for it. Spark feeds the MNIST-like rows (784 float32 and
an int64 label):

- a plain ``array<float>`` DataFrame at the defaults (``cluster.train(df, epochs)``: converted
  once, in the first epoch, and fed from what it kept after), and with ``convert_once=False``
  (read and converted every epoch);
- ``duotf.spark.feed_cache(df)`` (its build time printed apart) and a ``pack_tensors`` column;
- a converted TensorFlowOnSpark program's data: an RDD of ``(float32[784], label)`` and of
  ``([784 floats], label)`` tuples, drained with ``next_batch(100)`` in a ``while not
  feed.should_stop()`` loop and with ``dataset(100)``; and ``next_batch`` alone on columns
  already received (its own per-row Python);
- inference, ``cluster.inference(df)`` with a trivial model (each row answered with its
  label), beside one epoch of training on the same DataFrame (the same rows read once);
- tiny rows (one int64).

Dask feeds arrays, tiny arrays, and a DataFrame (training, one epoch, and inference).

The Spark part starts with ``train(df, epochs=2)`` on the ``array<float>`` DataFrame, shown
as the session's warm-up and left out of the summary, as the limit leaves TF's first dataset
out: the first feed of a session also starts the executors' Python workers and compiles the
JVMs' read path (the JVM's writing of feed frames, and epochs fed from them). Beside each Spark rate: the CPU the
executors' JVMs spent a row (standalone executors on this host), which is what Spark's
conversion of ``array<float>`` to Arrow costs.

Printed beside, measured in the same run: the limit, an in-process
``tf.data.Dataset.from_tensor_slices`` over the same arrays drained at the same batch size for
the same epochs (warm, best of two); and with --with-tfos, TensorFlowOnSpark 2.2.5
(InputMode.SPARK, ``next_batch(100)``; inference with ``batch_results``) on the same Spark
cluster and the same kinds of RDD (its wheel is fetched with ``pip download`` unless given).
Targets: >= 30x TFoS rows/s on MNIST-like rows; the default path >= 50% of the limit;
inference >= 0.5x its training feed and >= 30x TFoS.

``--malloc ROUNDS`` only compares the node's C heap setting under ``dataset()`` (TF's
``from_generator`` sets a 128 KiB trim threshold; duotf sets its own again: see
``duotf/feed/malloc.py``), on Dask, in alternating rounds.

``--arrow-batches ROUNDS`` only compares, on Spark, the Arrow batches of duotf's own jobs (at
most 4 MiB: ``duotf.backends.spark.tasks.ARROW_BATCH_BYTES``) with Spark's default (10,000
records, which duotf keeps where the session sets it, as here), in alternating rounds: the
default ``train(df, epochs)`` and ``inference(df)``.

``--shuffle ROUNDS`` only compares, on Spark, the default ``train(df, epochs)`` with
``train(df, epochs, shuffle=True, seed=round)``, alternating, with the median ratio of the
rounds' pairs: what shuffling costs the feed.

``--rounds ROUNDS`` only runs, on Spark, the default ``train(df, epochs)`` ROUNDS times in one
session after the warm-up, each with where its time went, beside the limit: how a session's
runs differ as it warms.

``--jar ROUNDS`` only measures what duotf's jar is worth on Spark, and so what a Spark Connect
session, which does not load it (see ``duotf/backends/spark/jvm``), costs: ``train(df,
epochs=1)`` (the array column packed in the JVM, or converted by Spark's Arrow writer) and the
default ``train(df, epochs)`` (the first epoch's frames written by the JVM, or converted through
Arrow and Python) on the ``array<float>`` DataFrame, on a classic session with the jar and with
``DUOTF_SPARK_PACK_ARRAYS=0``, and on a Spark Connect session, in rounds that alternate the
three (a classic application and a Connect server's on the master at once, 4 cores each: a
cluster of 8 cores); each path warmed by a run of one and of two epochs first, then the medians
of the rounds, in one run.

``--json PATH`` also writes the summary's rates, the limits and the run's command, settings
and machine to PATH (``benchmarks/record.py``; ``benchmarks/charts.py`` draws them).

``--default-rows N [N ...]`` also runs the default ``train(df, epochs)`` at these row counts,
each beside the limit measured on that many rows: how the fixed costs (a count job, one engine
job an epoch) weigh as the data grows.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from contextlib import contextmanager

import numpy as np

import duotf
from benchmarks.mnist import mnist_frame
from benchmarks.record import Record


def quiet_tf() -> None:
    """TensorFlow's C++ notes and warnings off, here and in the nodes this process starts, unless
    the environment sets the level. Each benchmark's command line calls it first; never at import,
    as the test suite imports these modules and its nodes must keep their own level."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


BATCH = 100


def _say_ready(args, ctx) -> float:
    """A node has imported TensorFlow: a file in ``args["ready"]`` tells the driver, which
    starts the feed once every node's is there, so that the rates leave TF's start-up out
    (as the limit does) and no row waits in a buffer for a node still importing TF."""
    import time as _time

    with open(os.path.join(args["ready"], f"node-{ctx.job_name}-{ctx.task_index}"), "w"):
        pass
    return _time.time()


def _when_ready(folder: str, nodes: int, timeout: float = 300.0) -> float:
    """Wait until ``nodes`` nodes have said they are ready; the time then."""
    deadline = time.monotonic() + timeout
    while len(os.listdir(folder)) < nodes:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(os.listdir(folder))} of {nodes} nodes imported TF")
        time.sleep(0.05)
    return time.time()


def drain_main(args, ctx):
    """Iterate ``feed.dataset(batch)`` in a Python loop, as a TF program's own loop does."""
    __import__("tensorflow")  # what a TF program does first

    def batch_rows(feed):
        for batch in feed.dataset(args["batch"]):
            yield int(next(iter(batch.values())).shape[0])

    return timed_drain(args, ctx, batch_rows)


def timed_drain(args, ctx, batch_rows, input_mapping=None) -> dict:
    """Say the node is ready, then read its training feed (``get_data_feed(train=True,
    input_mapping=...)``) through ``batch_rows(feed)``, an iterator of each batch's rows: the
    rows, the times when about every 20,000 had been read, the time the node was ready and its
    page faults meanwhile."""
    import time as _time

    import resource

    ready = _say_ready(args, ctx)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    feed = ctx.get_data_feed(train=True, input_mapping=input_mapping)
    rows, marks, step, last = 0, [], 0, _time.time()  # marks: (time, rows read by then)
    for n in batch_rows(feed):
        rows += n
        last = _time.time()
        if rows >= step:
            marks.append((last, rows))
            step = rows + 20_000
    # The time of the last batch, not of the loop's end: ending a long tf.data iterator waits
    # for TF's autotuning thread, which here took up to 6 s after the last batch.
    marks.append((last, rows))
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return {"rows": rows, "marks": marks, "ready": ready, "faults": faults}


def next_batch_main(args, ctx):
    """A converted TensorFlowOnSpark program's loop: ``next_batch`` until ``should_stop``."""
    import time as _time

    __import__("tensorflow")
    ready = _say_ready(args, ctx)

    feed = ctx.get_data_feed(train=True)
    rows, marks, step, last = 0, [], 0, _time.time()
    while not feed.should_stop():
        rows += len(feed.next_batch(args["batch"]))
        last = _time.time()
        if rows >= step:
            marks.append((last, rows))
            step = rows + 20_000
    marks.append((last, rows))
    return {"rows": rows, "marks": marks, "ready": ready}


def identity_main(args, ctx):
    """Inference with a trivial model: each row's answer is its own label, so that the feed's
    transport (rows in, one value per row back) is what is measured."""
    import time as _time

    __import__("tensorflow")
    ready = _say_ready(args, ctx)
    feed = ctx.get_data_feed(train=False, input_mapping={"label": "label"})
    rows, first, last = 0, None, _time.time()
    while not feed.should_stop():
        batch = feed.next_batch(args["batch"])
        n = len(batch["label"]) if batch else 0
        if n:
            first = first or _time.time()
            feed.batch_results(batch["label"].astype("float64"))
            rows += n
            last = _time.time()
    return {"rows": rows, "ready": ready, "first": first, "last": last}


def run_inference(backend, data, row_bytes: int, label: str, count, keep=None, quiet=False,
                  figures=None) -> float:
    """``cluster.inference(data)`` rows/s, from the moment it was called (once every node had
    imported TensorFlow) to the last answer; ``count(out)`` materializes the output and gives
    its rows (they must all be there). ``figures``, a dict, gets what is printed: ``rate``,
    ``first_after_call`` and ``first_after_run`` (seconds from ``inference`` and from
    ``duotf.run`` to every node's first answered batch), ``job_seconds`` and ``job_rate`` (from
    ``duotf.run`` to the last answer), ``call_seconds`` (``inference`` itself) and
    ``read_seconds`` (``count(out)``)."""
    import tempfile

    ready = tempfile.mkdtemp(prefix="duotf-bench-ready-")
    launched = time.time()
    with duotf.run(identity_main, {"batch": 1000, "ready": ready}, backend,
                   duotf.ClusterSpec(workers=2)) as cluster:
        start = _when_ready(ready, 2)
        jvm = executor_cpu()
        called = time.perf_counter()
        out = cluster.inference(data, **({"result_columns": {"prediction": "double"}, "keep": keep}
                                          if hasattr(data, "mapInArrow") else {}))
        returned = time.perf_counter()
        n = count(out)
        read = time.perf_counter() - returned
        returned -= called
        jvm = executor_cpu() - jvm
        results = cluster.wait()
    shutil.rmtree(ready, ignore_errors=True)
    fed = sum(r["rows"] for r in results)
    assert n == fed, (n, fed)
    span = max(r["last"] for r in results) - start
    rate = fed / span
    first = max(r["first"] for r in results)  # every node has answered a batch
    job = max(r["last"] for r in results) - launched
    if figures is not None:
        figures.update(rate=rate, rows=fed, seconds=span, first_after_call=first - start,
                       first_after_run=first - launched, job_seconds=job, job_rate=fed / job,
                       call_seconds=returned, read_seconds=read)
    if quiet:
        return rate
    print(f"  duotf {label:<40} {fed:>9} rows: {rate:>10,.0f} rows/s {rate * row_bytes / 1e6:>6.0f} MB/s "
          f"in {span:5.1f} s (inference, identity model)"
          + (f"; executors' JVMs: {jvm / fed * 1e6:.1f} us CPU a row" if jvm else ""), flush=True)
    print(f"    every node's first batch {first - start:.2f} s after inference() ({first - launched:.1f} s "
          f"after duotf.run, TF's import on the nodes included); the whole job from duotf.run: "
          f"{job:.1f} s, {fed / job:,.0f} rows/s", flush=True)
    print(f"    inference() returned after {returned:.2f} s; reading its result (count()) took "
          f"{read:.2f} s", flush=True)
    return rate


def next_batch_alone(numpy_rows: bool, repeat: int = 2000) -> float:
    """Rows/s of ``DataFeed.next_batch(100)`` itself on columns already received (its own
    per-row Python: a tuple per row), the transport left out: the real method, on an object
    whose ``_take`` hands it the same 100-row columns every call."""
    from duotf._transport.datafeed import DataFeed

    cols = {"0": np.zeros((BATCH, 784), np.float32), "1": np.arange(BATCH, dtype=np.int64)}

    class Received:
        input_mapping = None
        unanswered = 0  # what check_answered reads: no row owed a result

        def _take(self, n):
            return cols

        _rows = DataFeed._rows  # the real per-row work: a tuple per row

    feed = Received()
    t0 = time.perf_counter()
    for _ in range(repeat):
        DataFeed.next_batch(feed, BATCH)
    return BATCH * repeat / (time.perf_counter() - t0)


def malloc_settings(client, rows: int, epochs: int, rounds: int) -> None:
    """``dataset()``'s C heap setting (duotf/feed/malloc.py): TF's 128 KiB trim threshold,
    which its ``from_generator`` sets, against duotf's, set again after it; Dask MNIST-like
    arrays, the two in alternating rounds; rows/s over the whole run and the nodes' minor page
    faults per row."""
    import statistics

    data = dask_data(rows, False, 20_000)
    got = {"duotf": [], "tf": []}
    for r in range(rounds):
        for setting in (("duotf", "tf") if r % 2 == 0 else ("tf", "duotf")):
            rate, results = run_duotf(client, data, epochs, 3144, "", env={"DUOTF_MALLOC": setting},
                                      quiet=True)
            faults = sum(x["faults"] for x in results) / sum(x["rows"] for x in results)
            got[setting].append((rate, faults))
            print(f"  round {r + 1}, DUOTF_MALLOC={setting:<6} {rate:>10,.0f} rows/s, "
                  f"{faults:.2f} page faults a row", flush=True)
    for setting, runs in got.items():
        print(f"  median, DUOTF_MALLOC={setting:<6} {statistics.median(r for r, _ in runs):>10,.0f} rows/s, "
              f"{statistics.median(f for _, f in runs):.2f} page faults a row")


def _rows_at(marks, t: float) -> float:
    """Rows a node had read at time ``t``, interpolated between its marks."""
    import bisect

    times = [m[0] for m in marks]
    i = bisect.bisect_right(times, t)
    if i == 0:
        return 0.0
    if i == len(marks):
        return float(marks[-1][1])
    (t0, r0), (t1, r1) = marks[i - 1], marks[i]
    return r0 + (r1 - r0) * (t - t0) / max(t1 - t0, 1e-9)


def feed_rates(results):
    """``(whole, steady, seconds)``: rows/s from the first batch any node read to the last, and
    while every node was reading (from the moment the last node to start read its first batch
    to the moment the first node to finish read its last): the feed without the nodes' own
    start-up, which the limit leaves out too."""
    first = [r["marks"][0][0] for r in results]
    last = [r["marks"][-1][0] for r in results]
    whole = sum(r["rows"] for r in results) / (max(last) - min(first))
    t0, t1 = max(first), min(last)
    if t1 - t0 < 1.0:
        return whole, None, t1 - t0
    steady = sum(_rows_at(r["marks"], t1) - _rows_at(r["marks"], t0) for r in results) / (t1 - t0)
    return whole, steady, t1 - t0


def arrow_batches(session, rows: int, epochs: int, rounds: int) -> None:
    """duotf's Arrow batches (4 MiB) against Spark's default (10,000 records, set on the session
    so that duotf keeps it), alternating: the default ``train(df, epochs)`` and
    ``inference(df)`` on the MNIST-like ``array<float>`` DataFrame."""
    import statistics

    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    df = spark_data(session, rows, False, 8)
    got = {}
    for r in range(rounds):
        for setting in (("duotf", "spark") if r % 2 == 0 else ("spark", "duotf")):
            if setting == "spark":
                session.conf.set(key, "10000")
            try:
                cpu = executor_cpu()
                train = run_duotf(session, df, epochs, 3144, "", quiet=True)[0]
                cpu, infer_cpu = executor_cpu() - cpu, executor_cpu()
                infer = run_inference(session, df, 3144, "", lambda out: out.count(), quiet=True)
                infer_cpu = executor_cpu() - infer_cpu
            finally:
                session.conf.unset(key)
            # the executors' JVM CPU a row: of the training's first (converting) epoch, which
            # is where nearly all of it goes, and of inference
            run = (train, infer, cpu / rows * 1e6, infer_cpu / rows * 1e6)
            got.setdefault(setting, []).append(run)
            print(f"  round {r + 1}, {setting + ' batches':<14} train {train:>10,.0f} rows/s "
                  f"({run[2]:.1f} us JVM CPU a row of the data), inference {infer:>10,.0f} rows/s "
                  f"({run[3]:.1f} us)", flush=True)
    for setting, runs in got.items():
        med = [statistics.median(run[i] for run in runs) for i in range(4)]
        print(f"  median, {setting + ' batches':<14} train {med[0]:>10,.0f} rows/s ({med[2]:.1f} us), "
              f"inference {med[1]:>10,.0f} rows/s ({med[3]:.1f} us)")
    df.unpersist()


def compare_in_one_session(opts, title: str, compare, rounds: int) -> None:
    """``compare(session, rows, epochs, rounds)`` in a Spark session of its own on
    ``--spark-master``, after a warm-up feed."""
    from pyspark.sql import SparkSession

    session = checkout_on_executors(
        SparkSession.builder.master(opts.spark_master).config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")).getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    try:
        print(title)
        run_duotf(session, spark_data(session, opts.rows, False, 8), 1, 3144,
                  "first feed of the session (warm-up)")
        compare(session, opts.rows, opts.epochs, rounds)
    finally:
        session.stop()


def shuffle_rounds(session, rows: int, epochs: int, rounds: int) -> None:
    """The default ``train(df, epochs)`` against ``train(df, epochs, shuffle=True, seed=r)``,
    alternating, on the MNIST-like ``array<float>`` DataFrame: what shuffling costs."""
    import statistics

    df = spark_data(session, rows, False, 8)
    got: dict = {}
    for r in range(rounds):
        for case in (("plain", "shuffled") if r % 2 == 0 else ("shuffled", "plain")):
            extra = {"shuffle": True, "seed": r} if case == "shuffled" else {}
            rate = run_duotf(session, df, epochs, 3144, "", quiet=True, **extra)[0]
            got.setdefault(case, []).append(rate)
            print(f"  round {r + 1}, {case:<9} {rate:>10,.0f} rows/s", flush=True)
    ratios = [s / p for p, s in zip(got["plain"], got["shuffled"])]
    print(f"  median: plain {statistics.median(got['plain']):,.0f} rows/s, shuffled "
          f"{statistics.median(got['shuffled']):,.0f} rows/s; shuffled / plain, median of the "
          f"rounds' pairs: {statistics.median(ratios):.2f}")
    df.unpersist()


def limit(x, y, epochs: int, repeats: int = 2) -> float:
    """The in-process limit: rows/s draining ``from_tensor_slices((x, y)).batch(100)`` for
    ``epochs`` epochs, the best of ``repeats`` runs after a warm-up pass (TF's first dataset in a
    process pays its start-up, about 3x slower; the feed's rate leaves the nodes' start-up out)."""
    import tensorflow as tf

    for _ in tf.data.Dataset.from_tensor_slices((x[:20_000], y[:20_000])).batch(BATCH):
        pass
    best = 0.0
    for _ in range(repeats):
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat(epochs)
        t0 = time.perf_counter()
        n = 0
        for bx, _ in ds:
            n += int(bx.shape[0])
        best = max(best, n / (time.perf_counter() - t0))
    return best


def executor_cpu() -> float:
    """CPU seconds used so far by the Spark executor JVMs on this host (0 in local mode, where
    the driver's JVM runs the tasks)."""
    import psutil

    total = 0.0
    for proc in psutil.process_iter(["cmdline", "cpu_times"]):
        if "CoarseGrainedExecutorBackend" in " ".join(proc.info["cmdline"] or []):
            total += proc.info["cpu_times"].user + proc.info["cpu_times"].system
    return total


def run_duotf(backend, data, epochs: int, row_bytes: int, label: str, main=drain_main, env=None,
              quiet=False, breakdown=False, figures=None, node_args=None, **train):
    """The feed's rate over the whole run: every row fed, from the moment ``train`` was called
    (once every node had imported TensorFlow: the limit leaves TF's start-up out too) to the
    last batch a node read. Counting, a first epoch that converts, and every epoch's start are
    in it. The rate while every node was reading is printed beside it; with ``breakdown``, where
    ``train`` spent its time (its report's ``count_seconds`` and ``epoch_seconds``).
    ``figures``, a dict, gets what is printed: ``rate``, ``steady``, ``first_after_call`` and
    ``first_after_run`` (seconds from ``train`` and from ``duotf.run`` to every node's first
    batch), ``job_seconds`` and ``job_rate`` (from ``duotf.run`` to the last batch) and
    ``train``'s ``report``. ``node_args`` go to ``main`` beside the batch size."""
    import tempfile

    ready = tempfile.mkdtemp(prefix="duotf-bench-ready-")
    launched = time.time()
    with duotf.run(main, {"batch": BATCH, "ready": ready, **(node_args or {})}, backend,
                   duotf.ClusterSpec(workers=2), env=env) as cluster:
        start = _when_ready(ready, 2)
        jvm = executor_cpu()
        report = cluster.train(data, epochs=epochs, **train)
        jvm = executor_cpu() - jvm
        results = cluster.wait()
    shutil.rmtree(ready, ignore_errors=True)
    fed = sum(r["rows"] for r in results)
    assert fed == report["rows_fed"], (fed, report)
    _, steady, seconds = feed_rates(results)
    span = max(r["marks"][-1][0] for r in results) - start
    rate = fed / span
    first = max(r["marks"][0][0] for r in results)  # every node has read a batch
    job = max(r["marks"][-1][0] for r in results) - launched
    if figures is not None:
        figures.update(rate=rate, steady=steady, rows=fed, seconds=span, first_after_call=first - start,
                       first_after_run=first - launched, job_seconds=job, job_rate=fed / job,
                       report=report)
    if quiet:
        return rate, results
    print(f"  duotf {label:<40} {fed:>9} rows: {rate:>10,.0f} rows/s {rate * row_bytes / 1e6:>6.0f} MB/s "
          f"over the whole run of {span:5.1f} s ({steady or 0:,.0f} rows/s over the {seconds:.1f} s "
          f"every node was reading)" + ("  (under 10 s: raise the epochs)" if span < 10 else "")
          + (f"; executors' JVMs: {jvm / fed * 1e6:.1f} us CPU a row" if jvm else ""), flush=True)
    print(f"    every node's first batch {first - start:.2f} s after train() ({first - launched:.1f} s "
          f"after duotf.run, TF's import on the nodes included); the whole job from duotf.run: "
          f"{job:.1f} s, {fed / job:,.0f} rows/s", flush=True)
    if breakdown:
        later = report["epoch_seconds"][1:]
        print(f"    train() took {report['seconds']:.2f} s: counting the rows {report['count_seconds']:.2f} s, "
              f"epoch 1 {report['epoch_seconds'][0]:.2f} s"
              + (f", epochs 2-{len(later) + 1} {min(later):.2f}-{max(later):.2f} s ({sum(later):.2f} s "
                 "in all)" if later else "")
              + f"; {report.get('epochs_fed_by_reference', 0)} epochs fed by naming kept frames",
              flush=True)
    return rate


def checkout_on_executors(builder):
    """``builder`` with this checkout on the executors' ``PYTHONPATH``: the nodes that a
    standalone cluster's executors start import the benchmark's functions (``drain_main``, ...)
    by name, from this folder. Not a setting of the engine: nothing it does changes."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return builder.config("spark.executorEnv.PYTHONPATH", os.pathsep.join(paths))


def spark_job_floor(session, tasks: int = 2, repeats: int = 9) -> float:
    """The median seconds of a Spark job of ``tasks`` Python tasks that do nothing: what every
    job costs on this cluster before any data moves (``train`` runs one to count the rows, or
    to write the frames, and one an epoch fed by Spark tasks; a cached epoch's job has one
    task per free slot, 2 here; an epoch fed by naming kept frames runs none)."""
    sc = session.sparkContext
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sc.parallelize(range(tasks), tasks).map(lambda x: x).collect()
        times.append(time.perf_counter() - t0)
    return sorted(times)[repeats // 2]


def spark_data(session, rows: int, tiny: bool, partitions: int, packed: bool = False,
               varied: bool = False):
    from pyspark.sql import functions as F

    from duotf.spark import pack_tensors

    if tiny:
        df = session.range(0, rows, numPartitions=partitions).select(F.col("id").alias("x"))
    else:
        df = mnist_frame(session, rows, partitions, varied)
        if packed:
            df = pack_tensors(df, "features")
    df = df.cache()
    df.count()
    return df


def connect_rates(opts) -> dict:
    """The DataFrame cases through a Spark Connect session: a Connect server (pyspark's own
    ``sbin/start-connect-server.sh``, started here and stopped after) whose application runs on
    the same master as the classic session above, which has ended by then (its executors are
    free again). The client has no RDD: those cases are classic Spark's only."""
    from pyspark.sql import SparkSession

    from duotf.spark import feed_cache
    from tests.conftest import connect_server

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    rates = {}
    server = connect_server(opts.spark_master, {"spark.executorEnv.PYTHONPATH": os.pathsep.join(paths),
                                                "spark.ui.showConsoleProgress": "false"})
    url = next(server)
    session = SparkSession.builder.remote(url).getOrCreate()
    try:
        print(f"Spark Connect ({url}, its application on {opts.spark_master}; the same settings):")
        df = spark_data(session, opts.rows, False, 8)
        run_duotf(session, df, 2, 3144, "first feed of the session (warm-up, 2 epochs)")
        rates["spark-connect", "mnist"] = run_duotf(session, df, opts.epochs, 3144,
                                                    "MNIST-like array<float> column (default)")
        rates["spark-connect", "mnist-every-epoch"] = run_duotf(
            session, df, opts.epochs, 3144, "MNIST-like array<float>, convert_once=False",
            convert_once=False)
        cache = feed_cache(df)
        rates["spark-connect", "mnist-cache"] = run_duotf(session, cache, opts.epochs, 3144,
                                                          "MNIST-like feed_cache(DataFrame)")
        cache.unpersist()
        rates["spark-connect", "mnist-1-epoch"] = run_duotf(session, df, 1, 3144, "array<float>, 1 epoch")
        rates["spark-connect", "mnist-inference"] = run_inference(
            session, df, 3144, "array<float> column", lambda out: out.count())
        df.unpersist()
        df = spark_data(session, opts.tiny_rows, True, 8)
        rates["spark-connect", "tiny"] = run_duotf(session, df, opts.tiny_epochs, 8, "tiny DataFrame")
        df.unpersist()
    finally:
        session.stop()
        os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)  # pyspark's process-wide mark
        next(server, None)  # stops the server
    return rates


@contextmanager
def _variable(name: str, value):
    """Environment variable ``name`` set to ``value`` (None: unset) in this process; as it was
    after."""
    before = os.environ.pop(name, None)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)
        if before is not None:
            os.environ[name] = before


def pack_arrays(on: bool):
    """``DUOTF_SPARK_PACK_ARRAYS`` unset (duotf's jar packs array columns and writes the first
    epoch's frames) or ``0`` (Spark's Arrow writer and Python do both) in this process, the
    driver, where duotf reads it before each job; as it was after."""
    return _variable("DUOTF_SPARK_PACK_ARRAYS", None if on else "0")


def remote_mark(on: bool):
    """pyspark's process-wide Spark Connect mark (``SPARK_CONNECT_MODE_ENABLED``, which its
    functions read to choose their classic or Connect form) set or lifted, as it was after: a
    classic session and a Connect one used in turn in one process."""
    return _variable("SPARK_CONNECT_MODE_ENABLED", "1" if on else None)


def jar_rates(opts) -> None:
    """``--jar ROUNDS``: the two cases on a classic session with and without the jar and on a
    Spark Connect session, both applications on the master at once (4 cores each), so that the
    three alternate (each round in another order) under the same load; medians."""
    import statistics

    from pyspark.sql import SparkSession

    from tests.conftest import connect_server

    half = {"spark.cores.max": "4", "spark.executor.cores": "2", "spark.ui.showConsoleProgress": "false"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    server = connect_server(opts.spark_master, {"spark.executorEnv.PYTHONPATH": os.pathsep.join(paths), **half})
    url = next(server)
    names = ["classic, the jar", "classic, DUOTF_SPARK_PACK_ARRAYS=0", "Spark Connect"]
    cases = [(1, "train(df, epochs=1)"), (opts.epochs, f"train(df, epochs={opts.epochs})")]

    def variants(classic, remote):  # (name, session, the jar on, pyspark's Connect mark)
        return [(names[0], classic, True, False), (names[1], classic, False, False),
                (names[2], remote, True, True)]

    remote = classic = None
    rates = {}
    try:
        with remote_mark(True):  # first: pyspark starts no Connect session beside a classic one
            remote = SparkSession.builder.remote(url).getOrCreate()
        builder = checkout_on_executors(SparkSession.builder.master(opts.spark_master)
                                        .config("spark.ui.enabled", "false"))
        for key, value in half.items():
            builder = builder.config(key, value)
        with remote_mark(False):
            classic = builder.getOrCreate()
            classic.sparkContext.setLogLevel("ERROR")
            data = {id(classic): spark_data(classic, opts.rows, False, 8)}
        with remote_mark(True):
            data[id(remote)] = spark_data(remote, opts.rows, False, 8)
        print(f"duotf's jar, Spark {opts.spark_master} (a classic session and a Connect server's "
              f"application, 4 cores each), {opts.rows} MNIST-like rows, {opts.jar} rounds:", flush=True)
        for name, session, on, remote_on in variants(classic, remote):
            for epochs in (1, 2):  # each path's first runs warm its JIT: shown, not counted
                with remote_mark(remote_on), pack_arrays(on):
                    run_duotf(session, data[id(session)], epochs, 3144, f"{name}, warm-up, {epochs} epoch(s)")
        for r in range(opts.jar):
            every = variants(classic, remote)
            for name, session, on, remote_on in every[r % 3:] + every[:r % 3]:
                for epochs, case in cases:
                    with remote_mark(remote_on), pack_arrays(on):
                        rates.setdefault((name, case), []).append(run_duotf(
                            session, data[id(session)], epochs, 3144, f"{name}, {case}, round {r + 1}"))
    finally:
        if remote is not None:
            with remote_mark(True):
                remote.stop()
        if classic is not None:
            classic.stop()
        next(server, None)  # stops the server
    print("Medians (rows/s over the whole run):")
    for epochs, case in cases:
        base = statistics.median(rates["classic, the jar", case])
        for name in names:
            runs = rates[name, case]
            rate = statistics.median(runs)
            print(f"  {case:<22} {name:<36} {rate:>10,.0f} rows/s  ({rate / base:.2f}x the jar's; "
                  f"runs: {', '.join(f'{x:,.0f}' for x in runs)})", flush=True)


def spark_rdd(session, rows: int, numpy_rows: bool, partitions: int):
    """A converted TensorFlowOnSpark program's data: an RDD of ``(features, label)`` tuples, the
    features a float32 numpy array of 784 values or a list of 784 floats (as TFoS's examples
    make them), cached."""
    def make(i):
        x = [(i % 255) / 255.0] * 784
        return (np.asarray(x, np.float32) if numpy_rows else x), i % 10

    rdd = session.sparkContext.parallelize(range(rows), partitions).map(make).cache()
    rdd.count()
    return rdd


def tfos_wheel(path):
    """The TFoS 2.2.5 wheel: ``path``, or fetched from PyPI (never installed)."""
    import glob
    import subprocess
    import sys
    import tempfile

    if path:
        return path
    where = tempfile.mkdtemp(prefix="tfos-wheel-")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", where,
                    "tensorflowonspark==2.2.5"], check=True)
    return glob.glob(os.path.join(where, "tensorflowonspark-2.2.5-*.whl"))[0]


def dask_data(rows: int, tiny: bool, chunk: int):
    import dask.array as da

    if tiny:
        return (da.arange(rows, chunks=chunk, dtype=np.int64),)
    x = da.random.default_rng(0).random((rows, 784), chunks=(chunk, 784), dtype=np.float32)
    y = da.arange(rows, chunks=chunk, dtype=np.int64) % 10
    return (x.persist(), y.persist())


def dask_frame(rows: int, chunk: int):
    """The MNIST-like rows as a Dask DataFrame (an object column of float32[784] arrays and
    the label), persisted."""
    import dask.dataframe as dd
    import pandas as pd

    def part(start):
        stop = min(start + chunk, rows)
        x = np.random.default_rng(start).random((stop - start, 784), dtype=np.float32)
        return pd.DataFrame({"features": list(x), "label": np.arange(start, stop) % 10})

    import dask

    # an object column of arrays as it is: Dask would make it strings otherwise
    with dask.config.set({"dataframe.convert-string": False}):
        return dd.from_map(part, list(range(0, rows, chunk))).persist()


def cli():
    quiet_tf()
    parser = argparse.ArgumentParser(description="duotf engine feed benchmark")
    parser.add_argument("--rows", type=int, default=250_000, help="MNIST-like rows in the data")
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--tiny-rows", type=int, default=4_000_000)
    parser.add_argument("--tiny-epochs", type=int, default=20)
    parser.add_argument("--backends", nargs="*", default=["spark", "spark-connect", "dask"])
    parser.add_argument("--spark-master", default="local[3]")
    parser.add_argument("--with-tfos", nargs="?", const="", default=None, metavar="WHEEL",
                        help="also run TensorFlowOnSpark 2.2.5 (optionally from this wheel file)")
    parser.add_argument("--tfos-rows", type=int, default=100_000)
    parser.add_argument("--rdd-rows", type=int, default=100_000,
                        help="rows of the RDDs of tuples (a converted TFoS program's data)")
    parser.add_argument("--rdd-epochs", type=int, default=10)
    parser.add_argument("--arrow-batches", type=int, default=0, metavar="ROUNDS",
                        help="only compare duotf's Arrow batches (4 MiB) with Spark's default "
                             "(10,000 records) on Spark, ROUNDS rounds of each")
    parser.add_argument("--rounds", type=int, default=0, metavar="ROUNDS",
                        help="only the default train(df, epochs) on Spark, ROUNDS times in one session")
    parser.add_argument("--shuffle", type=int, default=0, metavar="ROUNDS",
                        help="only compare, on Spark, train(df, epochs) with and without "
                             "shuffle=True, ROUNDS rounds of each, alternating")
    parser.add_argument("--jar", type=int, default=0, metavar="ROUNDS",
                        help="only compare, on Spark, a classic session with duotf's jar, one "
                             "with DUOTF_SPARK_PACK_ARRAYS=0 and Spark Connect (which does not "
                             "load it), ROUNDS rounds of each")
    parser.add_argument("--default-rows", type=int, nargs="*", default=[], metavar="N",
                        help="also run the default train(df, epochs) on N rows, beside the limit on N rows")
    parser.add_argument("--malloc", type=int, default=0, metavar="ROUNDS",
                        help="only compare dataset()'s C heap settings (TF's, duotf's) on Dask, "
                             "ROUNDS rounds of each")
    parser.add_argument("--json", metavar="PATH",
                        help="also write the summary's rates, the limits and the run's command, "
                             "settings and machine to PATH (benchmarks/record.py)")
    opts = parser.parse_args()
    if opts.json and (opts.malloc or opts.rounds or opts.arrow_batches or opts.jar or opts.shuffle):
        parser.error("--json records the main run, not --malloc, --rounds, --arrow-batches, "
                     "--jar or --shuffle")
    record = Record("feed", vars(opts)) if opts.json else None

    if opts.malloc:
        from distributed import Client, LocalCluster

        with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=None,
                          host="127.0.0.1") as lc, Client(lc) as client:
            print(f"dataset()'s C heap setting, Dask LocalCluster (2 workers), {opts.rows} "
                  f"MNIST-like rows x {opts.epochs} epochs:")
            malloc_settings(client, opts.rows, opts.epochs, opts.malloc)
        return
    if opts.jar:
        jar_rates(opts)
        return
    if opts.rounds:
        from pyspark.sql import SparkSession

        x = np.random.default_rng(0).random((opts.rows, 784), dtype=np.float32)
        there = limit(x, np.arange(opts.rows, dtype=np.int64) % 10, opts.epochs)
        del x
        session = checkout_on_executors(
            SparkSession.builder.master(opts.spark_master).config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")).getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
        try:
            print(f"The default train(df, epochs={opts.epochs}), Spark {opts.spark_master}, "
                  f"{opts.rows} MNIST-like rows, {opts.rounds} rounds in one session; limit "
                  f"{there:,.0f} rows/s:")
            df = spark_data(session, opts.rows, False, 8)
            run_duotf(session, df, 2, 3144, "first feed of the session (warm-up, 2 epochs)")
            for r in range(opts.rounds):
                rate = run_duotf(session, df, opts.epochs, 3144, f"round {r + 1}", breakdown=True)
                print(f"    = {rate / there:.0%} of the limit", flush=True)
        finally:
            session.stop()
        return
    if opts.shuffle:
        compare_in_one_session(opts, f"Shuffling, Spark {opts.spark_master}, {opts.rows} MNIST-like "
                               f"rows, train {opts.epochs} epochs, plain and shuffle=True:",
                               shuffle_rounds, opts.shuffle)
        return
    if opts.arrow_batches:
        compare_in_one_session(opts, f"Arrow batches, Spark {opts.spark_master}, {opts.rows} "
                               f"MNIST-like rows, train {opts.epochs} epochs and inference:",
                               arrow_batches, opts.arrow_batches)
        return
    x = np.random.default_rng(0).random((opts.rows, 784), dtype=np.float32)
    y = np.arange(opts.rows, dtype=np.int64) % 10
    mnist_limit = limit(x, y, opts.epochs)
    del x, y
    tiny_limit = limit(np.arange(opts.tiny_rows, dtype=np.int64), np.zeros(opts.tiny_rows, np.int8),
                       opts.tiny_epochs)
    print(f"limit (in-process from_tensor_slices, batch {BATCH}): MNIST-like {mnist_limit:,.0f} rows/s "
          f"({mnist_limit * 3144 / 1e6:.0f} MB/s), tiny {tiny_limit:,.0f} rows/s", flush=True)

    rates = {}
    if "spark" in opts.backends:
        from pyspark.sql import SparkSession

        from duotf.spark import feed_cache

        # Spark's defaults (1 GiB driver and executor memory, 10,000 records per Arrow batch):
        # only the master, and the UI and progress bar off (they cost nothing to the figures).
        session = checkout_on_executors(
            SparkSession.builder.master(opts.spark_master).config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")).getOrCreate()
        print("Spark settings beyond the master URL: none (engine defaults; the executors' "
              "PYTHONPATH names this checkout, for the nodes to import the benchmark's functions)")
        session.sparkContext.setLogLevel("ERROR")
        try:
            print(f"Spark {opts.spark_master}:")
            if record:  # the cores of the cluster's executors (of local[N]: N)
                record.settings["spark_default_parallelism"] = session.sparkContext.defaultParallelism
            # The session's first feed starts the executors' Python workers and warms their
            # JVMs (Arrow conversion code compiled): shown, and not among the figures below,
            # as the limit leaves TF's first dataset out.
            df = spark_data(session, opts.rows, False, 8)
            run_duotf(session, df, 2, 3144, "first feed of the session (warm-up, 2 epochs)",
                      breakdown=True)
            df.unpersist()
            floor = spark_job_floor(session)
            print(f"  a Spark job of 2 Python tasks that do nothing: {floor:.3f} s (median of 9): "
                  "what the JVM's writing pass, and an epoch fed by Spark tasks, cost before any "
                  "data moves (an epoch fed by naming kept frames to the nodes runs no job)",
                  flush=True)
            for kind, packed, label in [("mnist", False, "MNIST-like array<float> column (default)"),
                                        ("mnist-packed", True, "MNIST-like packed tensor column")]:
                df = spark_data(session, opts.rows, False, 8, packed=packed)
                rates["spark", kind] = run_duotf(session, df, opts.epochs, 3144, label,
                                                 breakdown=True)
                if not packed:
                    rates["spark", "mnist-every-epoch"] = run_duotf(
                        session, df, opts.epochs, 3144, "MNIST-like array<float>, convert_once=False",
                        convert_once=False)
                    t0 = time.perf_counter()
                    cache = feed_cache(df)
                    print(f"  (feed_cache of the array<float> DataFrame built in {time.perf_counter() - t0:.1f} s)")
                    rates["spark", "mnist-cache"] = run_duotf(session, cache, opts.epochs, 3144,
                                                              "MNIST-like feed_cache(DataFrame)")
                    cache.unpersist()
                df.unpersist()
            for rows in opts.default_rows:
                x = np.random.default_rng(0).random((rows, 784), dtype=np.float32)
                y = np.arange(rows, dtype=np.int64) % 10
                there = limit(x, y, opts.epochs)
                del x, y
                df = spark_data(session, rows, False, 8)
                rate = run_duotf(session, df, opts.epochs, 3144,
                                 f"array<float> (default), {rows} rows", breakdown=True)
                print(f"    = {rate / there:.0%} of the limit on {rows} rows ({there:,.0f} rows/s)", flush=True)
                if record:
                    chart = "the default train(df, epochs) by rows"
                    record.add("rows/s", "rows/s", [rate], peer="duotf", backend="spark",
                               case=f"mnist-{rows}-rows", chart=chart,
                               label=f"array<float> (default), {rows:,} rows")
                    record.add("rows/s", "rows/s", [there], peer="in-process limit",
                               case=f"mnist-{rows}-rows", chart=chart,
                               label=f"from_tensor_slices, {rows:,} rows")
                df.unpersist()
            df = spark_data(session, opts.tiny_rows, True, 8)
            rates["spark", "tiny"] = run_duotf(session, df, opts.tiny_epochs, 8, "tiny DataFrame")
            df.unpersist()
            df = spark_data(session, opts.rows, False, 8, packed=True)
            rates["spark", "mnist-packed-1-epoch"] = run_duotf(
                session, df, 1, 3144, "packed tensor column, 1 epoch")
            rates["spark", "mnist-packed-inference"] = run_inference(
                session, df, 3144, "packed tensor column", lambda out: out.count())
            df.unpersist()
            df = spark_data(session, opts.rows, False, 8)
            rates["spark", "mnist-1-epoch"] = run_duotf(session, df, 1, 3144, "array<float>, 1 epoch")
            rates["spark", "mnist-inference"] = run_inference(
                session, df, 3144, "array<float> column", lambda out: out.count())
            # what TFoS's inference returns: the answers only (here beside the label), no input
            rates["spark", "mnist-label-inference"] = run_inference(
                session, df, 3144, "array<float> column, keep=['label']", lambda out: out.count(),
                keep=["label"])
            df.unpersist()
            for numpy_rows, kind in [(True, "numpy"), (False, "lists")]:
                rdd = spark_rdd(session, opts.rdd_rows, numpy_rows, 8)
                what = "float32[784]" if numpy_rows else "list of 784 floats"
                rates["spark", f"mnist-rdd-{kind}-next_batch"] = run_duotf(
                    session, rdd, opts.rdd_epochs, 3144, f"RDD of ({what}, int), next_batch",
                    main=next_batch_main)
                rates["spark", f"mnist-rdd-{kind}-dataset"] = run_duotf(
                    session, rdd, opts.rdd_epochs, 3144, f"RDD of ({what}, int), dataset()")
                rdd.unpersist()
            alone = next_batch_alone(True)
            print(f"  next_batch(100) alone on received columns (784 float32 + 1 int): {alone:,.0f} "
                  f"rows/s = {1e6 / alone:.2f} us a row of the node's own Python", flush=True)
        finally:
            session.stop()
        if opts.with_tfos is not None:
            from benchmarks import tfos_feed

            if not opts.spark_master.startswith("spark://"):
                raise SystemExit("--with-tfos needs --spark-master spark://... (TFoS has no local mode)")
            wheel = tfos_wheel(opts.with_tfos)
            rates["tfos", "mnist"] = tfos_feed.run(opts.spark_master, wheel, opts.tfos_rows, "lists")
            rates["tfos", "mnist-inference"] = tfos_feed.run(opts.spark_master, wheel, opts.tfos_rows,
                                                             "lists", inference=True)
            rates["tfos", "mnist-numpy"] = tfos_feed.run(opts.spark_master, wheel, opts.tfos_rows, "numpy")
            rates["tfos", "tiny"] = tfos_feed.run(opts.spark_master, wheel, opts.tfos_rows * 3, "tiny")
    if "spark-connect" in opts.backends:
        rates.update(connect_rates(opts))
    if "dask" in opts.backends:
        from distributed import Client, LocalCluster

        with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=None,
                          host="127.0.0.1") as lc, Client(lc) as client:
            print("Dask LocalCluster (2 workers):")
            rates["dask", "mnist"] = run_duotf(client, dask_data(opts.rows, False, 20_000), opts.epochs,
                                               3144, "MNIST-like arrays (x, y)")
            rates["dask", "tiny"] = run_duotf(client, dask_data(opts.tiny_rows, True, 250_000),
                                              opts.tiny_epochs, 8, "tiny array")
            frame = dask_frame(opts.rows, 20_000)
            rates["dask", "mnist-1-epoch"] = run_duotf(client, frame, 1, 3144, "MNIST-like DataFrame, 1 epoch")
            rates["dask", "mnist-inference"] = run_inference(
                client, frame, 3144, "MNIST-like DataFrame", len)  # counted on the workers, as Spark's count()
    print("summary (rows/s over the whole run; MB/s; % of the in-process limit; x the TFoS feed of "
          "the same kind of data):")
    for (engine, kind), rate in sorted(rates.items()):
        base = kind.split("-")[0]
        lim = mnist_limit if base == "mnist" else tiny_limit
        row_bytes = 3144 if base == "mnist" else 8
        line = (f"  {engine:<14}{kind:<32}{rate:>11,.0f} rows/s {rate * row_bytes / 1e6:>6.0f} MB/s "
                f"= {rate / lim:5.0%} of the limit")
        tfos = ("tfos", "mnist-numpy") if "numpy" in kind else ("tfos", base)
        if kind.endswith("inference"):
            tfos = ("tfos", "mnist-inference")
            train = rates.get((engine, kind[:-len("inference")] + "1-epoch"))
            if train and engine != "tfos":
                line += f", {rate / train:.2f}x its training feed (1 epoch)"
        if engine != "tfos" and tfos in rates:
            line += f", {rate / rates[tfos]:.0f}x TFoS"
        print(line)
    if record:
        record_rates(record, rates, mnist_limit, tiny_limit)
        record.write(opts.json)


#: what each rate of the summary fed, as a chart labels it, by engine
LABELS = {
    "spark": {
        "mnist": "array<float> DataFrame (default)",
        "mnist-every-epoch": "array<float>, convert_once=False",
        "mnist-cache": "feed_cache(df)",
        "mnist-packed": "pack_tensors column",
        "mnist-rdd-numpy-next_batch": "RDD (float32[784], label), next_batch",
        "mnist-rdd-numpy-dataset": "RDD (float32[784], label), dataset()",
        "mnist-rdd-lists-next_batch": "RDD ([784 floats], label), next_batch",
        "mnist-rdd-lists-dataset": "RDD ([784 floats], label), dataset()",
        "mnist-1-epoch": "array<float>, one epoch of training",
        "mnist-inference": "array<float>, inference",
        "mnist-label-inference": "array<float>, inference, keep=['label']",
        "mnist-packed-1-epoch": "packed column, one epoch of training",
        "mnist-packed-inference": "packed column, inference",
        "tiny": "tiny rows (one int64)",
    },
    "spark-connect": {
        "mnist": "array<float> DataFrame (default)",
        "mnist-every-epoch": "array<float>, convert_once=False",
        "mnist-cache": "feed_cache(df)",
        "mnist-1-epoch": "array<float>, one epoch of training",
        "mnist-inference": "array<float>, inference",
        "tiny": "tiny rows (one int64)",
    },
    "dask": {
        "mnist": "arrays (x, y)",
        "tiny": "tiny array (one int64)",
        "mnist-1-epoch": "DataFrame, one epoch of training",
        "mnist-inference": "DataFrame, inference",
    },
    "tfos": {
        "mnist": "RDD ([784 floats], label), next_batch",
        "mnist-numpy": "RDD (float32[784], label), next_batch",
        "mnist-inference": "RDD ([784 floats], label), inference",
        "tiny": "RDD of (i,), next_batch",
    },
}


def record_rates(record, rates: dict, mnist_limit: float, tiny_limit: float) -> None:
    """The summary's rates and the limits as rows of ``record``, one chart a comparison:
    MNIST-like rows fed for training, tiny rows, and inference beside one epoch of training."""
    def chart(kind):
        if kind == "tiny":
            return "tiny rows, fed for training"
        if kind.endswith(("inference", "1-epoch")):
            return "MNIST-like rows: inference and one epoch of training"
        return "MNIST-like rows, fed for training"

    for case, rate in (("mnist", mnist_limit), ("tiny", tiny_limit)):
        record.add("rows/s", "rows/s", [rate], peer="in-process limit", case=case,
                   chart=chart(case), label="limit: from_tensor_slices(...).batch(100)",
                   reference=True)
    for (engine, kind), rate in sorted(rates.items()):
        peer, backend = ("TensorFlowOnSpark 2.2.5", "spark") if engine == "tfos" else ("duotf", engine)
        record.add("rows/s", "rows/s", [rate], peer=peer, backend=backend, case=kind,
                   chart=chart(kind), label=LABELS[engine].get(kind, kind))


if __name__ == "__main__":
    cli()
