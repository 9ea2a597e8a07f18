"""``python -m duotf.backends.spark.jvm``: rebuild duotf's jar for the installed pyspark's line
from the Java sources (needs a JDK). ``--spark-jars DIR --line spark3`` builds another line's
against a folder of that line's Spark jars (a pyspark 3.5's ``pyspark/jars``); ``--check`` says
which shipped jars are not built from the current sources, and exits 1 if any."""

import argparse
import sys
from pathlib import Path

from duotf.backends.spark.jvm import LINES, build, stale

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m duotf.backends.spark.jvm", description=__doc__)
    parser.add_argument("--line", choices=sorted(LINES))
    parser.add_argument("--spark-jars", type=Path, help="a folder of that line's Spark jars")
    parser.add_argument("--into", type=Path, help="where to write the jar (default: the package's)")
    parser.add_argument("--check", action="store_true", help="check the shipped jars, build nothing")
    args = parser.parse_args()
    if args.check:
        old = stale()
        for line in old:
            print(f"duotf-jvm-{line}.jar is not built from the current sources")
        sys.exit(1 if old else 0)
    print(build(args.line, args.spark_jars, args.into))
