"""Node programs and data of the tests across separate hosts (engines whose ``hosts`` is set).

Pickled by value (``duotf.testing.suite.mains``), so executors need not import it.
"""

from __future__ import annotations

import os
import socket
import time


class HostRows:
    """The rows ``(host, i)`` for ``start <= i < stop``, where ``host`` is the hostname of the
    process that makes them: the engine's task that feeds the partition
    (``engine.row_sources``). A node that reads a row made on another host knows it crossed."""

    def __init__(self, start: int, stop: int):
        self.start, self.stop = start, stop

    def __len__(self):
        return self.stop - self.start

    def __getitem__(self, i):  # a Dask Bag looks at its partition's first row
        if not 0 <= i < self.stop - self.start:
            raise IndexError(i)
        return (socket.gethostname(), self.start + i)

    def __call__(self):
        host = socket.gethostname()
        return ((host, i) for i in range(self.start, self.stop))


def host_rows_main(args, ctx):
    """Read the feed; say this node's host, the rows read, and those made on another host.
    With ``args["started"]``, a file ``<started>/node-<i>`` once the first batch is read, and
    ``args["pause"]`` seconds of pause after each batch (a feed that lasts)."""
    feed = ctx.get_data_feed(train=True)
    me = socket.gethostname()
    rows = across = 0
    while not feed.should_stop():
        batch = feed.next_batch(args["batch"])
        rows += len(batch)
        across += sum(1 for row in batch if row[0] != me)
        if args.get("started") and rows and rows == len(batch):
            open(os.path.join(args["started"], f"node-{ctx.task_index}"), "w").close()
        if args.get("pause"):
            time.sleep(args["pause"])
    return {"host": me, "rows": rows, "across": across}


def allreduce_main(args, ctx):
    """All-reduce a tensor under MultiWorkerMirroredStrategy until the cluster stops it,
    writing ``<started>/node-<i>`` after the first step."""
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    step = 0
    while True:
        value = strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)),
                                axis=None)
        step += 1
        if step == 1:
            assert float(value) == ctx.num_workers
            open(os.path.join(args["started"], f"node-{ctx.task_index}"), "w").close()


def listening_main(args, ctx):
    """Start this node's TensorFlow server (on the port its task reserved) and return every
    TCP port this node process listens on: its feed server's and TensorFlow's (``args``
    ``{"addresses": True}``: each as ``[address, port]``)."""
    import psutil

    ctx.start_server()
    found = [c.laddr for c in psutil.Process().net_connections(kind="tcp")
             if c.status == psutil.CONN_LISTEN]
    if args and args.get("addresses"):
        return sorted({(a.ip, a.port) for a in found})
    return sorted({a.port for a in found})
