"""What a restart costs: a node killed mid-training, ``duotf.run(..., max_restarts=1)``.

    python -m benchmarks.restart                          # local, dask, spark local[3]
    python -m benchmarks.restart --spark-master spark://127.0.0.1:7077 --backends spark

Each run trains a small model under MultiWorkerMirroredStrategy on 2 workers (TF reading its
own arrays), 4 epochs, the chief saving a checkpoint after each and reporting it. The killed
run has worker 1 SIGKILL its own process after epoch 2 on the first attempt; the cluster
restarts and resumes at epoch 2.

restart -> running : from the failure reaching the driver to every main of the new attempt
                     running (``cluster.restarts[0].seconds``)
restart -> ready   : from the failure to every new main having imported TensorFlow (what a
                     TF program's start costs; goal: one TF import + 2 s, as at start-up)
total              : the whole run, duotf.run() to shutdown, with and without the kill
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import duotf
from benchmarks.startup import add_backend_options, backends, tf_import_seconds


def train_main(args, ctx):
    import signal

    import numpy as np
    import tensorflow as tf

    ready = time.time()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4096, 32)).astype(np.float32)
    y = (x @ rng.normal(size=32).astype(np.float32)).astype(np.float32)
    start = np.zeros(32, np.float32)
    if ctx.latest_checkpoint():
        start = np.load(ctx.latest_checkpoint())["w"]
    with strategy.scope():
        w = tf.Variable(start, aggregation=tf.VariableAggregation.SUM)

    @tf.function
    def step(xb, yb):
        def replica(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(tf.linalg.matvec(xb, w) - yb)) / 256
            w.assign_sub(0.01 * tape.gradient(loss, w))

        strategy.run(replica, args=(xb, yb))

    per = 128
    rank = ctx.task_index
    for epoch in range(ctx.resume_epoch, args["epochs"]):
        for k in range(args["steps"]):
            lo = (k * 256) % len(x) + rank * per
            step(tf.constant(x[lo:lo + per]), tf.constant(y[lo:lo + per]))
        if ctx.is_chief:
            path = os.path.join(ctx.checkpoint_dir, f"epoch{epoch + 1}.npz")
            np.savez(path, w=w.numpy())
            ctx.report_checkpoint(epoch + 1, path)
        if args["kill"] and ctx.attempt == 0 and ctx.task_index == 1 and epoch + 1 == 2:
            os.kill(os.getpid(), signal.SIGKILL)
    return {"ready": ready, "attempt": ctx.attempt}


def measure(backend, kill: bool, epochs: int, steps: int):
    env = {"TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    t0 = time.time()
    with duotf.run(train_main, {"kill": kill, "epochs": epochs, "steps": steps}, backend,
                   duotf.ClusterSpec(workers=2), env=env, max_restarts=1) as cluster:
        out = cluster.wait()
    total = time.time() - t0
    if not kill:
        return total, None, None
    [restart] = cluster.restarts
    ready = max(r["ready"] for r in out) - restart.failed_at
    return total, restart.seconds, ready


def cli():
    parser = argparse.ArgumentParser(description="duotf restart cost")
    add_backend_options(parser, repeat=2)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=200, help="steps per epoch")
    opts = parser.parse_args()
    if "spark" in opts.backends and not opts.spark_master:
        opts.spark_master = "local[3]"
    tf_import = statistics.median(tf_import_seconds() for _ in range(opts.repeat))
    print(f"bare 'import tensorflow' (fresh process): {tf_import:.2f} s; goal for restart -> "
          f"ready: {tf_import + 2:.2f} s")
    print(f"{'backend':<26}{'restart->running':>17}{'restart->ready':>16}{'total, killed':>15}"
          f"{'total, not':>12}{'extra':>8}")
    for name, backend, close in backends(opts):
        try:
            measure(backend, False, 1, 10)  # warm-up: engine workers, page cache
            plain = [measure(backend, False, opts.epochs, opts.steps) for _ in range(opts.repeat)]
            killed = [measure(backend, True, opts.epochs, opts.steps) for _ in range(opts.repeat)]
        finally:
            close()
        p = statistics.median(r[0] for r in plain)
        k, running, ready = (statistics.median(r[i] for r in killed) for i in range(3))
        print(f"{name:<26}{running:>16.2f}s{ready:>15.2f}s{k:>14.2f}s{p:>11.2f}s{k - p:>7.2f}s")


if __name__ == "__main__":
    cli()
