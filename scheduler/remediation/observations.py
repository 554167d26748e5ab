"""What the controller observes about one node, each cycle, for the machine.

Observations are facts, never intentions: the faults the agent reports now,
whether the Node is cordoned and whether gpuwarden's taint is on it, how far
a drain has got, what the agent says about resets and validations, whether a
person has cleared an escalation, and what the pool's breaker allows. The
machine compares them with the record of what it asked for; the difference
is the next transition.

:func:`faults_from_conditions` turns the engine's view of a node's
conditions into faults, one per GPU named, so remediation and placement read
the same conditions the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpuwarden.contract import XID_REASON_PREFIX
from scheduler.engine.health import is_fatal
from scheduler.engine.model import NodeCondition
from scheduler.remediation.breaker import BreakerVerdict
from scheduler.remediation.model import Fault, ResetResult, ValidationResult


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    index: int
    uuid: str = ""


@dataclass(frozen=True, slots=True)
class DrainProgress:
    """Pods still on one scope (DaemonSet and mirror pods left out: they stay),
    and what holds them there (e.g. ``ns/pod: PodDisruptionBudget ns/pdb``)."""

    scope_key: str
    pods_left: int
    blockers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Observations:
    """One node, now.

    ``unschedulable`` is the Node's ``spec.unschedulable``;
    ``quarantine_taint`` whether gpuwarden's taint is on it. Together with
    the record they tell who cordoned: a cordon with no cordon of ours in the
    record is a person's. ``drains`` has an entry per scope the controller
    measured; a scope with none has not been measured and is not done.
    ``resets`` and ``validations`` are the agent's latest reports from the
    GPUNode. ``escalation_cleared`` is the value of the annotation a person
    sets when the escalated repair is done (None when absent).
    """

    node: str
    pool: str
    gpus: tuple[GpuIdentity, ...] = ()
    faults: tuple[Fault, ...] = ()
    unschedulable: bool = False
    quarantine_taint: bool = False
    drains: tuple[DrainProgress, ...] = ()
    resets: tuple[ResetResult, ...] = ()
    validations: tuple[ValidationResult, ...] = ()
    escalation_cleared: str | None = None
    breaker: BreakerVerdict = field(default_factory=BreakerVerdict)

    def drain_for(self, scope_key: str) -> DrainProgress | None:
        return next((d for d in self.drains if d.scope_key == scope_key), None)

    def uuid_of(self, index: int) -> str:
        return next((g.uuid for g in self.gpus if g.index == index), "")


def xid_of(reason: str) -> int | None:
    """The XID in a condition reason such as ``Xid79``; None for other reasons."""
    digits = reason[len(XID_REASON_PREFIX) :] if reason.startswith(XID_REASON_PREFIX) else ""
    return int(digits) if digits.isdigit() else None


def faults_from_conditions(
    conditions: Iterable[NodeCondition],
    gpus: Iterable[GpuIdentity] = (),
    since: Mapping[tuple[str, str, int | None], float] | None = None,
) -> tuple[Fault, ...]:
    """The faults remediation acts on, from a node's conditions.

    Only True conditions that the engine's health judge calls fatal become
    faults: what placement refuses is what remediation repairs. A condition
    naming several GPUs becomes one fault per GPU. ``since`` optionally maps
    (condition type, reason, GPU index or None) to when the agent raised it
    (from the GPUNode's fault list).
    """
    uuids = {g.index: g.uuid for g in gpus}
    out: list[Fault] = []
    for cond in conditions:
        if not cond.status or not is_fatal(cond.type, cond.reason, cond.action):
            continue
        indices: tuple[int | None, ...] = cond.gpu_indices or (None,)
        for index in indices:
            out.append(
                Fault(
                    condition=cond.type,
                    reason=cond.reason,
                    action=cond.action,
                    gpu_index=index,
                    gpu_uuid=uuids.get(index, "") if index is not None else "",
                    xid=xid_of(cond.reason),
                    since=(since or {}).get((cond.type, cond.reason, index)),
                    message=cond.message,
                )
            )
    return tuple(out)
