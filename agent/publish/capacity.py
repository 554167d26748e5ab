"""``gpuwarden.io/gpu-memory`` in the Node's capacity and allocatable.

The scheduler places GPU-memory slices against this extended resource, so it
is the MiB of memory on *healthy* GPUs: a GPU that turns unhealthy takes its
memory out of the node at once, and it comes back only when the rules call
the GPU healthy again (repair and re-validation for latched faults).
Allocatable equals capacity: the agent reserves nothing.

Written with a strategic-merge patch of ``nodes/status`` touching only this
one key of each map, so the kubelet's cpu/memory/pods and device-plugin
resources are left alone. Sent only when the value changes, or when the Node
returned by the heartbeat shows someone else changed it (and once after
start or an API outage), never on a timer.
"""

from __future__ import annotations

from agent.model import HealthReport
from agent.publish.conditions import conditions_held_by_errors
from gpuwarden.contract import RESOURCE_GPU_MEMORY, ConditionType
from gpuwarden.kube import JSON, KubeApi
from gpuwarden.logconfig import get_logger
from gpuwarden.quantity import parse_quantity

log = get_logger(__name__)


def desired_gpu_memory_mib(report: HealthReport, previous: int | None) -> int | None:
    """The capacity the report calls for, or ``previous`` when the GPU probe failed.

    A report whose GPU source failed (NVML could not be used) lists no GPUs
    because they are unknown, not because there are none: publishing 0 then
    would evict every memory-slice workload for a transient driver hiccup.
    """
    if not report.gpus and report.errors and ConditionType.GPU_MISSING in conditions_held_by_errors(report.errors):
        return previous
    return report.healthy_gpu_memory_mib


def _gpu_memory_in(node: JSON, field: str) -> int | None:
    """The MiB the Node's ``field`` holds, read as the quantity the API server wrote.

    The API server stores a quantity in its canonical form: the agent's
    ``"1000"`` reads back as ``"1k"``, and ``"2000000"`` as ``"2M"``. Read
    with ``int()`` those looked malformed, and the value was sent again on
    every heartbeat. An extended resource is a whole number, so anything
    else is malformed.
    """
    raw = ((node.get("status") or {}).get(field) or {}).get(RESOURCE_GPU_MEMORY)
    if raw is None:
        return None
    amount = parse_quantity(raw)
    if isinstance(amount, str) or amount.denominator != 1:
        problem = amount if isinstance(amount, str) else "not a whole number"
        log.warning("capacity_on_node_malformed", resource=RESOURCE_GPU_MEMORY, field=field, value=raw, problem=problem)
        return None
    return int(amount)


def capacity_from_node(node: JSON) -> int | None:
    """The gpu-memory capacity a Node carries now (None when it has none)."""
    return _gpu_memory_in(node, "capacity")


def allocatable_from_node(node: JSON) -> int | None:
    """The gpu-memory allocatable a Node carries now (None when it has none)."""
    return _gpu_memory_in(node, "allocatable")


def published_from_node(node: JSON) -> int | None:
    """The value the agent's patch left on the Node, if both maps still hold it.

    The scheduler places against allocatable, so a Node whose allocatable
    alone was changed (by hand, or by a tool that rewrites it) is as wrong as
    one whose capacity was: when the two disagree the Node holds no value of
    the agent's, and the next publish sends both again.
    """
    capacity = capacity_from_node(node)
    return capacity if capacity == allocatable_from_node(node) else None


def capacity_patch(mib: int) -> JSON:
    quantity = str(mib)
    return {
        "status": {
            "capacity": {RESOURCE_GPU_MEMORY: quantity},
            "allocatable": {RESOURCE_GPU_MEMORY: quantity},
        }
    }


class CapacityPublisher:
    """Keeps the Node's gpu-memory capacity equal to the healthy GPUs' memory."""

    def __init__(self, api: KubeApi, node_name: str) -> None:
        self._api = api
        self._node = node_name
        self._desired: int | None = None
        self._published: int | None = None

    @property
    def published(self) -> int | None:
        return self._published

    def restore(self, node: JSON) -> int | None:
        """Remember the value already on the Node, so an unchanged restart sends nothing.

        The capacity found is also what the agent keeps asking for while its
        GPU probe fails; it counts as published only if allocatable matches.
        """
        self._published = published_from_node(node)
        self._desired = capacity_from_node(node)
        return self._desired

    def invalidate(self) -> None:
        self._published = None

    def observe(self, node: JSON) -> None:
        """Take the value the Node holds now from a Node the agent received anyway.

        The heartbeat patch returns the whole Node; if something else changed
        the capacity or the allocatable -- a kubelet that lost its checkpoint
        zeroes extended resources when it re-registers -- the next publish
        puts both back, without any extra read.
        """
        self._published = published_from_node(node)

    def publish(self, report: HealthReport) -> bool:
        """Patch capacity and allocatable if the healthy memory changed; True if sent."""
        self._desired = desired_gpu_memory_mib(report, self._desired)
        return self.flush()

    def flush(self) -> bool:
        if self._desired is None or self._desired == self._published:
            return False
        self._api.patch_node_status(self._node, capacity_patch(self._desired))
        log.info(
            "capacity_published",
            node=self._node,
            resource=RESOURCE_GPU_MEMORY,
            mib=self._desired,
            previous_mib=self._published,
        )
        self._published = self._desired
        return True
