"""What a restarted agent restores from its Node, and which Events that leaves to write.

A restarted agent reads its Node and GPUNode back before publishing (see
:mod:`agent.daemon`). Deciding what that read-back means is pure and lives
here, apart from the threads: which faults the Node's conditions and the
GPUNode's detail stand for (:func:`faults_to_restore`), which of a report's
Events are fault transitions (:func:`split_events`), and which of those are
still worth writing once the restored faults are known
(:func:`events_to_write`, :func:`hold`, :func:`events_after_restore`): a
fault the Node already showed was announced by the previous run.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agent.model import Entity, EntityKind, EventType, Fault, FaultKey, HealthEvent, HealthReport
from agent.publish.conditions import ConditionState
from gpuwarden.contract import HEALTHY_REASONS, Action, ConditionType, Reason, xid_reason

_ACTION_SUFFIX = re.compile(r"\s*Recommended action: ([A-Z_]+)\.\s*$")
# Conditions whose faults latch: a GPU they name stays out of capacity until
# repair clears it, so a restore without the GPUNode must not lose which.
_LATCHED_CONDITIONS = frozenset(
    {ConditionType.GPU_XID_ERROR, ConditionType.GPU_MEMORY_DEGRADED, ConditionType.GPU_MISSING}
)
# One listed fault of a condition message: "GPU 3 (GPU-…, 0000:3b:00.0): what [ACTION]".
_GPU_PART = re.compile(r"^GPU (\d+)(?: \(([^()]*)\))?(?::\s*|\s+)(.+?)(?:\s*\[([A-Z_]+)\])?$")
_MORE = re.compile(r"^and \d+ more$")
# What a rule's text says, for a part of a message listing several reasons.
_PART_REASONS: tuple[tuple[re.Pattern[str], str | None], ...] = (
    (re.compile(r"\bXid (\d+)\b"), None),
    (re.compile(r"row remap(?:ping)? failed"), Reason.ROW_REMAP_FAILURE),
    (re.compile(r"row remap pending"), Reason.ROW_REMAP_PENDING),
    (re.compile(r"pages retired \(limit"), Reason.RETIRED_PAGES_LIMIT),
    (re.compile(r"retired pages pending"), Reason.RETIRED_PAGES_PENDING),
    (re.compile(r"\bis lost\b"), Reason.GPU_LOST),
)


def _split_parts(body: str) -> list[str]:
    """``body`` split at the "; " between listed faults, not inside parentheses."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(body):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        elif ch == ";" and depth == 0:
            parts.append(body[start:i].strip())
            start = i + 1
    parts.append(body[start:].strip())
    return [p for p in parts if p]


def _gpu_entity(index: str, ids: str | None) -> Entity:
    uuid = bus = None
    for raw in (ids or "").split(","):
        value = raw.strip()
        if value.startswith(("GPU-", "MIG-")):
            uuid = value
        elif value:
            bus = value
    return Entity.gpu(int(index), uuid, bus)


def _part_reason(text: str, condition_reason: str) -> str:
    if condition_reason != Reason.MULTIPLE_FAULTS:
        return condition_reason
    for pattern, reason in _PART_REASONS:
        match = pattern.search(text)
        if match:
            return reason if reason is not None else xid_reason(int(match.group(1)))
    return condition_reason


def gpu_faults_from_condition(ctype: ConditionType, state: ConditionState, action: Action) -> tuple[list[Fault], bool]:
    """Latched per-GPU faults for the GPUs a True condition's message names,
    and whether they are all the message lists.

    Not all when some part of the message names no GPU (a node-wide fault,
    or faults left out as "and N more"): the condition then also needs its
    node-wide stand-in. Each GPU named is kept out of capacity until repair,
    which is the safe side when the detail of the GPUNode is gone.
    """
    body = _ACTION_SUFFIX.sub("", state.message).rstrip(". ")
    out: list[Fault] = []
    complete = True
    for part in _split_parts(body):
        match = _GPU_PART.match(part)
        if match is None or _MORE.match(part):
            complete = False
            continue
        index, ids, what, tail = match.groups()
        try:
            part_action = Action(tail) if tail else action
        except ValueError:
            part_action = action
        entity = _gpu_entity(index, ids)
        out.append(
            Fault(
                condition=ctype,
                reason=_part_reason(what, state.reason),
                message=f"{entity.describe()}: {what}",
                action=part_action,
                entity=entity,
                since=state.last_transition,
                latched=True,
            )
        )
    return out, complete and bool(out)


def faults_from_conditions(conditions: dict[ConditionType, ConditionState], covered: set[ConditionType]) -> list[Fault]:
    """Node-wide faults standing in for True conditions the GPUNode has no detail for.

    The GPUNode may be gone (deleted by hand, or never written because the
    API server failed first); the condition alone still says a fault was
    raised, and the rules latch it by condition and reason. For the latched
    conditions, the GPUs the message names get latched faults of their own,
    so they stay out of capacity: a node-wide fault names no GPU, and one
    with reason MultipleFaults would neither latch nor count against any.
    """
    out: list[Fault] = []
    for ctype, state in conditions.items():
        if not state.problem or ctype in covered:
            continue
        match = _ACTION_SUFFIX.search(state.message)
        action = Action.NONE
        message = state.message
        if match:
            message = state.message[: match.start()].rstrip(". ") or state.reason
            try:
                action = Action(match.group(1))
            except ValueError:
                action = Action.NONE
        if ctype in _LATCHED_CONDITIONS:
            per_gpu, complete = gpu_faults_from_condition(ctype, state, action)
            out += per_gpu
            if complete:
                continue
        out.append(
            Fault(
                condition=ctype,
                reason=state.reason,
                message=message,
                action=action,
                entity=Entity.node(),
                since=state.last_transition,
            )
        )
    return out


_CONDITION_OF_HEALTHY_REASON = {reason: ctype for ctype, reason in HEALTHY_REASONS.items()}


@dataclass(frozen=True, slots=True)
class FaultTransition:
    """A fault Event of a report, with what it is about.

    ``condition`` and ``entity_key`` name the fault the Event announces
    (Warning) or clears (Normal); ``reason`` is the fault's reason, known
    only for a Warning (a clearing Event carries the healthy reason).
    """

    event: HealthEvent
    condition: ConditionType
    entity_key: str
    reason: str | None


def split_events(report: HealthReport) -> tuple[list[HealthEvent], list[FaultTransition]]:
    """The report's Events that are no fault transition, and those that are.

    A Normal Event is a fault clearing. A Warning is a fault appearing when
    the same report holds a fault of that reason on that entity (the XID
    rule's Event for a hardware XID included). Everything else --
    application XIDs, XIDs not in the catalogue -- tells of an occurrence,
    not of state, and is worth writing whatever the rules knew.
    """
    plain: list[HealthEvent] = []
    transitions: list[FaultTransition] = []
    faults = {(f.reason, f.entity.key): f for f in report.faults}
    for event in report.events:
        if event.type is EventType.NORMAL:
            ctype = _CONDITION_OF_HEALTHY_REASON.get(event.reason)
            if ctype is not None:
                transitions.append(FaultTransition(event, ctype, event.entity.key, None))
                continue
        else:
            fault = faults.get((event.reason, event.entity.key))
            if fault is not None:
                transitions.append(FaultTransition(event, fault.condition, fault.entity.key, fault.reason))
                continue
        plain.append(event)
    return plain, transitions


@dataclass(frozen=True, slots=True)
class RestoredFaults:
    """The faults a restore read back from the Node, to judge older Events by.

    A fault restored without GPUNode detail stands for its whole condition
    (a node-wide fault), so any fault Event under that condition is known.
    """

    keys: frozenset[FaultKey]
    node_wide: frozenset[ConditionType]

    @classmethod
    def of(cls, faults: list[Fault]) -> RestoredFaults:
        return cls(
            keys=frozenset(f.key for f in faults),
            node_wide=frozenset(f.condition for f in faults if f.entity.kind is EntityKind.NODE),
        )

    def knew(self, transition: FaultTransition) -> bool:
        """Whether the Node already showed the fault this transition is about."""
        if transition.condition in self.node_wide:
            return True
        if transition.reason is not None:
            return (transition.condition.value, transition.reason, transition.entity_key) in self.keys
        return any(k.condition == transition.condition.value and k.entity == transition.entity_key for k in self.keys)


def faults_to_restore(conditions: dict[ConditionType, ConditionState], gpunode_faults: Iterable[Fault]) -> list[Fault]:
    """The faults to seed the rules with after a restart.

    The Node's conditions say which faults are raised; the GPUNode adds
    their detail (GPU, port, action, latched). A fault the GPUNode still
    lists under a condition the Node shows False was cleared (repair and
    re-validation) just before a restart: it stays cleared. A True condition
    the GPUNode has no detail for becomes a node-wide fault.
    """
    raised = {t for t, state in conditions.items() if state.problem}
    faults = [f for f in gpunode_faults if f.condition in raised]
    faults += faults_from_conditions(conditions, covered={f.condition for f in faults})
    return faults


def events_to_write(
    report: HealthReport, epoch: int | None, restored: RestoredFaults
) -> tuple[Sequence[HealthEvent], list[FaultTransition]]:
    """The report's Events to write now, and its fault Events to hold.

    ``epoch`` is the restore epoch reports must carry to be published (None
    before the restore). A report judged after the restore has all its Events
    written. One judged before it writes the Events that are no fault
    transition, and holds its fault Events until the restore when there has
    been none yet; when the restore came while it was being judged, its fault
    Events are judged against the restored faults at once.
    """
    if epoch is not None and report.restore_epoch >= epoch:
        return report.events, []
    plain, transitions = split_events(report)
    if epoch is None:
        return plain, transitions
    return plain + events_after_restore(transitions, restored), []


def hold(
    held: Sequence[FaultTransition], transitions: Iterable[FaultTransition], limit: int
) -> tuple[list[FaultTransition], int]:
    """``held`` with ``transitions`` added, keeping the newest ``limit``, and
    how many of the oldest were dropped for it.

    Bounded like the Events queue: an API server that stays away from the
    start cannot grow the held Events without limit.
    """
    out = [*held, *transitions]
    overflow = len(out) - limit
    if overflow > 0:
        del out[:overflow]
    return out, max(0, overflow)


def events_after_restore(transitions: Iterable[FaultTransition], restored: RestoredFaults) -> list[HealthEvent]:
    """The fault Events, judged before the restore, that are still worth writing.

    Those about faults the Node already showed were announced by the previous
    run (or clear a fault the rules hold again now); the rest happened while
    the API server was away.
    """
    return [t.event for t in transitions if not restored.knew(t)]
