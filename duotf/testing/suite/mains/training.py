"""Node programs of the training, lifecycle and failure tests: regression data, the MWMS and
parameter-server mains, and mains that block, raise or describe their node.

Pickled by value (``duotf.testing.suite.mains``), so executors need not import it.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np


N_FEATURES = 4


def make_regression(path: str, rows: int = 256, seed: int = 7) -> str:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, N_FEATURES)).astype(np.float32)
    true_w = np.arange(1, N_FEATURES + 1, dtype=np.float32)
    y = (x @ true_w + 0.5 + 0.01 * rng.normal(size=rows)).astype(np.float32)
    np.savez(path, x=x, y=y)
    return path


def reference_weights(path: str, global_batch: int, steps: int, lr: float):
    """Plain numpy SGD on the whole global batch: what synchronous training must reproduce."""
    data = np.load(path)
    x, y = data["x"].astype(np.float64), data["y"].astype(np.float64)
    w = np.zeros(N_FEATURES)
    b = 0.0
    for step in range(steps):
        lo = (step * global_batch) % len(x)
        xb, yb = x[lo : lo + global_batch], y[lo : lo + global_batch]
        err = xb @ w + b - yb
        w -= lr * 2 * xb.T @ err / global_batch
        b -= lr * 2 * err.sum() / global_batch
    return w, b


def mwms_linear(args, ctx, w0, b0):
    """MultiWorkerMirroredStrategy over a linear model from ``(w0, b0)``: ``(w, b, step)``,
    ``step(k)`` training global step ``k`` on this worker's share of the file's rows."""
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    data = np.load(args["data"])
    x, y = data["x"], data["y"]
    global_batch, lr = args["batch"], args["lr"]
    per_worker = global_batch // ctx.num_workers
    with strategy.scope():
        # SUM: every replica's update (its share of the mean gradient) is added on every copy.
        w = tf.Variable(w0, aggregation=tf.VariableAggregation.SUM)
        b = tf.Variable(b0, aggregation=tf.VariableAggregation.SUM)

    @tf.function
    def replica_step(xb, yb):
        def replica_fn(xb, yb):
            with tf.GradientTape() as tape:
                err = tf.linalg.matvec(xb, w) + b - yb
                loss = tf.reduce_sum(tf.square(err)) / global_batch
            gw, gb = tape.gradient(loss, [w, b])
            w.assign_sub(lr * gw)
            b.assign_sub(lr * gb)

        strategy.run(replica_fn, args=(xb, yb))

    def step(k):
        lo = (k * global_batch) % len(x) + ctx.task_index * per_worker
        replica_step(tf.constant(x[lo : lo + per_worker]), tf.constant(y[lo : lo + per_worker]))

    return w, b, step


def mwms_main(args, ctx):
    """Synchronous data-parallel training: TF reads its own data (a file) on every worker."""
    w, b, step = mwms_linear(args, ctx, np.zeros(N_FEATURES, np.float32), np.float32(0.0))
    for k in range(args["steps"]):
        step(k)
    return {"w": w.numpy().tolist(), "b": float(b.numpy()), "rank": ctx.task_index}


def ps_chief_main(args, ctx):
    """ParameterServerStrategy: the chief coordinates, variables live on the ps."""
    if ctx.job_name != "chief":
        ctx.serve()
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        total = tf.Variable(0.0)

    @tf.function
    def add_one():
        total.assign_add(1.0)
        return total.read_value()

    for _ in range(args["steps"]):
        coordinator.schedule(add_one)
    coordinator.join()
    return {"total": float(total.numpy()), "device": total.device}


def describe_main(args, ctx):
    if args and args.get("marker"):
        with open(os.path.join(args["marker"], f"ran-{ctx.node_id}"), "w") as f:
            f.write("ran")
    return {
        "node_id": ctx.node_id,
        "job": ctx.job_name,
        "index": ctx.task_index,
        "tf_config": json.loads(os.environ["TF_CONFIG"]),
        "cluster_spec": ctx.cluster_spec,
        "num_workers": ctx.num_workers,
        "is_chief": ctx.is_chief,
        "cwd": os.getcwd(),
        "working_dir": ctx.working_dir,
        "relative": ctx.absolute_path("model"),
        "absolute": ctx.absolute_path("/data/x"),
        "url": ctx.absolute_path("s3://bucket/k"),
        "port": ctx.port,
        "executor_id": ctx.executor_id,
        "pid": os.getpid(),
        "gpus": ctx.gpus,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def wait_for_file(path: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.05)


def block_main(args, ctx):
    """Runs until the file args['release'] appears (or it is stopped)."""
    wait_for_file(args["release"], args.get("timeout", 120.0))
    return ctx.node_id


def chief_blocks_main(args, ctx):
    """The chief waits for the file args['release'] (as a chief waits in a collective that its
    peers never make); every other node returns at once."""
    if ctx.node_id == 0:
        wait_for_file(args["release"], args.get("timeout", 120.0))
    return ctx.node_id


def raise_on_main(args, ctx):
    if ctx.node_id == args["bad"]:
        raise ValueError(f"boom-{ctx.node_id}: bad input in node program")
    wait_for_file(args["release"])
    return ctx.node_id


def sleep_main(args, ctx):
    """Sleeps ``args`` seconds (a run to hold, or to kill the driver of)."""
    time.sleep(float(args))
    return ctx.node_id


def slow_save_main(args, ctx):
    """Work that is still going on when the driver calls shutdown: it must not be cut off."""
    wait_for_file(args["release"])
    time.sleep(args["work"])
    path = os.path.join(args["out"], f"saved-{ctx.node_id}")
    with open(path, "w") as f:
        f.write("model")
    return path


def ps_between_graph_main(args, ctx):
    """TF1-style between-graph replication: variables placed on the ps by replica_device_setter."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    server = ctx.start_server()
    cluster = tf.train.ClusterSpec(ctx.cluster_spec)
    setter = tf1.train.replica_device_setter(
        worker_device=f"/job:worker/task:{ctx.task_index}", cluster=cluster
    )
    with tf1.device(setter):
        total = tf1.get_variable("total", initializer=0.0)
        global_step = tf1.train.get_or_create_global_step()
        train = tf.group(tf1.assign_add(total, 1.0), tf1.assign_add(global_step, 1))
    with tf1.train.MonitoredTrainingSession(master=server.target, is_chief=ctx.is_chief) as sess:
        for _ in range(args["steps"]):
            sess.run(train)
        value = sess.run(total)
    return {"total": float(value), "device": total.device}


def read_shard_main(args, ctx):
    """TF reads its own TFRecords: each worker its share of the files."""
    from duotf.io.tfdata import tfrecord_dataset

    return sorted(r.numpy().decode() for r in tfrecord_dataset(args["glob"], ctx))


