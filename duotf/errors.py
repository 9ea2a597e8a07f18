"""The exception tree of duotf.

::

    DuotfError
    ├── ConfigError (ValueError)          a setting or argument is wrong; nothing was started
    │   ├── UnsupportedProtocolError     the installed TensorFlow cannot serve spec.protocol
    │   └── PortRangeError               no free port left in DUOTF_PORTS for a duotf server
    ├── BackendError                      the engine (Spark, Dask, ...) failed or refused
    │   └── InsufficientSlotsError       fewer task slots / workers than nodes
    ├── ReservationTimeoutError (TimeoutError)   not every node registered in time
    ├── NodeError                         one node went wrong; every other node was stopped
    │   ├── NodeFailedError              main raised, or its process exited or was killed
    │   └── NodeUnresponsiveError        no heartbeat within heartbeat_timeout
    ├── FeedError                         the engine feed failed: the count, a source, a feeding task, a node
    │   └── FeedSchemaError              a partition's data does not fit the feed (a null, a ragged column)
    ├── TFRecordCorruptError (IOError)    a TFRecord file is damaged (CRC, length, truncation, stream)
    ├── SchemaMismatchError (ValueError)  a value does not fit its column of a tf.train.Example
    ├── NodesStoppedError                 shutdown stopped a main that had not returned
    ├── TensorBoardError                  tensorboard=True, but TensorBoard did not start
    └── ClusterClosedError                the cluster is already shut down

Every exception pickles with its attributes (``__reduce__``), so one raised where a node runs
arrives whole on the driver.
"""

from __future__ import annotations

from typing import Any, List, Optional

from duotf._enum import StrEnum

__all__ = [
    "DuotfError",
    "ConfigError",
    "UnsupportedProtocolError",
    "PortRangeError",
    "BackendError",
    "InsufficientSlotsError",
    "ReservationTimeoutError",
    "NodeError",
    "NodeFailedError",
    "NodeUnresponsiveError",
    "NodesStoppedError",
    "TensorBoardError",
    "ClusterClosedError",
    "FeedError",
    "FeedSchemaError",
    "TFRecordCorruptError",
    "SchemaMismatchError",
]


class DuotfError(Exception):
    """Base of every error duotf raises."""

    def __init__(self, message: str, **attrs: Any):
        super().__init__(message)
        self.message = message
        self._attrs = attrs
        for key, value in attrs.items():
            setattr(self, key, value)

    def __reduce__(self):
        return (_rebuild, (type(self), self.message, self._attrs))

    @property
    def attributes(self) -> dict:
        """The error's typed attributes (what it pickles with besides its message)."""
        return dict(self._attrs)

    def __str__(self) -> str:
        return self.message


def _rebuild(cls, message, attrs):
    err = cls.__new__(cls)
    DuotfError.__init__(err, message, **attrs)
    return err


class ConfigError(DuotfError, ValueError):
    """A setting or argument is wrong; the message names it and what to change."""


class UnsupportedProtocolError(ConfigError):
    """The TensorFlow installed on the nodes has no server for the requested protocol.

    Attributes: ``protocol``, ``tf_version``, ``host``.
    """

    protocol: str
    tf_version: str
    host: str


class PortRangeError(ConfigError):
    """No free port left in the range duotf may listen on (``DUOTF_PORTS``, ``duotf.run(...,
    ports=)``) for one of its servers.

    Attributes: ``ports`` (the range, ``"lo-hi"``), ``host``, ``what`` (the server).
    """

    ports: str
    host: str
    what: str


class BackendError(DuotfError):
    """The engine failed or refused; the engine's own error is chained as ``__cause__``."""


class InsufficientSlotsError(BackendError):
    """The engine has fewer places to run nodes than the cluster needs.

    Attributes: ``needed``, ``available``, ``backend``.
    """

    needed: int
    available: int
    backend: str


class ReservationTimeoutError(DuotfError, TimeoutError):
    """Not every node registered (or became ready) before ``reservation_timeout``.

    Attributes: ``registered``, ``expected``, ``missing`` (node ids), ``timeout``.
    """

    registered: int
    expected: int
    missing: List[int]
    timeout: float


class NodeError(DuotfError):
    """One node went wrong. Attributes: ``node_id``, ``role``, ``host``, ``pid``."""

    node_id: int
    role: str
    host: Optional[str]
    pid: Optional[int]


class NodeFailedError(NodeError):
    """A node's ``main`` raised, or its process exited or was killed.

    Attributes: ``exitcode`` (negative: the signal), ``remote_type``, ``remote_traceback``,
    ``output_tail`` (the node's last lines of stdout and stderr, at most 100, also at the end of
    the message; empty where its output does not go to the driver: ``log_to_driver``).
    """

    exitcode: Optional[int]
    remote_type: Optional[str]
    remote_traceback: Optional[str]
    output_tail: List[str]


class NodeUnresponsiveError(NodeError):
    """A node sent no heartbeat for ``heartbeat_timeout`` seconds (stopped, hung, or lost)."""


class FeedError(DuotfError):
    """Feeding data failed: counting the rows, a partition's data source, a feeding task or its
    process, or a node that died or took no data for ``feed_timeout`` seconds.

    The first line says what failed where: ``feeding epoch E failed on <node>: ...`` (or
    ``inference failed ...``), the partition, and the underlying error. Attributes, each None
    where it is not known: ``epoch`` (from 1; None in inference), ``partition`` (the feed's
    partition), ``node`` (the label of the node it was fed to), ``rows`` (rows of that range
    delivered, or sent by the task, before it broke), ``cause`` (the data source's or the
    engine's own error, in one line). ``lost`` is True where the engine lost the feeding task's
    process (an executor, Python worker or Dask worker went away mid-range), not where the data
    or a node failed: a cluster run with ``max_restarts`` restarts on it (cause ``"lost"``).
    ``stuck`` is True where the node was alive but took no data for ``feed_timeout`` seconds
    (its main is not reading its feed): the feed fails at once, not a partition at a time.
    """

    # None where an error does not know them
    epoch: Optional[int] = None
    partition: Optional[int] = None
    node: Optional[str] = None
    rows: Optional[int] = None
    cause: Optional[str] = None
    lost: bool = False
    stuck: bool = False


class FeedProblem(StrEnum):
    """What a :class:`FeedSchemaError` found wrong: its ``problem``.

    A member is the string it names (``FeedProblem.NULL == "null"``), and prints as it.

    Attributes
    ----------
    NULL:
        A null in a column, or inside a row's array.
    RAGGED:
        Rows of different lengths (or shapes) in an array column not declared ragged.
    TYPE:
        An array column of anything but numbers (strings, bytes, nested arrays), or a row that
        is no array where the rows before it are.
    """

    NULL = "null"
    RAGGED = "ragged"
    TYPE = "type"


class FeedSchemaError(FeedError):
    """A partition holds data the feed refuses rather than change silently: a null in a column,
    rows of different lengths in an array column that was not declared ragged, or an array
    column of anything but numbers (strings, bytes, nested arrays).

    Raised by the feeding task, before the rows are sent. Attributes: ``column``,
    ``partition``, ``row`` (the first offending row, counted from 0 within the partition),
    ``problem`` (a :class:`FeedProblem`: ``"null"``, ``"ragged"`` or ``"type"``), ``hint`` (what to change: fill or drop
    nulls, filter or pad rows, declare the column with ``ragged=[...]``, or encode the values as
    numbers), ``node`` (None). The message is one line: what is wrong, where, and the hint.
    """

    column: str
    row: int
    problem: FeedProblem
    hint: str

    def __init__(self, message: str, **attrs: Any):
        # A problem named by its string (an error rebuilt from JSON: the JVM feed's records)
        # becomes its member, so that ``problem`` is a FeedProblem wherever it was raised.
        if isinstance(attrs.get("problem"), str) and attrs["problem"] in _PROBLEMS:
            attrs["problem"] = FeedProblem(attrs["problem"])
        super().__init__(message, **attrs)

    def located(self, partition: Optional[int], offset: int) -> "FeedSchemaError":
        """The same error, for the rows of ``partition`` that start at row ``offset``."""
        attrs = self.attributes
        attrs.update(partition=partition, row=attrs["row"] + offset)
        return type(self)(schema_message(**attrs), **attrs)


_PROBLEMS = frozenset(problem.value for problem in FeedProblem)


def cause_of(exc: BaseException) -> str:
    """An error in one line, for the ``cause`` of another: its type and its message's first
    line."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:500]}" if lines else type(exc).__name__


def schema_message(column, partition, row, problem, what, hint, node=None) -> str:
    """The message of a :class:`FeedSchemaError` (first line: what is wrong, where)."""
    where = f"row {row}" if partition is None else f"row {row} of partition {partition}"
    return f"column {column!r}: {what.format(where=where)}; {hint}"


def feed_schema_error(column: str, row: int, problem: FeedProblem, what: str,
                      hint: str) -> FeedSchemaError:
    """A :class:`FeedSchemaError` for ``row`` of a chunk whose partition is not known yet (the
    feeding task places it with :meth:`FeedSchemaError.located`). ``what`` may name the place
    as ``{where}``."""
    attrs = dict(column=column, partition=None, row=int(row), problem=problem, what=what,
                 hint=hint, node=None)
    return FeedSchemaError(schema_message(**attrs), **attrs)


class TFRecordCorruptError(DuotfError, IOError):
    """A TFRecord file is damaged: a record fails its CRC, has an impossible length, is cut
    short, or the GZIP/ZLIB stream around the records cannot be decoded.

    Attributes: ``url``; ``offset``, where the damage is in the record stream (decompressed for
    GZIP/ZLIB): the start of the bad record, or for a damaged compressed stream the number of
    bytes decoded before it; ``record_offset``, the start of the first record not delivered
    (every record before it was); ``compressed_offset``, the position in the compressed file
    where the decompressor found the damage (``None`` where there is none); ``reason``.
    """

    url: str
    offset: int
    record_offset: Optional[int]
    compressed_offset: Optional[int]
    reason: str


class SchemaMismatchError(DuotfError, ValueError):
    """A value does not fit its column. Attributes: ``column``, ``expected``, ``value``."""

    column: str
    expected: str
    value: Any


class NodesStoppedError(DuotfError):
    """``shutdown`` stopped nodes whose ``main`` had not returned within the grace period.

    Attributes: ``stopped`` (role names), ``grace_secs``.
    """

    stopped: List[str]
    grace_secs: float


class TensorBoardError(DuotfError):
    """``duotf.run(..., tensorboard=True)``: TensorBoard did not start beside the chief (not
    installed there, exited, or silent); the nodes run on. ``node``: the node that was to run
    it."""

    node: str


class ClusterClosedError(DuotfError):
    """The cluster was already shut down."""
