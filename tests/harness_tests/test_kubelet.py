"""The fake kubelet writes nodes the way a real kubelet and device plugin would.

The agent's condition patches and the scheduler's capacity reads are tested
against these nodes, so their status must have a kubelet's shape, and the
taint the API server adds to new nodes must really be lifted.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from kubernetes import client

from gpuwarden import contract
from tests.harness import TAINT_NOT_READY, create_gpu_node, kubelet_conditions, unique_name


def _condition(node: client.V1Node, kind: str) -> dict[str, Any]:
    """The condition ``kind`` of a node as a dict ({} when absent)."""
    conditions = node.to_dict()["status"]["conditions"] or []
    return next((c for c in conditions if c["type"] == kind), {})


def test_kubelet_conditions_are_a_healthy_kubelets() -> None:
    conditions = {c["type"]: c for c in kubelet_conditions()}
    assert set(conditions) == {"MemoryPressure", "DiskPressure", "PIDPressure", "Ready"}
    assert conditions["Ready"]["status"] == "True"
    assert all(c["status"] == "False" for kind, c in conditions.items() if kind != "Ready")
    assert all(c["lastHeartbeatTime"].endswith("Z") for c in conditions.values())


@pytest.mark.k8s
def test_gpu_node_is_ready_untainted_and_has_gpu_capacity(k8s: client.ApiClient) -> None:
    name = unique_name("gpu-node")
    created = create_gpu_node(k8s, name, gpus=4, gpu_memory_mib=4 * 81920, labels={contract.LABEL_NODE_POOL: "a"})
    plain_name = unique_name("plain-node")
    try:
        node = created.to_dict()
        assert node["metadata"]["labels"][contract.LABEL_NODE_POOL] == "a"
        assert node["metadata"]["labels"]["kubernetes.io/hostname"] == name
        for resources in (node["status"]["capacity"], node["status"]["allocatable"]):
            assert resources[contract.RESOURCE_NVIDIA_GPU] == "4"
            assert resources[contract.RESOURCE_GPU_MEMORY] == str(4 * 81920)
            assert resources["cpu"] == "64"
        ready = _condition(created, "Ready")
        assert (ready["status"], ready["reason"]) == ("True", "KubeletReady")
        assert all(t["key"] != TAINT_NOT_READY for t in node["spec"]["taints"] or [])

        plain = create_gpu_node(k8s, plain_name, gpus=2).to_dict()
        assert plain["status"]["capacity"][contract.RESOURCE_NVIDIA_GPU] == "2"
        assert contract.RESOURCE_GPU_MEMORY not in plain["status"]["capacity"]
    finally:
        for node_name in (name, plain_name):
            with contextlib.suppress(client.ApiException):
                client.CoreV1Api(k8s).delete_node(node_name)


@pytest.mark.k8s
def test_admission_taints_new_nodes_not_ready(k8s: client.ApiClient) -> None:
    """The taint create_gpu_node lifts is really added by the API server."""
    core = client.CoreV1Api(k8s)
    name = unique_name("bare-node")
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name)))
    try:
        taints = core.read_node(name).to_dict()["spec"]["taints"] or []
        assert [(t["key"], t["effect"]) for t in taints] == [(TAINT_NOT_READY, "NoSchedule")]
    finally:
        core.delete_node(name)


@pytest.mark.k8s
def test_strategic_merge_condition_patch_keeps_kubelet_conditions(k8s: client.ApiClient) -> None:
    core = client.CoreV1Api(k8s)
    name = unique_name("gpu-node")
    create_gpu_node(k8s, name)
    try:
        patch = {
            "status": {
                "conditions": [
                    {
                        "type": contract.ConditionType.GPU_XID_ERROR.value,
                        "status": "True",
                        "reason": contract.xid_reason(79),
                        "message": "GPU 0 fell off the bus",
                        "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ]
            }
        }
        core.patch_node_status(name, patch)
        node = core.read_node_status(name)

        xid = _condition(node, contract.ConditionType.GPU_XID_ERROR)
        assert (xid["status"], xid["reason"]) == ("True", "Xid79")
        ready = _condition(node, "Ready")
        assert (ready["status"], ready["reason"]) == ("True", "KubeletReady")
        for kubelet_type in ("MemoryPressure", "DiskPressure", "PIDPressure"):
            assert _condition(node, kubelet_type)["status"] == "False"
    finally:
        core.delete_node(name)
