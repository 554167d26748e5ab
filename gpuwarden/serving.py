"""How the HTTP endpoint is secured: the flags both processes share, their checks, and the server they build.

Two modes, chosen per process:

* **plain HTTP, no authentication** (the default): what node_exporter and
  dcgm-exporter do, and what any Prometheus scrapes with no configuration.
  The metrics are hardware health and counters, no secrets; a cluster that
  scrapes inside the node network, or fences the port with a
  NetworkPolicy or the host firewall, needs nothing more.
* **TLS with delegated authorization** (``--metrics-tls
  --metrics-auth=delegated``): HTTPS, and ``/metrics`` only for a bearer
  token whose user the API server allows ``get`` on the non-resource URL
  ``/metrics`` (see :mod:`gpuwarden.metricsauth`). For clusters where the
  node network is not trusted; it needs RBAC for the process and for the
  scraper (manifests/secure-metrics/).

``--metrics-tls`` alone (encryption without authorization) is allowed;
delegated authorization without TLS is refused, since it would send the
scraper's token in clear text to anyone on the path. Plain HTTP stays the
default because the secure mode cannot work without cluster-specific
configuration on the scraper's side (its ServiceAccount bound to a
ClusterRole, HTTPS and a token in its scrape config), and a default that
breaks every existing scrape would be turned off, not kept.

Imports nothing heavy: parsing flags must stay cheap (:mod:`gpuwarden.cli`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from gpuwarden.flags import FlagError, add_flag

if TYPE_CHECKING:
    from kubernetes import client
    from prometheus_client import CollectorRegistry

    from gpuwarden.http import Check, HealthServer

MetricsAuth = Literal["none", "delegated"]
AUTH_MODES: list[str] = ["none", "delegated"]

# The scrape waits for the reviews; Prometheus' default scrape timeout is 10 s.
REVIEW_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class MetricsSecurity:
    """TLS and authorization of the HTTP endpoint; the default is plain HTTP, open (see the module docstring)."""

    tls: bool = False
    # Both or neither; neither in TLS mode means a self-signed certificate.
    cert_file: str | None = None
    key_file: str | None = None
    auth: MetricsAuth = "none"


def add_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--metrics-tls``, ``--metrics-tls-cert-file``, ``--metrics-tls-key-file`` and ``--metrics-auth``."""
    add_flag(
        parser,
        "--metrics-tls",
        action="store_true",
        help="serve /metrics, /healthz and /readyz over HTTPS only",
    )
    add_flag(
        parser,
        "--metrics-tls-cert-file",
        default=None,
        help="PEM certificate (chain) for --metrics-tls, reloaded when the file changes; "
        "self-signed at start when unset",
    )
    add_flag(
        parser,
        "--metrics-tls-key-file",
        default=None,
        help="PEM private key of --metrics-tls-cert-file, reloaded with it",
    )
    add_flag(
        parser,
        "--metrics-auth",
        choices=AUTH_MODES,
        default="none",
        help="who may read /metrics: anyone (none), or bearer tokens the API server allows to get the "
        "non-resource URL /metrics (delegated: TokenReview and SubjectAccessReview; needs --metrics-tls)",
    )


def security_from_args(args: argparse.Namespace) -> MetricsSecurity:
    """The flags' values, checked together. Raises :class:`FlagError` (a usage error, exit status 2)."""
    cert, key = args.metrics_tls_cert_file or None, args.metrics_tls_key_file or None
    if cert is not None and key is None:
        raise FlagError("--metrics-tls-cert-file needs --metrics-tls-key-file: a certificate is served with its key")
    if key is not None and cert is None:
        raise FlagError("--metrics-tls-key-file needs --metrics-tls-cert-file: a key is served with its certificate")
    if cert is not None and not args.metrics_tls:
        raise FlagError("--metrics-tls-cert-file and --metrics-tls-key-file need --metrics-tls")
    if args.metrics_auth == "delegated" and not args.metrics_tls:
        raise FlagError(
            "--metrics-auth=delegated needs --metrics-tls: scrapers would send their bearer tokens in clear text"
        )
    return MetricsSecurity(tls=bool(args.metrics_tls), cert_file=cert, key_file=key, auth=args.metrics_auth)


def build_server(
    registry: CollectorRegistry,
    security: MetricsSecurity,
    *,
    host: str,
    port: int,
    liveness: Check,
    readiness: Check,
    api_client: client.ApiClient,
    field_manager: str,
    hosts: Sequence[str],
) -> HealthServer:
    """The HTTP endpoint in the mode ``security`` asks for.

    ``hosts`` name a self-signed certificate. Reviews go through their own
    :class:`~gpuwarden.kube.KubeApi`, with a short timeout and their own
    request counts: counted with the process's other requests, every scrape
    would look like progress to a liveness check that tells a stuck
    publisher or cycle by its last finished request, and would count
    against the publishing request budget. A failing review shows as the
    target down (503) and a log line per outage. Raises
    :class:`~gpuwarden.servingcert.ServingCertificateError` when the
    certificate files cannot be served and ``OSError`` when the port is taken.
    """
    # Imported here: flag parsing must not load the HTTP or Kubernetes modules.
    from gpuwarden.http import HealthServer  # noqa: PLC0415
    from gpuwarden.kube import KubeApi  # noqa: PLC0415
    from gpuwarden.metricsauth import DelegatedAuthorizer  # noqa: PLC0415
    from gpuwarden.servingcert import ServingCertificate  # noqa: PLC0415

    tls: ServingCertificate | None = None
    if security.tls:
        if security.cert_file and security.key_file:
            tls = ServingCertificate.from_files(security.cert_file, security.key_file)
        else:
            tls = ServingCertificate.self_signed([*hosts, "localhost", "127.0.0.1"])
    authorizer = None
    if security.auth == "delegated":
        reviews = KubeApi(api_client, field_manager=field_manager, timeout_s=REVIEW_TIMEOUT_S)
        authorizer = DelegatedAuthorizer(reviews)
    return HealthServer(
        registry, host=host, port=port, liveness=liveness, readiness=readiness, tls=tls, authorizer=authorizer
    )
