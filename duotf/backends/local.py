"""The in-process backend: node agents run as threads of the driver process.

Each node still runs in a process of its own, so ``main`` sees exactly what it sees on Spark or
Dask; only the engine is missing. It is the embedded default and the fast backend of the tests.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import List, Optional, Sequence, Union

from duotf.errors import ConfigError, InsufficientSlotsError
from duotf._node.agent import NodeOutcome
from duotf.backends.base import (Backend, EngineJob, FeedAdapter, FeedOptions, NodeFunction, ThreadJob, count_error)


class LocalBackend(Backend):
    """Run nodes on this machine without an engine.

    Parameters
    ----------
    slots:
        How many nodes may run at once (default: 32).
    gpus:
        The GPUs its nodes may hold (``ClusterSpec(gpus_per_node=k)``): a count ``n`` (the
        devices 0 to n-1) or a list of addresses. Address ``i`` is the i-th device of this
        process's ``CUDA_VISIBLE_DEVICES`` where that is set, as on Spark and Dask. Each node
        holds ``k`` devices no other node of this backend holds (the first free ones, in this
        order) until it ends; runs side by side (:func:`duotf.run_parallel`) share them out
        the same way. Default:
        none, so a spec asking for GPUs fails at once; the backend never guesses the machine's
        devices.
    """

    name = "local"

    def __init__(self, slots: Optional[int] = None, gpus: Union[int, Sequence[str], None] = None):
        self._slots = slots if slots is not None else 32
        if gpus is None:
            self._gpus: List[str] = []
        elif isinstance(gpus, int) and not isinstance(gpus, bool) and gpus >= 0:
            self._gpus = [str(i) for i in range(gpus)]
        elif isinstance(gpus, (list, tuple)) and all(isinstance(g, (str, int)) for g in gpus):
            self._gpus = [str(g) for g in gpus]
        else:
            raise ConfigError(f"LocalBackend(gpus={gpus!r}): give a number of devices or a list "
                              "of device addresses")
        self._gpu_lock = threading.Lock()
        self._gpus_held: set = set()  # addresses held by nodes running now

    def __repr__(self) -> str:
        gpus = f", gpus={self._gpus}" if self._gpus else ""
        return f"LocalBackend(slots={self._slots}{gpus})"

    def slots(self) -> int:
        return self._slots

    def capacity_hint(self) -> str:
        return "Ask for fewer nodes or pass duotf.backends.LocalBackend(slots=...)."

    def check_gpus(self, nodes: int, per_node: int) -> int:
        if not self._gpus:
            raise ConfigError(
                f"ClusterSpec(gpus_per_node={per_node}) asks for GPUs, but this local backend "
                "has none to hand out: pass duotf.backends.LocalBackend(gpus=N) (the devices "
                "0 to N-1 of this machine, or of its CUDA_VISIBLE_DEVICES), or set "
                "gpus_per_node=0.")
        if nodes * per_node > len(self._gpus):
            raise InsufficientSlotsError(
                f"the cluster needs {nodes} nodes of {per_node} GPUs each ({nodes * per_node}) "
                f"but LocalBackend has {len(self._gpus)} (addresses {', '.join(self._gpus)}): ask for "
                "fewer nodes or GPUs per node, or pass more devices to LocalBackend(gpus=...).",
                needed=nodes * per_node, available=len(self._gpus), backend=self.name)
        return len(self._gpus) // per_node

    def start_nodes(self, fn: NodeFunction, n: int, job_id: str,
                    gpus_per_node: int = 0, names=None) -> EngineJob:
        executor = f"local-{socket.gethostname()}-{os.getpid()}"
        k = gpus_per_node
        held = self._take_gpus(n, k) if k else []

        def call() -> List[NodeOutcome]:
            results: List[Optional[NodeOutcome]] = [None] * n
            errors: List[BaseException] = []

            def one(i: int) -> None:
                try:
                    if k:
                        results[i] = fn(i, executor, 0, gpus=held[i * k:(i + 1) * k])
                    else:
                        results[i] = fn(i, executor, 0)
                except BaseException as exc:
                    errors.append(exc)

            threads = [
                threading.Thread(target=one, args=(i,), daemon=True,
                                 name=f"duotf-node-{names[i] if names else i}-{job_id}")
                for i in range(n)
            ]
            try:
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
            finally:
                self._give_back(held)
            if errors:
                raise errors[0]
            return [r for r in results if r is not None]

        # Agents end themselves when the driver's rendezvous server closes; nothing to cancel.
        return ThreadJob(call, cancel=lambda: None, name="local")

    def _take_gpus(self, n: int, k: int) -> List[str]:
        """The first ``n * k`` devices no running node holds, held until :meth:`_give_back`."""
        self.check_gpus(n, k)
        with self._gpu_lock:
            free = [g for g in self._gpus if g not in self._gpus_held]
            if len(free) < n * k:
                raise InsufficientSlotsError(
                    f"the cluster needs {n} nodes of {k} GPUs each, but only {len(free)} of "
                    f"LocalBackend's {len(self._gpus)} GPUs are free now (the others are held "
                    "by running nodes): run fewer clusters at once (max_concurrent=...).",
                    needed=n * k, available=len(free), backend=self.name)
            taken = free[:n * k]
            self._gpus_held.update(taken)
        return taken

    def _give_back(self, gpus: List[str]) -> None:
        with self._gpu_lock:
            self._gpus_held.difference_update(gpus)

    def feed_hint(self) -> str:
        return ("pass a list of partitions: lists of rows, pandas DataFrames, numpy arrays, or "
                "callables that return an iterator of rows or of column dicts.")

    def feed_adapter(self, data, nodes: int, options: Optional[FeedOptions] = None) -> FeedAdapter:
        if not isinstance(data, (list, tuple)):
            return super().feed_adapter(data, nodes, options)
        return LocalFeed(list(data), options)


def _parallel(calls, width: int = 4) -> list:
    """Run the calls in up to ``width`` threads; results in order; the first error is raised."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=width, thread_name_prefix="duotf-local-feed") as pool:
        return list(pool.map(lambda call: call(), calls))


class LocalFeed(FeedAdapter):
    """A list of partitions, fed from threads of the driver (up to 4 at once)."""

    def __init__(self, parts: list, options: Optional[FeedOptions] = None):
        super().__init__(options)
        self.parts = parts

    def counts(self) -> List[int]:
        from duotf._transport.tasks import count_rows

        counts = []
        for pid, part in enumerate(self.parts):
            try:
                counts.append(count_rows(part))
            except Exception as exc:
                raise count_error(pid, exc) from exc
        return counts

    def train(self, job) -> EngineJob:
        from duotf._transport import tasks
        calls = [lambda i=i, p=p: self._done(i, tasks.train_partition(job, i, p), int)
                 for i, p in enumerate(self.parts)]
        return ThreadJob(lambda: _parallel(calls), cancel=lambda: None, name="local-feed")

    def infer(self, job, keep, result_columns) -> EngineJob:
        from duotf._transport import tasks
        calls = [lambda i=i, p=p: self._done(i, tasks.infer_partition(job, i, p, keep), len)
                 for i, p in enumerate(self.parts)]
        return ThreadJob(lambda: _parallel(calls), cancel=lambda: None, name="local-feed")

    def _done(self, pid: int, value, rows):
        self.partition_done(pid, rows(value))
        return value
