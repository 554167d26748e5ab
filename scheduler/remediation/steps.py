"""What the machine asks the controller to do, as plain data.

Two kinds of step, so that a controller that crashed half-way through a
cycle, or a new leader, does the right thing by simply doing what the next
cycle says:

- **Holds** describe what must be true while a workflow is in its state:
  the node cordoned and tainted, a GPU fenced, a drain going on, a reset or
  a validation asked of the agent. They come every cycle; the controller
  compares them with the cluster and patches only what differs.
- **Edges** happen once, on the cycle of a transition: Events, the
  escalation (with its webhook call), removing the escalation marks,
  returning a GPU, uncordoning, letting go after a person's uncordon.

Every step except :class:`EmitEvent` changes the cluster; dry-run keeps the
Events and turns each edge into an Event that says what would have happened.

The escalation webhook receives :meth:`Escalate.payload` as its JSON body::

    {"node": "gpu-node-7", "pool": "default", "need": "REBOOT",
     "scope": "node", "gpus": [0, 1, ...],
     "fault": {"condition": "GpuXidError", "reason": "Xid79", "xid": 79,
               "action": "REBOOT", "gpuIndex": 3, "gpuUuid": "GPU-...",
               "message": "..."},
     "reason": "XID 79 on GPU 3 needs REBOOT", "escalatedAt": 1700000000.0}

``xid``, ``gpuIndex`` and ``gpuUuid`` are left out when the fault has none.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpuwarden.contract import TAINT_QUARANTINE, Action
from scheduler.remediation.model import Fault, Scope


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


class EventReason(StrEnum):
    """Reasons of the Events remediation writes on the Node."""

    GPU_QUARANTINED = "GpuQuarantined"
    NODE_QUARANTINED = "NodeQuarantined"
    QUARANTINE_HELD = "QuarantineHeld"
    DRAIN_QUEUED = "DrainQueued"
    DRAIN_STARTED = "DrainStarted"
    DRAIN_BLOCKED = "DrainBlocked"
    DRAIN_TIMED_OUT = "DrainTimedOut"
    RESET_REQUESTED = "GpuResetRequested"
    RESET_FAILED = "GpuResetFailed"
    REPAIR_ESCALATED = "RepairEscalated"
    ESCALATION_CLEARED = "EscalationCleared"
    VALIDATION_REQUESTED = "ValidationRequested"
    VALIDATION_FAILED = "ValidationFailed"
    REPEAT_FAULT = "RepeatFault"
    GPU_RETURNED = "GpuReturned"
    NODE_RETURNED = "NodeReturned"
    REMEDIATION_FAILED = "RemediationFailed"
    MANUAL_UNCORDON = "ManualUncordon"
    RECORD_UNREADABLE = "RemediationRecordUnreadable"
    ORPHAN_ADOPTED = "QuarantineAdopted"
    DRY_RUN = "DryRun"
    DRY_RUN_DISCARDED = "DryRunDiscarded"


@dataclass(frozen=True, slots=True)
class Cordon:
    """Hold: ``spec.unschedulable`` true and the quarantine taint with this ``timeAdded``."""

    time_added: float
    taint: str = TAINT_QUARANTINE

    def describe(self) -> str:
        return f"cordon the node and add the {self.taint} taint"


@dataclass(frozen=True, slots=True)
class Uncordon:
    """Edge: remove the quarantine taint and set ``spec.unschedulable`` false."""

    taint: str = TAINT_QUARANTINE

    def describe(self) -> str:
        return f"remove the {self.taint} taint and uncordon the node"


@dataclass(frozen=True, slots=True)
class QuarantineGpu:
    """Hold: the GPU takes no new work (gpuwarden's placement skips it)."""

    gpu_index: int
    gpu_uuid: str = ""

    def describe(self) -> str:
        return f"quarantine GPU {self.gpu_index}"


@dataclass(frozen=True, slots=True)
class ReturnGpu:
    """Edge: the GPU's quarantine ends; it takes work again."""

    gpu_index: int
    gpu_uuid: str = ""

    def describe(self) -> str:
        return f"return GPU {self.gpu_index} to service"


@dataclass(frozen=True, slots=True)
class Drain:
    """Hold: evict the pods of the scope (all pods of the node, or those on
    ``gpus``), each by the drain policy of its namespace, timed from
    ``started_at``. A gang with any pod there leaves whole."""

    scope: Scope
    gpus: tuple[int, ...]
    started_at: float

    def describe(self) -> str:
        what = "the node" if self.scope.is_node else f"GPU {self.scope.gpu_index}"
        return f"drain the pods of {what}"


@dataclass(frozen=True, slots=True)
class RequestGpuReset:
    """Hold: ask the node's agent (through the GPUNode) to reset the GPU once idle."""

    gpu_index: int
    gpu_uuid: str
    requested_at: float

    def describe(self) -> str:
        return f"ask the agent to reset GPU {self.gpu_index}"


@dataclass(frozen=True, slots=True)
class RequestValidation:
    """Hold: ask the agent to validate ``gpus`` (the whole node for a node
    scope); only a pass reported after ``repaired_at`` counts."""

    scope: Scope
    gpus: tuple[int, ...]
    requested_at: float
    repaired_at: float

    def describe(self) -> str:
        what = "the node" if self.scope.is_node else f"GPU {self.scope.gpu_index}"
        return f"ask the agent to validate {what}"


@dataclass(frozen=True, slots=True)
class Escalate:
    """Edge: people must act. Set the repair-needed label to ``need``, remove
    any escalation-cleared annotation left from before, write the Event and
    call the webhook (if configured) with :meth:`payload`."""

    node: str
    pool: str
    need: Action
    scope: Scope
    gpus: tuple[int, ...]
    fault: Fault
    reason: str
    escalated_at: float

    def describe(self) -> str:
        return f"escalate to people: {self.need} needed"

    def payload(self) -> dict[str, Any]:
        fault: dict[str, Any] = {
            "condition": self.fault.condition,
            "reason": self.fault.reason,
            "action": self.fault.action.value,
            "message": self.fault.message,
        }
        if self.fault.xid is not None:
            fault["xid"] = self.fault.xid
        if self.fault.gpu_index is not None:
            fault["gpuIndex"] = self.fault.gpu_index
        if self.fault.gpu_uuid:
            fault["gpuUuid"] = self.fault.gpu_uuid
        return {
            "node": self.node,
            "pool": self.pool,
            "need": self.need.value,
            "scope": self.scope.key,
            "gpus": list(self.gpus),
            "fault": fault,
            "reason": self.reason,
            "escalatedAt": self.escalated_at,
        }


@dataclass(frozen=True, slots=True)
class ClearEscalation:
    """Edge: remove the repair-needed label and the escalation-cleared annotation."""

    def describe(self) -> str:
        return "remove the repair-needed label and the escalation-cleared annotation"


@dataclass(frozen=True, slots=True)
class StopManaging:
    """Edge: a person uncordoned the node mid-workflow: remove gpuwarden's
    taint and repair-needed label, end the quarantine of ``released_gpus``,
    and leave the node to that person until a new fault."""

    released_gpus: tuple[int, ...]
    reason: str

    def describe(self) -> str:
        return "stop managing the node and release its fences"


@dataclass(frozen=True, slots=True)
class EmitEvent:
    type: EventType
    reason: EventReason
    message: str

    def describe(self) -> str:
        return f"{self.type} {self.reason}: {self.message}"


Step = (
    Cordon
    | Uncordon
    | QuarantineGpu
    | ReturnGpu
    | Drain
    | RequestGpuReset
    | RequestValidation
    | Escalate
    | ClearEscalation
    | StopManaging
    | EmitEvent
)

# Steps that are true of a state while the workflow stays in it (see the module docstring).
HOLD_STEPS = (Cordon, QuarantineGpu, Drain, RequestGpuReset, RequestValidation)
# Steps that put hardware back into service.
RETURN_STEPS = (Uncordon, ReturnGpu, StopManaging)


def is_changing(step: Step) -> bool:
    """Whether carrying out the step changes the cluster (all but Events)."""
    return not isinstance(step, EmitEvent)
