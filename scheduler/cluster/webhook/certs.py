"""The webhook's serving certificate when no cert-manager issues one: a private CA the replicas share.

The API server calls the webhook over HTTPS and trusts only the
``caBundle`` of the webhook configuration, so whatever the replicas serve
must chain to what that bundle holds, on every replica at once. One
self-signed certificate per replica would need a bundle that follows every
restart; instead the replicas share a small CA and one serving certificate
in a Secret (``ca.crt`` the bundle, ``ca.key``, ``tls.crt``, ``tls.key``).
Whichever replica finds the Secret empty or due fills it (writes carry the
resourceVersion they read, so two replicas never both win), and each one
writes the bundle into the webhook configuration's ``caBundle`` when it
differs and serves the Secret's pair from private files that
:class:`~gpuwarden.servingcert.ServingCertificate` reloads when they change.

Rotation before expiry, in an order that never serves a certificate the API
server cannot verify:

* the serving certificate is renewed once two thirds of its life have
  passed (90 days by default: renewed at 60), signed by the current CA;
* the CA is renewed the same way (5 years) in two steps: first the new CA
  joins the bundle (the old one stays until it expires) and the bundle is
  written to the webhook configuration; only then, at a later check, is a
  serving certificate signed by the new CA. So a replica still serving the
  previous certificate, and the API server still holding the previous
  bundle, both keep working.

Checks run at start and every ``check_s`` (5 minutes); a replica that lost a
write race reads the winner's Secret at its next check.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpuwarden import contract, pki
from gpuwarden.kube import JSON, ApiError, KubeApi
from gpuwarden.logconfig import get_logger
from gpuwarden.servingcert import ServingCertificate

log = get_logger(__name__)

CA_VALIDITY = dt.timedelta(days=5 * 365)
SERVING_VALIDITY = dt.timedelta(days=90)
# Renewed once this share of the lifetime has passed.
RENEW_AT = 2 / 3
CHECK_S = 300.0

_CA_CRT, _CA_KEY, _TLS_CRT, _TLS_KEY = "ca.crt", "ca.key", "tls.crt", "tls.key"


@dataclass(frozen=True, slots=True)
class CertSettings:
    """Where the material lives and how long it lasts; ``webhook_config`` None leaves caBundle to someone else."""

    namespace: str
    secret: str = contract.WEBHOOK_COMPONENT + "-tls"
    webhook_config: str | None = contract.WEBHOOK_COMPONENT
    hosts: tuple[str, ...] = ()
    ca_validity: dt.timedelta = CA_VALIDITY
    serving_validity: dt.timedelta = SERVING_VALIDITY
    check_s: float = CHECK_S
    clock: Callable[[], dt.datetime] = field(default=lambda: dt.datetime.now(dt.UTC))


def new_ca(now: dt.datetime, validity: dt.timedelta) -> tuple[x509.Certificate, bytes]:
    """A CA certificate and its PEM key, named for the webhook and the time it was made (names must differ)."""
    cert, key = pki.new_ca(f"{contract.WEBHOOK_COMPONENT}-ca-{int(now.timestamp())}", now, validity, path_length=0)
    return cert, pki.key_pem(key)


def new_serving(
    ca: x509.Certificate, ca_key_pem: bytes, hosts: Sequence[str], now: dt.datetime, validity: dt.timedelta
) -> tuple[bytes, bytes]:
    """A serving certificate for ``hosts`` signed by ``ca`` (PEM certificate, PEM key); never past the CA's end."""
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an EC key")
    cert, key = pki.new_serving(hosts, now, validity, issuer=(ca, ca_key))
    return cert.public_bytes(serialization.Encoding.PEM), pki.key_pem(key)


def _due(cert: x509.Certificate, now: dt.datetime) -> bool:
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return now >= start + (end - start) * RENEW_AT


def _pem(certs: Sequence[x509.Certificate]) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


def _hosts_of(cert: x509.Certificate) -> set[str]:
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(n) for n in sans.get_values_for_type(x509.DNSName)} | {
        str(ip) for ip in sans.get_values_for_type(x509.IPAddress)
    }


@dataclass
class _Material:
    """The Secret's contents, parsed; a field that is missing or unreadable is None or empty."""

    bundle: list[x509.Certificate]
    ca_key: bytes | None
    cert: bytes | None
    key: bytes | None
    resource_version: str | None

    @classmethod
    def from_secret(cls, secret: JSON | None) -> _Material:
        data = (secret or {}).get("data") or {}

        def field_bytes(key: str) -> bytes | None:
            value = data.get(key)
            try:
                return base64.b64decode(value) if isinstance(value, str) and value else None
            except ValueError:
                return None

        bundle: list[x509.Certificate] = []
        raw_bundle = field_bytes(_CA_CRT)
        if raw_bundle:
            try:
                bundle = x509.load_pem_x509_certificates(raw_bundle)
            except ValueError:
                bundle = []
        version = ((secret or {}).get("metadata") or {}).get("resourceVersion")
        return cls(bundle, field_bytes(_CA_KEY), field_bytes(_TLS_CRT), field_bytes(_TLS_KEY), version)

    def data(self) -> dict[str, str]:
        out = {_CA_CRT: _pem(self.bundle)}
        for key, value in ((_CA_KEY, self.ca_key), (_TLS_CRT, self.cert), (_TLS_KEY, self.key)):
            if value is not None:
                out[key] = value
        return {k: base64.b64encode(v).decode() for k, v in out.items()}


class WebhookCertificates:
    """Keeps the shared Secret, the caBundle and this replica's served files current (module docstring)."""

    def __init__(self, api: KubeApi, settings: CertSettings, directory: str | None = None) -> None:
        if not settings.hosts:
            raise ValueError("a serving certificate needs at least one host name")
        self._api = api
        self.settings = settings
        # A directory made here holds a private key: it goes when this stops.
        self._owned = directory is None
        self._dir = Path(directory or tempfile.mkdtemp(prefix="gpuwarden-webhook-tls-"))
        self.cert_file = str(self._dir / _TLS_CRT)
        self.key_file = str(self._dir / _TLS_KEY)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.bundle_pem: bytes = b""
        self.checks = 0

    # -- the check ------------------------------------------------------------

    def ensure(self) -> None:
        """One check: fill or renew the Secret if due, write the caBundle, write this replica's files.

        Raises :class:`ApiError` when the API server cannot be read or
        written; the served files then stay as they were.
        """
        for _attempt in range(3):
            if self._check_once():
                break
        self.checks += 1

    def _check_once(self) -> bool:
        """False when a write lost a race with another replica (then check again)."""
        s = self.settings
        now = s.clock()
        secret = self._api.get_secret(s.namespace, s.secret)
        material = _Material.from_secret(secret)
        signing = material.bundle[0] if material.bundle and material.ca_key else None
        kept = [c for c in material.bundle if c.not_valid_after_utc > now]
        changed = len(kept) != len(material.bundle)
        material.bundle = kept
        if signing is None or _due(signing, now):
            signing, material.ca_key = new_ca(now, s.ca_validity)
            material.bundle = [signing, *material.bundle]
            changed = True
            log.info("webhook_ca_created", subject=signing.subject.rfc4514_string(), cas=len(material.bundle))
        if changed and material.cert is not None:
            # A certificate is being served: the new bundle goes out alone, and
            # a certificate the new CA signs waits for a later check.
            if not self._write(secret, material):
                return False
            self._publish_bundle(material)
            self._serve(material)
            return True
        trusted = changed or self._publish_bundle(material)
        if self._serving_due(material, signing, now):
            if trusted or self._signed_by(material, signing):
                assert material.ca_key is not None
                material.cert, material.key = new_serving(signing, material.ca_key, s.hosts, now, s.serving_validity)
                changed = True
                log.info("webhook_serving_certificate_issued", hosts=list(s.hosts))
            else:
                log.warning("webhook_serving_certificate_waits", why="its CA is not in the caBundle yet")
        if changed:
            if not self._write(secret, material):
                return False
            self._publish_bundle(material)
        self._serve(material)
        return True

    @staticmethod
    def _signed_by(material: _Material, signing: x509.Certificate) -> bool:
        """Whether the served certificate is signed by the current CA already."""
        if material.cert is None:
            return False
        try:
            served = x509.load_pem_x509_certificate(material.cert)
        except ValueError:
            return False
        try:
            served.verify_directly_issued_by(signing)
        except Exception:  # InvalidSignature, ValueError, TypeError: not this CA's
            return False
        return True

    def _serving_due(self, material: _Material, signing: x509.Certificate, now: dt.datetime) -> bool:
        if material.cert is None or material.key is None:
            return True
        try:
            served = x509.load_pem_x509_certificate(material.cert)
        except ValueError:
            return True
        return (
            _due(served, now)
            or not self._signed_by(material, signing)
            or not set(self.settings.hosts) <= _hosts_of(served)
        )

    def _write(self, secret: JSON | None, material: _Material) -> bool:
        s = self.settings
        body: JSON = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {"name": s.secret, "namespace": s.namespace},
            "data": material.data(),
        }
        try:
            if secret is None:
                self._api.create_secret(s.namespace, body)
            else:
                meta = secret.get("metadata") or {}
                body["metadata"] = {**meta, "resourceVersion": material.resource_version}
                body["metadata"].pop("managedFields", None)
                self._api.replace_secret(s.namespace, s.secret, body)
        except ApiError as err:
            if err.status == 409:
                log.info("webhook_certificate_race_lost", secret=f"{s.namespace}/{s.secret}")
                return False
            raise
        return True

    def _publish_bundle(self, material: _Material) -> bool:
        """Write the bundle into every webhook of the configuration; True when all of them hold it."""
        self.bundle_pem = _pem(material.bundle)
        name = self.settings.webhook_config
        if name is None:
            return True
        wanted = base64.b64encode(self.bundle_pem).decode()
        config = self._api.get_mutating_webhook_configuration(name)
        if config is None:
            log.warning("webhook_configuration_missing", name=name, effect="caBundle not written; retried next check")
            return False
        stale = [
            w.get("name")
            for w in config.get("webhooks") or ()
            if ((w.get("clientConfig") or {}).get("caBundle") or "") != wanted
        ]
        if stale:
            patch = {"webhooks": [{"name": n, "clientConfig": {"caBundle": wanted}} for n in stale]}
            self._api.patch_mutating_webhook_configuration(name, patch)
            log.info("webhook_ca_bundle_written", configuration=name, webhooks=stale, cas=len(material.bundle))
        return True

    def _serve(self, material: _Material) -> None:
        """This replica's files, rewritten only when they differ: the key first, so a reload finds a pair."""
        if material.cert is None or material.key is None:
            return
        for path, data in ((self.key_file, material.key), (self.cert_file, material.cert)):
            try:
                if Path(path).read_bytes() == data:
                    continue
            except OSError:
                pass
            fd, tmp = tempfile.mkstemp(dir=self._dir, prefix=".tmp-")
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(tmp, path)

    # -- serving and the loop ---------------------------------------------------

    def serving_certificate(self) -> ServingCertificate:
        """The certificate to serve, reloaded whenever a check rewrites the files; call after :meth:`ensure`."""
        return ServingCertificate.from_files(self.cert_file, self.key_file)

    def start(self) -> WebhookCertificates:
        self._thread = threading.Thread(target=self._run, name="webhook-certs", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the checks; remove the served files' directory if this made it (the server has stopped)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._owned:
            shutil.rmtree(self._dir, ignore_errors=True)

    def _run(self) -> None:
        while not self._stop.wait(self.settings.check_s):
            try:
                self.ensure()
            except ApiError as err:
                log.warning("webhook_certificate_check_failed", error=str(err), retry_s=self.settings.check_s)
