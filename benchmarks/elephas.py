"""Time to a fixed test accuracy: duotf against elephas 7.3.0, the same Keras model and data.

    python -m benchmarks.elephas [--pairs 3] [--target 0.80] [--modes averaging averaging-big
                                 mwms mwms-big] [--frame parquet|arrow] [--venv DIR] [--json PATH]

The task: a 784 -> 128 relu -> 10 softmax MLP (Keras, ``SGD(0.01)``, the elephas README's
optimizer; the same initial weights on both sides) learns 90,000 MNIST-like rows, 2 workers on
Spark ``local``, until its accuracy on 10,000 held-out rows reaches ``--target``. The rows are the
scikit-learn digits (nothing is downloaded) drawn 3x larger on a 28x28 canvas at a random shift
of up to 2 pixels, dimmed at random and under Gaussian noise; the held-out rows are drawn from
digits that no training row comes from. They are made once, from one seed, into a ``.npz`` file
that both sides load.

**The measure** is the wall time from the start of the user's program (a fresh Python process:
its imports, the Spark JVM, the nodes' start and every TensorFlow import included) to the
driver holding a model at the target: the accuracy is taken after every epoch (numpy, the same
function on both sides, its time included), and training stops at the first epoch at the target.

- **elephas** (in its own venv, see below): its README's recipe, ``SparkContext`` on
  ``local[2]``, ``to_simple_rdd(sc, x, y)`` (2 partitions: 2 workers),
  ``SparkModel(model)`` (its default synchronous mode: every worker fits one epoch of its
  partition alone, the driver averages the workers' changes), then ``fit(rdd, epochs=1,
  batch_size=32)`` and the driver's accuracy check, epoch after epoch (one ``fit`` with
  ``epochs=N`` runs the same Spark job N times).
- **duotf**, ``SparkSession`` on ``local[3]`` (2 nodes and a feeding slot), a
  ``ClusterSpec(workers=2)`` started first (the nodes import TensorFlow while the driver makes
  a DataFrame of the same arrays: written as a Parquet file with pyarrow and read with
  ``spark.read.parquet``, or with ``--frame arrow`` ``spark.createDataFrame`` of an Arrow
  table), ``cluster.train(df, epochs=MAX)``; each node fits one epoch at a time (``model.fit(feed.dataset(...), epochs=1)``), checks the same
  accuracy of the same weights as the other node, and at the target both end the feed
  (``feed.terminate()``) and the first returns its weights. Its modes (``--modes``):
  ``averaging``: ``duotf.averaging.AveragingCallback(every=--every)`` with 32 rows a worker's
  step, the model outside any strategy (each worker fits its own copy; elephas's algorithm,
  averaged more often and without a Spark job an epoch); ``mwms``: Keras ``fit`` under
  ``MultiWorkerMirroredStrategy`` at the same 32 rows a worker's step (every step all-reduces
  the gradients); ``averaging-big`` and ``mwms-big``: the same with ``--big-batch`` rows a
  worker's step (256) and the learning rate scaled with the batch (``0.01 * batch / 32``: the
  linear scaling rule), so an eighth of the steps and all-reduces.

Results (2026-11-27, this 2-core VM shared with other work): docs/benchmarks.md, "elephas: time
to a fixed accuracy"; the goal was not met there (start-up bounds a 2-epoch run on both sides).

The two alternate, elephas first, for ``--pairs`` rounds (after one warm-up run of each, not
counted: the first run of a process reads TensorFlow from disk); a round's ratio is each duotf
mode's time over elephas's of the same round; printed: every time, the ratios and their median
beside the goal (duotf <= 0.5x elephas's time), and where each side's time went (each process's
own marks: imports, Spark, the nodes' TensorFlow, every epoch).

**elephas's environment** is a venv of its own, made on first use under ``--venv`` (default a
folder in the temp dir, reused while its marker file names the same pins): elephas 7.3.0
installed with ``--no-deps`` (it pins ``pyspark<=4.0.0`` and ``tensorflow<2.20``) and exactly
what it imports: ``ELEPHAS_PINS``. The main environment (duotf, pyspark 4.3, TF 2.21) runs
duotf's side; the two sides never share a process. ``--json PATH`` writes the times with the
command and machine (``benchmarks/record.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

#: what elephas 7.3.0 needs in its venv, beside itself (installed with --no-deps): its own
#: declared ranges (pyspark<=4.0.0, tensorflow<2.20, numpy<2, h5py and flask at its pins; flask
#: is imported by its parameter server module, which ``elephas.spark_model`` imports) at their
#: newest matching versions, and the Keras that TF 2.19 takes.
ELEPHAS = "elephas==7.3.0"
ELEPHAS_PINS = ("pyspark==4.0.0", "tensorflow-cpu==2.19.1", "keras==3.15.1", "numpy==1.26.4",
                "h5py==3.11.0", "flask==2.3.3")
#: the modes of duotf measured, by name (see the module's docstring)
MODES = ("averaging", "averaging-big", "mwms", "mwms-big")
#: a mode's bar in the chart
LABELS = {"averaging": "averaging every {every} steps, batch 32 (local[3])",
          "averaging-big": "averaging every {every} steps, batch {big} (local[3])",
          "mwms": "MWMS fit, batch 32 a worker (local[3])",
          "mwms-big": "MWMS fit, batch {big} a worker (local[3])"}
WIDTH, HIDDEN, CLASSES = 784, 128, 10
LR = 0.01  # Keras's SGD default, as elephas's README compiles its MLP
BATCH = 32  # rows a worker's step: Keras's and elephas's default batch_size
MARK = "@@ "  # a child's result lines on stdout start with it
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- the data and the model, the same on both sides --------------------------------------------
def make_data(path: str, rows: int = 90_000, test_rows: int = 10_000, seed: int = 0,
              noise: float = 0.35, shift: int = 2) -> str:
    """Write the MNIST-like rows (see the module's docstring) and the model's initial weights
    (Glorot uniform, zero biases) to ``path`` (``.npz``); return ``path``."""
    from sklearn.datasets import load_digits

    rng = np.random.default_rng(seed)
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)
    order = rng.permutation(len(images))
    held_out = len(images) // 5  # digits that only the held-out rows are drawn from
    big = np.kron(images, np.ones((3, 3), np.float32))  # (n, 24, 24)
    side = 2 * shift + 1

    def draw(pool, n):
        pick = rng.choice(pool, n)
        out = np.zeros((n, 28, 28), np.float32)
        dy, dx = rng.integers(0, side, n), rng.integers(0, side, n)
        for a in range(side):
            for b in range(side):
                at = (dy == a) & (dx == b)
                top, left = 2 - shift + a, 2 - shift + b
                out[at, top:top + 24, left:left + 24] = big[pick[at]]
        out *= rng.uniform(0.6, 1.0, (n, 1, 1)).astype(np.float32)
        out += rng.normal(0.0, noise, out.shape).astype(np.float32)
        np.clip(out, 0.0, 1.0, out=out)
        return out.reshape(n, WIDTH), digits.target[pick].astype(np.int64)

    x_train, y_train = draw(order[held_out:], rows)
    x_test, y_test = draw(order[:held_out], test_rows)

    def glorot(shape):
        limit = np.sqrt(6.0 / sum(shape))
        return rng.uniform(-limit, limit, size=shape).astype(np.float32)

    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test,
             w0=glorot((WIDTH, HIDDEN)), w1=np.zeros(HIDDEN, np.float32),
             w2=glorot((HIDDEN, CLASSES)), w3=np.zeros(CLASSES, np.float32))
    return path


def initial_weights(data) -> List[np.ndarray]:
    return [data[f"w{i}"] for i in range(4)]


def accuracy(weights: Sequence[np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    """The MLP's accuracy on ``(x, y)`` from its weights, in numpy: the same on both sides."""
    w0, b0, w1, b1 = weights
    hidden = np.maximum(x @ w0 + b0, 0.0)
    return float(np.mean(np.argmax(hidden @ w1 + b1, axis=1) == y))


def build_model(lr: float = LR):
    """The compiled MLP (``import keras``: Keras 3 in both environments)."""
    import keras

    model = keras.Sequential([keras.Input((WIDTH,)),
                              keras.layers.Dense(HIDDEN, activation="relu"),
                              keras.layers.Dense(CLASSES, activation="softmax")])
    model.compile(keras.optimizers.SGD(lr), "sparse_categorical_crossentropy")
    return model


def scaled_lr(per_worker_batch: int) -> float:
    """The learning rate of the linear scaling rule: ``LR`` at elephas's ``BATCH`` rows a
    worker's step, scaled with the batch."""
    return LR * per_worker_batch / BATCH


def say(**fields) -> None:
    """A result line for the parent (stdout, marked)."""
    print(MARK + json.dumps(fields), flush=True)


# -- elephas's side (run by the venv's python) ---------------------------------------------------
def elephas_side(opts) -> None:
    from pyspark import SparkConf, SparkContext

    marks = {"imported pyspark": time.time()}
    conf = (SparkConf().setAppName("elephas-bench").setMaster("local[2]")
            .set("spark.ui.enabled", "false").set("spark.driver.memory", opts.driver_memory))
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    marks["SparkContext"] = time.time()
    from elephas.spark_model import SparkModel
    from elephas.utils.rdd_utils import to_simple_rdd

    model = build_model()
    marks["imported TF, elephas; model"] = time.time()
    data = np.load(opts.data)
    model.set_weights(initial_weights(data))
    x_test, y_test = data["x_test"], data["y_test"]
    rdd = to_simple_rdd(sc, data["x_train"], data["y_train"])
    if rdd.getNumPartitions() != 2:
        raise RuntimeError(f"expected 2 partitions (local[2]), got {rdd.getNumPartitions()}")
    spark_model = SparkModel(model)
    marks["RDD"] = time.time()
    epochs = []
    for epoch in range(1, opts.max_epochs + 1):
        spark_model.fit(rdd, epochs=1, batch_size=BATCH, verbose=0)
        fitted = time.time()
        acc = accuracy(spark_model.master_network.get_weights(), x_test, y_test)
        epochs.append([epoch, fitted, time.time(), acc])
        if acc >= opts.target:
            break
    say(side="elephas", marks=marks, epochs=epochs, done=time.time(), accuracy=epochs[-1][3])
    sc.stop()


# -- duotf's side (run by the main environment's python) ----------------------------------------
def node_main(args, ctx):
    """One node: fit an epoch at a time until the held-out accuracy reaches the target."""
    import time as _time

    start = _time.time()
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # first: it sets up collectives
    import keras  # noqa: F401  (main imports Keras: duotf's fix of Keras fit under MWMS applies)

    tf_ready = _time.time()
    data = np.load(args["data"])
    x_test, y_test = data["x_test"], data["y_test"]
    feed = ctx.get_data_feed(train=True)
    mode, batch = args["mode"], args["batch"]
    callbacks = []
    if mode.startswith("averaging"):
        from duotf.averaging import AveragingCallback

        ds = feed.dataset(batch, features="x", label="y")
        model = build_model(args["lr"])  # this worker's own copy
        callbacks.append(AveragingCallback(every=args["every"], strategy=strategy))
    else:  # under the strategy Keras takes the global batch
        ds = feed.dataset(batch * ctx.num_workers, features="x", label="y")
        with strategy.scope():
            model = build_model(args["lr"])
    model.set_weights(initial_weights(data))
    epochs = []
    for epoch in range(1, args["max_epochs"] + 1):
        model.fit(ds, epochs=1, verbose=0, callbacks=callbacks)  # averaging: ends averaged
        fitted = _time.time()
        acc = accuracy(model.get_weights(), x_test, y_test)  # the same weights on every node
        epochs.append([epoch, fitted, _time.time(), acc])
        if acc >= args["target"]:
            break
    feed.terminate()  # the driver's train() returns; rows of later epochs are not fed
    result = {"start": start, "tf": tf_ready, "epochs": epochs}
    if ctx.task_index == 0:
        result["weights"] = model.get_weights()
    return result


def dataframe(session, x: np.ndarray, y: np.ndarray, how: str, folder: str):
    """The rows as a Spark DataFrame (``x array<float>``, ``y bigint``): a Parquet file written
    by pyarrow in ``folder`` and read by Spark (``how="parquet"``), or ``createDataFrame`` of
    the Arrow table (``"arrow"``, which Spark then converts row by row on every read)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    offsets = pa.array(np.arange(0, (len(x) + 1) * WIDTH, WIDTH, dtype=np.int32))
    table = pa.table({"x": pa.ListArray.from_arrays(offsets, pa.array(x.reshape(-1))),
                      "y": pa.array(y)})
    if how == "arrow":
        return session.createDataFrame(table)
    path = os.path.join(folder, "rows.parquet")
    pq.write_table(table, path, compression="none")
    return session.read.parquet(path)


def duotf_side(opts) -> None:
    import shutil

    from pyspark.sql import SparkSession

    import duotf

    marks = {"imported pyspark, duotf": time.time()}
    session = (SparkSession.builder.master("local[3]").appName("duotf-bench")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.memory", opts.driver_memory).getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    marks["SparkSession"] = time.time()
    mode = opts.mode
    batch = opts.big_batch if mode.endswith("-big") else BATCH
    args = {"data": opts.data, "mode": mode, "batch": batch, "lr": scaled_lr(batch),
            "every": opts.every,
            "target": opts.target, "max_epochs": opts.max_epochs}
    with duotf.run(node_main, args, session, duotf.ClusterSpec(workers=2),
                   env={"TF_CPP_MIN_LOG_LEVEL": "3"}, progress=False) as cluster:
        marks["duotf.run"] = time.time()
        data = np.load(opts.data)
        folder = tempfile.mkdtemp(prefix="rows-", dir=os.path.dirname(os.path.abspath(opts.data)))
        df = dataframe(session, data["x_train"], data["y_train"], opts.frame, folder)
        marks["DataFrame"] = time.time()
        report = cluster.train(df, epochs=opts.max_epochs)
        marks["train()"] = time.time()
        results = cluster.wait()
        done = time.time()
    first = results[0]
    acc = accuracy(first["weights"], data["x_test"], data["y_test"])  # the driver's model
    say(side="duotf", mode=mode, marks=marks, epochs=first["epochs"], done=done, accuracy=acc,
        nodes=[{"start": r["start"], "tf": r["tf"]} for r in results],
        count_seconds=report.get("count_seconds"), epoch_seconds=report.get("epoch_seconds"),
        train_seconds=report.get("seconds"))
    session.stop()
    shutil.rmtree(folder, ignore_errors=True)


# -- the parent: venv, data, rounds --------------------------------------------------------------
def default_venv() -> str:
    return os.path.join(tempfile.gettempdir(), "duotf-bench-elephas-venv")


def ensure_venv(folder: str) -> str:
    """elephas's venv at ``folder`` (made, or reused while its marker names the same pins);
    return its python."""
    python = os.path.join(folder, "bin", "python")
    marker = os.path.join(folder, "duotf-bench-pins.txt")
    wanted = "\n".join((ELEPHAS,) + ELEPHAS_PINS) + "\n"
    if os.path.exists(marker) and open(marker).read() == wanted and os.path.exists(python):
        return python
    print(f"making elephas's venv in {folder} ({ELEPHAS} --no-deps; {' '.join(ELEPHAS_PINS)})",
          flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", folder], check=True)
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run(pip + list(ELEPHAS_PINS), check=True)
    subprocess.run(pip + ["--no-deps", ELEPHAS], check=True)
    with open(marker, "w") as f:
        f.write(wanted)
    return python


def child_command(python: str, side: str, opts, mode: Optional[str] = None) -> List[str]:
    cmd = [python, "-m", "benchmarks.elephas", "--side", side, "--data", opts.data,
           "--target", str(opts.target), "--max-epochs", str(opts.max_epochs),
           "--every", str(opts.every), "--big-batch", str(opts.big_batch),
           "--driver-memory", opts.driver_memory, "--frame", opts.frame]
    return cmd + (["--mode", mode] if mode else [])


def run_child(cmd: List[str], env: Dict[str, str], log: str) -> Dict[str, Any]:
    """Run one side in a fresh process; its result line with the times made relative to the
    process's start (``time`` to the target, ``marks``, ``epochs``)."""
    start = time.time()
    with open(log, "w") as err:
        out = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    lines = [line[len(MARK):] for line in out.stdout.splitlines() if line.startswith(MARK)]
    if out.returncode != 0 or not lines:
        with open(log) as f:
            tail = f.read()[-4000:]
        raise RuntimeError(f"{' '.join(cmd[:5])} failed ({out.returncode}); its stderr "
                           f"({log}) ends:\n{tail}")
    result = json.loads(lines[-1])
    result["time"] = result["done"] - start
    result["marks"] = {k: v - start for k, v in result["marks"].items()}
    result["epochs"] = [[e, f - start, a - start, acc] for e, f, a, acc in result["epochs"]]
    if "nodes" in result:
        result["nodes"] = [{k: v - start for k, v in n.items()} for n in result["nodes"]]
    return result


def describe(result: Dict[str, Any]) -> str:
    """Where a run's time went: its marks, and every epoch's end (s from the process's start)."""
    parts = [f"{name} {t:.1f}" for name, t in result["marks"].items()]
    if "nodes" in result:
        parts.append("nodes' TF imported " + "/".join(f"{n['tf']:.1f}" for n in result["nodes"]))
        epochs = "+".join(f"{s:.1f}" for s in result["epoch_seconds"])
        parts.append(f"train(): JVM pass {result['count_seconds']:.1f} + epochs {epochs}")
    parts += [f"epoch {e} {f:.1f} (acc {acc:.3f})" for e, f, _, acc in result["epochs"]]
    return ", ".join(parts) + f", model on the driver {result['time']:.1f}"


def phases(result: Dict[str, Any]) -> Dict[str, Any]:
    """A run's marks for the record: where its time went (s from its process's start)."""
    keep = ("marks", "epochs", "nodes", "count_seconds", "epoch_seconds", "train_seconds")
    return {k: result[k] for k in keep if k in result}


def reached(result: Dict[str, Any], target: float) -> bool:
    return result["accuracy"] >= target


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3, help="rounds of elephas then each mode")
    parser.add_argument("--target", type=float, default=0.80, help="held-out accuracy to reach")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--rows", type=int, default=90_000)
    parser.add_argument("--test-rows", type=int, default=10_000)
    parser.add_argument("--max-epochs", type=int, default=10, help="give up after these")
    parser.add_argument("--every", type=int, default=100, help="averaging: steps between averages")
    parser.add_argument("--big-batch", type=int, default=256,
                        help="averaging-big, mwms-big: rows a worker's step")
    parser.add_argument("--driver-memory", default="4g", help="spark.driver.memory, both sides")
    parser.add_argument("--frame", choices=["parquet", "arrow"], default="parquet",
                        help="how duotf's side makes its DataFrame of the arrays")
    parser.add_argument("--warmup", type=int, default=1, help="uncounted runs of each side first")
    parser.add_argument("--venv", default=None, help="elephas's venv (made if missing)")
    parser.add_argument("--work", default=None, help="folder for the data and the sides' logs "
                        "(default: a temp folder, removed after a run that succeeds)")
    parser.add_argument("--json", metavar="PATH", help="also write the times here")
    # a child's options: which side this process runs
    parser.add_argument("--side", choices=["elephas", "duotf"], help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.pairs < 1 or opts.max_epochs < 1 or opts.every < 1 or opts.big_batch < 1:
        parser.error("--pairs, --max-epochs, --every and --big-batch must be >= 1")
    if not 0 < opts.target < 1:
        parser.error("--target is an accuracy, between 0 and 1")
    return opts


def main(argv=None) -> None:
    opts = parse(argv)
    if opts.side == "elephas":
        return elephas_side(opts)
    if opts.side == "duotf":
        import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[__name__])  # nodes need no benchmarks/
        return duotf_side(opts)
    from benchmarks.record import Record

    record = Record("elephas", settings=vars(opts))
    work = opts.work or tempfile.mkdtemp(prefix="duotf-bench-elephas-")
    os.makedirs(work, exist_ok=True)
    opts.data = make_data(os.path.join(work, "data.npz"), opts.rows, opts.test_rows)
    venv_python = ensure_venv(opts.venv or default_venv())
    base = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
    base.pop("PYSPARK_PYTHON", None)
    base.pop("PYSPARK_DRIVER_PYTHON", None)
    # elephas's Python workers are the venv's; duotf's nodes import this checkout's duotf
    elephas_env = dict(base, PYSPARK_PYTHON=venv_python)
    duotf_env = dict(base, PYSPARK_PYTHON=sys.executable,
                     PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get(
                         "PYTHONPATH")] if p]))
    runs = [("elephas", None)] + [("duotf", mode) for mode in opts.modes]
    print(f"{opts.rows:,} MNIST-like rows, held-out {opts.test_rows:,}, target accuracy "
          f"{opts.target}; elephas 7.3.0 on local[2] (its venv: {' '.join(ELEPHAS_PINS)}), "
          f"duotf on local[3]; {opts.pairs} pairs", flush=True)

    def one(side, mode, label):
        python = venv_python if side == "elephas" else sys.executable
        env = elephas_env if side == "elephas" else duotf_env
        log = os.path.join(work, f"{label}-{side}{'-' + mode if mode else ''}.log")
        result = run_child(child_command(python, side, opts, mode), env, log)
        name = side if mode is None else f"duotf {mode}"
        flag = "" if reached(result, opts.target) else " (NOT at the target: max epochs)"
        print(f"  {label} {name:<20} {result['time']:6.1f} s to {result['accuracy']:.4f} in "
              f"{len(result['epochs'])} epochs{flag}: {describe(result)}", flush=True)
        return result

    for w in range(opts.warmup):
        for side, mode in runs:
            one(side, mode, f"warm-up {w + 1}")
    times: Dict[str, List[float]] = {name: [] for name in ["elephas"] + list(opts.modes)}
    results: Dict[str, List[Dict[str, Any]]] = {name: [] for name in times}
    for p in range(opts.pairs):
        for side, mode in runs:
            r = one(side, mode, f"pair {p + 1}")
            key = mode or "elephas"
            results[key].append(r)
            times[key].append(r["time"] if reached(r, opts.target) else float("inf"))  # never
    summary(opts, times, results, record)
    if opts.json:
        record.write(opts.json)
    if not opts.work:  # a failed run keeps it: its error names the side's log there
        import shutil

        shutil.rmtree(work, ignore_errors=True)


def summary(opts, times, results, record) -> None:
    print(f"\ntime to {opts.target} held-out accuracy (s), from the program's start to the "
          f"model on the driver; ratio = duotf / elephas of the same pair; goal <= 0.5")
    header = f"{'pair':<6} {'elephas':>8}" + "".join(f" {m:>10} {'ratio':>6}" for m in opts.modes)
    print(header)
    ratios = {m: [t / e for t, e in zip(times[m], times["elephas"])] for m in opts.modes}
    for p in range(opts.pairs):
        line = f"{p + 1:<6} {times['elephas'][p]:>8.1f}"
        for m in opts.modes:
            line += f" {times[m][p]:>10.1f} {ratios[m][p]:>6.2f}"
        print(line)
    line = f"{'median':<6} {statistics.median(times['elephas']):>8.1f}"
    for m in opts.modes:
        line += f" {statistics.median(times[m]):>10.1f} {statistics.median(ratios[m]):>6.2f}"
    print(line)
    best = min(opts.modes, key=lambda m: statistics.median(ratios[m]))
    verdict = "met" if statistics.median(ratios[best]) <= 0.5 else "NOT met"
    print(f"best duotf mode: {best}, median ratio {statistics.median(ratios[best]):.2f} "
          f"(goal <= 0.5: {verdict})")
    epochs = {k: [len(r["epochs"]) for r in v] for k, v in results.items()}
    print("epochs to the target: " + ", ".join(f"{k} {v}" for k, v in epochs.items()))
    chart = f"time to {opts.target} held-out accuracy"

    def row(peer, case, key, **extra):  # a run that never reached the target: its whole time
        record.add("time to accuracy", "s", [r["time"] for r in results[key]], peer=peer,
                   backend="spark", case=case, chart=chart, epochs=epochs[key],
                   reached=[reached(r, opts.target) for r in results[key]],
                   accuracy=[r["accuracy"] for r in results[key]],
                   phases=[phases(r) for r in results[key]], **extra)

    row("elephas 7.3.0", "SparkModel, synchronous", "elephas",
        label="elephas 7.3.0: SparkModel (an average an epoch), batch 32, local[2]")
    for m in opts.modes:
        finite = [x if x != float("inf") else None for x in ratios[m]]
        median = statistics.median(ratios[m])
        row("duotf", m, m, label=LABELS[m].format(every=opts.every, big=opts.big_batch),
            ratio=finite, ratio_median=None if median == float("inf") else median, goal=0.5)
    elephas = statistics.median(times["elephas"])
    if elephas != float("inf"):
        record.add("time to accuracy", "s", [0.5 * elephas], peer="goal", case="goal",
                   chart=chart, reference=True, label="goal: 0.5x elephas's median")


if __name__ == "__main__":
    main()
