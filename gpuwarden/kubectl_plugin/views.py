"""What the plugin shows, computed from API objects as plain JSON: pure functions, no I/O.

Each view is a dataclass so that the table, the JSON and the YAML outputs
are the same data in three spellings (``dataclasses.asdict``); a field added
here shows in all three. Reading never raises on a malformed or partly
written object: a field that cannot be read shows as unknown (None), since
a status the scheduler has not written yet is a normal state of a fresh
object, and the plugin exists to look at clusters that are not well.

GPUNode status fields (``gpuCount``, ``healthyGpuCount``, ``gpus``,
``ibPorts``, ...) are the GPUNode CRD's schema (``manifests/crd-gpunodes.yaml``);
Queue and PodGroup fields are the names in :mod:`gpuwarden.contract`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpuwarden import contract, dra
from gpuwarden.contract import ConditionType, PodGroupConditionType
from gpuwarden.timefmt import parse_time

JSON = Mapping[str, Any]

# The resources a Queue governs, in the order people read them.
QUEUE_RESOURCES = (contract.QUEUE_RESOURCE_GPU, contract.QUEUE_RESOURCE_CPU, contract.QUEUE_RESOURCE_MEMORY)
# An IB port carries traffic when it is ACTIVE with its physical link up (the sysfs spellings the agent keeps).
IB_ACTIVE = "ACTIVE"
IB_LINK_UP = "LinkUp"
# The Eviction API marks a pod it evicts with this condition (reason EvictionByEvictionAPI).
POD_DISRUPTION_TARGET = "DisruptionTarget"
# The most recent Events ``why`` shows; Kubernetes keeps them an hour anyway.
MAX_EVENTS = 10

_AGENT_CONDITIONS = frozenset(c.value for c in ConditionType)
_QUEUE_STATUS_AMOUNTS = (
    contract.QUEUE_STATUS_GUARANTEED,
    contract.QUEUE_STATUS_FAIR_SHARE,
    contract.QUEUE_STATUS_ALLOCATED,
    contract.QUEUE_STATUS_REQUESTED,
)


def _d(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _l(value: object) -> list[Any]:
    return list(value) if isinstance(value, list) else []


def _s(value: object) -> str:
    return value if isinstance(value, str) else ""


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _amount(value: object) -> str | None:
    """A quantity as written: a number (GPUs, ``4`` or ``0.5``) or a Kubernetes quantity string."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return f"{value:g}"
    return value if isinstance(value, str) and value else None


def _zero(amount: str | None) -> bool:
    """Whether an amount as written ("0", "0Mi", "0m", or none at all) is nothing."""
    if amount is None:
        return True
    digits = amount.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    try:
        return float(digits) == 0
    except ValueError:
        return False


def age(then: datetime | None, now: datetime) -> str:
    """How long ago, in kubectl's short form (``45s``, ``12m``, ``3h``, ``2d``)."""
    if then is None:
        return "-"
    seconds = max(0, int((now - then).total_seconds()))
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size * (2 if unit != "m" else 1):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


# --------------------------------------------------------------------------
# nodes
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ActiveCondition:
    """One of the agent's NodeConditions with status True: a problem present now."""

    type: str
    reason: str
    message: str
    since: str


@dataclass(frozen=True, slots=True)
class DeviceView:
    """One DRA device of the node (NVIDIA's driver): its taints, the driver's and the rules', and who holds it."""

    name: str
    kind: str
    uuid: str
    taints: list[str]
    claims: list[str]


@dataclass(frozen=True, slots=True)
class NodeView:
    """One GPU node as an operator scans the fleet: health, remediation, InfiniBand.

    ``gpus_*`` and ``ib_*`` are None when the node has no GPUNode (no agent
    has reported for it); ``state`` is remediation's one-word label, or
    ``healthy`` when remediation has never touched the node.
    """

    name: str
    pool: str
    gpus_healthy: int | None
    gpus_total: int | None
    ib_up: int | None
    ib_total: int | None
    conditions: list[ActiveCondition]
    state: str
    repair_needed: str | None
    quarantined_gpus: str | None
    cordoned: bool
    action: str | None
    # The node's devices in NVIDIA's DRA driver's ResourceSlices (None: the driver publishes none here).
    dra_devices: list[DeviceView] | None = None


def is_gpu_node(node: JSON, gpunode: JSON | None, dra_devices: bool = False) -> bool:
    """Whether a node belongs in the list: an agent or the DRA driver reported for it, or gpuwarden wrote on it."""
    if gpunode is not None or dra_devices:
        return True
    meta = _d(node.get("metadata"))
    if contract.LABEL_REMEDIATION_STATE in _d(meta.get("labels")):
        return True
    return any(_s(c.get("type")) in _AGENT_CONDITIONS for c in _l(_d(node.get("status")).get("conditions")))


@dataclass(frozen=True, slots=True)
class DraObjects:
    """What the DRA objects say per device, read once for every node of a listing (see :mod:`gpuwarden.dra`)."""

    devices: Mapping[str, list[dra.Device]] = field(default_factory=dict)
    rule_taints: Mapping[tuple[str, str, str], list[dra.Taint]] = field(default_factory=dict)
    holders: Mapping[tuple[str, str, str], list[str]] = field(default_factory=dict)
    # DeviceTaintRules that name no single device (each may taint many).
    broad_rules: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, slices: Sequence[JSON], rules: Sequence[JSON], claims: Sequence[JSON]) -> DraObjects:
        return cls(
            dra.devices_by_node(slices), dra.rule_taints(rules), dra.claim_holders(claims), dra.broad_rules(rules)
        )

    def device_views(self, node: str) -> list[DeviceView] | None:
        devices = self.devices.get(node)
        if devices is None:
            return None
        out = []
        for d in devices:
            key = (d.driver, d.pool, d.name)
            taints = [t.describe() for t in (*d.taints, *self.rule_taints.get(key, ()))]
            out.append(DeviceView(d.name, d.kind, d.uuid, taints, sorted(self.holders.get(key, ()))))
        return out


def node_view(node: JSON, gpunode: JSON | None, objects: DraObjects | None = None) -> NodeView:
    meta = _d(node.get("metadata"))
    labels = _d(meta.get("labels"))
    annotations = _d(meta.get("annotations"))
    conditions = [
        ActiveCondition(
            type=_s(c.get("type")),
            reason=_s(c.get("reason")),
            message=_s(c.get("message")),
            since=_s(c.get("lastTransitionTime")),
        )
        for c in _l(_d(node.get("status")).get("conditions"))
        if isinstance(c, Mapping) and _s(c.get("type")) in _AGENT_CONDITIONS and c.get("status") == "True"
    ]
    status = _d(gpunode.get("status")) if gpunode is not None else {}
    ports = [p for p in _l(status.get("ibPorts")) if isinstance(p, Mapping)]
    has_status = gpunode is not None and bool(status)
    gpus_total = _int(status.get("gpuCount"))
    gpus_healthy = _int(status.get("healthyGpuCount"))
    if gpus_total is None and has_status:
        listed = [g for g in _l(status.get("gpus")) if isinstance(g, Mapping)]
        gpus_total, gpus_healthy = len(listed), sum(1 for g in listed if g.get("healthy") is True)
    up = sum(1 for p in ports if p.get("state") == IB_ACTIVE and p.get("physState") == IB_LINK_UP)
    return NodeView(
        name=_s(meta.get("name")),
        pool=_s(labels.get(contract.LABEL_NODE_POOL)) or contract.DEFAULT_NODE_POOL,
        gpus_healthy=gpus_healthy,
        gpus_total=gpus_total,
        ib_up=up if has_status else None,
        ib_total=len(ports) if has_status else None,
        conditions=sorted(conditions, key=lambda c: c.type),
        state=_s(labels.get(contract.LABEL_REMEDIATION_STATE)) or contract.RemediationState.HEALTHY.value,
        repair_needed=_s(labels.get(contract.LABEL_REPAIR_NEEDED)) or None,
        quarantined_gpus=_s(annotations.get(contract.ANNOTATION_QUARANTINED_GPUS)) or None,
        cordoned=_d(node.get("spec")).get("unschedulable") is True,
        action=_s(status.get("action")) or None,
        dra_devices=objects.device_views(_s(meta.get("name"))) if objects is not None else None,
    )


def node_views(
    nodes: Sequence[JSON], gpunodes: Sequence[JSON], names: Sequence[str] = (), objects: DraObjects | None = None
) -> list[NodeView]:
    """One view per GPU node, by name; only ``names`` when given (all of them, GPU node or not)."""
    by_name = {_s(_d(g.get("metadata")).get("name")): g for g in gpunodes}
    wanted = set(names)
    out = []
    for node in nodes:
        name = _s(_d(node.get("metadata")).get("name"))
        gpunode = by_name.get(name)
        has_devices = objects is not None and name in objects.devices
        if (name in wanted) if wanted else is_gpu_node(node, gpunode, has_devices):
            out.append(node_view(node, gpunode, objects))
    return sorted(out, key=lambda v: v.name)


# --------------------------------------------------------------------------
# queues
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueResource:
    """One resource of a queue: what its spec says and what the scheduler last wrote.

    ``quota`` defaults to 0 and ``limit`` to None (no limit) when the spec
    names the resource without them, as the Queue CRD defines; the status
    amounts are None until a scheduling cycle has written them.
    """

    resource: str
    governed: bool
    quota: str | None
    limit: str | None
    over_quota_weight: str | None
    guaranteed: str | None
    fair_share: str | None
    allocated: str | None
    requested: str | None


@dataclass(frozen=True, slots=True)
class QueueProblem:
    type: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class QueueView:
    name: str
    parent: str | None
    depth: int
    priority: int | None
    node_pool: str | None
    resources: list[QueueResource]
    gpu_seconds_lost_to_faults: float | None
    problems: list[QueueProblem]


def _queue_resources(spec: JSON, status: JSON) -> list[QueueResource]:
    named = _d(spec.get(contract.QUEUE_SPEC_RESOURCES))
    rows = []
    for resource in QUEUE_RESOURCES:
        governed = resource in named
        amounts = {key: _amount(_d(status.get(key)).get(resource)) for key in _QUEUE_STATUS_AMOUNTS}
        # A resource the queue does not govern is shown only while its pods use or ask for some.
        held = any(
            not _zero(amounts[key]) for key in (contract.QUEUE_STATUS_ALLOCATED, contract.QUEUE_STATUS_REQUESTED)
        )
        if not governed and not held and not (resource == contract.QUEUE_RESOURCE_GPU and not named):
            continue
        entry = _d(named.get(resource))
        rows.append(
            QueueResource(
                resource=resource,
                governed=governed,
                quota=(_amount(entry.get(contract.QUEUE_RESOURCE_QUOTA)) or "0") if governed else None,
                limit=_amount(entry.get(contract.QUEUE_RESOURCE_LIMIT)),
                over_quota_weight=_amount(entry.get(contract.QUEUE_RESOURCE_OVER_QUOTA_WEIGHT)),
                guaranteed=amounts[contract.QUEUE_STATUS_GUARANTEED],
                fair_share=amounts[contract.QUEUE_STATUS_FAIR_SHARE],
                allocated=amounts[contract.QUEUE_STATUS_ALLOCATED],
                requested=amounts[contract.QUEUE_STATUS_REQUESTED],
            )
        )
    return rows


def queue_views(queues: Sequence[JSON]) -> list[QueueView]:
    """The queue tree, parents before their children (depth-first, siblings by name).

    A queue whose parent does not exist, or that sits in a loop, is shown
    at the top level: hiding it would hide the queue that most needs
    fixing (its Invalid condition says why).
    """
    by_name = {_s(_d(q.get("metadata")).get("name")): q for q in queues}
    parent_of = {name: _s(_d(q.get("spec")).get(contract.QUEUE_SPEC_PARENT)) or None for name, q in by_name.items()}
    children: dict[str | None, list[str]] = {}
    for name, parent in parent_of.items():
        children.setdefault(parent if parent in by_name else None, []).append(name)
    out: list[QueueView] = []
    seen: set[str] = set()

    def walk(name: str, depth: int) -> None:
        if name in seen:
            return
        seen.add(name)
        obj = by_name[name]
        spec, status = _d(obj.get("spec")), _d(obj.get("status"))
        lost = status.get(contract.QUEUE_STATUS_GPU_SECONDS_LOST)
        out.append(
            QueueView(
                name=name,
                parent=parent_of[name],
                depth=depth,
                priority=_int(spec.get(contract.QUEUE_SPEC_PRIORITY)),
                node_pool=_s(spec.get(contract.QUEUE_SPEC_NODE_POOL)) or None,
                resources=_queue_resources(spec, status),
                gpu_seconds_lost_to_faults=float(lost)
                if isinstance(lost, int | float) and not isinstance(lost, bool)
                else None,
                problems=[
                    QueueProblem(type=_s(c.get("type")), reason=_s(c.get("reason")), message=_s(c.get("message")))
                    for c in _l(status.get(contract.STATUS_CONDITIONS))
                    if isinstance(c, Mapping) and c.get("status") == "True"
                ],
            )
        )
        for child in sorted(children.get(name, [])):
            walk(child, depth + 1)

    for root in sorted(children.get(None, [])):
        walk(root, 0)
    for name in sorted(set(by_name) - seen):  # loops: no member has a root to hang from
        walk(name, 0)
    return out


# --------------------------------------------------------------------------
# why
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConditionView:
    type: str
    status: str
    reason: str
    message: str
    since: str


@dataclass(frozen=True, slots=True)
class ReservationView:
    """Room held for the group on one node until its pods bind there (PodGroup ``status.reservations``)."""

    node: str
    gpus: list[int]
    gpu_memory_mib: list[int]
    expires: str


@dataclass(frozen=True, slots=True)
class EventView:
    last_seen: str
    type: str
    reason: str
    object: str
    message: str
    count: int
    source: str


@dataclass(frozen=True, slots=True)
class PodGroupView:
    name: str
    queue: str
    min_member: int | None
    phase: str
    conditions: list[ConditionView]
    reservations: list[ReservationView]


@dataclass(frozen=True, slots=True)
class ClaimView:
    """One ResourceClaim of the pod: its name in the pod and in the namespace, and what it was given.

    ``devices`` are ``driver/pool/device`` with the taints each carries now;
    empty while the claim is not allocated. ``claim`` is empty when the claim
    of a template was not created yet (the pod's status names none).
    """

    name: str
    claim: str
    allocated: bool
    devices: list[str]


@dataclass(frozen=True, slots=True)
class WhyReport:
    """Everything that explains one pod's state, with a one-line verdict first.

    ``exists`` is False for a pod that is gone (an evicted pod usually is):
    its Events outlive it by up to an hour and are then all there is.
    """

    namespace: str
    pod: str
    exists: bool
    verdict: str
    phase: str
    node: str | None
    scheduler_name: str
    queue: str | None
    pod_conditions: list[ConditionView]
    pod_group: PodGroupView | None
    events: list[EventView] = field(default_factory=list)
    # The pod's ResourceClaims (DRA) and the devices allocated to each.
    claims: list[ClaimView] = field(default_factory=list)


def _condition_views(raw: object, types: frozenset[str] | None = None) -> list[ConditionView]:
    return [
        ConditionView(
            type=_s(c.get("type")),
            status=_s(c.get("status")),
            reason=_s(c.get("reason")),
            message=_s(c.get("message")),
            since=_s(c.get("lastTransitionTime")),
        )
        for c in _l(raw)
        if isinstance(c, Mapping) and (types is None or _s(c.get("type")) in types)
    ]


def pod_queue(pod: JSON) -> str | None:
    """The queue the pod names: gpuwarden's label, else KAI's."""
    labels = _d(_d(pod.get("metadata")).get("labels"))
    return _s(labels.get(contract.LABEL_QUEUE)) or _s(labels.get(contract.LABEL_KAI_QUEUE)) or None


def owner_uids(obj: JSON) -> list[str]:
    return [_s(r.get("uid")) for r in _l(_d(obj.get("metadata")).get("ownerReferences")) if isinstance(r, Mapping)]


def controller_owner(obj: JSON) -> Mapping[str, Any] | None:
    """The owner reference marked controller, else the first one."""
    refs = [r for r in _l(_d(obj.get("metadata")).get("ownerReferences")) if isinstance(r, Mapping)]
    return next((r for r in refs if r.get("controller") is True), refs[0] if refs else None)


def group_owned_by(podgroups: Sequence[JSON], uids: Sequence[str]) -> JSON | None:
    """The PodGroup one of ``uids`` owns: the scheduler creates a derived group owned by its workload."""
    wanted = [u for u in uids if u]
    for uid in wanted:
        for group in podgroups:
            if uid in owner_uids(group):
                return group
    return None


def _event_time(event: JSON) -> datetime | None:
    for key in ("lastTimestamp", "eventTime", "firstTimestamp"):
        found = parse_time(event.get(key))
        if found is not None:
            return found
    return parse_time(_d(event.get("metadata")).get("creationTimestamp"))


def event_views(events: Sequence[JSON], now: datetime) -> list[EventView]:
    """The most recent Events, oldest first (as ``kubectl describe`` lists them)."""
    dated = sorted(events, key=lambda e: _event_time(e) or datetime.min.replace(tzinfo=UTC))[-MAX_EVENTS:]
    out = []
    for e in dated:
        involved = _d(e.get("involvedObject"))
        source = _d(e.get("source"))
        count = _int(e.get("count"))
        out.append(
            EventView(
                last_seen=age(_event_time(e), now),
                type=_s(e.get("type")),
                reason=_s(e.get("reason")),
                object=f"{_s(involved.get('kind')).lower()}/{_s(involved.get('name'))}",
                message=_s(e.get("message")) or _s(e.get("note")),
                count=count if count is not None else 1,
                source=_s(source.get("component")) or _s(e.get("reportingComponent")),
            )
        )
    return out


def podgroup_view(group: JSON) -> PodGroupView:
    spec, status = _d(group.get("spec")), _d(group.get("status"))
    reservations = [
        ReservationView(
            node=_s(r.get("node")),
            gpus=[g for g in _l(r.get("gpus")) if isinstance(g, int)],
            gpu_memory_mib=[m for m in _l(r.get("gpuMemoryMiB")) if isinstance(m, int)],
            expires=_s(r.get("expires")),
        )
        for r in _l(status.get(contract.PODGROUP_STATUS_RESERVATIONS))
        if isinstance(r, Mapping)
    ]
    return PodGroupView(
        name=_s(_d(group.get("metadata")).get("name")),
        queue=_s(spec.get(contract.PODGROUP_SPEC_QUEUE)),
        min_member=_int(spec.get(contract.PODGROUP_SPEC_MIN_MEMBER)),
        phase=_s(status.get(contract.PODGROUP_STATUS_PHASE)) or "Unknown",
        conditions=_condition_views(status.get(contract.STATUS_CONDITIONS)),
        reservations=reservations,
    )


def _active(group: PodGroupView | None, kind: PodGroupConditionType) -> ConditionView | None:
    if group is None:
        return None
    return next((c for c in group.conditions if c.type == kind.value and c.status == "True"), None)


def verdict(pod: JSON | None, group: PodGroupView | None, events: Sequence[EventView]) -> str:
    """One sentence: what is happening to the pod and the reason the scheduler gave, most telling first."""
    if pod is None:
        if events:
            return "the pod no longer exists; its recent Events follow"
        return "the pod does not exist"
    meta, spec, status = _d(pod.get("metadata")), _d(pod.get("spec")), _d(pod.get("status"))
    node = _s(spec.get("nodeName"))
    phase = _s(status.get("phase")) or "Unknown"
    disruption = next(iter(_condition_views(status.get("conditions"), frozenset({POD_DISRUPTION_TARGET}))), None)
    blocked = _active(group, PodGroupConditionType.EVICTION_BLOCKED)
    if meta.get("deletionTimestamp"):
        why = f": {disruption.reason}: {disruption.message}" if disruption is not None else ""
        return f"being evicted or deleted from node {node or '(none)'}{why}"
    if phase in ("Succeeded", "Failed"):
        return f"finished ({phase}) on node {node or '(none)'}"
    scheduler = _s(spec.get("schedulerName")) or "default-scheduler"
    if not node and scheduler != contract.SCHEDULER_NAME:
        return f"pending; gpuwarden does not place it: its schedulerName is {scheduler}, not {contract.SCHEDULER_NAME}"
    if node:
        placed = f"placed on node {node} ({phase})"
        if blocked is not None:
            return f"{placed}; an eviction the scheduler decided for its group is refused: {blocked.message}"
        return placed
    if group is None:
        return "pending; no PodGroup yet: the scheduler has not grouped it (is it running, and leader?)"
    unschedulable = _active(group, PodGroupConditionType.UNSCHEDULABLE)
    if group.reservations:
        room = ", ".join(r.node for r in group.reservations)
        return f"pending; room is reserved for it on {room} and it binds once the pods evicted for it are gone"
    if blocked is not None:
        return f"pending; the evictions that would make room are refused: {blocked.message}"
    if unschedulable is not None:
        return f"pending: {unschedulable.reason}: {unschedulable.message}"
    return f"pending; PodGroup {group.name} is {group.phase} and gives no reason yet (the next cycle writes one)"


def pod_claim_names(pod: JSON) -> list[tuple[str, str]]:
    """(name in the pod, ResourceClaim name) of each of the pod's claims; the second empty when not made yet.

    The claim of the pod's ``nvidia.com/gpu`` served through DRA is named ``(extended resources)``.
    """
    made = {
        _s(entry.get("name")): _s(entry.get("resourceClaimName"))
        for entry in map(_d, _l(_d(pod.get("status")).get("resourceClaimStatuses")))
    }
    out = []
    for entry in map(_d, _l(_d(pod.get("spec")).get("resourceClaims"))):
        name = _s(entry.get("name"))
        out.append((name, _s(entry.get("resourceClaimName")) or made.get(name, "")))
    # The claim the scheduler made for the pod's extended resources (nvidia.com/gpu through DRA, KEP-5004).
    extended = _s(_d(_d(pod.get("status")).get("extendedResourceClaimStatus")).get("resourceClaimName"))
    if extended:
        out.append(("(extended resources)", extended))
    return out


def claim_views(pod: JSON, claims: Mapping[str, JSON], objects: DraObjects) -> list[ClaimView]:
    """The pod's claims as ``why`` shows them: each one's devices and the taints on them now."""
    rule_taints = objects.rule_taints
    driver_taints = {(d.driver, d.pool, d.name): d.taints for devices in objects.devices.values() for d in devices}
    out = []
    for name, claim_name in pod_claim_names(pod):
        claim = claims.get(claim_name)
        allocation = _d(_d(claim.get("status")).get("allocation")) if claim is not None else {}
        devices = []
        for result in map(_d, _l(_d(allocation.get("devices")).get("results"))):
            key = (_s(result.get("driver")), _s(result.get("pool")), _s(result.get("device")))
            taints = [t.describe() for t in (*driver_taints.get(key, ()), *rule_taints.get(key, ()))]
            devices.append("/".join(key) + (f" [{'; '.join(taints)}]" if taints else ""))
        out.append(ClaimView(name, claim_name, bool(allocation), devices))
    return out


def why_report(
    namespace: str,
    name: str,
    *,
    pod: JSON | None,
    group: JSON | None,
    events: Sequence[JSON],
    now: datetime,
    claims: Sequence[ClaimView] = (),
) -> WhyReport:
    group_view = podgroup_view(group) if group is not None else None
    shown = event_views(events, now)
    spec, status = (_d(pod.get("spec")), _d(pod.get("status"))) if pod is not None else ({}, {})
    return WhyReport(
        namespace=namespace,
        pod=name,
        exists=pod is not None,
        verdict=verdict(pod, group_view, shown),
        phase=_s(status.get("phase")) or ("Unknown" if pod is not None else "Gone"),
        node=_s(spec.get("nodeName")) or None,
        scheduler_name=_s(spec.get("schedulerName")),
        queue=(pod_queue(pod) if pod is not None else None) or (group_view.queue if group_view else None),
        pod_conditions=_condition_views(status.get("conditions"), frozenset({POD_DISRUPTION_TARGET, "PodScheduled"})),
        pod_group=group_view,
        events=shown,
        claims=list(claims),
    )
