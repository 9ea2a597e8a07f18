"""Train a digits classifier with MultiWorkerMirroredStrategy on any duotf backend.

TensorFlow reads its own data: the driver writes the 8x8 digits of scikit-learn (which ship
with the package: nothing is downloaded) to a file once, and every worker reads it and trains
on its slice of each global batch. The chief evaluates on the held-out split and saves the
weights.

    python examples/digits/train.py                       # embedded local backend
    python examples/digits/train.py --backend dask        # a Dask LocalCluster
    python examples/digits/train.py --backend spark       # Spark local[N+1]
    python examples/digits/train.py --input engine        # the engine pushes the rows instead
    spark-submit --master spark://host:7077 examples/digits/train.py --backend spark --data-dir DIR

On a cluster of several machines the nodes read digits.npz, and the chief saves its weights,
in --data-dir (DIR above): give a folder that the driver and every executor see (a shared
mount). Without one the example refuses to start there: the driver's temp folder is on the
driver alone.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time

import numpy as np

import duotf


def prepare_data(path: str, seed: int = 0) -> str:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    n_test = len(x) // 5
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)  # --data-dir NEW
    np.savez(path, x_train=x[n_test:], y_train=y[n_test:], x_test=x[:n_test], y_test=y[:n_test])
    return path


def main(args, ctx):
    """The node program: the same on every worker, as under any TF cluster launcher."""
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    data = np.load(args["data"])
    x, y = data["x_train"], data["y_train"]
    global_batch = args["batch_size"]
    per_worker = global_batch // ctx.num_workers
    tf.random.set_seed(args["seed"])
    with strategy.scope():
        sum_ = tf.VariableAggregation.SUM
        init = tf.keras.initializers.GlorotUniform(seed=args["seed"])
        w1 = tf.Variable(init([64, 64]), aggregation=sum_)
        b1 = tf.Variable(tf.zeros([64]), aggregation=sum_)
        w2 = tf.Variable(init([64, 10]), aggregation=sum_)
        b2 = tf.Variable(tf.zeros([10]), aggregation=sum_)
    params = [w1, b1, w2, b2]

    def logits(xb):
        return tf.matmul(tf.nn.relu(tf.matmul(xb, w1) + b1), w2) + b2

    @tf.function
    def train_step(xb, yb):
        def replica_fn(xb, yb):
            with tf.GradientTape() as tape:
                losses = tf.nn.sparse_softmax_cross_entropy_with_logits(yb, logits(xb))
                loss = tf.reduce_sum(losses) / global_batch
            for p, g in zip(params, tape.gradient(loss, params)):
                p.assign_sub(args["lr"] * g)  # SUM of every replica's share: the global step
            return loss

        per_replica = strategy.run(replica_fn, args=(xb, yb))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    if args.get("feed"):
        # The engine pushes the rows (cluster.train): every worker gets the same number per
        # epoch, in batches that never span two epochs, so the replicas stay in step.
        feed = ctx.get_data_feed(train=True, input_mapping=args["feed"])
        epoch_rows = feed.dataset(per_worker, per_epoch=True)  # one iteration: one epoch
        for epoch in range(args["epochs"]):
            for batch in epoch_rows:
                loss = train_step(batch["x"], batch["y"])
            if ctx.is_chief:
                print(f"epoch {epoch + 1}: loss {float(loss):.4f}", flush=True)
    else:
        steps_per_epoch = len(x) // global_batch
        for epoch in range(args["epochs"]):
            for step in range(steps_per_epoch):
                lo = step * global_batch + ctx.task_index * per_worker
                loss = train_step(x[lo : lo + per_worker], y[lo : lo + per_worker])
            if ctx.is_chief:
                print(f"epoch {epoch + 1}: loss {float(loss):.4f}", flush=True)

    predicted = np.argmax(logits(data["x_test"]).numpy(), axis=1)
    accuracy = float(np.mean(predicted == data["y_test"]))
    if ctx.is_chief:
        model_path = ctx.absolute_path(args["model_dir"])
        os.makedirs(model_path, exist_ok=True)
        np.savez(os.path.join(model_path, "weights.npz"), *[p.numpy() for p in params])
    return {"accuracy": accuracy, "worker": ctx.task_index}


def engine_data(backend, data_path: str, partitions: int = 4):
    """The training rows as a collection of the backend's engine, for the feed mode.

    Returns the collection and the input_mapping from its column names to "x" and "y".
    """
    data = np.load(data_path)
    x, y = data["x_train"], data["y_train"]
    if backend is None:  # local: a list of partitions, each a dict of columns
        bounds = np.linspace(0, len(x), partitions + 1).astype(int)
        parts = [{"x": x[a:b], "y": y[a:b]} for a, b in zip(bounds[:-1], bounds[1:])]
        return parts, {"x": "x", "y": "y"}
    if hasattr(backend, "sparkContext"):
        rows = [(row.tolist(), int(label)) for row, label in zip(x, y)]
        return backend.createDataFrame(rows, "x array<float>, y long").repartition(partitions), \
            {"x": "x", "y": "y"}
    import dask.array as da

    chunk = -(-len(x) // partitions)
    return (da.from_array(x, chunks=(chunk, 64)), da.from_array(y, chunks=chunk)), {"0": "x", "1": "y"}


def make_backend(name: str, workers: int, gpus_per_node: int = 0):
    if name == "spark":
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.appName("duotf-digits")
        # spark-submit starts this driver with its JVM already running and the gateway's port in
        # the environment; its --master (or spark-defaults.conf) then decides. A plain `python`
        # run gets local mode with a slot to feed from. (SparkConf() cannot tell: before a
        # SparkContext exists it holds none of spark-submit's settings.)
        if "PYSPARK_GATEWAY_PORT" not in os.environ and "--master" not in os.environ.get(
                "PYSPARK_SUBMIT_ARGS", ""):
            builder = builder.master(f"local[{workers + 1}]").config("spark.ui.enabled", "false")
        return builder.getOrCreate()
    if name == "dask":
        from distributed import Client, LocalCluster

        # Each worker declares GPUs (and sees every device of the machine: with several workers
        # on one machine, give each its own CUDA_VISIBLE_DEVICES, as dask-cuda does).
        resources = {"GPU": gpus_per_node} if gpus_per_node else None
        return Client(LocalCluster(n_workers=workers, threads_per_worker=2, dashboard_address=None,
                                   resources=resources))
    if gpus_per_node:
        return duotf.backends.LocalBackend(gpus=workers * gpus_per_node)  # devices 0..n-1
    return None  # the embedded local backend


def on_this_machine(backend) -> bool:
    """Whether the nodes run on this machine: the embedded backend, the example's Dask
    LocalCluster, Spark ``local[N]`` (not a cluster master that spark-submit named)."""
    return not hasattr(backend, "sparkContext") or backend.sparkContext.master.startswith("local")


def cli(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["local", "dask", "spark"], default="local",
                        help="local: the embedded backend; dask: a LocalCluster of --workers "
                        "workers; spark: local[workers+1], or spark-submit's --master (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=2, help="TF workers, nodes (default: %(default)s)")
    parser.add_argument("--epochs", type=int, default=30, help="passes over the training rows (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="global batch; each worker's step takes its share (default: %(default)s)")
    parser.add_argument("--lr", type=float, default=0.5, help="SGD learning rate (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=1, help="weight initialisation seed (default: %(default)s)")
    parser.add_argument("--data-dir", default=None,
                        help="where digits.npz is written, which every node reads: on a cluster of "
                        "several machines a folder they all see (default: a new temporary "
                        "directory, where the engine runs on this machine)")
    parser.add_argument("--model-dir", default=None,
                        help="where the chief saves weights.npz (default: <data-dir>/model)")
    parser.add_argument("--gpus-per-node", type=int, default=0,
                        help="GPUs of each node (Spark: start the session with GPU executors) (default: %(default)s)")
    parser.add_argument("--input", choices=["files", "engine"], default="files",
                        help="files: TF reads the data file; engine: cluster.train() pushes the rows "
                        "(default: %(default)s)")
    parser.add_argument("--quiet", action="store_true",
                        help="do not show the nodes' output, the chief's per-epoch loss (default: show it)")
    opts = parser.parse_args(argv)
    if not opts.quiet:  # the nodes' output, as "[worker:0] epoch 1: loss 0.1234", on stderr
        logging.basicConfig(format="%(message)s")
        logging.getLogger("duotf.node").setLevel(logging.INFO)

    backend = make_backend(opts.backend, opts.workers, opts.gpus_per_node)
    if opts.data_dir is None and not on_this_machine(backend):
        parser.error(f"--backend spark on {backend.sparkContext.master}: the nodes read digits.npz "
                     "on the executors, which do not see this driver's temp folder: give "
                     "--data-dir, a folder the driver and every executor see (a shared mount)")
    data_dir = opts.data_dir or tempfile.mkdtemp(prefix="duotf-digits-")
    args = {
        "data": prepare_data(os.path.join(data_dir, "digits.npz")),
        "batch_size": opts.batch_size,
        "epochs": opts.epochs,
        "lr": opts.lr,
        "seed": opts.seed,
        "model_dir": opts.model_dir or os.path.join(data_dir, "model"),
    }
    t0 = time.monotonic()
    spec = duotf.ClusterSpec(workers=opts.workers, gpus_per_node=opts.gpus_per_node)
    if opts.input == "engine":
        collection, args["feed"] = engine_data(backend, args["data"])
    with duotf.run(main, args, backend, spec, env={"TF_CPP_MIN_LOG_LEVEL": "2"}) as cluster:
        if opts.input == "engine":
            cluster.train(collection, epochs=opts.epochs)
        results = cluster.wait()
    accuracy = results[0]["accuracy"]
    print(f"backend={opts.backend} workers={opts.workers} test accuracy={accuracy:.4f} "
          f"({time.monotonic() - t0:.1f} s); model in {args['model_dir']}")
    return accuracy


if __name__ == "__main__":
    cli()
