"""TFRecord files over any fsspec URL: a streaming reader and writer, byte-compatible with TF.

A record on disk is::

    uint64 length (little-endian) | uint32 masked CRC-32C of the length bytes
    length bytes of data          | uint32 masked CRC-32C of the data

optionally inside a GZIP or ZLIB stream (TF's ``compression_type``). Both CRCs are checked on
read. Files are read in chunks and never loaded whole.
"""

from __future__ import annotations

import gzip
import io
import logging
import struct
import zlib
from typing import BinaryIO, Iterable, Iterator, List, Optional

import crc32c as _crc32c

from ..errors import TFRecordCorruptError

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

COMPRESSIONS = ("NONE", "GZIP", "ZLIB")


def masked_crc(data) -> int:
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


class _ZlibReader(io.RawIOBase):
    """A readable stream that inflates a zlib stream (TF's ZLIB) as it is read."""

    def __init__(self, raw: BinaryIO):
        self._raw = raw
        self._inflate = zlib.decompressobj()
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self._buf:
            if self._inflate.eof:
                return 0
            chunk = self._raw.read(_CHUNK)
            if not chunk:
                self._buf = self._inflate.flush()
                if not self._buf:
                    return 0
                break
            self._buf = self._inflate.decompress(chunk)
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


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
    from .files import open_url

    return open_url(url, mode, storage_options)


class TFRecordReader:
    """Iterate the records of one TFRecord file at ``url``.

    Parameters
    ----------
    url:
        Any fsspec URL or local path.
    compression:
        "NONE", "GZIP", "ZLIB" or "infer" (from the suffix).
    skip_corrupt:
        Skip records that fail their CRC (and a truncated tail) instead of raising;
        :attr:`skipped` counts them and a warning reports them.
    storage_options:
        Passed to fsspec (credentials, endpoint...).
    """

    def __init__(self, url: str, compression: Optional[str] = None, *, skip_corrupt: bool = False,
                 storage_options: Optional[dict] = None, check_crc: bool = True):
        self.url = url
        self.compression = resolve_compression(compression, url)
        self.skip_corrupt = skip_corrupt
        self.storage_options = storage_options
        self.check_crc = check_crc
        self.skipped = 0

    def __iter__(self) -> Iterator[bytes]:
        for batch in self.batches():
            yield from batch

    def batches(self, max_bytes: int = _CHUNK) -> Iterator[List[bytes]]:
        """Yield lists of records, about ``max_bytes`` of input at a time (fewer Python calls)."""
        with _open(self.url, "rb", self.storage_options) as raw:
            if self.compression == "GZIP":
                stream = gzip.GzipFile(fileobj=raw, mode="rb")
            elif self.compression == "ZLIB":
                stream = io.BufferedReader(_ZlibReader(raw), _CHUNK)
            else:
                stream = raw
            try:
                yield from self._parse(stream, max_bytes)
            except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
                self._corrupt(self._offset, f"the {self.compression} stream is damaged ({exc})")
        if self.skipped:
            logger.warning("%s: skipped %d corrupt record(s)", self.url, self.skipped)

    def _corrupt(self, offset: int, reason: str) -> None:
        if self.skip_corrupt:
            self.skipped += 1
            return
        where = " (offset in the uncompressed stream)" if self.compression != "NONE" else ""
        raise TFRecordCorruptError(
            f"corrupt TFRecord in {self.url} at byte {offset}{where}: {reason}. "
            "Pass skip_corrupt=True to skip corrupt records and count them.",
            url=self.url, offset=offset, reason=reason,
        )

    def _parse(self, stream, max_bytes: int) -> Iterator[List[bytes]]:
        buf = b""
        pos = 0  # in buf
        base = 0  # stream offset of buf[0]
        self._offset = 0
        eof = False
        check = self.check_crc
        header_size = _HEADER.size
        unpack_header = _HEADER.unpack_from
        unpack_footer = _FOOTER.unpack_from
        while True:
            if not eof:
                size = max_bytes
                if len(buf) - pos >= header_size:  # a record is waiting to be completed
                    size = max(size, unpack_header(buf, pos)[0] + header_size + 4 - (len(buf) - pos))
                chunk = stream.read(size)
                if chunk:
                    buf = buf[pos:] + chunk if pos < len(buf) else chunk
                    base += pos
                    pos = 0
                else:
                    eof = True
            out: List[bytes] = []
            end = len(buf)
            while True:
                if end - pos < header_size:
                    break
                length, length_crc = unpack_header(buf, pos)
                if check and masked_crc(buf[pos : pos + 8]) != length_crc:
                    self._offset = base + pos
                    if out:
                        yield out
                    self._corrupt(base + pos, "the length field fails its CRC")
                    return  # without a trustworthy length the rest cannot be framed
                stop = pos + header_size + length + 4
                if stop > end:
                    break
                data = buf[pos + header_size : stop - 4]
                if check and masked_crc(data) != unpack_footer(buf, stop - 4)[0]:
                    self._offset = base + pos
                    self._corrupt(base + pos, f"the data of a {length}-byte record fails its CRC")
                else:
                    out.append(data)
                pos = stop
            self._offset = base + pos
            if out:
                yield out
            if eof:
                if pos < len(buf):
                    self._corrupt(base + pos, f"the file ends inside a record ({len(buf) - pos} "
                                              "trailing bytes): truncated")
                return


def read_records(url: str, compression: Optional[str] = None, **kwargs) -> Iterator[bytes]:
    """The records of one TFRecord file (see :class:`TFRecordReader`)."""
    return iter(TFRecordReader(url, compression, **kwargs))


class TFRecordWriter:
    """Write records to ``url``; use as a context manager. Compatible with tf.data readers."""

    def __init__(self, url: str, compression: Optional[str] = None, *,
                 storage_options: Optional[dict] = None):
        self.url = url
        self.compression = resolve_compression(compression, url)
        self._raw = _open(url, "wb", storage_options).__enter__()
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
