"""The feed plan is deterministic: the same data and spec give every worker the same rows in the
same order on every engine and every run, so the same program trains the same weights."""

from __future__ import annotations

import numpy as np

import duotf
from duotf.testing.suite.data import epoch_rows
from duotf.testing.suite import mains

SIZES = [30, 9, 52, 17]  # more partitions than workers, uneven: ranges split across workers
WIDTH, BATCH, LR, EPOCHS = 3, 8, 0.05, 3


def seeded_parts():
    """Rows ``(x0, x1, x2, y)`` of a noisy linear function, ``SIZES[p]`` of them in partition p."""
    rng = np.random.default_rng(7)
    parts, start = [], 0
    for size in SIZES:
        x = rng.normal(size=(size, WIDTH))
        y = x @ np.array([1.5, -2.0, 0.5]) + 0.3 + rng.normal(scale=0.1, size=size)
        parts.append([tuple(row) + (float(t),) for row, t in zip(x.tolist(), y.tolist())])
        start += size
    return parts


def one_process_reference(parts, workers: int = 2, seed=None, window: int = 0):
    """What each worker must compute: its rows of every epoch (:func:`epoch_rows`), in batches
    that never span an epoch."""
    out = []
    for t in range(workers):
        w, b = np.zeros(WIDTH), 0.0
        for epoch in range(1, EPOCHS + 1):
            rows = epoch_rows(parts, workers, epoch, seed, window)
            for i in range(0, len(rows[t]), BATCH):
                a = np.asarray(rows[t][i:i + BATCH], dtype=np.float64)
                x, y = a[:, :-1], a[:, -1]
                err = x @ w + b - y
                w = w - LR * (x.T @ err) / len(y)
                b = b - LR * float(err.mean())
        out.append({"w": w.tolist(), "b": b})
    return out


def test_engine_fed_training_gives_the_same_weights_on_every_engine_and_run(backend, engine):
    parts = seeded_parts()
    expected = one_process_reference(parts)
    args = {"width": WIDTH, "batch": BATCH, "lr": LR}
    for _ in range(2):
        with duotf.run(mains.sgd_main, args, backend, duotf.ClusterSpec(workers=2)) as cluster:
            cluster.train(engine.rows(parts), epochs=EPOCHS)
            got = cluster.wait(timeout=120)
        assert got == expected  # bit for bit: the same rows, in the same order, in the same batches


def test_a_shuffled_feed_gives_the_same_weights_on_every_engine_and_run(backend, engine):
    """shuffle=True with a seed: each epoch deals the partitions out in an order of its own and
    each node permutes its rows by windows (10 rows here: several windows an epoch, across
    ranges), all from the seed, the epoch and the data; so bit for bit the same weights as the
    one-process reference on every engine. (One run each: the plain test above runs twice to
    catch a race between feeding tasks; the shuffle adds no timing of its own.)"""
    parts = seeded_parts()
    expected = one_process_reference(parts, seed=11, window=10)
    assert expected != one_process_reference(parts)  # the shuffled order differs from the plain one
    args = {"width": WIDTH, "batch": BATCH, "lr": LR}
    with duotf.run(mains.sgd_main, args, backend, duotf.ClusterSpec(workers=2)) as cluster:
        report = cluster.train(engine.rows(parts), epochs=EPOCHS, shuffle=True, seed=11,
                               shuffle_buffer=10)
        got = cluster.wait(timeout=120)
    assert report["shuffle_seed"] == 11
    assert got == expected
