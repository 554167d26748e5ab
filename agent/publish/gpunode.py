"""The per-node ``GPUNode`` object: each GPU's and each IB port's inventory and health.

Conditions say *that* a node has a GPU problem; the GPUNode says which GPU,
which port, and what exactly, in a form the scheduler can place against
(per-GPU memory, MIG mode, health) and a person can list across the fleet
(``kubectl get gpunodes``). It also carries each fault's full detail --
condition, reason, action, since, latched -- which is what a restarted agent
reads back to keep latched faults raised.

The object is cluster-scoped, named after the node and owned by the Node
(apiVersion v1, kind Node, uid), so the garbage collector removes it with the
node. It is created once, its owner reference set then; after that only its
status subresource is patched, never its metadata (a recreated Node's stale
GPUNode is collected and created anew),
and only when the content changes: per-poll values such as memory in use
stay in the metrics, so an idle healthy node sends nothing here. Because an
unchanged status is never sent, a GPUNode deleted behind the agent's back
(``kubectl delete``, the CRD deleted and applied again) would stay gone
while the node is steady; the daemon therefore reads it once per heartbeat
(:meth:`GpuNodePublisher.verify`) and it is created again from the report.

The status also carries the agent's answers to remediation's requests
(``status.remediation``, see :mod:`agent.remediation`), set with
:meth:`GpuNodePublisher.set_remediation` and written with the rest, so they
survive the agent's restart. Every state of the object the publisher reads
or is answered with goes to ``on_object``: the spec in it is where those
requests come from.

Where the agent reads the kubelet's PodResources API, each GPU also lists
the pods that hold it (``pods``: namespace, name, uid, container, resource,
schedulerName) and whether the device plugin offers it (``allocatable``),
and ``status.podResources`` says whether the last read succeeded; a failed
read keeps each GPU's holders as last read (see :class:`GpuHolders`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agent.allocations import GpuAllocation, gpu_allocations
from agent.model import Entity, EntityKind, Fault, GpuStatus, HealthReport, IbPortStatus
from agent.publish.conditions import conditions_held_by_errors, format_time, now_utc, parse_time
from agent.publish.pods import PodIdentity, PodKey
from agent.samples import PodResourcesSample
from gpuwarden import contract
from gpuwarden.contract import Action, ConditionType
from gpuwarden.kube import JSON, ApiError, KubeApi
from gpuwarden.logconfig import get_logger

log = get_logger(__name__)

API_VERSION = f"{contract.API_GROUP}/{contract.API_VERSION}"
# Status key: when the agent first saw its Node quarantined, for a taint that
# carries no timeAdded. Kept here because the agent may write nothing else
# that outlives it (it cannot touch the Node's taints).
QUARANTINED_SINCE = "quarantinedSince"
GPUNODE_CRD = f"{contract.GPUNODE_PLURAL}.{contract.API_GROUP}"
CRD_MISSING = (
    f"the GPUNode CRD ({GPUNODE_CRD}) is not installed, so no GPUNode can be written; "
    "install it with `kubectl apply -k manifests/`"
)


def crd_missing(exc: ApiError) -> bool:
    """Whether a 404 means the GPUNode CRD is missing rather than the object.

    The API server answers a path no installed resource serves with a plain
    ``404 page not found`` body, and a missing object with a Status whose
    reason is NotFound (its message names the object).
    """
    return exc.status == 404 and "page not found" in exc.detail


def _crd_missing_error(exc: ApiError) -> ApiError:
    """``exc`` with a message that says what is missing and how to fix it.

    Raised, not logged: the daemon's outage log writes it once per outage.
    """
    return ApiError(exc.operation, exc.status, CRD_MISSING)


# Longest message kept of a failed PodResources read.
MAX_POD_RESOURCES_MESSAGE = 1024
_HOLDER_KEYS = (contract.GPUNODE_GPU_PODS, contract.GPUNODE_GPU_ALLOCATABLE, contract.GPUNODE_GPU_PODS_OMITTED)


@dataclass(frozen=True, slots=True)
class GpuHolders:
    """Who holds each GPU for one report: a PodResources read joined with the node's pods.

    When ``List`` failed (``sample.listed`` False) every GPU keeps the
    holders it was last published with, since "no holders" would tell the
    scheduler the GPU is free. ``pods`` names the UID and scheduler of each
    holder the API server listed.
    """

    sample: PodResourcesSample
    pods: Mapping[PodKey, PodIdentity] = field(default_factory=dict)


def _holder_json(namespace: str, pod: str, container: str, resource: str, who: PodIdentity | None) -> JSON:
    out: JSON = {
        contract.HOLDER_NAMESPACE: namespace,
        contract.HOLDER_NAME: pod,
        contract.HOLDER_CONTAINER: container,
        contract.HOLDER_RESOURCE: resource,
    }
    if who is not None:
        out[contract.HOLDER_UID] = who.uid
        out[contract.HOLDER_SCHEDULER_NAME] = who.scheduler_name
    return out


def _allocation_json(allocation: GpuAllocation | None, pods: Mapping[PodKey, PodIdentity]) -> JSON:
    if allocation is None:
        return {contract.GPUNODE_GPU_PODS: []}
    out: JSON = {
        contract.GPUNODE_GPU_PODS: [
            _holder_json(h.namespace, h.pod, h.container, h.resource, pods.get((h.namespace, h.pod)))
            for h in allocation.holders
        ]
    }
    if allocation.offered is not None:
        out[contract.GPUNODE_GPU_ALLOCATABLE] = allocation.offered
    if allocation.omitted:
        out[contract.GPUNODE_GPU_PODS_OMITTED] = allocation.omitted
    return out


def _with_holders(gpus: list[JSON], holders: GpuHolders, previous: JSON | None) -> list[JSON]:
    """Each GPU entry with its holders: this report's, or as last published when the read failed."""
    before: dict[str, JSON] = {}
    for g in (previous or {}).get("gpus") or []:
        if isinstance(g, dict) and isinstance(g.get("uuid"), str):
            before[g["uuid"]] = {k: g[k] for k in _HOLDER_KEYS if k in g}
    # Over the GPUs listed, also those kept from the previous status while NVML is down.
    allocations = (
        gpu_allocations(holders.sample, [str(g.get("uuid") or "") for g in gpus]) if holders.sample.listed else None
    )
    out: list[JSON] = []
    for gpu in gpus:
        uuid = str(gpu.get("uuid") or "")
        if allocations is None:
            extra = before.get(uuid, {})
        else:
            extra = _allocation_json(allocations.get(uuid), holders.pods)
            kept = before.get(uuid, {}).get(contract.GPUNODE_GPU_ALLOCATABLE)
            if contract.GPUNODE_GPU_ALLOCATABLE not in extra and kept is not None and holders.sample.failure:
                # GetAllocatableResources failed this once: what it said last stands.
                extra[contract.GPUNODE_GPU_ALLOCATABLE] = kept
        out.append({**{k: v for k, v in gpu.items() if k not in _HOLDER_KEYS}, **extra})
    return out


def _pod_resources_json(holders: GpuHolders) -> JSON:
    sample = holders.sample
    if sample.failure is None:
        return {"ok": True}
    return {
        "ok": False,
        "reason": sample.failure.value,
        "message": (sample.error or "")[:MAX_POD_RESOURCES_MESSAGE],
    }


def _mig_mode(enabled: bool | None) -> str:
    if enabled is None:
        return "Unknown"
    return "Enabled" if enabled else "Disabled"


def fault_json(fault: Fault, *, with_entity: bool = False) -> JSON:
    out: JSON = {
        "condition": fault.condition.value,
        "reason": fault.reason,
        "message": fault.message,
        "action": fault.action.value,
        "since": format_time(fault.since),
        "latched": fault.latched,
    }
    if with_entity:
        e = fault.entity
        for key, value in (
            ("gpu", e.gpu_index),
            ("uuid", e.uuid),
            ("pciBusId", e.pci_bus_id),
            ("device", e.ib_device),
            ("port", e.ib_port),
            ("mount", e.mount),
        ):
            if value is not None:
                out[key] = value
    return out


def _gpu_json(gpu: GpuStatus) -> JSON:
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "pciBusId": gpu.pci_bus_id,
        "model": gpu.model,
        "memoryMiB": gpu.memory_total_mib,
        "migMode": _mig_mode(gpu.mig_enabled),
        "healthy": gpu.healthy,
        "faults": [fault_json(f) for f in gpu.faults],
    }


def _port_json(port: IbPortStatus) -> JSON:
    out: JSON = {
        "device": port.device,
        "port": port.port,
        "state": port.state,
        "physState": port.phys_state,
        "linkLayer": port.link_layer,
        "healthy": port.healthy,
        "faults": [fault_json(f) for f in port.faults],
    }
    if port.rate_gbps is not None:
        out["rateGbps"] = port.rate_gbps
    if port.netdev is not None:
        out["netdev"] = port.netdev
    return out


def gpunode_status(report: HealthReport, previous: JSON | None = None, holders: GpuHolders | None = None) -> JSON:
    """The GPUNode status for a report (without ``observedTime``).

    Every key is always present (empty lists included) because it is sent as
    a JSON merge patch, where an absent key would leave a stale value behind.
    When the GPU (or IB) probe failed this poll, the previous lists are kept:
    an empty list would claim the node has no GPUs. ``holders`` (None where
    no PodResources socket is read) adds each GPU's holders and
    ``podResources``.
    """
    held = conditions_held_by_errors(report.errors) if report.errors else frozenset()
    gpus = [_gpu_json(g) for g in sorted(report.gpus, key=lambda g: g.index)]
    if not gpus and ConditionType.GPU_MISSING in held and previous:
        gpus = list(previous.get("gpus") or [])
    ports = [_port_json(p) for p in sorted(report.ib_ports, key=lambda p: (p.device, p.port))]
    if not ports and ConditionType.INFINIBAND_DEGRADED in held and previous:
        ports = list(previous.get("ibPorts") or [])
    listed = {("gpu", g.index) for g in report.gpus} | {("ib", p.device, p.port) for p in report.ib_ports}
    node_faults = [fault_json(f, with_entity=True) for f in report.faults if not _listed(f.entity, listed)]
    if holders is not None:
        gpus = _with_holders(gpus, holders, previous)
    healthy = [g for g in gpus if g.get("healthy")]
    actions = [Action(f["action"]) for g in gpus for f in g.get("faults", [])]
    actions += [Action(f["action"]) for p in ports for f in p.get("faults", [])]
    actions += [Action(f["action"]) for f in node_faults]
    status: JSON = {
        "gpuCount": len(gpus),
        "healthyGpuCount": len(healthy),
        "gpuMemoryMiB": sum(int(g.get("memoryMiB", 0)) for g in gpus),
        "healthyGpuMemoryMiB": sum(int(g.get("memoryMiB", 0)) for g in healthy),
        "action": contract.worst_action(actions).value,
        "probeErrors": sorted(report.errors),
        "gpus": gpus,
        "ibPorts": ports,
        "nodeFaults": node_faults,
    }
    if holders is not None:
        status[contract.GPUNODE_POD_RESOURCES] = _pod_resources_json(holders)
    return status


def _listed(entity: Entity, listed: set[tuple[Any, ...]]) -> bool:
    if entity.kind is EntityKind.GPU:
        return ("gpu", entity.gpu_index) in listed
    if entity.kind is EntityKind.IB_PORT:
        return ("ib", entity.ib_device, entity.ib_port) in listed
    return False


def owner_reference(node_name: str, node_uid: str) -> JSON:
    # No blockOwnerDeletion: setting it needs delete permission on Nodes,
    # which the agent must not have, and nothing waits on this object.
    return {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}


def gpunode_object(node_name: str, node_uid: str | None) -> JSON:
    meta: JSON = {"name": node_name}
    if node_uid:
        meta["ownerReferences"] = [owner_reference(node_name, node_uid)]
    return {
        "apiVersion": API_VERSION,
        "kind": contract.GPUNODE_KIND,
        "metadata": meta,
        "spec": {"nodeName": node_name},
    }


def _fault_from_json(raw: Any, entity: Entity) -> Fault | None:
    if not isinstance(raw, dict):
        return None
    try:
        condition = ConditionType(raw["condition"])
        action = Action(raw.get("action", Action.NONE.value))
    except (KeyError, ValueError):
        return None
    since = parse_time(raw.get("since"))
    if since is None or not raw.get("reason"):
        return None
    return Fault(
        condition=condition,
        reason=str(raw["reason"]),
        message=str(raw.get("message") or ""),
        action=action,
        entity=entity,
        since=since,
        latched=bool(raw.get("latched", False)),
    )


def _entity_from_fault_json(raw: JSON) -> Entity:
    if raw.get("device") is not None and raw.get("port") is not None:
        return Entity.ib(str(raw["device"]), int(raw["port"]))
    if raw.get("gpu") is not None:
        return Entity.gpu(int(raw["gpu"]), raw.get("uuid"), raw.get("pciBusId"))
    if raw.get("mount"):
        return Entity.mount_point(str(raw["mount"]))
    return Entity.node()


def faults_from_gpunode(obj: JSON) -> list[Fault]:
    """Every fault a previous run recorded in the GPUNode's status.

    Entries that do not parse are logged and skipped: one malformed entry
    (an edited object, an older schema) must not cost the others.
    """
    status = obj.get("status") or {}
    out: list[Fault] = []
    skipped = 0
    for gpu in status.get("gpus") or []:
        if not isinstance(gpu, dict) or not isinstance(gpu.get("index"), int):
            skipped += 1
            continue
        entity = Entity.gpu(gpu["index"], gpu.get("uuid"), gpu.get("pciBusId"))
        for raw in gpu.get("faults") or []:
            fault = _fault_from_json(raw, entity)
            if fault is None:
                skipped += 1
            else:
                out.append(fault)
    for port in status.get("ibPorts") or []:
        if not isinstance(port, dict) or not isinstance(port.get("port"), int) or not port.get("device"):
            skipped += 1
            continue
        entity = Entity.ib(str(port["device"]), port["port"])
        for raw in port.get("faults") or []:
            fault = _fault_from_json(raw, entity)
            if fault is None:
                skipped += 1
            else:
                out.append(fault)
    for raw in status.get("nodeFaults") or []:
        if not isinstance(raw, dict):
            skipped += 1
            continue
        try:
            entity = _entity_from_fault_json(raw)
        except (TypeError, ValueError):
            skipped += 1
            continue
        fault = _fault_from_json(raw, entity)
        if fault is None:
            skipped += 1
        else:
            out.append(fault)
    if skipped:
        log.warning("gpunode_faults_malformed", gpunode=(obj.get("metadata") or {}).get("name"), skipped=skipped)
    return out


def quarantined_since_from_gpunode(obj: JSON | None) -> datetime | None:
    """The quarantine start a previous run recorded in the GPUNode, if any."""
    status = (obj or {}).get("status")
    return parse_time(status.get(QUARANTINED_SINCE)) if isinstance(status, dict) else None


def _owner_uids(obj: JSON) -> set[str]:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return {str(r.get("uid")) for r in refs if isinstance(r, dict) and r.get("kind") == "Node"}


class GpuNodePublisher:
    """Creates the node's GPUNode once and keeps its status equal to the report."""

    def __init__(
        self,
        api: KubeApi,
        node_name: str,
        *,
        clock: Callable[[], datetime] = now_utc,
        on_object: Callable[[JSON], None] | None = None,
    ) -> None:
        self._api = api
        self._on_object = on_object
        self._remediation: JSON | None = None
        self._node = node_name
        self._clock = clock
        self._node_uid: str | None = None
        # The object as last read or written; None until known to exist.
        self._object: JSON | None = None
        self._desired: JSON | None = None
        self._published: JSON | None = None
        self._quarantined_since: datetime | None = None
        # The owners last warned about, so a mismatch is logged once, not per poll.
        self._warned_owner: set[str] | None = None

    def set_quarantined_since(self, since: datetime | None) -> None:
        """When the Node's quarantine began (None: not quarantined); written with the next status."""
        self._quarantined_since = since

    def set_remediation(self, status: JSON | None) -> None:
        """The answers to remediation's requests (``status.remediation``); written with the next status."""
        self._remediation = status

    def _seen(self, obj: JSON | None) -> JSON | None:
        if obj is not None and self._on_object is not None:
            self._on_object(obj)
        return obj

    def set_node_uid(self, uid: str | None) -> None:
        """The Node's uid, for the owner reference (a recreated node has a new one)."""
        if uid and uid != self._node_uid:
            self._node_uid = uid

    def restore(self, obj: JSON | None) -> list[Fault]:
        """Adopt an existing GPUNode; returns the faults it records."""
        if obj is None:
            return []
        self._seen(obj)
        self._object = obj
        status = obj.get("status")
        if isinstance(status, dict):
            self._published = {k: v for k, v in status.items() if k != "observedTime"}
            self._desired = self._published
        return faults_from_gpunode(obj)

    def gpu_uuids(self) -> list[str]:
        """The UUIDs of the GPUs the status lists now (kept while NVML cannot be read)."""
        gpus = (self._desired or {}).get("gpus") or []
        return [str(g["uuid"]) for g in gpus if isinstance(g, dict) and g.get("uuid")]

    def invalidate(self) -> None:
        self._object = None
        self._published = None

    def verify(self) -> bool:
        """Read the object back; True if it is gone and will be created again.

        Called once per heartbeat: the status is only sent when it changes,
        so without this read a deleted GPUNode -- and with it the per-GPU
        detail a restarted agent restores latched faults from -- stays gone
        as long as the node is steady. Nothing to check before the object is
        known: the next flush reads or creates it anyway.
        """
        if self._object is None:
            return False
        if self._seen(self._api.get_gpunode(self._node)) is not None:
            return False
        self._lost("the GPUNode was deleted while the agent ran (or its CRD was deleted and applied again)")
        return True

    def _lost(self, why: str) -> None:
        log.warning("gpunode_missing", gpunode=self._node, why=why, action="creating it again from the last report")
        self.invalidate()

    def publish(self, report: HealthReport, holders: GpuHolders | None = None) -> bool:
        self._desired = gpunode_status(report, self._desired, holders)
        return self.flush()

    def flush(self) -> bool:
        """Create the object if needed, then patch a changed status."""
        if self._desired is None:
            return False
        sent = self._ensure_object()
        desired = {k: v for k, v in self._desired.items() if k != QUARANTINED_SINCE}
        if self._quarantined_since is not None:
            desired[QUARANTINED_SINCE] = format_time(self._quarantined_since)
        if self._remediation is not None:
            desired[contract.GPUNODE_REMEDIATION] = self._remediation
        elif self._published and contract.GPUNODE_REMEDIATION in self._published:
            # Nothing set here (yet): what an earlier run answered stays.
            desired[contract.GPUNODE_REMEDIATION] = self._published[contract.GPUNODE_REMEDIATION]
        if desired == self._published:
            return sent
        status: JSON = {**desired, "observedTime": format_time(self._clock())}
        # A merge patch leaves keys it does not name: remove what we dropped.
        status.update({k: None for k in self._published or {} if k not in desired})
        patch = {"status": status}
        try:
            self._object = self._seen(self._api.patch_gpunode_status(self._node, patch))
        except ApiError as exc:
            if exc.status != 404:
                raise
            if crd_missing(exc):
                self.invalidate()
                raise _crd_missing_error(exc) from exc
            # Deleted behind our back (or by the garbage collector after the
            # node was recreated): create it again now, with this status.
            self._lost("patching its status answered 404")
            self._ensure_object()
            fresh: JSON = {**desired, "observedTime": status["observedTime"]}
            self._object = self._seen(self._api.patch_gpunode_status(self._node, {"status": fresh}))
        self._published = desired
        log.info(
            "gpunode_published",
            gpunode=self._node,
            gpus=self._desired["gpuCount"],
            healthy_gpus=self._desired["healthyGpuCount"],
            action=self._desired["action"],
        )
        return True

    def _ensure_object(self) -> bool:
        sent = False
        if self._object is None:
            existing = self._seen(self._api.get_gpunode(self._node))
            sent = True
            if existing is None:
                try:
                    existing = self._api.create_gpunode(gpunode_object(self._node, self._node_uid))
                    log.info("gpunode_created", gpunode=self._node, owner_uid=self._node_uid)
                except ApiError as exc:
                    if crd_missing(exc):
                        raise _crd_missing_error(exc) from exc
                    if exc.status != 409:
                        raise
                    existing = self._api.get_gpunode(self._node)
                    if existing is None:
                        raise
                # A new object has an empty status whatever was published before.
                self._published = None
            else:
                status = existing.get("status")
                self._published = (
                    {k: v for k, v in status.items() if k != "observedTime"} if isinstance(status, dict) else None
                )
            self._object = existing
        owners = _owner_uids(self._object)
        if self._node_uid and self._node_uid not in owners and self._warned_owner != owners:
            # The agent never changes an existing GPUNode's metadata (the
            # admission policy refuses it: a token that could rewrite owner
            # references could have its GPUNode collected, and with it the
            # scheduler's requests). One owned by an earlier Node of this name
            # is collected by the garbage collector, and created again by the
            # next publish; one without an owner (made by hand) stays so.
            self._warned_owner = owners
            log.warning(
                "gpunode_owner_mismatch",
                gpunode=self._node,
                node_uid=self._node_uid,
                owner_uids=sorted(owners),
                action=(
                    "waiting for the garbage collector to remove it; it is created again after"
                    if owners
                    else "delete it so that the agent creates it owned by its Node"
                ),
            )
        return sent
