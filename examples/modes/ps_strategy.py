"""TF2 ``ParameterServerStrategy`` on any duotf backend: a chief coordinating with
``ClusterCoordinator``, workers and parameter servers served by duotf, and an evaluator doing
side-car evaluation of the checkpoints the chief writes.

- ps nodes: duotf runs their ``tf.distribute.Server`` (``main`` is not called on them);
- workers: ``main`` calls ``ctx.serve()``: the chief's coordinator runs the steps on them;
- chief: builds the variables on the ps, schedules asynchronous steps, each drawing a batch from
  its worker's own dataset (TensorFlow reads the TFRecord files there), saves a checkpoint every
  epoch and writes ``done`` at the end;
- evaluator: restores each new checkpoint, scores the held-out split, reports it
  (``cluster.metrics``), and ends once the chief is done.

Keras 3 has no ``model.fit`` under ParameterServerStrategy (keras-team/keras#18624): the chief
runs a custom loop. The engine feed cannot reach the workers here: see docs/guides/training-modes.md
("TF2 ParameterServerStrategy"). With ``--input engine`` the engine writes its DataFrame as TFRecord files of
``tf.train.Example`` first (``duotf.io.dataframe``, in its own tasks) and the workers read
those: the supported way to train a ParameterServerStrategy on a Spark or Dask DataFrame.
examples/modes/async_ps.py is the ps training that the engine feeds.

    python examples/modes/ps_strategy.py                      # embedded local backend
    python examples/modes/ps_strategy.py --backend dask       # a Dask LocalCluster
    python examples/modes/ps_strategy.py --backend spark      # Spark local[N]
    python examples/modes/ps_strategy.py --backend spark --input engine   # Spark writes the files
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

import duotf
from examples.modes import common


def main(args, ctx):
    """The node program of every chief, worker and evaluator (ps nodes only serve)."""
    if ctx.job_name == "worker":
        ctx.serve()  # never returns: the chief runs its steps here
    if ctx.job_name == "evaluator":
        return evaluate(args, ctx)
    return coordinate(args, ctx)


def coordinate(args, ctx):
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():  # the variables live on the ps
        params = [tf.Variable(p) for p in common.init_params(args["seed"])]
        step = tf.Variable(0, dtype=tf.int64)
    batch, lr = args["batch_size"], args["lr"]
    files = args["train_files"]
    files = sorted(tf.io.gfile.glob(files)) if isinstance(files, str) else list(files)
    parse = common.parse_example if args.get("examples") else common.parse_record

    def dataset_fn(_input_context):  # traced here; its graph runs on each worker, reading the files there
        ds = tf.data.Dataset.from_tensor_slices(files).interleave(
            tf.data.TFRecordDataset, cycle_length=len(files))
        # Every worker reads every file in its own shuffled order (the coordinator's function
        # is the same for all workers, so it cannot give each its own files).
        return ds.map(parse).shuffle(2048).repeat().batch(batch).prefetch(2)

    @tf.function
    def per_worker_dataset_fn():
        return strategy.distribute_datasets_from_function(dataset_fn)

    iterators = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))

    @tf.function
    def train_step(iterator):
        def step_fn(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(
                    tf.nn.sparse_softmax_cross_entropy_with_logits(y, common.logits(params, x)))
            for p, g in zip(params, tape.gradient(loss, params)):
                p.assign_sub(lr * g)  # asynchronous: straight to the ps, no waiting for others
            step.assign_add(1)
            return loss

        x, y = next(iterator)
        return strategy.run(step_fn, args=(x, y))

    model_dir = ctx.absolute_path(args["model_dir"])
    checkpoint = tf.train.Checkpoint(w1=params[0], b1=params[1], w2=params[2], b2=params[3],
                                     step=step)
    manager = tf.train.CheckpointManager(checkpoint, os.path.join(model_dir, "ckpt"),
                                         max_to_keep=None)
    steps_per_epoch = args["rows"] // batch
    t0 = time.monotonic()
    for epoch in range(args["epochs"]):
        for _ in range(steps_per_epoch):
            loss = coordinator.schedule(train_step, args=(iterators,))
        coordinator.join()  # every scheduled step done: a consistent checkpoint
        manager.save(checkpoint_number=epoch + 1)
        print(f"epoch {epoch + 1}: loss {float(loss.fetch()):.4f}", flush=True)
    seconds = time.monotonic() - t0
    with open(os.path.join(model_dir, "done"), "w") as f:  # the evaluator's cue to stop
        f.write(str(int(step.numpy())))
    return {"accuracy": common.accuracy(params, args["data"]), "steps": int(step.numpy()),
            "seconds": seconds}


def evaluate(args, ctx):
    """Side-car evaluation: every checkpoint the chief writes, until it writes ``done``."""
    import tensorflow as tf

    params = [tf.Variable(p) for p in common.init_params(args["seed"])]
    step = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(w1=params[0], b1=params[1], w2=params[2], b2=params[3],
                                     step=step)
    model_dir = ctx.absolute_path(args["model_dir"])
    folder = os.path.join(model_dir, "ckpt")
    done = os.path.join(model_dir, "done")
    deadline = time.monotonic() + args.get("evaluator_timeout", 3600)

    def finished():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the chief wrote no {done} within the evaluator's timeout")
        return os.path.exists(done)

    evaluated = []

    def score(path):
        checkpoint.restore(path).expect_partial()
        accuracy = common.accuracy(params, args["data"])
        evaluated.append({"checkpoint": os.path.basename(path), "step": int(step.numpy()),
                          "accuracy": accuracy})
        ctx.report(step=int(step.numpy()), eval_accuracy=accuracy)

    for path in tf.train.checkpoints_iterator(folder, min_interval_secs=0, timeout=0.5,
                                              timeout_fn=finished):
        score(path)
    last = tf.train.latest_checkpoint(folder)  # one saved just before `done`, between two looks
    if last and (not evaluated or evaluated[-1]["checkpoint"] != os.path.basename(last)):
        score(last)
    return {"evaluated": evaluated}


def cli(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["local", "dask", "spark"], default="local",
                        help="local: the embedded backend; dask: a LocalCluster of one worker per "
                        "node; spark: local[nodes], or spark-submit's --master (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=2, help="TF workers (default: %(default)s)")
    parser.add_argument("--ps", type=int, default=1, help="parameter servers (default: %(default)s)")
    parser.add_argument("--epochs", type=int, default=15,
                        help="passes over the training rows, all workers together (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=32, help="each step's batch (default: %(default)s)")
    parser.add_argument("--lr", type=float, default=0.2, help="SGD learning rate (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=1, help="weight initialisation seed (default: %(default)s)")
    parser.add_argument("--data-dir", default=None,
                        help="where the data and the checkpoints go (default: a new temporary directory)")
    parser.add_argument("--input", choices=["files", "engine"], default="files",
                        help="files: TF reads the TFRecords written from numpy; engine: Spark or "
                        "Dask writes its DataFrame as TFRecords of tf.train.Example, TF reads "
                        "those (default: %(default)s)")
    parser.add_argument("--quiet", action="store_true",
                        help="do not show the nodes' output (default: show it)")
    opts = parser.parse_args(argv)
    if not opts.quiet:
        logging.basicConfig(format="%(message)s")
        logging.getLogger("duotf.node").setLevel(logging.INFO)
    common.ship_by_value(common)
    data_dir = opts.data_dir or tempfile.mkdtemp(prefix="duotf-ps-")
    args = dict(common.prepare_data(data_dir), batch_size=opts.batch_size, epochs=opts.epochs,
                lr=opts.lr, seed=opts.seed, model_dir=os.path.join(data_dir, "model"))
    spec = duotf.ClusterSpec(chief=True, workers=opts.workers, ps=opts.ps, evaluator=True)
    backend = common.make_backend(opts.backend, spec.num_nodes)
    if opts.input == "engine":
        args["train_files"] = common.engine_files(backend, args["data"],
                                                  os.path.join(data_dir, "engine-train"))
        args["examples"] = True
    t0 = time.monotonic()
    with duotf.run(main, args, backend, spec, env={"TF_CPP_MIN_LOG_LEVEL": "2"}) as cluster:
        results = cluster.wait()
    chief, evaluator = results[0], results[-1]
    print(f"backend={opts.backend} chief+{opts.workers} workers+{opts.ps} ps+evaluator: "
          f"test accuracy={chief['accuracy']:.4f} ({chief['steps']} steps, "
          f"{time.monotonic() - t0:.1f} s); evaluator scored {len(evaluator['evaluated'])} "
          f"checkpoints, last {evaluator['evaluated'][-1]['accuracy']:.4f}")
    return results


if __name__ == "__main__":
    cli()
