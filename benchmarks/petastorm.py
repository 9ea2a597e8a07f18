"""duotf against petastorm's Spark converter, end to end, on the same MNIST-like DataFrame.

    python -m benchmarks.petastorm [--rows 100000 [1000000 ...]] [--epochs 1 10] [--pairs 3]
                                   [--varied] [--spark-master local[3]] [--venv DIR] [--json PATH]
    python -m benchmarks.petastorm --guide [--venv DIR]

Two processes read one DataFrame of MNIST-like rows (784 float32 in an ``array<float>`` column
and an int64 label: ``benchmarks.mnist``, which ``benchmarks.feed.spark_data`` feeds too), in
batches of 100, for E epochs, no model:

- **duotf**: ``cluster.train(df, epochs=E)`` with 2 nodes, each draining
  ``ctx.get_data_feed().dataset(100)`` (``benchmarks.feed.run_duotf`` and ``drain_main``);
- **petastorm 0.13.1**: ``make_spark_converter(df)`` (the DataFrame written as Parquet under
  ``petastorm.spark.converter.parentCacheDirUrl``), then 2 processes (as Horovod's ranks), each
  draining ``converter.make_tf_dataset(batch_size=100, cur_shard=i, shard_count=2,
  num_epochs=E)``, petastorm's defaults otherwise (4 reader threads, prefetch AUTOTUNE); the
  converter is deleted after each run, so that each run converts (``benchmarks/petastorm_peer.py``).

A rate is every row read over the whole run, from the call that starts it (``train`` or
``make_spark_converter``, made once both processes have imported TensorFlow, so that both
leave TF's start-up out) to the last batch of the last process to finish: the count, the first
epoch's conversion, the converter's Parquet and every epoch are in it. The whole job, the
processes' start and TF's import included, is printed beside it.

petastorm 0.13.1 imports only with pyarrow 14 and numpy < 2 (duotf's environment has pyarrow
26, which pyspark 4's Arrow paths need), so it runs in a venv of its own, made here on first use
(``--venv DIR``, default ``$TMPDIR/duotf-bench-petastorm-venv``, reused while it holds the same
pins: ``PEER_REQUIREMENTS``), with pyspark 3.5 and TensorFlow 2.17 (CPU), the newest that
install beside them; it runs in a process of that venv's python with a SparkSession of its own
on the same master URL (``local[N]``: a ``spark://`` master must run the venv's Spark version).
duotf runs here (pyspark 4.3, TF 2.21). Each row count's DataFrame is built and cached on both
sides, then each side runs as its warm-up (not counted: the session's first jobs start Spark's
Python workers and compile the JVMs' paths; duotf runs 1 epoch, read through Arrow, and 2,
written by the JVM once, petastorm 1 epoch), then duotf and petastorm take turns, ``--pairs``
pairs at each epoch count, the first of a pair alternating; printed: both rates, each pair's ratio and the median of the
ratios. Target: duotf >= 3x petastorm end to end at 1 and 10 epochs and at 1,000,000 rows.

``--varied`` gives each row 784 values of its own (``benchmarks.mnist.VARIED``) instead of one
value repeated 784 times: Parquet stores a repeated value in a few bytes a row, so the default
rows make petastorm's files (and its writing and reading them) far smaller than real data
would; duotf's frames hold every value either way.

``--guide`` only runs the petastorm blocks of docs/guides/petastorm.md in the venv (the "before"
code of the guide, which duotf's environment cannot import) on 2,000 rows, and says what they
read. ``--json PATH`` writes the rates, the ratios and the run's command, settings (the venv's
versions among them) and machine to PATH (``benchmarks/record.py``; ``benchmarks/charts.py``
draws them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence

#: the peer's venv: what petastorm 0.13.1 imports with, and the pyspark and TensorFlow that
#: install beside pyarrow 14 and numpy < 2 (pyspark 4.x wants a newer pyarrow for its Arrow
#: paths; TensorFlow 2.18 on allows numpy 2, 2.17 is the last built for numpy 1 alone)
PEER_REQUIREMENTS = ("petastorm==0.13.1", "pyarrow==14.0.2", "numpy==1.26.4", "pandas==2.2.3",
                     "pyspark==3.5.9", "tensorflow-cpu==2.17.1")
#: the file of a venv made here that names its pins
MARKER = "duotf-bench-requirements.txt"
#: the checkout's root: the peer runs there, to import benchmarks.petastorm_peer
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOAL = 3.0
PEER = "petastorm 0.13.1"


def default_venv() -> str:
    return os.path.join(tempfile.gettempdir(), "duotf-bench-petastorm-venv")


def ensure_venv(folder: str, requirements: Sequence[str] = PEER_REQUIREMENTS,
                python: str = sys.executable) -> str:
    """The python of a venv at ``folder`` holding ``requirements``: the venv as it is when
    its marker names the same pins, else made anew (only where ``folder`` is missing, empty or
    a venv made here: another folder is refused)."""
    want = "\n".join(requirements) + "\n"
    marker = os.path.join(folder, MARKER)
    exe = os.path.join(folder, "bin", "python")
    if os.path.isfile(marker) and open(marker).read() == want and os.path.isfile(exe):
        return exe
    if os.path.isdir(folder) and os.listdir(folder) and not os.path.isfile(marker):
        raise SystemExit(f"--venv {folder}: not empty and not a venv made by this benchmark; "
                         "give a new folder")
    print(f"making the petastorm venv at {folder}: {' '.join(requirements)} (a few minutes)",
          flush=True)
    subprocess.run([python, "-m", "venv", "--clear", folder], check=True)
    subprocess.run([exe, "-m", "pip", "install", "-q", *requirements], check=True)
    with open(marker, "w") as f:
        f.write(want)
    return exe


def peer_env() -> Dict[str, str]:
    """The peer's environment: this one without what would point its pyspark at duotf's Spark
    or its imports at duotf's packages; the checkout on its path, for benchmarks.*."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("SPARK_HOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYSPARK_SUBMIT_ARGS",
                        "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = ROOT
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return env


class Peer:
    """The petastorm side: ``benchmarks.petastorm_peer serve`` in the venv, one command at a
    time (see that module)."""

    def __init__(self, python: str, master: str, cache_dir: str):
        from benchmarks.petastorm_peer import hear

        self._hear = hear
        self.proc = subprocess.Popen([python, "-m", "benchmarks.petastorm_peer", "serve",
                                      "--spark-master", master, "--cache-dir", cache_dir],
                                     cwd=ROOT, env=peer_env(), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.versions = self._hear(self.proc.stdout)["versions"]

    def ask(self, **command) -> dict:
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return self._hear(self.proc.stdout)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.ask(op="quit")
            except (EOFError, BrokenPipeError):
                pass
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def peer_rate(result: dict, epochs: int) -> dict:
    """A petastorm run's figures: rows/s from ``make_spark_converter`` to the last batch of
    the last shard, the converter's seconds, and the whole job's seconds (from the shards'
    launch)."""
    rows = sum(s["rows"] for s in result["shards"])
    if rows != result["rows"] * epochs:
        raise AssertionError(f"petastorm's shards read {rows} rows, not {result['rows']} x {epochs}")
    last = max(s["last"] for s in result["shards"])
    span = last - result["start"]
    return {"rate": rows / span, "seconds": span, "converter": result["converted"],
            "job": last - result["launched"], "rows": rows,
            "shard_rows": [s["rows"] for s in result["shards"]]}


def duotf_rate(session, df, epochs: int) -> dict:
    """duotf's figures for ``train(df, epochs)`` on 2 nodes draining ``dataset(100)``:
    ``benchmarks.feed.run_duotf``'s rate (from ``train`` to the last batch) and the whole job's
    seconds (from ``duotf.run``)."""
    from benchmarks.feed import run_duotf

    launched = time.time()
    rate, results = run_duotf(session, df, epochs, 3144, "", quiet=True)
    rows = sum(r["rows"] for r in results)
    last = max(r["marks"][-1][0] for r in results)
    return {"rate": rate, "seconds": rows / rate, "job": last - launched, "rows": rows}


def order(pair: int) -> tuple:
    """Who runs first in pair ``pair`` (0-based): duotf, then petastorm first, in turn."""
    return ("duotf", "petastorm") if pair % 2 == 0 else ("petastorm", "duotf")


def ratios(duotf: Sequence[float], peer: Sequence[float]) -> List[float]:
    """duotf's rate over petastorm's, pair by pair."""
    if len(duotf) != len(peer) or not duotf:
        raise ValueError(f"pairs of rates needed, got {len(duotf)} and {len(peer)}")
    return [d / p for d, p in zip(duotf, peer)]


def verdict(median: float, goal: float = GOAL) -> str:
    return f"goal >= {goal:g}x: {'met' if median >= goal else 'NOT met'}"


def _line(name: str, got: dict) -> str:
    extra = f", the converter {got['converter']:.2f} s of it" if "converter" in got else ""
    return (f"{name:<10} {got['rate']:>10,.0f} rows/s ({got['rows']:,} rows in {got['seconds']:6.2f} s"
            f"{extra}; whole job {got['job']:6.2f} s)")


def compare(session, peer: Peer, df, epochs: int, pairs: int) -> dict:
    """``pairs`` pairs of runs at ``epochs`` epochs, taking turns; their figures."""
    got: Dict[str, List[dict]] = {"duotf": [], "petastorm": []}
    for pair in range(pairs):
        for who in order(pair):
            if who == "duotf":
                got[who].append(duotf_rate(session, df, epochs))
            else:
                got[who].append(peer_rate(peer.ask(op="run", epochs=epochs, batch=100, shards=2),
                                          epochs))
        d, p = got["duotf"][-1], got["petastorm"][-1]
        print(f"  pair {pair + 1} ({order(pair)[0]} first):\n    {_line('duotf', d)}\n    "
              f"{_line('petastorm', p)}\n    duotf / petastorm = {d['rate'] / p['rate']:.2f}x",
              flush=True)
    r = ratios([x["rate"] for x in got["duotf"]], [x["rate"] for x in got["petastorm"]])
    median = statistics.median(r)
    print(f"  {epochs} epoch(s): median of the pairs' ratios {median:.2f}x "
          f"({', '.join(f'{x:.2f}' for x in r)}); {verdict(median)}", flush=True)
    return {"duotf": got["duotf"], "petastorm": got["petastorm"], "ratios": r, "median": median}


def record_case(record, rows: int, epochs: int, case: dict, varied: bool = False) -> None:
    kind = "varied " if varied else ""
    chart = f"{rows:,} {kind}MNIST-like rows, 2 processes, end to end"
    name = f"{rows}-{kind.strip() + '-' if varied else ''}rows-{epochs}-epochs"
    record.add("rows/s", "rows/s", [x["rate"] for x in case["duotf"]], peer="duotf",
               backend="spark", case=name, chart=chart, label=f"train(df, epochs={epochs}), 2 nodes",
               job_seconds=[x["job"] for x in case["duotf"]])
    record.add("rows/s", "rows/s", [x["rate"] for x in case["petastorm"]], peer=PEER,
               backend="spark", case=name, chart=chart,
               label=f"converter + make_tf_dataset, {epochs} epoch(s), 2 shards",
               converter_seconds=[x["converter"] for x in case["petastorm"]],
               job_seconds=[x["job"] for x in case["petastorm"]],
               shard_rows=case["petastorm"][0]["shard_rows"])
    ratio_chart = f"duotf over petastorm, {rows:,} {kind}rows"
    record.add("duotf / petastorm", "x", case["ratios"], peer="duotf", backend="spark",
               case=name, chart=ratio_chart, label=f"{epochs} epoch(s), median of the pairs")
    if not any(r["chart"] == ratio_chart and r.get("reference") for r in record.rows):
        record.add("duotf / petastorm", "x", [GOAL], peer="goal", case="goal", chart=ratio_chart,
                   label=f"goal: {GOAL:g}x", reference=True)


def guide_run(python: str, master: str) -> None:
    """``--guide``: the guide's petastorm blocks, in the venv."""
    folder = tempfile.mkdtemp(prefix="duotf-petastorm-guide-")
    peer = Peer(python, master, os.path.join(folder, "cache"))
    try:
        peer.ask(op="data", rows=2000, partitions=4)
        out = peer.ask(op="guide", page=os.path.join(ROOT, "docs", "guides", "petastorm.md"),
                       dir=folder)
        for ran in out["ran"]:
            print(f"ran the block of {ran.pop('block')!r} in the venv: {ran}")
    finally:
        peer.close()
        shutil.rmtree(folder, ignore_errors=True)


def parse(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="duotf against petastorm's Spark converter, "
                                                 "end to end")
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000],
                        help="MNIST-like rows of the DataFrame (several: one case each)")
    parser.add_argument("--epochs", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--pairs", type=int, default=3, help="runs of each, taking turns")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--varied", action="store_true",
                        help="784 values of their own a row, not one value repeated (which "
                             "Parquet stores in a few bytes)")
    parser.add_argument("--spark-master", default="local[3]",
                        help="both sides' master URL (a spark:// one must run the venv's Spark "
                             "version too)")
    parser.add_argument("--venv", default=default_venv(),
                        help="the petastorm venv's folder, made if missing (default: %(default)s)")
    parser.add_argument("--guide", action="store_true",
                        help="only run docs/guides/petastorm.md's petastorm blocks in the venv")
    parser.add_argument("--json", metavar="PATH",
                        help="also write the rates, the ratios and the run's command, settings and "
                             "machine to PATH (benchmarks/record.py)")
    opts = parser.parse_args(argv)
    if opts.pairs < 1 or min(opts.rows) < 1 or min(opts.epochs) < 1:
        parser.error("--pairs, --rows and --epochs must be positive")
    if opts.guide and opts.json:
        parser.error("--json records the comparison, not --guide")
    return opts


def cli(argv: Optional[Sequence[str]] = None) -> None:
    opts = parse(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TF loads, here and in the nodes
    python = ensure_venv(opts.venv)
    if opts.guide:
        guide_run(python, opts.spark_master)
        return
    from pyspark.sql import SparkSession

    from benchmarks.feed import checkout_on_executors, run_duotf, spark_data
    from benchmarks.record import Record

    record = Record("petastorm", vars(opts)) if opts.json else None
    cache = tempfile.mkdtemp(prefix="duotf-bench-petastorm-cache-")
    peer = Peer(python, opts.spark_master, cache)
    session = checkout_on_executors(
        SparkSession.builder.master(opts.spark_master).config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")).getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    print(f"duotf: pyspark {session.version} ({opts.spark_master}); petastorm's venv: "
          + ", ".join(f"{k} {v}" for k, v in peer.versions.items()), flush=True)
    if record:
        record.settings["peer_versions"] = peer.versions
        record.settings["peer_requirements"] = list(PEER_REQUIREMENTS)
    summary = []
    values = "784 values of their own a row" if opts.varied else "one value repeated 784 times a row"
    try:
        for rows in opts.rows:
            df = spark_data(session, rows, False, opts.partitions, varied=opts.varied)
            built = peer.ask(op="data", rows=rows, partitions=opts.partitions, varied=opts.varied)
            assert built["rows"] == rows, built
            print(f"{rows:,} MNIST-like rows ({values}) in {opts.partitions} partitions, cached on "
                  "both sides; warm-up (not counted):", flush=True)
            for epochs in (1, 2):  # each path: 1 epoch through Arrow, more written by the JVM
                run_duotf(session, df, epochs, 3144, f"warm-up, {epochs} epoch(s)")
            print("  " + _line("petastorm", peer_rate(peer.ask(op="run", epochs=1, batch=100,
                                                                   shards=2), 1)), flush=True)
            for epochs in opts.epochs:
                print(f"{rows:,} rows, {epochs} epoch(s), {opts.pairs} pairs:", flush=True)
                case = compare(session, peer, df, epochs, opts.pairs)
                summary.append((rows, epochs, case))
                if record:
                    record_case(record, rows, epochs, case, opts.varied)
            df.unpersist()
    finally:
        session.stop()
        peer.close()
        shutil.rmtree(cache, ignore_errors=True)
    print(f"summary (median rows/s from the call to the last batch; the median of the pairs' "
          f"ratios; goal >= {GOAL:g}x):")
    for rows, epochs, case in summary:
        d = statistics.median(x["rate"] for x in case["duotf"])
        p = statistics.median(x["rate"] for x in case["petastorm"])
        print(f"  {rows:>9,} rows {epochs:>3} epoch(s): duotf {d:>10,.0f}  petastorm {p:>10,.0f}  "
              f"ratio {case['median']:5.2f}x  {verdict(case['median'])}")
    if record:
        record.write(opts.json)


if __name__ == "__main__":
    cli()
