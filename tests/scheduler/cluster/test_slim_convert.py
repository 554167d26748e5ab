"""What the cache keeps of a pod is all the conversion reads: a slimmed pod converts like the raw one."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwarden import contract
from scheduler.cluster.convert import task_from_pod
from scheduler.cluster.slim import slim_pod


def _raw_pod(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "w-0",
            "namespace": "team",
            "uid": "uid-0",
            "creationTimestamp": "2026-11-29T10:00:00Z",
            "labels": {contract.LABEL_QUEUE: "vision"},
            "annotations": {contract.ANNOTATION_GPU_FRACTION: "0.5", "note": "x"},
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "j-1", "controller": True}
            ],
            "managedFields": [{"manager": "kubectl"}],
        },
        "spec": {
            "schedulerName": contract.SCHEDULER_NAME,
            "priority": 50,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/train:1",
                    "env": [{"name": "A", "value": "1"}],
                    "resources": {"requests": {"cpu": "1500m", "memory": "4Gi"}, "limits": {"nvidia.com/gpu": "1"}},
                }
            ],
            "initContainers": [
                {"name": "fetch", "image": "x", "resources": {"requests": {"cpu": "4", "memory": "1Gi"}}},
                {"name": "proxy", "image": "y", "restartPolicy": "Always", "resources": {"requests": {"cpu": "250m"}}},
            ],
            "overhead": {"cpu": "100m", "memory": "64Mi"},
            "nodeSelector": {"pool": "a"},
            "tolerations": [{"key": "gpuwarden.io/quarantined", "operator": "Exists", "effect": "NoSchedule"}],
            **spec,
        },
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "m"}],
            "containerStatuses": [{"name": "main", "ready": False}],
        },
    }


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"nodeName": "gpu-1"},
        {"schedulingGates": [{"name": "wait-for-data"}]},
    ],
)
def test_a_slimmed_pod_converts_to_the_same_task(spec: dict[str, Any]) -> None:
    raw = _raw_pod(**spec)
    assert task_from_pod(slim_pod(raw)) == task_from_pod(raw)


def test_the_gates_and_the_owner_survive_slimming() -> None:
    slim = slim_pod(_raw_pod(schedulingGates=[{"name": "g"}]))
    assert slim["spec"]["schedulingGates"] == [{"name": "g"}]
    assert slim["metadata"]["ownerReferences"][0]["uid"] == "j-1"
    assert "managedFields" not in slim["metadata"] and "image" not in slim["spec"]["containers"][0]


def test_pods_mounting_the_same_claims_share_one_list_of_them_and_others_keep_their_own() -> None:
    def pod(name: str, claim: str) -> dict[str, Any]:
        volumes = [
            {"name": "data", "persistentVolumeClaim": {"claimName": claim}},
            {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}},
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        ]
        return {"metadata": {"name": name, "namespace": "a"}, "spec": {"containers": [], "volumes": volumes}}

    a, b, c = slim_pod(pod("a", "team-data")), slim_pod(pod("b", "team-data")), slim_pod(pod("c", "other"))
    assert a["spec"]["volumes"] == [
        {"name": "data", "persistentVolumeClaim": {"claimName": "team-data"}},
        {"name": "scratch", "ephemeral": {}},
    ]
    assert a["spec"]["volumes"] is b["spec"]["volumes"]
    assert c["spec"]["volumes"][0]["persistentVolumeClaim"] == {"claimName": "other"}
    assert [task_from_pod(p).claims for p in (a, c)] == [("team-data", "a-scratch"), ("other", "c-scratch")]


def test_a_pod_s_dra_claims_survive_slimming() -> None:
    """The DRA stage finds a pod's claims from what the cache keeps (scheduler.cluster.claims.pod_claims)."""
    from scheduler.cluster.claims import pod_claims

    raw = _raw_pod(resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}])
    raw["status"] = {
        "phase": "Pending",
        "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "w-0-gpu-x7k2"}],
        "extendedResourceClaimStatus": {"resourceClaimName": "w-0-extended-resources-abcde", "requestMappings": []},
    }
    assert (
        pod_claims(slim_pod(raw))
        == pod_claims(raw)
        == [
            ("gpu", "w-0-gpu-x7k2", "one-gpu"),
            ("", "w-0-extended-resources-abcde", "<extended-resources>"),
        ]
    )
