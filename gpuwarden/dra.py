"""NVIDIA's DRA devices as the API shows them: read from ResourceSlices, DeviceTaintRules and ResourceClaims.

Shared by the scheduler's device taints (scheduler/remediation/devicetaints.py)
and the kubectl plugin's views, which read the same objects: plain JSON in,
dataclasses out, no I/O, never raising on a malformed object (a device that
cannot be read is left out; a field that cannot be read is empty).

The shapes are resource.k8s.io/v1's and those NVIDIA's DRA driver
(kubernetes-sigs/dra-driver-nvidia-gpu) publishes: one pool per node, named
after it; a device per GPU (``gpu-<minor>``) and per MIG device, whose
attributes include ``uuid``, ``type`` (``gpu``, ``mig``), for MIG devices
``parentUUID`` and ``profile``, and ``resource.kubernetes.io/pciBusID``.
Only the newest generation of a pool counts: slices of an older one are
being replaced.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuwarden import contract


@dataclass(frozen=True, slots=True)
class Taint:
    """A device taint: the driver's own in its slice (``rule`` empty), or one a DeviceTaintRule adds (its name)."""

    key: str
    value: str
    effect: str
    rule: str = ""
    # ``timeAdded`` as written (RFC 3339; the API server fills it in when the writer did not).
    # Not part of a taint's identity: the same taint read twice is the same taint.
    time_added: str = field(default="", compare=False)

    def describe(self) -> str:
        text = f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"
        return f"{text} (rule {self.rule})" if self.rule else text


@dataclass(frozen=True, slots=True)
class Device:
    """One device of the driver's slices: where it is (driver, pool, name), which GPU it is or is carved from."""

    driver: str
    pool: str
    name: str
    uuid: str
    kind: str = ""  # the driver's ``type`` attribute: gpu, mig, vfio
    parent_uuid: str = ""
    pci_bus: str = ""
    profile: str = ""
    # The driver's own taints (in the slice), never a rule's.
    taints: tuple[Taint, ...] = ()


def _d(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _s(value: object) -> str:
    return value if isinstance(value, str) else ""


def _taints(raw: object) -> tuple[Taint, ...]:
    out = []
    for item in raw if isinstance(raw, list) else ():
        entry = _d(item)
        if _s(entry.get("key")) and _s(entry.get("effect")):
            out.append(
                Taint(
                    _s(entry.get("key")),
                    _s(entry.get("value")),
                    _s(entry.get("effect")),
                    time_added=_s(entry.get("timeAdded")),
                )
            )
    return tuple(out)


def device_minor(name: str) -> int | None:
    """The minor number a whole-GPU device's name gives (``gpu-3`` is 3); None for a MIG device or any other name.

    NVIDIA's driver names a GPU's device after its ``/dev/nvidia<minor>``;
    on a node with no GPUNode to match UUIDs against, that minor is the GPU's index.
    """
    prefix, _, number = name.rpartition("-")
    return int(number) if prefix == "gpu" and number.isdigit() else None


# ``gpu-<minor>-mig-<profile without dots>-<GPU instance profile ID>-<placement start>``, as the driver names
# a MIG device (MigSpecTuple.ToCanonicalName).
_MIG_NAME = re.compile(r"gpu-(\d+)-mig-.+-(\d+)-(\d+)")
_PROFILE_SLICES = re.compile(r"(\d+)g\.")
# Compute slices of a GPU that MIG divides (A100, H100, H200, B200); a device's profile
# (``3g.40gb``) says how many it has.
MIG_COMPUTE_SLICES = 7


def mig_placement(name: str) -> tuple[int, int] | None:
    """(parent's minor, placement start) that a MIG device's name gives (``gpu-0-mig-1g10gb-19-3``); None otherwise."""
    match = _MIG_NAME.fullmatch(name)
    return None if match is None else (int(match.group(1)), int(match.group(3)))


def mig_share(profile: str, memory_mib: int, parent_memory_mib: int | None) -> float:
    """The share of its GPU a MIG device is, between 0 and 1, for counting it in quotas and capacity.

    Its memory over its parent's where the parent's memory is known (the
    agent's GPUNode says it); else its compute slices over
    :data:`MIG_COMPUTE_SLICES` (``3g.40gb`` is 3/7 of an H100); else a whole GPU.
    """
    if parent_memory_mib and memory_mib > 0:
        return min(1.0, memory_mib / parent_memory_mib)
    match = _PROFILE_SLICES.match(profile)
    if match is not None and int(match.group(1)) > 0:
        return min(1.0, int(match.group(1)) / MIG_COMPUTE_SLICES)
    return 1.0


def pci_bus(address: str) -> str:
    """A PCI address in one form: NVML's 8-digit domain and the kernel's 4-digit one compare equal."""
    domain, sep, rest = address.strip().lower().rpartition(":")
    if not sep:
        return address.strip().lower()
    head, _, bus = domain.rpartition(":")
    try:
        return f"{int(head or '0', 16):04x}:{bus}:{rest}"
    except ValueError:
        return address.strip().lower()


def devices_by_node(
    slices: Iterable[Mapping[str, Any]], driver: str = contract.NVIDIA_DRA_DRIVER
) -> dict[str, list[Device]]:
    """The driver's devices per node, in slice order, from the newest generation of each pool only."""
    newest: dict[tuple[str, str], int] = {}
    usable: list[tuple[str, str, int, Mapping[str, Any]]] = []
    for obj in slices:
        spec = _d(obj.get("spec"))
        pool = _d(spec.get("pool"))
        node, pool_name = _s(spec.get("nodeName")), _s(pool.get("name"))
        if spec.get("driver") != driver or not node or not pool_name:
            continue
        generation = pool.get("generation")
        generation = generation if isinstance(generation, int) and not isinstance(generation, bool) else 0
        newest[(node, pool_name)] = max(newest.get((node, pool_name), generation), generation)
        usable.append((node, pool_name, generation, spec))
    found: dict[str, list[Device]] = {}
    for node, pool_name, generation, spec in usable:
        if generation != newest[(node, pool_name)]:
            continue
        for item in spec.get("devices") or ():
            entry = _d(item)
            if not _s(entry.get("name")):
                continue
            attributes = _d(entry.get("attributes"))

            def attribute(name: str, attributes: Mapping[str, Any] = attributes) -> str:
                return _s(_d(attributes.get(name)).get("string"))

            found.setdefault(node, []).append(
                Device(
                    driver=driver,
                    pool=pool_name,
                    name=_s(entry.get("name")),
                    uuid=attribute("uuid"),
                    kind=attribute("type"),
                    parent_uuid=attribute("parentUUID"),
                    pci_bus=attribute("resource.kubernetes.io/pciBusID"),
                    profile=attribute("profile"),
                    taints=_taints(entry.get("taints")),
                )
            )
    return found


def rule_taints(rules: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str], list[Taint]]:
    """The taints DeviceTaintRules add, by the (driver, pool, device) they name.

    Only rules that name all three are read: a rule that leaves any out
    selects more than one device (all of a pool, a driver, or the cluster),
    which is shown by ``broad_rules`` rather than spread over every device.
    """
    out: dict[tuple[str, str, str], list[Taint]] = {}
    for rule in rules:
        spec = _d(rule.get("spec"))
        selector = _d(spec.get("deviceSelector"))
        key = (_s(selector.get("driver")), _s(selector.get("pool")), _s(selector.get("device")))
        taint = _d(spec.get("taint"))
        if all(key) and _s(taint.get("key")) and _s(taint.get("effect")):
            name = _s(_d(rule.get("metadata")).get("name"))
            out.setdefault(key, []).append(
                Taint(_s(taint.get("key")), _s(taint.get("value")), _s(taint.get("effect")), name)
            )
    return out


def broad_rules(rules: Iterable[Mapping[str, Any]]) -> list[str]:
    """The DeviceTaintRules that do not name one device (a driver, a pool or nothing at all): each may taint many."""
    out = []
    for rule in rules:
        selector = _d(_d(rule.get("spec")).get("deviceSelector"))
        if not all(_s(selector.get(k)) for k in ("driver", "pool", "device")):
            out.append(_s(_d(rule.get("metadata")).get("name")))
    return sorted(out)


def claim_holders(claims: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str], list[str]]:
    """Which ResourceClaims (``namespace/name``) hold each device, by (driver, pool, device), from their allocation."""
    out: dict[tuple[str, str, str], list[str]] = {}
    for claim in claims:
        meta = _d(claim.get("metadata"))
        name = f"{_s(meta.get('namespace'))}/{_s(meta.get('name'))}"
        allocation = _d(_d(claim.get("status")).get("allocation"))
        results = _d(allocation.get("devices")).get("results")
        for item in results if isinstance(results, list) else ():
            result = _d(item)
            key = (_s(result.get("driver")), _s(result.get("pool")), _s(result.get("device")))
            if all(key):
                out.setdefault(key, []).append(name)
    return out
