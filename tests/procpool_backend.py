"""A backend that duotf does not ship: node agents and feeding tasks run in the worker processes
of a ``concurrent.futures.ProcessPoolExecutor``.

It proves that the backend contract (:mod:`duotf.backends.base`) can be extended from outside
duotf. Nothing in duotf names it: it is found through the ``duotf.backends`` entry point of
``tests/plugins/duotf_procpool_test-0.0.dist-info`` (the conftest puts ``tests/plugins`` on
``sys.path``), and the shared suite runs on it like on any other engine::

    duotf.run(main, args, backend="procpool")      # duotf makes a pool of 4, closes it at shutdown
    with ProcessPool(max_workers=4) as pool:       # the caller's: ProcessPoolBackend.accepts it
        duotf.run(main, args, backend=pool)

The pool's processes are spawned (never forked from this threaded process) and inherit
``sys.path``, so its workers import duotf, and the nodes they start too (a script that uses it
needs the usual ``if __name__ == "__main__":`` guard of spawned processes). Data to feed is a list
of partitions, as for the local backend; each partition travels with cloudpickle, so a callable
that makes the partition's rows may be a closure.
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.process
import multiprocessing
import os
import socket
import threading
from typing import List, Optional, Set

import cloudpickle

from duotf._deadline import Deadline
from duotf.backends import Backend, EngineJob, FeedAdapter, FeedOptions, ThreadJob, count_error
from duotf.errors import InsufficientSlotsError

__all__ = ["ProcessPool", "ProcessPoolBackend", "ProcessPoolFeed"]


class _SpawnRecorder:
    """The "spawn" context, keeping every process it starts: the pool's workers, which
    :meth:`ProcessPool.close` makes sure are gone and :meth:`ProcessPool.processes` lists."""

    def __init__(self):
        self._context = multiprocessing.get_context("spawn")
        self.started: List[multiprocessing.process.BaseProcess] = []

    def __getattr__(self, name):
        return getattr(self._context, name)

    def Process(self, *args, **kwargs):  # noqa: N802 - the context's own name
        proc = self._context.Process(*args, **kwargs)
        self.started.append(proc)
        return proc


class ProcessPool:
    """The engine: up to ``max_workers`` worker processes, started as tasks need them.

    Every node occupies a worker for its whole life; feeding tasks take the workers left.
    Close it (or use it as a context manager) to end the workers.
    """

    def __init__(self, max_workers: int = 4):
        self.max_workers = max_workers
        self._context = _SpawnRecorder()
        self._lock = threading.Lock()
        self._executor: Optional[concurrent.futures.ProcessPoolExecutor] = None
        # the tasks not ended: an ended one goes (its error's traceback holds the frames of the
        # job that ran it, and so that job's Cluster, which the leak check waits to collect)
        self._futures: Set[concurrent.futures.Future] = set()
        self._closed = False

    def __repr__(self) -> str:
        return f"ProcessPool(max_workers={self.max_workers})"

    def submit(self, fn, *args) -> concurrent.futures.Future:
        """Run ``fn(*args)`` (pickled) in a worker process."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed")
            if self._executor is None:
                self._executor = concurrent.futures.ProcessPoolExecutor(
                    self.max_workers, mp_context=self._context)
            try:
                future = self._executor.submit(fn, *args)
            except concurrent.futures.process.BrokenProcessPool:
                # A worker died (a test killed it) and the executor ended every worker: the
                # engine goes on with fresh ones, as Spark and Dask replace a lost one.
                self._executor.shutdown(wait=False, cancel_futures=True)
                self._executor = concurrent.futures.ProcessPoolExecutor(
                    self.max_workers, mp_context=self._context)
                future = self._executor.submit(fn, *args)
            self._futures.add(future)
        future.add_done_callback(self._futures.discard)
        return future

    def busy(self) -> int:
        """How many submitted tasks have not ended (running or waiting for a worker)."""
        with self._lock:
            return sum(not f.done() for f in set(self._futures))

    def processes(self) -> list:
        """The live worker processes, as ``psutil.Process`` (for tests that watch them)."""
        import psutil

        found = []
        for proc in self._context.started:
            try:
                found.append(psutil.Process(proc.pid))
            except psutil.NoSuchProcess:
                pass
        return found

    def close(self, timeout: float = 30.0) -> None:
        """End every worker; idempotent. Workers still busy after ``timeout`` seconds (an agent
        whose driver never closed) are killed, so that no process outlives the pool."""
        with self._lock:
            self._closed = True
            executor, self._executor = self._executor, None
        if executor is None:
            return
        executor.shutdown(wait=False, cancel_futures=True)
        deadline = Deadline.after(timeout)
        for proc in self._context.started:
            proc.join(deadline.remaining)
            if proc.exitcode is None:
                proc.kill()
        executor.shutdown(wait=True)

    def __enter__(self) -> "ProcessPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- what the workers run -----------------------------------------------------------------------
def _node_task(fn, node_id: int):
    return fn(node_id, f"procpool-{socket.gethostname()}-{os.getpid()}", 0)


def _count_rows(part) -> int:
    from duotf._transport.tasks import count_rows

    return count_rows(part)


class _ByValue:
    """Unpickles as ``obj`` itself, which travels with cloudpickle (closures too); pickled once,
    sent every epoch."""

    def __init__(self, obj):
        self._blob = cloudpickle.dumps(obj)

    def __reduce__(self):
        return cloudpickle.loads, (self._blob,)


def _job(futures: List[concurrent.futures.Future], name: str) -> EngineJob:
    """The tasks' results in order once every task has ended; the first error, in task order."""

    def call() -> list:
        concurrent.futures.wait(futures)
        return [f.result() for f in futures]

    def cancel() -> None:
        # Only tasks still waiting for a worker can be cancelled. Running agents end themselves
        # when the driver's rendezvous server closes, feeding tasks when their nodes stop.
        for future in futures:
            future.cancel()

    return ThreadJob(call, cancel=cancel, name=name)


# -- the backend --------------------------------------------------------------------------------
class ProcessPoolBackend(Backend):
    """Run nodes, and the tasks feeding them, in the worker processes of a :class:`ProcessPool`."""

    name = "procpool"

    @classmethod
    def accepts(cls, obj) -> bool:
        """A :class:`ProcessPool`."""
        return isinstance(obj, ProcessPool)

    def __init__(self, pool: ProcessPool):
        self.pool = pool
        self._owns_pool = False

    @classmethod
    def from_name(cls) -> "ProcessPoolBackend":
        """A pool of 4 workers (2 nodes and 2 feeding tasks), closed with the backend."""
        backend = cls(ProcessPool(max_workers=4))
        backend._owns_pool = True
        return backend

    def __repr__(self) -> str:
        return f"ProcessPoolBackend({self.pool!r})"

    def slots(self) -> int:
        return self.pool.max_workers - self.pool.busy()

    def capacity_hint(self) -> str:
        return "Ask for fewer nodes or pass a ProcessPool(max_workers=...) with more workers."

    def start_nodes(self, fn, n: int, job_id: str, names=None) -> EngineJob:
        return _job([self.pool.submit(_node_task, fn, i) for i in range(n)], "procpool")

    def feed_hint(self) -> str:
        return ("pass a list of partitions: lists of rows, pandas DataFrames, numpy arrays, dicts "
                "of columns, or picklable callables that return an iterator of rows or of column "
                "dicts.")

    def feed_adapter(self, data, nodes: int, options: Optional[FeedOptions] = None) -> FeedAdapter:
        if not isinstance(data, (list, tuple)):
            return super().feed_adapter(data, nodes, options)
        return ProcessPoolFeed(self, list(data), options)

    def close(self) -> None:
        if self._owns_pool:
            self.pool.close()


class ProcessPoolFeed(FeedAdapter):
    """A list of partitions, counted and fed by tasks in the pool's free workers."""

    def __init__(self, backend: ProcessPoolBackend, parts: list, options: Optional[FeedOptions] = None):
        super().__init__(options)
        self.backend = backend
        self.parts = [_ByValue(p) for p in parts]

    def check_capacity(self, nodes: int) -> None:
        pool = self.backend.pool
        if self.backend.slots() < 1:
            raise InsufficientSlotsError(
                f"the {nodes} nodes take every worker of {pool!r}: none is left to run the "
                "feeding tasks. Pass a ProcessPool with more max_workers than nodes.",
                needed=nodes + 1, available=pool.max_workers, backend=self.backend.name,
            )

    def counts(self) -> List[int]:
        futures = [self.backend.pool.submit(_count_rows, part) for part in self.parts]
        counts = []
        for pid, future in enumerate(futures):
            try:
                counts.append(future.result())
            except Exception as exc:  # the partition's source raised (a lost worker too)
                raise count_error(pid, exc) from exc
        return counts

    def train(self, job) -> EngineJob:
        from duotf._transport.tasks import train_partition

        pool = self.backend.pool
        return _job([pool.submit(train_partition, job, pid, part)
                     for pid, part in enumerate(self.parts)], "procpool-feed")

    def infer(self, job, keep, result_columns) -> EngineJob:
        from duotf._transport.tasks import infer_partition

        pool = self.backend.pool
        return _job([pool.submit(infer_partition, job, pid, part, keep)
                     for pid, part in enumerate(self.parts)], "procpool-feed")
