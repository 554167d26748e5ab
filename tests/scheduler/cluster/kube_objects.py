"""Kubernetes objects for the scheduler's cluster tests: GPU nodes as the agent publishes them, queues, pods."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from agent.publish.conditions import desired_conditions
from agent.publish.gpunode import gpunode_object, gpunode_status
from gpuwarden import contract
from scheduler.cluster.sliceadmission import slice_env_source
from tests.agent.publish.reports import report
from tests.harness import ControlPlane, create_gpu_node, unique_name

GPUS = 8
REPO = Path(__file__).resolve().parents[3]
SCHEDULER_RBAC = REPO / "manifests" / "scheduler" / "rbac.yaml"
SCHEDULER_POLICY = REPO / "manifests" / "scheduler" / "admission-policy.yaml"
NAMESPACE_MANIFEST = REPO / "manifests" / "namespace.yaml"


def publish_health(k8s: client.ApiClient, node: str, *faults: Any) -> None:
    """What the agent would publish for ``node``: its GPUNode and its NodeConditions."""
    now = datetime.now(UTC).replace(microsecond=0)
    rep = report(*faults, node=node, time=now)
    custom = client.CustomObjectsApi(k8s)
    try:
        custom.create_cluster_custom_object(
            contract.API_GROUP,
            contract.API_VERSION,
            contract.GPUNODE_PLURAL,
            gpunode_object(node, None),
        )
    except client.ApiException as exc:
        if exc.status != 409:  # it exists: this is an update
            raise
    custom.patch_cluster_custom_object_status(
        contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL, node, {"status": gpunode_status(rep)}
    )
    conditions = [state.to_json(now) for state in desired_conditions(rep, {}, now).values()]
    client.CoreV1Api(k8s).patch_node_status(node, {"status": {"conditions": conditions}})


@pytest.fixture
def cluster(k8s: client.ApiClient, scheduler_crds: None, gpunode_crd: None) -> Iterator[Callable[[int], list[str]]]:
    """Makes healthy 8-GPU nodes with their GPUNode, removed after the test."""
    made: list[str] = []

    def make(count: int) -> list[str]:
        names = [unique_name("cycle-node") for _ in range(count)]
        for name in names:
            create_gpu_node(k8s, name, gpus=GPUS)
            publish_health(k8s, name)
            made.append(name)
        return names

    yield make
    core = client.CoreV1Api(k8s)
    custom = client.CustomObjectsApi(k8s)
    for name in made:
        with contextlib.suppress(client.ApiException):
            core.delete_node(name)
        with contextlib.suppress(client.ApiException):
            custom.delete_cluster_custom_object(contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL, name)


@pytest.fixture
def scheduler_rbac(control_plane: ControlPlane) -> Iterator[None]:
    """The shipped RBAC and admission policies of the scheduler, applied for one test.

    Act as the scheduler with ``control_plane.impersonate``. The policies are
    kept once applied: every later test acting as the scheduler meets them,
    as it would in a cluster, and removing them would race the next apply.
    """
    control_plane.kubectl("apply", "-f", str(NAMESPACE_MANIFEST))
    control_plane.kubectl("apply", "-f", str(SCHEDULER_RBAC))
    control_plane.kubectl("apply", "-f", str(SCHEDULER_POLICY))
    try:
        yield
    finally:
        control_plane.kubectl("delete", "-f", str(SCHEDULER_RBAC), "--ignore-not-found", "--wait=false", check=False)


def create_queue(k8s: client.ApiClient, name: str, resources: dict[str, Any]) -> None:
    """A Queue with ``spec.resources`` as given (e.g. ``{"gpu": {"quota": 8}}``)."""
    client.CustomObjectsApi(k8s).create_cluster_custom_object(
        contract.SCHEDULING_API_GROUP,
        contract.SCHEDULING_API_VERSION,
        contract.QUEUE_PLURAL,
        {
            "apiVersion": f"{contract.SCHEDULING_API_GROUP}/{contract.SCHEDULING_API_VERSION}",
            "kind": contract.QUEUE_KIND,
            "metadata": {"name": name},
            "spec": {"resources": resources},
        },
    )


def delete_queue(k8s: client.ApiClient, name: str) -> None:
    with contextlib.suppress(client.ApiException):
        client.CustomObjectsApi(k8s).delete_cluster_custom_object(
            contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION, contract.QUEUE_PLURAL, name
        )


@pytest.fixture
def queue(k8s: client.ApiClient, scheduler_crds: None) -> Iterator[Callable[..., str]]:
    made: list[str] = []

    def make(gpu_quota: float, **extra: Any) -> str:
        name = unique_name("q")
        create_queue(k8s, name, {"gpu": {"quota": gpu_quota, **extra}})
        made.append(name)
        return name

    yield make
    for name in made:
        delete_queue(k8s, name)


def podgroup(k8s: client.ApiClient, namespace: str, name: str, queue: str, min_member: int) -> None:
    client.CustomObjectsApi(k8s).create_namespaced_custom_object(
        contract.SCHEDULING_API_GROUP,
        contract.SCHEDULING_API_VERSION,
        namespace,
        contract.PODGROUP_PLURAL,
        {
            "apiVersion": f"{contract.SCHEDULING_API_GROUP}/{contract.SCHEDULING_API_VERSION}",
            "kind": contract.PODGROUP_KIND,
            "metadata": {"name": name},
            "spec": {"minMember": min_member, "queue": queue},
        },
    )


def pod(
    k8s: client.ApiClient,
    namespace: str,
    name: str,
    *,
    group: str | None = None,
    queue: str | None = None,
    gpus: int = 1,
    annotations: dict[str, str] | None = None,
    owner: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    env_from: list[client.V1EnvFromSource] | None = None,
    runtime_class: str | None = None,
) -> client.V1Pod:
    notes = dict(annotations or {})
    if group is not None:
        notes[contract.ANNOTATION_POD_GROUP] = group
    labels = {**(labels or {}), **({contract.LABEL_QUEUE: queue} if queue else {})} or None
    limits = {contract.RESOURCE_NVIDIA_GPU: str(gpus)} if gpus else {}
    body = client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=name, annotations=notes or None, labels=labels, owner_references=[owner] if owner else None
        ),
        spec=client.V1PodSpec(
            scheduler_name=contract.SCHEDULER_NAME,
            containers=[
                client.V1Container(
                    name="main",
                    image="registry.invalid/train:1",
                    resources=client.V1ResourceRequirements(
                        requests={"cpu": "1", "memory": "4Gi", **limits}, limits=limits or None
                    ),
                    env_from=env_from,
                )
            ],
            runtime_class_name=runtime_class,
        ),
    )
    return client.CoreV1Api(k8s).create_namespaced_pod(namespace, body)


def slice_env(pod_name: str) -> list[client.V1EnvFromSource]:
    """The envFrom the admission webhook gives a GPU slice pod: its slice ConfigMap, required."""
    ref = slice_env_source(pod_name)["configMapRef"]
    return [client.V1EnvFromSource(config_map_ref=client.V1ConfigMapEnvSource(name=ref["name"], optional=False))]


def node_of(k8s: client.ApiClient, namespace: str, name: str) -> str | None:
    node: str | None = client.CoreV1Api(k8s).read_namespaced_pod(name, namespace).spec.node_name
    return node


def refusing_pdb(k8s: client.ApiClient, namespace: str, name: str, labels: dict[str, str]) -> None:
    """A budget of minAvailable 1 over one healthy pod, with the status the disruption controller would write.

    The test control plane runs no disruption controller; without a status
    the API server refuses every eviction as "still being processed", which
    would prove less than a budget that has counted its pods and says no.
    """
    policy = client.PolicyV1Api(k8s)
    created = policy.create_namespaced_pod_disruption_budget(
        namespace,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}},
        },
    )
    status = {
        "observedGeneration": created.metadata.generation,
        "currentHealthy": 1,
        "desiredHealthy": 1,
        "expectedPods": 1,
        "disruptionsAllowed": 0,
    }
    policy.patch_namespaced_pod_disruption_budget_status(name, namespace, {"status": status})


def foreign_pod(k8s: client.ApiClient, namespace: str, node: str, name: str, gpus: int = 1) -> Any:
    """A pod another scheduler (kube-scheduler, KAI) placed: bound at creation, asking for whole GPUs."""
    return client.CoreV1Api(k8s).create_namespaced_pod(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "schedulerName": "default-scheduler",
                "nodeName": node,
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.invalid/train:1",
                        "resources": {"limits": {contract.RESOURCE_NVIDIA_GPU: str(gpus)}},
                    }
                ],
            },
        },
    )
