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

from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from duotf._transport.columns import Columns, RaggedColumn

__all__ = ["WINDOW_BYTES", "partition_order", "permutation", "window_rows"]

#: the size of a node's shuffling window: the memory it holds beside its queue, per feed. Under
#: the 32 MiB above which a node's C heap maps fresh pages for every allocation
#: (:mod:`duotf._transport.malloc`): a window's arrays then reuse freed heap memory. Measured
#: (784 float32 a row, frames of 4 MiB): 30 MiB windows took 0.97 M rows/s a core, 64 MiB
#: windows 0.17 M (page faults).
WINDOW_BYTES = 30 << 20

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
    returns the epoch's last, short window, and starts the next epoch.

    A window's number columns are written once, each row straight to its permuted place in
    an array of the window's size, as the rows arrive (one copy; the received frames are free
    at once). Ragged and string columns are gathered when the window is complete. The epoch's
    last window is shorter than planned: its rows are read back in arrival order and permuted
    by its own size (one more copy, for that window alone)."""

    def __init__(self, window_bytes: int = WINDOW_BYTES):
        self._window_bytes = window_bytes
        self._size: Optional[int] = None
        self._key: Optional[Sequence[int]] = None
        self._index = 0
        self._held = 0
        self._order: Optional[np.ndarray] = None  # the full window's permutation
        self._places: Optional[np.ndarray] = None  # its inverse: where each arriving row goes
        self._arrays: Dict[str, np.ndarray] = {}  # number columns, written in place
        self._parts: Dict[str, List[Any]] = {}  # other columns, by part, in arrival order
        self._names: List[str] = []

    @property
    def held(self) -> int:
        """Rows held for the current window."""
        return self._held

    def add(self, cols: Columns, key: Optional[Sequence[int]]) -> List[Columns]:
        from duotf._transport.columns import num_rows

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
            self._put(cols, start, start + k)
            start += k
            if self._held == self._size:
                out.append(self._complete())
        return out

    def _put(self, cols: Columns, start: int, stop: int) -> None:
        assert self._key is not None and self._size is not None  # add() set them
        if self._order is None:  # the window's first rows
            self._order = permutation(self._key, self._index, self._size)
            self._places = np.empty_like(self._order)
            self._places[self._order] = np.arange(self._size)
            self._names = list(cols)
            for name, values in cols.items():
                if isinstance(values, np.ndarray):
                    self._arrays[name] = np.empty((self._size, *values.shape[1:]), values.dtype)
                else:
                    self._parts[name] = []
        assert self._places is not None
        places = self._places[self._held:self._held + stop - start]
        for name, values in cols.items():
            if name in self._arrays:
                self._arrays[name][places] = values[start:stop]
            else:
                self._parts[name].append(values[start:stop])
        self._held += stop - start

    def _complete(self) -> Columns:
        assert self._order is not None
        out: Columns = {}
        for name in self._names:
            if name in self._arrays:
                out[name] = self._arrays[name]
            else:
                out[name] = take({name: _joined(self._parts[name])}, self._order)[name]
        self._start_window()
        return out

    def _start_window(self) -> None:
        self._index += 1
        self._held = 0
        self._order = self._places = None
        self._arrays, self._parts = {}, {}

    def flush(self, epoch_end: bool = True) -> List[Columns]:
        """The window held so far, permuted ([] when empty); at an epoch's end the next window
        is the next epoch's first."""
        out = []
        if self._held:
            assert self._key is not None and self._places is not None  # set with the first rows
            held = self._held
            arrived = self._places[:held]  # where the rows, in arrival order, were written
            cols: Columns = {name: (self._arrays[name][arrived] if name in self._arrays
                                    else _joined(self._parts[name])) for name in self._names}
            out.append(take(cols, permutation(self._key, self._index, held)))
            self._start_window()
        if epoch_end:
            self._key, self._index, self._size = None, 0, None
        return out


def _joined(parts: List[Any]) -> Any:
    """One column from its parts (RaggedColumns or lists)."""
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], RaggedColumn):
        return RaggedColumn.concat(parts)
    return [v for part in parts for v in part]
