"""The webhook process: GPU inventory, certificate and HTTPS server started and stopped together."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from kubernetes import client

from gpuwarden import contract
from gpuwarden.kube import JSON, ApiError, Backoff, KubeApi
from gpuwarden.logconfig import get_logger
from gpuwarden.servingcert import ServingCertificate
from scheduler.cluster.webhook.certs import CertSettings, WebhookCertificates
from scheduler.cluster.webhook.inventory import GpuInventory
from scheduler.cluster.webhook.review import answer
from scheduler.cluster.webhook.server import WebhookServer

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class WebhookSettings:
    """How ``gpuwarden webhook`` runs; every field has a flag (``gpuwarden webhook --help``).

    With ``cert_file`` and ``key_file`` (cert-manager's Secret, mounted) the
    pair is served and reloaded when it changes, and the caBundle is
    cert-manager's to inject; otherwise ``certs`` says where the
    self-signed bootstrap keeps its CA and which configuration it writes.
    """

    host: str = "0.0.0.0"
    port: int = 9443
    # Set on slice pods that name none; None or "" sets nothing.
    runtime_class: str | None = contract.SLICE_RUNTIME_CLASS
    cert_file: str | None = None
    key_file: str | None = None
    certs: CertSettings | None = None
    inventory_refresh_s: float = 1.0


class Webhook:
    """One webhook replica: construct (:class:`ApiError` when the bootstrap cannot reach the API), start, stop."""

    def __init__(self, api_client: client.ApiClient, settings: WebhookSettings) -> None:
        self.settings = settings
        self.api = KubeApi(api_client, field_manager=contract.WEBHOOK_COMPONENT)
        self.inventory = GpuInventory(api_client, refresh_s=settings.inventory_refresh_s, stats=self.api.stats)
        self.certs: WebhookCertificates | None = None
        if settings.cert_file and settings.key_file:
            tls = ServingCertificate.from_files(settings.cert_file, settings.key_file)
        else:
            if settings.certs is None:
                raise ValueError("without certificate files the webhook needs CertSettings for its bootstrap")
            self.certs = WebhookCertificates(self.api, settings.certs)
            try:
                self.certs.ensure()
                tls = self.certs.serving_certificate()
            except BaseException:
                self.certs.stop()  # a bootstrap retried leaves no key behind
                raise
        self.tls = tls
        self.server = WebhookServer(self.decide, tls=tls, host=settings.host, port=settings.port, ready=self.readiness)

    def decide(self, body: bytes) -> JSON:
        return answer(
            body, largest_gpu_mib=self.inventory.largest_gpu_mib(), runtime_class=self.settings.runtime_class or None
        )

    def readiness(self) -> tuple[bool, str]:
        """Ready once Nodes and GPUNodes are listed: before that a MiB slice could not be bounded."""
        if self.inventory.synced():
            return True, f"ok: largest GPU {self.inventory.largest_gpu_mib()} MiB"
        return False, "nodes and GPUNodes not listed yet"

    @property
    def port(self) -> int:
        return self.server.port

    def start(self) -> Webhook:
        self.inventory.start()
        if self.certs is not None:
            self.certs.start()
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()
        if self.certs is not None:
            self.certs.stop()
        self.inventory.stop()


def run_until(api_client: client.ApiClient, settings: WebhookSettings, stop: threading.Event) -> int:
    """Serve until ``stop`` is set; an API server that is down at start is waited for, with backoff."""
    backoff = Backoff(1.0, 30.0)
    while not stop.is_set():
        try:
            webhook = Webhook(api_client, settings)
            break
        except ApiError as err:
            delay = backoff.next_delay()
            log.warning("webhook_bootstrap_failed", error=str(err), retry_s=round(delay, 1))
            stop.wait(delay)
    else:
        return 0
    webhook.start()
    try:
        stop.wait()
    finally:
        webhook.stop()
    log.info("webhook_stopped", reviews=webhook.server.reviews)
    return 0
