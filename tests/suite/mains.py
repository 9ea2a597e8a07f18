"""Node programs used by the shared suite. Pickled by value, so executors need not import tests."""

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


def _mwms_linear(args, ctx, w0, b0):
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
    w, b, step = _mwms_linear(args, ctx, np.zeros(N_FEATURES, np.float32), np.float32(0.0))
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


def raise_on_main(args, ctx):
    if ctx.node_id == args["bad"]:
        raise ValueError(f"boom-{ctx.node_id}: bad input in node program")
    wait_for_file(args["release"])
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


def feed_train_main(args, ctx):
    """Read the engine feed with next_batch; report what arrived, epoch by epoch."""
    feed = ctx.get_data_feed(train=True)
    seen = {}
    while not feed.should_stop():
        epoch = feed.epoch  # a batch never spans two epochs
        batch = feed.next_batch(args["batch"])
        seen.setdefault(epoch, []).extend(int(row[1]) for row in batch)
    return {"rank": ctx.task_index, "ids": seen, "epochs": feed.epoch}


def feed_dataset_main(args, ctx):
    """The fast path: a tf.data.Dataset of column dicts."""
    feed = ctx.get_data_feed(train=True, input_mapping={"x": "features", "y": "label"})
    rows, total, steps = 0, 0.0, 0
    for batch in feed.dataset(args["batch"]):
        steps += 1
        rows += int(batch["label"].shape[0])
        total += float(batch["features"].numpy().sum())
    return {"rows": rows, "sum": total, "steps": steps}


def feed_infer_main(args, ctx):
    """Answer ``args.get("feeds", 1)`` ``cluster.inference`` calls, one after the other."""
    for _ in range(args.get("feeds", 1)):  # one get_data_feed() for each cluster.inference()
        feed = ctx.get_data_feed(train=False)
        while not feed.should_stop():
            batch = feed.next_batch(args["batch"])
            if batch:
                feed.batch_results([row[0] * 2.0 + row[1] for row in batch])
    return ctx.task_index


def feed_terminate_main(args, ctx):
    feed = ctx.get_data_feed(train=True)
    first = feed.next_batch(args["batch"])
    feed.terminate()
    return len(first)


def feed_die_main(args, ctx):
    feed = ctx.get_data_feed(train=True)
    feed.next_batch(args["batch"])
    if ctx.task_index == 1:
        os._exit(3)  # dies mid-feed, no exception, no goodbye
    while not feed.should_stop():
        feed.next_batch(args["batch"])
    return "ok"


def feed_memory_main(args, ctx):
    """Drain a large feed through dataset(); report rows and how much this process grew."""
    import psutil
    __import__("tensorflow")  # what a TF program does first

    proc = psutil.Process()
    feed = ctx.get_data_feed(train=True)
    base = peak = proc.memory_info().rss
    rows = 0
    for i, batch in enumerate(feed.dataset(args["batch"])):
        rows += int(batch["1"].shape[0])
        if i % 50 == 0:
            peak = max(peak, proc.memory_info().rss)
    return {"rows": rows, "growth_mb": (peak - base) / 2**20}


def ids_seen_main(args, ctx):
    """Drain a feed of ids (column "1", 0 <= id < args["rows"]) through dataset(); return
    how many rows came and which ids, as a packed bitmap, and how many came twice here."""
    import numpy as np
    __import__("tensorflow")  # what a TF program does first

    seen = np.zeros(args["rows"], dtype=bool)
    rows = twice = 0
    for batch in ctx.get_data_feed(train=True).dataset(args["batch"]):
        ids = batch["1"].numpy()
        rows += len(ids)
        twice += int(seen[ids].sum()) + len(ids) - len(np.unique(ids))
        seen[ids] = True
    return {"rows": rows, "twice": twice, "seen": np.packbits(seen).tobytes()}


def feed_tensor_main(args, ctx):
    """Read a 2-D tensor column through dataset(); check every row against its id."""
    import numpy as np

    feed = ctx.get_data_feed(train=True, input_mapping=args["mapping"])
    ids, dtypes, shapes, wrong = [], set(), set(), 0
    for batch in feed.dataset(args["batch"]):
        x, i = batch["x"].numpy(), batch["id"].numpy()
        dtypes.add(str(x.dtype))
        shapes.add(x.shape[1:])
        wrong += int((x != i[:, None] * 10 + np.arange(x.shape[1])).any(axis=1).sum())
        ids.extend(int(v) for v in i)
    return {"ids": ids, "dtypes": sorted(dtypes), "shapes": sorted(shapes), "wrong": wrong}


def sgd_main(args, ctx):
    """Plain SGD on a linear model, batch by batch, on this worker's rows: the weights depend
    on every row it reads and on the order it reads them in."""
    import numpy as np

    feed = ctx.get_data_feed(train=True)
    w = np.zeros(args["width"])
    b = 0.0
    while not feed.should_stop():
        rows = feed.next_batch(args["batch"])
        if not rows:
            continue
        a = np.asarray(rows, dtype=np.float64)
        x, y = a[:, :-1], a[:, -1]
        err = x @ w + b - y
        w = w - args["lr"] * (x.T @ err) / len(y)
        b = b - args["lr"] * float(err.mean())
    return {"w": w.tolist(), "b": b}


def feed_infer_short_main(args, ctx):
    """Inference that answers one result fewer than the rows of its first batch, then reads on
    (``"read"``) or returns (``"return"``)."""
    feed = ctx.get_data_feed(train=False)
    batch = feed.next_batch(args["batch"])
    feed.batch_results([0.0] * (len(batch) - 1))
    if args["then"] == "read":
        while not feed.should_stop():
            feed.batch_results([0.0] * len(feed.next_batch(args["batch"])))
    return len(batch)


def feed_ragged_main(args, ctx):
    """Read a column declared ragged, by next_batch (a RaggedColumn) or dataset() (a
    tf.RaggedTensor); report every row's values by its id, and the type the column came as."""
    feed = ctx.get_data_feed(train=True, input_mapping={args["id"]: "id", args["v"]: "v"})
    rows, kinds = {}, set()
    if args["reader"] == "dataset":
        for batch in feed.dataset(args["batch"]):
            kinds.add(type(batch["v"]).__name__)
            rows.update(zip(batch["id"].numpy().tolist(), batch["v"].to_list()))
    else:
        while not feed.should_stop():
            batch = feed.next_batch(args["batch"])
            if batch:
                kinds.add(type(batch["v"]).__name__)
                rows.update(zip(batch["id"].tolist(), batch["v"].to_list()))
    return {"rows": rows, "kinds": sorted(kinds)}


def ragged_infer_main(args, ctx):
    """Inference over rows (id, values) whose values are declared ragged: 1000 * len + sum."""
    feed = ctx.get_data_feed(train=False)
    while not feed.should_stop():
        batch = feed.next_batch(args["batch"])
        if batch:
            feed.batch_results([1000.0 * len(v) + float(np.sum(v)) for _, v in batch])
    return ctx.task_index


def feed_hold_main(args, ctx):
    """Read the feed; after ``hold`` rows, create ``held``-<rank> and read on only once
    ``release`` exists (a test kills a feeding process meanwhile). Report the ids read, by epoch."""
    feed = ctx.get_data_feed(train=True, input_mapping={"0": "x", "1": "id"})
    seen, rows = {}, 0
    while not feed.should_stop():
        epoch = feed.epoch
        batch = feed.next_batch(args["batch"])
        if not batch:
            continue
        seen.setdefault(epoch, []).append(np.asarray(batch["id"]).copy())
        rows += len(batch["id"])
        if rows >= args["hold"] and not os.path.exists(args["release"]):
            open(f"{args['held']}-{ctx.task_index}", "w").close()
            wait_for_file(args["release"])
    return {"rank": ctx.task_index, "ids": {e: np.concatenate(v).tolist() for e, v in seen.items()}}



def _keras_linear(width: int, lr: float):
    import keras

    model = keras.Sequential([keras.Input((width,)),
                              keras.layers.Dense(1, kernel_initializer="zeros")])
    model.compile(keras.optimizers.SGD(lr), "mse")
    return model


def _step_counter():
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
        model = _keras_linear(width, lr)
    counter = _step_counter()
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
        model = _keras_linear(width, lr)
    counter = _step_counter()
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
        model = _keras_linear(2, 0.1)
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
        assert ctx.report(value=i, square=np.float32(i) ** 2) is True
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


def mwms_resume_main(args, ctx):
    """mwms_main (TF reads its own file, MultiWorkerMirroredStrategy) in epochs of
    ``steps_per_epoch`` steps; the chief saves the weights after each epoch and reports it;
    after a restart every worker starts from that checkpoint at ctx.resume_epoch."""
    per_epoch = args["steps_per_epoch"]
    w0, b0 = np.zeros(N_FEATURES, np.float32), np.float32(0.0)
    if ctx.latest_checkpoint():
        saved = np.load(ctx.latest_checkpoint())
        w0, b0 = saved["w"], saved["b"]
    w, b, step = _mwms_linear(args, ctx, w0, b0)
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


def keras_resume_main(args, ctx):
    """Keras 3 fit under MultiWorkerMirroredStrategy on the engine feed, resumable:
    CheckpointCallback saves and reports every epoch, restore + initial_epoch resume."""
    import keras
    import tensorflow as tf

    import duotf.keras

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    feed = ctx.get_data_feed(train=True, input_mapping=args["mapping"])
    with strategy.scope():
        model = _keras_linear(args["width"], args["lr"])
    restored = duotf.keras.CheckpointCallback.restore(model, ctx)

    class Hold(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            _hold_until_killed(args, ctx, epoch + 1)

    counter = _step_counter()
    model.fit(feed.dataset(args["batch"], features="x", label="y"), epochs=args["epochs"],
              initial_epoch=ctx.resume_epoch, verbose=0,
              callbacks=[duotf.keras.CheckpointCallback(ctx), Hold(), counter])
    kernel, bias = model.get_weights()
    return {"w": kernel[:, 0].tolist(), "b": float(bias[0]), "attempt": ctx.attempt,
            "restored": restored, "steps": counter.steps}
