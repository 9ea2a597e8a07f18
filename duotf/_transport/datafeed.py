"""The node's reader of the engine feed: ``DataFeed``, what ``main`` reads its rows from.

It reads the queue of the node's :class:`duotf._transport.server.FeedServer`, which the feeding
tasks' batches and the driver's "epoch" and "end" markers are queued on, in order.
"""

from __future__ import annotations

import collections
import difflib
import logging
import queue
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Union, cast

import numpy as np

from duotf._transport import malloc, shuffle
from duotf._transport.server import FeedServer
from duotf._transport.wire import Frame, Marker
from duotf._transport.columns import Columns, RaggedColumn, concat_cols, num_rows, slice_cols

if TYPE_CHECKING:  # TensorFlow is imported where a dataset is made
    import tensorflow as tf

logger = logging.getLogger(__name__)

__all__ = ["DataFeed", "INFERENCE_DATASET", "check_answered"]

# Read once (see duotf._transport.server): a read compares every queued item's kind with these.
_MARKER, _EPOCH = Frame.MARKER, Marker.EPOCH


#: the attribute that marks a dataset of an inference feed (``DataFeed.dataset(train=False)``):
#: ``duotf.keras`` predicts such a dataset per worker under MultiWorkerMirroredStrategy
INFERENCE_DATASET = "duotf_inference_feed"


def check_answered(feed: "DataFeed", what: str) -> None:
    """Inference: raise :class:`~duotf.errors.FeedError` if rows ``feed`` read are still owed
    results.

    The feeding task waits for the results of the rows it sent before it ends, so a read (or a
    return of ``main``: :func:`duotf.context.check_feeds_answered`) that leaves results owed
    would otherwise hang until ``feed_timeout``.

    Parameters
    ----------
    feed:
        The feed read from.
    what:
        What happened, the start of the error's message (``"main returned"``).
    """
    missing = feed.unanswered
    if missing:
        from duotf.errors import FeedError

        raise FeedError(
            f"{what} with {missing} rows read but not answered: inference needs "
            f"feed.batch_results(...) with one result per row read (call it with the "
            f"{missing} missing results first)", missing=missing)


def _as_result_columns(results) -> Columns:
    if isinstance(results, dict):
        return {str(k): (v if isinstance(v, list) else np.asarray(v)) for k, v in results.items()}
    if hasattr(results, "numpy"):
        results = results.numpy()
    if isinstance(results, list) and results and isinstance(results[0], (str, bytes)):
        return {"prediction": results}
    return {"prediction": np.asarray(results)}


class DataFeed:
    """What ``main`` reads the engine's data from: ``ctx.get_data_feed(train=...)``.

    ``next_batch(n)``, ``should_stop()``, ``batch_results(results)`` and ``terminate()`` behave
    as in TensorFlowOnSpark; :meth:`dataset` is the fast path, a ``tf.data.Dataset`` of column
    dicts built without per-row Python work.
    """

    def __init__(self, server: FeedServer, train: bool = True,
                 input_mapping: Optional[Dict[str, str]] = None):
        self._server = server
        self.train = train
        self.input_mapping = dict(input_mapping) if input_mapping else None
        self.epoch = 0
        self._ended = False
        self._current: Optional[Columns] = None
        self._offset = 0
        self._current_conn = None
        self._owed: "collections.deque" = collections.deque()  # [conn, rows] awaiting results
        self._epoch_cut = False  # the rows last taken ended their epoch
        # a shuffled feed (cluster.train(shuffle=True)): its rows by windows, each permuted
        self._windows = shuffle.Windows()
        self._ready: "collections.deque" = collections.deque()  # permuted windows to read
        self._deferred: Optional[Marker] = None  # a marker read while a window was held
        # input_mapping is checked against the first frame's columns (the feed's schema: the
        # driver never sees the mapping), and its error raised again on every later read
        self._mapping_checked = self.input_mapping is None
        self._mapping_error: Optional[Exception] = None

    # -- reading ------------------------------------------------------------------------------
    def _raise_failure(self) -> None:
        if self._mapping_error is not None:
            raise self._mapping_error
        if self._server.failure is not None:
            from duotf.errors import FeedError

            raise FeedError(f"the driver ended the feed: {self._server.failure}")

    def _fill(self, block: Optional[bool] = None):
        """Make a current batch available: True; False once the feed has ended (or, when not
        blocking, while nothing is queued); ``Marker.EPOCH`` when an epoch just ended. By
        default it blocks in training, and in inference only while no row read is owed its
        result (the feeding tasks may send nothing more before they get those results).
        Raises the feed's failure once the driver failed it, rows of a frame already taken
        included (they were dropped with the rest: the epoch cannot be read whole)."""
        if block is None:
            block = self.train or not self._owed
        self._raise_failure()
        while self._current is None or self._offset >= num_rows(self._current):
            self._raise_failure()
            if self._ended or self._server.terminated.is_set():
                return False
            if self._ready:  # shuffled windows, permuted, in their order
                self._current, self._offset = self._ready.popleft(), 0
                continue
            payload: Any
            if self._deferred is not None:  # the marker after the epoch's last window
                kind, payload, conn = _MARKER, self._deferred, None
                self._deferred = None
            else:
                try:
                    kind, payload, conn = self._server.queue.get(block)
                except queue.Empty:
                    return False
            if kind is _MARKER:
                if self._windows.held:  # the epoch's last, short window comes first
                    self._ready.extend(self._windows.flush())
                    self._deferred = payload
                    continue
                self._windows.flush()  # the next epoch's windows count from 0
                if payload is Marker.END:
                    self._ended = True
                elif payload is _EPOCH:
                    self.epoch += 1
                    return _EPOCH
                continue
            if not self._mapping_checked:
                self._check_mapping(payload)
            self._current_conn = conn
            key = conn.shuffle if self.train and conn is not None else None
            if key is not None or self._windows.held:  # a shuffled range: by windows
                self._ready.extend(self._windows.add(payload, key))
                continue
            self._current, self._offset = payload, 0
        return True

    def _check_mapping(self, cols: Columns) -> None:
        """Raise :class:`~duotf.errors.ConfigError` when a key of ``input_mapping`` names no
        column of ``cols`` (a typo would otherwise drop that column from every batch)."""
        columns = list(cols)
        missing = [key for key in self.input_mapping or {} if key not in cols]
        self._mapping_checked = True
        if not missing:
            return
        from duotf.errors import ConfigError

        key = missing[0]
        close = difflib.get_close_matches(str(key), columns, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        self._mapping_error = ConfigError(
            f"get_data_feed(input_mapping=...): no column {key!r} in the feed (its columns: "
            f"{', '.join(map(repr, columns))}); {hint}the keys of input_mapping name the data's "
            f"columns ({{column: name}})", column=key, columns=columns)
        raise self._mapping_error

    def _consume(self, k: int) -> Columns:
        """The next ``k`` rows of the current frame (a view, no copy)."""
        cols = slice_cols(cast(Columns, self._current), self._offset, self._offset + k)  # _fill set it
        self._offset += k
        if not self.train:
            if self._owed and self._owed[-1][0] is self._current_conn:
                self._owed[-1][1] += k
            else:
                self._owed.append([self._current_conn, k])
        return cols

    def _mapped(self, cols: Columns) -> Columns:
        if self.input_mapping:
            return {self.input_mapping[k]: v for k, v in cols.items() if k in self.input_mapping}
        return cols

    def _take(self, n: int, stop_at_epoch: bool = False):
        """Up to ``n`` rows, never across an epoch's end: None once the data ended;
        ``Marker.EPOCH`` with ``stop_at_epoch`` when an epoch ends before any row (otherwise
        the next epoch's rows). ``self._epoch_cut`` tells whether the rows end their epoch."""
        parts: List[Columns] = []
        self._epoch_cut = False
        # Inference returns a short batch rather than wait for rows that may only come after
        # the results of the rows already taken (the feeding task waits for those).
        while n > 0:
            status = self._fill(block=self.train or (not parts and not self._owed))
            if status is _EPOCH:
                if parts:
                    self._epoch_cut = True
                    break  # a batch never spans two epochs
                if stop_at_epoch:
                    return _EPOCH
                continue
            if not status:
                break
            k = min(n, num_rows(cast(Columns, self._current)) - self._offset)  # _fill set it
            parts.append(self._consume(k))
            n -= k
        if not parts:
            return None
        return self._mapped(concat_cols(parts))

    def _take_block(self, max_rows: int, batch_size: int, stop_at_epoch: bool = False):
        """Whole batches from the current frame as one view (up to ``max_rows``), or else one
        batch assembled across frames (short at the end of an epoch or of the data); None and
        ``Marker.EPOCH`` as in :meth:`_take`."""
        self._epoch_cut = False
        status = self._fill()
        while status is _EPOCH:
            if stop_at_epoch:
                return _EPOCH
            status = self._fill()
        if not status:
            return None
        available = num_rows(cast(Columns, self._current)) - self._offset  # _fill set it
        if available < batch_size:
            return self._take(batch_size, stop_at_epoch)
        k = min(max_rows, available) // batch_size * batch_size
        return self._mapped(self._consume(k))

    @property
    def unanswered(self) -> int:
        """Inference: rows read whose results have not been sent by :meth:`batch_results`."""
        return sum(rows for _, rows in self._owed)

    def next_batch(self, batch_size: int) -> Any:
        """Up to ``batch_size`` rows: a dict of column arrays with ``input_mapping``, else a list
        of rows (tuples, or single values for one column).

        A column declared ragged (``cluster.train(..., ragged=[name])``) is a
        :class:`~duotf._transport.columns.RaggedColumn` in the dict (``values`` and ``row_splits``),
        and in a row the row's own values, a 1-D numpy array.

        A batch never spans two epochs: the last batch of an epoch may be short (by the same
        amount on every worker, since ``train`` balances rows). In inference a batch is also cut
        short when no more rows are queued, as the rows' results must go back first, and reading
        with rows still unanswered raises :class:`~duotf.errors.FeedError`.

        Annotated ``Any``: a dict or a list, as ``get_data_feed(input_mapping=...)`` chose."""
        check_answered(self, "next_batch() was called")
        cols = self._take(batch_size)
        if cols is None:
            return {} if self.input_mapping else []
        return self._rows(cols)

    def batches(self, batch_size: int) -> Iterator[Any]:
        """The batches of one epoch, as :meth:`next_batch` gives them: iterating stops at the
        epoch's end (nothing more once the data ended), so ``for batch in feed.batches(n)``
        is one epoch, and a checkpoint saved after it holds whole epochs (what a restart
        resumes from: ``ctx.report_checkpoint``)."""
        check_answered(self, "batches() was called")
        while True:
            cols = self._take(batch_size, stop_at_epoch=True)
            if cols is None or cols is _EPOCH:
                return
            cut = self._epoch_cut
            yield self._rows(cols)
            if cut:
                return

    def _rows(self, cols):
        if self.input_mapping:
            return cols
        values = list(cols.values())
        if len(values) == 1:
            return list(values[0])
        return list(zip(*values))

    def should_stop(self) -> bool:
        """True once every row has been read (end of data) or the feed was terminated.

        In inference, calling it with rows still unanswered raises
        :class:`~duotf.errors.FeedError`."""
        check_answered(self, "should_stop() was called")
        status = self._fill()
        while status is _EPOCH:
            status = self._fill()
        return self._server.terminated.is_set() or not status

    def batch_results(self, results: Any) -> None:
        """Send inference results for the rows read so far, in order, one per input row: a
        list, a numpy array or tensor (one result column, ``prediction``), or a dict of columns."""
        cols = _as_result_columns(results)
        n = num_rows(cols)
        start = 0
        while start < n:
            if not self._owed:
                from duotf.errors import FeedError

                raise FeedError(f"batch_results got {n - start} more results than rows were read "
                                f"({n} results for {start} unanswered rows)", extra=n - start)
            conn, rows = self._owed[0]
            k = min(rows, n - start)
            conn.send(Frame.RESULT, slice_cols(cols, start, start + k))
            start += k
            if k == rows:
                self._owed.popleft()
            else:
                self._owed[0][1] -= k

    def terminate(self) -> None:
        """Stop reading: pending and future data is dropped and the driver's call returns."""
        self._server.terminate()

    def dataset(self, batch_size: int, *, features: Union[str, Sequence[str], None] = None,
                label: Optional[str] = None, per_epoch: Optional[bool] = None,
                block_bytes: int = 4 << 20) -> tf.data.Dataset:
        """A ``tf.data.Dataset`` of this node's rows in batches of ``batch_size``.

        Without ``features`` and ``label`` an element is a dict ``{column: tensor}``; with them
        it is what Keras ``model.fit`` takes, ``(x, y)``: ``x`` the tensor of ``features`` when
        it is one name, a dict of tensors when it is a list (every column but ``label`` when
        it is None), ``y`` the tensor of ``label`` (just ``x`` without ``label``, for
        ``predict``). Names are column names after ``input_mapping``.

        With ``per_epoch`` (the default when ``features`` or ``label`` is given) one iteration
        of the dataset is one epoch of the feed, and iterating it again reads the next epoch,
        as ``fit(ds, epochs=n)`` does: as ``train`` balances rows, every worker runs the same
        number of steps per epoch, so ``fit`` needs no ``steps_per_epoch``. Otherwise one
        iteration reads every epoch.

        The dataset's auto-shard policy is OFF: the engine already gave each node its own
        rows, and ``MultiWorkerMirroredStrategy`` must not drop any. Note that under that
        strategy Keras treats ``batch_size`` as the global batch: each worker's step takes
        ``batch_size / num_workers`` of its own rows (TF's rebatching).

        Batches follow the same rules as :meth:`next_batch` (never across epochs). Rows move
        from Python to TF in blocks of whole batches (about ``block_bytes``), each a view of one
        received frame where possible, and TF splits them: there is no per-row and little
        per-batch Python work. A column declared ragged is a ``tf.RaggedTensor`` of shape
        ``(rows, None)``.

        **Inference** (``train=False``): a feeding task sends its partition's later rows only
        once the earlier ones are answered, and the feed ends only once every row is answered,
        so a dataset of the whole feed could never end. One iteration of an inference feed's
        dataset is the rows queued now: it waits for the first, then ends as soon as none is
        queued while the rows read are unanswered (rows answered as they are read, batch by
        batch, let it read on). Answer them (``batch_results``) and ask again::

            while not feed.should_stop():
                feed.batch_results(model.predict(feed.dataset(256, features="x"), verbose=0))

        The dataset is marked (:data:`INFERENCE_DATASET`) so that ``model.predict`` under a
        multi-worker ``MultiWorkerMirroredStrategy`` predicts this worker's rows alone
        (:mod:`duotf.keras`): there, Keras's ``predict`` otherwise gathers every worker's
        predictions, step by step, and needs every worker to take the same number of steps.
        """
        import tensorflow as tf

        if not self.train:
            check_answered(self, "dataset() was called")
        if per_epoch is None:
            per_epoch = features is not None or label is not None
        first = self._take(batch_size)
        if first is None:
            raise ValueError("the feed ended before any data arrived")
        pending = [first, self._epoch_cut]

        signature = {k: _tensor_spec(v) for k, v in first.items()}
        xy = _xy_selector(list(signature), features, label)
        per_block = _rows_per_block(first, batch_size, block_bytes)

        def blocks():
            malloc.retune_after_tf()  # TF's from_generator has just set its trim threshold
            if pending[0] is not None:  # the batch read above, to learn the columns
                cols, cut = pending
                pending[0] = None
            else:
                cols = self._take_block(per_block, batch_size, stop_at_epoch=per_epoch)
                cut = self._epoch_cut
            while cols is not None and cols is not _EPOCH:
                n = num_rows(cols)
                full = n // batch_size * batch_size
                if full:
                    yield _stacked(cols, 0, full, full // batch_size)
                if full < n:  # the short batch at the end of an epoch, or of the data
                    yield _stacked(cols, full, n, 1)
                if per_epoch and cut:
                    return
                cols = self._take_block(per_block, batch_size, stop_at_epoch=per_epoch)
                cut = self._epoch_cut

        ds = tf.data.Dataset.from_generator(blocks, output_signature=signature).unbatch()
        return _finished(ds, xy, inference=not self.train)


def _tensor_spec(values):
    """The ``tf.TensorSpec`` of a block of batches of a column like ``values``."""
    import tensorflow as tf

    if isinstance(values, list):
        return tf.TensorSpec((None, None), tf.string)
    if isinstance(values, RaggedColumn):
        return tf.RaggedTensorSpec((None, None, None), tf.as_dtype(values.dtype), ragged_rank=2,
                                   row_splits_dtype=tf.int64)
    return tf.TensorSpec((None, None, *values.shape[1:]), tf.as_dtype(values.dtype))


def _stacked(cols: Columns, start: int, stop: int, k: int) -> dict:
    """Rows ``[start, stop)`` of ``cols`` as ``k`` batches: shape ``(k, (stop - start) // k, ...)``."""
    import tensorflow as tf

    out = {}
    for name, v in cols.items():
        part = v[start:stop]
        if isinstance(part, RaggedColumn):
            out[name] = tf.RaggedTensor.from_uniform_row_length(
                part.to_tensor(), (stop - start) // k, validate=False)
            continue
        if isinstance(part, list):
            part = np.asarray(part, dtype=object)
        out[name] = part.reshape(k, (stop - start) // k, *part.shape[1:])
    return out


def _rows_per_block(first: Columns, batch_size: int, block_bytes: int) -> int:
    """Whole batches' rows in about ``block_bytes``, from the row size of the batch ``first``."""
    row_bytes = sum(v.nbytes // max(len(v), 1) if isinstance(v, (np.ndarray, RaggedColumn)) else 64
                    for v in first.values())
    return batch_size * max(1, block_bytes // max(row_bytes * batch_size, 1))


def _finished(ds, xy, inference: bool):
    """``ds`` as :meth:`DataFeed.dataset` returns it: elements selected by ``xy`` (see
    :func:`_xy_selector`), auto-sharding off, marked as an inference feed's."""
    import tensorflow as tf

    if xy is not None:
        ds = ds.map(xy)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    ds = ds.with_options(options)
    if inference:
        setattr(ds, INFERENCE_DATASET, True)
    return ds


def _xy_selector(columns: List[str], features, label: Optional[str]):
    """A function of a batch dict giving ``(x, y)`` (or ``x``), or None for the dict itself."""
    if features is None and label is None:
        return None
    from duotf.errors import ConfigError

    names = [features] if isinstance(features, str) else (
        [c for c in columns if c != label] if features is None else list(features))
    for name in names + ([label] if label is not None else []):
        if name not in columns:
            raise ConfigError(f"dataset(): no column {name!r} in the feed (its columns: "
                              f"{', '.join(map(repr, columns))}); name columns as "
                              f"input_mapping maps them", column=name)
    if label is not None and label in names:
        raise ConfigError(f"dataset(): column {label!r} is both a feature and the label",
                          column=label)
    single = isinstance(features, str) or (features is None and len(names) == 1)

    def select(batch):
        x = batch[names[0]] if single else {name: batch[name] for name in names}
        return x if label is None else (x, batch[label])

    return select
