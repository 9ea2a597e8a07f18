"""The Dask backend's feed: a Dask DataFrame, Bag, Array or tuple of Arrays, one feeding task per
partition (row block), run on the cluster's workers beside the nodes.

Inference output stays distributed: the tasks' results are kept on the workers (futures) and
handed back as a collection of the input's kind with one output partition per input partition.
"""

from __future__ import annotations

from typing import List, Optional

from ..errors import ConfigError
from .base import EngineJob, FeedAdapter, ThreadJob

__all__ = ["DaskFeed", "kind_of"]


def kind_of(data) -> Optional[str]:
    """"dataframe", "bag", "array", "arrays" (a tuple of arrays), or None."""
    if isinstance(data, tuple) and data and all(kind_of(a) == "array" for a in data):
        if len({a.chunks[0] for a in data}) != 1:
            raise ConfigError("the arrays of a tuple must have the same row chunks: "
                              "rechunk them alike (a.rechunk({0: b.chunks[0]}))")
        return "arrays"
    module = type(data).__module__ or ""
    if ("dask.dataframe" in module or "dask_expr" in module
            or hasattr(data, "map_partitions") and hasattr(data, "columns")):
        return "dataframe"
    if module.startswith("dask.bag"):
        return "bag"
    if module.startswith("dask.array"):
        return "array"
    return None


def _columns(*blocks):
    return {str(i): block for i, block in enumerate(blocks)}


def _empty_like(part):
    return part.iloc[:0] if hasattr(part, "iloc") else part[:0]


class DaskFeed(FeedAdapter):
    """Feeds a Dask DataFrame, Bag or Array: one feeding task per partition (row block)."""

    def __init__(self, client, data):
        import dask

        self.client = client
        self.data = data
        self.kind = kind_of(data)
        if self.kind == "arrays":  # (features, labels, ...): columns "0", "1", ... by row block
            blocks = [a.rechunk({i: -1 for i in range(1, a.ndim)}).to_delayed().ravel() for a in data]
            self.data = data[0]
            self.parts = [dask.delayed(_columns)(*row) for row in zip(*blocks)]
        elif self.kind == "array":
            self.data = data.rechunk({i: -1 for i in range(1, data.ndim)})
            self.parts = list(self.data.to_delayed().ravel())
        else:
            self.parts = list(data.to_delayed())

    def counts(self) -> List[int]:
        import dask

        if self.kind in ("array", "arrays"):
            return [int(c) for c in self.data.chunks[0]]
        return list(self.client.gather(self.client.compute([dask.delayed(len)(p) for p in self.parts])))

    def _run(self, tasks, finish, name: str) -> EngineJob:
        client = self.client
        # Partition order is the scheduler's order too: a node queues its ranges in partition
        # order (see duotf.planner.balance), so a task never waits on one not yet started.
        futures = [client.compute(task, priority=len(tasks) - i) for i, task in enumerate(tasks)]

        def call():
            try:
                return finish(futures)
            except BaseException:
                client.cancel(futures)
                raise

        return ThreadJob(call, cancel=lambda: client.cancel(futures), name=name)

    def train(self, job) -> EngineJob:
        import dask

        from ..feed.tasks import train_partition

        tasks = [dask.delayed(train_partition)(job, i, p) for i, p in enumerate(self.parts)]

        def finish(futures):
            try:
                return list(self.client.gather(futures))
            finally:
                self.client.cancel(futures)  # counts only: nothing to keep

        return self._run(tasks, finish, "dask-feed")

    def infer(self, job, keep, result_columns) -> EngineJob:
        import dask

        from ..feed.tasks import infer_partition

        tasks = [dask.delayed(infer_partition)(job, i, p, keep) for i, p in enumerate(self.parts)]
        return self._run(tasks, self._collection, "dask-inference")

    def _collection(self, futures):
        """Wait for every partition's results while the cluster runs, and wrap the futures
        (the results stay on the workers) in a collection of the input's kind."""
        import dask
        from distributed import wait

        wait(futures)
        for future in futures:
            if future.status == "error":
                future.result()  # raises the task's own error
        client = self.client
        if self.kind == "dataframe":
            import dask.dataframe as dd

            meta = client.submit(_empty_like, futures[0]).result()
            return dd.from_delayed(futures, meta=meta, verify_meta=False)
        if self.kind == "bag":
            import dask.bag as db

            return db.from_delayed([dask.delayed(f) for f in futures])
        import dask.array as da

        first = client.submit(_empty_like, futures[0]).result()
        rows = self.data.chunks[0]
        blocks = [da.from_delayed(dask.delayed(f), shape=(n,) + first.shape[1:], dtype=first.dtype)
                  for f, n in zip(futures, rows)]
        return da.concatenate(blocks) if blocks else da.from_array(first)
