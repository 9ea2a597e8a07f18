"""The task side of the engine feed: what a feeding task does with its partition.

A backend's feeding task calls :func:`train_partition` or :func:`infer_partition` with the
:class:`~duotf._transport.feeder.FeedJob` the driver planned and the partition as the engine gives it
(rows, a pandas frame, numpy arrays, column dicts, or a callable for the local backend); the
rows go out in columnar frames (:mod:`.feeder`). Spark's DataFrame tasks do the same from Arrow
batches (:mod:`duotf.backends.spark.tasks`).
"""

from __future__ import annotations

import itertools
from typing import Collection, Iterable, List, Optional

from duotf._transport.columns import Columns, chunked, num_rows, to_columns
from duotf._transport.feeder import FeedJob, feed_infer, feed_train

__all__ = ["chunks_of", "count_rows", "train_partition", "infer_partition", "assemble"]

CHUNK_ROWS = 4096


def chunks_of(part, ragged: Collection[str] = ()) -> Iterable[Columns]:
    """A partition of any kind as columnar chunks, without materializing row iterators.

    A callable (local backend) is called for a fresh iterator of rows or of column dicts, so
    the partition can be produced again for every epoch without being held in memory. Rows are
    checked as they become columns (:mod:`.columns`: nulls, ragged columns not in ``ragged``);
    a list partition is converted when its chunk is taken, so that the feeding task places a
    refusal in its partition (:func:`~duotf._transport.feeder.validated`).
    """
    if callable(part):
        it = iter(part())
        first = next(it, None)
        if first is None:
            return []
        if isinstance(first, dict):
            return itertools.chain([first], it)
        return chunked(itertools.chain([first], it), CHUNK_ROWS, ragged)
    if isinstance(part, dict):  # already columns
        return [part] if part and len(next(iter(part.values()))) else []
    if isinstance(part, (list, tuple)) or hasattr(part, "columns") or hasattr(part, "shape"):
        return (to_columns(p, ragged) for p in [part] if len(p))
    return chunked(part, CHUNK_ROWS, ragged)


def count_rows(part) -> int:
    """The rows of a partition of any kind :func:`chunks_of` takes, counted without converting
    (or checking) them."""
    if callable(part):
        return sum(num_rows(item) if isinstance(item, dict) else 1 for item in part())
    if isinstance(part, dict):
        return num_rows(part)
    if isinstance(part, (list, tuple)) or hasattr(part, "columns") or hasattr(part, "shape"):
        return len(part)
    return sum(1 for _ in part)


def train_partition(job: FeedJob, pid: int, part) -> int:
    """Feed one partition by the job's plan; return the rows the nodes accepted."""
    return feed_train(job, pid, chunks_of(part, job.ragged))


def assemble(part, pairs, keep: Optional[List[str]]):
    """The inference output of one partition, in the input's own kind."""
    import numpy as np

    results = [r for _, r in pairs]
    names = list(results[0]) if results else ["prediction"]

    def column(parts, name):
        values = [p[name] for p in parts]
        if values and isinstance(values[0], np.ndarray):
            return np.concatenate(values)
        return [v for chunk in values for v in chunk]

    if hasattr(part, "columns") and hasattr(part, "dtypes"):  # pandas in, pandas out
        kept = list(part.columns) if keep is None else keep
        out = part[kept].reset_index(drop=True).copy() if len(part) else part[kept].iloc[:0].copy()
        for name in names:
            values = column(results, name) if results else []
            out[name] = list(values) if getattr(values, "ndim", 1) > 1 else values
        return out
    if len(names) == 1:
        values = column(results, names[0]) if results else []
        if isinstance(part, np.ndarray):
            return np.asarray(values)
        return values.tolist() if isinstance(values, np.ndarray) else list(values)
    cols = {n: column(results, n) for n in names}
    return [dict(zip(names, row)) for row in zip(*cols.values())]


def infer_partition(job: FeedJob, pid: int, part, keep: Optional[List[str]]):
    """Feed one partition to its node; return its results as :func:`assemble` makes them."""
    return assemble(part, list(feed_infer(job, pid, chunks_of(part, job.ragged))), keep)
