"""The generated PKI is one the API server and its clients accept.

Clients verify the server against the generated CA at 127.0.0.1, so the
serving certificate must be signed by it and name that address; the keys
must be private to the test user.
"""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tests.harness import generate_pki


def test_serving_certificate_is_signed_by_the_ca_for_loopback(tmp_path: Path) -> None:
    paths = generate_pki(tmp_path)
    ca = x509.load_pem_x509_certificate(paths["ca_cert"].read_bytes())
    serving = x509.load_pem_x509_certificate(paths["serving_cert"].read_bytes())

    serving.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in names.get_values_for_type(x509.IPAddress)
    assert "localhost" in names.get_values_for_type(x509.DNSName)


def test_keys_are_ec_and_readable_only_by_their_owner(tmp_path: Path) -> None:
    paths = generate_pki(tmp_path)
    for path in paths.values():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    public = serialization.load_pem_public_key(paths["sa_pub"].read_bytes())
    private = serialization.load_pem_private_key(paths["sa_key"].read_bytes(), password=None)
    assert isinstance(public, ec.EllipticCurvePublicKey)
    assert isinstance(private, ec.EllipticCurvePrivateKey)
    assert public.public_numbers() == private.public_key().public_numbers()
