"""Encryption in transit for duotf's own connections: TLS on the feed and the control channel.

Every connection to a duotf server proves the job's secret first (:mod:`duotf._transport.gate`),
in clear. Where the job asks for TLS, both ends then run a TLS handshake on the connection
before anything else crosses it, each presenting the job's certificate and accepting only a peer
whose certificate the job trusts (mutual TLS, the certificate pinned: no host name is checked,
as executors' names are no one's to know). What is encrypted:

- the feed: every connection from a feeding task (a Spark or Dask task) to a node's feed
  server, and the driver's markers to the nodes;
- the control channel: every node agent's connection to the driver's rendezvous server (through
  the Spark Connect relay too, which forwards the encrypted bytes).

After the handshake each end sends the other, over TLS, a key of its own for what it sends; where
both ends have ``cryptography`` 47 or later, the bytes then go in records of up to
:data:`BULK_RECORD` bytes sealed with AES-256-GCM under those keys (:class:`_Bulk`), else in
TLS's own records of 16 KiB.

TensorFlow's own traffic between the nodes (gRPC: the collectives, parameter servers) is not:
TensorFlow 2 offers no setting that encrypts its server's channels.

The certificate is made for each job (an ECDSA P-256 key and a self-signed certificate, with
the ``cryptography`` package, or the ``openssl`` command where that package is missing) and
sent with the job to its tasks, as the job's secret is; or the user gives one
(``DUOTF_TLS_CERT`` and ``DUOTF_TLS_KEY``: PEM files on the driver; ``DUOTF_TLS_CA``: the
certificates a peer's may chain to, the given certificate itself by default).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
from typing import Mapping, Optional, Tuple, cast

from duotf.errors import ConfigError

#: "1": TLS on; "0": off; unset: on where the engine encrypts its own traffic
TLS_ENV = "DUOTF_TLS"
CERT_ENV, KEY_ENV, CA_ENV = "DUOTF_TLS_CERT", "DUOTF_TLS_KEY", "DUOTF_TLS_CA"
#: seconds a TLS handshake may take, where the connection has no timeout of its own
HANDSHAKE_TIMEOUT = 30.0
#: the days a certificate made for a job is valid (a job that runs longer needs a given one)
DAYS = 30


@dataclasses.dataclass(frozen=True)
class Material:
    """A job's TLS certificate, its key and what a peer's certificate must chain to (PEM)."""

    cert: bytes
    key: bytes = dataclasses.field(repr=False)
    ca: bytes

    def __repr__(self) -> str:  # never the key
        return f"Material(cert of {len(self.cert)} bytes)"


def wanted(setting: Optional[bool], engine_encrypts: bool,
           environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether a job uses TLS: ``setting`` (``duotf.run(tls=...)``) where given, else
    ``DUOTF_TLS``, else whether the engine encrypts its own traffic."""
    if setting is not None:
        return bool(setting)
    value = (os.environ if environ is None else environ).get(TLS_ENV, "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    if value:
        raise ConfigError(f"{TLS_ENV}={value!r}: use 1 (TLS on), 0 (off), or leave it unset (on "
                          f"where the engine encrypts its own traffic)")
    return engine_encrypts


def for_job(environ: Optional[Mapping[str, str]] = None) -> Material:
    """The job's material: the user's (``DUOTF_TLS_CERT``, ``DUOTF_TLS_KEY``, ``DUOTF_TLS_CA``),
    checked here, or one made for the job."""
    env = os.environ if environ is None else environ
    cert_path, key_path = env.get(CERT_ENV), env.get(KEY_ENV)
    if bool(cert_path) != bool(key_path):
        raise ConfigError(f"{CERT_ENV} and {KEY_ENV} go together: set both (PEM files of a "
                          f"certificate and its key), or neither for one made for each job")
    if cert_path and key_path:
        material = Material(_read(cert_path, CERT_ENV), _read(key_path, KEY_ENV),
                            _read(env[CA_ENV], CA_ENV) if env.get(CA_ENV) else b"")
        material = dataclasses.replace(material, ca=material.ca or material.cert)
    else:
        material = make()
    try:
        contexts(material)
    except (ssl.SSLError, ValueError) as exc:
        raise ConfigError(f"the TLS certificate given ({CERT_ENV}={cert_path}, {KEY_ENV}="
                          f"{key_path}) cannot be used: {exc}") from None
    return material


def _read(path: str, name: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise ConfigError(f"{name}={path}: {exc.strerror or exc}") from None


def make() -> Material:
    """A key and a self-signed certificate for one job: with ``cryptography``, else ``openssl``."""
    try:
        cert, key = _make_with_cryptography()
    except ImportError:
        cert, key = _make_with_openssl()
    return Material(cert, key, cert)


def _make_with_cryptography() -> Tuple[bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "duotf job")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))  # hosts' clocks differ
            .not_valid_after(now + datetime.timedelta(days=DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def _make_with_openssl() -> Tuple[bytes, bytes]:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ConfigError(
            "TLS needs a certificate for the job, and neither the cryptography package nor the "
            "openssl command is here to make one: pip install cryptography (or duotf[tls]), or "
            f"give one ({CERT_ENV} and {KEY_ENV}: PEM files), or turn TLS off ({TLS_ENV}=0)")
    with tempfile.TemporaryDirectory(prefix="duotf-tls-") as folder:
        cert, key = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
        done = subprocess.run(
            [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-days", str(DAYS), "-subj", "/CN=duotf job", "-keyout", key, "-out", cert],
            stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if done.returncode != 0:
            raise ConfigError(f"openssl could not make the job's TLS certificate: "
                              f"{done.stderr.strip()[-300:]}")
        with open(cert, "rb") as c, open(key, "rb") as k:
            return c.read(), k.read()


@functools.lru_cache(maxsize=8)
def contexts(material: Material) -> Tuple[ssl.SSLContext, ssl.SSLContext]:
    """``(server, client)`` contexts of ``material``: each presents the job's certificate and
    requires the peer's, which must chain to ``material.ca``."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    for context in (server, client):
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        _load_chain(context, material)
        context.load_verify_locations(cadata=material.ca.decode("ascii"))
        context.verify_mode = ssl.CERT_REQUIRED
    client.check_hostname = False  # pinned to the job's CA; executors' names are unknown
    server.num_tickets = 0  # no session is resumed: each connection makes its own
    return server, client


def _load_chain(context: ssl.SSLContext, material: Material) -> None:
    """``load_cert_chain`` from memory: a file only this process sees (an anonymous memory file
    on Linux; elsewhere a private temporary file, removed at once)."""
    pem = material.cert.rstrip(b"\n") + b"\n" + material.key
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("duotf-tls", 0)
        try:
            os.write(fd, pem)
            context.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return
    fd, path = tempfile.mkstemp(prefix="duotf-tls-")
    try:
        os.write(fd, pem)
        os.close(fd)
        context.load_cert_chain(path)
    finally:
        os.unlink(path)


def secure(sock: socket.socket, material: Optional[Material], server_side: bool) -> socket.socket:
    """``sock`` (authenticated, blocking) with TLS on it where ``material`` is given, the
    handshake done within the socket's timeout (:data:`HANDSHAKE_TIMEOUT` where it has none);
    ``sock`` itself where it is None. Raises ``ssl.SSLError`` where the handshake fails."""
    if material is None:
        return sock
    context = contexts(material)[0 if server_side else 1]
    timeout = sock.gettimeout()
    sock.settimeout(HANDSHAKE_TIMEOUT if timeout is None else timeout)
    secured = TLSSocket(sock, context, server_side)
    sock.settimeout(timeout)
    # duck-typed: the socket methods duotf's connections call (see TLSSocket)
    return cast(socket.socket, secured)


def encrypted(sock) -> bool:
    """Whether ``sock`` carries TLS."""
    return isinstance(sock, TLSSocket)


#: plaintext bytes encrypted at once by a send (its records go out before the next are made):
#: small enough that the ciphertext's buffer comes from the heap and stays in the cache, where a
#: buffer of 1 MiB is a new mapping of memory each time, paid in page faults (docs/benchmarks.md)
_SEND_CHUNK = 1 << 16
#: ciphertext bytes read from the socket at once (into one buffer, reused)
_RECV_CHUNK = 1 << 20
#: plaintext bytes a bulk record holds at most: a 4 MiB frame is 16 calls to the cipher a side,
#: where TLS's records of 16 KiB make it 256, each with its copies through OpenSSL's buffers
BULK_RECORD = 1 << 18
#: records one key seals before both ends move to the next key, derived from it: 16 GiB a key,
#: far inside AES-GCM's limits (TLS 1.3 allows 2^24.5 records of 16 KiB, about 380 GB)
_REKEY = 1 << 16
#: what each end says first over TLS: whether it takes bulk records, and its sending key
_OFFER = 33


def _aead():
    """The AES-GCM class of ``cryptography`` where it seals into a given buffer (47 and later),
    else None: the connection then keeps TLS's own records."""
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        return None
    return AESGCM if hasattr(AESGCM, "encrypt_into") else None


class _Key:
    """One direction's AES-256-GCM key and the count of records it has sealed or opened: the
    count is each record's nonce, so no nonce repeats under a key, and a record replayed,
    dropped or reordered fails its check."""

    def __init__(self, aead, key: bytes):
        self._aead_class, self._key, self._count = aead, key, 0
        self._aead = aead(key)

    def next(self) -> Tuple[object, bytes]:
        """``(the cipher, the nonce)`` for the next record."""
        if self._count and self._count % _REKEY == 0:
            self._key = hashlib.sha256(b"duotf next key" + self._key).digest()
            self._aead = self._aead_class(self._key)
        nonce = self._count.to_bytes(12, "big")
        self._count += 1
        return self._aead, nonce


class _Bulk:
    """Records of up to :data:`BULK_RECORD` bytes after the TLS handshake, sealed with
    AES-256-GCM under keys the two ends sent each other over TLS (QUIC and DTLS-SRTP take
    TLS's handshake with records of their own the same way). A record is its plaintext's length
    (4 bytes, in clear, checked as the record's associated data), its ciphertext and its tag.
    Each direction has its own key, so a reader and a writer share no state and no lock."""

    def __init__(self, sock: socket.socket, aead, send_key: bytes, recv_key: bytes,
                 early: bytes):
        self.sock = sock
        self._tx, self._rx = _Key(aead, send_key), _Key(aead, recv_key)
        self._early = memoryview(early)  # what arrived with the peer's offer, past its record
        self._out = bytearray(4 + BULK_RECORD + 16)  # the record being sent (under the send lock)
        self._in = bytearray(4 + BULK_RECORD + 16)  # the record being received
        self._in_fill, self._in_size = 0, -1  # bytes of it here; its plaintext's size once known
        self._plain = bytearray(BULK_RECORD)  # a record opened for a reader who asked for less
        self._left = memoryview(self._plain)[:0]  # what of it the reader has not taken

    def send(self, view: memoryview) -> None:
        """Seal and send ``view`` (the caller holds the send lock)."""
        out = memoryview(self._out)
        for start in range(0, len(view), BULK_RECORD):
            chunk = view[start:start + BULK_RECORD]
            head = len(chunk).to_bytes(4, "big")
            out[:4] = head
            aead, nonce = self._tx.next()
            aead.encrypt_into(nonce, chunk, head, out[4:4 + len(chunk) + 16])  # type: ignore[attr-defined]
            self.sock.sendall(out[:4 + len(chunk) + 16])

    def recv_into(self, view: memoryview, nbytes: int) -> int:
        """Up to ``nbytes`` of plaintext into ``view`` (the caller holds the read lock): what is
        left of the last record, else the next record, opened straight into ``view`` where it
        fits; 0 where the peer closed the connection."""
        if not self._left:
            if not self._receive():
                return 0
            size, self._in_fill, self._in_size = self._in_size, 0, -1
            record = memoryview(self._in)
            into = view[:size] if size <= nbytes else memoryview(self._plain)[:size]
            aead, nonce = self._rx.next()
            try:
                aead.decrypt_into(nonce, record[4:4 + size + 16], record[:4], into)  # type: ignore[attr-defined]
            except Exception as exc:  # cryptography's InvalidTag
                raise ssl.SSLError(f"a record of this TLS connection failed its check "
                                   f"({type(exc).__name__}): the bytes were changed on the way")
            if size <= nbytes:
                return size
            self._left = into
        n = min(nbytes, len(self._left))
        view[:n] = self._left[:n]
        self._left = self._left[n:]
        return n

    def _receive(self) -> bool:
        """Read the rest of the next record into ``_in`` (a read the socket's timeout cuts
        resumes at the next call); False where the peer closed the connection."""
        record = memoryview(self._in)
        while True:
            need = 4 if self._in_size < 0 else 4 + self._in_size + 16
            if self._in_fill == need:
                if self._in_size >= 0:
                    return True
                self._in_size = int.from_bytes(record[:4], "big")
                if self._in_size > BULK_RECORD:
                    raise ssl.SSLError(f"a record of this TLS connection says it holds "
                                       f"{self._in_size} bytes, over {BULK_RECORD}")
                continue
            into = record[self._in_fill:need]
            if self._early:
                n = min(len(into), len(self._early))
                into[:n] = self._early[:n]
                self._early = self._early[n:]
            else:
                n = self.sock.recv_into(into, len(into))
                if not n:
                    return False
            self._in_fill += n


class TLSSocket:
    """A TLS connection over a connected socket, which one thread may read while others write.

    duotf's connections are full duplex: a reader thread on each end, and senders on others (a
    node's heartbeats beside the driver's messages; a feed server's replies and "free" messages
    beside a feeding task's frames). An ``ssl.SSLSocket`` may not be read and written at once
    from two threads (OpenSSL's records then fail their MAC), so the TLS state here is an
    ``ssl.SSLObject`` over memory buffers, held under a lock only while bytes are encrypted or
    decrypted, never while the socket blocks. Records go out in the order they were made: a
    send holds ``_send_lock`` from making its records to writing them, and whatever a read
    makes to send (TLS 1.3's tickets and key updates) goes out the same way.

    After the handshake each end sends the other, over TLS, a key of its own for what it sends;
    where both ends have ``cryptography`` 47 or later, the bytes then go in :class:`_Bulk`
    records (the feed's frames in 16 records each instead of 256, opened straight into the
    reader's buffer), else in TLS's own records.

    It has the methods of a socket that duotf's connections call; others go to the socket.
    """

    def __init__(self, sock: socket.socket, context: ssl.SSLContext, server_side: bool):
        self.sock = sock
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=server_side)
        self._lock = threading.Lock()  # the SSLObject and its buffers
        self._send_lock = threading.Lock()  # the order of the records on the wire
        self._recv_lock = threading.Lock()  # one reader at a time
        self._raw = bytearray(_RECV_CHUNK)  # what the socket gave, before it is decrypted
        self._raw_view = memoryview(self._raw)
        self._bulk: Optional[_Bulk] = None
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                data = sock.recv(1 << 16)
                if not data:
                    raise ssl.SSLEOFError("the peer closed the connection during the TLS handshake")
                self._incoming.write(data)
        self._flush()
        self._bulk = self._agree()

    def _agree(self) -> Optional[_Bulk]:
        """Send this end's offer (whether it takes bulk records, and the key it would send
        them with) and read the peer's, both over TLS: :class:`_Bulk` records where both take
        them."""
        aead = _aead()
        key = os.urandom(32)
        self.sendall(bytes([aead is not None]) + key)
        offer = bytearray(_OFFER)
        view, got = memoryview(offer), 0
        while got < _OFFER:
            n = self.recv_into(view[got:], _OFFER - got)
            if not n:
                raise ssl.SSLEOFError("the peer closed the connection after the TLS handshake")
            got += n
        if aead is None or not offer[0]:
            return None
        # TLS reads a record's bytes and no more: what else arrived is the peer's first records
        return _Bulk(self.sock, aead, key, bytes(offer[1:]), self._incoming.read())

    def _flush(self) -> None:
        """Send what the TLS state has made to send (under ``_send_lock``, or before any
        other thread has the connection)."""
        with self._lock:
            data = self._outgoing.read()
        if data:
            self.sock.sendall(data)

    def sendall(self, data) -> None:
        view = memoryview(data).cast("B")
        with self._send_lock:
            if self._bulk is not None:
                self._bulk.send(view)
                return
            for start in range(0, len(view), _SEND_CHUNK):
                with self._lock:
                    self._tls.write(view[start:start + _SEND_CHUNK])
                    out = self._outgoing.read()
                self.sock.sendall(out)

    def send(self, data) -> int:
        self.sendall(data)
        return len(memoryview(data).cast("B"))

    def sendfile(self, file, offset: int = 0, count: Optional[int] = None) -> int:
        """``count`` bytes of ``file`` from ``offset`` (to its end where None), encrypted here."""
        sent, chunk_size = 0, BULK_RECORD if self._bulk is not None else _SEND_CHUNK
        chunk = bytearray(chunk_size)
        while count is None or sent < count:
            want = chunk_size if count is None else min(chunk_size, count - sent)
            n = os.preadv(file.fileno(), [memoryview(chunk)[:want]], offset + sent)
            if not n:
                break
            self.sendall(memoryview(chunk)[:n])
            sent += n
        return sent

    def recv_into(self, buffer, nbytes: int = 0) -> int:
        """Decrypt into ``buffer`` what has arrived, up to ``nbytes``: every whole record
        received (at least one byte, unless the peer closed), under one hold of the lock."""
        view = memoryview(buffer).cast("B")
        nbytes = nbytes or len(view)
        with self._recv_lock:
            if self._bulk is not None:
                return self._bulk.recv_into(view, nbytes)
            while True:
                got, ended = 0, False
                with self._lock:
                    while got < nbytes:
                        try:
                            n = cast(int, self._tls.read(nbytes - got, view[got:]))
                        except ssl.SSLWantReadError:
                            break
                        except ssl.SSLZeroReturnError:  # the peer closed TLS: the stream's end
                            ended = True
                            break
                        got += n
                    made = self._outgoing.pending
                if made:
                    with self._send_lock:
                        self._flush()
                if got or ended:
                    return got
                n = self.sock.recv_into(self._raw)
                if not n:
                    return 0
                with self._lock:
                    self._incoming.write(self._raw_view[:n])

    def recv(self, bufsize: int) -> bytes:
        buffer = bytearray(bufsize)
        return bytes(buffer[:self.recv_into(buffer, bufsize)])

    def sendmsg(self, buffers, *args) -> int:
        total = 0
        for buffer in buffers:
            self.sendall(buffer)
            total += len(memoryview(buffer).cast("B"))
        return total

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "TLSSocket":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getattr__(self, name: str):  # settimeout, setsockopt, shutdown, getpeername, ...
        return getattr(self.sock, name)
