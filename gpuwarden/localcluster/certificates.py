"""The certificates and keys a private API server needs, made fresh for every run.

Nothing is checked in: a committed key would expire or leak, and a fresh CA
means no test can accidentally trust anything but the server it started.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpuwarden import pki


def _write_pem(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


def generate_pki(directory: Path) -> dict[str, Path]:
    """A CA, an API-server serving certificate it signs, and a service-account key pair.

    EC P-256 keys: generated in microseconds, which keeps fixture start-up
    fast, and accepted by kube-apiserver for both purposes.
    """
    now = dt.datetime.now(dt.UTC)
    validity = dt.timedelta(days=7)
    ca_cert, ca_key = pki.new_ca("gpuwarden-test-ca", now, validity)
    serving_cert, serving_key = pki.new_serving(
        ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "127.0.0.1"],
        now,
        validity,
        issuer=(ca_cert, ca_key),
        common_name="kube-apiserver",
    )

    sa_key = ec.generate_private_key(ec.SECP256R1())
    paths = {
        "ca_cert": directory / "ca.crt",
        "serving_cert": directory / "apiserver.crt",
        "serving_key": directory / "apiserver.key",
        "sa_key": directory / "sa.key",
        "sa_pub": directory / "sa.pub",
    }
    _write_pem(paths["ca_cert"], ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_pem(paths["serving_cert"], serving_cert.public_bytes(serialization.Encoding.PEM))
    _write_pem(paths["serving_key"], pki.key_pem(serving_key))
    _write_pem(paths["sa_key"], pki.key_pem(sa_key))
    _write_pem(
        paths["sa_pub"],
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
    )
    return paths
