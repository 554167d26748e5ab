"""Pods with DRA ResourceClaims: the GPUs their claims may take, the GPUs claims hold, and what to write at bind.

On a node where NVIDIA's DRA driver publishes the GPUs (driver
``gpu.nvidia.com``, one pool named after the node, a device per GPU), a
pod gets GPUs through ResourceClaims, not through ``nvidia.com/gpu``: the
scheduler chooses the devices, writes them into the claim's
``status.allocation`` with the pod in ``status.reservedFor``, and only then
binds; the kubelet refuses a pod whose claims are not allocated and
reserved for it. This stage, run on each cycle's snapshot after it is
assembled, turns the claims into what the engine reads:

- **Inventory.** The driver's whole-GPU devices (``type`` ``gpu``) are
  matched to the node's GPUs by UUID (the agent's GPUNode). A node that
  has DRA GPUs but no GPUs otherwise (no GPUNode, no ``nvidia.com/gpu``
  from a device plugin: the GPU Operator's DRA mode) gets its GPUs from
  the devices, indexed by the minor number the driver names them by.
- **MIG devices.** On a node whose kubelet has no device plugin, each MIG
  device of the driver's (``type`` ``mig``; static MIG, where the GPU in
  MIG mode is not published itself) is a GPU of the engine's carved from
  its parent (:attr:`~scheduler.engine.model.Gpu.parent`, index
  :data:`MIG_INDEX` and up), which only claims that select it take, out
  when its parent is, and counting for its share of the parent in quotas
  and capacity. A partitionable device (``consumesCounters``: the
  driver's dynamic MIG, alpha) is never offered: gpuwarden does not model
  the counters.
- **Held devices.** Every allocated claim holds its devices, whoever
  allocated it: a running pod of ours holds exactly its claims' devices
  (the allocation is the truth of which GPU it has); devices of claims no
  pod of ours holds (kube-scheduler's pods, a shared claim allocated
  ahead, a claim whose pod is gone and which the resourceclaim controller
  has not deallocated yet) are held by another scheduler's placeholder on
  that node, so nothing is placed on them. A MIG device holds itself where
  it is a GPU of the engine's, else its parent GPU.
- **Pending pods.** For each claim a pending pod of ours uses: the claim
  of a template is the one the resourceclaim controller created for the
  pod (``status.resourceClaimStatuses``); until it exists the pod waits,
  as it does for kube-scheduler. An unallocated claim's requests are
  read (``exactly``, ``allocationMode: ExactCount``), their DeviceClass and
  request selectors evaluated (:mod:`.drasel`) over the devices, and the
  pod asks the engine for the requests' total count of GPUs, each request
  its own count among the GPUs its selectors allow
  (:class:`~scheduler.engine.model.DeviceFilter`; where the requests'
  sets differ, the engine matches GPUs to requests, as kube-scheduler's
  allocator does). A claim allocated already pins the pod to the
  allocation's node; one reserved for this pod already (a bind that
  did not go through) too, its devices held by the placeholder there until
  the pod runs. A ``matchAttribute`` constraint makes each
  group of devices that share the attribute's value an alternative, largest
  first; the engine takes the first that has room.
- **Refused, with the reason on the PodGroup** (``UnsupportedPlacement``):
  ``firstAvailable`` alternatives, ``allocationMode: All``, admin access,
  ``distinctAttribute`` constraints, requests that select no device
  offered (MIG devices on a node with a device plugin, partitionable
  devices, other drivers' devices: leave such pods to kube-scheduler), a
  pod that asks for both ``nvidia.com/gpu`` and claims, a selector that
  fails on a device (the error is shown: an error never reads as "does
  not match"), a claim being deleted or reserved for 256 consumers
  already.

The devices taken are chosen by the engine, which knows quotas, gangs,
bin-packing and health; :class:`ClaimPlan` keeps, per pending pod, what
:mod:`.claimbind` needs to write the allocation for the GPUs chosen.

A ``matchAttribute`` constraint binds the requests it names (all of its
claim's when it names none), as upstream. The differential test
(tests/scheduler/cluster/test_claims_oracle_k8s.py) holds gpuwarden to
kube-scheduler's verdict, both ways.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from itertools import product
from typing import Any

from gpuwarden import contract
from gpuwarden.contract import RESOURCE_NVIDIA_GPU
from gpuwarden.dra import device_minor, mig_placement, mig_share
from gpuwarden.kube import JSON
from gpuwarden.logconfig import get_logger
from scheduler.cluster.convert import EXTERNAL_JOB_PREFIX, external_queue_name, with_external_queues
from scheduler.cluster.drasel import CelDevice, SelectorError, device_value, matches
from scheduler.cluster.logonce import WarnOnce
from scheduler.cluster.placement import UnreadableError, node_terms, with_volume_terms
from scheduler.cluster.quantity import mebibytes
from scheduler.engine.model import (
    NON_PREEMPTIBLE_PRIORITY,
    DeviceChoices,
    DeviceFilter,
    DeviceRequests,
    Gpu,
    Job,
    Node,
    NodeTerm,
    Requirement,
    Snapshot,
    Task,
    TaskStatus,
)
from scheduler.engine.resources import MILLI

log = get_logger(__name__)
warn = WarnOnce(__name__)

DRIVER = contract.NVIDIA_DRA_DRIVER
# The finalizer kube-scheduler puts on a claim it allocates, before it writes
# the allocation: the claim is not deleted while allocated.
FINALIZER = "resource.kubernetes.io/delete-protection"
# At most this many consumers in ``status.reservedFor`` (resource.k8s.io/v1).
MAX_RESERVED = 256
_FATAL_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
DRA_JOB_PREFIX = f"{EXTERNAL_JOB_PREFIX}claims:"
# KEP-5004: the claim kube-scheduler makes for a pod's extended resources carries this annotation.
EXTENDED_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"
# pod_claims' mark for the claim ``status.extendedResourceClaimStatus`` names.
EXTENDED = "<extended-resources>"
# The engine's index of a MIG device: MIG_INDEX + 16 x its parent's minor + its placement start
# (stable while the device exists, so a bound pod's recorded assignment keeps naming it), or
# from MIG_INDEX_OTHER on for a name that does not say those.
MIG_INDEX = 1000
MIG_INDEX_OTHER = 100_000
# The device plugin's MIG resources (its "mixed" strategy): nvidia.com/mig-1g.5gb and the like.
_MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


# --------------------------------------------------------------------------
# Inventory
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceTaint:
    key: str
    value: str
    effect: str


@dataclass(slots=True)
class DraGpu:
    """One device of the driver's slices: a whole GPU or a MIG device, with what CEL and tolerations read."""

    node: str
    pool: str
    name: str
    uuid: str
    kind: str
    parent_uuid: str
    memory_mib: int
    cel: CelDevice
    taints: tuple[DeviceTaint, ...] = ()
    profile: str = ""
    # It consumes shared counters (a partitionable device, KEP-4815: the driver's dynamic MIG), which
    # gpuwarden does not model: never offered, though what a claim holds of it is still held.
    counters: bool = False

    def attribute(self, qualified: str) -> object:
        """An attribute by its qualified name (``gpu.nvidia.com/productName``), as CEL would read it."""
        domain, _, short = qualified.rpartition("/")
        return self.cel.value["attributes"].get(domain or DRIVER, {}).get(short)


@dataclass(slots=True)
class _SliceMemo:
    obj: Any
    devices: list[DraGpu]


def _s(value: object) -> str:
    return value if isinstance(value, str) else ""


def _d(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _memory_mib(entry: Mapping[str, Any]) -> int:
    raw = _d(_d(entry.get("capacity")).get("memory")).get("value")
    mib = mebibytes(raw) if raw is not None else 0
    return mib if isinstance(mib, int) else 0


def _slice_devices(obj: Mapping[str, Any]) -> list[DraGpu]:
    spec = _d(obj.get("spec"))
    node, pool = _s(spec.get("nodeName")), _s(_d(spec.get("pool")).get("name"))
    if spec.get("driver") != DRIVER or not node or not pool:
        return []
    out: list[DraGpu] = []
    for item in spec.get("devices") or ():
        entry = _d(item)
        name = _s(entry.get("name"))
        if not name:
            continue
        value = device_value(DRIVER, entry)
        attrs = value["attributes"].get(DRIVER, {})
        taints = tuple(
            DeviceTaint(_s(t.get("key")), _s(t.get("value")), _s(t.get("effect")))
            for t in (entry.get("taints") or ())
            if isinstance(t, dict) and _s(t.get("key"))
        )
        out.append(
            DraGpu(
                node=node,
                pool=pool,
                name=name,
                uuid=_s(attrs.get("uuid")),
                kind=_s(attrs.get("type")) or "gpu",
                parent_uuid=_s(attrs.get("parentUUID")),
                memory_mib=_memory_mib(entry),
                cel=CelDevice(value),
                taints=taints,
                profile=_s(attrs.get("profile")),
                counters=bool(entry.get("consumesCounters")),
            )
        )
    return out


def _pool_of(obj: Mapping[str, Any]) -> tuple[tuple[str, str], int]:
    """A slice's (node, pool) and the pool's generation: only the newest generation of a pool counts."""
    spec = _d(obj.get("spec"))
    pool = _d(spec.get("pool"))
    generation = pool.get("generation")
    if not isinstance(generation, int) or isinstance(generation, bool):
        generation = 0
    return (_s(spec.get("nodeName")), _s(pool.get("name"))), generation


def _rule_applies(selector: Mapping[str, Any], device: DraGpu) -> bool:
    for key, have in (("driver", DRIVER), ("pool", device.pool), ("device", device.name)):
        want = _s(selector.get(key))
        if want and want != have:
            return False
    return True


@dataclass(slots=True)
class Inventory:
    """The driver's devices by node, from the newest generation of each pool, with the rules' taints added."""

    by_node: dict[str, list[DraGpu]] = field(default_factory=dict)
    by_pool: dict[tuple[str, str], DraGpu] = field(default_factory=dict)  # (pool, device name)
    version: int = 0


# --------------------------------------------------------------------------
# Plans: what a pending pod's bind must write
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """One request of a claim to allocate: how many GPUs, and the result's extras."""

    name: str
    count: int
    tolerations: tuple[Mapping[str, Any], ...] = ()
    class_config: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class ClaimToWrite:
    """A claim of the pod: to allocate (``requests``), or allocated already and only to reserve for the pod."""

    namespace: str
    name: str
    uid: str
    requests: tuple[RequestPlan, ...] = ()
    claim_config: tuple[Mapping[str, Any], ...] = ()
    # Allocated already: reserve only (the allocation stays as it is).
    reserve_only: bool = False
    # Allocated and reserved for this pod already: nothing to write.
    done: bool = False


@dataclass(frozen=True, slots=True)
class ExtendedClaim:
    """The claim to create for a pod's ``nvidia.com/gpu`` on a node DRA serves it on (KEP-5004).

    ``requests`` are (request name, count) in the claim's order, ``mappings``
    (container, request name) as the pod's status lists them (a one-shot
    init container may have several, several containers one);
    ``stale`` names claims made for the pod before (an attempt that did not
    bind), deleted before the new one is made, as kube-scheduler does.
    """

    resource: str
    device_class: str
    class_config: tuple[Mapping[str, Any], ...]
    requests: tuple[tuple[str, int], ...]
    mappings: tuple[tuple[str, str], ...]
    stale: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    """Per pending pod: its claims in order, and the node's devices by GPU index (to name the devices chosen)."""

    pod: str
    namespace: str
    uid: str
    claims: tuple[ClaimToWrite, ...]
    devices: Mapping[str, Mapping[int, tuple[str, str]]]  # node -> GPU index -> (pool, device)
    extended: ExtendedClaim | None = None
    # Where the requests' GPUs must be told apart (DeviceFilter.choices): per node, the
    # alternatives, each request in the claims' order (the GPUs held already last).
    choices: Mapping[str, DeviceChoices] = field(default_factory=dict)

    def writes_on(self, node: str) -> bool:
        """Whether a bind to ``node`` writes claims (an extended resource's claim only where DRA serves it)."""
        return any(not c.done for c in self.claims) or (self.extended is not None and node in self.devices)


# --------------------------------------------------------------------------
# The stage
# --------------------------------------------------------------------------


def pod_claims(pod: Mapping[str, Any]) -> list[tuple[str, str | None, str]]:
    """(entry name, claim name or None while it is not created, template or ''), per ``spec.resourceClaims``.

    A template's claim is the one ``status.resourceClaimStatuses`` names; an
    entry whose status names no claim (null) needs none, and is left out.
    """
    spec = _d(pod.get("spec"))
    raw = spec.get("resourceClaims")
    extended = _s(_d(_d(pod.get("status")).get("extendedResourceClaimStatus")).get("resourceClaimName"))
    if not isinstance(raw, list) or not raw:
        return [("", extended, EXTENDED)] if extended else []
    statuses = {
        _s(_d(s).get("name")): _d(s).get("resourceClaimName", "")
        for s in (_d(pod.get("status")).get("resourceClaimStatuses") or ())
    }
    out: list[tuple[str, str | None, str]] = []
    for item in raw:
        entry = _d(item)
        name = _s(entry.get("name"))
        direct = _s(entry.get("resourceClaimName"))
        if direct:
            out.append((name, direct, ""))
            continue
        template = _s(entry.get("resourceClaimTemplateName"))
        if name not in statuses:
            out.append((name, None, template))
        elif isinstance(statuses[name], str) and statuses[name]:
            out.append((name, statuses[name], template))
    if extended:
        out.append(("", extended, EXTENDED))
    return out


def extended_classes(classes: Mapping[str, JSON]) -> dict[str, str]:
    """Which DeviceClass serves each extended resource through DRA (KEP-5004), as kube-scheduler picks it.

    A class serves its ``spec.extendedResourceName`` and, always, the implicit
    ``deviceclass.resource.kubernetes.io/<class>``; where several name the
    same resource, the newest wins, and of equally new ones the first by name.
    """
    best: dict[str, tuple[str, str]] = {}
    for name, obj in classes.items():
        created = _s(_d(obj.get("metadata")).get("creationTimestamp"))
        explicit = _s(_d(obj.get("spec")).get("extendedResourceName"))
        for resource in filter(None, (explicit, f"{IMPLICIT_PREFIX}{name}")):
            have = best.get(resource)
            if have is None or created > have[0] or (created == have[0] and name < have[1]):
                best[resource] = (created, name)
    return {resource: name for resource, (_, name) in best.items()}


def _tolerates(tolerations: Iterable[Mapping[str, Any]], taint: DeviceTaint) -> bool:
    for t in tolerations:
        key, op = _s(t.get("key")), _s(t.get("operator")) or "Equal"
        effect = _s(t.get("effect"))
        if effect and effect != taint.effect:
            continue
        if op == "Exists" and (not key or key == taint.key):
            return True
        if op == "Equal" and key == taint.key and _s(t.get("value")) == taint.value:
            return True
    return False


@dataclass(slots=True)
class _Request:
    """A request read from a claim, with the selectors it is judged by."""

    name: str
    count: int
    expressions: tuple[str, ...]
    tolerations: tuple[Mapping[str, Any], ...]
    class_config: tuple[Mapping[str, Any], ...]


class _RefusedError(Exception):
    """Why a pod's claims cannot be placed by gpuwarden (or not yet): the text goes to its PodGroup."""


def _expressions(selectors: object, what: str) -> tuple[str, ...]:
    out = []
    for item in selectors if isinstance(selectors, list) else ():
        expression = _s(_d(_d(item).get("cel")).get("expression"))
        if not expression:
            raise _RefusedError(f"{what}: a selector without a CEL expression, which gpuwarden cannot judge")
        out.append(expression)
    return tuple(out)


def _read_requests(claim: Mapping[str, Any], ident: str, classes: Mapping[str, JSON]) -> list[_Request]:
    devices = _d(_d(claim.get("spec")).get("devices"))
    for constraint in devices.get("constraints") or ():
        c = _d(constraint)
        if "distinctAttribute" in c:
            raise _RefusedError(f"{ident}: distinctAttribute constraints are not supported by gpuwarden")
    out: list[_Request] = []
    for item in devices.get("requests") or ():
        request = _d(item)
        name = _s(request.get("name"))
        if request.get("firstAvailable") is not None:
            raise _RefusedError(f"{ident} request {name!r}: firstAvailable alternatives are not supported by gpuwarden")
        exactly = _d(request.get("exactly"))
        if not exactly:
            raise _RefusedError(f"{ident} request {name!r}: no 'exactly' device request")
        if exactly.get("adminAccess") is True:
            raise _RefusedError(f"{ident} request {name!r}: admin access is not supported by gpuwarden")
        mode = _s(exactly.get("allocationMode")) or "ExactCount"
        if mode != "ExactCount":
            raise _RefusedError(
                f"{ident} request {name!r}: allocationMode {mode} is not supported by gpuwarden (only ExactCount)"
            )
        count = exactly.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise _RefusedError(f"{ident} request {name!r}: count {count!r} is not a positive integer")
        if exactly.get("capacity") is not None:
            raise _RefusedError(f"{ident} request {name!r}: capacity requests are not supported by gpuwarden")
        class_name = _s(exactly.get("deviceClassName"))
        device_class = classes.get(class_name)
        if device_class is None:
            raise _RefusedError(f"{ident} request {name!r}: deviceclass {class_name!r} not found")
        class_spec = _d(device_class.get("spec"))
        expressions = _expressions(class_spec.get("selectors"), f"deviceclass {class_name}")
        expressions += _expressions(exactly.get("selectors"), f"{ident} request {name!r}")
        tolerations = tuple(_d(t) for t in (exactly.get("tolerations") or ()))
        config = tuple(_d(c) for c in (class_spec.get("config") or ()))
        out.append(_Request(name, count, expressions, tolerations, config))
    if not out:
        raise _RefusedError(f"{ident}: no device request")
    return out


def _constraints(claim: Mapping[str, Any]) -> list[tuple[str, frozenset[str] | None]]:
    """The claim's matchAttribute constraints: (attribute, the requests it binds; None: all)."""
    out: list[tuple[str, frozenset[str] | None]] = []
    for constraint in _d(_d(claim.get("spec")).get("devices")).get("constraints") or ():
        c = _d(constraint)
        attribute = _s(c.get("matchAttribute"))
        if attribute:
            names = [_s(r) for r in (c.get("requests") or ())]
            out.append((attribute, frozenset(names) if names else None))
    return out


def _allowed(device: DraGpu, request: _Request) -> bool:
    """Whether ``request`` may take ``device``; raises _Refused with the selector's error.

    The selectors come before the taints, as in kube-scheduler's allocator
    (it selects a device, then checks its taints): a selector that fails on
    a tainted device is an error there too, not a device passed over.
    """
    for expression in request.expressions:
        try:
            if not matches(expression, device.cel):
                return False
        except SelectorError as err:
            raise _RefusedError(f"request {request.name!r}, device {device.pool}/{device.name}: {err}") from None
    for taint in device.taints:
        if taint.effect in _FATAL_EFFECTS and not _tolerates(request.tolerations, taint):
            return False
    return True


def _groups(devices: list[tuple[int, DraGpu]], attribute: str) -> list[frozenset[int]]:
    """The groups of ``devices`` (indices) that share ``attribute``'s value, largest first.

    A device without the attribute is in no group: a ``matchAttribute``
    constraint cannot hold for it, as upstream.
    """
    groups: dict[str, set[int]] = {}
    for index, device in devices:
        value = device.attribute(attribute)
        if value is not None:
            groups.setdefault(repr(value), set()).add(index)
    return sorted((frozenset(g) for g in groups.values()), key=lambda g: (-len(g), min(g)))


@dataclass(frozen=True, slots=True)
class DraObjects:
    """What the stage reads from the cluster view: pods by UID, claims by ``namespace/name``, the rest by name."""

    pods: Mapping[str, JSON]
    claims: Mapping[str, JSON]
    classes: Mapping[str, JSON]
    slices: Mapping[str, JSON]
    rules: Mapping[str, JSON]
    # The Node objects by name: whether a device plugin serves nvidia.com/gpu there (KEP-5004).
    nodes: Mapping[str, JSON] = field(default_factory=dict)
    # False when ResourceClaims cannot be listed (not served, or refused): then no claim is known to
    # hold a device, so gpuwarden allocates none and serves nvidia.com/gpu only where a device plugin does.
    claims_readable: bool = True


@dataclass(slots=True)
class _Read:
    """One cycle's reading: the objects, the inventory, and which claim holds which GPUs (and for whom)."""

    objects: DraObjects
    inventory: Inventory
    held: dict[str, tuple[str, tuple[int, ...]]]
    reserved: dict[str, set[str]]
    # nvidia.com/gpu through DRA: the class that serves it, and the nodes where no device plugin does.
    gpu_class: str | None = None
    dra_nodes: frozenset[str] = frozenset()
    # Claims made for pods' extended resources, by the pod UID that owns them.
    extended_by_pod: dict[str, list[str]] = field(default_factory=dict)
    # Nodes whose device plugin advertises nvidia.com/gpu, and nodes with GPUs whose kubelet advertises none.
    plugged: frozenset[str] = frozenset()
    pluginless: frozenset[str] = frozenset()
    # Whether pending whole-GPU pods must be told where they may take a GPU (DeviceFilter): once a
    # node with GPUs has no device plugin, DRA serves nvidia.com/gpu, or MIG devices are offered.
    extended_on: bool = False
    # An unallocated claim that several pending pods name: the pod (``namespace/name``, UID) it is
    # allocated for first; the others wait until it is allocated, then are only added to it.
    first: dict[str, tuple[str, str]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _NodeMemo:
    """One node as the stage last made it: from which engine node and devices, and what it made of them."""

    node: Node
    devices: list[DraGpu]
    migs_allowed: bool  # whether MIG devices may be offered there (no device plugin)
    converted: Node
    index: dict[str, int]  # device name -> GPU index
    shares: dict[int, int]  # MIG device's GPU index -> its milli-GPUs


@dataclass(slots=True)
class _JobMemo:
    job: Job
    inputs: tuple[object, ...]
    judged: Job
    plans: dict[str, ClaimPlan]
    # The claims whose devices the job's pods hold in the engine (running
    # pods' claims, pending pods' claims reserved for them already).
    attributed: frozenset[str]


@dataclass(slots=True)
class ClaimStage:
    """The cycle's DRA stage (module docstring); one per scheduling loop, it keeps what it read."""

    _slices: dict[str, _SliceMemo] = field(default_factory=dict)
    _rules: tuple[object, ...] = ()
    _inventory: Inventory = field(default_factory=Inventory)
    _nodes: dict[str, _NodeMemo] = field(default_factory=dict)
    _index: dict[str, dict[str, int]] = field(default_factory=dict)  # node -> device name -> GPU index
    _index_version: int = 0
    # node -> the engine index of each MIG device offered there -> its milli-GPUs (Gpu.milli_gpus).
    _shares: dict[str, dict[int, int]] = field(default_factory=dict)
    _filters: dict[tuple[object, ...], DeviceFilter | str] = field(default_factory=dict)
    _jobs: dict[str, _JobMemo] = field(default_factory=dict)
    _holders: dict[str, tuple[tuple[object, ...], Job]] = field(default_factory=dict)
    # Per allocated claim: its cache entry, the (node, GPU indices) it holds and the UIDs it is reserved for.
    _allocations: dict[str, tuple[object, tuple[str, tuple[int, ...]] | None, set[str]]] = field(default_factory=dict)
    _allocations_version: tuple[int, int] = (-1, -1)
    # Per Node entry: its allocatable nvidia.com/gpu; the set of nodes with some, kept while it is the same.
    _plugins: dict[str, tuple[object, int, bool]] = field(default_factory=dict)
    # The Node objects last read, in the cache's order, and the answer from them.
    _plugin_objects: list[object] = field(default_factory=list)
    _plugin_answer: tuple[tuple[Node, ...], frozenset[str], frozenset[str], frozenset[str]] | None = None
    _sets: dict[str, frozenset[str]] = field(default_factory=dict)
    # _dra_pluginless's last answer: (inventory and index versions, the plugin answer it read, the answer).
    _pluginless_memo: tuple[tuple[int, int], object, frozenset[str]] | None = None
    # The largest share a device filter's devices count for (_charge), by the filter's key.
    _largest: dict[tuple[int, str], int] = field(default_factory=dict)
    # What the binds of the last snapshot need, by pod UID.
    plans: dict[str, ClaimPlan] = field(default_factory=dict)
    # The last cycle's shared claims' first pods, and a token that changes with them (a memo input).
    _first: dict[str, tuple[str, str]] = field(default_factory=dict)
    _first_token: object = field(default_factory=object)
    # Per job key: (the job and its pods as last read, the claims its pending pods name).
    _named: dict[str, tuple[tuple[object, ...], list[tuple[str, str, str, str]]]] = field(default_factory=dict)

    def apply(self, snapshot: Snapshot, objects: DraObjects) -> Snapshot:
        """``snapshot`` with DRA GPUs, the devices claims hold, and each pending claim pod's devices or reason."""
        pods, claims, classes = objects.pods, objects.claims, objects.classes
        pluginless, plugged, mig_plugged = self._plugin_nodes(snapshot.nodes, objects.nodes)
        if not objects.slices and not claims and not self._slices and not self._jobs and not pluginless:
            self.plans = {}
            return snapshot
        inventory = self._read_inventory(objects.slices, objects.rules)
        nodes = self._with_dra_gpus(snapshot.nodes, inventory, plugged | mig_plugged)
        by_name = {n.name: n for n in nodes}
        index = self._index
        # Which claim holds which GPUs (node, indices), and for whom.
        held: dict[str, tuple[str, tuple[int, ...]]] = {}
        reserved: dict[str, set[str]] = {}
        # Read again only for a claim whose cache entry changed, or when the devices' indices did.
        known = self._allocations if self._allocations_version == (inventory.version, self._index_version) else {}
        kept: dict[str, tuple[object, tuple[str, tuple[int, ...]] | None, set[str]]] = {}
        for key, claim in claims.items():
            entry = known.get(key)
            if entry is None or entry[0] is not claim:
                status = _d(claim.get("status"))
                allocation = _d(status.get("allocation"))
                if not allocation:
                    continue
                uids = {_s(_d(r).get("uid")) for r in (status.get("reservedFor") or ()) if _d(r).get("uid")}
                entry = (claim, self._claim_gpus(allocation, inventory), uids)
            kept[key] = entry
            if entry[1] is not None:
                held[key] = entry[1]
            reserved[key] = entry[2]
        self._allocations = kept
        self._allocations_version = (inventory.version, self._index_version)
        read = _Read(objects, inventory, held, reserved)
        read.gpu_class = (
            extended_classes(classes).get(RESOURCE_NVIDIA_GPU) if classes and objects.claims_readable else None
        )
        read.plugged = plugged
        read.pluginless = self._dra_pluginless(pluginless, plugged, inventory, objects.nodes, by_name)
        if read.gpu_class is not None:
            read.dra_nodes = self._stable(
                "dra", frozenset(name for name in inventory.by_node if name not in plugged and name in self._index)
            )
            for key, claim in claims.items():
                meta = _d(claim.get("metadata"))
                if _d(meta.get("annotations")).get(EXTENDED_ANNOTATION) == "true":
                    for owner in meta.get("ownerReferences") or ():
                        if _d(owner).get("controller") is True and _d(owner).get("kind") == "Pod":
                            read.extended_by_pod.setdefault(_s(_d(owner).get("uid")), []).append(key)
        # Whole-GPU pods must be told where a device plugin serves nvidia.com/gpu once a node with GPUs has
        # none, or once MIG devices are GPUs of the engine's (which only claims that select them take).
        read.extended_on = extended_on = (
            bool(read.pluginless) or (read.gpu_class is not None and bool(read.dra_nodes)) or bool(self._shares)
        )
        attributed: set[str] = set()
        jobs = list(snapshot.jobs)
        plans: dict[str, ClaimPlan] = {}
        seen: set[str] = set()
        candidates = [
            (i, job)
            for i, job in enumerate(jobs)
            if any(
                _has_claims(pods.get(t.uid))
                or (extended_on and t.gpus and t.status is TaskStatus.PENDING and not t.devices)
                for t in job.tasks
            )
        ]
        sharing = self._shared_claims(candidates, pods, read)
        for i, job in candidates:
            seen.add(job.key)
            inputs = (
                job,
                inventory.version,
                self._index_version,
                read.gpu_class,
                classes.get(read.gpu_class) if read.gpu_class is not None else None,
                read.dra_nodes,
                read.plugged,
                read.extended_on,
                *self._claim_inputs(job, pods, claims, classes),
                *(claims.get(k) for t in job.tasks for k in read.extended_by_pod.get(t.uid, ())),
                self._first_token if job.key in sharing else None,
            )
            memo = self._jobs.get(job.key)
            if (
                memo is None
                or len(memo.inputs) != len(inputs)
                or any(a is not b for a, b in zip(memo.inputs, inputs, strict=True))
            ):
                memo = self._judge(job, inputs, read)
                self._jobs[job.key] = memo
            jobs[i] = memo.judged
            plans.update(memo.plans)
            attributed.update(memo.attributed)
        if len(self._jobs) > len(seen):
            self._jobs = {k: m for k, m in self._jobs.items() if k in seen}
        self.plans = plans
        holders = self._holder_jobs(held, attributed, by_name, index)
        pools = {by_name[j.tasks[0].node].pool for j in holders if j.tasks and j.tasks[0].node in by_name}
        queues = snapshot.queues
        missing = [p for p in pools if external_queue_name(p) not in {q.name for q in queues}]
        if missing:
            queues = with_external_queues(queues, missing)
        return replace(snapshot, nodes=nodes, jobs=(*jobs, *holders), queues=queues)

    def _shared_claims(self, candidates: list[tuple[int, Job]], pods: Mapping[str, JSON], read: _Read) -> set[str]:
        """Which pending pod each unallocated claim several pending pods name is allocated for (``read.first``).

        kube-scheduler allocates such a claim for the first pod it schedules
        and only reserves it for the others; placing each pod on its own
        would give the claim two allocations. Returns the keys of the jobs
        that name such a claim (their verdicts depend on who is first).
        """
        users: dict[str, list[tuple[str, str, str]]] = {}
        kept: dict[str, tuple[tuple[object, ...], list[tuple[str, str, str, str]]]] = {}
        for _, job in candidates:
            # Per job, its pending pods' named claims, read again only when the job or a pod changed.
            inputs = (job, *(pods.get(t.uid) for t in job.tasks))
            memo = self._named.get(job.key)
            if (
                memo is None
                or len(memo[0]) != len(inputs)
                or any(a is not b for a, b in zip(memo[0], inputs, strict=True))
            ):
                named: list[tuple[str, str, str, str]] = []
                for task in job.tasks:
                    pod = pods.get(task.uid)
                    if task.status is not TaskStatus.PENDING or pod is None:
                        continue
                    for _, name, template in pod_claims(pod):
                        if name and not template:  # only a claim named by the pod can be shared
                            named.append((f"{job.namespace}/{name}", f"{job.namespace}/{task.name}", task.uid, job.key))
                memo = (inputs, named)
            kept[job.key] = memo
            for key, pod_name, uid, job_key in memo[1]:
                if key not in read.reserved:
                    users.setdefault(key, []).append((pod_name, uid, job_key))
        self._named = kept
        first: dict[str, tuple[str, str]] = {}
        sharing: set[str] = set()
        for key, sharers in users.items():
            if len(sharers) > 1:
                pod_name, uid, _ = min(sharers)
                first[key] = (pod_name, uid)
                sharing.update(job_key for _, _, job_key in sharers)
        if first != self._first:
            self._first, self._first_token = first, object()
        read.first = self._first
        return sharing

    def _plugin_nodes(
        self, nodes: tuple[Node, ...], raw: Mapping[str, JSON]
    ) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
        """Nodes with GPUs whose kubelet advertises no ``nvidia.com/gpu`` (no device plugin), those with one,
        and those whose device plugin hands out MIG devices (``nvidia.com/mig-*``, its mixed strategy).

        Read again only for Node entries that changed (the cache replaces an
        entry on every change).
        """
        known = self._plugins
        last = self._plugin_answer
        # The common cycle: the same Node objects, in the cache's order, and
        # the same engine nodes; checked at C speed, not node by node.
        seen = self._plugin_objects
        if (
            last is not None
            and last[0] is nodes
            and len(raw) == len(seen)
            and all(map(operator.is_, raw.values(), seen))
        ):
            return last[1], last[2], last[3]
        kept: dict[str, tuple[object, int, bool]] = {}
        for name, obj in raw.items():
            entry = known.get(name)
            if entry is None or entry[0] is not obj:
                entry = (obj, _plugin_gpus(obj), _plugin_migs(obj))
            kept[name] = entry
        self._plugins = kept
        plugged = self._stable("plugged", frozenset(name for name, (_, count, _) in kept.items() if count > 0))
        migs = self._stable("plugged-mig", frozenset(name for name, (_, _, mig) in kept.items() if mig))
        pluginless = frozenset(n.name for n in nodes if n.gpus and n.name in kept and n.name not in plugged)
        pluginless = self._stable("pluginless", pluginless)
        self._plugin_objects = list(raw.values())
        self._plugin_answer = (nodes, pluginless, plugged, migs)
        return pluginless, plugged, migs

    def _dra_pluginless(
        self,
        pluginless: frozenset[str],
        plugged: frozenset[str],
        inventory: Inventory,
        raw: Mapping[str, JSON],
        nodes: Mapping[str, Node],
    ) -> frozenset[str]:
        """``pluginless`` and the nodes given their GPUs by their slice alone (no GPUNode, no device plugin).

        Worked out again only when the inventory, the devices' indices or the
        Node objects' answer (:meth:`_plugin_nodes`) changed.
        """
        key = (inventory.version, self._index_version, self._plugin_answer)
        memo = self._pluginless_memo
        if memo is not None and memo[0] == key[:2] and memo[1] is key[2]:
            return memo[2]
        found = pluginless | frozenset(
            name
            for name in inventory.by_node
            if name not in plugged and name in raw and name in nodes and nodes[name].gpus
        )
        answer = self._stable("pluginless-dra", found)
        self._pluginless_memo = (key[:2], key[2], answer)
        return answer

    def _stable(self, what: str, value: frozenset[str]) -> frozenset[str]:
        """``value``, or the equal set handed out before: the job memos compare their inputs by identity."""
        before = self._sets.get(what)
        if before is not None and before == value:
            return before
        self._sets[what] = value
        return value

    # -- inventory ------------------------------------------------------------

    def _read_inventory(self, slices: Mapping[str, JSON], rules: Mapping[str, JSON]) -> Inventory:
        changed = len(slices) != len(self._slices) or any(
            (m := self._slices.get(k)) is None or m.obj is not obj for k, obj in slices.items()
        )
        rule_objs = tuple(rules[k] for k in sorted(rules))
        if (
            not changed
            and len(rule_objs) == len(self._rules)
            and all(a is b for a, b in zip(rule_objs, self._rules, strict=True))
        ):
            return self._inventory
        memos = {}
        for key, obj in slices.items():
            memo = self._slices.get(key)
            if memo is None or memo.obj is not obj:
                memo = _SliceMemo(obj, _slice_devices(obj))
            memos[key] = memo
        self._slices = memos
        self._rules = rule_objs
        newest: dict[tuple[str, str], int] = {}
        for memo in memos.values():
            k, generation = _pool_of(memo.obj)
            newest[k] = max(newest.get(k, generation), generation)
        inventory = Inventory(version=self._inventory.version + 1)
        rule_specs = [_d(_d(r).get("spec")) for r in rule_objs]
        for memo in memos.values():
            k, generation = _pool_of(memo.obj)
            if generation != newest.get(k):
                continue
            for device in memo.devices:
                extra = tuple(
                    DeviceTaint(
                        _s(_d(r.get("taint")).get("key")),
                        _s(_d(r.get("taint")).get("value")),
                        _s(_d(r.get("taint")).get("effect")),
                    )
                    for r in rule_specs
                    if _d(r.get("taint")).get("key") and _rule_applies(_d(r.get("deviceSelector")), device)
                )
                tainted = replace(device, taints=(*device.taints, *extra)) if extra else device
                inventory.by_node.setdefault(device.node, []).append(tainted)
                inventory.by_pool[(device.pool, device.name)] = tainted
        self._inventory = inventory
        return inventory

    def _with_dra_gpus(
        self, nodes: tuple[Node, ...], inventory: Inventory, plugged: frozenset[str]
    ) -> tuple[Node, ...]:
        """The nodes, those with DRA GPUs and no other GPUs given theirs, MIG devices added; each device's index kept.

        MIG devices become GPUs of the engine's only on a node whose kubelet
        has no device plugin serving ``nvidia.com/gpu`` or MIG devices
        (``nvidia.com/mig-*``): there every pod that takes a GPU does so
        through a claim, so none takes a MIG device it did not select.
        """
        out: list[Node] | None = None
        kept: dict[str, _NodeMemo] = {}
        changed = len(self._nodes) != sum(1 for n in nodes if inventory.by_node.get(n.name))
        for i, node in enumerate(nodes):
            devices = inventory.by_node.get(node.name)
            if not devices:
                continue
            allowed = node.name not in plugged
            memo = self._nodes.get(node.name)
            if memo is None or memo.node is not node or memo.devices is not devices or memo.migs_allowed != allowed:
                memo = self._node_memo(node, devices, allowed)
                changed = True
            kept[node.name] = memo
            if memo.converted is not node:
                if out is None:
                    out = list(nodes)
                out[i] = memo.converted
        self._nodes = kept
        if changed:
            index = {name: memo.index for name, memo in kept.items()}
            shares = {name: memo.shares for name, memo in kept.items() if memo.shares}
            if index != self._index or shares != self._shares:
                self._index_version += 1
            self._index = index
            self._shares = shares
        return nodes if out is None else tuple(out)

    @staticmethod
    def _node_memo(node: Node, devices: list[DraGpu], migs_allowed: bool) -> _NodeMemo:
        gpus = [d for d in devices if d.kind == "gpu"]
        migs = [d for d in devices if d.kind == "mig" and not d.counters] if migs_allowed else []
        converted = ClaimStage._convert(node, gpus, migs)
        by_uuid = {g.uuid: g.index for g in converted.gpus if g.uuid}
        unmatched = [d.name for d in (*gpus, *migs) if d.uuid not in by_uuid]
        if unmatched:
            warn.warning(
                "dra devices match no gpu of the node; not allocated",
                ("dra-unmatched", node.name),
                node=node.name,
                devices=unmatched[:8],
            )
        return _NodeMemo(
            node=node,
            devices=devices,
            migs_allowed=migs_allowed,
            converted=converted,
            index={d.name: by_uuid[d.uuid] for d in (*gpus, *migs) if d.uuid in by_uuid},
            shares={g.index: g.milli_gpus for g in converted.gpus if g.parent is not None},
        )

    @staticmethod
    def _convert(node: Node, gpus: list[DraGpu], migs: list[DraGpu]) -> Node:
        """``node`` with the driver's GPUs where it has none otherwise, and a GPU per MIG device (``Gpu.parent``).

        A MIG device's parent is the node's GPU with its ``parentUUID``; in
        static MIG the driver does not publish a GPU in MIG mode, so on a node
        with no GPUNode the parent is made from its devices (index from
        their names, memory their sum). The parent is in MIG mode: it takes
        nothing itself. Each MIG device counts for its share of the parent
        (:func:`gpuwarden.dra.mig_share`).
        """
        known = bool(node.gpus)
        made: list[Gpu] = list(node.gpus)
        if not known:
            taken: set[int] = set()
            for device in sorted(gpus, key=lambda d: d.name):
                minor = device_minor(device.name)
                index = minor if minor is not None else -1
                if index < 0 or index in taken:
                    index = max(taken, default=-1) + 1
                taken.add(index)
                made.append(Gpu(index=index, uuid=device.uuid, memory_mib=device.memory_mib or 1))
        if migs:
            made = ClaimStage._with_migs(made, migs, parent_memory_known=known)
        if not migs and known:
            return node
        return replace(node, gpus=tuple(sorted(made, key=lambda g: g.index)))

    @staticmethod
    def _with_migs(gpus: list[Gpu], migs: list[DraGpu], *, parent_memory_known: bool) -> list[Gpu]:
        by_uuid = {g.uuid: g for g in gpus if g.uuid}
        taken = {g.index for g in gpus}
        children: dict[str, list[DraGpu]] = {}
        for device in sorted(migs, key=lambda d: d.name):
            if device.uuid and device.parent_uuid:
                children.setdefault(device.parent_uuid, []).append(device)
        out = [g for g in gpus if g.uuid not in children]
        other = MIG_INDEX_OTHER
        for parent_uuid, devices in children.items():
            parent = by_uuid.get(parent_uuid)
            if parent is None:
                placed = mig_placement(devices[0].name)
                index = placed[0] if placed is not None and placed[0] not in taken else max(taken, default=-1) + 1
                taken.add(index)
                parent = Gpu(index=index, uuid=parent_uuid, memory_mib=sum(d.memory_mib for d in devices) or 1)
            out.append(replace(parent, mig_enabled=True))
            for device in devices:
                placed = mig_placement(device.name)
                index = MIG_INDEX + 16 * parent.index + placed[1] if placed is not None and placed[1] < 16 else -1
                if index < 0 or index in taken:
                    index, other = other, other + 1
                taken.add(index)
                # Rounded down, so that the devices of one GPU never count for more than it.
                share = mig_share(device.profile, device.memory_mib, parent.memory_mib if parent_memory_known else None)
                out.append(
                    Gpu(
                        index=index,
                        uuid=device.uuid,
                        memory_mib=device.memory_mib or 1,
                        healthy=parent.healthy,
                        parent=parent.index,
                        milli_gpus=max(1, int(share * MILLI)),
                        faulted_since=parent.faulted_since,
                    )
                )
        return out

    def _claim_gpus(self, allocation: Mapping[str, Any], inventory: Inventory) -> tuple[str, tuple[int, ...]] | None:
        """The node and GPU indices an allocation holds; None if none is known.

        A MIG device holds itself where it is a GPU of the engine's, else its parent.
        """
        node = ""
        found: set[int] = set()
        for item in _d(allocation.get("devices")).get("results") or ():
            result = _d(item)
            if result.get("driver") != DRIVER:
                continue
            device = inventory.by_pool.get((_s(result.get("pool")), _s(result.get("device"))))
            if device is None:
                continue
            node = device.node
            names = self._index.get(node, {})
            if device.name in names:  # a whole GPU, or a MIG device offered as a GPU of its own
                found.add(names[device.name])
            elif device.kind != "gpu":
                parent = next(
                    (d for d in inventory.by_node.get(node, ()) if d.kind == "gpu" and d.uuid == device.parent_uuid),
                    None,
                )
                if parent is not None and parent.name in names:
                    found.add(names[parent.name])
        return (node, tuple(sorted(found))) if node and found else None

    # -- pending and running pods ------------------------------------------------

    @staticmethod
    def _claim_inputs(
        job: Job, pods: Mapping[str, JSON], claims: Mapping[str, JSON], classes: Mapping[str, JSON]
    ) -> list[object]:
        out: list[object] = []
        for task in job.tasks:
            pod = pods.get(task.uid)
            out.append(pod)
            for _, name, _ in pod_claims(pod or {}):
                claim = claims.get(f"{job.namespace}/{name}") if name else None
                out.append(claim)
                for request in _d(_d(claim or {}).get("spec")).get("devices", {}).get("requests") or ():
                    out.append(classes.get(_s(_d(_d(request).get("exactly")).get("deviceClassName"))))
        return out

    def _judge(self, job: Job, inputs: tuple[object, ...], read: _Read) -> _JobMemo:
        pods = read.objects.pods
        tasks: list[Task] = []
        plans: dict[str, ClaimPlan] = {}
        attributed: set[str] = set()
        for task in job.tasks:
            pod = pods.get(task.uid)
            entries = pod_claims(pod or {})
            extended = (
                read.extended_on
                and task.gpus > 0
                and pod is not None
                and task.status is TaskStatus.PENDING
                and not _d(pod.get("spec")).get("resourceClaims")
            )
            if pod is None or not (_has_claims(pod) or extended):
                tasks.append(task)
                continue
            if task.status is not TaskStatus.PENDING:
                shares = self._shares.get(task.node or "", {})
                tasks.append(self._running(task, job.namespace, entries, read.held, attributed, shares=shares))
                continue
            if extended and not self._extended_done(task, job.namespace, entries, read):
                entries = [e for e in entries if e[2] != EXTENDED]
            try:
                if extended and not entries:
                    judged, plan = self._pending_extended(task, job.namespace, pod, read)
                else:
                    judged, plan = self._pending(task, job.namespace, entries, read)
            except _RefusedError as why:
                tasks.append(replace(task, unplaceable=str(why)))
                continue
            tasks.append(judged)
            if plan is None:
                continue
            plans[task.uid] = plan
        same = all(a is b for a, b in zip(tasks, job.tasks, strict=True))
        return _JobMemo(job, inputs, job if same else replace(job, tasks=tuple(tasks)), plans, frozenset(attributed))

    @staticmethod
    def _running(
        task: Task,
        namespace: str,
        entries: list[tuple[str, str | None, str]],
        held: Mapping[str, tuple[str, tuple[int, ...]]],
        attributed: set[str],
        *,
        shares: Mapping[int, int],
    ) -> Task:
        """A bound pod of ours holds its claims' devices on its node (the allocation says which GPUs).

        Until the view shows its claims allocated (the claims' watch may be
        behind the pods'), it holds the GPUs its bind recorded (the
        assignment annotation), so that no one else is given them meanwhile.
        """
        indices: set[int] = set()
        for _, name, _ in entries:
            key = f"{namespace}/{name}"
            found = held.get(key) if name else None
            if found is not None and found[0] == task.node:
                indices.update(found[1])
                attributed.add(key)
        if not indices:
            indices.update(task.gpu_indices)
        if not indices:
            return task
        return replace(
            task,
            gpus=max(task.gpus, len(indices)),
            gpu_indices=tuple(sorted(indices)),
            gpu_milli=_held_milli(indices, shares),
            claimed=True,
        )

    def _pending(
        self, task: Task, namespace: str, entries: list[tuple[str, str | None, str]], read: _Read
    ) -> tuple[Task, ClaimPlan]:
        claims, classes, inventory = read.objects.claims, read.objects.classes, read.inventory
        reserved = read.reserved
        if not read.objects.claims_readable:
            raise _RefusedError(
                "ResourceClaims cannot be listed (not served, or the scheduler's RBAC refuses it): which devices "
                "claims hold is unknown, so gpuwarden allocates none"
            )
        if task.gpus and any(template != EXTENDED for _, _, template in entries):
            raise _RefusedError(
                "the pod asks for nvidia.com/gpu and for DRA resource claims; gpuwarden places one or the other"
            )
        to_write: list[ClaimToWrite] = []
        requests: list[_Request] = []
        # matchAttribute: the attribute, and the positions in ``requests`` of the requests it binds.
        constraints: list[tuple[str, frozenset[int]]] = []
        pinned: str | None = None
        for entry, name, template in entries:
            if name is None:
                raise _RefusedError(
                    f"waiting for the ResourceClaim of pod claim {entry!r} (template {template}) to be created "
                    "by the resourceclaim controller"
                )
            key = f"{namespace}/{name}"
            claim = claims.get(key)
            ident = f"resourceclaim {name}"
            if claim is None:
                raise _RefusedError(f"{ident} not found")
            meta = _d(claim.get("metadata"))
            if meta.get("deletionTimestamp"):
                raise _RefusedError(f"{ident} is being deleted")
            if template == EXTENDED and _d(meta.get("annotations")).get(EXTENDED_ANNOTATION) != "true":
                raise _RefusedError(f"{ident} named in the pod's extendedResourceClaimStatus is no such claim")
            if template and not any(
                _d(o).get("uid") == task.uid and _d(o).get("controller") is True
                for o in (meta.get("ownerReferences") or ())
            ):
                raise _RefusedError(f"{ident} was not created for this pod")
            status = _d(claim.get("status"))
            allocation = _d(status.get("allocation"))
            base = ClaimToWrite(namespace, name, _s(meta.get("uid")))
            if allocation:
                node = self._allocation_node(allocation, ident)
                if pinned is not None and node != pinned:
                    raise _RefusedError(f"{ident} is allocated on node {node}, another of the pod's claims on {pinned}")
                pinned = node
                mine = task.uid in reserved.get(key, set())
                if not mine and len(reserved.get(key, ())) >= MAX_RESERVED:
                    raise _RefusedError(f"{ident} is reserved for {MAX_RESERVED} consumers already")
                # Its devices stay held as every allocated claim's are (by the placeholder on its
                # node) until the pod runs: the pod asks the engine only for the GPUs of the
                # claims still to allocate, on that node.
                to_write.append(replace(base, reserve_only=not mine, done=mine))
                continue
            first = read.first.get(key)
            if first is not None and first[1] != task.uid:
                raise _RefusedError(
                    f"{ident} is shared with pending pod {first[0]}, for which it is allocated first; this pod "
                    "is added to it once it is (a gang whose pods share one unallocated claim cannot be placed)"
                )
            claim_requests = _read_requests(claim, ident, classes)
            at = {r.name: len(requests) + k for k, r in enumerate(claim_requests)}
            requests.extend(claim_requests)
            for attribute, names in _constraints(claim):
                bound = at.values() if names is None else (at[n] for n in names if n in at)
                constraints.append((attribute, frozenset(bound)))
            to_write.append(
                replace(
                    base,
                    requests=tuple(RequestPlan(r.name, r.count, r.tolerations, r.class_config) for r in claim_requests),
                    claim_config=tuple(_d(c) for c in (_d(_d(claim.get("spec")).get("devices")).get("config") or ())),
                )
            )
        count = sum(r.count for r in requests)
        placement = task.placement
        if pinned is not None:
            term = (NodeTerm(fields=(Requirement("metadata.name", "In", (pinned,)),)),)
            placement = with_volume_terms(placement, (*(placement.volume_terms if placement else ()), term))
        devices: DeviceFilter | None = None
        if count:
            devices = self._filter(requests, constraints, inventory, pinned)
        plan = ClaimPlan(
            pod=task.name,
            namespace=namespace,
            uid=task.uid,
            claims=tuple(to_write),
            devices=self._device_names(inventory, devices.nodes if devices else ()),
            choices=devices.choices if devices else {},
        )
        return replace(
            task, gpus=count, devices=devices, placement=placement, gpu_milli=self._charge(devices, count)
        ), plan

    def _charge(self, devices: DeviceFilter | None, count: int) -> int | None:
        """What a pending claim pod is charged when its claims may be given MIG devices: the largest share, per device.

        None (1000 per GPU) when they may be given only whole GPUs. A pod
        given a smaller device than the largest it could have is charged its
        own once it runs (:meth:`_running`).
        """
        if devices is None or not self._shares:
            return None
        key = (self._index_version, devices.key)
        largest = self._largest.get(key)
        if largest is None:
            largest = 0
            for node, allowed in devices.nodes.items():
                shares = self._shares.get(node, {})
                largest = max(largest, *(shares.get(i, MILLI) for i in allowed), 0)
            if len(self._largest) > 4096:
                self._largest.clear()
            self._largest[key] = largest
        return count * largest if 0 < largest < MILLI else None

    @staticmethod
    def _extended_done(task: Task, namespace: str, entries: list[tuple[str, str | None, str]], read: _Read) -> bool:
        """Whether the claim the pod's status names for its extended resources is allocated and reserved for it."""
        for _, name, template in entries:
            if template == EXTENDED:
                key = f"{namespace}/{name}"
                return key in read.held and task.uid in read.reserved.get(key, set())
        return False

    def _pending_extended(
        self, task: Task, namespace: str, pod: Mapping[str, Any], read: _Read
    ) -> tuple[Task, ClaimPlan | None]:
        """A pod's ``nvidia.com/gpu``: any GPU where a device plugin serves it, a device of the class where DRA does.

        With no class serving it through DRA, only the device plugin's nodes:
        a kubelet without the plugin refuses the pod (the node's GPUs, which
        the agent's GPUNode lists, are not the kubelet's to give).
        """
        if read.gpu_class is None or not read.dra_nodes:
            devices = DeviceFilter(key="device-plugin", nodes={}, plain=read.plugged)
            return replace(task, devices=devices), None
        requests, mappings = extended_requests(pod, RESOURCE_NVIDIA_GPU)
        if sum(n for _, n in requests) != task.gpus:
            # The claim's total is the pod's effective request by construction; a pod read
            # otherwise here than in its conversion is not one to write a claim for.
            raise _RefusedError(
                f"the claim for {RESOURCE_NVIDIA_GPU} would hold {sum(n for _, n in requests)} devices, "
                f"the pod asks for {task.gpus}"
            )
        device_class = read.objects.classes[read.gpu_class]
        class_spec = _d(device_class.get("spec"))
        request = _Request(
            "extended",
            task.gpus,
            _expressions(class_spec.get("selectors"), f"deviceclass {read.gpu_class}"),
            (),
            tuple(_d(c) for c in (class_spec.get("config") or ())),
        )
        found = self._filter([request], [], read.inventory, None, only=read.dra_nodes)
        devices = DeviceFilter(
            key=f"{found.key}|extended", nodes=found.nodes, plain=read.plugged, choices=found.choices
        )
        stale = tuple(k.split("/", 1)[1] for k in read.extended_by_pod.get(task.uid, ()))
        plan = ClaimPlan(
            pod=task.name,
            namespace=namespace,
            uid=task.uid,
            claims=(),
            devices=self._device_names(read.inventory, devices.nodes),
            extended=ExtendedClaim(
                RESOURCE_NVIDIA_GPU, read.gpu_class, request.class_config, requests, mappings, stale
            ),
            choices=found.choices,
        )
        return replace(task, devices=devices, gpu_milli=self._charge(devices, task.gpus)), plan

    def _device_names(self, inventory: Inventory, nodes: Iterable[str]) -> dict[str, dict[int, tuple[str, str]]]:
        out: dict[str, dict[int, tuple[str, str]]] = {}
        for node in nodes:
            names = self._index.get(node, {})
            out[node] = {names[d.name]: (d.pool, d.name) for d in inventory.by_node.get(node, ()) if d.name in names}
        return out

    def _allocation_node(self, allocation: Mapping[str, Any], ident: str) -> str:
        try:
            terms = node_terms(allocation.get("nodeSelector"), f"{ident} status.allocation.nodeSelector")
        except UnreadableError as err:
            raise _RefusedError(str(err)) from None
        for term in terms:
            for requirement in (*term.fields, *term.expressions):
                if (
                    requirement.operator == "In"
                    and len(requirement.values) == 1
                    and requirement.key
                    in (
                        "metadata.name",
                        "kubernetes.io/hostname",
                    )
                ):
                    return requirement.values[0]
        raise _RefusedError(f"{ident} is allocated with a node selector gpuwarden cannot follow (not one node)")

    def _filter(
        self,
        requests: list[_Request],
        constraints: list[tuple[str, frozenset[int]]],
        inventory: Inventory,
        pinned: str | None,
        *,
        only: frozenset[str] | None = None,
    ) -> DeviceFilter:
        key = (
            inventory.version,
            self._index_version,
            only,
            pinned,
            tuple(constraints),
            tuple((r.expressions, tuple(tuple(sorted(t.items())) for t in r.tolerations)) for r in requests),
        )
        cached = self._filters.get(key)
        if isinstance(cached, str):
            raise _RefusedError(cached)
        if cached is not None:
            return cached
        try:
            found = self._compute(requests, constraints, inventory, pinned, only=only)
        except _RefusedError as why:
            self._filters[key] = str(why)
            raise
        if len(self._filters) > 4096:
            self._filters.clear()
        self._filters[key] = found
        return found

    def _compute(
        self,
        requests: list[_Request],
        constraints: list[tuple[str, frozenset[int]]],
        inventory: Inventory,
        pinned: str | None,
        *,
        only: frozenset[str] | None,
    ) -> DeviceFilter:
        nodes: dict[str, frozenset[int]] = {}
        choices: dict[str, DeviceChoices] = {}
        for node, devices in inventory.by_node.items():
            if (pinned is not None and node != pinned) or (only is not None and node not in only):
                continue
            names = self._index.get(node, {})
            whole = [(names[d.name], d) for d in devices if d.name in names and not d.counters]
            # Each request's own devices: kube-scheduler's allocator matches requests one by one.
            sets = [frozenset(i for i, d in whole if _allowed(d, r)) for r in requests]
            usable = [(i, d) for i, d in whole if any(i in chosen for chosen in sets)]
            alternatives: list[DeviceRequests] = []
            # One group per constraint, each combination an alternative (a node's few devices keep it small).
            for groups in product(*(_groups(usable, attribute) for attribute, _ in constraints)):
                wanted = tuple(
                    (
                        r.count,
                        allowed.intersection(
                            *(g for g, (_, bound) in zip(groups, constraints, strict=True) if k in bound)
                        ),
                    )
                    for k, (r, allowed) in enumerate(zip(requests, sets, strict=True))
                )
                if all(len(allowed) >= count for count, allowed in wanted):
                    alternatives.append(wanted)
            if not alternatives:
                continue
            nodes[node] = frozenset().union(*(allowed for wanted in alternatives for _, allowed in wanted))
            distinct = {allowed for _, allowed in alternatives[0]}
            if len(alternatives) > 1 or len(distinct) > 1:
                # One set per node would be wrong here: which GPU goes to which request matters.
                choices[node] = tuple(alternatives)
        if not nodes and requests and only is None:
            raise _RefusedError(
                "no GPU or MIG device of NVIDIA's DRA driver matches the claims' device classes and selectors"
                + (f" on node {pinned}" if pinned else "")
                + " (gpuwarden allocates the devices of gpu.nvidia.com, MIG devices only on nodes without a "
                "device plugin, and no partitionable device (dynamic MIG); leave claims for those and for other "
                "drivers' devices to kube-scheduler)"
            )
        # With what the sets hold: a remembered "no room" for the pods of one key
        # (scheduler.engine.backlog) must not outlive the device sets it was judged on.
        content = hash((frozenset(nodes.items()), frozenset(choices.items())))
        text = repr((pinned, constraints, [(r.count, r.expressions, r.tolerations) for r in requests], content))
        return DeviceFilter(key=text, nodes=nodes, choices=choices)

    # -- devices held by claims no pod of ours holds -------------------------------

    def _holder_jobs(
        self,
        held: Mapping[str, tuple[str, tuple[int, ...]]],
        attributed: set[str],
        nodes: Mapping[str, Node],
        index: Mapping[str, Mapping[str, int]],
    ) -> list[Job]:
        by_node: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
        for key, (node, indices) in held.items():
            if key not in attributed and node in nodes:
                by_node.setdefault(node, []).append((key, indices))
        kept: dict[str, tuple[tuple[object, ...], Job]] = {}
        out: list[Job] = []
        for node, entries in sorted(by_node.items()):
            entries.sort()
            inputs = (nodes[node].pool, self._index_version, *entries)
            memo = self._holders.get(node)
            if memo is None or memo[0] != inputs:
                tasks = tuple(
                    Task(
                        name=f"claim:{key}",
                        namespace="",
                        uid=f"claim:{key}",
                        status=TaskStatus.RELEASING,
                        gpus=len(indices),
                        node=node,
                        gpu_indices=indices,
                        gpu_milli=_held_milli(indices, self._shares.get(node, {})),
                    )
                    for key, indices in entries
                )
                memo = (
                    inputs,
                    Job(
                        name=f"{DRA_JOB_PREFIX}{node}",
                        queue=external_queue_name(nodes[node].pool),
                        namespace="",
                        priority=NON_PREEMPTIBLE_PRIORITY,
                        preemptible=False,
                        tasks=tasks,
                    ),
                )
            kept[node] = memo
            out.append(memo[1])
        self._holders = kept
        return out


def _held_milli(indices: Iterable[int], shares: Mapping[int, int]) -> int | None:
    """What a pod holding these GPUs is charged when some are MIG devices (their shares); None for whole GPUs only."""
    if not shares:
        return None
    found = [shares.get(i, MILLI) for i in indices]
    return sum(found) if any(i in shares for i in indices) else None


def _plugin_migs(node: Mapping[str, Any] | None) -> bool:
    """Whether the node's device plugin hands out MIG devices (any allocatable ``nvidia.com/mig-<profile>``)."""
    allocatable = _d(_d(_d(node).get("status")).get("allocatable"))
    return any(
        isinstance(name, str) and name.startswith(_MIG_RESOURCE_PREFIX) and str(value) not in ("0", "")
        for name, value in allocatable.items()
    )


def _plugin_gpus(node: Mapping[str, Any] | None) -> int:
    """The node's allocatable ``nvidia.com/gpu`` (a device plugin's); 0 where none is advertised."""
    raw = _d(_d(_d(node).get("status")).get("allocatable")).get(RESOURCE_NVIDIA_GPU)
    try:
        return int(str(raw)) if raw is not None else 0
    except ValueError:
        return 0


def extended_requests(
    pod: Mapping[str, Any], resource: str
) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, str], ...]]:
    """The requests of the claim kube-scheduler would make for ``resource`` (KEP-5004), and the pod's mappings.

    Returns (request name, count) in the claim's order (by name) and
    (container, request name) in ``status.extendedResourceClaimStatus``'s
    order, both as kube-scheduler's DynamicResources plugin builds them:

    - A request is named ``container-<i>-request-<r>``: ``i`` counts init
      containers first, then containers; ``r`` is the resource's place among
      all the container's requests, in name order.
    - Containers that run to the pod's end (the containers and the sidecars,
      init containers with ``restartPolicy: Always``) each get a request of
      their own count, mapped to them.
    - A one-shot init container runs before the containers that follow it
      start, so it first reuses their devices: it is mapped to the requests
      of the long-lived containers from its own index on, in order, until
      their counts cover its own; for what they leave short it asks a
      request of its own.
    - Of the one-shot init containers' own requests only the largest is
      made (they run one after another), and each init container mapped to
      another is mapped to it instead.

    The total is the pod's effective request (the largest init container's
    need beside the sidecars started before it, or the long-lived sum),
    which is what the engine places. Requests are read as upstream reads
    them, after the API server's defaulting.
    """
    spec = _d(pod.get("spec"))
    inits = [_d(c) for c in spec.get("initContainers") or ()]
    containers = [*inits, *(_d(c) for c in spec.get("containers") or ())]

    def own(index: int, container: Mapping[str, Any]) -> tuple[str, int] | None:
        resources = _d(container.get("resources"))
        # The API server copies each limit into a missing request; an object read before
        # defaulting is read as it would be after.
        requests = {**_d(resources.get("limits")), **_d(resources.get("requests"))}
        if resource not in requests:
            return None
        try:
            count = int(str(requests[resource]))
        except ValueError:
            raise _RefusedError(f"container {_s(container.get('name'))!r}: {resource} {requests[resource]!r}") from None
        if count <= 0:
            return None
        return f"container-{index}-request-{sorted(requests).index(resource)}", count

    long_lived: dict[int, tuple[str, int]] = {}
    mappings: list[tuple[str, str]] = []
    one_shot: list[int] = []
    for i, container in enumerate(containers):
        if i < len(inits) and container.get("restartPolicy") != "Always":
            one_shot.append(i)
            continue
        made = own(i, container)
        if made is not None:
            long_lived[i] = made
            mappings.append((_s(container.get("name")), made[0]))
    init_mappings: list[tuple[str, str]] = []
    largest: tuple[str, int] | None = None
    init_names: set[str] = set()
    for i in one_shot:
        container = containers[i]
        asked = own(i, container)
        if asked is None:
            continue
        name = _s(container.get("name"))
        reused = 0
        for j in sorted(k for k in long_lived if k >= i):
            reused += long_lived[j][1]
            init_mappings.append((name, long_lived[j][0]))
            if reused >= asked[1]:
                break
        if reused >= asked[1]:
            continue
        extra = (asked[0], asked[1] - reused)
        init_mappings.append((name, extra[0]))
        init_names.add(extra[0])
        if largest is None or largest[1] < extra[1]:
            largest = extra
    requests = list(long_lived.values())
    if largest is not None:
        requests.append(largest)
        init_mappings = [(c, largest[0] if r in init_names else r) for c, r in init_mappings]
    return tuple(sorted(requests)), (*mappings, *init_mappings)


def _has_claims(pod: Mapping[str, Any] | None) -> bool:
    """Whether the pod uses claims: its own (``spec.resourceClaims``) or the one made for its extended resources."""
    if pod is None:
        return False
    spec, status = pod.get("spec"), pod.get("status")
    return (isinstance(spec, dict) and bool(spec.get("resourceClaims"))) or (
        isinstance(status, dict) and bool(status.get("extendedResourceClaimStatus"))
    )
