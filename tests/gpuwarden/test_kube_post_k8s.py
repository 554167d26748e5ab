"""KubeApi's POSTs (binds, evictions) through the rest client's pool, against the real API server."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from gpuwarden.kube import ApiError, KubeApi
from gpuwarden.localcluster.controlplane import ControlPlane
from tests.harness import temporary_namespace

FIELD_MANAGER = "gpuwarden-scheduler"


def _binding(namespace: str, pod: str, node: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod, "namespace": namespace, "annotations": {"gpuwarden.io/test": "yes"}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


def _pod(core: client.CoreV1Api, namespace: str, name: str) -> None:
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {"schedulerName": "nobody", "containers": [{"name": "main", "image": "registry.invalid/x:1"}]},
        },
    )


def test_binds_go_out_as_the_client_and_refusals_come_back_in_the_api_servers_words(
    control_plane: ControlPlane,
) -> None:
    with control_plane.api_client() as admin, temporary_namespace(admin) as namespace:
        core = client.CoreV1Api(admin)
        for name in ("p0", "p1"):
            _pod(core, namespace, name)
        api = KubeApi(admin, field_manager=FIELD_MANAGER)
        api.create_pod_binding(namespace, "p0", _binding(namespace, "p0", "node-a"))
        bound = core.read_namespaced_pod("p0", namespace)
        assert bound.spec.node_name == "node-a"
        assert bound.metadata.annotations == {"gpuwarden.io/test": "yes"}
        # Bound already: the API server's 409 and its message, as an ApiError.
        with pytest.raises(ApiError) as conflict:
            api.create_pod_binding(namespace, "p0", _binding(namespace, "p0", "node-b"))
        assert conflict.value.status == 409 and "already assigned" in conflict.value.detail
        with pytest.raises(ApiError) as missing:
            api.create_pod_binding(namespace, "gone", _binding(namespace, "gone", "node-a"))
        assert missing.value.status == 404
        assert api.stats.snapshot() == ({"create_pod_binding": 3}, {"create_pod_binding": 2})

        # The token is read again through the client (at most once a second):
        # a token that stops being good is noticed, and so is a good one again.
        config = admin.configuration
        good = config.api_key["authorization"]
        config.api_key["authorization"] = "not-a-token"
        time.sleep(1.1)
        with pytest.raises(ApiError) as refused:
            api.create_pod_binding(namespace, "p1", _binding(namespace, "p1", "node-a"))
        assert refused.value.status == 401
        config.api_key["authorization"] = good
        time.sleep(1.1)
        api.create_pod_binding(namespace, "p1", _binding(namespace, "p1", "node-a"))
        assert core.read_namespaced_pod("p1", namespace).spec.node_name == "node-a"


def test_a_client_whose_rest_client_changes_requests_is_obeyed(control_plane: ControlPlane) -> None:
    """An impersonating client (its own rest client) binds as the ServiceAccount, so RBAC refuses it."""
    with control_plane.api_client() as admin, temporary_namespace(admin) as namespace:
        _pod(client.CoreV1Api(admin), namespace, "p0")
        with control_plane.impersonate("nobody", namespace) as nobody:
            api = KubeApi(nobody, field_manager=FIELD_MANAGER)
            with pytest.raises(ApiError) as forbidden:
                api.create_pod_binding(namespace, "p0", _binding(namespace, "p0", "node-a"))
        assert forbidden.value.status == 403 and "system:serviceaccount" in forbidden.value.detail
