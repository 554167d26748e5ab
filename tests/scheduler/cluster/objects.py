"""Raw Kubernetes objects for the conversion tests, built the way the cluster builds them.

Node conditions and GPUNode status come from the agent's own publishing
functions, so a test here checks both sides of the contract at once: what
the agent writes is what the scheduler reads. Every object goes through a
JSON round trip, as it would through the API server.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from agent.model import Entity, EntityKind, Fault, GpuStatus, HealthReport
from agent.publish.conditions import desired_conditions
from agent.publish.gpunode import gpunode_object, gpunode_status
from gpuwarden.contract import (
    ANNOTATION_GPU_ASSIGNMENT,
    ANNOTATION_POD_GROUP,
    LABEL_NODE_POOL,
    RESOURCE_NVIDIA_GPU,
    SCHEDULER_NAME,
    Action,
    ConditionType,
    xid_reason,
)

T0 = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)
GPU_MIB = 81559
JSON = dict[str, Any]


def raw(obj: Any) -> Any:
    return json.loads(json.dumps(obj))


def gpu_entity(node: str, index: int) -> Entity:
    return Entity.gpu(index, f"GPU-{node}-{index:04d}", f"00000000:{0x18 + index:02X}:00.0")


def xid_fault(node: str, index: int, xid: int = 79, action: Action = Action.REBOOT) -> Fault:
    entity = gpu_entity(node, index)
    return Fault(
        condition=ConditionType.GPU_XID_ERROR,
        reason=xid_reason(xid),
        message=f"{entity.describe()}: XID {xid} (fatal), the GPU needs attention. Recommended action: {action.value}.",
        action=action,
        entity=entity,
        since=T0,
        latched=True,
    )


def kmsg_xid_fault(bus: str, xid: int = 48, action: Action = Action.RESET_GPU) -> Fault:
    """An XID seen in the kernel log while NVML is down: only the bus id is known."""
    entity = Entity(EntityKind.GPU, pci_bus_id=bus)
    return Fault(ConditionType.GPU_XID_ERROR, xid_reason(xid), f"XID {xid}", action, entity, T0, latched=True)


def report(node: str, *faults: Fault, gpus: int = 8, mig: bool | None = False) -> HealthReport:
    """A report for ``gpus`` GPUs; a GPU with a fault on it is unhealthy."""
    listed: list[GpuStatus] = []
    for i in range(gpus):
        entity = gpu_entity(node, i)
        mine = tuple(f for f in faults if f.entity.gpu_index == i)
        listed.append(
            GpuStatus(
                index=i,
                uuid=entity.uuid or "",
                pci_bus_id=entity.pci_bus_id or "",
                model="NVIDIA H100 80GB HBM3",
                memory_total_mib=GPU_MIB,
                memory_used_mib=0,
                mig_enabled=mig,
                healthy=not mine,
                faults=mine,
            )
        )
    return HealthReport(node=node, time=T0, gpus=tuple(listed), faults=tuple(faults))


def node_json(
    name: str,
    rep: HealthReport | None = None,
    *,
    gpus: int = 8,
    cpu: str = "128",
    memory: str = "1Ti",
    pool: str | None = None,
    ready: str | None = "True",
    unschedulable: bool = False,
    taints: list[JSON] | None = None,
    labels: dict[str, str] | None = None,
) -> JSON:
    """A Node as the kubelet and the agent leave it (the agent's conditions from ``rep``)."""
    conditions: list[JSON] = []
    if ready is not None:
        conditions.append({"type": "Ready", "status": ready, "reason": "KubeletReady", "message": "kubelet is ready"})
    conditions.append({"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"})
    if rep is not None:
        conditions += [state.to_json(T0) for state in desired_conditions(rep, {}, T0).values()]
    all_labels = {"kubernetes.io/hostname": name, **(labels or {})}
    if pool is not None:
        all_labels[LABEL_NODE_POOL] = pool
    spec: JSON = {}
    if unschedulable:
        spec["unschedulable"] = True
    if taints:
        spec["taints"] = taints
    allocatable = {"cpu": cpu, "memory": memory, "pods": "110", RESOURCE_NVIDIA_GPU: str(gpus)}
    return raw(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "uid": f"uid-{name}", "labels": all_labels},
            "spec": spec,
            "status": {"capacity": dict(allocatable), "allocatable": allocatable, "conditions": conditions},
        }
    )


def gpunode_json(rep: HealthReport) -> JSON:
    obj = gpunode_object(rep.node, f"uid-{rep.node}")
    obj["status"] = gpunode_status(rep)
    return raw(obj)


def pod_json(
    name: str,
    *,
    namespace: str = "team-a",
    gpus: int = 0,
    cpu: str = "1",
    memory: str = "4Gi",
    node: str | None = None,
    group: str | None = None,
    scheduler: str = SCHEDULER_NAME,
    assignment: str | None = None,
    created: str = "2026-11-29T09:00:00Z",
    phase: str | None = None,
    deleting: bool = False,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    owners: list[JSON] | None = None,
) -> JSON:
    ann = dict(annotations or {})
    if group is not None:
        ann[ANNOTATION_POD_GROUP] = group
    if assignment is not None:
        ann[ANNOTATION_GPU_ASSIGNMENT] = assignment
    resources: JSON = {"requests": {"cpu": cpu, "memory": memory}}
    if gpus:
        resources["requests"][RESOURCE_NVIDIA_GPU] = str(gpus)
        resources["limits"] = {RESOURCE_NVIDIA_GPU: str(gpus)}
    meta: JSON = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{namespace}-{name}",
        "creationTimestamp": created,
        "labels": labels or {},
        "annotations": ann,
    }
    if owners:
        meta["ownerReferences"] = owners
    if deleting:
        meta["deletionTimestamp"] = "2026-11-29T10:00:00Z"
    spec: JSON = {"schedulerName": scheduler, "containers": [{"name": "main", "image": "x", "resources": resources}]}
    if node is not None:
        spec["nodeName"] = node
    status: JSON = {"phase": phase or ("Running" if node else "Pending")}
    return raw({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status})
