"""The default ``train(df, epochs)`` on two Spark lines, in turns: each interpreter (a venv of its
own, with its pyspark, TensorFlow and pyarrow) runs ``python -m benchmarks.feed --rounds 1``,
the first then the second, ``--pairs`` times; the rate of each run's timed round, the median of
each side, and the median of the pairs' ratios (second over first).

    python -m benchmarks.legs PYTHON_A PYTHON_B [--pairs 3] [--rows 100000] [--epochs 3]
                              [--spark-master local[3]]

For example, Spark 3.5 (the venv .ci/legs/spark3.5.txt describes) against this environment's
Spark 4.3: ``python -m benchmarks.legs /tmp/leg35/bin/python python3``. The repository root is
put first on each interpreter's path, so both run this checkout's duotf.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from typing import List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: what benchmarks.feed prints for a run: "  duotf round 1 ... 300000 rows:  123,456 rows/s"
_RATE = re.compile(r"duotf round 1\s.*?([\d,]+) rows/s")


def versions(python: str) -> str:
    """The versions of what the run depends on, in ``python``."""
    code = ("import pyspark, tensorflow as tf, pyarrow, pandas, sys; "
            "print(f'pyspark {pyspark.__version__}, TF {tf.__version__}, pyarrow {pyarrow.__version__}, "
            "pandas {pandas.__version__}, Python {sys.version.split()[0]}')")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([python, "-c", code], capture_output=True, text=True, env=env,
                          check=True).stdout.strip()


def one_run(python: str, opts) -> Tuple[float, float]:
    """One ``benchmarks.feed --rounds 1`` in ``python``: its round's rows/s and its wall time."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
               PYSPARK_PYTHON=python, PYSPARK_DRIVER_PYTHON=python)
    begun = time.monotonic()
    done = subprocess.run([python, "-m", "benchmarks.feed", "--rounds", "1", "--rows", str(opts.rows),
                           "--epochs", str(opts.epochs), "--spark-master", opts.spark_master],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=1200)
    if done.returncode != 0:
        raise SystemExit(f"{python} -m benchmarks.feed failed:\n{done.stdout}\n{done.stderr}")
    found = _RATE.search(done.stdout)
    if found is None:
        raise SystemExit(f"no rate in the output of {python}:\n{done.stdout}")
    return float(found.group(1).replace(",", "")), time.monotonic() - begun


def main(argv: List[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("python_a")
    parser.add_argument("python_b")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--spark-master", default="local[3]")
    opts = parser.parse_args(argv)
    sides = {"A": opts.python_a, "B": opts.python_b}
    for name, python in sides.items():
        print(f"{name}: {python}: {versions(python)}", flush=True)
    print(f"The default train(df, epochs={opts.epochs}), {opts.rows:,} MNIST-like rows, Spark "
          f"{opts.spark_master}, A then B, {opts.pairs} pairs:", flush=True)
    rates = {"A": [], "B": []}
    for pair in range(opts.pairs):
        for name, python in sides.items():
            rate, seconds = one_run(python, opts)
            rates[name].append(rate)
            print(f"  pair {pair + 1} {name}: {rate:>10,.0f} rows/s ({seconds:.0f} s for the whole run)",
                  flush=True)
    ratios = [b / a for a, b in zip(rates["A"], rates["B"])]
    for name in sides:
        print(f"  median {name}: {statistics.median(rates[name]):>10,.0f} rows/s")
    print(f"  B/A, the median of the pairs' ratios: {statistics.median(ratios):.2f} "
          f"({', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main(sys.argv[1:])
