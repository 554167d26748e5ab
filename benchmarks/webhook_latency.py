"""What the admission webhook adds to a pod creation, beside the same creation without it.

Starts the test control plane, runs the webhook in a process of its own (as
the second container of a scheduler pod does: it shares no interpreter with
the client), registers the shipped webhook configuration pointed at it on
127.0.0.1 with the caBundle its bootstrap writes, and creates the same GPU
slice pod ``--pods`` times in each of two namespaces, interleaved: one the
configuration selects (the API server calls the webhook, which validates the
pod and injects its envFrom and runtime class) and one it does not. Each
create is timed end to end at the client; min, median and p99 are printed
for both and their difference. Target: the webhook adds under 5 ms at p99.

Run it (not part of ``make test``; about a minute)::

    make controlplane
    .venv/bin/python benchmarks/webhook_latency.py [--pods 1000]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402
from kubernetes import client  # noqa: E402

from gpuwarden import contract  # noqa: E402
from gpuwarden.logconfig import configure_logging  # noqa: E402
from tests.harness import free_ports, running_control_plane, temporary_namespace, unique_name, wait_for  # noqa: E402

MANIFEST = REPO / "manifests" / "scheduler" / "webhook.yaml"
LABEL = "gpuwarden-webhook-bench"
CONFIGURATION = "gpuwarden-webhook-bench"
WARM_UP = 20


def serve(kubeconfig: str, namespace: str, port: int, runtime_class: str) -> None:
    """The webhook process: bootstrap its CA into ``namespace``, write the caBundle, serve until killed."""
    import threading

    from gpuwarden.kube import load_api_client
    from scheduler.cluster.webhook.app import WebhookSettings, run_until
    from scheduler.cluster.webhook.certs import CertSettings

    configure_logging("console", "warning")
    settings = WebhookSettings(
        host="127.0.0.1",
        port=port,
        runtime_class=runtime_class,
        certs=CertSettings(namespace=namespace, webhook_config=CONFIGURATION, hosts=("127.0.0.1",)),
    )
    run_until(load_api_client(kubeconfig), settings, threading.Event())


def slice_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {contract.ANNOTATION_GPU_FRACTION: "0.25"}},
        "spec": {
            "schedulerName": contract.SCHEDULER_NAME,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/train:1",
                    "resources": {"requests": {"cpu": "1", "memory": "4Gi"}},
                }
            ],
        },
    }


def configuration(port: int) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    config: dict[str, Any] = next(d for d in docs if d["kind"] == "MutatingWebhookConfiguration")
    config["metadata"] = {"name": CONFIGURATION}
    (hook,) = config["webhooks"]
    hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}/mutate"}
    hook["namespaceSelector"] = {"matchLabels": {LABEL: "on"}}
    return config


def summary(label: str, samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"{label:<16} min {ordered[0]:7.2f} ms   median {statistics.median(ordered):7.2f} ms   p99 {p99:7.2f} ms"


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=1000, help="pods created with the webhook, and as many without")
    args = parser.parse_args()
    configure_logging("console", "warning")
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    with running_control_plane() as plane, plane.api_client() as api:
        core = client.CoreV1Api(api)
        admission = client.AdmissionregistrationV1Api(api)
        nodes = client.NodeV1Api(api)
        runtime_class = unique_name("hami")
        nodes.create_runtime_class(
            {
                "apiVersion": "node.k8s.io/v1",
                "kind": "RuntimeClass",
                "metadata": {"name": runtime_class},
                "handler": "hami",
            }
        )
        (port,) = free_ports(1)
        admission.create_mutating_webhook_configuration(configuration(port))
        with temporary_namespace(api, "bench-on") as on, temporary_namespace(api, "bench-off") as off:
            core.patch_namespace(on, {"metadata": {"labels": {LABEL: "on"}}})
            process = multiprocessing.get_context("spawn").Process(
                target=serve, args=(str(plane.kubeconfig), on, port, runtime_class), daemon=True
            )
            process.start()
            try:
                wait_for(
                    lambda: core.create_namespaced_pod(on, slice_pod("probe"), dry_run="All").spec.runtime_class_name,
                    timeout=60,
                    ignore=(client.ApiException,),
                    description="the webhook answers",
                )
                timings: dict[str, list[float]] = {on: [], off: []}
                for i in range(WARM_UP + args.pods):
                    # Alternate which goes first, so neither always follows the other.
                    order = (on, off) if i % 2 == 0 else (off, on)
                    for namespace in order:
                        started = time.perf_counter()
                        created = core.create_namespaced_pod(namespace, slice_pod(f"pod-{i}"))
                        elapsed = (time.perf_counter() - started) * 1000
                        if namespace == on:
                            assert created.spec.runtime_class_name == runtime_class
                        else:
                            assert created.spec.runtime_class_name is None
                        if i >= WARM_UP:
                            timings[namespace].append(elapsed)
            finally:
                process.kill()
                process.join(5)
                with contextlib.suppress(client.ApiException):
                    admission.delete_mutating_webhook_configuration(CONFIGURATION)
                with contextlib.suppress(client.ApiException):
                    nodes.delete_runtime_class(runtime_class)
        with_hook, without = timings[on], timings[off]
        print(f"pod creation, {args.pods} pods each way, interleaved (client-side wall time)")
        print(summary("without webhook", without))
        print(summary("with webhook", with_hook))
        added_median = statistics.median(with_hook) - statistics.median(without)
        added_p99 = p99(with_hook) - p99(without)
        print(f"{'added':<16} median {added_median:+.2f} ms   p99 {added_p99:+.2f} ms   (target: p99 under +5 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
