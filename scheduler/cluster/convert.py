"""Watched Kubernetes objects (raw JSON dicts) to the engine's Snapshot.

The watch cache holds objects exactly as the API server returns them
(``json.loads`` of the body, or a watch event's ``object``); this module
turns them into :mod:`scheduler.engine.model` data, and nothing here talks
to the API server. Three rules hold throughout:

- **Bad input never raises.** A field of the wrong type or an unparsable
  value is logged once per object and field (:class:`WarnOnce`) and read
  conservatively: an unreadable GPU health is unhealthy, an unreadable
  node capacity is none, an agent condition with an odd status is a problem.
- **Rounding favours safety.** What a pod asks is rounded up, what a node
  offers is rounded down.
- **Free text is parsed once, here.** The agent's condition messages name
  GPUs and a recommended action (``agent/publish/conditions.py``); they are
  read into :class:`NodeCondition` fields so the engine never reads prose.

Pods of other schedulers hold capacity that gpuwarden must neither hand out
nor divide. They are given to the engine as one synthetic job per node, in a
reserved per-pool queue (:func:`external_queue_name`) that deserves exactly
what they hold, ranks above every real queue and takes nothing beyond, with
every such pod in status ``RELEASING``. Why this shape, given how the engine
treats running work:

- A running task is seated on its node, so its CPU, memory and GPUs are not
  offered again, whatever its queue.
- A job whose queue does not exist is seated but charged to nobody, while
  its node's GPUs still count in the capacity fair share divides: real
  queues would be promised GPUs that are not there, and reclaim would
  evict for them in vain. A queue with an unlimited quota deserves what it
  requests, and the highest priority is covered first, so the reserved
  queue takes exactly the held amount off the top and the real queues share
  the rest honestly.
- ``RELEASING`` tasks are never evicted (not by health eviction, reclaim,
  preemption, consolidation or stale gangs): another scheduler's pods are
  not ours to move. The job is non-preemptible as well.

The reserved queues appear in ``Decisions.queue_shares``; the status writer
skips them (:func:`is_external_queue`): there is no Queue object behind
them. Their names contain ``:``, which no Kubernetes object name may, so
they can never collide with a user's queue; likewise the synthetic jobs.
Pods of other schedulers on nodes that take no work (cordoned, not Ready,
or with a node-wide fatal fault) are left out of the jobs: those nodes add
nothing to the capacity being divided, so their pods must not be charged
against it. They are the snapshot's ``bystanders`` instead, which pod
affinity and topology spread count by their labels.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from functools import lru_cache
from typing import Any

from gpuwarden.contract import (
    ANNOTATION_DRAINING,
    ANNOTATION_GPU_ASSIGNMENT,
    ANNOTATION_POD_GROUP,
    ANNOTATION_QUARANTINED_GPUS,
    DEFAULT_NODE_POOL,
    GPUNODE_GPU_ALLOCATABLE,
    GPUNODE_GPU_PODS,
    GPUNODE_POD_RESOURCES,
    HOLDER_NAME,
    HOLDER_NAMESPACE,
    HOLDER_UID,
    LABEL_NODE_POOL,
    RESOURCE_NVIDIA_GPU,
    SCHEDULER_NAME,
    Action,
    ConditionType,
)
from gpuwarden.logconfig import get_logger
from gpuwarden.timefmt import parse_epoch
from scheduler.cluster.assignment import decode_assignment
from scheduler.cluster.logonce import WarnOnce
from scheduler.cluster.placement import UnreadableError, node_other, other_requests, read_placement
from scheduler.cluster.quantity import (
    QuantityError,
    count_ceil,
    count_floor,
    cpu_milli_ceil,
    cpu_milli_floor,
    mib_ceil,
    mib_floor,
)
from scheduler.cluster.sliceadmission import SliceAdmission, has_sharing_annotation
from scheduler.engine.health import is_fatal, judge
from scheduler.engine.holders import holder_key, kubelet_gpus, reported_gpus
from scheduler.engine.model import (
    NON_PREEMPTIBLE_PRIORITY,
    UNLIMITED,
    Gpu,
    Job,
    Node,
    NodeCondition,
    Queue,
    QueueResource,
    SchedulerConfig,
    Snapshot,
    Taint,
    TaintEffect,
    Task,
    TaskStatus,
    Toleration,
)
from scheduler.engine.resources import parse_gpu_request

log = get_logger(__name__)
warn = WarnOnce(__name__)

# The memory of a GPU known only from the device plugin's count (no GPUNode
# yet): an 80 GiB device, the common data-centre size. NVIDIA's GPU feature
# discovery label, when present, says better.
DEFAULT_GPU_MEMORY_MIB = 81920
LABEL_GFD_GPU_MEMORY = "nvidia.com/gpu.memory"

# Reserved names for the capacity other schedulers' pods hold (see the
# module docstring). ':' cannot appear in a Kubernetes object name.
EXTERNAL_QUEUE_PREFIX = "external:"
EXTERNAL_JOB_PREFIX = "external:"
# Above any priority a Queue object can carry (an int32).
EXTERNAL_QUEUE_PRIORITY = 2**31

_AGENT_CONDITIONS = frozenset(t.value for t in ConditionType)
_ACTIONS = {a.value: a for a in Action}
_EFFECTS = {e.value: e for e in TaintEffect}
_MIG_MODES = {"Enabled": True, "Disabled": False, "Unknown": False}

_ACTION_TAIL = re.compile(r"Recommended action:\s*([A-Za-z_]+)\s*\.?\s*$")
# Fault texts in a condition message are joined by "; " and start with the
# entity's description (agent.model.Entity.describe).
_GPU_BY_INDEX = re.compile(r"(?:^|; )GPU (\d+)\b")
_GPU_BY_BUS = re.compile(r"(?:^|; )GPU at ([0-9A-Fa-f:.]+)")
_GPU_BY_UUID = re.compile(r"(?:^|; )GPU ((?:GPU|MIG)-[0-9A-Za-z-]+)")
_GPU_UNIDENTIFIED = "a GPU that could not be identified"
_MORE = re.compile(r"; and \d+ more\b")


def external_queue_name(pool: str) -> str:
    """The reserved queue holding other schedulers' pods in ``pool``."""
    return f"{EXTERNAL_QUEUE_PREFIX}{pool}"


def is_external_queue(name: str) -> bool:
    """True for a reserved queue (no Queue object: its status is not written)."""
    return name.startswith(EXTERNAL_QUEUE_PREFIX)


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """What the snapshot needs of one pod group, read off its PodGroup.

    ``priority`` is the value of the group's priority class (the caller
    resolves the name); ``below_min_member_since`` is when the caller first
    saw the running gang short (None while whole), kept across cycles.
    """

    queue: str
    min_member: int = 1
    priority: int = 0
    preemptible: bool | None = None
    uid: str = ""
    below_min_member_since: float | None = None


# --------------------------------------------------------------------------
# Small readers: a field of the wrong type is logged and replaced
# --------------------------------------------------------------------------


def _dict(value: object, what: str, ident: str) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if value is not None:
        warn.warning("object field malformed", (ident, what), object=ident, field=what, value=repr(value)[:200])
    return {}


def _list(value: object, what: str, ident: str) -> list[Any]:
    if isinstance(value, list):
        return value
    if value is not None:
        warn.warning("object field malformed", (ident, what), object=ident, field=what, value=repr(value)[:200])
    return []


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _str_map(value: object, what: str, ident: str) -> dict[str, str]:
    """A string-to-string map (labels, annotations); other entries are dropped."""
    if not value:
        return {}
    if not isinstance(value, dict):
        warn.warning("object field malformed", (ident, what), object=ident, field=what, value=repr(value)[:200])
        return {}
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            warn.warning("object field malformed", (ident, what), object=ident, field=what, key=repr(k)[:100])
            return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}
    return value


def _amount(
    resources: Mapping[str, Any], key: str, convert: Callable[[str | int | float], int], ident: str, default: int = 0
) -> int:
    raw = resources.get(key)
    if raw is None:
        return default
    try:
        if isinstance(raw, (str, int, float)) and not isinstance(raw, bool):
            value = convert(raw)
            if value >= 0:
                return value
    except (QuantityError, ValueError, OverflowError):
        pass
    warn.warning("quantity malformed", (ident, key), object=ident, resource=key, value=repr(raw)[:100])
    return default


# --------------------------------------------------------------------------
# Nodes
# --------------------------------------------------------------------------


@dataclass(slots=True)
class _GpuInventory:
    gpus: tuple[Gpu, ...]
    by_uuid: dict[str, int]
    by_bus: dict[str, int]
    # GPU indices whose GPUNode faults name each condition type.
    faulted: dict[str, set[int]]
    # Per pod (UID, or namespace/name), the GPUs the kubelet reports it holding; None: not published.
    holders: dict[str, tuple[int, ...]] | None = None


def _bus_key(bus: str) -> str:
    """PCI bus ids compared without case and without a leading domain's extra zeros."""
    bus = bus.lower()
    domain, sep, rest = bus.partition(":")
    if sep and len(domain) == 8:
        bus = domain[4:] + ":" + rest
    return bus


def _gpus_from_gpunode(gpunode: Mapping[str, Any], ident: str) -> _GpuInventory | None:
    status = _dict(gpunode.get("status"), "status", ident)
    raw = status.get("gpus")
    if raw is None:
        return None  # not published yet: fall back to the device plugin's count
    entries = _list(raw, "status.gpus", ident)
    gpus: list[Gpu] = []
    seen: set[int] = set()
    by_uuid: dict[str, int] = {}
    by_bus: dict[str, int] = {}
    faulted: dict[str, set[int]] = {}
    holders: dict[str, list[int]] | None = None
    read = status.get(GPUNODE_POD_RESOURCES)
    # The holders are as last read while the agent's reads fail: a pod listed
    # then may have gone and another taken its name since.
    stale = isinstance(read, dict) and read.get("ok") is not True
    for entry in entries:
        if not isinstance(entry, dict):
            warn.warning("gpunode gpu malformed", (ident, "entry"), gpunode=ident, value=repr(entry)[:200])
            continue
        index = entry.get("index")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            warn.warning("gpunode gpu without index", (ident, repr(index)), gpunode=ident, index=repr(index)[:50])
            continue
        if index in seen:
            warn.warning("gpunode gpu listed twice", (ident, index), gpunode=ident, gpu=index)
            continue
        seen.add(index)
        healthy = entry.get("healthy")
        if not isinstance(healthy, bool):
            warn.warning(
                "gpunode gpu health unreadable; unhealthy", (ident, index, "healthy"), gpunode=ident, gpu=index
            )
            healthy = False
        memory = entry.get("memoryMiB")
        if not isinstance(memory, int) or isinstance(memory, bool) or memory <= 0:
            warn.warning("gpunode gpu memory unreadable; unhealthy", (ident, index, "memory"), gpunode=ident, gpu=index)
            memory = DEFAULT_GPU_MEMORY_MIB
            healthy = False
        mode = entry.get("migMode", "Unknown")
        mig = _MIG_MODES.get(mode) if isinstance(mode, str) else None
        if mig is None:
            # An unknown mode may be MIG: such a GPU is not ours to place.
            warn.warning("gpunode gpu MIG mode unreadable", (ident, index, "mig"), gpunode=ident, gpu=index)
            mig = True
        uuid = _str(entry.get("uuid"))
        if uuid:
            by_uuid[uuid] = index
        bus = _str(entry.get("pciBusId"))
        if bus:
            by_bus[_bus_key(bus)] = index
        faults = entry.get("faults")
        since: float | None = None
        if faults:
            for fault in _list(faults, f"status.gpus[{index}].faults", ident):
                if isinstance(fault, dict) and isinstance(fault.get("condition"), str):
                    faulted.setdefault(fault["condition"], set()).add(index)
                    # Dated by the faults that take it out of service only: one
                    # that leaves it in (a degraded link) says nothing of when
                    # the device manager should have stopped choosing it.
                    if not _fatal_fault(fault):
                        continue
                    at = parse_epoch(fault.get("since"))
                    if at is not None and (since is None or at < since):
                        since = at
        if GPUNODE_GPU_PODS in entry:
            holders = {} if holders is None else holders
            _read_holders(entry[GPUNODE_GPU_PODS], index, holders, ident, stale)
        offered = entry.get(GPUNODE_GPU_ALLOCATABLE)
        gpus.append(
            Gpu(
                index=index,
                uuid=uuid,
                memory_mib=memory,
                healthy=healthy,
                mig_enabled=mig,
                offered=offered if isinstance(offered, bool) else None,
                faulted_since=since,
            )
        )
    gpus.sort(key=_gpu_index)
    held = None if holders is None else {k: tuple(sorted(v)) for k, v in holders.items()}
    return _GpuInventory(tuple(gpus), by_uuid, by_bus, faulted, held)


def _fatal_fault(fault: Mapping[str, Any]) -> bool:
    """Whether a GPUNode fault takes its GPU out of service, by the engine's rule (an unknown action: by its type)."""
    raw = fault.get("action")
    try:
        action = Action(raw) if isinstance(raw, str) else Action.NONE
    except ValueError:
        action = Action.NONE
    return is_fatal(str(fault["condition"]), _str(fault.get("reason")), action)


def _read_holders(raw: object, index: int, out: dict[str, list[int]], ident: str, stale: bool = False) -> None:
    """Add one GPU's holders (the kubelet's word, published by the agent) to ``out``, keyed as :mod:`.holders` reads.

    A holder is keyed by its UID, or by ``namespace/name`` when the agent
    could not read the UID. The holders with a UID stand even while the
    agent's last PodResources read failed (``stale``: ``status.podResources.ok``
    false): they are as last read, and a container keeps its devices for its
    life, so a pod still listed still holds them; a pod started since is
    simply not listed. A holder without a UID is dropped then: the pod read
    under that name may have been deleted and recreated (a StatefulSet's
    pod keeps its name) since, and the new pod must not inherit its GPUs.
    """
    for holder in _list(raw, f"status.gpus[{index}].pods", ident):
        if not isinstance(holder, dict):
            continue
        uid = _str(holder.get(HOLDER_UID))
        if not uid and stale:
            continue
        key = uid or holder_key(_str(holder.get(HOLDER_NAMESPACE)), _str(holder.get(HOLDER_NAME)))
        if key == "/":
            continue
        found = out.setdefault(key, [])
        if index not in found:
            found.append(index)


def _gpu_index(gpu: Gpu) -> int:
    return gpu.index


@lru_cache(maxsize=256)
def _plugin_gpus(count: int, memory: int) -> tuple[Gpu, ...]:
    return tuple(Gpu(index=i, memory_mib=memory) for i in range(count))


def _gpus_from_allocatable(
    allocatable: Mapping[str, Any], labels: Mapping[str, str], ident: str, default_memory: int
) -> _GpuInventory:
    count = _amount(allocatable, RESOURCE_NVIDIA_GPU, count_floor, ident)
    memory = default_memory
    label = labels.get(LABEL_GFD_GPU_MEMORY)
    if label is not None:
        if label.isdigit() and int(label) > 0:
            memory = int(label)
        else:
            warn.warning("gpu memory label malformed", (ident, "gfd"), node=ident, value=label[:50])
    return _GpuInventory(_plugin_gpus(min(count, 1024), memory), {}, {}, {})


def _taints(raw: object, ident: str) -> tuple[Taint, ...]:
    out: list[Taint] = []
    for entry in _list(raw, "spec.taints", ident):
        if not isinstance(entry, dict):
            warn.warning("taint malformed", (ident, "taint"), node=ident, value=repr(entry)[:200])
            continue
        raw_effect = entry.get("effect")
        effect = _EFFECTS.get(raw_effect) if isinstance(raw_effect, str) else None
        if effect is None:
            warn.warning("taint effect unknown; NoSchedule", (ident, "effect"), node=ident, taint=repr(entry)[:200])
            effect = TaintEffect.NO_SCHEDULE
        out.append(Taint(key=_str(entry.get("key")), value=_str(entry.get("value")), effect=effect))
    return tuple(out)


def _action_of(message: str, ident: str, ctype: str) -> Action:
    match = _ACTION_TAIL.search(message)
    if match is not None:
        action = _ACTIONS.get(match.group(1).upper())
        if action is not None:
            return action
    warn.warning("condition names no known action", (ident, ctype, message), node=ident, condition=ctype)
    return Action.NONE


def _named_gpus(message: str, inventory: _GpuInventory, ctype: str) -> tuple[int, ...]:
    """The GPUs a problem condition is about; () when it must be read as node-wide.

    The message lists faults by GPU index, bus id or UUID; the GPUNode's
    per-GPU faults for the same condition are added (they may be newer,
    and the message lists only the first few). When the message names a GPU
    that cannot be identified, or says "and N more" and the GPUNode adds
    nothing the message did not list, the GPUs at fault are not all known,
    and only the whole node is a safe answer.
    """
    named: set[int] = {int(m) for m in _GPU_BY_INDEX.findall(message)}
    complete = _GPU_UNIDENTIFIED not in message
    for bus in _GPU_BY_BUS.findall(message):
        index = inventory.by_bus.get(_bus_key(bus.rstrip(".:")))
        if index is None:
            complete = False
        else:
            named.add(index)
    for uuid in _GPU_BY_UUID.findall(message):
        index = inventory.by_uuid.get(uuid)
        if index is None:
            complete = False
        else:
            named.add(index)
    extra = inventory.faulted.get(ctype, set()) - named
    if _MORE.search(message) and not extra:
        complete = False
    if not complete:
        return ()
    return tuple(sorted(named | extra))


def _conditions(raw: object, inventory: _GpuInventory, ident: str) -> tuple[tuple[NodeCondition, ...], bool]:
    """The agent's conditions and whether the kubelet says the node is Ready."""
    out: list[NodeCondition] = []
    ready = False
    for entry in _list(raw, "status.conditions", ident):
        if not isinstance(entry, dict):
            continue
        ctype = entry.get("type")
        status = entry.get("status")
        if ctype == "Ready":
            ready = status == "True"
            continue
        if not isinstance(ctype, str) or ctype not in _AGENT_CONDITIONS:
            continue
        if status == "False":
            out.append(NodeCondition(type=ctype, status=False, reason=_str(entry.get("reason"))))
            continue
        if status != "True":
            warn.warning("agent condition status unreadable; a problem", (ident, ctype), node=ident, condition=ctype)
        message = _str(entry.get("message"))
        out.append(
            NodeCondition(
                type=ctype,
                status=True,
                reason=_str(entry.get("reason")),
                message=message,
                action=_action_of(message, ident, ctype),
                gpu_indices=_named_gpus(message, inventory, ctype),
            )
        )
    return tuple(out), ready


def node_from_objects(
    node: Mapping[str, Any],
    gpunode: Mapping[str, Any] | None,
    *,
    default_gpu_memory_mib: int = DEFAULT_GPU_MEMORY_MIB,
) -> Node:
    """A Node (and its GPUNode, when the agent has published one) as the engine sees it.

    GPUs come from the GPUNode (the agent's per-GPU index, UUID, memory,
    MIG mode and health); without one, from the device plugin's
    ``nvidia.com/gpu`` allocatable, each with ``default_gpu_memory_mib``
    (or NVIDIA's ``nvidia.com/gpu.memory`` label). A node is unschedulable
    when cordoned or when its kubelet is not Ready (a missing Ready
    condition counts as not Ready). Of the other kubelet conditions none is
    read: the node lifecycle controller turns them into taints.
    """
    meta = _dict(node.get("metadata"), "metadata", "node")
    name = _str(meta.get("name"))
    ident = f"node/{name}"
    labels = _str_map(meta.get("labels"), "metadata.labels", ident)
    spec = _dict(node.get("spec"), "spec", ident)
    status = _dict(node.get("status"), "status", ident)
    allocatable = _dict(status.get("allocatable"), "status.allocatable", ident)
    inventory = _gpus_from_gpunode(gpunode, f"gpunode/{name}") if gpunode is not None else None
    if inventory is None:
        inventory = _gpus_from_allocatable(allocatable, labels, ident, default_gpu_memory_mib)
    conditions, ready = _conditions(status.get("conditions"), inventory, ident)
    annotations = _str_map(meta.get("annotations"), "metadata.annotations", ident)
    gpus = _fenced(inventory.gpus, annotations.get(ANNOTATION_QUARANTINED_GPUS), ident)
    unschedulable = spec.get("unschedulable", False)
    if not isinstance(unschedulable, bool):
        warn.warning("object field malformed", (ident, "unschedulable"), object=ident, field="spec.unschedulable")
        unschedulable = True
    extended, max_pods = node_other(allocatable)
    return Node(
        name=name,
        pool=labels.get(LABEL_NODE_POOL) or DEFAULT_NODE_POOL,
        cpu_milli=_amount(allocatable, "cpu", cpu_milli_floor, ident),
        memory_mib=_amount(allocatable, "memory", mib_floor, ident),
        gpus=gpus,
        labels=labels,
        taints=_taints(spec.get("taints"), ident),
        schedulable=ready and not unschedulable,
        conditions=conditions,
        draining=annotations.get(ANNOTATION_DRAINING) == "true",
        extended=extended,
        max_pods=max_pods,
        kubelet_holders=inventory.holders,
    )


def quarantined_indices(listed: str) -> frozenset[int] | None:
    """The GPU indices ``gpuwarden.io/quarantined-gpus`` names ("2,5"); None when it cannot be read.

    Whoever reads a malformed list fences every GPU: remediation wrote it,
    and placing work on a GPU it meant to fence is worse than idling a
    healthy one.
    """
    try:
        return frozenset(int(part) for part in listed.split(",") if part.strip())
    except ValueError:
        return None


def _fenced(gpus: tuple[Gpu, ...], listed: str | None, ident: str) -> tuple[Gpu, ...]:
    """The GPUs with those remediation quarantined marked out of service (all of them if the list is malformed)."""
    if not listed:
        return gpus
    fenced = quarantined_indices(listed)
    if fenced is None:
        warn.warning("object field malformed", (ident, "quarantined-gpus"), object=ident, value=listed)
        return tuple(replace(g, healthy=False) for g in gpus)
    return tuple(replace(g, healthy=False) if g.index in fenced else g for g in gpus)


# --------------------------------------------------------------------------
# Pods
# --------------------------------------------------------------------------


def _container_amounts(container: Any, ident: str) -> tuple[int, int, int, bool]:
    """(millicores, MiB, GPUs, is a sidecar) that one container asks for."""
    if not isinstance(container, dict):
        warn.warning("container malformed", (ident, "container"), pod=ident)
        return 0, 0, 0, False
    sidecar = container.get("restartPolicy") == "Always"
    resources = container.get("resources")
    if not resources:
        return 0, 0, 0, sidecar
    resources = _dict(resources, "resources", ident)
    requests = _dict(resources.get("requests"), "resources.requests", ident)
    limits = _dict(resources.get("limits"), "resources.limits", ident)
    # The API server defaults a missing request to the limit; an object
    # that skipped defaulting is read the same way.
    cpu = _amount(requests if "cpu" in requests else limits, "cpu", cpu_milli_ceil, ident)
    mem = _amount(requests if "memory" in requests else limits, "memory", mib_ceil, ident)
    gpu = _amount(limits if RESOURCE_NVIDIA_GPU in limits else requests, RESOURCE_NVIDIA_GPU, count_ceil, ident)
    return cpu, mem, gpu, sidecar


def pod_amounts(spec: Mapping[str, Any], ident: str) -> tuple[int, int, int]:
    """A pod's effective request, as the kube-scheduler computes it.

    The sum over its containers and restartable init containers (sidecars,
    which run alongside), or the largest one-shot init container plus the
    sidecars started before it, whichever is larger; then the pod overhead.
    """
    cpu = mem = gpu = 0
    for container in _list(spec.get("containers"), "spec.containers", ident):
        c, m, g, _ = _container_amounts(container, ident)
        cpu += c
        mem += m
        gpu += g
    init = spec.get("initContainers")
    if init:
        side_cpu = side_mem = side_gpu = 0
        peak_cpu = peak_mem = peak_gpu = 0
        for container in _list(init, "spec.initContainers", ident):
            c, m, g, sidecar = _container_amounts(container, ident)
            if sidecar:
                side_cpu += c
                side_mem += m
                side_gpu += g
                c, m, g = side_cpu, side_mem, side_gpu
            else:
                c, m, g = c + side_cpu, m + side_mem, g + side_gpu
            peak_cpu = max(peak_cpu, c)
            peak_mem = max(peak_mem, m)
            peak_gpu = max(peak_gpu, g)
        cpu = max(cpu + side_cpu, peak_cpu)
        mem = max(mem + side_mem, peak_mem)
        gpu = max(gpu + side_gpu, peak_gpu)
    overhead = spec.get("overhead")
    if overhead:
        overhead = _dict(overhead, "spec.overhead", ident)
        cpu += _amount(overhead, "cpu", cpu_milli_ceil, ident)
        mem += _amount(overhead, "memory", mib_ceil, ident)
    return cpu, mem, gpu


# Tolerations read, by their fields: the pods of one workload (and most of
# a cluster's) carry the same few lists. Cleared when it grows past its
# bound; only lists read without a warning are kept, so that each pod with
# a bad one is still reported.
_TOLERATIONS: dict[tuple[tuple[object, ...], ...], tuple[Toleration, ...]] = {}
_TOLERATIONS_KEPT = 4096


def _tolerations(raw: object, ident: str) -> tuple[Toleration, ...]:
    key: tuple[tuple[object, ...], ...] | None = None
    if isinstance(raw, list) and all(isinstance(e, dict) for e in raw):
        key = tuple((e.get("key"), e.get("operator"), e.get("value"), e.get("effect")) for e in raw)
        try:
            return _TOLERATIONS[key]
        except KeyError:
            pass
        except TypeError:  # a field of a type no toleration has: read it the long way, with its warning
            key = None
    read, clean = _read_tolerations(raw, ident)
    if key is not None and clean:
        if len(_TOLERATIONS) >= _TOLERATIONS_KEPT:
            _TOLERATIONS.clear()
        _TOLERATIONS[key] = read
    return read


def _read_tolerations(raw: object, ident: str) -> tuple[tuple[Toleration, ...], bool]:
    """The tolerations, and whether all of them were read without a warning."""
    clean = True
    out: list[Toleration] = []
    for entry in _list(raw, "spec.tolerations", ident):
        if not isinstance(entry, dict):
            warn.warning("toleration malformed", (ident, "toleration"), pod=ident)
            clean = False
            continue
        operator = entry.get("operator") or "Equal"
        if operator not in ("Equal", "Exists"):
            # Kubernetes knows no other operator: the toleration matches nothing.
            warn.warning("toleration operator unknown", (ident, "operator"), pod=ident, operator=repr(operator)[:50])
            clean = False
            continue
        out.append(
            Toleration(
                key=_str(entry.get("key")),
                operator=operator,
                value=_str(entry.get("value")),
                effect=_str(entry.get("effect")),
            )
        )
    return tuple(out), clean


def _refusal(pod: Mapping[str, Any], gpus: int, annotations: Mapping[str, str], admission: SliceAdmission) -> str:
    """Why a pending GPU slice pod must not be placed (:mod:`.sliceadmission`); "" for any other pod.

    A malformed request is left to the engine, which explains it the same
    way for every pod; only a well-formed slice is checked here.
    """
    if not has_sharing_annotation(annotations):
        return ""
    request = parse_gpu_request(gpus, annotations)
    if isinstance(request, str) or not request.is_slice:
        return ""
    return admission.refusal(pod) or ""


def _task(pod: Mapping[str, Any], external: bool, admission: SliceAdmission | None = None) -> Task:
    meta = _dict(pod.get("metadata"), "metadata", "pod")
    name = _str(meta.get("name"))
    namespace = _str(meta.get("namespace")) or "default"
    ident = f"pod/{namespace}/{name}"
    spec = _dict(pod.get("spec"), "spec", ident)
    cpu, mem, gpus = pod_amounts(spec, ident)
    node = spec.get("nodeName")
    node = node if isinstance(node, str) and node else None
    labels = _str_map(meta.get("labels"), "metadata.labels", ident)
    rules = read_placement(spec, labels)
    try:
        extended = other_requests(spec)
        unplaceable = rules.unplaceable
    except UnreadableError as why:
        extended, unplaceable = (), str(why)
    if unplaceable:
        warn.warning("placement rules unreadable", (ident, "placement"), pod=ident, problem=unplaceable[:200])
    terminating = bool(meta.get("deletionTimestamp"))
    if external:
        # Another scheduler's pod holds what the kubelet admitted: whole
        # devices. Its GPU annotations (KAI's fractions, say) describe
        # sharing done by that scheduler and must not be read as ours. Its
        # labels, host ports, other resources and anti-affinity bind the
        # pods placed near it.
        return Task(
            name=name,
            namespace=namespace,
            uid=_str(meta.get("uid")),
            status=TaskStatus.RELEASING,
            cpu_milli=cpu,
            memory_mib=mem,
            gpus=gpus,
            node=node,
            labels=labels,
            placement=rules.placement,
            extended=extended,
            terminating=terminating,
        )
    annotations = _str_map(meta.get("annotations"), "metadata.annotations", ident)
    if terminating:
        status = TaskStatus.RELEASING
    elif node is not None:
        status = TaskStatus.RUNNING
    else:
        status = TaskStatus.PENDING
    indices: tuple[int, ...] = ()
    if node is not None:
        text = annotations.get(ANNOTATION_GPU_ASSIGNMENT)
        if text is not None:
            decoded = decode_assignment(text, node=node)
            if decoded is None:
                warn.warning("gpu assignment unreadable", (ident, text), pod=ident, value=text[:200])
            else:
                indices = decoded
    refusal = ""
    if admission is not None and status is TaskStatus.PENDING:
        refusal = _refusal(pod, gpus, annotations, admission)
    selector = spec.get("nodeSelector")
    tolerations = spec.get("tolerations")
    started: float | None = None
    if node is not None:
        status_obj = pod.get("status")
        if isinstance(status_obj, dict):
            started = parse_epoch(_str(status_obj.get("startTime")))
    return Task(
        name=name,
        namespace=namespace,
        uid=_str(meta.get("uid")),
        status=status,
        cpu_milli=cpu,
        memory_mib=mem,
        gpus=gpus,
        annotations=annotations,
        node_selector=_str_map(selector, "spec.nodeSelector", ident) if selector else {},
        tolerations=_tolerations(tolerations, ident) if tolerations else (),
        node=node,
        gpu_indices=indices,
        refusal=refusal,
        labels=labels,
        placement=rules.placement,
        extended=extended,
        terminating=terminating,
        unplaceable=unplaceable if status is TaskStatus.PENDING else "",
        claims=_claims(spec, name) if status is TaskStatus.PENDING else (),
        started=started,
    )


def _claims(spec: Mapping[str, Any], pod: str) -> tuple[str, ...]:
    """The claims a pod's volumes use: a persistentVolumeClaim's, a generic ephemeral volume's ``<pod>-<volume>``."""
    volumes = spec.get("volumes")
    if not volumes or not isinstance(volumes, list):
        return ()
    found: list[str] = []
    for volume in volumes:
        if not isinstance(volume, dict):
            continue
        claim = volume.get("persistentVolumeClaim")
        if isinstance(claim, dict) and isinstance(claim.get("claimName"), str):
            found.append(claim["claimName"])
        elif "ephemeral" in volume and isinstance(volume.get("name"), str):
            found.append(f"{pod}-{volume['name']}")
    return tuple(found)


def task_order(task: Task) -> tuple[str, str, str]:
    """How a job's pods are ordered in a Snapshot: namespace, name, uid."""
    return (task.namespace, task.name, task.uid)


def task_from_pod(pod: Mapping[str, Any], admission: SliceAdmission | None = None) -> Task:
    """A pod as the engine sees it.

    Status: ``RELEASING`` once a deletion timestamp is set (it holds its
    resources until gone), ``RUNNING`` once bound to a node (bound pods hold
    resources whether or not their containers have started), else
    ``PENDING``. Held GPUs come from the assignment annotation
    (:mod:`scheduler.cluster.assignment`). Whether a pod belongs in the
    snapshot at all (finished, gated, another scheduler's) is
    :func:`snapshot_from`'s business. With ``admission``, a pending GPU
    slice pod that lacks what the admission webhook injects carries why in
    ``refusal`` (the scheduler's cycle passes it; the webhook, which is
    about to inject it, does not).
    """
    return _task(pod, external=False, admission=admission)


def external_task_from_pod(pod: Mapping[str, Any]) -> Task:
    """Another scheduler's pod as the engine sees it: RELEASING, holding whole devices (module docstring)."""
    return _task(pod, external=True)


# --------------------------------------------------------------------------
# Snapshot
# --------------------------------------------------------------------------


@lru_cache(maxsize=65536)
def creation_epoch(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def _earliest(earliest: dict[tuple[str, str], str], key: tuple[str, str], created: object) -> None:
    """Keep the group's earliest creation time (its age): the first pod's, finished or not.

    RFC 3339 in UTC at one-second precision, as the API server writes it,
    orders as text: only each group's earliest is parsed.
    """
    if isinstance(created, str):
        first = earliest.get(key)
        if first is None or created < first:
            earliest[key] = created


def _external_queue(pool: str) -> Queue:
    unbounded = QueueResource(quota=UNLIMITED, limit=UNLIMITED, over_quota_weight=0.0)
    return Queue(
        name=external_queue_name(pool),
        priority=EXTERNAL_QUEUE_PRIORITY,
        node_pool=pool,
        gpu=unbounded,
        cpu=unbounded,
        memory=unbounded,
    )


def keyed_node(name: str, node: Mapping[str, Any], gpunode: Mapping[str, Any] | None) -> Node:
    """:func:`node_from_objects`, named after its key in the cache (the name the pods' nodeName uses)."""
    converted = node_from_objects(node, gpunode)
    if converted.name == name:
        return converted
    warn.warning("node name differs from its key", ("node-key", name), key=name, name=converted.name)
    return replace(converted, name=name)


def is_bystander(task: Task) -> bool:
    """Whether another scheduler's pod on a node that takes no work matters to placement rules."""
    return bool(task.labels) or task.placement is not None


def takes_work(node: Node) -> bool:
    """Whether other schedulers' pods on ``node`` are charged (see the module docstring)."""
    return node.schedulable and judge(node).node_fatal is None


# The creation time of every external job. The engine reads a job's age to
# order pending jobs and victims; an external job is neither (its pods are
# bound, and it is not preemptible), so no decision depends on it. A constant
# keeps an unchanged node's external job equal from one cycle to the next, so
# the kept-state engine and the backlog memo do not take every node with
# another scheduler's pods (a DaemonSet's, on every node) as changed each cycle.
EXTERNAL_JOB_CREATED = 0.0


def external_job(node: Node, tasks: list[Task], held: set[int]) -> Job:
    """The synthetic job holding other schedulers' pods on one node that takes work.

    Its pods are taken in name order, not in the order they were read, so
    the GPUs named for them do not depend on how the cache lists its pods.
    """
    tasks = sorted(tasks, key=task_order)
    if node.gpus and any(t.gpus for t in tasks):
        tasks = _seat_external(tasks, node, held)
    return Job(
        name=f"{EXTERNAL_JOB_PREFIX}{node.name}",
        queue=external_queue_name(node.pool),
        namespace="",
        priority=NON_PREEMPTIBLE_PRIORITY,
        preemptible=False,
        tasks=tuple(tasks),
        created=EXTERNAL_JOB_CREATED,
    )


def with_external_queues(queues: Sequence[Queue], pools: Iterable[str]) -> tuple[Queue, ...]:
    """The real queues, then one reserved queue per pool where other schedulers' pods hold capacity."""
    return (*queues, *(_external_queue(pool) for pool in sorted(pools)))


def _seat_external(tasks: list[Task], node: Node, held: set[int]) -> list[Task]:
    """Name GPUs for other schedulers' pods: the kubelet's where it reports them, else a guess.

    The device plugin, not gpuwarden, chose them. Where the node's agent
    publishes the kubelet's PodResources answers, a pod listed there holds
    exactly the GPUs listed (:mod:`scheduler.engine.holders`), so a fault on
    one of them is known to hit it. Any other pod gets a guess: GPUs no pod
    of ours holds and the kubelet reports nobody holding, healthy ones first
    (the device plugin hands out healthy devices); the count is what
    matters, and naming them keeps the engine from warning about every such
    pod every cycle.
    """
    real: dict[int, tuple[int, ...]] = {}
    if node.kubelet_holders:
        for i, task in enumerate(tasks):
            found = kubelet_gpus(node, task) if task.gpus else None
            if found is not None:
                real[i] = found
    taken = held | reported_gpus(node)
    free = [g.index for g in node.gpus if g.index not in taken and g.healthy and not g.mig_enabled]
    free += [g.index for g in node.gpus if g.index not in taken and not (g.healthy and not g.mig_enabled)]
    out: list[Task] = []
    for i, original in enumerate(tasks):
        task = original
        if i in real:
            task = replace(task, gpu_indices=real[i])
        elif task.gpus and free:
            take, free = free[: task.gpus], free[task.gpus :]
            task = replace(task, gpu_indices=tuple(take))
        out.append(task)
    return out


def snapshot_from(  # noqa: PLR0917 (the watch loop passes them in this order)
    nodes: Mapping[str, Mapping[str, Any]],
    gpunodes: Mapping[str, Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    queues: Sequence[Queue],
    groups: Mapping[tuple[str, str], GroupInfo],
    now: float,
    config: SchedulerConfig,
    *,
    pod_groups: Mapping[str, str] | None = None,
    admission: SliceAdmission | None = None,
) -> Snapshot:
    """The engine's Snapshot from the watch cache's raw objects.

    ``nodes`` and ``gpunodes`` are keyed by node name (a GPUNode is named
    after its node). A pod of ours belongs to the group its
    ``ANNOTATION_POD_GROUP`` annotation names, else to ``pod_groups[uid]``
    (what the pod-grouper derived, :func:`scheduler.cluster.grouping.derive_group`),
    and ``groups`` says what that group is. One Job per group with pods;
    created is its earliest pod's creation time.

    A finished pod of ours (Succeeded, Failed) is no task: it holds
    nothing. It is counted in its group's ``succeeded`` or ``failed``
    (succeeded members count toward the gang, :class:`Job`), and a group
    whose pods have all finished is a job without tasks, so that its status
    can say how it ended. Left out: other schedulers' finished pods,
    pending pods that are being deleted or are held by scheduling gates,
    and pods whose group is not known yet (the next cycle has it). A bound
    pod of ours without a known group still holds its resources, as other
    schedulers' pods do (see the module docstring). ``admission`` is as for
    :func:`task_from_pod`.
    """
    engine_nodes = {name: keyed_node(name, obj, gpunodes.get(name)) for name, obj in nodes.items()}

    by_uid = pod_groups or {}
    members: dict[tuple[str, str], list[Task]] = {}
    # Per group, its members that succeeded and that failed.
    finished: dict[tuple[str, str], list[int]] = {}
    earliest: dict[tuple[str, str], str] = {}
    foreign: dict[str, list[Mapping[str, Any]]] = {}
    # GPU indices held by our pods, per node, for naming foreign pods' GPUs.
    held: dict[str, set[int]] = {}
    for pod in pods:
        if not isinstance(pod, dict):
            warn.warning("pod malformed", ("pod", type(pod).__name__), value=repr(pod)[:200])
            continue
        spec = pod.get("spec")
        status = pod.get("status")
        if not isinstance(spec, dict):
            spec = {}
        phase = status.get("phase") if isinstance(status, dict) else None
        ended = isinstance(phase, str) and phase in _TERMINAL_PHASES
        raw_node = spec.get("nodeName")
        node_name = raw_node if isinstance(raw_node, str) else ""
        bound = bool(node_name)
        if spec.get("schedulerName") != SCHEDULER_NAME:
            if bound and not ended:
                foreign.setdefault(node_name, []).append(pod)
            continue
        meta = pod.get("metadata")
        if not isinstance(meta, dict):
            meta = {}
        if not ended and not bound and (meta.get("deletionTimestamp") or spec.get("schedulingGates")):
            continue
        namespace = _str(meta.get("namespace")) or "default"
        annotations = meta.get("annotations")
        group = annotations.get(ANNOTATION_POD_GROUP) if isinstance(annotations, dict) else None
        if not isinstance(group, str) or not group:
            group = by_uid.get(_str(meta.get("uid")))
        key = (namespace, group) if group else None
        if ended:
            if key is not None and key in groups:
                counts = finished.setdefault(key, [0, 0])
                counts[0 if phase == "Succeeded" else 1] += 1
                _earliest(earliest, key, meta.get("creationTimestamp"))
            continue
        if key is None or key not in groups:
            ident = f"{namespace}/{_str(meta.get('name'))}"
            if bound:
                foreign.setdefault(node_name, []).append(pod)
                warn.warning("bound pod has no known pod group; counted as held", ("nogroup", ident), pod=ident)
            else:
                # Usually a race (the operator's PodGroup is a watch event behind its
                # pods); one that lasts is told on the pod (scheduler.cluster.ungrouped).
                log.debug("pending_pod_waits_for_its_pod_group", pod=ident, group=group)
            continue
        task = _task(pod, external=False, admission=admission)
        members.setdefault(key, []).append(task)
        if task.gpu_indices and task.node is not None:
            held.setdefault(task.node, set()).update(task.gpu_indices)
        _earliest(earliest, key, meta.get("creationTimestamp"))

    jobs: list[Job] = []
    for key in [*members, *(k for k in finished if k not in members)]:
        tasks = members.get(key, [])
        succeeded, failed = finished.get(key, (0, 0))
        info = groups[key]
        stamp = earliest.get(key)
        created = creation_epoch(stamp) if stamp is not None else None
        jobs.append(
            Job(
                name=key[1],
                queue=info.queue,
                namespace=key[0],
                uid=info.uid,
                priority=info.priority,
                preemptible=info.preemptible,
                min_member=max(1, info.min_member),
                created=created if created is not None else now,
                tasks=tuple(tasks),
                below_min_member_since=info.below_min_member_since,
                succeeded=succeeded,
                failed=failed,
            )
        )

    external_pools: set[str] = set()
    bystanders: list[Task] = []
    for node_name, node_pods in foreign.items():
        engine_node = engine_nodes.get(node_name)
        if engine_node is None:
            continue
        tasks = [_task(p, external=True) for p in node_pods]
        if not takes_work(engine_node):
            bystanders.extend(t for t in tasks if is_bystander(t))
            continue
        jobs.append(external_job(engine_node, tasks, held.get(node_name, set())))
        external_pools.add(engine_node.pool)
    all_queues = with_external_queues(queues, external_pools)
    return Snapshot(
        nodes=tuple(engine_nodes.values()),
        queues=all_queues,
        jobs=tuple(jobs),
        now=now,
        config=config,
        bystanders=tuple(sorted(bystanders, key=task_order)),
    )
