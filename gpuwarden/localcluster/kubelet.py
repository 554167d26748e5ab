"""The kubelet's side of the API, written by hand because the local cluster has no kubelets.

A real node's status, the not-ready taint lifted, a pod reported running or
finished, a graceful deletion completed: these are what a kubelet (and
NVIDIA's device plugin) would write, so code under test, and the demo's
scheduler and controllers, see nodes and pods that look like a cluster's.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import secrets

from kubernetes import client

from gpuwarden import contract

# Kubernetes' own names, used the way a kubelet and the API server use them.
LABEL_HOSTNAME = "kubernetes.io/hostname"
LABEL_OS = "kubernetes.io/os"
LABEL_ARCH = "kubernetes.io/arch"
TAINT_NOT_READY = "node.kubernetes.io/not-ready"


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def kubelet_conditions() -> list[dict[str, str]]:
    """The conditions a healthy kubelet reports, with its reasons and messages."""
    now = _now()
    rows = [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ]
    return [
        {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        for kind, status, reason, message in rows
    ]


def create_gpu_node(
    api: client.ApiClient,
    name: str,
    *,
    gpus: int = 8,
    gpu_memory_mib: int | None = None,
    labels: dict[str, str] | None = None,
) -> client.V1Node:
    """Create a Ready GPU Node the way a kubelet and NVIDIA's device plugin would.

    ``gpu_memory_mib`` is the node's total ``gpuwarden.io/gpu-memory``
    (capacity and allocatable), written only when given, as the agent would.
    The API server's admission taints every new node ``not-ready``; a kubelet
    reporting Ready makes the node-lifecycle controller lift it, and that
    controller does not run here, so the helper lifts it.
    """
    core = client.CoreV1Api(api)
    all_labels = {LABEL_HOSTNAME: name, LABEL_OS: "linux", LABEL_ARCH: "amd64", **(labels or {})}
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name, labels=all_labels)))

    resources = {
        "cpu": "64",
        "memory": "512Gi",
        "pods": "110",
        "ephemeral-storage": "1Ti",
        contract.RESOURCE_NVIDIA_GPU: str(gpus),
    }
    if gpu_memory_mib is not None:
        resources[contract.RESOURCE_GPU_MEMORY] = str(gpu_memory_mib)
    status = {
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": kubelet_conditions(),
            "addresses": [
                {"type": "InternalIP", "address": "10.0.0.1"},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "osImage": "gpuwarden test node",
                "kernelVersion": "6.1.0",
                "kubeletVersion": "v1.37.2",
                "kubeProxyVersion": "",
                "containerRuntimeVersion": "containerd://2.0.0",
                "machineID": secrets.token_hex(16),
                "systemUUID": secrets.token_hex(16),
                "bootID": secrets.token_hex(16),
            },
        }
    }
    core.patch_node_status(name, status)

    node = core.read_node(name)
    current = node.spec.taints if node.spec is not None and node.spec.taints else []
    taints = [
        {k: v for k, v in api.sanitize_for_serialization(t).items() if v is not None}  # type: ignore[no-untyped-call]
        for t in current
        if t.key != TAINT_NOT_READY
    ]
    if len(taints) != len(current):
        core.patch_node(name, {"spec": {"taints": taints or None}})
    return core.read_node(name)


def mark_pod_running(api: client.ApiClient, name: str, namespace: str, *, ready: bool = True) -> client.V1Pod:
    """Write a pod's status as the kubelet does once its containers run."""
    core = client.CoreV1Api(api)
    pod = core.read_namespaced_pod(name, namespace)
    now = _now()
    ready_s = "True" if ready else "False"
    conditions = [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
        {"type": "Initialized", "status": "True", "lastTransitionTime": now},
        {"type": "ContainersReady", "status": ready_s, "lastTransitionTime": now},
        {"type": "Ready", "status": ready_s, "lastTransitionTime": now},
    ]
    containers = [
        {
            "name": c.name,
            "image": c.image,
            "imageID": "",
            "ready": ready,
            "restartCount": 0,
            "started": True,
            "state": {"running": {"startedAt": now}},
        }
        for c in (pod.spec.containers if pod.spec is not None else [])
    ]
    body = {
        "status": {
            "phase": "Running",
            "conditions": conditions,
            "containerStatuses": containers,
            "startTime": now,
            "podIP": "10.1.0.1",
            "hostIP": "10.0.0.1",
        }
    }
    return core.patch_namespaced_pod_status(name, namespace, body)


def mark_pod_finished(api: client.ApiClient, name: str, namespace: str, *, succeeded: bool = True) -> client.V1Pod:
    """Write a pod's status as the kubelet does once its containers exited (code 0, or 1).

    A Job's controller counts the pod as a completion (or a failure) from
    this status, as it would from a real kubelet's.
    """
    core = client.CoreV1Api(api)
    pod = core.read_namespaced_pod(name, namespace)
    now = _now()
    code = 0 if succeeded else 1
    reason = "Completed" if succeeded else "Error"
    started = pod.status.start_time if pod.status is not None and pod.status.start_time is not None else None
    started_at = started.strftime("%Y-%m-%dT%H:%M:%SZ") if started is not None else now
    containers = [
        {
            "name": c.name,
            "image": c.image,
            "imageID": "",
            "ready": False,
            "restartCount": 0,
            "started": False,
            "state": {"terminated": {"exitCode": code, "reason": reason, "startedAt": started_at, "finishedAt": now}},
        }
        for c in (pod.spec.containers if pod.spec is not None else [])
    ]
    conditions = [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
        {"type": "Initialized", "status": "True", "lastTransitionTime": now},
        {"type": "ContainersReady", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now},
        {"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now},
    ]
    body = {
        "status": {
            "phase": "Succeeded" if succeeded else "Failed",
            "conditions": conditions,
            "containerStatuses": containers,
        }
    }
    return core.patch_namespaced_pod_status(name, namespace, body)


def complete_pod_deletion(api: client.ApiClient, name: str, namespace: str) -> None:
    """Finish a graceful pod deletion as the kubelet does after stopping the containers.

    A pod bound to a node only gets a deletionTimestamp when deleted or
    evicted; the kubelet removes it for good with grace period 0. Fake nodes
    have no kubelet, so tests that need the pod gone call this.
    """
    core = client.CoreV1Api(api)
    with contextlib.suppress(client.ApiException):
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
