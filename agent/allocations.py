"""Which pods hold which GPU, from the kubelet's PodResources answers: pure functions.

The kubelet names devices by the device plugin's IDs, the agent names GPUs
by NVML's UUIDs; NVIDIA's device plugin uses the UUID as the ID, so the two
meet there. A device ID names a GPU when it is the GPU's UUID, a time-sliced
replica of it (``<uuid>::<n>``), or for a DRA claim when the device name or a
CDI device name (``vendor/class=<name>``) is the UUID. Everything else (RDMA
devices, MIG instances, which carry their own UUIDs, a DRA device named
``gpu-0``) holds no GPU here: a guess would be worse than nothing, since the
scheduler trusts these holders over its own assignment. UUIDs compare without
regard to case.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from agent.samples import PodResourcesSample
from gpuwarden.contract import GPUNODE_MAX_PODS_PER_GPU

# More holders than this on one GPU (time-slicing replicas) are not listed
# one by one; the count is kept.
MAX_HOLDERS_PER_GPU = GPUNODE_MAX_PODS_PER_GPU


@dataclass(frozen=True, slots=True, order=True)
class GpuHolder:
    """One container holding a GPU, by the names the kubelet gives it."""

    namespace: str
    pod: str
    container: str
    resource: str


@dataclass(frozen=True, slots=True)
class GpuAllocation:
    """Who holds one GPU and whether the device plugin offers it.

    ``offered`` is None when the kubelet did not say (its
    ``GetAllocatableResources`` failed or is not served). ``omitted`` counts
    holders past :data:`MAX_HOLDERS_PER_GPU`.
    """

    uuid: str
    holders: tuple[GpuHolder, ...] = ()
    offered: bool | None = None
    omitted: int = 0


def _named(device_id: str) -> str:
    """The GPU UUID a device ID would name, lower-cased (CDI prefix and replica suffix removed)."""
    name = device_id.rpartition("=")[2] if "=" in device_id else device_id
    return name.partition("::")[0].strip().lower()


def gpu_of(device_id: str, uuids: dict[str, str]) -> str | None:
    """The UUID (as NVML spells it) of the GPU ``device_id`` names, if any; ``uuids`` maps lower-case to spelling."""
    return uuids.get(_named(device_id))


def gpu_allocations(sample: PodResourcesSample, gpu_uuids: Iterable[str]) -> dict[str, GpuAllocation]:
    """Per GPU UUID, its holders (sorted, each once) and whether it is offered.

    Only a successful ``List`` says who holds what; callers keep what they had
    when the read failed (see :attr:`PodResourcesSample.failure`).
    """
    uuids = {u.lower(): u for u in gpu_uuids if u}
    holders: dict[str, set[GpuHolder]] = {u: set() for u in uuids.values()}
    for held in sample.held:
        for device_id in held.device_ids:
            uuid = gpu_of(device_id, uuids)
            if uuid is not None:
                holders[uuid].add(GpuHolder(held.namespace, held.pod, held.container, held.resource))
    offered: set[str] | None = None
    if sample.allocatable is not None:
        offered = {u for d in sample.allocatable if (u := gpu_of(d, uuids)) is not None}
    out: dict[str, GpuAllocation] = {}
    for uuid, found in holders.items():
        ordered = sorted(found)
        out[uuid] = GpuAllocation(
            uuid=uuid,
            holders=tuple(ordered[:MAX_HOLDERS_PER_GPU]),
            offered=None if offered is None else uuid in offered,
            omitted=max(0, len(ordered) - MAX_HOLDERS_PER_GPU),
        )
    return out
