"""Making certificates: a CA, and serving certificates it signs or that sign themselves.

Three places need them: the local control plane (its API server), the
scheduler's admission webhook (a CA the replicas share) and the HTTPS mode
of ``/metrics`` (self-signed). They make them the same way, here: EC P-256
keys (generated in microseconds, accepted everywhere Kubernetes looks),
SHA-256 signatures, validity starting an hour back so that a machine whose
clock is a little behind still accepts the certificate.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# How far back a certificate's validity starts.
CLOCK_SKEW = dt.timedelta(hours=1)


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """The private key as unencrypted PKCS#8 PEM."""
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def subject_names(hosts: Sequence[str]) -> list[x509.GeneralName]:
    """Each host once, in order: an IP address as an IP name, anything else as a DNS name."""
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def new_ca(
    common_name: str, now: dt.datetime, validity: dt.timedelta, *, path_length: int | None = None
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed CA certificate and its key, valid from an hour before ``now`` for ``validity``."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=path_length), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return cert, key


def new_serving(
    hosts: Sequence[str],
    now: dt.datetime,
    validity: dt.timedelta,
    *,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None = None,
    common_name: str | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A server certificate for ``hosts`` and its key, signed by ``issuer`` (a CA and its key) or by itself.

    The subject is ``common_name``, else the first host. A certificate
    signed by a CA never outlives it.
    """
    if not hosts:
        raise ValueError("a certificate needs at least one host name")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = _name(common_name or hosts[0])
    not_after = now + validity
    if issuer is not None:
        not_after = min(not_after, issuer[0].not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer[0].subject if issuer is not None else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(subject_names(hosts)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(issuer[1] if issuer is not None else key, hashes.SHA256())
    )
    return cert, key
