"""What the feed's input validation costs (nulls, ragged list columns), per batch and end to end.

    python -m benchmarks.validation [--rows 2000 --width 784 --repeats 300]
    python -m benchmarks.validation --feed [--backend local|dask] [--feed-rows 40000
                                    --partitions 8 --epochs 10 --rounds 2]

Per batch (the default): an Arrow batch as Spark hands it to a feeding task (``array<float>``
column ``x`` of ``width`` values a row, ``long`` column ``y``) is converted with
``duotf._transport.columns.from_arrow``, which validates as it converts; beside it, the same
conversion without any check (the code before validation), with the checks switched off
(``columns.VALIDATE``, see below), and the checks alone. The same for a pandas frame as a Dask
or local partition holds one (``x`` an object column of float32 arrays, ``y`` int64, ``z``
float64) through ``from_pandas``, the rows/pandas path, with the checks on and off. For scale,
what the feed does next with every batch at the least: the frame sent through a local socket
pair and received as the node does (``wire.send_frame`` / ``wire.recv_frame``). Medians of
``--repeats`` runs.

End to end (``--feed``): a real cluster of 2 worker nodes drains ``feed.dataset(100)``
(benchmarks/feed.py's ``drain_main``) from the same data with the checks on and off, in
alternating rounds, and the feed rates (rows/s while every node reads) are printed side by side
with their ratio, and the CPU time the feeding processes spent per row (this process for the
local backend, the Dask workers' processes for Dask; the nodes' processes aside), which a small
machine's swings of wall-clock rate leave steady: on the local backend, Arrow record batches (the path of a Spark DataFrame's
feeding task) and pandas frames as partitions; on Dask, a Dask DataFrame of such frames. The
checks are switched off in the processes that feed (this one for the local backend, every Dask
worker with ``client.run``) through ``duotf._transport.columns.VALIDATE``, the benchmark-only switch
that ``DUOTF_FEED_VALIDATE=0`` sets when a feeding process imports duotf (the way to switch it
off in Spark executors: ``spark.executorEnv.DUOTF_FEED_VALIDATE``).

Target: the checks cost < 3 % of the feed's throughput.
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


def _validating(flag: bool) -> None:
    """Switch the feed's checks on or off in this process (benchmarks only)."""
    from duotf._transport import columns
    columns.VALIDATE = flag


def _unvalidated(fn):
    """``fn`` with the checks switched off for the call."""
    def call():
        _validating(False)
        try:
            return fn()
        finally:
            _validating(True)
    return call


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--width", type=int, default=784)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--feed", action="store_true", help="end to end through a real cluster")
    parser.add_argument("--backend", choices=["local", "dask"], default="local")
    parser.add_argument("--feed-rows", type=int, default=40_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    opts = parser.parse_args()
    if opts.feed:
        end_to_end(opts)
    else:
        per_batch(opts)


def per_batch(opts) -> None:
    import pyarrow as pa

    from duotf._transport.columns import from_arrow

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
    switched = _median_us(_unvalidated(lambda: from_arrow(batch)), opts.repeats)
    print(f"  the frame through a socket: {sent:9.1f} us  (checks: {alone / (sent + base):.2%} of "
          "conversion + send)")
    print(f"  from_arrow, checks off    : {switched:9.1f} us  (columns.VALIDATE = False; with "
          f"them: {(validated - switched) / switched:+.1%})")
    per_batch_pandas(opts)


def _pandas_frame(n: int, width: int, seed: int = 0):
    """A partition as Dask or the local backend holds one: an object column of float32 arrays
    (``x``), an int64 label (``y``), a float64 column (``z``)."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    x = rng.random((n, width), dtype=np.float32)
    return pd.DataFrame({"x": list(x), "y": np.arange(n, dtype=np.int64) % 10,
                         "z": rng.random(n)})


def per_batch_pandas(opts) -> None:
    """``from_pandas`` (the rows/pandas path) with the checks on and off."""
    from duotf._transport.columns import from_pandas

    n, width = opts.rows, opts.width
    frame = _pandas_frame(n, width)
    repeats = max(opts.repeats // 4, 20)
    on = _median_us(lambda: from_pandas(frame), repeats, per=5)
    off = _median_us(_unvalidated(lambda: from_pandas(frame)), repeats, per=5)
    sent = _median_us(_sender(from_pandas(frame)), max(repeats // 5, 20), per=1)
    print(f"pandas frame: {n} rows, x: object column of float32[{width}] arrays, y int64, "
          f"z float64; medians of {repeats} x 5 calls")
    print(f"  from_pandas, checks on    : {on:9.1f} us  ({(on - off) / off:+.1%})")
    print(f"  from_pandas, checks off   : {off:9.1f} us")
    print(f"  the frame through a socket: {sent:9.1f} us  (checks: {(on - off) / (off + sent):.2%} "
          "of conversion + send)")


def _cpu(procs) -> float:
    """User + system CPU seconds of ``procs`` themselves (their children, the nodes, aside)."""
    return sum(sum(p.cpu_times()[:2]) for p in procs)


def _feed_rate(backend, data, epochs: int, feeders) -> tuple:
    """Rows/s while every node read (benchmarks/feed.py's measure), one cluster run; and the
    CPU microseconds the feeding processes spent per row fed (a 2-core machine's wall-clock
    rates swing by a quarter from run to run; CPU time spent does not)."""
    import duotf
    from benchmarks.feed import BATCH, drain_main, feed_rates

    with duotf.run(drain_main, {"batch": BATCH}, backend, duotf.ClusterSpec(workers=2),
                   env={"TF_CPP_MIN_LOG_LEVEL": "3"}) as cluster:
        procs = feeders()
        cpu0 = _cpu(procs)
        report = cluster.train(data, epochs=epochs)
        cpu = _cpu(procs) - cpu0
        results = cluster.wait()
    fed = sum(r["rows"] for r in results)
    assert fed == report["rows_fed"], (fed, report)
    whole, steady, _ = feed_rates(results)
    return steady or whole, cpu / fed * 1e6


def end_to_end(opts) -> None:
    """The same data fed with the checks on and off, rounds alternating; rates side by side."""
    import statistics as stats

    import pyarrow as pa

    n, parts, width = opts.feed_rows, opts.partitions, opts.width
    frames = [_pandas_frame(len(rows), width, seed=i)
              for i, rows in enumerate(np.array_split(np.arange(n), parts))]
    cases = {}
    client = None
    if opts.backend == "local":
        backend = "local"  # a fresh local backend per run, closed with its cluster
        batches = []
        for f in frames:
            x = np.stack(f["x"].tolist())
            offsets = pa.array(np.arange(len(f) + 1, dtype=np.int32) * width)
            batches.append(pa.RecordBatch.from_arrays(
                [pa.ListArray.from_arrays(offsets, pa.array(x.ravel())), pa.array(f["y"].to_numpy())],
                ["x", "y"]))
        cases["Arrow record batches (array<float> x, long y)"] = batches
        cases["pandas frames (object column x, int64 y, float64 z)"] = frames

        def switch(flag):
            _validating(flag)

        def feeders():
            import psutil
            return [psutil.Process()]
    else:
        import dask
        import dask.dataframe as dd
        from distributed import Client, LocalCluster

        lc = LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=None, host="127.0.0.1")
        client = Client(lc)
        backend = client
        with dask.config.set({"dataframe.convert-string": False}):
            ddf = dd.from_delayed([dask.delayed(lambda f: f)(f) for f in frames], meta=frames[0].iloc[:0])
        cases["Dask DataFrame of pandas frames (object column x, int64 y, float64 z)"] = ddf.persist()

        def switch(flag):
            client.run(_validating, flag)
            _validating(flag)

        def feeders():
            import os as _os

            import psutil
            return [psutil.Process(pid) for pid in client.run(_os.getpid).values()]
    try:
        print(f"end to end, {opts.backend} backend, 2 worker nodes draining dataset({100}): "
              f"{n} rows x {width} float32 in {parts} partitions, {opts.epochs} epochs a run; "
              f"{opts.rounds} rounds of (checks on, checks off); medians of the rounds", flush=True)
        for label, data in cases.items():
            rates = {True: [], False: []}
            cpus = {True: [], False: []}
            for i in range(opts.rounds):
                for flag in ((True, False) if i % 2 == 0 else (False, True)):  # neither always first
                    switch(flag)
                    try:
                        rate, cpu = _feed_rate(backend, data, opts.epochs, feeders)
                    finally:
                        switch(True)
                    rates[flag].append(rate)
                    cpus[flag].append(cpu)
            on, off = stats.median(rates[True]), stats.median(rates[False])
            cpu_on, cpu_off = stats.median(cpus[True]), stats.median(cpus[False])
            print(f"  {label}:", flush=True)
            print(f"    checks on : {on:>10,.0f} rows/s  (rounds: "
                  f"{', '.join(f'{r:,.0f}' for r in rates[True])})")
            print(f"    checks off: {off:>10,.0f} rows/s  (rounds: "
                  f"{', '.join(f'{r:,.0f}' for r in rates[False])})")
            print(f"    on / off  : {on / off:.1%}  (the checks cost {1 - on / off:+.1%} of the throughput)",
                  flush=True)
            print(f"    feeding CPU per row: checks on {cpu_on:.2f} us, off {cpu_off:.2f} us "
                  f"(rounds on: {', '.join(f'{c:.2f}' for c in cpus[True])}; off: "
                  f"{', '.join(f'{c:.2f}' for c in cpus[False])}): the checks add "
                  f"{cpu_on / cpu_off - 1:+.1%} to the feeding processes' CPU time", flush=True)
    finally:
        if client is not None:
            client.close()
            lc.close()


def _sender(cols):
    """A call that sends ``cols`` as one frame through a socket pair; a thread receives it."""
    import socket
    import threading

    from duotf._transport import wire
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
