"""Placement rules through whole cycles against the real API server: pods bound where their rules allow.

The engine's rules are pinned down in tests/scheduler/engine/test_rules.py
and checked against kube-scheduler in test_placement_oracle_k8s.py; here the
objects are the API server's own (a node's labels, a pod's affinity, a
PersistentVolume's node affinity, a claim that waits for its first
consumer), and the cycle binds.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from gpuwarden import contract
from scheduler.cluster.cycle import ClusterView
from tests.harness import unique_name
from tests.scheduler.cluster.kube_objects import node_of, podgroup
from tests.scheduler.cluster.test_cycle_k8s import new_cycle, podgroup_status, view

pytestmark = pytest.mark.k8s

PRODUCT = "nvidia.com/gpu.product"
HOST = "kubernetes.io/hostname"


def _raw(response: Any) -> Any:
    return json.loads(response.data)


def _view(k8s: client.ApiClient, nodes: set[str]) -> ClusterView:
    """The cycle's view, with the claims and volumes the watch cache also holds."""
    core = client.CoreV1Api(k8s)
    claims = {
        f"{c['metadata']['namespace']}/{c['metadata']['name']}": c
        for c in _raw(core.list_persistent_volume_claim_for_all_namespaces(_preload_content=False))["items"]
    }
    volumes = {v["metadata"]["name"]: v for v in _raw(core.list_persistent_volume(_preload_content=False))["items"]}
    base = view(k8s, nodes)
    return ClusterView(
        nodes=base.nodes,
        gpunodes=base.gpunodes,
        pods=base.pods,
        queues=base.queues,
        podgroups=base.podgroups,
        claims=claims,
        volumes=volumes,
    )


def _pod(k8s: client.ApiClient, namespace: str, name: str, queue: str, **spec: Any) -> None:
    podgroup(k8s, namespace, name, queue, 1)
    body = {
        "metadata": {"name": name, "annotations": {contract.ANNOTATION_POD_GROUP: name}},
        "spec": {
            "schedulerName": contract.SCHEDULER_NAME,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/train:1",
                    "resources": {
                        "requests": {"cpu": "1", "memory": "1Gi", contract.RESOURCE_NVIDIA_GPU: "1"},
                        "limits": {contract.RESOURCE_NVIDIA_GPU: "1"},
                    },
                }
            ],
            **spec,
        },
    }
    client.CoreV1Api(k8s).create_namespaced_pod(namespace, body)


def _label(k8s: client.ApiClient, node: str, labels: dict[str, str]) -> None:
    client.CoreV1Api(k8s).patch_node(node, {"metadata": {"labels": labels}})


def _reason(k8s: client.ApiClient, namespace: str, name: str) -> tuple[str, str]:
    (condition,) = podgroup_status(k8s, namespace, name)["conditions"]
    return condition["reason"], condition["message"]


def test_required_node_affinity_binds_to_the_named_product_only(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    a100, h100 = cluster(2)
    _label(k8s, a100, {PRODUCT: "NVIDIA-A100-SXM4-80GB"})
    _label(k8s, h100, {PRODUCT: "NVIDIA-H100-80GB-HBM3"})
    q = queue(16)
    term = {"matchExpressions": [{"key": PRODUCT, "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}]}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
    for i in range(3):
        _pod(k8s, namespace, f"h-{i}", q, affinity=affinity)
    new_cycle(k8s).run(_view(k8s, {a100, h100}))
    assert [node_of(k8s, namespace, f"h-{i}") for i in range(3)] == [h100] * 3


def test_a_bound_volume_keeps_its_pod_on_the_volume_s_node_and_an_unbound_claim_waits_saying_why(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    first, second = cluster(2)
    for node in (first, second):
        _label(k8s, node, {HOST: node})
    core = client.CoreV1Api(k8s)
    storage = client.StorageV1Api(k8s)
    late = unique_name("late")
    storage.create_storage_class(
        {
            "metadata": {"name": late},
            "provisioner": "example.com/none",
            "volumeBindingMode": "WaitForFirstConsumer",
        }
    )
    pv = unique_name("local")
    try:
        core.create_persistent_volume(
            {
                "metadata": {"name": pv},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "",
                    "local": {"path": "/data"},
                    "nodeAffinity": {
                        "required": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": HOST, "operator": "In", "values": [second]}]}
                            ]
                        }
                    },
                },
            }
        )
        resources = {"requests": {"storage": "1Gi"}}
        core.create_namespaced_persistent_volume_claim(
            namespace,
            {
                "metadata": {"name": "data"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": resources,
                    "storageClassName": "",
                    "volumeName": pv,
                },
            },
        )
        core.create_namespaced_persistent_volume_claim(
            namespace,
            {
                "metadata": {"name": "scratch"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": resources, "storageClassName": late},
            },
        )
        q = queue(16)
        _pod(k8s, namespace, "reader", q, volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}])
        _pod(k8s, namespace, "waiter", q, volumes=[{"name": "s", "persistentVolumeClaim": {"claimName": "scratch"}}])
        _pod(k8s, namespace, "lost", q, volumes=[{"name": "m", "persistentVolumeClaim": {"claimName": "missing"}}])
        new_cycle(k8s).run(_view(k8s, {first, second}))

        assert node_of(k8s, namespace, "reader") == second
        assert node_of(k8s, namespace, "waiter") is None
        reason, message = _reason(k8s, namespace, "waiter")
        assert reason == "UnsupportedPlacement"
        assert "scratch is not bound yet" in message and late in message
        assert node_of(k8s, namespace, "lost") is None
        assert _reason(k8s, namespace, "lost") == (
            "UnsupportedPlacement",
            "pod lost is not placed: persistentvolumeclaim missing not found",
        )
    finally:
        storage.delete_storage_class(late)
        core.delete_persistent_volume(pv)
