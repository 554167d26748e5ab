"""TLS mode of the HTTP endpoint, for real over loopback: self-signed, from files, and rotated under a running server.

Certificate files are laid out the way a Secret volume lays them out (the
kubelet and cert-manager rotate by swapping a ``..data`` symlink to a new
directory), so the reload is tested against the change it must follow.
"""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from prometheus_client import CollectorRegistry, Counter

from gpuwarden.http import HealthServer
from gpuwarden.servingcert import ServingCertificate, ServingCertificateError, self_signed_pem
from tests.harness import generate_pki
from tests.waiting import wait_for


class SecretVolume:
    """A directory like a mounted Secret: ``tls.crt`` and ``tls.key`` are links through ``..data``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.generation = 0
        root.mkdir(parents=True, exist_ok=True)

    @property
    def cert_file(self) -> str:
        return str(self.root / "tls.crt")

    @property
    def key_file(self) -> str:
        return str(self.root / "tls.key")

    def write(self, cert_pem: bytes, key_pem: bytes) -> None:
        """Publish a new pair atomically: new directory, then one rename of the ``..data`` link."""
        self.generation += 1
        data = self.root / f"..{self.generation}"
        data.mkdir()
        (data / "tls.crt").write_bytes(cert_pem)
        (data / "tls.key").write_bytes(key_pem)
        link = self.root / "..data_tmp"
        link.symlink_to(data.name)
        os.replace(link, self.root / "..data")
        for name in ("tls.crt", "tls.key"):
            if not (self.root / name).is_symlink():
                (self.root / name).symlink_to(f"..data/{name}")


def _der(cert_pem: bytes) -> bytes:
    return x509.load_pem_x509_certificate(cert_pem).public_bytes(Encoding.DER)


def _served(tls: ServingCertificate) -> HealthServer:
    registry = CollectorRegistry()
    Counter("gpuwarden_test_scrapes", "a metric to find in the scrape", registry=registry).inc()
    server = HealthServer(
        registry, host="127.0.0.1", port=0, liveness=lambda: (True, "ok"), readiness=lambda: (True, "ok"), tls=tls
    )
    server.start()
    return server


@pytest.fixture
def server_factory() -> Iterator[list[HealthServer]]:
    servers: list[HealthServer] = []
    yield servers
    for server in servers:
        server.stop()


def _unverified() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _get(port: int, path: str, context: ssl.SSLContext) -> tuple[int, str, bytes | None]:
    """Status, body and the certificate the server presented (DER), over a new connection."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=context)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        assert conn.sock is not None
        peer = conn.sock.getpeercert(binary_form=True)
        return resp.status, resp.read().decode(), peer
    finally:
        conn.close()


def test_self_signed_https_serves_metrics_and_probes_and_refuses_plain_http(
    server_factory: list[HealthServer],
) -> None:
    tls = ServingCertificate.self_signed(["node-a", "127.0.0.1"])
    server = _served(tls)
    server_factory.append(server)
    status, body, peer = _get(server.port, "/metrics", _unverified())
    assert status == 200
    assert "gpuwarden_test_scrapes_total 1.0" in body
    assert _get(server.port, "/healthz", _unverified())[:2] == (200, "ok\n")
    # The certificate names the hosts it was made for.
    assert peer is not None
    cert = x509.load_der_x509_certificate(peer)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["node-a"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    # Plain HTTP on the TLS port gets no answer, and the server keeps serving.
    plain = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
        plain.request("GET", "/healthz")
        plain.getresponse()
    plain.close()
    # A client that connects and says nothing does not block others.
    with socket.create_connection(("127.0.0.1", server.port), timeout=5):
        assert _get(server.port, "/readyz", _unverified())[0] == 200


def test_a_certificate_from_files_is_verified_and_reloaded_when_the_secret_rotates(
    tmp_path: Path, server_factory: list[HealthServer]
) -> None:
    for name in ("pki-1", "pki-2"):
        (tmp_path / name).mkdir()
    first, second = generate_pki(tmp_path / "pki-1"), generate_pki(tmp_path / "pki-2")
    volume = SecretVolume(tmp_path / "secret")
    volume.write(first["serving_cert"].read_bytes(), first["serving_key"].read_bytes())
    tls = ServingCertificate.from_files(volume.cert_file, volume.key_file)
    server = _served(tls)
    server_factory.append(server)

    trusts_first = ssl.create_default_context(cafile=str(first["ca_cert"]))
    trusts_second = ssl.create_default_context(cafile=str(second["ca_cert"]))
    status, _, peer = _get(server.port, "/metrics", trusts_first)
    assert status == 200
    assert peer == _der(first["serving_cert"].read_bytes())
    with pytest.raises(ssl.SSLCertVerificationError):
        _get(server.port, "/metrics", trusts_second)

    # Rotation: the next connection gets the new certificate, no restart.
    volume.write(second["serving_cert"].read_bytes(), second["serving_key"].read_bytes())
    status, _, peer = _get(server.port, "/metrics", trusts_second)
    assert status == 200
    assert peer == _der(second["serving_cert"].read_bytes())
    assert tls.reloads == 1
    # Unchanged files are not loaded again.
    _get(server.port, "/healthz", trusts_second)
    assert tls.reloads == 1


def test_a_half_rotated_pair_keeps_the_previous_certificate_until_the_key_follows(
    tmp_path: Path, server_factory: list[HealthServer]
) -> None:
    cert_a, key_a = self_signed_pem(["127.0.0.1"])
    cert_b, key_b = self_signed_pem(["127.0.0.1"])
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert_file.write_bytes(cert_a)
    key_file.write_bytes(key_a)
    tls = ServingCertificate.from_files(str(cert_file), str(key_file))
    server = _served(tls)
    server_factory.append(server)
    assert _get(server.port, "/healthz", _unverified())[2] == _der(cert_a)

    # The certificate is replaced first, its key a moment later (two writes).
    staged = tmp_path / "staged.crt"
    staged.write_bytes(cert_b)
    os.replace(staged, cert_file)
    assert _get(server.port, "/healthz", _unverified())[2] == _der(cert_a)
    assert tls.reloads == 0
    staged_key = tmp_path / "staged.key"
    staged_key.write_bytes(key_b)
    os.replace(staged_key, key_file)
    assert wait_for(lambda: _get(server.port, "/healthz", _unverified())[2] == _der(cert_b), timeout=5)
    assert tls.reloads == 1

    # Files gone for a moment (a volume being remounted): still serving.
    shutil.move(str(cert_file), str(tmp_path / "away.crt"))
    assert _get(server.port, "/healthz", _unverified())[2] == _der(cert_b)


def test_unusable_certificate_files_are_refused_at_start(tmp_path: Path) -> None:
    cert_a, _ = self_signed_pem(["127.0.0.1"])
    _, key_b = self_signed_pem(["127.0.0.1"])
    (tmp_path / "a.crt").write_bytes(cert_a)
    (tmp_path / "b.key").write_bytes(key_b)
    with pytest.raises(ServingCertificateError, match="cannot load"):
        ServingCertificate.from_files(str(tmp_path / "a.crt"), str(tmp_path / "b.key"))
    with pytest.raises(ServingCertificateError, match="cannot load"):
        ServingCertificate.from_files(str(tmp_path / "missing.crt"), str(tmp_path / "b.key"))
