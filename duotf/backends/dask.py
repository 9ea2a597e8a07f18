"""The Dask backend: one node per distinct worker, pinned to it.

Each node task is restricted to its worker (``workers=[addr], allow_other_workers=False``) and
never retried, so neither rescheduling nor work stealing can run a second copy; the driver also
rejects a node that registers twice. The task secedes from the worker's thread pool, so the
worker keeps its threads for other work while the node runs.
"""

from __future__ import annotations

import os
from typing import List
from urllib.parse import urlparse

from ..node import NodeOutcome
from .base import Backend, NodeFunction, NodeGang, ThreadGang, routable_ip


def _dask_node(fn: NodeFunction, node_id: int) -> NodeOutcome:
    from distributed import get_worker, secede

    address = get_worker().address
    secede()
    return fn(node_id, address, 0)


class DaskBackend(Backend):
    """Run nodes on the workers of a ``distributed.Client``."""

    name = "dask"

    def __init__(self, client):
        self.client = client
        self._owned_cluster = None

    def __repr__(self) -> str:
        return f"DaskBackend({self.client.scheduler.address!r})"

    @classmethod
    def from_name(cls) -> "DaskBackend":
        """An embedded ``LocalCluster`` with one worker process per core (at least 2)."""
        from distributed import Client, LocalCluster

        cluster = LocalCluster(
            n_workers=max(os.cpu_count() or 2, 2),
            threads_per_worker=2,
            processes=True,
            dashboard_address=None,
            host="127.0.0.1",
        )
        backend = cls(Client(cluster))
        backend._owned_cluster = cluster
        return backend

    def close(self) -> None:
        if self._owned_cluster is not None:
            self.client.close()
            self._owned_cluster.close()
            self._owned_cluster = None

    def _workers(self) -> List[str]:
        return sorted(self.client.scheduler_info(n_workers=-1)["workers"])

    def slots(self) -> int:
        return len(self._workers())

    def capacity_hint(self) -> str:
        return "duotf runs one node per Dask worker: start more workers or ask for fewer nodes."

    def start_nodes(self, fn: NodeFunction, n: int, job_id: str) -> NodeGang:
        workers = self._workers()[:n]
        futures = [
            self.client.submit(
                _dask_node, fn, i,
                key=f"duotf-{job_id}-node-{i}",
                workers=[workers[i]],
                allow_other_workers=False,
                pure=False,
                retries=0,
            )
            for i in range(n)
        ]
        client = self.client

        def call() -> List[NodeOutcome]:
            try:
                return client.gather(futures)
            finally:
                # Release the keys: a finished node must never be "recomputed elsewhere" when
                # its worker leaves.
                cancel()

        def cancel() -> None:
            if futures:
                client.cancel(list(futures))
                futures.clear()

        return ThreadGang(call, cancel=cancel, name="dask")

    def feed_hint(self) -> str:
        return "pass a Dask DataFrame, Bag or Array."

    def feed_adapter(self, data, nodes: int):
        if _kind(data) == "unknown":
            return super().feed_adapter(data, nodes)
        return _DaskFeed(self.client, data)

    def driver_host(self) -> str:
        host = urlparse(self.client.scheduler.address).hostname or "127.0.0.1"
        return routable_ip(host)


# -- the engine feed ----------------------------------------------------------------------------
class _DaskFeed:
    """Feeds a Dask DataFrame, Bag or Array: one feeding task per partition (row block)."""

    def __init__(self, client, data):
        self.client = client
        self.data = data
        self.kind = _kind(data)
        if self.kind == "arrays":  # (features, labels, ...): columns "0", "1", ... by row block
            import dask

            blocks = [a.rechunk({i: -1 for i in range(1, a.ndim)}).to_delayed().ravel() for a in data]
            self.data = data[0]
            self.parts = [dask.delayed(_columns)(*row) for row in zip(*blocks)]
            return
        if self.kind == "array":
            data = data.rechunk({i: -1 for i in range(1, data.ndim)})
            self.data = data
            self.parts = list(data.to_delayed().ravel())
        else:
            self.parts = list(data.to_delayed())

    def counts(self) -> List[int]:
        import dask

        if self.kind in ("array", "arrays"):
            return [int(c) for c in self.data.chunks[0]]
        return list(self.client.gather(self.client.compute([dask.delayed(len)(p) for p in self.parts])))

    def _gang(self, tasks, finish, name):
        futures = self.client.compute(tasks)
        client = self.client

        def call():
            try:
                return finish(client.gather(futures))
            finally:
                client.cancel(futures)

        return ThreadGang(call, cancel=lambda: client.cancel(futures), name=name)

    def train(self, job) -> NodeGang:
        import dask

        from ..feed.driver import train_partition

        tasks = [dask.delayed(train_partition)(job, i, p) for i, p in enumerate(self.parts)]
        return self._gang(tasks, lambda sent: list(sent), "dask-feed")

    def infer(self, job, keep, result_columns) -> NodeGang:
        import dask

        from ..feed.driver import infer_partition

        tasks = [dask.delayed(infer_partition)(job, i, p, keep) for i, p in enumerate(self.parts)]

        def finish(outputs):
            # The results are computed while the cluster runs, then handed back as a collection
            # of the input's kind, partition for partition.
            if self.kind == "dataframe":
                import dask.dataframe as dd

                with dask.config.set({"dataframe.convert-string": False}):
                    return [dd.from_pandas(_concat_frames(outputs), npartitions=len(outputs) or 1)
                            if outputs else self.data]
            if self.kind == "bag":
                import dask.bag as db

                return [db.from_sequence([x for part in outputs for x in part],
                                         npartitions=max(len(outputs), 1))]
            import dask.array as da
            import numpy as np

            return [da.from_array(np.concatenate(outputs), chunks=(self.data.chunks[0],) +
                                  tuple((-1,) * (np.concatenate(outputs).ndim - 1)))]

        return self._gang(tasks, finish, "dask-inference")


def _concat_frames(frames):
    import pandas as pd

    return pd.concat(frames, ignore_index=True)


def _columns(*blocks):
    return {str(i): block for i, block in enumerate(blocks)}


def _kind(data) -> str:
    if isinstance(data, tuple) and data and all(_kind(a) == "array" for a in data):
        if len({a.chunks[0] for a in data}) != 1:
            from ..errors import ConfigError

            raise ConfigError("the arrays of a tuple must have the same row chunks: "
                              "rechunk them alike (a.rechunk({0: b.chunks[0]}))")
        return "arrays"
    module = type(data).__module__ or ""
    if "dask.dataframe" in module or "dask_expr" in module or hasattr(data, "map_partitions") and hasattr(data, "columns"):
        return "dataframe"
    if module.startswith("dask.bag"):
        return "bag"
    if module.startswith("dask.array"):
        return "array"
    return "unknown"
