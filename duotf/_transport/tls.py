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
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
from typing import Mapping, Optional, Tuple

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
    secured = context.wrap_socket(sock, server_side=server_side)
    secured.settimeout(timeout)
    return secured


def encrypted(sock: socket.socket) -> bool:
    """Whether ``sock`` carries TLS."""
    return isinstance(sock, ssl.SSLSocket)
