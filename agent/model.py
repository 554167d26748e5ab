"""The agent's verdict: what the health rules concluded about one node.

A :class:`HealthReport` is the single hand-off between judgement (rules) and
publishing (conditions, capacity, GPUNode, Events, metrics). It is plain,
immutable data so that publishers can compare the previous report with the
current one to find transitions, and so tests can build one by hand.

Raw samples (counters, link states) stay with the probes; the report carries
only what a person or the scheduler acts on, plus the per-GPU and per-port
inventory that the GPUNode object shows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import NamedTuple

from gpuwarden.contract import Action, ConditionType, worst_action


class EntityKind(StrEnum):
    GPU = "gpu"
    IB_PORT = "ib_port"
    MOUNT = "mount"
    NODE = "node"


@dataclass(frozen=True, slots=True)
class Entity:
    """The piece of hardware (or mount) a fault is about.

    Only the fields of its kind are set. ``key`` identifies it across polls,
    so that a fault on "GPU 3" in one report is the same fault in the next.
    """

    kind: EntityKind
    gpu_index: int | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    ib_device: str | None = None
    ib_port: int | None = None
    mount: str | None = None

    @classmethod
    def gpu(cls, index: int, uuid: str | None, pci_bus_id: str | None) -> Entity:
        return cls(EntityKind.GPU, gpu_index=index, uuid=uuid, pci_bus_id=pci_bus_id)

    @classmethod
    def ib(cls, device: str, port: int) -> Entity:
        return cls(EntityKind.IB_PORT, ib_device=device, ib_port=port)

    @classmethod
    def mount_point(cls, path: str) -> Entity:
        return cls(EntityKind.MOUNT, mount=path)

    @classmethod
    def node(cls) -> Entity:
        return cls(EntityKind.NODE)

    @property
    def key(self) -> str:
        if self.kind is EntityKind.GPU:
            # The UUID survives re-enumeration after a reset; the index does not.
            return f"gpu/{self.uuid or self.pci_bus_id or self.gpu_index}"
        if self.kind is EntityKind.IB_PORT:
            return f"ib/{self.ib_device}/{self.ib_port}"
        if self.kind is EntityKind.MOUNT:
            return f"mount/{self.mount}"
        return "node"

    def describe(self) -> str:
        """Human text naming the entity, as used in condition messages.

        A GPU is named by what is known of it and nothing else: a kernel-log
        XID seen while NVML is down knows its GPU's bus id only, and
        "GPU None (uuid unknown, ...)" reads like a bug and names nothing.
        """
        if self.kind is EntityKind.GPU:
            return self._describe_gpu()
        if self.kind is EntityKind.IB_PORT:
            return f"{self.ib_device} port {self.ib_port}"
        if self.kind is EntityKind.MOUNT:
            return f"mount {self.mount}"
        return "node"

    def _describe_gpu(self) -> str:
        if self.gpu_index is not None:
            known = ", ".join(x for x in (self.uuid, self.pci_bus_id) if x)
            return f"GPU {self.gpu_index} ({known})" if known else f"GPU {self.gpu_index}"
        if self.pci_bus_id:
            return f"GPU at {self.pci_bus_id} ({self.uuid})" if self.uuid else f"GPU at {self.pci_bus_id}"
        if self.uuid:
            return f"GPU {self.uuid}"
        return "a GPU that could not be identified"


class FaultKey(NamedTuple):
    """What makes two faults the same fault across polls and restarts.

    A tuple, so it hashes and compares as fast as one (and equal to the plain
    ``(condition, reason, entity)`` tuple), with names for its fields.
    """

    condition: str  # the ConditionType's value
    reason: str
    entity: str  # the Entity's key


@dataclass(frozen=True, slots=True)
class Fault:
    """One problem on one entity, mapped to a condition type.

    ``latched`` faults stay raised until repair and re-validation clear them;
    the rest clear when their signal clears (after hysteresis). ``since`` is
    when the fault was first raised, kept across polls and agent restarts.
    """

    condition: ConditionType
    reason: str
    message: str
    action: Action
    entity: Entity
    since: datetime
    latched: bool = False

    @property
    def key(self) -> FaultKey:
        return FaultKey(self.condition.value, self.reason, self.entity.key)


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """Something worth an Event that is not (or not only) a condition.

    Application XIDs, unknown XIDs, and faults that appeared or cleared.
    """

    type: EventType
    reason: str
    message: str
    entity: Entity
    time: datetime


@dataclass(frozen=True, slots=True)
class GpuStatus:
    """Inventory and health of one GPU, as the GPUNode object shows it."""

    index: int
    uuid: str
    pci_bus_id: str
    model: str
    memory_total_mib: int
    memory_used_mib: int | None
    mig_enabled: bool | None
    # False when any fault on this GPU takes it out of service (its memory
    # leaves node capacity); lost GPUs are listed with healthy=False.
    healthy: bool
    faults: tuple[Fault, ...] = ()


@dataclass(frozen=True, slots=True)
class IbPortStatus:
    """Inventory and health of one InfiniBand (or RoCE) port."""

    device: str
    port: int
    state: str  # e.g. "ACTIVE", "DOWN"
    phys_state: str  # e.g. "LinkUp", "Disabled"
    rate_gbps: float | None
    link_layer: str  # "InfiniBand" or "Ethernet"
    netdev: str | None = None
    healthy: bool = True
    faults: tuple[Fault, ...] = ()


@dataclass(frozen=True, slots=True)
class HealthReport:
    """Everything the rules concluded about the node at ``time``.

    ``faults`` holds every active fault (each also listed under its GPU or
    port); ``events`` holds what happened since the previous report.
    ``errors`` lists probes that could not run this poll (NVML failed to
    initialise, a sysfs read failed): publishers must then keep what they
    published before for that source rather than report it healthy.
    ``restore_epoch`` counts the state restores (faults read back from the
    Node) the rules had received when they judged this report: a publisher
    that restored state must not publish a report judged before that, since
    it lacks the restored (latched) faults. ``unjudged`` names the condition
    types no rule could judge this poll (their source failed, or their rule
    did): their faults are held as they were, and the absence of a fault
    there means "unknown", not "healthy".
    """

    node: str
    time: datetime
    gpus: tuple[GpuStatus, ...] = ()
    ib_ports: tuple[IbPortStatus, ...] = ()
    faults: tuple[Fault, ...] = ()
    events: tuple[HealthEvent, ...] = ()
    errors: tuple[str, ...] = field(default_factory=tuple)
    restore_epoch: int = 0
    unjudged: frozenset[ConditionType] = frozenset()

    def faults_for(self, condition: ConditionType) -> tuple[Fault, ...]:
        return tuple(f for f in self.faults if f.condition is condition)

    @property
    def healthy_gpu_memory_mib(self) -> int:
        """MiB of memory on healthy GPUs: the node's gpu-memory capacity."""
        return sum(g.memory_total_mib for g in self.gpus if g.healthy)

    @property
    def action(self) -> Action:
        """The most expensive recommended action across all faults."""
        return worst_action([f.action for f in self.faults])
