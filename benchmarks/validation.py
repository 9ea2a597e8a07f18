"""What the feed's input validation costs per Arrow batch (nulls, ragged list columns).

    python -m benchmarks.validation [--rows 2000 --width 784 --repeats 300]

An Arrow batch as Spark hands it to a feeding task (``array<float>`` column ``x`` of ``width``
values a row, ``long`` column ``y``) is converted with ``duotf.feed.columns.from_arrow``, which
validates as it converts; beside it, the same conversion without any check (the code before
validation), and the checks alone. For scale, what the feed does next with every batch at the
least: the frame sent through a local socket pair and received as the node does
(``wire.send_frame`` / ``wire.recv_frame``). Medians of ``--repeats`` runs. Target: the checks
cost < 3 % of the feed's time per batch.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def _median_us(fn, repeats: int, per: int = 20) -> float:
    """The median over ``repeats`` timings of ``per`` calls each, per call (a shared machine's
    noise lands in a few timings, which the median leaves out)."""
    fn()  # warm
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(per):
            fn()
        times.append((time.perf_counter() - t0) / per)
    return statistics.median(times) * 1e6


def main() -> None:
    import pyarrow as pa

    from duotf.feed.columns import from_arrow

    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--width", type=int, default=784)
    parser.add_argument("--repeats", type=int, default=200)
    opts = parser.parse_args()
    n, width = opts.rows, opts.width

    values = pa.array(np.random.default_rng(0).random(n * width, dtype=np.float32))
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * width)
    x = pa.ListArray.from_arrays(offsets, values)
    batch = pa.RecordBatch.from_arrays([x, pa.array(np.arange(n, dtype=np.int64))], ["x", "y"])

    def unchecked():  # from_arrow before validation (duotf 70a6cbe), tensors=None
        cols = {}
        for name, column in zip(batch.schema.names, batch.columns):
            t = column.type
            if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
                k = len(column)
                flat = column.flatten().to_numpy(zero_copy_only=False)
                cols[name] = flat.reshape(k, -1) if k else flat.reshape(0, 0)
            elif pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t):
                cols[name] = column.to_pylist()
            else:
                cols[name] = column.to_numpy(zero_copy_only=False)
        return cols

    flat_x = x.flatten()
    even = (np.arange(n + 1, dtype=np.int32) * width).tobytes()

    def checks():  # what validation adds, alone: as from_arrow does them
        for column in batch.columns:
            column.null_count
        flat_x.null_count
        offsets = np.frombuffer(x.buffers()[1], np.int32)[x.offset:x.offset + n + 1]
        return offsets.tobytes() == even

    assert all((a == b).all() for a, b in zip(unchecked().values(), from_arrow(batch).values()))
    base = _median_us(unchecked, opts.repeats)
    validated = _median_us(lambda: from_arrow(batch), opts.repeats)
    alone = _median_us(checks, opts.repeats)
    sent = _median_us(_sender(from_arrow(batch)), max(opts.repeats // 5, 20), per=1)
    mb = batch.nbytes / 2**20
    print(f"Arrow batch: {n} rows x {width} float32 ({mb:.1f} MiB) + int64 label; medians of "
          f"{opts.repeats} x 20 calls")
    print(f"  from_arrow without checks : {base:9.1f} us (zero-copy)")
    print(f"  from_arrow with checks    : {validated:9.1f} us  ({(validated - base) / base:+.1%})")
    print(f"  the checks alone          : {alone:9.1f} us  ({alone / base:.1%} of the conversion)")
    print(f"  the frame through a socket: {sent:9.1f} us  (checks: {alone / (sent + base):.2%} of "
          "conversion + send)")


def _sender(cols):
    """A call that sends ``cols`` as one frame through a socket pair; a thread receives it."""
    import socket
    import threading

    from duotf.feed import wire

    a, b = socket.socketpair()
    for sock in (a, b):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    got = threading.Semaphore(0)

    def receive():
        try:
            while True:
                wire.recv_frame(b)
                got.release()
        except OSError:
            pass

    threading.Thread(target=receive, daemon=True).start()

    def send():
        wire.send_frame(a, wire.Frame.BATCH, cols)
        got.acquire()

    return send


if __name__ == "__main__":
    main()
