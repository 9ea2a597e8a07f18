"""Node programs of the feed tests: they read ``ctx.get_data_feed`` in every way a node can.

Pickled by value (``duotf.testing.suite.mains``), so executors need not import it.
"""

from __future__ import annotations

import os

import numpy as np

from duotf.testing.suite.mains.training import wait_for_file


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





def feed_columns_main(args, ctx):
    """Read every batch with ``args["mapping"]`` as input_mapping (None: none); return the
    names of the columns the batches held and the rows read."""
    feed = ctx.get_data_feed(train=True, input_mapping=args.get("mapping"))
    names, rows = set(), 0
    while not feed.should_stop():
        batch = feed.next_batch(args.get("batch", 16))
        if isinstance(batch, dict):
            names.update(batch)
            rows += len(next(iter(batch.values()), []))
        else:
            rows += len(batch)
    return {"columns": sorted(names), "rows": rows}


def keras_columns_main(args, ctx):
    """Fit a one-layer Keras model on ``feed.dataset(features="x", label="y")``, one epoch."""
    import keras

    feed = ctx.get_data_feed(train=True, input_mapping=args.get("mapping"))
    model = keras.Sequential([keras.Input((args["width"],)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(feed.dataset(args["batch"], features="x", label="y"), epochs=1, verbose=0)
    return ctx.node_id
