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
from .base import Backend, EngineJob, NodeFunction, ThreadJob, routable_ip


def _dask_node(fn: NodeFunction, node_id: int) -> NodeOutcome:
    from distributed import get_worker, secede

    address = get_worker().address
    secede()
    return fn(node_id, address, 0)


class DaskBackend(Backend):
    """Run nodes on the workers of a ``distributed.Client``."""

    name = "dask"

    @classmethod
    def accepts(cls, obj) -> bool:
        """A ``distributed.Client``."""
        return type(obj).__module__.startswith("distributed") and hasattr(obj, "scheduler_info")

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

    def start_nodes(self, fn: NodeFunction, n: int, job_id: str) -> EngineJob:
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

        return ThreadJob(call, cancel=cancel, name="dask")

    def feed_hint(self) -> str:
        return "pass a Dask DataFrame, Bag or Array."

    def feed_adapter(self, data, nodes: int):
        from .dask_feed import DaskFeed, kind_of

        if kind_of(data) is None:
            return super().feed_adapter(data, nodes)
        return DaskFeed(self.client, data)

    def driver_host(self) -> str:
        host = urlparse(self.client.scheduler.address).hostname or "127.0.0.1"
        return routable_ip(host)
