"""Small helpers that let many tests share one cluster.

One control plane serves the whole session, so every test names its objects
with :func:`unique_name` or works in a :func:`temporary_namespace`. Waiting
for controllers (``wait_for``) lives in :mod:`tests.waiting`, which needs no
Kubernetes client, so unit tests wait the same way without importing it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator

import pytest
from kubernetes import client

from gpuwarden.localcluster import ControlPlane, ManagedProcess, find_binaries


def unique_name(prefix: str) -> str:
    """A DNS-1123 name that no other test uses, e.g. ``gpu-node-3f9a1c07``.

    32 random bits: a run makes a thousand namespaces or so, which stay
    (terminating: no namespace controller runs) until the control plane
    stops, and with 24 bits two of them met about once in thirty runs.
    """
    base = "".join(c if c.isalnum() else "-" for c in prefix.lower()).strip("-")[:50] or "x"
    return f"{base}-{secrets.token_hex(4)}"


def simple_pod(name: str, *, labels: dict[str, str] | None = None, node_name: str | None = None) -> client.V1Pod:
    """A one-container pod object (not created) for tests that need any pod."""
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1PodSpec(
            node_name=node_name,
            containers=[client.V1Container(name="main", image="registry.invalid/gpuwarden-test:1")],
        ),
    )


@contextlib.contextmanager
def temporary_namespace(api: client.ApiClient, prefix: str = "test") -> Iterator[str]:
    """Create a uniquely named namespace and delete it afterwards (not waiting)."""
    core = client.CoreV1Api(api)
    name = unique_name(prefix)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(name)


@contextlib.contextmanager
def pod_bound_token(api: client.ApiClient, service_account: str, namespace: str) -> Iterator[str]:
    """The token a pod of ``service_account`` mounts: a TokenRequest bound to a pod made for it.

    No kubelet runs the pod (no scheduler takes it); it exists so that the
    token is what a Deployment's or DaemonSet's pod really gets, and is
    deleted afterwards, which also ends the token.
    """
    core = client.CoreV1Api(api)
    pod = core.create_namespaced_pod(
        namespace,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name=unique_name(service_account)),
            spec=client.V1PodSpec(
                service_account_name=service_account,
                scheduler_name="nobody",
                containers=[client.V1Container(name="main", image="registry.invalid/gpuwarden:test")],
            ),
        ),
    )
    try:
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=[],
                expiration_seconds=3600,
                bound_object_ref=client.V1BoundObjectReference(
                    kind="Pod", api_version="v1", name=pod.metadata.name, uid=pod.metadata.uid
                ),
            )
        )
        yield str(core.create_namespaced_service_account_token(service_account, namespace, request).status.token)
    finally:
        with contextlib.suppress(client.ApiException):
            core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)


@contextlib.contextmanager
def kube_scheduler(control_plane: ControlPlane, name: str, *flags: str) -> Iterator[ManagedProcess]:
    """The upstream kube-scheduler (``make controlplane`` builds it; ``KUBE_SCHEDULER`` names another) on the
    test control plane, leader election off, stopped afterwards. A missing binary fails the test, never skips it."""
    override = os.environ.get("KUBE_SCHEDULER")
    path = os.path.abspath(override) if override else str(find_binaries().kube_apiserver.parent / "kube-scheduler")
    if not os.access(path, os.X_OK):
        pytest.fail(f"no kube-scheduler at {path}: build it with `make controlplane`", pytrace=False)
    proc = ManagedProcess(
        name=name,
        argv=[path, f"--kubeconfig={control_plane.kubeconfig}", "--leader-elect=false", "--secure-port=0", *flags],
        log_path=control_plane.run_dir / "logs" / f"{name}.log",
        pid_file=control_plane.run_dir / "pids",
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
