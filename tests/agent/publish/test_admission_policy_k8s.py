"""The agent's token may write only its own node's health: the shipped admission policy, for real.

The token is what a DaemonSet pod gets: a ServiceAccount token bound to a pod
on node A, which makes the API server name the node in the request's user
info. With it the agent writes its conditions and gpu-memory on A, and
nothing else: not node B, not A's labels, the kubelet's conditions or another
capacity, and not another node's GPUNode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from agent.publish.gpunode import gpunode_object
from gpuwarden import contract
from tests.agent.publish.conftest import AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT, delete_node_and_leftovers
from tests.harness import ControlPlane, create_gpu_node, unique_name
from tests.waiting import wait_for

pytestmark = pytest.mark.k8s


@pytest.fixture
def two_nodes(k8s: client.ApiClient, agent_manifests: None) -> Iterator[tuple[str, str]]:
    names = (unique_name("vap-a"), unique_name("vap-b"))
    for name in names:
        create_gpu_node(k8s, name, gpus=8)
    try:
        yield names
    finally:
        for name in names:
            delete_node_and_leftovers(k8s, name)


def _agent_on(control_plane: ControlPlane, k8s: client.ApiClient, node: str) -> client.ApiClient:
    """A client with the token a DaemonSet pod of the agent on ``node`` would mount."""
    core = client.CoreV1Api(k8s)
    pod = core.create_namespaced_pod(
        AGENT_NAMESPACE,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name=unique_name("gpuwarden-agent")),
            spec=client.V1PodSpec(
                node_name=node,
                service_account_name=AGENT_SERVICE_ACCOUNT,
                containers=[client.V1Container(name="agent", image="registry.invalid/gpuwarden:test")],
            ),
        ),
    )
    token = core.create_namespaced_service_account_token(
        AGENT_SERVICE_ACCOUNT,
        AGENT_NAMESPACE,
        client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=[],
                expiration_seconds=3600,
                bound_object_ref=client.V1BoundObjectReference(
                    kind="Pod", api_version="v1", name=pod.metadata.name, uid=pod.metadata.uid
                ),
            )
        ),
    ).status.token
    config = control_plane.configuration()
    config.api_key = {"authorization": token}
    return client.ApiClient(config)


def _status_patch(api: client.ApiClient, node: str, body: dict[str, Any]) -> int:
    """The HTTP status of a strategic-merge patch of nodes/status (200 when allowed)."""
    try:
        client.CoreV1Api(api).patch_node_status(node, body)
    except client.ApiException as exc:
        return int(exc.status)
    return 200


def _own_condition(status: str = "True") -> dict[str, Any]:
    return {
        "type": contract.ConditionType.GPU_PCIE_DEGRADED.value,
        "status": status,
        "reason": "PcieWidthDegraded",
        "message": "GPU 2: PCIe link x8, device maximum x16. Recommended action: RESET_GPU.",
    }


def test_the_agents_token_writes_only_its_own_nodes_health(
    control_plane: ControlPlane, k8s: client.ApiClient, two_nodes: tuple[str, str]
) -> None:
    node_a, node_b = two_nodes
    with contextlib.closing(_agent_on(control_plane, k8s, node_a)) as agent:
        # Policies take effect once the API server has loaded them.
        wait_for(
            lambda: _status_patch(agent, node_b, {"status": {"conditions": [_own_condition()]}}) == 403,
            timeout=30,
            interval=0.5,
            description="the agent on A refused B's status",
        )
        assert _status_patch(agent, node_a, {"status": {"conditions": [_own_condition()]}}) == 200
        assert _status_patch(agent, node_a, {"status": {"capacity": {contract.RESOURCE_GPU_MEMORY: "652472"}}}) == 200
        refused = [
            {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}},
            {"metadata": {"annotations": {"example.com/owned": "yes"}}},
            {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "Gone", "message": "x"}]}},
            {"status": {"allocatable": {contract.RESOURCE_NVIDIA_GPU: "0"}}},
            {"status": {"capacity": {"cpu": "1"}}},
        ]
        assert [_status_patch(agent, node_a, body) for body in refused] == [403] * len(refused)
        stored = client.CoreV1Api(k8s).read_node(node_a)
        assert "node-role.kubernetes.io/control-plane" not in (stored.metadata.labels or {})
        assert stored.status.allocatable[contract.RESOURCE_NVIDIA_GPU] == "8"
        ready = next(c for c in stored.status.conditions if c.type == "Ready")
        assert ready.status == "True"

        # GPUNodes: its own, not another node's, and no finalizers.
        custom = client.CustomObjectsApi(agent)

        def create(name: str, **meta: Any) -> int:
            body = gpunode_object(name, None)
            body["metadata"].update(meta)
            try:
                custom.create_cluster_custom_object(
                    contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL, body
                )
            except client.ApiException as exc:
                return int(exc.status)
            return 201

        assert create(node_b) == 403
        assert create(node_a, finalizers=["example.com/keep"]) == 403
        assert create(node_a) == 201


def test_the_agent_answers_in_status_remediation_but_never_writes_the_spec(
    control_plane: ControlPlane, k8s: client.ApiClient, two_nodes: tuple[str, str]
) -> None:
    node_a, _ = two_nodes
    group = (contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL)
    asked = {"resets": [{"gpu": 1, "requestedAt": "2026-12-01T10:00:00Z"}]}
    answered = {
        "resets": [
            {
                "gpu": 1,
                "requestedAt": "2026-12-01T10:00:00Z",
                "result": contract.RESET_SUCCEEDED,
                "finishedAt": "2026-12-01T10:00:05.250000Z",
            }
        ],
        "validations": [],
    }
    with contextlib.closing(_agent_on(control_plane, k8s, node_a)) as agent:
        custom = client.CustomObjectsApi(agent)

        def status_of(call: Any, *args: Any) -> int:
            try:
                call(*group, *args)
            except client.ApiException as exc:
                return int(exc.status)
            return 200

        forged = gpunode_object(node_a, None)
        forged["spec"][contract.GPUNODE_REMEDIATION] = {"validations": [{"requestedAt": "2026-12-01T10:00:00Z"}]}
        wait_for(
            lambda: status_of(custom.create_cluster_custom_object, forged) == 403,
            timeout=30,
            interval=0.5,
            description="the agent refused a GPUNode created with remediation requests",
        )
        assert status_of(custom.create_cluster_custom_object, gpunode_object(node_a, None)) == 200
        # The scheduler asks (an administrator's client here).
        client.CustomObjectsApi(k8s).patch_cluster_custom_object(
            *group, node_a, {"spec": {contract.GPUNODE_REMEDIATION: asked}}
        )
        # The agent sees the request through its own watch's list (RBAC: list with its name).
        listed = custom.list_cluster_custom_object(*group, field_selector=f"metadata.name={node_a}")
        assert [i["spec"][contract.GPUNODE_REMEDIATION] for i in listed["items"]] == [asked]
        # It answers in status, and may not rewrite, drop or add to the requests.
        patch = {"status": {contract.GPUNODE_REMEDIATION: answered}}
        assert status_of(custom.patch_cluster_custom_object_status, node_a, patch) == 200
        for spec in ({contract.GPUNODE_REMEDIATION: None}, {contract.GPUNODE_REMEDIATION: {"resets": []}}):
            assert status_of(custom.patch_cluster_custom_object, node_a, {"spec": spec}) == 403
        # A spec sent to the status subresource is not applied.
        sneaky = {"spec": {contract.GPUNODE_REMEDIATION: None}, "status": {"gpuCount": 8}}
        assert status_of(custom.patch_cluster_custom_object_status, node_a, sneaky) == 200
    stored = client.CustomObjectsApi(k8s).get_cluster_custom_object(*group, node_a)
    assert stored["spec"][contract.GPUNODE_REMEDIATION] == asked
    assert stored["status"][contract.GPUNODE_REMEDIATION] == answered
