"""petastorm's side of ``benchmarks/petastorm.py``, run by the python of the benchmark's own venv
(petastorm 0.13.1, pyarrow 14, numpy < 2, pyspark 3.5, TensorFlow 2.17), never in duotf's
environment: it imports neither duotf nor anything of the benchmarks but ``benchmarks.mnist``.

    VENV/bin/python -m benchmarks.petastorm_peer serve --spark-master local[3] --cache-dir DIR
    VENV/bin/python -m benchmarks.petastorm_peer shard --index I --count N

``serve`` keeps one SparkSession and answers one JSON command a line on stdin, each reply a
line ``@@peer {...}`` on stdout (Spark, TensorFlow and petastorm may write their own lines
around it):

- ``{"op": "data", "rows": N, "partitions": P, "varied": V}``: the MNIST-like DataFrame of
  ``benchmarks.mnist``, cached and counted (as ``benchmarks.feed.spark_data`` makes duotf's);
- ``{"op": "run", "epochs": E, "batch": B, "shards": N}``: N ``shard`` processes, each of which
  imports TensorFlow and petastorm and says so; once all have, ``make_spark_converter(df)``
  (the DataFrame written as Parquet under the cache folder), the converter handed to each
  shard (pickled, as Horovod or a process pool hands it), and each drains
  ``converter.make_tf_dataset(batch_size=B, cur_shard=i, shard_count=N, num_epochs=E)``; then
  ``converter.delete()``, so that the next run converts again. The reply holds the call's
  time, the converter's seconds and every shard's rows and the time of its first and last batch;
- ``{"op": "guide", "page": PATH, "dir": DIR}``: runs the petastorm blocks of the guide
  (docs/guides/petastorm.md) with the session's DataFrame as ``df`` and its Parquet under DIR;
- ``{"op": "quit"}``.
"""

from __future__ import annotations

import argparse
import base64
import json
import pickle
import subprocess
import sys
import time

#: the mark of a line meant for the other side
MARK = "@@peer "
#: a line of each petastorm block of docs/guides/petastorm.md -> the block's data locations
#: (replaced as text before it runs) and the name whose value says what it did
GUIDE_BLOCKS = {
    "converter = make_spark_converter(df)": ({"file:///dbfs/tmp/petastorm": "file://{dir}/cache"},
                                             "loss"),
}


def say(message: dict) -> None:
    """A reply to the other side: one marked JSON line on stdout."""
    sys.stdout.write(MARK + json.dumps(message) + "\n")
    sys.stdout.flush()


def hear(stream) -> dict:
    """The next marked line of ``stream`` as a dict; other lines are passed on to stderr."""
    for line in stream:
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
        sys.stderr.write(line)
    raise EOFError("the other side ended without a reply")


def shard(index: int, count: int) -> None:
    """A training process: imports TF and petastorm, says so, then drains its shard of the
    converter it is handed, as a Horovod rank does."""
    import tensorflow  # noqa: F401 - what a training process imports first
    import petastorm.spark  # noqa: F401 - and what unpickling the converter needs

    say({"ready": time.time()})
    job = pickle.loads(base64.b64decode(sys.stdin.readline()))
    converter = job["converter"]
    rows, first, last = 0, None, None
    with converter.make_tf_dataset(batch_size=job["batch"], cur_shard=index, shard_count=count,
                                   num_epochs=job["epochs"]) as dataset:
        for batch in dataset:
            rows += int(batch.label.shape[0])
            last = time.time()  # the last batch's time, not the reader's stop after it
            first = first or last
    say({"rows": rows, "first": first, "last": last})


def run(df, epochs: int, batch: int, shards: int) -> dict:
    """One end-to-end run of ``shards`` processes over ``df``: see the module's docstring."""
    from petastorm.spark import make_spark_converter

    launched = time.time()
    procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.petastorm_peer", "shard",
                               "--index", str(i), "--count", str(shards)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for i in range(shards)]
    try:
        ready = [hear(p.stdout)["ready"] for p in procs]
        start = time.time()
        converter = make_spark_converter(df)
        converted = time.time() - start
        job = base64.b64encode(pickle.dumps({"converter": converter, "epochs": epochs,
                                             "batch": batch})).decode()
        for p in procs:
            p.stdin.write(job + "\n")
            p.stdin.flush()
        results = [hear(p.stdout) for p in procs]
        for p in procs:
            p.wait(timeout=120)
        converter.delete()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return {"launched": launched, "ready": ready, "start": start, "converted": converted,
            "rows": len(converter), "shards": results}


def guide(spark, df, page: str, folder: str) -> dict:
    """Run the guide's petastorm blocks (found by the lines of ``GUIDE_BLOCKS``) in this
    environment, ``spark`` and ``df`` given, their locations under ``folder``."""
    import re

    text = open(page).read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    ran = []
    for line, (data, result) in GUIDE_BLOCKS.items():
        (code,) = [b for b in blocks if line in b]
        for old, new in data.items():
            assert old in code, f"the block of {line!r} no longer names {old!r}"
            code = code.replace(old, new.format(dir=folder))
        names = {"spark": spark, "df": df, "__name__": "guide_block"}
        exec(compile(code, f"{page}:{line}", "exec"), names)
        ran.append({"block": line, result: repr(names[result])})
    return {"ran": ran}


def serve(master: str, cache_dir: str) -> None:
    from pyspark.sql import SparkSession
    from petastorm.spark import SparkDatasetConverter

    from benchmarks.mnist import mnist_frame

    spark = (SparkSession.builder.master(master).config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, "file://" + cache_dir)
    from importlib import metadata

    say({"versions": {name: metadata.version(name) for name in
                      ("petastorm", "pyarrow", "numpy", "pandas", "pyspark", "tensorflow-cpu")}})
    df = None
    try:
        for line in sys.stdin:
            command = json.loads(line)
            if command["op"] == "data":
                if df is not None:
                    df.unpersist()
                t0 = time.time()
                df = mnist_frame(spark, command["rows"], command["partitions"],
                                 command.get("varied", False)).cache()
                say({"rows": df.count(), "seconds": time.time() - t0})
            elif command["op"] == "run":
                say(run(df, command["epochs"], command["batch"], command["shards"]))
            elif command["op"] == "guide":
                say(guide(spark, df, command["page"], command["dir"]))
            elif command["op"] == "quit":
                break
    finally:
        spark.stop()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    one = sub.add_parser("serve")
    one.add_argument("--spark-master", default="local[3]")
    one.add_argument("--cache-dir", required=True)
    two = sub.add_parser("shard")
    two.add_argument("--index", type=int, required=True)
    two.add_argument("--count", type=int, required=True)
    opts = parser.parse_args(argv)
    if opts.what == "serve":
        serve(opts.spark_master, opts.cache_dir)
    else:
        shard(opts.index, opts.count)


if __name__ == "__main__":
    main()
