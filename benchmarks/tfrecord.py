"""TFRecord write and read throughput: duotf beside TensorFlow's own writer and reader.

    python benchmarks/tfrecord.py [--mb 256] [--record-bytes 3200] [--repeat 3]

Local files and memory://. TF's reader is measured at its best: tf.data.TFRecordDataset drained
in batches of 1024 (per-record eager iteration is far slower), and also per record. duotf's
reader is measured through TFRecordReader.batches(), records as Python bytes, CRCs checked.
Target: reading local files >= 0.8x TF's native reader (batched). Median of --repeat runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from duotf.io.tfrecord import TFRecordReader, write_records


def timed(fn, repeat):
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        count = fn()
        runs.append(time.perf_counter() - t)
    return statistics.median(runs), count


def cli():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--record-bytes", type=int, default=3200)  # an MNIST-like Example
    parser.add_argument("--repeat", type=int, default=3)
    opts = parser.parse_args()

    import tensorflow as tf

    n = opts.mb * (1 << 20) // opts.record_bytes
    records = [os.urandom(64) * (opts.record_bytes // 64) for _ in range(1000)]
    data = [records[i % 1000] for i in range(n)]
    size_mb = n * (opts.record_bytes + 16) / (1 << 20)
    tmp = tempfile.mkdtemp(prefix="duotf-bench-")
    ours, theirs = os.path.join(tmp, "duotf.tfrecord"), os.path.join(tmp, "tf.tfrecord")
    print(f"{n} records of {opts.record_bytes} B ({size_mb:.0f} MB), median of {opts.repeat}")

    def tf_write():
        with tf.io.TFRecordWriter(theirs) as w:
            for r in data:
                w.write(r)
        return n

    def duotf_reader(url):
        return lambda: sum(len(b) for b in TFRecordReader(url).batches())

    def tf_batched():
        return sum(int(b.shape[0]) for b in tf.data.TFRecordDataset(theirs, buffer_size=1 << 20).batch(1024))

    def tf_per_record():
        return sum(1 for _ in tf.data.TFRecordDataset(theirs, buffer_size=1 << 20))

    rows = [
        ("write", "local", "duotf write_records", timed(lambda: write_records(ours, data), opts.repeat)),
        ("write", "local", "tf.io.TFRecordWriter", timed(tf_write, opts.repeat)),
        ("write", "memory", "duotf write_records", timed(lambda: write_records("memory://bench/a.tfrecord", data), opts.repeat)),
        ("read", "local", "duotf TFRecordReader", timed(duotf_reader(theirs), opts.repeat)),
        ("read", "local", "tf.data batched(1024)", timed(tf_batched, opts.repeat)),
        ("read", "local", "tf.data per record", timed(tf_per_record, max(1, opts.repeat // 3))),
        ("read", "memory", "duotf TFRecordReader", timed(duotf_reader("memory://bench/a.tfrecord"), opts.repeat)),
    ]
    print(f"{'op':<6}{'fs':<8}{'implementation':<24}{'MB/s':>9}{'records/s':>12}")
    rates = {}
    for op, fs, name, (seconds, count) in rows:
        assert count == n, (name, count)
        rates[(op, fs, name)] = size_mb / seconds
        print(f"{op:<6}{fs:<8}{name:<24}{size_mb / seconds:>9.0f}{n / seconds:>12,.0f}")
    read_ratio = rates[("read", "local", "duotf TFRecordReader")] / rates[("read", "local", "tf.data batched(1024)")]
    write_ratio = rates[("write", "local", "duotf write_records")] / rates[("write", "local", "tf.io.TFRecordWriter")]
    print(f"local read: duotf / TF batched = {read_ratio:.2f}x (target >= 0.8x); "
          f"local write: duotf / TF = {write_ratio:.2f}x")
    for path in (ours, theirs):
        os.remove(path)
    os.rmdir(tmp)


if __name__ == "__main__":
    cli()
