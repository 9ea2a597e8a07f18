"""Node programs and functions of the Keras, scoring, estimator, logs, TensorBoard and metrics
tests, and the row sources of the feed-failure tests.

Pickled by value (``duotf.testing.suite.mains``), so executors need not import it.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np

from duotf.testing.suite.mains.training import wait_for_file


def keras_linear(width: int, lr: float):
    import keras

    model = keras.Sequential([keras.Input((width,)),
                              keras.layers.Dense(1, kernel_initializer="zeros")])
    model.compile(keras.optimizers.SGD(lr), "mse")
    return model


def step_counter():
    """A Keras callback counting fit's steps, epoch by epoch."""
    import keras

    class Counter(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.steps = []

        def on_epoch_begin(self, epoch, logs=None):
            self.steps.append(0)

        def on_train_batch_end(self, batch, logs=None):
            self.steps[-1] += 1

    return Counter()


def _fitted(model, history, counter) -> dict:
    kernel, bias = model.get_weights()
    return {"w": kernel[:, 0].tolist(), "b": float(bias[0]), "loss": history.history["loss"],
            "steps": counter.steps}


def keras_fit_main(args, ctx):
    """Keras 3 under MultiWorkerMirroredStrategy, no steps_per_epoch: fit on the engine feed,
    then fit, evaluate and predict on CSV files TF reads itself (each worker its files);
    the chief saves the model and loads it back."""
    import sys

    # duotf's fix waits for Keras to be imported: nothing of Keras is loaded before
    out = {"rank": ctx.task_index, "keras_before": "keras" in sys.modules,
           "hooks": [type(f).__name__ for f in sys.meta_path].count("_ApplyOnImport")}
    import tensorflow as tf
    import keras
    from keras.src.backend.tensorflow import trainer

    out["fixed"] = getattr(trainer.reduce_per_replica, "__duotf_multi_worker_fix__", False)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    width, batch, lr = args["width"], args["batch"], args["lr"]

    feed = ctx.get_data_feed(train=True, input_mapping=args["mapping"])
    with strategy.scope():
        model = keras_linear(width, lr)
    counter = step_counter()
    import duotf.keras

    history = model.fit(feed.dataset(batch, features="x", label="y"), epochs=args["epochs"],
                        verbose=0, callbacks=[counter, duotf.keras.ReportCallback(ctx)])
    out["feed"] = dict(_fitted(model, history, counter), feed_epochs=feed.epoch)

    def parse(line):
        values = tf.io.decode_csv(line, [0.0] * (width + 1))
        return tf.stack(values[:width]), values[width]

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.FILE
    files = tf.data.TextLineDataset(args["files"]).map(parse).batch(batch).with_options(options)
    with strategy.scope():
        model = keras_linear(width, lr)
    counter = step_counter()
    history = model.fit(files, epochs=args["file_epochs"], verbose=0, callbacks=[counter])
    out["files"] = _fitted(model, history, counter)
    out["evaluate"] = float(model.evaluate(files, verbose=0))
    out["predict"] = model.predict(files, verbose=0)[:, 0].tolist()
    if ctx.is_chief:
        model.save(args["model"])
        loaded = keras.saving.load_model(args["model"])
        out["saved_equal"] = all(np.array_equal(a, b) for a, b in
                                 zip(loaded.get_weights(), model.get_weights()))
    return out


def keras_unsupported_main(args, ctx):
    """A Keras without what duotf's fix replaces (removed here; DUOTF_KERAS_FIX=0 kept duotf
    from fixing it first): enable_multi_worker_fit and fit under the strategy must say what to
    install, before any step."""
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer

    import duotf.keras

    out = {"fixed": getattr(trainer.reduce_per_replica, "__duotf_multi_worker_fix__", False)}
    del trainer.reduce_per_replica
    try:
        duotf.keras.enable_multi_worker_fit()
    except duotf.ConfigError as exc:
        out["enable"] = str(exc)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = keras_linear(2, 0.1)
    x, y = np.ones((8, 2), np.float32), np.ones(8, np.float32)
    try:
        model.fit(x, y, epochs=1, verbose=0)
    except Exception as exc:  # noqa: BLE001 - the test checks which
        out["fit"] = (type(exc).__name__, str(exc))
    out["iterations"] = int(model.optimizer.iterations.numpy())
    return out



def trial_main(args, ctx):
    """A run of ``duotf.run_parallel``: no TensorFlow, only what a search needs to tell runs apart.

    ``mode``: "raise" raises, "kill" kills its own process; "hold" waits for ``release``.
    With ``gate`` (a directory), the node writes ``in-<trial>-<node>`` (its working directory in
    it) and waits until ``together`` such files exist: a run that never meets ``together - 1``
    others alive times out instead of returning.
    """
    import signal

    entered = time.time()
    mode = args.get("mode", "ok")
    if mode == "raise":
        raise ValueError(f"trial {args['trial']}: bad hyperparameters")
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    gate = args.get("gate")
    if gate:
        with open(os.path.join(gate, f"in-{args['trial']}-{ctx.node_id}"), "w") as f:
            f.write(ctx.working_dir)
        deadline = time.monotonic() + args.get("gate_timeout", 60.0)
        while sum(name.startswith("in-") for name in os.listdir(gate)) < args.get("together", 1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"trial {args['trial']} met no other run in {gate}")
            time.sleep(0.02)
    if mode == "hold":
        wait_for_file(args["release"])
    return {"trial": args["trial"], "node": ctx.node_id, "workers": ctx.num_workers,
            "score": args["trial"] * 10, "executor": ctx.executor_id, "entered": entered,
            "left": time.time()}


def load_keras(path: str):
    """A model loader for ``duotf.spark.predict_udf`` / ``duotf.dask.predict`` (bound to a path
    with functools.partial)."""
    import keras

    return keras.saving.load_model(path, compile=False)


def scoring_stats(batches):
    """A ``mapInArrow`` task: this Python worker's pid and model cache figures, as JSON."""
    import pyarrow as pa

    from duotf._ml.scoring import cache_stats

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"pid": [os.getpid()], "stats": [json.dumps(cache_stats())]})


def linear_model_fn():
    """TFEstimator's modelFn in the estimator tests: a compiled Keras linear model of 3 inputs
    (its initial weights follow the seed TFEstimator sets)."""
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05), "mse")
    return model


def holdout_callbacks():
    """TFEstimator's callbacks in the estimator tests: stop as soon as val_loss does not improve,
    and keep the best model in the fit's folder (a relative path)."""
    import keras

    return [keras.callbacks.EarlyStopping(monitor="val_loss", patience=0),
            keras.callbacks.ModelCheckpoint("checkpoints/best.keras", monitor="val_loss",
                                            save_best_only=True)]


def linear_train_fn(args, ctx):
    """TFEstimator's trainFn (TensorFlowOnSpark style) in the estimator tests: fit on the feed
    with the args TFEstimator hands over; the chief saves to args["modelPath"]."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(args["seed"])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    feed = ctx.get_data_feed(train=True)
    dataset = feed.dataset(args["batchSize"], features=args["featuresCol"], label=args["labelCol"])
    with strategy.scope():
        model = linear_model_fn()
    history = model.fit(dataset, epochs=args["epochs"], verbose=0)
    if ctx.is_chief:
        model.save(args["modelPath"])
    return {"loss": history.history["loss"], "args": args["args"]}


def started_train_fn(args, ctx):
    """TFEstimator's trainFn in the fit-group test: marks that the node runs (a file in
    trainArgs["started"]), then waits for a file that never comes, until it is stopped."""
    folder = args["args"]["started"]
    open(os.path.join(folder, f"node-{ctx.node_id}"), "w").close()
    wait_for_file(os.path.join(folder, "never"), 120.0)


def tracking_train_fn(args, ctx):
    """TFEstimator's trainFn in the MLflow test: reads no row (the feed terminated), the chief
    writes a stand-in for the model; its history is the MLflow run it was handed."""
    ctx.get_data_feed(train=True).terminate()
    if ctx.is_chief:
        with open(args["modelPath"], "wb") as f:
            f.write(b"not a model")
    return {"mlflow": args["mlflow"]}


def talk_main(args, ctx):
    """Writes to every output a node has: print, sys.stderr, fd 2 directly, and logging."""
    import logging
    import sys

    me = f"{ctx.job_name}-{ctx.task_index}"
    print(f"out-1 {me}")
    sys.stderr.write(f"err-2 {me}\n")
    sys.stderr.flush()
    os.write(2, f"fd2-3 {me}\n".encode())
    logging.getLogger("talk").warning("log-4 %s", me)
    print(f"out-5 {me}")
    if args and args.get("fail") == ctx.task_index:
        for i in range(150):
            print(f"last-{i} {me}")
        raise RuntimeError(f"talked out {me}")
    if args and args.get("flood_node") == ctx.node_id:
        for i in range(args["flood"]):  # far more lines than the driver takes per second
            print(f"flood {i}")
    return {"me": me, "tf_cpp_min_log_level": os.environ.get("TF_CPP_MIN_LOG_LEVEL")}




def argv_main(args, ctx):
    """A main for the command line (``python -m duotf run``): ``args`` is the list of strings
    after ``--``; ``--fail`` fails worker 1."""
    me = f"{ctx.job_name}:{ctx.task_index}"
    print(f"argv_main {me} got {' '.join(args)}")
    if "--fail" in args and ctx.task_index == 1:
        raise RuntimeError(f"{me} was asked to fail (--fail)")
    return {"args": args, "node_id": ctx.node_id, "role": me}


def tensorboard_main(args, ctx):
    """Reads its feed to the end; the chief writes scalars to ctx.log_dir with tf.summary; then
    waits for the file args['release'] (TensorBoard serves while the node runs)."""
    import tensorflow as tf

    feed = ctx.get_data_feed(train=True)
    rows = 0
    while not feed.should_stop():
        rows += len(feed.next_batch(10))
    if ctx.is_chief:
        writer = tf.summary.create_file_writer(ctx.log_dir)
        with writer.as_default():
            for step, loss in enumerate(args["losses"]):
                tf.summary.scalar("loss", loss, step=step)
        writer.close()
    wait_for_file(args["release"])
    return {"rows": rows, "log_dir": ctx.log_dir}


def report_main(args, ctx):
    """Reads the feed, reporting each batch (rows read so far); then ``ordered`` reports without
    a step; a report refused for a value that is no number; and on node ``flood_node`` a flood
    of reports, far over the rate limit (returns how many it admitted)."""
    from duotf.errors import ConfigError

    feed = ctx.get_data_feed(train=True)
    rows, batches = 0, 0
    while not feed.should_stop():
        epoch = feed.epoch
        got = len(feed.next_batch(args["batch"]))
        if got:
            rows += got
            batches += 1
            assert ctx.report(step=batches, rows=rows, epoch=epoch) is True
    for i in range(args["ordered"]):
        # a numpy scalar, exact in float32 (numpy 1.26's float32 ** int rounds through float64:
        # 169 ** 2 came back as 28560.999999999996, numpy's arithmetic, not the report's)
        assert ctx.report(value=i, square=np.float32(i * i)) is True
    refused = []
    for bad in ({"step": 1, "loss": "high"}, {"step": 1.5, "loss": 0.5}, {"step": 2}):
        try:
            ctx.report(**bad)
        except ConfigError as exc:
            refused.append(str(exc))
    admitted = None
    if ctx.node_id == args.get("flood_node"):
        admitted = sum(ctx.report(step=i, flood=i) for i in range(args["flood"]))
    return {"batches": batches, "rows": rows, "refused": refused, "admitted": admitted}


def epoch_report_main(args, ctx):
    """Reads the feed and reports each epoch's ``loss`` (``0.5 ** epoch``) at ``step=`` that
    epoch (0-based), as ``duotf.keras.ReportCallback`` does, once its rows are read; the last
    epoch's only once the file args['release'] appears (training that goes on after the feed)."""
    feed = ctx.get_data_feed(train=True)
    epoch = None
    while not feed.should_stop():
        now = feed.epoch
        if feed.next_batch(args["batch"]):
            if epoch is not None and now != epoch:
                ctx.report(step=epoch, loss=0.5 ** epoch)
            epoch = now
    wait_for_file(args["release"])
    ctx.report(step=epoch, loss=0.5 ** epoch)
    return epoch


class _Poison(tuple):
    """A row that raises when the feed reads its values (a source failing on this row)."""

    def __getitem__(self, i):
        raise RuntimeError(f"injected: the source failed at row {tuple.__getitem__(self, 1)}")


class RowSource:
    """The rows ``(0.5, i)`` for ``start <= i < stop``, made where the engine reads them
    (``engine.row_sources``). ``fail="count"``: the source raises at once, so counting its rows
    fails; ``fail=k``: its row ``k`` (from 0) raises when the feed converts it, after the rows
    before it went out in the feed's chunks of 4096 (the count, which does not read values,
    passes)."""

    def __init__(self, start: int, stop: int, fail=None):
        self.start, self.stop, self.fail = start, stop, fail

    def _check(self):
        if self.fail == "count":
            raise RuntimeError(f"injected: the source of rows {self.start}.. failed")

    def __len__(self):
        self._check()
        return self.stop - self.start

    def __getitem__(self, i):  # a Dask Bag looks at its partition's first row
        if not 0 <= i < self.stop - self.start:
            raise IndexError(i)
        return (0.5, self.start + i)

    def __call__(self):
        self._check()
        return ((_Poison((0.5, i)) if i - self.start == self.fail else (0.5, i))
                for i in range(self.start, self.stop))


def infer_model(weights):
    """A small Keras model (3 -> 2 tanh -> 1) with the given weights: the inference tests'."""
    import keras

    model = keras.Sequential([keras.Input((3,), name="features"), keras.layers.Dense(2, activation="tanh"),
                              keras.layers.Dense(1)])
    model.set_weights([np.asarray(w, np.float32) for w in weights])
    return model


def keras_predict_main(args, ctx):
    """Inference with a Keras model built in a MultiWorkerMirroredStrategy scope:
    ``model.predict`` on this node's inference feed (``feed.dataset``: the rows queued now),
    answered with ``batch_results``, until the feed ends; returns how many rows it answered."""
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = infer_model(args["weights"])
    feed = ctx.get_data_feed(train=False)
    rows = 0
    while not feed.should_stop():
        predictions = model.predict(feed.dataset(args["batch"], features="features"), verbose=0)
        feed.batch_results(predictions[:, 0])
        rows += len(predictions)
    return rows


def two_io_model_fn():
    """TFEstimator's modelFn of several inputs and outputs: inputs ``a`` (3 floats) and ``b``
    (one float), outputs ``y`` (one value) and ``z`` (2 values); compiled, weights by the seed."""
    import keras

    a, b = keras.Input((3,), name="a"), keras.Input((1,), name="b")
    hidden = keras.layers.Concatenate()([a, b])
    y = keras.layers.Dense(1, name="y")(hidden)
    z = keras.layers.Dense(2, name="z")(hidden)
    model = keras.Model([a, b], [y, z])
    model.compile(keras.optimizers.SGD(0.05), ["mse", "mse"])
    return model


