"""The certificate the HTTP endpoint serves in TLS mode: from files, reloaded when they change, or self-signed.

A certificate from files is what cert-manager or a projected Secret mounts;
both rotate it by swapping the files under a running pod (a Secret volume
replaces a symlink, so the inode changes). A process that reads its
certificate once would serve the old one until it expires, and restarting a
fleet of node agents to pick up a certificate is exactly the churn rotation
is meant to avoid. So every new connection first compares the files'
``stat`` with what was loaded -- two system calls, no reading -- and loads
them again when they differ. A half-finished rotation (the certificate
swapped, the key not yet) fails to load: the previous certificate keeps
being served, one warning is logged, and the next change of either file is
tried again.

Without files, TLS mode generates a self-signed certificate at start. It
encrypts the scrape (the bearer token Prometheus sends is not readable on
the node network) but proves no identity, so the scraper must skip
verification; see the README for what that does and does not protect.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import ssl
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuwarden.logconfig import get_logger

log = get_logger(__name__)

# A self-signed certificate outlives any pod that would use it; a year keeps
# it from expiring under an agent that runs for months.
SELF_SIGNED_VALIDITY = dt.timedelta(days=365)


class ServingCertificateError(Exception):
    """The certificate or key cannot be served (missing, unreadable, not a pair)."""


@dataclass(frozen=True, slots=True)
class _FileState:
    """What ``stat`` says of the two files: any difference means they were rewritten."""

    cert: tuple[int, int, int, int]
    key: tuple[int, int, int, int]


def _stat(path: str) -> tuple[int, int, int, int]:
    st = os.stat(path)  # follows the symlink a Secret volume swaps
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server context with the pair loaded; TLS 1.2 at least, as Kubernetes components require."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ServingCertificateError(f"cannot load {cert_file} with {key_file}: {exc}") from exc
    return context


def _describe(cert: bytes | str) -> dict[str, str]:
    """Subject, expiry and fingerprint of the leaf certificate (PEM bytes or a file), for the log line."""
    from cryptography import x509  # noqa: PLC0415 -- only a TLS-mode server pays for the import
    from cryptography.hazmat.primitives.serialization import Encoding  # noqa: PLC0415

    try:
        parsed = x509.load_pem_x509_certificate(cert if isinstance(cert, bytes) else Path(cert).read_bytes())
    except (OSError, ValueError):
        return {}
    return {
        "subject": parsed.subject.rfc4514_string(),
        "not_after": parsed.not_valid_after_utc.isoformat(),
        "sha256": hashlib.sha256(parsed.public_bytes(Encoding.DER)).hexdigest(),
    }


def self_signed_pem(hosts: Sequence[str], *, validity: dt.timedelta = SELF_SIGNED_VALIDITY) -> tuple[bytes, bytes]:
    """A fresh EC P-256 key and a self-signed serving certificate for ``hosts`` (PEM certificate, PEM key).

    Each host that parses as an IP address becomes an IP subject alternative
    name, every other one a DNS name; the first names the subject.
    """
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415 -- only a TLS-mode server pays for it

    from gpuwarden import pki  # noqa: PLC0415

    cert, key = pki.new_serving(hosts, dt.datetime.now(dt.UTC), validity)
    return cert.public_bytes(serialization.Encoding.PEM), pki.key_pem(key)


class ServingCertificate:
    """The SSL context for the next connection; see the module docstring.

    Build one with :meth:`from_files` or :meth:`self_signed`; the HTTP server
    calls :meth:`context` for every connection it accepts.
    """

    def __init__(self, context: ssl.SSLContext, cert_file: str | None = None, key_file: str | None = None) -> None:
        self._context = context
        self._cert_file = cert_file
        self._key_file = key_file
        self._lock = threading.Lock()
        self._state = self._read_state() if cert_file else None
        self.reloads = 0  # successful reloads since start, for tests and logs

    @classmethod
    def from_files(cls, cert_file: str, key_file: str) -> ServingCertificate:
        """The pair in the files, reloaded when they change. Raises :class:`ServingCertificateError`."""
        served = cls(_context(cert_file, key_file), cert_file, key_file)
        log.info("serving_certificate_loaded", cert_file=cert_file, **_describe(cert_file))
        return served

    @classmethod
    def self_signed(cls, hosts: Sequence[str]) -> ServingCertificate:
        """A certificate generated now for ``hosts``; its key never touches a disk that outlives the call.

        ``ssl`` loads a key only from a file, so the pair is written to a
        private temporary directory and removed as soon as it is loaded.
        """
        cert_pem, key_pem = self_signed_pem(hosts)
        with tempfile.TemporaryDirectory(prefix="gpuwarden-tls-") as tmp:
            cert_file, key_file = os.path.join(tmp, "tls.crt"), os.path.join(tmp, "tls.key")
            for path, data in ((cert_file, cert_pem), (key_file, key_pem)):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
            context = _context(cert_file, key_file)
        log.info("serving_certificate_self_signed", hosts=list(hosts), **_describe(cert_pem))
        return cls(context)

    def _read_state(self) -> _FileState | None:
        assert self._cert_file is not None and self._key_file is not None
        try:
            return _FileState(_stat(self._cert_file), _stat(self._key_file))
        except OSError:
            # Mid-rotation a file can be missing for an instant; keep serving.
            return None

    def context(self) -> ssl.SSLContext:
        """The context to wrap the next connection with, reloaded first if the files changed."""
        if self._cert_file is None or self._key_file is None:
            return self._context
        with self._lock:
            state = self._read_state()
            if state is not None and state != self._state:
                self._state = state
                try:
                    self._context = _context(self._cert_file, self._key_file)
                except ServingCertificateError as exc:
                    # Logged once per change of the files: the next change is tried again.
                    log.warning("serving_certificate_reload_failed", error=str(exc), keeps="previous certificate")
                else:
                    self.reloads += 1
                    log.info(
                        "serving_certificate_reloaded",
                        cert_file=self._cert_file,
                        **_describe(self._cert_file),
                    )
            return self._context
