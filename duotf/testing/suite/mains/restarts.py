"""Node programs of the restart tests: they hold until killed, and resume from checkpoints.

Pickled by value (``duotf.testing.suite.mains``), so executors need not import it.
"""

from __future__ import annotations

import json
import os

import numpy as np

from duotf.testing.suite.mains.training import N_FEATURES, mwms_linear, wait_for_file
from duotf.testing.suite.mains.models import keras_linear, step_counter


# -- restarts (test_restarts) ------------------------------------------------------------------
def _hold_until_killed(args, ctx, epoch: int) -> None:
    """On the first attempt, on the node the test kills: say so (a file the test waits for)
    after ``epoch`` epochs, then wait to be killed."""
    if ctx.attempt == 0 and ctx.node_id == args["victim"] and epoch == args["kill_after"]:
        path = os.path.join(args["signal_dir"], "ready-to-die")
        with open(path + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(path + ".tmp", path)
        wait_for_file(os.path.join(args["signal_dir"], "never"), timeout=300)


def sgd_resume_main(args, ctx):
    """sgd_main epoch by epoch, with a checkpoint per epoch: after a restart it resumes from the
    checkpoint the driver names, at ctx.resume_epoch. Returns the weights and, per attempt, the
    rows read in each epoch."""
    import numpy as np

    feed = ctx.get_data_feed(train=True)
    w, b = np.zeros(args["width"]), 0.0
    if ctx.latest_checkpoint():
        saved = np.load(ctx.latest_checkpoint())
        w, b = saved["w"], float(saved["b"])
    epoch, seen = ctx.resume_epoch, []
    while not feed.should_stop():
        rows_read = 0
        for rows in feed.batches(args["batch"]):
            a = np.asarray(rows, dtype=np.float64)
            x, y = a[:, :-1], a[:, -1]
            err = x @ w + b - y
            w = w - args["lr"] * (x.T @ err) / len(y)
            b = b - args["lr"] * float(err.mean())
            rows_read += len(rows)
        epoch += 1
        seen.append(rows_read)
        path = os.path.join(ctx.checkpoint_dir, f"node{ctx.node_id}-epoch{epoch}.npz")
        np.savez(path, w=w, b=b)
        ctx.report_checkpoint(epoch, path)
        _hold_until_killed(args, ctx, epoch)
    return {"w": w.tolist(), "b": b, "attempt": ctx.attempt, "resumed_at": ctx.resume_epoch,
            "epochs_read": seen}


def ids_resume_main(args, ctx):
    """Read the ids of the feed (``{"0": features, "1": id}``) epoch by epoch, with a
    checkpoint per epoch (the epochs done); after a restart, resume at ctx.resume_epoch. On the
    first attempt, in epoch ``hold_epoch`` (from 1) after ``hold`` rows: create ``held`` and read
    on only once ``release`` exists (the test kills a feeding process meanwhile). Returns, for
    this attempt, the ids read in each epoch."""
    feed = ctx.get_data_feed(train=True, input_mapping={"0": "x", "1": "id"})
    epoch, seen, rows = ctx.resume_epoch, {}, 0
    while not feed.should_stop():
        got = []
        for batch in feed.batches(args["batch"]):
            got.append(np.asarray(batch["id"]).copy())
            rows += len(batch["id"])
            if (ctx.attempt == 0 and epoch + 1 == args["hold_epoch"] and rows >= args["hold"]
                    and not os.path.exists(args["release"])):
                open(args["held"], "w").close()
                wait_for_file(args["release"], timeout=300)
        epoch += 1
        seen[epoch] = np.concatenate(got).tolist() if got else []
        path = os.path.join(ctx.checkpoint_dir, f"node{ctx.node_id}-epoch{epoch}.npz")
        np.savez(path, epoch=epoch)
        ctx.report_checkpoint(epoch, path)
    return {"attempt": ctx.attempt, "resumed_at": ctx.resume_epoch, "ids": seen}


def mwms_resume_main(args, ctx):
    """mwms_main (TF reads its own file, MultiWorkerMirroredStrategy) in epochs of
    ``steps_per_epoch`` steps; the chief saves the weights after each epoch and reports it;
    after a restart every worker starts from that checkpoint at ctx.resume_epoch."""
    per_epoch = args["steps_per_epoch"]
    w0, b0 = np.zeros(N_FEATURES, np.float32), np.float32(0.0)
    if ctx.latest_checkpoint():
        saved = np.load(ctx.latest_checkpoint())
        w0, b0 = saved["w"], saved["b"]
    w, b, step = mwms_linear(args, ctx, w0, b0)
    for epoch in range(ctx.resume_epoch, args["epochs"]):
        for k in range(epoch * per_epoch, (epoch + 1) * per_epoch):
            step(k)
        if ctx.is_chief:
            path = os.path.join(ctx.checkpoint_dir, f"epoch{epoch + 1}.npz")
            np.savez(path, w=w.numpy(), b=b.numpy())
            ctx.report_checkpoint(epoch + 1, path)
        _hold_until_killed(args, ctx, epoch + 1)
    return {"w": w.numpy().tolist(), "b": float(b.numpy()), "rank": ctx.task_index,
            "attempt": ctx.attempt}


def always_exit_main(args, ctx):
    """A node that dies on every attempt (exit code 3 before main returns); on the first once
    duotf.run has returned (the test writes "go"), on the later ones at once."""
    if ctx.node_id == args["victim"]:
        if ctx.attempt == 0:
            wait_for_file(os.path.join(args["signal_dir"], "go"))
        os._exit(3)
    wait_for_file(os.path.join(args["signal_dir"], "never"), timeout=300)


def raise_main(args, ctx):
    """Raise on the victim node until attempt ``raise_until``; on the first attempt once
    duotf.run has returned (the test writes "go")."""
    if ctx.node_id == args["victim"] and ctx.attempt < args.get("raise_until", 99):
        if ctx.attempt == 0:
            wait_for_file(os.path.join(args["signal_dir"], "go"))
        raise ValueError(f"bad value on attempt {ctx.attempt}")
    return ctx.attempt


def save_then_fail_main(args, ctx):
    """The restart example of docs/guides/restarts.md: the first attempt saves a file into ctx.checkpoint_dir
    (a folder duotf made, never the user), reports it, and fails; the next finds it."""
    if ctx.attempt == 0:
        path = os.path.join(ctx.checkpoint_dir, f"node{ctx.node_id}.npz")
        np.savez(path, w=np.arange(3.0))
        ctx.report_checkpoint(1, path)
        raise ValueError("fails after its checkpoint")
    saved = np.load(ctx.latest_checkpoint())
    return {"attempt": ctx.attempt, "w": saved["w"].tolist(), "dir": ctx.checkpoint_dir}


def keras_resume_main(args, ctx):
    """Keras 3 fit under MultiWorkerMirroredStrategy on the engine feed, resumable:
    CheckpointCallback saves and reports every epoch, restore + initial_epoch resume."""
    import keras
    import tensorflow as tf

    import duotf.keras

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    feed = ctx.get_data_feed(train=True, input_mapping=args["mapping"])
    with strategy.scope():
        model = keras_linear(args["width"], args["lr"])
    restored = duotf.keras.CheckpointCallback.restore(model, ctx)

    class Hold(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            _hold_until_killed(args, ctx, epoch + 1)

    counter = step_counter()
    model.fit(feed.dataset(args["batch"], features="x", label="y"), epochs=args["epochs"],
              initial_epoch=ctx.resume_epoch, verbose=0,
              callbacks=[duotf.keras.CheckpointCallback(ctx), Hold(), counter])
    kernel, bias = model.get_weights()
    return {"w": kernel[:, 0].tolist(), "b": float(bias[0]), "attempt": ctx.attempt,
            "restored": restored, "steps": counter.steps}


def hold_after_epoch(folder: str, epoch: int):
    """TFEstimator's callbacks in the resume test (``functools.partial(hold_after_epoch, folder,
    2)``): at the end of ``epoch`` epochs every worker writes ``folder/held-<index>`` and holds
    until ``folder/release`` appears (or its node is stopped: its driver is gone), so that no
    later checkpoint is written before the test resumes the run."""
    import keras

    class Hold(keras.callbacks.Callback):
        def on_epoch_end(self, done, logs=None):
            if done + 1 == epoch:  # Keras counts from 0
                index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
                open(os.path.join(folder, f"held-{index}"), "w").close()
                wait_for_file(os.path.join(folder, "release"), 120.0)

    return [Hold()]
