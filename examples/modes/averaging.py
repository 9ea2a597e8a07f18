"""Periodic weight averaging (TensorOnSpark's ``sync_interval``) on any duotf backend.

Each worker trains its own copy of the digits model on its own rows, with no collective in its
steps, and every ``--every`` steps the workers average their weights
(``duotf.averaging.WeightAverager``: one TF all-reduce). The same program as a custom loop or
as Keras ``model.fit`` with ``duotf.averaging.AveragingCallback``; the rows from the engine
(``cluster.train``, each worker's ``DataFeed``) or TF reading its share of the file.

    python examples/modes/averaging.py --every 10                    # embedded local backend
    python examples/modes/averaging.py --backend dask --keras        # a Dask LocalCluster
    python examples/modes/averaging.py --backend spark --input files # Spark local[N+1]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a script: make the examples package importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np

import duotf
from examples.modes import common


def main(args, ctx):
    """Every worker: train on its own rows, average every ``args["every"]`` steps."""
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # first: it sets up TF's collectives
    from duotf.averaging import WeightAverager

    batch, lr = args["batch_size"], args["lr"]
    if args.get("feed"):
        feed = ctx.get_data_feed(train=True, input_mapping=args["feed"])
        epochs = [feed.dataset(batch, features="x", label="y")] * args["epochs"]  # one iteration: one epoch
    else:  # this worker's share of the file; "steps" (a count per worker) may make them uneven
        data = np.load(args["data"])
        x = data["x_train"][ctx.task_index::ctx.num_workers]
        y = data["y_train"][ctx.task_index::ctx.num_workers]
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)
        steps = args.get("steps")
        epochs = ([ds.repeat().take(steps[ctx.task_index])] if steps
                  else [ds] * args["epochs"])
    t0 = time.monotonic()
    if args.get("keras"):
        import keras

        from duotf.averaging import AveragingCallback

        keras.utils.set_random_seed(args["seed"])  # the same initial weights; start() averages anyway
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(keras.optimizers.SGD(lr),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        callback = AveragingCallback(every=args["every"], strategy=strategy)
        dataset = epochs[0] if args.get("feed") else epochs[0].repeat(len(epochs))
        model.fit(dataset, epochs=len(epochs) if args.get("feed") else 1, verbose=0,
                  callbacks=[callback])
        averager, params = callback.averager, model.weights
    else:
        params = [tf.Variable(p) for p in common.init_params(args["seed"])]
        averager = WeightAverager(params, every=args["every"], strategy=strategy)

        @tf.function
        def train_step(x, y):  # this worker alone: no collective
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(
                    tf.nn.sparse_softmax_cross_entropy_with_logits(y, common.logits(params, x)))
            for p, g in zip(params, tape.gradient(loss, params)):
                p.assign_sub(lr * g)
            return loss

        averager.start()
        for epoch in epochs:
            for x, y in epoch:
                train_step(x, y)
                averager.step()
        averager.finish()  # the last average, once every worker ran out of rows
    seconds = time.monotonic() - t0
    weights = [np.asarray(p) for p in params]
    return {"worker": ctx.task_index, "accuracy": common.accuracy(weights, args["data"]),
            "steps": averager.steps, "rounds": averager.rounds, "seconds": seconds,
            "checksum": float(sum(np.sum(w.astype(np.float64)) for w in weights))}


def run(backend, args, workers: int = 2, epochs: int = 10, rows=None, env=None):
    """Train once; returns every worker's result."""
    spec = duotf.ClusterSpec(workers=workers)
    with duotf.run(main, args, backend, spec, env=env or {"TF_CPP_MIN_LOG_LEVEL": "2"}) as cluster:
        if rows is not None:
            cluster.train(rows, epochs=epochs)  # balanced: every worker takes the same steps
        return cluster.wait()


def cli(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["local", "dask", "spark"], default="local",
                        help="local: the embedded backend; dask: a LocalCluster of one worker per "
                        "node and one to feed; spark: local[workers+1], or spark-submit's "
                        "--master (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=2, help="TF workers (default: %(default)s)")
    parser.add_argument("--every", type=int, default=10,
                        help="average the weights every this many steps (default: %(default)s)")
    parser.add_argument("--epochs", type=int, default=15, help="passes over the rows (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="each worker's batch (default: %(default)s)")
    parser.add_argument("--lr", type=float, default=0.3, help="SGD learning rate (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=1, help="weight initialisation seed (default: %(default)s)")
    parser.add_argument("--keras", action="store_true",
                        help="train with model.fit and AveragingCallback (default: a custom loop)")
    parser.add_argument("--input", choices=["engine", "files"], default="engine",
                        help="engine: cluster.train pushes the rows; files: each worker reads its "
                        "share of the file (default: %(default)s)")
    parser.add_argument("--data-dir", default=None,
                        help="where the data goes (default: a new temporary directory)")
    parser.add_argument("--quiet", action="store_true",
                        help="do not show the nodes' output (default: show it)")
    opts = parser.parse_args(argv)
    if not opts.quiet:
        logging.basicConfig(format="%(message)s")
        logging.getLogger("duotf.node").setLevel(logging.INFO)
    common.ship_by_value(common)
    data_dir = opts.data_dir or tempfile.mkdtemp(prefix="duotf-averaging-")
    data = common.prepare_data(data_dir)
    backend = common.make_backend(opts.backend, opts.workers + 1)
    args = {"data": data["data"], "batch_size": opts.batch_size, "lr": opts.lr, "seed": opts.seed,
            "every": opts.every, "epochs": opts.epochs, "keras": opts.keras}
    rows = None
    if opts.input == "engine":
        rows, args["feed"] = common.engine_rows(backend, data["data"])
    t0 = time.monotonic()
    results = run(backend, args, opts.workers, opts.epochs, rows)
    first = results[0]
    print(f"backend={opts.backend} {opts.workers} workers, averaging every {opts.every} steps"
          f"{' (Keras)' if opts.keras else ''}: test accuracy={first['accuracy']:.4f} "
          f"({first['steps']} steps, {first['rounds']} averages, {time.monotonic() - t0:.1f} s)")
    return results


if __name__ == "__main__":
    cli()
