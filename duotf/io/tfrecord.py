"""TFRecord files over any fsspec URL: a streaming reader and writer, byte-compatible with TF.

A record on disk is::

    uint64 length (little-endian) | uint32 masked CRC-32C of the length bytes
    length bytes of data          | uint32 masked CRC-32C of the data

optionally inside a GZIP or ZLIB stream (TF's ``compression_type``). Both CRCs are checked on
read. Files are read in chunks and never loaded whole: a length field is trusted only up to
``max_record_bytes`` and, for an uncompressed file of known size, the bytes left in it.

Damage never costs a good record before it: the reader delivers every record up to the damaged
spot, then raises :class:`TFRecordCorruptError` (or, with ``skip_corrupt``, skips what cannot be
framed and goes on; see :class:`TFRecordReader`). GZIP/ZLIB streams are decoded up to the damage.
"""

from __future__ import annotations

import gzip
import io
import logging
import os
import struct
import zlib
from typing import Any, BinaryIO, Iterable, Iterator, List, Optional, Tuple, Union

import crc32c as _crc32c

from duotf.errors import TFRecordCorruptError

logger = logging.getLogger(__name__)

__all__ = [
    "TFRecordCorruptError",
    "TFRecordReader",
    "TFRecordWriter",
    "read_records",
    "write_records",
    "resolve_compression",
    "masked_crc",
]

_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8
_PACK_Q = struct.Struct("<Q").pack
_PACK_I = struct.Struct("<I").pack
_CHUNK = 1 << 20
_IN_CHUNK = 1 << 20  # compressed bytes read at a time
MAX_RECORD_BYTES = (1 << 31) - 1  # a tf.train.Example (a protobuf) cannot be larger
_ZEROS4 = b"\0\0\0\0"

COMPRESSIONS = ("NONE", "GZIP", "ZLIB")


def masked_crc(data: Union[bytes, bytearray, memoryview]) -> int:
    """The masked CRC-32C of ``data``, as a TFRecord file stores it beside each length and
    record (TensorFlow's ``crc32c::Mask``): a reader compares it to find a corrupt record."""
    crc = _crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def resolve_compression(compression: Optional[str], url: str = "") -> str:
    """``None``/"" -> NONE; "infer" guesses from the suffix (.gz, .zlib); case-insensitive."""
    if compression == "infer":
        lower = url.lower()
        return "GZIP" if lower.endswith(".gz") else "ZLIB" if lower.endswith(".zlib") else "NONE"
    value = (compression or "NONE").upper()
    if value not in COMPRESSIONS:
        raise ValueError(f"compression={compression!r}: use one of {', '.join(COMPRESSIONS)} or 'infer'")
    return value


class _StreamDamage(Exception):
    """The GZIP/ZLIB stream cannot be decoded past ``compressed_offset``."""

    def __init__(self, reason: str, compressed_offset: int):
        super().__init__(reason)
        self.reason = reason
        self.compressed_offset = compressed_offset


class _Inflater:
    """The decoded bytes of a GZIP (members in turn) or ZLIB stream, as far as it decodes.

    zlib raises on damage and drops what the failing call had decoded, so that call is replayed
    from a copy of the state before it, 4 KiB and then one byte at a time: every byte decoded
    before the damage is returned, then :class:`_StreamDamage` is raised with the position in the
    compressed file where zlib found it.
    """

    def __init__(self, raw: BinaryIO, codec: str):
        self._raw = raw
        self._codec = codec
        self._wbits = 31 if codec == "GZIP" else 15
        self._d = zlib.decompressobj(self._wbits)
        self._in = b""  # compressed bytes not yet given to self._d
        self._in_pos = 0  # position of self._in[0] in the compressed file
        self._started = False
        self._out: List[bytes] = []
        self._out_len = 0
        self._error: Optional[_StreamDamage] = None
        self._done = False

    def read(self, n: int) -> bytes:
        """At least one decoded byte (maybe more than ``n``), b"" at the end, or the damage."""
        while self._out_len < n and not self._done and self._error is None:
            self._step()
        if self._out:
            data = self._out[0] if len(self._out) == 1 else b"".join(self._out)
            self._out, self._out_len = [], 0
            return data
        if self._error is not None:
            raise self._error
        return b""

    def _emit(self, data: bytes) -> None:
        if data:
            self._out.append(data)
            self._out_len += len(data)

    def _consumed(self, data: bytes, rest: bytes) -> None:
        self._in_pos += len(data) - len(rest)
        self._in = rest

    def _step(self) -> None:
        if self._d.eof:
            if self._codec != "GZIP":
                self._done = True  # a ZLIB stream is one stream; what follows it is not read
                return
            stripped = self._in.lstrip(b"\0")  # zero padding between members, as gzip allows
            self._consumed(self._in, stripped)
            if not self._in:
                self._in = self._raw.read(_IN_CHUNK)
                if not self._in:
                    self._done = True
                return
            self._d = zlib.decompressobj(self._wbits)  # the next member
        if not self._in:
            self._in = self._raw.read(_IN_CHUNK)
            if not self._in:
                if not self._started:
                    self._done = True  # an empty file holds no records
                    return
                self._emit(self._d.flush())
                self._error = _StreamDamage(
                    f"the {self._codec} stream ends before its end marker: truncated", self._in_pos)
                return
            self._started = True
        data = self._in
        before = self._d.copy()
        try:
            out = self._d.decompress(data, _CHUNK)
        except zlib.error as exc:
            self._d = before
            self._salvage(data, exc)
            return
        self._consumed(data, self._d.unused_data if self._d.eof else self._d.unconsumed_tail)
        self._emit(out)

    def _salvage(self, data: bytes, exc: zlib.error) -> None:
        pos = 0
        while pos < len(data):
            piece = data[pos : pos + 4096]
            before = self._d.copy()
            try:
                self._emit(self._d.decompress(piece))
                step = len(piece)
            except zlib.error:
                self._d = before
                for i in range(len(piece)):
                    try:
                        self._emit(self._d.decompress(piece[i : i + 1]))
                    except zlib.error as err:
                        self._fail(err, self._in_pos + pos + i)
                        return
                    if self._d.eof:
                        break
                step = i + 1
            if self._d.eof:  # a GZIP member ended before the damage
                done = pos + step - len(self._d.unused_data)
                self._consumed(data, data[done:])
                return
            pos += step
        self._fail(exc, self._in_pos + len(data))

    def _fail(self, exc: zlib.error, compressed_offset: int) -> None:
        self._error = _StreamDamage(f"the {self._codec} stream is damaged ({exc})", compressed_offset)


class _ZlibWriter(io.RawIOBase):
    def __init__(self, raw: BinaryIO):
        self._raw = raw
        self._deflate = zlib.compressobj()

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self._raw.write(self._deflate.compress(bytes(b)))
        return len(b)

    def close(self) -> None:
        if not self.closed:
            self._raw.write(self._deflate.flush())
        super().close()


def _open(url: str, mode: str, storage_options: Optional[dict]):
    from duotf.io.files import open_url

    return open_url(url, mode, storage_options)


def _size_of(raw) -> Optional[int]:
    """The size of an open file where the filesystem knows it cheaply, else None."""
    size = getattr(raw, "size", None)
    if isinstance(size, int):
        return size
    try:
        return os.fstat(raw.fileno()).st_size
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None


class TFRecordReader:
    """Iterate the records of one TFRecord file at ``url``.

    Every good record before a damaged spot is delivered, in order. Then, by default,
    :class:`TFRecordCorruptError` is raised, naming the file and where the damage is.

    Parameters
    ----------
    url:
        Any fsspec URL or local path.
    compression:
        "NONE", "GZIP", "ZLIB" or "infer" (from the suffix).
    skip_corrupt:
        Skip what is damaged instead of raising, and go on. A record whose length field is
        sound but whose data fails its CRC is skipped alone (counted in :attr:`skipped`). A
        region that cannot be framed (a length that fails its CRC, is larger than
        ``max_record_bytes`` or runs past the end of the file, a truncated tail) is skipped up
        to the next offset where a whole record checks out (length and data CRCs); its size is
        counted in :attr:`skipped_bytes`, as its record count is unknown. A GZIP/ZLIB stream
        cannot be decoded past damage: the rest of the file is lost. :attr:`corruptions` keeps
        one :class:`TFRecordCorruptError` per skipped spot, and a warning sums them up.
    max_record_bytes:
        A length field above this is damage, not an allocation (default 2 GiB - 1, the largest
        protobuf). For an uncompressed file whose size the filesystem knows, a length running
        past the end of the file is damage too.
    storage_options:
        Passed to fsspec (credentials, endpoint...).
    check_crc:
        False skips the CRC checks (faster; damage is then found only by impossible lengths,
        and skipping cannot re-frame after it).

    Attributes
    ----------
    skipped:
        Records skipped whole (framed by a sound length field).
    skipped_bytes:
        Every byte of the record stream (decompressed) skipped: skipped records, regions that
        could not be framed, and what a damaged compressed stream had decoded of a record.
    corruptions:
        The :class:`TFRecordCorruptError` of each damaged spot that was skipped.
    """

    def __init__(self, url: str, compression: Optional[str] = None, *, skip_corrupt: bool = False,
                 storage_options: Optional[dict] = None, check_crc: bool = True,
                 max_record_bytes: int = MAX_RECORD_BYTES):
        if not 0 < max_record_bytes <= MAX_RECORD_BYTES:
            raise ValueError(f"max_record_bytes={max_record_bytes}: use 1 to {MAX_RECORD_BYTES}")
        self.url = url
        self.compression = resolve_compression(compression, url)
        self.skip_corrupt = skip_corrupt
        self.storage_options = storage_options
        self.check_crc = check_crc
        self.max_record_bytes = max_record_bytes
        self.skipped = 0
        self.skipped_bytes = 0
        self.corruptions: List[TFRecordCorruptError] = []

    def __iter__(self) -> Iterator[bytes]:
        for batch in self.batches():
            yield from batch

    def batches(self, max_bytes: int = _CHUNK) -> Iterator[List[bytes]]:
        """Yield lists of records, about ``max_bytes`` of input at a time (fewer Python calls)."""
        with _open(self.url, "rb", self.storage_options) as raw:
            if self.compression == "NONE":
                stream, size = raw, _size_of(raw)
            else:
                stream, size = _Inflater(raw, self.compression), None
            yield from self._parse(stream, max_bytes, size)
        if self.corruptions:
            logger.warning("%s: skipped %d damaged spot(s): %d whole record(s), %d byte(s) in all; "
                           "the first: %s", self.url, len(self.corruptions), self.skipped,
                           self.skipped_bytes, self.corruptions[0].reason)

    def _damaged(self, offset: int, reason: str, *, record_offset: Optional[int] = None,
                 compressed_offset: Optional[int] = None, records: int = 0, nbytes: int = 0) -> None:
        """Raise the damage, or (skip_corrupt) count it and go on."""
        record_offset = offset if record_offset is None else record_offset
        where = f"at byte {offset}"
        if self.compression != "NONE":
            where += " of the decompressed stream"
            if compressed_offset is not None:
                where += f" (byte {compressed_offset} of the {self.compression} file)"
        delivered = (f"; the records before byte {record_offset} were delivered"
                     if record_offset != offset else "")
        err = TFRecordCorruptError(
            f"corrupt TFRecord in {self.url} {where}: {reason}{delivered}. Pass skip_corrupt=True "
            "to skip what is damaged and count it (reader.skipped, reader.skipped_bytes).",
            url=self.url, offset=offset, record_offset=record_offset,
            compressed_offset=compressed_offset, reason=reason,
        )
        if not self.skip_corrupt:
            raise err
        self.skipped += records
        self.skipped_bytes += nbytes
        self.corruptions.append(err)

    def _parse(self, stream, max_bytes: int, size: Optional[int]) -> Iterator[List[bytes]]:
        check = self.check_crc
        limit = self.max_record_bytes
        skip = self.skip_corrupt
        unpack_header = _HEADER.unpack_from
        unpack_footer = _FOOTER.unpack_from
        buf = b""
        pos = 0  # in buf
        base = 0  # stream offset of buf[0]
        final = False  # nothing more will be read
        damage: Optional[_StreamDamage] = None  # the compressed stream ended in damage
        gap = None  # (offset, reason) of a damaged region being skipped that cannot be framed
        need = 0
        while True:
            if not final:
                chunk, damage = _read_more(stream, max(max_bytes, need))
                final = not chunk
                if chunk:  # the rest of buf, then the chunk; base stays buf[0]'s offset
                    buf, base, pos = (buf[pos:] + chunk if pos < len(buf) else chunk), base + pos, 0
            out: List[bytes] = []
            end = len(buf)
            need = 0
            while pos < end:
                if gap is not None and not check:
                    pos = end  # without CRCs nothing can be re-framed: the rest is skipped
                    break
                if end - pos < 12:
                    if not final or damage:
                        break
                    problem = f"the file ends inside a record header ({end - pos} bytes): truncated"
                else:
                    length, length_crc = unpack_header(buf, pos)
                    stop = pos + 16 + length
                    if check and masked_crc(buf[pos : pos + 8]) != length_crc:
                        problem = "the length field fails its CRC"
                    elif length > limit:
                        problem = (f"the length field says {length} bytes, more than "
                                   f"max_record_bytes={limit}")
                    elif size is not None and base + stop > size:
                        problem = (f"a {length}-byte record runs past the end of the file "
                                   f"({size - base - pos} bytes left): truncated")
                    elif stop > end:
                        if not final or damage:
                            need = stop - end
                            break
                        problem = f"the file ends inside a {length}-byte record: truncated"
                    elif check and masked_crc(buf[pos + 12 : stop - 4]) != unpack_footer(buf, stop - 4)[0]:
                        if gap is None:  # the length is sound: skip this record alone
                            if out and not skip:
                                yield out
                                out = []
                            self._damaged(base + pos, f"the data of a {length}-byte record fails "
                                          "its CRC", records=1, nbytes=stop - pos)
                            pos = stop
                            continue
                        problem = "not a record"
                    else:
                        if gap is not None:  # re-framed: the damaged region ends here
                            self._damaged(gap[0], gap[1], nbytes=base + pos - gap[0])
                            gap = None
                        out.append(buf[pos + 12 : stop - 4])
                        pos = stop
                        continue
                if gap is None:
                    if out and not skip:
                        yield out
                        out = []
                    if not skip:
                        self._damaged(base + pos, problem)
                    gap = (base + pos, problem)
                # look for the next offset that could hold a length field <= limit (< 2^32)
                found = buf.find(_ZEROS4, pos + 5, end)
                pos = found - 4 if found != -1 else max(pos + 1, end - 7)
            if out:
                yield out
            if final:
                self._stream_ended(gap, damage, base, end, pos)
                return

    def _stream_ended(self, gap: Optional[tuple], damage: Optional["_StreamDamage"], base: int,
                      end: int, pos: int) -> None:
        """Raise (or count) what the stream's end left at ``base + end``: a damaged region
        ``gap`` (``(offset, reason)``) never re-framed, and the ``damage`` that ended a compressed
        stream, the rest of whose record from ``base + pos`` is lost."""
        if gap is not None:
            self._damaged(gap[0], gap[1], nbytes=base + end - gap[0])
        if damage is not None:
            self._damaged(base + end, damage.reason, record_offset=base + pos,
                          compressed_offset=damage.compressed_offset,
                          nbytes=0 if gap is not None else end - pos)


def _read_more(stream, want: int) -> Tuple[bytes, Optional["_StreamDamage"]]:
    """The next chunk of ``stream`` (``b""`` at its end), and the damage that ended a compressed
    stream there (None if it did not)."""
    try:
        return stream.read(want), None
    except _StreamDamage as exc:
        return b"", exc


def read_records(url: str, compression: Optional[str] = None, **kwargs: Any) -> Iterator[bytes]:
    """The records of one TFRecord file (see :class:`TFRecordReader`)."""
    return iter(TFRecordReader(url, compression, **kwargs))


class TFRecordWriter:
    """Write records to ``url``; use as a context manager. Compatible with tf.data readers."""

    def __init__(self, url: str, compression: Optional[str] = None, *,
                 storage_options: Optional[dict] = None):
        self.url = url
        self.compression = resolve_compression(compression, url)
        self._raw = _open(url, "wb", storage_options).__enter__()
        self._stream: Any  # a GzipFile, a _ZlibWriter or the raw file; None once closed
        if self.compression == "GZIP":
            self._stream = gzip.GzipFile(fileobj=self._raw, mode="wb")
        elif self.compression == "ZLIB":
            self._stream = _ZlibWriter(self._raw)
        else:
            self._stream = self._raw
        self._pending: List[bytes] = []
        self._pending_bytes = 0
        self.records = 0

    def write(self, record: bytes) -> None:
        if not isinstance(record, bytes):
            record = bytes(record)
        length = _PACK_Q(len(record))
        crc = _crc32c.crc32c
        a, b = crc(length), crc(record)
        self._pending += (
            length,
            _PACK_I((((a >> 15) | (a << 17)) + _MASK_DELTA) & 0xFFFFFFFF),
            record,
            _PACK_I((((b >> 15) | (b << 17)) + _MASK_DELTA) & 0xFFFFFFFF),
        )
        self._pending_bytes += len(record) + 16
        self.records += 1
        if self._pending_bytes >= _CHUNK:
            self.flush()

    def write_all(self, records: Iterable[bytes]) -> None:
        for record in records:
            self.write(record)

    def flush(self) -> None:
        if self._pending:
            self._stream.write(b"".join(self._pending))
            self._pending.clear()
            self._pending_bytes = 0

    def close(self) -> None:
        if self._stream is None:
            return
        self.flush()
        if self._stream is not self._raw:
            self._stream.close()
        self._raw.__exit__(None, None, None)
        self._stream = None

    def __enter__(self) -> "TFRecordWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_records(url: str, records: Iterable[bytes], compression: Optional[str] = None,
                  storage_options: Optional[dict] = None) -> int:
    """Write ``records`` to ``url``; return how many were written."""
    with TFRecordWriter(url, compression, storage_options=storage_options) as writer:
        writer.write_all(records)
        return writer.records
