"""The driver side of the engine feed, used by ``Cluster.train`` and ``Cluster.inference``."""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any, Iterable, List, Optional

from ..errors import ClusterClosedError, ConfigError, FeedError
from .columns import Columns, chunked, num_rows, to_columns
from .feeder import FeedJob, balance, feed_infer, feed_train

logger = logging.getLogger(__name__)

CHUNK_ROWS = 4096


def chunks_of(part) -> Iterable[Columns]:
    """A partition of any kind as columnar chunks, without materializing row iterators.

    A callable (local backend) is called for a fresh iterator of rows or of column dicts, so
    the partition can be produced again for every epoch without being held in memory.
    """
    if callable(part):
        it = iter(part())
        first = next(it, None)
        if first is None:
            return []
        if isinstance(first, dict):
            return itertools.chain([first], it)
        return chunked(itertools.chain([first], it), CHUNK_ROWS)
    if isinstance(part, dict):  # already columns
        return [part] if part and len(next(iter(part.values()))) else []
    if isinstance(part, (list, tuple)) or hasattr(part, "columns") or hasattr(part, "shape"):
        return [to_columns(part)] if len(part) else []
    return chunked(part, CHUNK_ROWS)


def train_partition(job: FeedJob, pid: int, part) -> int:
    return feed_train(job, pid, chunks_of(part))


def assemble(part, pairs, keep: Optional[List[str]]):
    """The inference output of one partition, in the input's own kind."""
    import numpy as np

    results = [r for _, r in pairs]
    inputs = [i for i, _ in pairs]
    names = list(results[0]) if results else ["prediction"]

    def column(parts, name):
        values = [p[name] for p in parts]
        if values and isinstance(values[0], np.ndarray):
            return np.concatenate(values)
        return [v for chunk in values for v in chunk]

    if hasattr(part, "columns") and hasattr(part, "dtypes"):  # pandas in, pandas out
        import pandas as pd

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
    return assemble(part, list(feed_infer(job, pid, chunks_of(part))), keep)


def _targets(cluster):
    targets = [n for n in cluster.nodes if n.role.job in ("chief", "worker")]
    missing = [n.describe() for n in targets if n.feed_port is None]
    if missing:
        raise ConfigError(f"no feed port known for {', '.join(missing)}")
    return targets


def _job(cluster, mode: str, timeout: float, plan=None) -> FeedJob:
    targets = _targets(cluster)
    return FeedJob(
        secret=cluster._secret,
        addresses=[(n.host, n.feed_port) for n in targets],
        labels=[n.describe() for n in targets],
        mode=mode,
        timeout=timeout,
        plan=plan,
    )


_TERMINATED = object()


def _terminated(cluster) -> bool:
    return any(n.feed_terminated for n in cluster.nodes)


def _await(cluster, gang, what: str):
    """Wait for a feeding job while watching the cluster; a node failure wins and cancels it.

    Returns ``_TERMINATED`` when a node called ``feed.terminate()``: the job is cancelled and
    whatever its tasks say about nodes that stopped reading is not an error.
    """

    def wake():
        with cluster._cond:
            cluster._cond.notify_all()

    gang.add_done_callback(wake)  # the next epoch starts at once, not at the next poll
    while True:
        with cluster._cond:
            if cluster._error is not None or cluster.status.value == "closed":
                gang.cancel()
                cluster._raise_if_failed()
            if _terminated(cluster):
                break
            if gang.done():
                break
            cluster._cond.wait(0.1)
    if _terminated(cluster):
        gang.cancel()
        gang.join(30)
        return _TERMINATED
    exc = gang.exception()
    if exc is None:
        return gang.outcomes()
    # A node that died makes its feeding task fail too: report the node's own error, which
    # arrives over the rendezvous within milliseconds.
    deadline = time.monotonic() + 3
    with cluster._cond:
        while cluster._error is None and time.monotonic() < deadline:
            cluster._cond.wait(0.1)
        if cluster._error is not None:
            cluster._error_delivered = True
            raise cluster._error from exc
    if isinstance(exc, FeedError):
        raise exc
    text = str(exc)
    found = [line for line in text.splitlines() if "FeedError:" in line]
    message = found[-1].split("FeedError:", 1)[1].strip() if found else f"{type(exc).__name__}: {text[:2000]}"
    raise FeedError(f"{what} failed: {message}", partition=None, node=None) from exc


def _markers(cluster, kind: str, timeout: float) -> None:
    """Queue an epoch/end marker on every target, on the data path, and wait for each ack."""
    from . import wire

    for node in _targets(cluster):
        try:
            sock = wire.connect((node.host, node.feed_port), cluster._secret, timeout)
            try:
                wire.send_frame(sock, "marker", marker=kind)
                wire.recv_frame(sock)  # "ack", or "terminated"
            finally:
                sock.close()
        except OSError as exc:
            if node.state in ("done", "returned", "stopped") or node.feed_terminated:
                continue  # this node needs no marker any more
            with cluster._cond:
                deadline = time.monotonic() + 3
                while cluster._error is None and time.monotonic() < deadline:
                    cluster._cond.wait(0.1)
            cluster._raise_if_failed()
            raise FeedError(f"could not send the {kind} marker to {node.describe()}: {exc}",
                            partition=None, node=node.describe()) from exc


def train(cluster, data, epochs: int, feed_timeout: float, balanced: bool) -> dict:
    if cluster.status.value != "running":
        cluster._raise_if_failed()
        raise ClusterClosedError(f"{cluster!r} is not running")
    if epochs < 1:
        raise ConfigError(f"epochs={epochs}: must be >= 1")
    adapter = cluster.backend.feed_adapter(data, len(cluster.nodes))
    targets = _targets(cluster)
    counts = adapter.counts()
    plan, per, dropped = balance(counts, len(targets), drop_remainder=balanced)
    if dropped:
        logger.warning("duotf: %d rows left over after giving each of %d workers %d rows are not "
                       "fed (balance=False feeds everything, unevenly)", dropped, len(targets), per)
    job = _job(cluster, "train", feed_timeout, plan)
    t0 = time.monotonic()
    fed, done = 0, 0
    for epoch in range(epochs):
        t1 = time.monotonic()
        sent = _await(cluster, adapter.train(job), f"feeding epoch {epoch + 1}")
        if sent is _TERMINATED:
            break
        fed += sum(sent)
        done += 1
        t2 = time.monotonic()
        _markers(cluster, "epoch", feed_timeout)
        logger.debug("duotf: epoch %d fed in %.3f s, its markers acknowledged in %.3f s",
                     epoch + 1, t2 - t1, time.monotonic() - t2)
    _markers(cluster, "end", feed_timeout)
    return {"epochs": done, "rows": sum(counts), "rows_fed": fed, "rows_per_worker": per,
            "rows_dropped_per_epoch": dropped, "terminated": _terminated(cluster),
            "seconds": time.monotonic() - t0}


def inference(cluster, data, keep, result_columns, feed_timeout: float):
    if cluster.status.value != "running":
        cluster._raise_if_failed()
        raise ClusterClosedError(f"{cluster!r} is not running")
    adapter = cluster.backend.feed_adapter(data, len(cluster.nodes))
    job = _job(cluster, "infer", feed_timeout)
    (output,) = _await(cluster, adapter.infer(job, keep, result_columns), "inference")
    _markers(cluster, "end", feed_timeout)
    return output
