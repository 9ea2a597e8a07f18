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

With ``ClusterSpec(gpus_per_node=k)`` nodes go only to workers that declare a ``GPU`` resource
of ``k`` or more (``dask worker ... --resources GPU=n``), and each node task asks for
``resources={"GPU": k}``, so Dask's own accounting keeps other GPU tasks off those devices. A
worker's GPUs are addresses ``0..n-1``: the first ``n`` entries of its ``CUDA_VISIBLE_DEVICES``
where set (dask-cuda puts a worker's own device first), else devices ``0..n-1``. A worker holds
``n // k`` of this backend's nodes at once, each on its own ``k`` addresses.
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Set, Tuple
from urllib.parse import urlparse

from duotf.errors import BackendError, ConfigError, InsufficientSlotsError
from duotf._node.agent import NodeOutcome
from duotf._deadline import Deadline
from duotf.backends.base import Backend, EngineJob, NodeFunction, ThreadJob, routable_ip

if TYPE_CHECKING:
    from distributed import LocalCluster

logger = logging.getLogger(__name__)


def _dask_node(fn: NodeFunction, node_id: int, gpus: Sequence[str] = ()) -> NodeOutcome:
    from distributed import get_worker, secede

    address = get_worker().address
    secede()
    if gpus:
        return fn(node_id, address, 0, gpus=list(gpus))
    return fn(node_id, address, 0)


#: seconds a connection to a worker on an avoided host is given to open (a host back answers
#: at once)
AVOID_PROBE = 0.5


def _host(address: str) -> str:
    """The host of a worker's address (``tcp://10.0.0.5:40123`` -> ``10.0.0.5``)."""
    return address.split("://", 1)[-1].rsplit(":", 1)[0]


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
        self._owned_cluster: Optional[LocalCluster] = None
        self._lock = threading.Lock()
        self._placed: Dict[str, int] = {}  # worker -> this backend's nodes running there
        self._avoided: Set[str] = set()  # hosts whose nodes were lost with their network
        #: worker -> the GPU slots (k addresses each) its nodes of this backend hold
        self._gpu_held: Dict[str, Set[int]] = {}

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
        deadline = Deadline.after(self.slot_wait)
        while True:
            workers = self._workers()
            if len(workers) >= nodes or deadline.expired:
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

    def _gpu_workers(self) -> Dict[str, float]:
        """Every worker now with the ``GPU`` resource it declares (0 where none): one RPC."""
        from distributed import Scheduler

        # every worker: distributed >= 2025 lists 5 unless asked for all (n_workers=-1), which
        # an older scheduler's identity() does not take (it lists all)
        every = {"n_workers": -1} if "n_workers" in inspect.signature(Scheduler.identity).parameters else {}
        info = self.client.sync(self.client.scheduler.identity, **every)
        return {address: float((w.get("resources") or {}).get("GPU", 0))
                for address, w in info["workers"].items()}

    def check_gpus(self, nodes: int, per_node: int) -> int:
        gpus = self._gpu_workers()
        if not any(gpus.values()):
            raise ConfigError(
                f"ClusterSpec(gpus_per_node={per_node}) asks for GPUs, but no worker of this "
                "Dask cluster declares a GPU resource: start the workers with "
                "`dask worker <scheduler> --resources GPU=n` (LocalCluster(resources={'GPU': n}); "
                "dask-cuda: --resources GPU=1), n being the devices of the worker's "
                "CUDA_VISIBLE_DEVICES, or set gpus_per_node=0.")
        able = sorted(w for w, g in gpus.items() if g >= per_node)
        if len(able) < nodes:
            raise InsufficientSlotsError(
                f"the cluster needs {nodes} nodes of {per_node} GPUs each, one node a worker, "
                f"but {len(able)} Dask workers declare GPU={per_node} or more "
                f"({', '.join(f'{w}: {g:g}' for w, g in sorted(gpus.items()))}). Start more "
                f"workers with --resources GPU={per_node}, or ask for fewer nodes or GPUs.",
                needed=nodes, available=len(able), backend=self.name)
        return sum(int(g // per_node) for g in gpus.values())

    def start_nodes(self, fn: NodeFunction, n: int, job_id: str,
                    gpus_per_node: int = 0, names=None) -> EngineJob:
        k = gpus_per_node
        if k:
            held = self._place_gpus(n, k)
            workers = [w for w, _ in held]
            gpus = [[str(slot * k + i) for i in range(k)] for _, slot in held]
        else:
            held = []
            workers = self._place(self._enough_workers(n), n)  # from exactly the list counted
            gpus = [[] for _ in workers]
        try:
            futures = self._submit(fn, workers, job_id, gpus,
                                   names or [str(i) for i in range(n)])
        except BaseException:
            self._release(workers, held)
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
                self._release(workers, held)

        def cancel() -> None:
            if futures:
                client.cancel(list(futures))
                futures.clear()

        return ThreadJob(call, cancel=cancel, name="dask")

    def avoid_hosts(self, hosts) -> int:
        """Place nodes and feeding tasks on ``hosts`` last, until a host answers again (see
        :meth:`_avoiding`): the scheduler lists a worker it cannot reach until
        ``distributed.scheduler.worker-ttl`` (5 min) passes, and a restarted node placed there
        would hang as the last did. Last, not never: with too few workers elsewhere a node
        still goes there. The workers on other hosts."""
        with self._lock:
            self._avoided |= set(hosts)
        # a restart waits for these workers, not for those of a host that does not answer
        return sum(1 for w in self._workers() if _host(w) not in self._avoided)

    def _avoiding(self, workers: List[str]) -> Set[str]:
        """The hosts avoided now: those :meth:`avoid_hosts` named, less each whose worker
        accepts a connection again (probed for :data:`AVOID_PROBE` s; a host back on the
        network is used as before)."""
        import socket

        with self._lock:
            avoided = set(self._avoided)
        for host in avoided:
            for address in (w for w in workers if _host(w) == host):
                try:
                    socket.create_connection((host, int(address.rsplit(":", 1)[1])), timeout=AVOID_PROBE).close()
                except (OSError, ValueError):
                    continue
                with self._lock:
                    self._avoided.discard(host)
                logger.info("duotf: host %s answers again: Dask nodes and feeding tasks may run there", host)
                break
        with self._lock:
            return set(self._avoided)

    def _feed_where(self) -> dict:
        """Where feeding tasks may run (keywords of ``client.submit``): anywhere, or, while
        :meth:`avoid_hosts` hosts do not answer, on the workers of the others first (loosely: a
        task still runs on an avoided host when no other worker is left)."""
        if not self._avoided:
            return {}
        workers = self._workers()
        avoided = self._avoiding(workers)
        if not avoided:
            return {}
        usable = [w for w in workers if _host(w) not in avoided]
        return {"workers": usable, "allow_other_workers": True} if usable else {}

    def _place(self, workers: List[str], n: int) -> List[str]:
        """``n`` distinct workers of ``workers``, spread over hosts: each next one on a host
        not avoided (:meth:`avoid_hosts`), then on the host with the fewest chosen so far, then
        running the fewest of this backend's nodes (ties by address); counted as busy until
        :meth:`_release`."""
        avoided = self._avoiding(workers) if self._avoided else set()
        with self._lock:
            chosen: List[str] = []
            on_host: Dict[str, int] = {}
            left = sorted(workers, key=lambda w: (self._placed.get(w, 0), w))
            for _ in range(min(n, len(left))):
                best = min(left, key=lambda w: (_host(w) in avoided, on_host.get(_host(w), 0)))
                left.remove(best)
                chosen.append(best)
                on_host[_host(best)] = on_host.get(_host(best), 0) + 1
            for w in chosen:
                self._placed[w] = self._placed.get(w, 0) + 1
        return chosen

    def _place_gpus(self, n: int, k: int) -> List[Tuple[str, int]]:
        """``n`` distinct workers, each with a GPU slot (``k`` of its addresses) that none of
        this backend's running nodes holds: ``(worker, slot)``, held until :meth:`_release`.
        Workers running the fewest of this backend's nodes first (ties by address)."""
        gpus = self._gpu_workers()
        with self._lock:
            free = {w: [s for s in range(int(g // k)) if s not in self._gpu_held.get(w, ())]
                    for w, g in gpus.items()}
            able = sorted((w for w in free if free[w]), key=lambda w: (self._placed.get(w, 0), w))
            if len(able) < n:
                raise InsufficientSlotsError(
                    f"the cluster needs {n} nodes of {k} GPUs each, one node a worker, but "
                    f"{len(able)} Dask workers have {k} GPUs free now (declared: "
                    f"{', '.join(f'{w}: {g:g}' for w, g in sorted(gpus.items()))}). Start more "
                    f"workers with --resources GPU={k}, or run fewer clusters at once.",
                    needed=n, available=len(able), backend=self.name)
            held = [(w, free[w][0]) for w in able[:n]]
            for w, slot in held:
                self._placed[w] = self._placed.get(w, 0) + 1
                self._gpu_held.setdefault(w, set()).add(slot)
        return held

    def _release(self, workers: List[str], gpus: Sequence[Tuple[str, int]] = ()) -> None:
        with self._lock:
            for w, slot in gpus:
                slots = self._gpu_held.get(w, set())
                slots.discard(slot)
                if not slots:
                    self._gpu_held.pop(w, None)
            for w in workers:
                left = self._placed.get(w, 0) - 1
                if left > 0:
                    self._placed[w] = left
                else:
                    self._placed.pop(w, None)

    def _submit(self, fn: NodeFunction, workers: List[str], job_id: str,
                gpus: List[List[str]], names) -> list:
        # The key is what the dashboard shows: "duotf-node-worker-1-<job id>".
        return [
            self.client.submit(
                _dask_node, fn, i, gpus[i],
                key=f"duotf-node-{names[i]}-{job_id}",
                workers=[workers[i]],
                allow_other_workers=False,
                pure=False,
                retries=0,
                # Dask's own accounting of the worker's GPU resource (None: no resource asked)
                resources={"GPU": len(gpus[i])} if gpus[i] else None,
            )
            for i in range(len(workers))
        ]

    def feed_hint(self) -> str:
        return "pass a Dask DataFrame, Bag or Array."

    def feed_adapter(self, data, nodes: int, options=None):
        from duotf.backends.dask.feed import DaskFeed, kind_of

        if kind_of(data) is None:
            return super().feed_adapter(data, nodes, options)
        return DaskFeed(self.client, data, options, where=self._feed_where)

    def encrypts_traffic(self) -> bool:
        """The client reaches its scheduler over TLS (``tls://``, or a ``Security`` that
        requires encryption)."""
        security = getattr(self.client, "security", None)
        return (str(self.client.scheduler.address).startswith("tls://")
                or bool(getattr(security, "require_encryption", False)))

    def driver_host(self) -> str:
        host = urlparse(self.client.scheduler.address).hostname or "127.0.0.1"
        return routable_ip(host)
