"""Seeded shuffling of a training feed (``cluster.train(..., shuffle=True, seed=s)``).

A feed is shuffled in two places, each by a function of the seed, the epoch and positions in
the data alone, never of timing or of which task ran first, so the same seed gives every worker
the same rows in the same order on every engine and in every run:

1. **Which rows each worker gets** (the driver, :func:`partition_order`): the balanced plan deals
   the partitions' rows to the workers in a seeded order of partitions that changes every
   epoch, instead of the fixed interleaved order. A worker still reads its ranges in partition
   order (the order feeding tasks start in, so no task waits for one not yet started).
2. **The order of a worker's rows** (the node, :class:`Windows`): the rows a worker receives in
   an epoch are cut into consecutive windows of ``shuffle_buffer`` rows (by default about
   :data:`WINDOW_BYTES`: a whole number of rows from the columns' types and shapes alone, the
   same on every engine), and each window is permuted
   (:func:`permutation`) before ``main`` reads it. A window spans the ranges of several
   partitions where they are small, so rows from neighbouring partitions mix.

What it is not: a global shuffle. Two rows of one worker's epoch that lie more than a window
apart stay in their order of partitions; data sorted by a column across the whole DataFrame
(by label, say) should be repartitioned at random once (``df.repartition(n, rand(seed))``)
before it is fed, as it should for any windowed shuffle (``tf.data``'s ``shuffle(buffer)``,
petastorm's).
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np

from duotf._transport.columns import Columns, RaggedColumn

__all__ = ["WINDOW_BYTES", "partition_order", "permutation", "window_rows"]

#: the size of a node's shuffling window: the memory it holds beside its queue, per feed
WINDOW_BYTES = 64 << 20

_PLAN, _ROWS = 1, 2  # the streams of random numbers a seed gives (the plan's, the windows')


def partition_order(partitions: int, seed: int, epoch: int) -> List[int]:
    """The order in which epoch ``epoch``'s balanced plan deals the partitions' rows."""
    return np.random.default_rng([_PLAN, seed, epoch]).permutation(partitions).tolist()


def permutation(key: Sequence[int], window: int, rows: int) -> np.ndarray:
    """The order of the ``rows`` rows of window number ``window`` (from 0, in the epoch) of a
    worker; ``key``: ``(seed, epoch, target, ...)`` as the feeding tasks announce it."""
    return np.random.default_rng([_ROWS, *map(int, key[:3]), window]).permutation(rows)


def window_rows(cols: Columns, window_bytes: int = WINDOW_BYTES) -> int:
    """Rows in a window of about ``window_bytes``, from the columns' item sizes and row shapes
    alone (the same on every engine; a ragged or string column counts 64 bytes a row)."""
    row = 0
    for values in cols.values():
        if isinstance(values, np.ndarray):
            row += values.dtype.itemsize * int(np.prod(values.shape[1:], dtype=np.int64))
        else:  # a RaggedColumn or a list of strings
            row += 64
    return max(1, window_bytes // max(row, 1))


def take(cols: Columns, order: np.ndarray) -> Columns:
    """The rows of ``cols`` in ``order`` (a copy)."""
    out: Columns = {}
    for name, values in cols.items():
        if isinstance(values, RaggedColumn):
            out[name] = values.take(order)
        elif isinstance(values, list):
            out[name] = [values[i] for i in order.tolist()]
        else:
            out[name] = values[order]
    return out


class Windows:
    """The node's side: cuts an epoch's rows into windows and hands each out permuted.

    ``add(cols, key)`` gives the next rows received and the key of the range they belong to
    (None: a range not shuffled); it returns the whole windows they complete. ``flush()``
    returns the epoch's last, short window, and starts the next epoch."""

    def __init__(self, window_bytes: int = WINDOW_BYTES):
        self._window_bytes = window_bytes
        self._size: Optional[int] = None
        self._parts: List[Columns] = []
        self._held = 0
        self._key: Optional[Sequence[int]] = None
        self._index = 0

    @property
    def held(self) -> int:
        """Rows held for the current window."""
        return self._held

    def add(self, cols: Columns, key: Optional[Sequence[int]]) -> List[Columns]:
        from duotf._transport.columns import num_rows, slice_cols

        if key is None:
            return [*self.flush(False), cols]
        if self._key is None:
            self._key = list(key)
        if self._size is None:  # the key's 4th number: rows a window, or 0: about window_bytes
            self._size = int(key[3]) if len(key) > 3 and key[3] > 0 else window_rows(
                cols, self._window_bytes)
        out = []
        start, n = 0, num_rows(cols)
        while start < n:
            k = min(n - start, self._size - self._held)
            self._parts.append(slice_cols(cols, start, start + k))
            self._held += k
            start += k
            if self._held == self._size:
                out.extend(self.flush(False))
        return out

    def flush(self, epoch_end: bool = True) -> List[Columns]:
        """The window held so far, permuted ([] when empty); at an epoch's end the next window
        is the next epoch's first."""
        from duotf._transport.columns import concat_cols

        out = []
        if self._held:
            assert self._key is not None  # set with the first rows held
            cols = concat_cols(self._parts) if len(self._parts) > 1 else self._parts[0]
            out.append(take(cols, permutation(self._key, self._index, self._held)))
            self._index += 1
        self._parts, self._held = [], 0
        if epoch_end:
            self._key, self._index, self._size = None, 0, None
        return out
