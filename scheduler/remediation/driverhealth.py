"""NVIDIA's DRA driver's health taints, read as faults of the GPUs they are on.

NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu) watches NVML
itself and taints the device of a GPU that fails, in its ResourceSlice:

- ``gpu.nvidia.com/xid=<XID>``: ``NoSchedule`` when the driver calls the
  XID fatal, ``None`` when it skips it as an application's error;
- ``gpu.nvidia.com/gpu-lost:NoSchedule``: the GPU fell off the bus;
- ``gpu.nvidia.com/unmonitored:None``: the driver cannot watch the GPU.

kube-scheduler and every allocator built on it keep new claims off a
``NoSchedule`` device, but nothing repairs it, and the taint stays until the
driver's kubelet plugin restarts. Remediation reads these taints as faults,
beside the agent's conditions, so a GPU the driver took out is drained,
repaired and validated like one the agent reported:

- an XID taint that takes the device out is a ``GpuXidError`` fault
  (reason ``Xid<N>``) with the XID catalogue's action
  (:mod:`gpuwarden.xid_catalogue`) when the catalogue calls it a hardware
  XID; one the catalogue calls an application's error, or does not know, is
  a GPU reset: the driver took the device out of every DRA allocator's
  hands, and a reset and a validation are the least that says it is sound;
- ``gpu-lost`` is ``GpuMissing``/``GpuLost``, a reboot, as the agent judges a
  GPU fallen off the bus;
- a ``None`` taint, and ``unmonitored``, are news, not faults.

A taint names its device; the fault names the node's GPU whose UUID the
device carries (a MIG device's parent), or, on a node whose GPUs are known
by no UUID (no GPUNode), the device's minor (``gpu-<minor>``), as the
claim stage counts them. ``since`` is the taint's ``timeAdded``: a taint
from before a repair is the old fault, not the fault come back, so after
gpuwarden's validation the GPU returns although the driver still shows the
taint (see the README's DRA section for what that means for other
schedulers). A fault the agent reports as well (same condition, reason and
GPU) is counted once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuwarden import contract
from gpuwarden.contract import Action, ConditionType, Reason
from gpuwarden.dra import Device, Taint, device_minor, devices_by_node
from gpuwarden.timefmt import parse_epoch
from gpuwarden.xid_catalogue import XidKind, lookup
from scheduler.remediation.model import DRA_DRIVER_REPORT, Fault
from scheduler.remediation.observations import GpuIdentity

TAINT_XID = f"{contract.NVIDIA_DRA_DRIVER}/xid"
TAINT_GPU_LOST = f"{contract.NVIDIA_DRA_DRIVER}/gpu-lost"
HEALTH_KEYS = frozenset({TAINT_XID, TAINT_GPU_LOST})
# The effects that take a device out of allocation (None only informs).
_OUT = frozenset({"NoSchedule", "NoExecute"})
# Catalogue actions that repair a GPU; anything less (none, restart the application) is not enough for a device
# the driver took out.
_REPAIRS = frozenset({Action.RESET_GPU, Action.REBOOT, Action.REPLACE})


def _d(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


class DriverTaints:
    """The driver's health-tainted devices per node, read again only from the slices that changed.

    One per remediation worker. :meth:`update` takes the view's slices on
    every pass; a slice whose resourceVersion did not change is not parsed
    again, so a pass costs a look at each slice's version, not a parse of
    every device.
    """

    def __init__(self) -> None:
        # Per slice name: (resourceVersion, node) as last read.
        self._slices: dict[str, tuple[str, str]] = {}
        # Per node: its devices that carry a driver health taint (nodes with none are absent).
        self._tainted: dict[str, tuple[Device, ...]] = {}

    def update(self, slices: Mapping[str, Mapping[str, Any]]) -> Mapping[str, tuple[Device, ...]]:
        """The health-tainted devices of each node, from ``slices`` (the view's ResourceSlices by name)."""
        seen: dict[str, tuple[str, str]] = {}
        moved: set[str] = set()
        for name, obj in slices.items():
            version = str(_d(obj.get("metadata")).get("resourceVersion") or "")
            node = str(_d(obj.get("spec")).get("nodeName") or "")
            seen[name] = (version, node)
            before = self._slices.get(name)
            if before != (version, node):
                moved.add(node)
                if before is not None:
                    moved.add(before[1])
        for name in self._slices.keys() - seen.keys():
            moved.add(self._slices[name][1])
        self._slices = seen
        moved.discard("")
        if moved:
            found = devices_by_node(obj for name, obj in slices.items() if seen[name][1] in moved)
            for node in moved:
                tainted = tuple(d for d in found.get(node, ()) if any(t.key in HEALTH_KEYS for t in d.taints))
                if tainted:
                    self._tainted[node] = tainted
                else:
                    self._tainted.pop(node, None)
        return self._tainted


def _minor(device: Device) -> int | None:
    return device_minor(device.name) if not device.parent_uuid else None


def driver_faults(devices: Iterable[Device], gpus: Sequence[GpuIdentity]) -> tuple[Fault, ...]:
    """The faults the driver's health taints on ``devices`` (one node's) stand for, one per GPU and kind."""
    by_uuid = {g.uuid: g.index for g in gpus if g.uuid}
    out: dict[str, Fault] = {}
    for device in devices:
        uuid = device.parent_uuid or device.uuid
        index = by_uuid.get(uuid) if by_uuid else _minor(device)
        if index is None:
            continue  # a device of no GPU we know: tainting a guess would repair the wrong GPU
        for taint in device.taints:
            fault = _fault(device, taint, index, uuid)
            if fault is not None:
                out.setdefault(fault.key, fault)
    return tuple(out.values())


def _fault(device: Device, taint: Taint, index: int, uuid: str) -> Fault | None:
    if taint.effect not in _OUT or taint.rule:
        return None
    where = f"{DRA_DRIVER_REPORT}{device.name} of pool {device.pool} ({taint.describe()})"
    # No timeAdded (the API server fills it in, so only a hand-made slice lacks it): an old taint.
    since = parse_epoch(taint.time_added) or 0.0
    if taint.key == TAINT_GPU_LOST:
        return Fault(
            condition=ConditionType.GPU_MISSING,
            reason=Reason.GPU_LOST,
            action=Action.REBOOT,
            gpu_index=index,
            gpu_uuid=uuid,
            since=since,
            message=f"{where}: the GPU fell off the bus; recommended action {Action.REBOOT}",
        )
    if taint.key != TAINT_XID or not taint.value.isdigit():
        return None
    xid = int(taint.value)
    info = lookup(xid)
    if info is not None and info.kind is XidKind.HARDWARE and info.action in _REPAIRS:
        action, what = info.action, info.meaning
    else:
        action = Action.RESET_GPU
        what = (
            f"{info.meaning}; the catalogue calls it {info.kind}, the driver took the device out"
            if info is not None
            else "not in the catalogue; the driver took the device out"
        )
    return Fault(
        condition=ConditionType.GPU_XID_ERROR,
        reason=contract.xid_reason(xid),
        action=action,
        gpu_index=index,
        gpu_uuid=uuid,
        xid=xid,
        since=since,
        message=f"{where}: XID {xid}, {what}; recommended action {action}",
    )
