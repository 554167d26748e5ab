"""The demo's stand-in kubelet and DRA claims: a pod starts only once its claims are allocated and reserved for it."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from demo.kubelet import LABEL_PART_OF, PART_OF, StandInKubelet
from gpuwarden.localcluster import create_gpu_node
from tests.harness import unique_name
from tests.scheduler.remediation.dra_objects import DRIVER, DriverGpu, driver_slice
from tests.waiting import wait_for

pytestmark = pytest.mark.k8s

DRA = ("resource.k8s.io", "v1")
GPUS = [DriverGpu(i, i, f"GPU-{i:08d}-0000-0000-0000-000000000000", f"00000000:{0x18 + i:02X}:00.0") for i in range(4)]


@pytest.fixture
def dra_node(k8s: client.ApiClient) -> Iterator[str]:
    name = unique_name("kubelet-dra")
    node = create_gpu_node(k8s, name, gpus=0)
    custom = client.CustomObjectsApi(k8s)
    made = custom.create_cluster_custom_object(*DRA, "resourceslices", driver_slice(name, node.metadata.uid, GPUS))
    yield name
    with contextlib.suppress(client.ApiException):
        custom.delete_cluster_custom_object(*DRA, "resourceslices", made["metadata"]["name"])
    with contextlib.suppress(client.ApiException):
        client.CoreV1Api(k8s).delete_node(name)


def _phase(k8s: client.ApiClient, namespace: str, name: str) -> str:
    raw = json.loads(client.CoreV1Api(k8s).read_namespaced_pod(name, namespace, _preload_content=False).data)
    return str((raw.get("status") or {}).get("phase"))


def test_a_pod_whose_claim_is_not_allocated_and_reserved_for_it_does_not_start(
    k8s: client.ApiClient, namespace: str, dra_node: str
) -> None:
    custom = client.CustomObjectsApi(k8s)
    claim = unique_name("claim")
    custom.create_namespaced_custom_object(
        *DRA,
        namespace,
        "resourceclaims",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": claim},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
        },
    )
    pod = client.CoreV1Api(k8s).create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "trainer", "labels": {LABEL_PART_OF: PART_OF}},
            "spec": {
                "nodeName": dra_node,
                "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                "containers": [
                    {"name": "main", "image": "registry.invalid/x:1", "resources": {"claims": [{"name": "gpu"}]}}
                ],
            },
        },
    )
    uid = pod.metadata.uid
    started: list[tuple[str, tuple[int, ...], int]] = []
    kubelet = StandInKubelet(k8s, lambda node, gpus, delta: started.append((node, gpus, delta)))
    kubelet.start()
    try:
        wait_for(lambda: "not allocated" in kubelet.refused.get(uid, ""), timeout=20, description="refused")
        assert _phase(k8s, namespace, "trainer") == "Pending"
        events = client.CoreV1Api(k8s).list_namespaced_event(namespace).items
        assert any(e.reason == "FailedPrepareDynamicResources" and claim in e.message for e in events)

        # Allocated, but for nobody: still refused.
        obj: dict[str, Any] = custom.get_namespaced_custom_object(*DRA, namespace, "resourceclaims", claim)
        obj["status"] = {
            "allocation": {
                "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": dra_node, "device": "gpu-2"}]},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [dra_node]}]}
                    ]
                },
            }
        }
        obj = custom.replace_namespaced_custom_object_status(*DRA, namespace, "resourceclaims", claim, obj)
        wait_for(lambda: "not reserved" in kubelet.refused.get(uid, ""), timeout=20, description="still refused")
        assert _phase(k8s, namespace, "trainer") == "Pending"

        obj["status"]["reservedFor"] = [{"resource": "pods", "name": "trainer", "uid": uid}]
        custom.replace_namespaced_custom_object_status(*DRA, namespace, "resourceclaims", claim, obj)
        wait_for(lambda: _phase(k8s, namespace, "trainer") == "Running", timeout=20, description="started")
        assert started == [(dra_node, (2,), 1)]
    finally:
        kubelet.stop()
