"""The Dask backend's feed: a Dask DataFrame, Bag, Array or tuple of Arrays, one feeding task per
partition (row block), run on the cluster's workers beside the nodes.

Inference output stays distributed: the tasks' results are kept on the workers (futures) and
handed back as a collection of the input's kind with one output partition per input partition.
"""

from __future__ import annotations

import uuid
from typing import Dict, List, Optional

from duotf.errors import ConfigError
from duotf.backends.base import EngineJob, FeedAdapter, ThreadJob, count_error

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

    def __init__(self, client, data, options=None, where=dict):
        super().__init__(options)
        import dask

        self.client = client
        self._where = where  # () -> where this feed's tasks may run (DaskBackend._feed_where)
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

    def partition_hosts(self) -> List[Optional[str]]:
        """The host of the worker holding each partition, or what it is made of directly, in
        memory (a persisted collection, one built from futures): one scheduler call. None for
        a partition held nowhere (computed where its task runs)."""
        wanted = []
        for part in self.parts:
            task = part.__dask_graph__().get(part.key)
            wanted.append([part.key, *sorted(getattr(task, "dependencies", None) or (), key=str)])
        keys = list({key for keys in wanted for key in keys})
        held = self.client.sync(self.client.scheduler.who_has, keys=keys) if keys else {}
        # a worker's host: tcp://10.0.0.5:40123 -> 10.0.0.5
        return [next((w.split("://", 1)[-1].rsplit(":", 1)[0] for key in keys for w in held.get(key) or ()),
                     None) for keys in wanted]

    def counts(self) -> List[int]:
        import dask

        if self.kind in ("array", "arrays"):
            return [int(c) for c in self.data.chunks[0]]
        token = uuid.uuid4().hex[:8]  # a key of its own per count, as the feed's own keys
        job_id = self.options.job_id
        futures = self.client.compute([
            dask.delayed(len)(p, dask_key_name=f"duotf-count-{job_id}-part-{i}-{token}")
            for i, p in enumerate(self.parts)], **self._where())
        try:
            return list(self.client.gather(futures))
        except Exception:
            # the future that failed the gather has erred by now; the others need no waiting
            failed = [pid for pid, future in enumerate(futures) if future.status == "error"]
            if not failed:
                raise
            error = futures[failed[0]].exception()
            raise count_error(failed[0], error) from error
        finally:
            self.client.cancel(futures)  # counts only: nothing to keep

    def _run(self, tasks, finish, name: str) -> EngineJob:
        client = self.client
        # Partition order is the scheduler's order too: a node queues its ranges in partition
        # order (see duotf._driver.planner.balance), so a task never waits on one not yet started.
        where = self._where()
        futures = [client.compute(task, priority=len(tasks) - i, **where) for i, task in enumerate(tasks)]

        def call():
            try:
                return finish(futures)
            except BaseException:
                client.cancel(futures)
                raise

        return ThreadJob(call, cancel=lambda: client.cancel(futures), name=name)

    def train(self, job) -> EngineJob:
        """One epoch, each worker's partitions one after the other in plan order (a task is
        submitted once the partitions before it on each of its workers are done), the workers'
        chains side by side. A node takes its ranges in that order anyway, and Dask need not
        start tasks in the order asked: a later task started first would hold a thread while
        it waits for its turn, and enough of them would leave none for the earlier ones."""
        from distributed import as_completed

        from duotf._transport.tasks import train_partition

        client = self.client
        after: Dict[int, set] = {}  # pid -> the partitions that must be done before it
        last: Dict[int, int] = {}  # target -> its latest partition so far
        for pid in sorted(job.plan):
            after[pid] = {last[t] for t, *_ in job.plan[pid] if t in last}
            for t, *_ in job.plan[pid]:
                last[t] = pid
        futures: Dict[object, int] = {}
        where = self._where()

        def call():
            sent = [0] * len(self.parts)  # a partition with no range (empty, or left over) sends none
            done: set = set()
            pending = [pid for pid in sorted(after) if job.plan[pid]]
            # the dashboard's name of a task: "duotf-feed-<job id>-epoch-3-part-7-<token>"
            # (the token: a key of its own per call, never one Dask still holds)
            token = uuid.uuid4().hex[:8]
            running = as_completed()

            blocks: Dict[int, object] = {}  # pid -> its partition, computed ahead

            def block(pid):
                if pid not in blocks:
                    blocks[pid] = client.compute(self.parts[pid], priority=len(self.parts) - pid, **where)
                return blocks[pid]

            def submit_ready():
                for pid in [q for q in pending if after[q] <= done]:
                    pending.remove(pid)
                    future = client.submit(train_partition, job, pid, block(pid), pure=False,
                                           priority=len(self.parts) - pid, **where,
                                           key=f"{job.key_prefix}-part-{pid}-{token}")
                    futures[future] = pid
                    running.add(future)
                # the partition each chain takes next is computed while the current one feeds
                for q in [q for q in pending if len(after[q] - done) == 1][:len(job.addresses)]:
                    block(q)

            try:
                submit_ready()
                for future in running:
                    pid = futures[future]
                    sent[pid] = future.result()  # raises the task's own error
                    self.partition_done(pid, sent[pid])
                    done.add(pid)
                    blocks.pop(pid, None)  # released: the block is not kept
                    submit_ready()
            finally:
                client.cancel(list(futures))  # duotf's own keys: nothing to keep
                # the data's partitions are released, never cancelled: Dask cancels a key's
                # dependents with it, and a restarted attempt's count and feed (or the user's
                # own work) depend on the same partitions
                for block in blocks.values():
                    block.release()
            return sent

        return ThreadJob(call, cancel=lambda: client.cancel(list(futures)), name="dask-feed")

    def infer(self, job, keep, result_columns) -> EngineJob:
        import dask

        from duotf._transport.tasks import infer_partition

        token = uuid.uuid4().hex[:8]
        tasks = [dask.delayed(infer_partition)(job, i, p, keep,
                                               dask_key_name=f"{job.key_prefix}-part-{i}-{token}")
                 for i, p in enumerate(self.parts)]
        return self._run(tasks, lambda futures: self._collection(futures, keep), "dask-inference")

    def _collection(self, futures, keep):
        """Wait for every partition's results while the cluster runs, and wrap the futures
        (the results stay on the workers) in a collection of the input's kind."""
        import dask
        from distributed import wait

        wait(futures)
        for future in futures:
            if future.status == "error":
                future.result()  # raises the task's own error
        client = self.client
        if self.kind == "bag":  # a Bag may have no partition at all: then neither has its output
            import dask.bag as db

            return db.from_delayed([dask.delayed(f) for f in futures])
        if not futures:  # no partition to take the output's kind from: one empty partition
            return self._empty_output(keep)
        if self.kind == "dataframe":
            import dask.dataframe as dd

            meta = client.submit(_empty_like, futures[0]).result()
            # as the tasks made it: Dask would turn an object column (arrays kept beside the
            # results, say) into strings otherwise ("dataframe.convert-string")
            with dask.config.set({"dataframe.convert-string": False}):
                return dd.from_delayed(futures, meta=meta, verify_meta=False)
        import dask.array as da

        first = client.submit(_empty_like, futures[0]).result()
        rows = self.data.chunks[0]
        blocks = [da.from_delayed(dask.delayed(f), shape=(n,) + first.shape[1:], dtype=first.dtype)
                  for f, n in zip(futures, rows)]
        return da.concatenate(blocks) if blocks else da.from_array(first)

    def _empty_output(self, keep):
        """The output of an input with no partition (a DataFrame or Array cannot hold none: one
        empty partition), as an empty partition of it would give."""
        import numpy as np

        from duotf._transport.tasks import assemble

        if self.kind == "dataframe":
            import dask.dataframe as dd

            return dd.from_pandas(assemble(self.data._meta, [], keep), npartitions=1)
        import dask.array as da

        return da.from_array(np.empty((0,)), chunks=(0,))
