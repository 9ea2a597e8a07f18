"""Periodic weight averaging (duotf.averaging, every k steps) against per-step synchronous
MultiWorkerMirroredStrategy, side by side on the digits: accuracy and throughput.

    python -m benchmarks.averaging                      # embedded local backend, 2 workers
    python -m benchmarks.averaging --every 1 10 100 --epochs 15 --repeats 2
    python -m benchmarks.averaging --backend dask

Every mode trains the same 64-64-10 perceptron from the same initial weights with plain SGD
(the same learning rate), each worker on the same share of the training split (TF reads the
file: every other row), in batches of ``--batch-size`` rows per worker, for ``--epochs``
passes. MWMS all-reduces the gradients of every step (the global batch is both workers'
batches); averaging trains each worker alone and all-reduces the weights every k steps (with
plain SGD, k=1 is the same computation as MWMS, by weights instead of gradients). ``train s``
is the slowest worker's training loop (strategy set up, TF warm, no start-up); ``rows/s`` is
all workers' rows over it; ``accuracy`` is the test accuracy of the final weights (the same on
every worker: the last average); ``wall s`` is the whole run, the nodes' start included. One
warm-up run first (not shown); then ``--repeats`` rounds of every mode in turn, the median shown.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np

import duotf
from examples.modes import averaging, common


def mwms_main(args, ctx):
    """Per-step synchronous training: every step all-reduces the gradients."""
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    data = np.load(args["data"])
    x = data["x_train"][ctx.task_index::ctx.num_workers]
    y = data["y_train"][ctx.task_index::ctx.num_workers]
    batch, lr = args["batch_size"], args["lr"]
    global_batch = batch * ctx.num_workers
    with strategy.scope():
        params = [tf.Variable(p, aggregation=tf.VariableAggregation.SUM)
                  for p in common.init_params(args["seed"])]

    @tf.function
    def train_step(xb, yb):
        def replica_fn(xb, yb):
            with tf.GradientTape() as tape:
                losses = tf.nn.sparse_softmax_cross_entropy_with_logits(yb, common.logits(params, xb))
                loss = tf.reduce_sum(losses) / global_batch
            for p, g in zip(params, tape.gradient(loss, params)):
                p.assign_sub(lr * g)  # SUM over the replicas: the step of the mean gradient
            return loss

        strategy.run(replica_fn, args=(xb, yb))

    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)
    steps = 0
    t0 = time.monotonic()
    for _ in range(args["epochs"]):
        for xb, yb in ds:
            train_step(xb, yb)
            steps += 1
    seconds = time.monotonic() - t0
    weights = [p.numpy() for p in params]
    return {"worker": ctx.task_index, "accuracy": common.accuracy(weights, args["data"]),
            "steps": steps, "rounds": steps, "seconds": seconds}


def run_mode(backend, args, every):
    t0 = time.monotonic()
    if every == 0:
        with duotf.run(mwms_main, args, backend, duotf.ClusterSpec(workers=args["workers"]),
                       env={"TF_CPP_MIN_LOG_LEVEL": "3"}) as cluster:
            results = cluster.wait()
    else:
        results = averaging.run(backend, dict(args, every=every), args["workers"],
                                env={"TF_CPP_MIN_LOG_LEVEL": "3"})
    wall = time.monotonic() - t0
    seconds = max(r["seconds"] for r in results)
    rows = sum(r["steps"] for r in results) * args["batch_size"]
    return {"accuracy": results[0]["accuracy"], "train": seconds, "rows_s": rows / seconds,
            "wall": wall, "steps": results[0]["steps"], "rounds": results[0]["rounds"]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["local", "dask", "spark"], default="local")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--every", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.3)
    parser.add_argument("--repeats", type=int, default=1, help="runs per mode; the median is shown")
    opts = parser.parse_args(argv)
    common.ship_by_value(common, averaging)
    data = common.prepare_data(tempfile.mkdtemp(prefix="duotf-avg-bench-"))
    backend = common.make_backend(opts.backend, opts.workers + 1)
    args = {"data": data["data"], "batch_size": opts.batch_size, "lr": opts.lr, "seed": 1,
            "epochs": opts.epochs, "workers": opts.workers}
    print(f"digits, {opts.workers} workers on {opts.backend}, {opts.epochs} epochs, "
          f"batch {opts.batch_size} per worker, SGD lr {opts.lr}; median of {opts.repeats}")
    print(f"{'mode':<22} {'accuracy':>8} {'train s':>8} {'rows/s':>9} {'wall s':>7} "
          f"{'steps':>6} {'all-reduces':>11}")
    modes = [0] + list(opts.every)
    run_mode(backend, dict(args, epochs=1), 0)  # warm-up, not shown: the first run pays for cold caches
    runs = {every: [] for every in modes}
    for _ in range(opts.repeats):  # the modes in turn, so that a burst of load hits them alike
        for every in modes:
            runs[every].append(run_mode(backend, args, every))
    for every in modes:
        pick = {key: statistics.median(r[key] for r in runs[every]) for key in runs[every][0]}
        name = "MWMS, every step" if every == 0 else f"averaging, k={every}"
        print(f"{name:<22} {pick['accuracy']:>8.4f} {pick['train']:>8.2f} {pick['rows_s']:>9.0f} "
              f"{pick['wall']:>7.1f} {pick['steps']:>6.0f} {pick['rounds']:>11.0f}", flush=True)


if __name__ == "__main__":
    main()
