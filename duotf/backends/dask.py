"""The Dask backend: one node per distinct worker, pinned to it.

Each node task is restricted to its worker (``workers=[addr], allow_other_workers=False``) and
never retried, so neither rescheduling nor work stealing can run a second copy; the driver also
rejects a node that registers twice. Clusters started side by side through one backend
(:func:`duotf.run_parallel`) are spread over the workers: each node goes to the worker that runs
the fewest of this backend's nodes (ties by address), so two 1-node runs on two workers never
share one. The task secedes from the worker's thread pool, so the
worker keeps its threads for other work while the node runs.

The workers are listed by one call to the scheduler (``Client.nthreads``), never from the
Client's cached ``scheduler_info``, which its own periodic refresh rewrites (with no workers
in it) while a caller reads it. A node whose worker leaves ends the job at once: its task would
otherwise wait for ever for a worker of that address.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Dict, List
from urllib.parse import urlparse

from ..errors import BackendError, InsufficientSlotsError
from ..node import NodeOutcome
from .base import Backend, EngineJob, NodeFunction, ThreadJob, routable_ip

logger = logging.getLogger(__name__)


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

    def __init__(self, client, slot_wait: float = 5.0):
        self.client = client
        #: seconds to wait for workers (a nanny restarting one) before giving up on capacity
        self.slot_wait = slot_wait
        self._owned_cluster = None
        self._lock = threading.Lock()
        self._placed: Dict[str, int] = {}  # worker -> this backend's nodes running there

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
        """The scheduler's workers now, by address: one RPC, one consistent answer."""
        return sorted(self.client.nthreads())

    def _enough_workers(self, nodes: int) -> List[str]:
        """One list of at least ``nodes`` workers, waiting up to ``slot_wait`` for them; raise
        :class:`InsufficientSlotsError` with the last list seen."""
        deadline = time.monotonic() + self.slot_wait
        while True:
            workers = self._workers()
            if len(workers) >= nodes or time.monotonic() >= deadline:
                break
            logger.debug("dask: %d workers for %d nodes; waiting", len(workers), nodes)
            time.sleep(0.1)  # a worker restarting or joining
        if len(workers) < nodes:
            raise InsufficientSlotsError(
                f"the cluster needs {nodes} nodes running at once but the dask backend has "
                f"{len(workers)} workers after waiting slot_wait={self.slot_wait:g} s "
                f"({', '.join(workers) or 'none'}). {self.capacity_hint()}",
                needed=nodes, available=len(workers), backend=self.name,
            )
        return workers

    def slots(self) -> int:
        return len(self._workers())

    def check_capacity(self, nodes: int) -> None:
        self._enough_workers(nodes)

    def capacity_hint(self) -> str:
        return "duotf runs one node per Dask worker: start more workers or ask for fewer nodes."

    def start_nodes(self, fn: NodeFunction, n: int, job_id: str, names=None) -> EngineJob:
        workers = self._place(self._enough_workers(n), n)  # from exactly the list counted
        try:
            futures = self._submit(fn, workers, job_id, names or [str(i) for i in range(n)])
        except BaseException:
            self._release(workers)
            raise
        client = self.client

        def call() -> List[NodeOutcome]:
            from distributed import wait

            mine = list(futures)  # cancel() empties the shared list from another thread
            try:
                while True:
                    try:
                        wait(mine, timeout=0.25)
                        break
                    except TimeoutError:
                        pass
                    # A task pinned to a worker that left waits for ever ("no-worker"): give up
                    # on it as soon as its worker is gone (a nanny's restart is a new address).
                    alive = set(client.nthreads())
                    gone = [i for i, f in enumerate(mine)
                            if not f.done() and workers[i] not in alive]
                    if gone:
                        raise BackendError(
                            "the Dask worker running " + ", ".join(
                                f"node {i} ({workers[i]})" for i in gone)
                            + " left the cluster (its process died or was restarted)")
                return client.gather(mine)
            finally:
                # Release the keys: a finished node must never be "recomputed elsewhere" when
                # its worker leaves.
                cancel()
                self._release(workers)

        def cancel() -> None:
            if futures:
                client.cancel(list(futures))
                futures.clear()

        return ThreadJob(call, cancel=cancel, name="dask")

    def _place(self, workers: List[str], n: int) -> List[str]:
        """``n`` distinct workers of ``workers``, those running the fewest of this backend's
        nodes first (ties by address), counted as busy until :meth:`_release`."""
        with self._lock:
            chosen = sorted(workers, key=lambda w: (self._placed.get(w, 0), w))[:n]
            for w in chosen:
                self._placed[w] = self._placed.get(w, 0) + 1
        return chosen

    def _release(self, workers: List[str]) -> None:
        with self._lock:
            for w in workers:
                left = self._placed.get(w, 0) - 1
                if left > 0:
                    self._placed[w] = left
                else:
                    self._placed.pop(w, None)

    def _submit(self, fn: NodeFunction, workers: List[str], job_id: str, names) -> list:
        # The key is what the dashboard shows: "duotf-node-worker-1-<job id>".
        return [
            self.client.submit(
                _dask_node, fn, i,
                key=f"duotf-node-{names[i]}-{job_id}",
                workers=[workers[i]],
                allow_other_workers=False,
                pure=False,
                retries=0,
            )
            for i in range(len(workers))
        ]

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
