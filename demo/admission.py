"""The admission webhook for GPU slices, as the demo runs it: in this process, reached on loopback.

In a cluster the webhook is the scheduler pod's second container behind a
Service; here there is no kubelet to run it. Without it the scheduler would
rightly place no slice pod: only the webhook gives one the envFrom of its
slice ConfigMap and its runtime class, and a slice pod without them would
see whole GPUs. So the demo serves the real webhook (its certificate
bootstrap, GPU inventory and review) on 127.0.0.1 and registers the shipped
MutatingWebhookConfiguration with only its client config pointed there. The
shipped RuntimeClass a GPU node offers (HAMi-core's runtime) is created too,
since the API server admits no pod that names a missing one.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from gpuwarden import contract
from gpuwarden.localcluster import ControlPlaneError
from gpuwarden.localcluster.processes import SOURCE_ROOT, free_ports
from scheduler.cluster.webhook.app import Webhook, WebhookSettings
from scheduler.cluster.webhook.certs import CertSettings

WEBHOOK_MANIFEST = SOURCE_ROOT / "manifests" / "scheduler" / "webhook.yaml"
NAMESPACE = "gpuwarden"
TRUST_TIMEOUT_S = 60.0


def _configuration(path: Path, port: int) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    config: dict[str, Any] = next(d for d in docs if d["kind"] == "MutatingWebhookConfiguration")
    for hook in config["webhooks"]:
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}/mutate"}
    return config


class DemoWebhook:
    """Start (certificate, configuration, server, and the API server's trust), then stop."""

    def __init__(self, api: client.ApiClient, runtime_class: str | None = contract.SLICE_RUNTIME_CLASS) -> None:
        self.api = api
        self.runtime_class = runtime_class
        (self.port,) = free_ports(1)
        self.webhook: Webhook | None = None

    def start(self, probe_namespace: str) -> None:
        """Serve, and return once the API server calls the webhook for a slice pod in ``probe_namespace``."""
        if self.runtime_class:
            with contextlib.suppress(client.ApiException):  # 409: there from an earlier start
                client.NodeV1Api(self.api).create_runtime_class(
                    client.V1RuntimeClass(
                        metadata=client.V1ObjectMeta(name=self.runtime_class), handler=self.runtime_class
                    )
                )
        admission = client.AdmissionregistrationV1Api(self.api)
        admission.create_mutating_webhook_configuration(_configuration(WEBHOOK_MANIFEST, self.port))  # type: ignore[arg-type]
        settings = WebhookSettings(
            host="127.0.0.1",
            port=self.port,
            runtime_class=self.runtime_class,
            certs=CertSettings(namespace=NAMESPACE, hosts=("127.0.0.1",)),
        )
        self.webhook = Webhook(self.api, settings).start()
        self._wait_trusted(probe_namespace)

    def _wait_trusted(self, namespace: str) -> None:
        """The API server learns the caBundle from its own watch: a dry-run slice pod tells when it has."""
        probe = client.V1Pod(
            metadata=client.V1ObjectMeta(name="probe", annotations={contract.ANNOTATION_GPU_FRACTION: "0.5"}),
            spec=client.V1PodSpec(
                scheduler_name=contract.SCHEDULER_NAME,
                containers=[client.V1Container(name="main", image="registry.invalid/probe:1")],
            ),
        )
        core = client.CoreV1Api(self.api)
        deadline = time.monotonic() + TRUST_TIMEOUT_S
        last = "no answer yet"
        while time.monotonic() < deadline:
            try:
                created = core.create_namespaced_pod(namespace, probe, dry_run="All")
            except client.ApiException as err:
                last = str(err.reason)
            else:
                if created.spec is not None and created.spec.containers[0].env_from:
                    return
                last = "admitted without its slice ConfigMap"
            time.sleep(0.2)
        raise ControlPlaneError(f"the API server does not reach the demo's webhook: {last}")

    def stop(self) -> None:
        if self.webhook is not None:
            self.webhook.stop()
            self.webhook = None
