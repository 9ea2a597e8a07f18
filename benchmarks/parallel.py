"""Wall time of K independent runs: one after another (duotf.run + wait) vs duotf.run_parallel.

    python -m benchmarks.parallel                        # local, dask, spark local[2]; K=4
    python -m benchmarks.parallel --runs 6 --work sleep  # mains that wait instead of compute
    python -m benchmarks.parallel --spark-master spark://127.0.0.1:7077

Each run is a 1-node cluster whose main does ``--work``: ``tf`` imports TensorFlow and takes 200
SGD steps on a tiny linear problem (a trial of a search: CPU-bound, TF import included), or
``sleep`` waits 2 s (a trial waiting on I/O or on an accelerator). run_parallel runs up to the
backend's slots at once (Dask LocalCluster and Spark local[2]: 2); the sequential baseline is
measured on the same engine in the same process, after one warm-up run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import duotf

from benchmarks.startup import add_backend_options, backends


def trial(args, ctx):
    if args["work"] == "sleep":
        time.sleep(2.0)
        return args["lr"]
    import tensorflow as tf

    x = tf.random.stateless_normal([256, 4], seed=[1, 2])
    y = tf.linalg.matvec(x, [1.0, 2.0, 3.0, 4.0])
    w = tf.Variable(tf.zeros([4]))
    for _ in range(200):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.linalg.matvec(x, w) - y))
        w.assign_sub(args["lr"] * tape.gradient(loss, w))
    return float(loss)


def sequential(backend, grid, env) -> float:
    t0 = time.perf_counter()
    for args in grid:
        with duotf.run(trial, args, backend, env=env) as cluster:
            cluster.wait()
    return time.perf_counter() - t0


def parallel(backend, grid, env, max_concurrent) -> float:
    t0 = time.perf_counter()
    runs = duotf.run_parallel(trial, grid, backend, env=env, max_concurrent=max_concurrent)
    assert all(run.ok for run in runs), [run.error for run in runs]
    return time.perf_counter() - t0


def cli():
    parser = argparse.ArgumentParser(description="duotf run_parallel benchmark")
    add_backend_options(parser, repeat=1)
    parser.add_argument("--runs", type=int, default=4, help="K: runs of the search")
    parser.add_argument("--work", choices=("tf", "sleep"), default="tf")
    parser.add_argument("--max-concurrent", type=int, default=None,
                        help="default: the backend's slots (1 node a run)")
    opts = parser.parse_args()

    env = {"TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    grid = [{"lr": 0.3 / (i + 1), "work": opts.work} for i in range(opts.runs)]
    print(f"K={opts.runs} runs of 1 node, work={opts.work}")
    print(f"{'backend':<22}{'sequential':>12}{'run_parallel':>14}{'speed-up':>10}{'at once':>9}")
    for name, backend, close in backends(opts):
        try:
            with duotf.run(trial, dict(grid[0], work="sleep"), backend, env=env) as c:
                c.wait()  # warm-up: engine workers, page cache
            seq = statistics.median(sequential(backend, grid, env) for _ in range(opts.repeat))
            par = statistics.median(parallel(backend, grid, env, opts.max_concurrent)
                                    for _ in range(opts.repeat))
            resolved = duotf.backends.resolve_backend(backend)[0]
            width = opts.max_concurrent or max(resolved.slots(), 1)
        finally:
            close()
        print(f"{name:<22}{seq:>11.2f}s{par:>13.2f}s{seq / par:>9.2f}x{min(width, opts.runs):>9}")


if __name__ == "__main__":
    cli()
