"""``gpuwarden webhook``: the admission webhook for GPU-sharing pods, a process of its own.

Registered by :func:`scheduler.cli.register` beside ``scheduler``; it runs as
a second container of each scheduler pod (manifests/scheduler/), so both
replicas answer, and a long scheduling cycle never delays an admission.
Only flag parsing happens at import; the Kubernetes client is loaded when it runs.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from gpuwarden.contract import SLICE_RUNTIME_CLASS, WEBHOOK_COMPONENT
from gpuwarden.flags import FlagError, add_flag, port_number, seconds


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "webhook",
        help="serve the admission webhook for GPU-sharing pods",
        description="Validate the GPU-sharing annotations of pods created for the gpuwarden scheduler and "
        "inject their GPU slice ConfigMap and runtime class, over HTTPS.",
    )
    add_flag(parser, "--kubeconfig", default=None, help="kubeconfig file; in-cluster service account when unset")
    add_flag(parser, "--webhook-address", default="0.0.0.0", help="address the HTTPS endpoint listens on")
    add_flag(parser, "--webhook-port", type=port_number, default=9443, help="port of /mutate, /healthz, /readyz")
    add_flag(
        parser,
        "--runtime-class",
        default=SLICE_RUNTIME_CLASS,
        help="runtimeClassName set on slice pods that name none (the runtime that preloads HAMi-core); empty sets "
        "none; give the scheduler the same",
    )
    add_flag(
        parser,
        "--tls-cert-file",
        default=None,
        help="PEM certificate to serve (cert-manager's Secret), reloaded when it changes; without it the "
        "webhook bootstraps a CA in --cert-secret and writes the caBundle itself",
    )
    add_flag(parser, "--tls-key-file", default=None, help="PEM key of --tls-cert-file")
    add_flag(parser, "--namespace", default="gpuwarden", help="namespace of the webhook's Service and Secret")
    add_flag(parser, "--service", default=WEBHOOK_COMPONENT, help="the webhook's Service (the certificate's name)")
    add_flag(
        parser,
        "--webhook-configuration",
        default=WEBHOOK_COMPONENT,
        help="MutatingWebhookConfiguration whose caBundle the bootstrap writes",
    )
    add_flag(parser, "--cert-secret", default=f"{WEBHOOK_COMPONENT}-tls", help="Secret holding the bootstrap CA")
    add_flag(
        parser,
        "--cert-check-interval",
        type=seconds(low=1.0, high=86_400.0),
        default=300.0,
        help="seconds between checks of the bootstrap certificate (renewal, another replica's rotation)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or SIGINT."""
    from gpuwarden.kube import load_api_client  # noqa: PLC0415
    from gpuwarden.servingcert import ServingCertificateError  # noqa: PLC0415
    from scheduler.cluster.webhook.app import WebhookSettings, run_until  # noqa: PLC0415
    from scheduler.cluster.webhook.certs import CertSettings  # noqa: PLC0415

    cert, key = args.tls_cert_file or None, args.tls_key_file or None
    if (cert is None) != (key is None):
        raise FlagError("--tls-cert-file and --tls-key-file go together: a certificate is served with its key")
    service = f"{args.service}.{args.namespace}.svc"
    settings = WebhookSettings(
        host=args.webhook_address,
        port=args.webhook_port,
        runtime_class=args.runtime_class or None,
        cert_file=cert,
        key_file=key,
        certs=CertSettings(
            namespace=args.namespace,
            secret=args.cert_secret,
            webhook_config=args.webhook_configuration or None,
            hosts=(service, f"{service}.cluster.local"),
            check_s=args.cert_check_interval,
        ),
    )
    try:
        api_client = load_api_client(args.kubeconfig)
    except Exception as exc:  # the kubernetes config loaders raise several unrelated types
        sys.stderr.write(f"gpuwarden webhook: cannot use the kubeconfig {args.kubeconfig or '(in-cluster)'}: {exc}\n")
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        return run_until(api_client, settings, stop)
    except (ServingCertificateError, OSError) as exc:
        sys.stderr.write(f"gpuwarden webhook: cannot serve on port {args.webhook_port}: {exc}\n")
        return 2
