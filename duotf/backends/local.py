"""The in-process backend: node agents run as threads of the driver process.

Each node still runs in a process of its own, so ``main`` sees exactly what it sees on Spark or
Dask; only the engine is missing. It is the embedded default and the fast backend of the tests.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import List, Optional

from ..node import NodeOutcome
from .base import Backend, EngineJob, FeedAdapter, NodeFunction, ThreadJob, count_error


class LocalBackend(Backend):
    """Run nodes on this machine without an engine.

    Parameters
    ----------
    slots:
        How many nodes may run at once (default: 32).
    """

    name = "local"

    def __init__(self, slots: Optional[int] = None):
        self._slots = slots if slots is not None else 32

    def __repr__(self) -> str:
        return f"LocalBackend(slots={self._slots})"

    def slots(self) -> int:
        return self._slots

    def capacity_hint(self) -> str:
        return "Ask for fewer nodes or pass duotf.backends.LocalBackend(slots=...)."

    def start_nodes(self, fn: NodeFunction, n: int, job_id: str) -> EngineJob:
        executor = f"local-{socket.gethostname()}-{os.getpid()}"

        def call() -> List[NodeOutcome]:
            results: List[Optional[NodeOutcome]] = [None] * n
            errors: List[BaseException] = []

            def one(i: int) -> None:
                try:
                    results[i] = fn(i, executor, 0)
                except BaseException as exc:
                    errors.append(exc)

            threads = [
                threading.Thread(target=one, args=(i,), name=f"duotf-local-node-{i}", daemon=True)
                for i in range(n)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if errors:
                raise errors[0]
            return [r for r in results if r is not None]

        # Agents end themselves when the driver's rendezvous server closes; nothing to cancel.
        return ThreadJob(call, cancel=lambda: None, name="local")

    def feed_hint(self) -> str:
        return ("pass a list of partitions: lists of rows, pandas DataFrames, numpy arrays, or "
                "callables that return an iterator of rows or of column dicts.")

    def feed_adapter(self, data, nodes: int) -> FeedAdapter:
        if not isinstance(data, (list, tuple)):
            return super().feed_adapter(data, nodes)
        return LocalFeed(list(data))


def _parallel(calls, width: int = 4) -> list:
    """Run the calls in up to ``width`` threads; results in order; the first error is raised."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=width, thread_name_prefix="duotf-local-feed") as pool:
        return list(pool.map(lambda call: call(), calls))


class LocalFeed(FeedAdapter):
    """A list of partitions, fed from threads of the driver (up to 4 at once)."""

    def __init__(self, parts: list):
        self.parts = parts

    def counts(self) -> List[int]:
        from ..feed.tasks import count_rows

        counts = []
        for pid, part in enumerate(self.parts):
            try:
                counts.append(count_rows(part))
            except Exception as exc:
                raise count_error(pid, exc) from exc
        return counts

    def train(self, job) -> EngineJob:
        from ..feed import tasks

        calls = [lambda i=i, p=p: tasks.train_partition(job, i, p) for i, p in enumerate(self.parts)]
        return ThreadJob(lambda: _parallel(calls), cancel=lambda: None, name="local-feed")

    def infer(self, job, keep, result_columns) -> EngineJob:
        from ..feed import tasks

        calls = [lambda i=i, p=p: tasks.infer_partition(job, i, p, keep) for i, p in enumerate(self.parts)]
        return ThreadJob(lambda: _parallel(calls), cancel=lambda: None, name="local-feed")
