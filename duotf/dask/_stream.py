"""Training a duotf cluster from a stream of Dask futures: :func:`feed_stream`, re-exported by
:mod:`duotf.dask` (the twin of :func:`duotf.spark.feed_stream`, which feeds a Structured
Streaming query).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Iterable, Sequence

from duotf.reports import DaskStreamReport

if TYPE_CHECKING:
    from distributed import Future

    from duotf._driver.cluster import Cluster

__all__ = ["feed_stream"]


def _empty_frame(frame):
    return frame.iloc[:0] if hasattr(frame, "iloc") else None


def feed_stream(cluster: Cluster, futures: Iterable[Future], *, feed_timeout: float = 600.0,
                balance: bool = True, ragged: Sequence[str] = ()) -> DaskStreamReport:
    """Train ``cluster`` from a stream of Dask futures: each future's result (a pandas
    DataFrame, a partition computed on the workers) is fed as it completes, and the nodes'
    feed ends once ``futures`` (any iterable: a list, or a generator that yields futures as
    new data arrives) is exhausted and every future fed. Returns the counts.

    The futures done at the same moment are fed together as one chunk of an open feed
    (:meth:`duotf.Cluster.open_stream`), a Dask DataFrame of their results where they are (no
    row passes through the driver): the nodes read one continuous stream (``next_batch``
    across chunks; ``should_stop()`` and ``dataset()`` end with the stream), ``balance`` per
    chunk, schema checks as in ``cluster.train``. Each chunk returns once the nodes have its
    rows queued, so a slow node holds up the feeding of the next, never memory. A future that
    fails, a result that is not a DataFrame, or a chunk that fails ends every node's feed with
    the error and raises it (a :class:`~duotf.errors.FeedError`).
    """
    import threading

    import dask
    import dask.dataframe as dd
    from distributed import as_completed

    from duotf.errors import FeedError

    arrived = as_completed()  # the futures of the iterable, handed out as they complete
    cond = threading.Condition()
    state: Dict[str, Any] = {"added": 0, "end": False, "error": None}

    def watch():  # the iterable may block (a generator waiting for data): its own thread
        try:
            for future in futures:
                arrived.add(future)
                with cond:
                    state["added"] += 1
                    cond.notify_all()
        except BaseException as exc:
            state["error"] = exc
        finally:
            with cond:
                state["end"] = True
                cond.notify_all()

    stream = cluster.open_stream(feed_timeout=feed_timeout, balance=balance, ragged=ragged)
    watcher = threading.Thread(target=watch, name="duotf-dask-stream", daemon=True)
    watcher.start()
    taken = 0  # futures handed out by as_completed so far
    try:
        while True:
            try:
                ready = arrived.next_batch(block=True)  # every future done by now: one chunk
            except StopIteration:  # none left to wait for: more to come, or the end
                with cond:
                    cond.wait_for(lambda: state["end"] or state["added"] > taken)
                    if state["end"] and state["added"] == taken:
                        break
                continue
            taken += len(ready)
            for future in ready:
                if future.status != "finished":
                    error = future.exception() if future.status == "error" else None
                    raise FeedError(f"a future of the stream {future.status}: "
                                    f"{type(error).__name__ if error else ''} {error or future.key}"
                                    .strip(), cause=str(error) if error else None)
            meta = ready[0].client.submit(_empty_frame, ready[0]).result()
            if meta is None:
                raise FeedError(f"a future of the stream gave a "
                                f"{type(ready[0].result()).__name__}; feed_stream takes "
                                "futures of pandas DataFrames")
            with dask.config.set({"dataframe.convert-string": False}):
                chunk = dd.from_delayed(ready, meta=meta, verify_meta=False)
            stream.feed(chunk)
        if state["error"] is not None:
            raise FeedError(f"the stream's iterable of futures raised "
                            f"{type(state['error']).__name__}: {state['error']}") from state["error"]
        stream.end()
    except BaseException as exc:
        if stream.error is None:
            stream.fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        raise
    finally:
        watcher.join(None if state["end"] else 0)
    return {**stream.report(), "futures": taken}
