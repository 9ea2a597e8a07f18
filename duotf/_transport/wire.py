"""The data path between a feeding task and a node: columnar batches over a TCP connection.

A connection is authenticated once with a challenge-response under the job's secret (HMAC of
a random nonce) at the node's gate (:mod:`duotf._transport.gate`: a bounded hello, a deadline, a bounded
number of connections authenticating at once), then carries frames::

    4-byte big-endian header length | header (UTF-8 JSON, space-padded) | column buffers

The header's ``"t"`` is the frame's kind, a :class:`Frame` (a frame of any other kind is a
protocol error that closes its connection). The header lists each column as
``[name, kind, dtype, shape_tail, nbytes]``. ``kind`` "nd" is a numeric numpy array sent as its
raw buffer; "bytes"/"str" columns are an int64 offsets array followed by the bytes; a "ragged"
column (:class:`~duotf._transport.columns.RaggedColumn`) is its int64 row splits followed by its
numeric values (``nbytes`` of ``dtype``). Every
buffer starts at a multiple of :data:`ALIGN` bytes from the frame's start (zero padding after
each buffer, spaces after the header), so that a frame received into, or mapped at, an aligned
address gives arrays that TensorFlow takes without copying. A frame is sent with one gathering
``sendmsg`` and received with one ``recv_into`` for all its buffers; no per-row work on either
side.
Only plain numeric dtypes are accepted; nothing received is ever unpickled. Frames carry no
per-frame MAC: the data path runs at memory speed and trusts the authenticated connection.
"""

from __future__ import annotations

import enum
import json
import random
import socket
import struct
import time
from typing import IO, Any, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from duotf._deadline import Deadline
from duotf._transport import gate
from duotf._transport import tls as tls_
from duotf._transport.columns import Columns, RaggedColumn

MAGIC = b"DFEED1"
DOMAIN = b"duotf-feed"  # what a client's proof covers with the nonce (see duotf._transport.gate)
_LEN = struct.Struct(">I")
MAX_HEADER = 1 << 20
ALIGN = 64  # column buffers start at multiples of this in a frame (TF's own tensor alignment)
_ZEROS = memoryview(bytes(ALIGN))
_IOV_MAX = 512


class FeedProtocolError(ConnectionError):
    """The peer is not an authenticated duotf feed endpoint, or sent a malformed frame."""


#: seconds between a node's WAIT answers to a range waiting for its turn
WAIT_S = 5.0


class Frame(str, enum.Enum):
    """The kind of a feed frame (its header's ``"t"``)."""

    # feeding task (or driver) -> node
    BATCH = "batch"  # rows
    FILE = "file"  # a batch frame in a feed cache file on the node's host, read there
    SLOT = "slot"  # a batch frame in a slot of a shared memory ring (see .shm)
    RING = "ring"  # a shared memory ring to open; the node answers "ring"
    PROBE = "probe"  # can the node read a feed cache file? It answers "probe"
    MARKER = "marker"  # an epoch or end :class:`Marker`, queued after every batch before it
    END = "end"  # a feeding task's rows end
    ORDER = "order"  # a training task's range: its place in the node's order of the epoch
    # node -> feeding task, answering ORDER
    WAIT = "wait"  # the ranges before this one are still being read (sent every WAIT_S)
    TURN = "turn"  # this range's turn: send
    DELIVERED = "delivered"  # an earlier attempt delivered this whole range: send none of it
    REFUSED = "refused"  # the epoch failed on this node (a range broke after delivering rows)
    # node -> feeding task (or driver)
    ACK = "ack"  # a marker queued, or (training) a task's rows queued
    TERMINATED = "terminated"  # main terminated its feed: no more data is wanted
    FREE = "free"  # shared memory slots the node no longer reads
    RESULT = "result"  # inference results, one row per row fed, in order

    def __str__(self) -> str:  # the value, as on the wire, in messages and logs
        return self.value


class Marker(str, enum.Enum):
    """What a "marker" frame marks (its ``"marker"``)."""

    EPOCH = "epoch"  # an epoch ends; more follow
    END = "end"  # the data ends
    FAIL = "fail"  # the feed failed (its "why"): the node's reads raise at once, nothing queued

    def __str__(self) -> str:
        return self.value


class UnknownFrameError(FeedProtocolError):
    """A frame of a kind (or a marker) that this end of the connection does not take."""


_FRAMES: Dict[Any, Frame] = {kind.value: kind for kind in Frame}


def frame_kind(header: dict) -> Frame:
    """The kind of a received frame; :class:`UnknownFrameError` where it is no :class:`Frame`."""
    try:
        kind = _FRAMES.get(header.get("t"))
    except TypeError:  # an unhashable "t"
        kind = None
    if kind is None:
        raise UnknownFrameError(f"unknown feed frame kind {header.get('t')!r}")
    return kind


def marker_kind(header: dict) -> Marker:
    """The marker of a "marker" frame; :class:`UnknownFrameError` where it is no :class:`Marker`."""
    try:
        return Marker(header.get("marker"))
    except ValueError:
        raise UnknownFrameError(f"unknown feed marker {header.get('marker')!r}") from None


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("feed connection closed")
        got += k
    return bytes(buf)


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("feed connection closed")
        got += k


def client_handshake(sock: socket.socket, secret: bytes, tls: Optional[tls_.Material] = None) -> socket.socket:
    """The feeding end's proof of the job's secret on ``sock``, then TLS where the job has
    ``tls``: the socket to use."""
    try:
        return gate.open_client(sock, secret, MAGIC, DOMAIN, tls)[0]
    except gate.Refused as exc:
        raise FeedProtocolError(f"not this job's duotf feed endpoint: {exc}") from None


#: TCP keepalive of a feed connection: first probe after this many idle seconds, then one
#: every KEEPALIVE_INTERVAL, KEEPALIVE_COUNT unanswered in a row end it
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 10, 5, 3


def keepalive(sock: socket.socket, idle: int = KEEPALIVE_IDLE, interval: int = KEEPALIVE_INTERVAL,
              count: int = KEEPALIVE_COUNT) -> None:
    """Let the kernel probe ``sock`` while it is idle, so that a peer whose host is gone (its
    connection never closes: no FIN, no RST ever comes) fails its reads after about ``idle +
    interval * count`` seconds instead of never. A live peer's kernel answers the probes even
    while its process is slow or stopped. The timings are Linux's (elsewhere the system's
    defaults, of hours, apply)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval), ("TCP_KEEPCNT", count)):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


def connect(address: Tuple[str, int], secret: bytes, timeout: float,
            tls: Optional[tls_.Material] = None) -> socket.socket:
    """An authenticated connection to a node's feed port (encrypted where the job has ``tls``).
    Where the node's gate closes it during the handshake (crowded by other connections), it is
    tried again with backoff within ``timeout``; a node that refuses the secret, or is not
    listening, raises at once."""
    deadline = Deadline.after(timeout)
    delay = 0.05
    while True:
        sock = socket.create_connection(address, timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
                sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
            return client_handshake(sock, secret, tls)
        except FeedProtocolError:
            sock.close()
            raise
        except OSError:
            sock.close()
            if (deadline.remaining or 0.0) < delay:  # no time left for another try (bounded)
                raise
        time.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 2, 1.0)


def send_markers(addresses: List[Tuple[str, int]], secret: bytes, marker: "Marker", timeout: float,
                 answers: Optional[list] = None, *, tls: Optional[tls_.Material] = None,
                 **fields) -> Tuple[int, Optional[str]]:
    """Send ``marker`` (with ``fields``) to the feed servers at ``addresses`` in turn, each on a
    connection of its own, and wait for each answer (appended to ``answers``, a header each,
    where given). Returns how many took it, and the error that stopped it at the next one
    (None: all took it). The driver calls it where it reaches the nodes: in its own process,
    or in an engine task when a relay stands between."""
    for i, address in enumerate(addresses):
        try:
            sock = connect(address, secret, timeout, tls)
            try:
                send_frame(sock, Frame.MARKER, marker=marker, **fields)
                answer, _ = recv_frame(sock)  # ACK, or TERMINATED
                if answers is not None:
                    answers.append(answer)
            finally:
                sock.close()
        except OSError as exc:  # (FeedProtocolError is one)
            return i, str(exc) or type(exc).__name__
    return len(addresses), None


def _encode_column(name: str, values) -> Tuple[list, list]:
    if isinstance(values, RaggedColumn):
        flat = np.ascontiguousarray(values.values)
        if flat.dtype.kind not in "biuf":
            raise TypeError(f"ragged column {name!r}: dtype {flat.dtype} cannot be fed; use numbers")
        return [name, "ragged", flat.dtype.str, [], flat.nbytes], [values.row_splits, flat]
    arr = values if isinstance(values, np.ndarray) else None
    if arr is not None and arr.dtype == object and arr.ndim > 1:
        # rows of arrays of objects (strings, nested arrays): their bytes would be pointers
        raise TypeError(f"column {name!r}: an array of {arr.dtype} values with shape {arr.shape} "
                        "cannot be fed; arrays must hold numbers (encode strings as numbers or "
                        "join them into one str/bytes column)")
    if arr is None or arr.dtype == object:
        seq = list(values)
        kind = "str" if seq and isinstance(seq[0], str) else "bytes"
        data = [v.encode() if isinstance(v, str) else v if isinstance(v, bytes) else _as_bytes(name, v)
                for v in seq]
        offsets = np.zeros(len(data) + 1, dtype=np.int64)
        np.cumsum([len(d) for d in data], out=offsets[1:])
        blob = b"".join(data)
        return [name, kind, "", [], len(blob)], [offsets, blob]
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"column {name!r}: dtype {arr.dtype} cannot be fed; use numbers, str or bytes")
    arr = np.ascontiguousarray(arr)
    return [name, "nd", arr.dtype.str, list(arr.shape[1:]), arr.nbytes], [arr]


def _as_bytes(name: str, value) -> bytes:
    """A value of a str/bytes column that is neither: bytes-like ones are taken, anything else
    (a number, an array, whose ``bytes()`` would be zeros or raw memory) is refused."""
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"column {name!r}: a {type(value).__name__} value in a column of str/bytes "
                    "values cannot be fed; give every row of the column str or bytes")


def _padding(n: int) -> int:
    return -n % ALIGN


def _encode(kind: Frame, columns: Optional[Columns] = None, **fields) -> List[memoryview]:
    """The frame as a list of buffers to send in order: the header, then each column buffer
    followed by its padding (the column buffers are views, not copies)."""
    header = {"t": kind, **fields}
    buffers = []
    if columns:
        specs = []
        rows = None
        for name, values in columns.items():
            spec, bufs = _encode_column(name, values)
            n = len(bufs[0]) - 1 if spec[1] != "nd" else len(bufs[0])
            if rows is None:
                rows = n
            elif rows != n:
                raise ValueError(f"column {name!r} has {n} rows, others have {rows}")
            specs.append(spec)
            buffers += bufs
        header["cols"] = specs
        header["rows"] = rows
    body = json.dumps(header).encode()
    body += b" " * _padding(_LEN.size + len(body))
    parts = [memoryview(_LEN.pack(len(body)) + body)]
    for buf in buffers:
        if not len(buf) or (isinstance(buf, np.ndarray) and not buf.nbytes):
            continue
        # numpy's stubs make an ndarray a Buffer on Python 3.12+ only; it is one on every Python
        view = (memoryview(buf).cast("B")  # type: ignore[arg-type]
                if isinstance(buf, np.ndarray) else memoryview(buf))
        parts.append(view)
        if _padding(len(view)):
            parts.append(_ZEROS[:_padding(len(view))])
    return parts


def _send_all(sock: socket.socket, parts: List[memoryview]) -> None:
    """``sendall`` of several buffers, gathered into as few ``sendmsg`` calls as the kernel
    takes (one ``sendall`` each over TLS, which has no ``sendmsg``)."""
    if tls_.encrypted(sock):
        for part in parts:
            sock.sendall(part)
        return
    parts = list(parts)
    while parts:
        sent = sock.sendmsg(parts[:_IOV_MAX])
        while parts and sent >= len(parts[0]):
            sent -= len(parts[0])
            parts.pop(0)
        if sent:
            parts[0] = parts[0][sent:]


def send_frame(sock: socket.socket, kind: Frame, columns: Optional[Columns] = None, **fields) -> None:
    _send_all(sock, _encode(kind, columns, **fields))


frame_parts = _encode  # a frame as the buffers to send or copy, in order
send_parts = _send_all


class Packed(NamedTuple):
    """A packed "batch" frame and its row count (see :func:`pack_frame`)."""

    rows: int
    data: bytes


class FileFrame(NamedTuple):
    """A packed "batch" frame stored in an open file, at ``offset`` (see :func:`pack_frame`)."""

    rows: int
    file: IO[bytes]  # a binary file object
    offset: int
    length: int

    def read(self) -> bytes:
        self.file.seek(self.offset)
        data = self.file.read(self.length)
        if len(data) != self.length:
            raise OSError(f"{getattr(self.file, 'name', 'file')}: frame at {self.offset} is cut short")
        return data


class FileRef(NamedTuple):
    """A packed "batch" frame in a file that this process need not see: sent as a "file"
    frame naming where it lies, for a node on the file's host to read itself (the feed of
    kept frames from the driver, :mod:`duotf.backends.spark.feed`)."""

    rows: int
    path: str
    offset: int
    length: int


#: a packed frame, sent as it is (or named): its columns are decoded only where a range splits it
PACKED = (Packed, FileFrame, FileRef)


def probe_file(sock: socket.socket, path: str, reply=None) -> bool:
    """Whether the node at the other end of ``sock`` says it can open the feed cache file
    ``path`` itself."""
    send_frame(sock, Frame.PROBE, path=path)
    header = reply(Frame.PROBE) if reply else recv_frame(sock)[0]
    return header.get("t") == Frame.PROBE and bool(header.get("ok"))


def send_file_ref(sock: socket.socket, ref: FileRef, start: int = 0, stop: Optional[int] = None) -> None:
    """A "file" frame naming ``ref``; ``start``/``stop``: only those rows of it."""
    fields: Dict[str, Any] = ({} if start == 0 and stop in (None, ref.rows)
                              else {"start": start, "stop": stop})
    send_frame(sock, Frame.FILE, path=ref.path, offset=ref.offset, length=ref.length,
               rows=ref.rows, **fields)


def reads_files(sock: socket.socket, frame, reply=None) -> bool:
    """Whether the node at the other end of ``sock`` can read ``frame``'s file itself: it is on
    this host (the same address at both ends) and says it can open the file. ``reply(kind)``
    reads the node's answer (by default the next frame)."""
    try:
        if not isinstance(frame, FileFrame) or sock.getsockname()[0] != sock.getpeername()[0]:
            return False
    except OSError:
        return False
    return probe_file(sock, frame.file.name, reply)


def send_packed(sock: socket.socket, frame, local: bool = False) -> None:
    """Send a :class:`Packed` or :class:`FileFrame` as it is. A file frame goes with
    ``sendfile`` (from the page cache to the socket, not through this process) or, to a peer on
    this host (``local``), as a "file" frame naming where it lies, which the peer reads itself."""
    if isinstance(frame, FileRef):
        send_file_ref(sock, frame)
    elif isinstance(frame, FileFrame) and local:
        send_frame(sock, Frame.FILE, path=frame.file.name, offset=frame.offset, length=frame.length,
                   rows=frame.rows)
    elif isinstance(frame, FileFrame):
        sent = sock.sendfile(frame.file, frame.offset, frame.length)
        if sent != frame.length:
            raise OSError(f"{getattr(frame.file, 'name', 'file')}: sent {sent} of {frame.length} bytes")
    else:
        sock.sendall(frame.data)


def pack_frame(columns: Columns) -> bytes:
    """A "batch" frame as one bytes object, to keep (e.g. cached in Spark) and send as it is."""
    return b"".join(_encode(Frame.BATCH, columns))


def _nd_dtype(name: str, dtype: str, rows: int, tail, nbytes: int) -> np.dtype:
    """The dtype of an announced numeric column, once it is a plain number type whose size
    matches the bytes announced (nothing else is built from the wire)."""
    dt = np.dtype(dtype)
    if dt.kind not in "biuf":
        raise FeedProtocolError(f"column {name!r}: dtype {dtype} is not accepted")
    expected = rows * int(np.prod(tail, dtype=np.int64)) * dt.itemsize
    if expected != nbytes:
        raise FeedProtocolError(f"column {name!r}: {nbytes} bytes announced for {(rows, *tail)} {dt}")
    return dt


def aligned_buffer(nbytes: int) -> np.ndarray:
    """A new uint8 array of ``nbytes`` whose data starts at a multiple of :data:`ALIGN`."""
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + nbytes]


def _layout(header: dict) -> Tuple[list, int]:
    """Where each announced column lies in the frame's body, and the body's size; the header's
    column list is checked first, so nothing is allocated for a malformed one."""
    rows = header.get("rows", 0)
    #: (name, kind, dtype (None: bytes or str), tail, nbytes, position) of each column
    layout: List[Tuple[str, str, Optional[np.dtype], list, int, int]] = []
    pos = 0
    for name, kind, dtype, tail, nbytes in header.get("cols", []):
        if kind == "nd":
            layout.append((name, kind, _nd_dtype(name, dtype, rows, tail, nbytes), tail, nbytes, pos))
            pos += nbytes + _padding(nbytes)
        elif kind in ("bytes", "str", "ragged"):
            offsets = 8 * (rows + 1)
            dt: Optional[np.dtype] = None
            if kind == "ragged":
                dt = np.dtype(dtype)
                if dt.kind not in "biuf" or tail or nbytes % dt.itemsize:
                    raise FeedProtocolError(f"ragged column {name!r}: {nbytes} bytes of {dtype}")
            layout.append((name, kind, dt, tail, nbytes, pos))
            pos += offsets + _padding(offsets) + nbytes + _padding(nbytes)
        else:
            raise FeedProtocolError(f"column {name!r}: unknown kind {kind!r}")
    return layout, pos


def _columns(header: dict, layout: list, body) -> Columns:
    """The columns of a frame's body: numeric ones are views of ``body``."""
    rows = header.get("rows", 0)
    columns: Columns = {}
    for name, kind, dt, tail, nbytes, pos in layout:
        if kind == "nd":
            columns[name] = np.frombuffer(body, dt, count=nbytes // max(dt.itemsize, 1),
                                          offset=pos).reshape(rows, *tail)
            continue
        offsets = np.frombuffer(body, np.int64, count=rows + 1, offset=pos)
        pos += offsets.nbytes + _padding(offsets.nbytes)
        size = nbytes // dt.itemsize if kind == "ragged" else nbytes
        if offsets[0] != 0 or offsets[-1] != size or np.any(np.diff(offsets) < 0):
            raise FeedProtocolError(f"column {name!r}: offsets do not match its {nbytes} bytes")
        if kind == "ragged":
            columns[name] = RaggedColumn(np.frombuffer(body, dt, count=size, offset=pos), offsets)
            continue
        blob = bytes(memoryview(body)[pos:pos + nbytes])
        items = [blob[offsets[i]:offsets[i + 1]] for i in range(rows)]
        columns[name] = [x.decode() for x in items] if kind == "str" else items
    return columns


def unpack_frame(data) -> Tuple[dict, Columns]:
    """The header and columns of a packed frame; numeric columns are views of ``data``."""
    view = memoryview(data).cast("B")
    (length,) = _LEN.unpack(view[:_LEN.size])
    if length > MAX_HEADER:
        raise FeedProtocolError(f"feed header of {length} bytes announced")
    header = json.loads(bytes(view[_LEN.size:_LEN.size + length]))
    layout, size = _layout(header)
    body = view[_LEN.size + length:]
    if len(body) < size:
        raise FeedProtocolError(f"frame of {len(view)} bytes is cut short: its header announces "
                                f"{_LEN.size + length + size}")
    return header, _columns(header, layout, body)


def recv_frame(sock: socket.socket) -> Tuple[dict, Columns]:
    """The next frame: its header, and its columns, all received with one ``recv_into`` into a
    new aligned buffer (numeric columns are views of it)."""
    (length,) = _LEN.unpack(recv_exact(sock, _LEN.size))
    if length > MAX_HEADER:
        raise FeedProtocolError(f"feed header of {length} bytes announced")
    try:
        header = json.loads(recv_exact(sock, length))
    except ValueError as exc:
        raise FeedProtocolError(f"feed header is not JSON: {exc}") from None
    layout, size = _layout(header)
    if not size:
        return header, _columns(header, layout, b"")
    body = aligned_buffer(size)
    _recv_into(sock, memoryview(body))  # type: ignore[arg-type]  # (see _encode)
    return header, _columns(header, layout, body)
