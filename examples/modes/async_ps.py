"""Asynchronous between-graph training, fed by the engine: the TensorFlowOnSpark-era program.

``tf.compat.v1`` graphs, ``replica_device_setter`` (the variables on the ps, each worker's ops
on itself), ``MonitoredTrainingSession``, ps + workers. Spark or Dask pushes the rows
(``cluster.train``); each worker reads its own with ``ctx.get_data_feed()`` and
``feed.next_batch`` and applies its gradients to the ps without waiting for the others. Once a
worker's feed ends it counts itself done on the ps; the chief (worker 0) waits for every worker
to be done, then scores the final weights and saves a checkpoint.

    python examples/modes/async_ps.py                      # embedded local backend
    python examples/modes/async_ps.py --backend dask       # a Dask LocalCluster
    python examples/modes/async_ps.py --backend spark      # Spark local[N]
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
    """The node program of every worker (ps nodes only serve: duotf runs their server)."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    server = ctx.start_server()
    feed = ctx.get_data_feed(train=True, input_mapping=args["feed"])
    setter = tf1.train.replica_device_setter(
        worker_device=f"/job:worker/task:{ctx.task_index}",
        cluster=tf.train.ClusterSpec(ctx.cluster_spec))
    with tf1.device(setter):
        x = tf1.placeholder(tf.float32, [None, 64])
        y = tf1.placeholder(tf.int64, [None])
        names = ["w1", "b1", "w2", "b2"]
        params = [tf1.get_variable(n, initializer=v)
                  for n, v in zip(names, common.init_params(args["seed"]))]
        global_step = tf1.train.get_or_create_global_step()
        logits = common.logits(params, x)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        train_op = tf1.train.GradientDescentOptimizer(args["lr"]).minimize(loss, global_step=global_step)
        accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.float32))
        done = tf1.get_variable("workers_done", initializer=0, trainable=False,
                                collections=[tf1.GraphKeys.GLOBAL_VARIABLES])
        mark_done = tf1.assign_add(done, 1)
    uninitialized = tf1.report_uninitialized_variables()

    if not ctx.is_chief:
        # MonitoredTrainingSession looks for the chief's initialisation every 30 s: look more often.
        wait_until(lambda s: len(s.run(uninitialized)) == 0, server, args["wait_secs"],
                   "the chief to initialise the variables")
    model_dir = ctx.absolute_path(args["model_dir"]) if ctx.is_chief else None
    steps, t0 = 0, time.monotonic()
    with tf1.train.MonitoredTrainingSession(
            master=server.target, is_chief=ctx.is_chief, checkpoint_dir=model_dir,
            save_checkpoint_secs=None, save_checkpoint_steps=10 ** 9,  # one checkpoint, at the end
            save_summaries_steps=None, save_summaries_secs=None, log_step_count_steps=0) as sess:
        while not feed.should_stop():
            batch = feed.next_batch(args["batch_size"])
            if len(batch["y"]):
                sess.run(train_op, {x: batch["x"], y: batch["y"]})
                steps += 1
        seconds = time.monotonic() - t0
        sess.run(mark_done)
        result = {"worker": ctx.task_index, "steps": steps, "seconds": seconds}
        if ctx.is_chief:  # the final weights: once every worker's rows are trained
            deadline = time.monotonic() + args["wait_secs"]
            while sess.run(done) < ctx.num_workers:
                if time.monotonic() > deadline:
                    raise TimeoutError("the other workers did not finish their feed in time")
                time.sleep(0.05)
            test = np.load(args["data"])
            result["accuracy"] = float(sess.run(accuracy, {x: test["x_test"], y: test["y_test"]}))
            result["global_step"] = int(sess.run(global_step))
    return result


def wait_until(ready, server, timeout, what):
    """Poll ``ready(session)`` on a plain session against ``server`` until true or ``timeout``."""
    import tensorflow as tf

    deadline = time.monotonic() + timeout
    with tf.compat.v1.Session(server.target) as session:
        while not ready(session):
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout} s for {what}")
            time.sleep(0.1)


def cli(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["local", "dask", "spark"], default="local",
                        help="local: the embedded backend; dask: a LocalCluster of one worker per "
                        "node and one to feed; spark: local[nodes+1], or spark-submit's --master "
                        "(default: %(default)s)")
    parser.add_argument("--workers", type=int, default=2, help="TF workers (default: %(default)s)")
    parser.add_argument("--ps", type=int, default=1, help="parameter servers (default: %(default)s)")
    parser.add_argument("--epochs", type=int, default=10, help="feed epochs (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=32, help="each step's batch (default: %(default)s)")
    parser.add_argument("--lr", type=float, default=0.2, help="SGD learning rate (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=1, help="weight initialisation seed (default: %(default)s)")
    parser.add_argument("--data-dir", default=None,
                        help="where the data and the checkpoint go (default: a new temporary directory)")
    parser.add_argument("--quiet", action="store_true",
                        help="do not show the nodes' output (default: show it)")
    opts = parser.parse_args(argv)
    if not opts.quiet:
        logging.basicConfig(format="%(message)s")
        logging.getLogger("duotf.node").setLevel(logging.INFO)
    common.ship_by_value(common)
    data_dir = opts.data_dir or tempfile.mkdtemp(prefix="duotf-async-")
    data = common.prepare_data(data_dir)
    spec = duotf.ClusterSpec(workers=opts.workers, ps=opts.ps)
    backend = common.make_backend(opts.backend, spec.num_nodes + 1)  # + a slot to feed from
    rows, mapping = common.engine_rows(backend, data["data"])
    args = {"data": data["data"], "feed": mapping, "batch_size": opts.batch_size, "lr": opts.lr,
            "seed": opts.seed, "model_dir": os.path.join(data_dir, "model"), "wait_secs": 600}
    t0 = time.monotonic()
    with duotf.run(main, args, backend, spec, env={"TF_CPP_MIN_LOG_LEVEL": "2"}) as cluster:
        cluster.train(rows, epochs=opts.epochs, balance=False)  # asynchronous: no equal shares needed
        results = cluster.wait()
    chief = results[0]
    print(f"backend={opts.backend} {opts.workers} workers+{opts.ps} ps, asynchronous: test "
          f"accuracy={chief['accuracy']:.4f} ({chief['global_step']} steps, "
          f"{time.monotonic() - t0:.1f} s); checkpoint in {args['model_dir']}")
    return results


if __name__ == "__main__":
    cli()
