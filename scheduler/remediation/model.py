"""What remediation remembers about a node, and how it is written on the Node.

Everything a restarted or failed-over scheduler needs to carry on exactly
where the last one stopped lives on the Node itself: a one-word label
(``gpuwarden.io/state``, for ``kubectl get nodes -L gpuwarden.io/state``) and a
JSON annotation (``gpuwarden.io/remediation-state``) holding a
:class:`NodeRecord`. Nothing is kept in the scheduler's memory between cycles
that is not also in that record, so losing the leader loses nothing.

A node can have several workflows at once, one per *scope*: a single GPU
(a fault whose action is ``RESET_GPU`` on one GPU takes only that GPU out) or
the whole node (``REBOOT``, ``REPLACE`` and faults that name no GPU). When a
node-wide workflow starts it absorbs the GPU workflows of that node: the
whole node is out anyway, and it returns the GPUs they fenced only when the
node itself has been validated.

Times are Unix seconds (floats), as everywhere in the scheduler's pure code;
the annotation keeps them as JSON numbers so that a record read back is
exactly the record written.

Reading the annotation never raises. A record that does not parse, or that a
newer gpuwarden wrote in a format this one does not know, becomes a record
marked *unreadable*: the machine then takes no step that returns hardware or
removes a fence, reports the problem, and leaves the annotation as it is, so
a person can look at it (and delete it to let remediation start over from
what it observes).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuwarden.contract import Action, RemediationState

State = RemediationState

# The version of the annotation's JSON; a record with another one is not read.
RECORD_VERSION = 1

# Label values besides the states: only single GPUs are out ("gpu-draining"),
# the last workflow was ended by a person's uncordon, the record cannot be read.
GPU_LABEL_PREFIX = "gpu-"
DRY_RUN_LABEL_PREFIX = "dry-run-"
LABEL_UNMANAGED = "unmanaged"
LABEL_UNREADABLE = "unreadable"

NODE_SCOPE_KEY = "node"

# How much of a fault message the record keeps: annotations share a 256 KiB
# budget per object, and the full text is on the condition anyway.
MESSAGE_LIMIT = 256

# The label shows the state that most needs a person's eyes first.
_LABEL_ORDER: tuple[State, ...] = (
    State.FAILED,
    State.ESCALATED,
    State.QUARANTINED,
    State.DRAINING,
    State.REPAIRING,
    State.VALIDATING,
)


@dataclass(frozen=True, slots=True)
class Scope:
    """What one workflow covers: one GPU (``gpu_index`` set) or the whole node."""

    gpu_index: int | None = None
    gpu_uuid: str = ""

    @classmethod
    def node(cls) -> Scope:
        return cls()

    @classmethod
    def gpu(cls, index: int, uuid: str = "") -> Scope:
        return cls(index, uuid)

    @property
    def is_node(self) -> bool:
        return self.gpu_index is None

    @property
    def key(self) -> str:
        """Stable name of the scope on its node: ``node`` or ``gpu-3``."""
        return NODE_SCOPE_KEY if self.gpu_index is None else f"gpu-{self.gpu_index}"


# How a fault's message begins when NVIDIA's DRA driver, not the agent, reported it (a device taint,
# scheduler/remediation/driverhealth.py); the message is kept in the record, so the source is too.
DRA_DRIVER_REPORT = "NVIDIA's DRA driver tainted device "


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault on a node, as read from its conditions or its GPUNode.

    ``gpu_index`` None means the fault names no GPU (a node-level fault).
    ``since`` is when the agent first raised it (the GPUNode says; None when
    only the condition was seen): a fault raised after a repair is the fault
    coming back, one raised before it is the old one not yet cleared.
    """

    condition: str
    reason: str
    action: Action
    gpu_index: int | None = None
    gpu_uuid: str = ""
    xid: int | None = None
    since: float | None = None
    message: str = ""

    @property
    def target(self) -> str:
        """The hardware the fault is about, for the repeat window: a GPU's UUID
        when known (a replaced GPU is new hardware), else its index, else the node."""
        if self.gpu_index is None:
            return NODE_SCOPE_KEY
        return self.gpu_uuid or f"gpu-{self.gpu_index}"

    @property
    def key(self) -> str:
        """What makes two observations the same fault."""
        return f"{self.condition}/{self.reason}/{self.target}"


@dataclass(frozen=True, slots=True)
class ResetResult:
    """The agent's report of one GPU reset (on the GPUNode), with its time."""

    gpu_index: int
    ok: bool
    at: float
    message: str = ""


@dataclass(frozen=True, slots=True)
class ValidationResult:
    """The agent's validation verdict, with its time; ``gpu_index`` None: the whole node."""

    gpu_index: int | None
    passed: bool
    at: float
    message: str = ""


@dataclass(frozen=True, slots=True)
class Attempts:
    """How often each repair step was tried in this workflow."""

    reset: int = 0
    validation: int = 0
    escalation: int = 0


@dataclass(frozen=True, slots=True)
class ScopeRecord:
    """One workflow: where it is, why it started, what it has tried.

    ``need`` is the repair it is heading for (``RESET_GPU`` for a GPU scope,
    ``REBOOT`` or ``REPLACE`` for a node). ``gpus`` are the GPUs it covers;
    ``fenced_gpus`` those quarantined one by one that it must return when it
    ends (a node scope inherits them from the GPU workflows it absorbed).
    ``entered`` maps each state's value to when the workflow last entered it.
    ``repaired_at`` is the time of the repair that validation must postdate.
    ``cordon_confirmed`` is set once the Node was seen cordoned after this
    workflow asked for it, so a cordon not yet applied is never mistaken for
    a person's uncordon.
    """

    scope: Scope
    state: State
    need: Action
    fault: Fault
    gpus: tuple[int, ...]
    started_at: float
    by: str
    why: str
    fenced_gpus: tuple[int, ...] = ()
    dry_run: bool = False
    cordon_confirmed: bool = False
    entered: Mapping[str, float] = field(default_factory=dict)
    attempts: Attempts = Attempts()
    reset_requested_at: float | None = None
    last_reset: ResetResult | None = None
    repaired_at: float | None = None
    validation_requested_at: float | None = None
    last_validation_pass_at: float | None = None
    drain_pods_left: int | None = None
    drain_blockers: tuple[str, ...] = ()
    note: str = ""

    @property
    def since(self) -> float:
        """When the workflow entered its current state."""
        return self.entered.get(self.state.value, self.started_at)


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """A workflow that started: kept for the repeat window."""

    target: str
    condition: str
    reason: str
    at: float


@dataclass(frozen=True, slots=True)
class Hold:
    """New quarantines wanted but not started, and why (the breaker, a person's cordon)."""

    reason: str
    since: float


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """Everything remediation keeps about one node (the annotation's content).

    ``suppressed`` lists faults (their keys) that start no workflow: those
    present when a person uncordoned the node (``unmanaged_since``), which
    are that person's business, and latched faults still shown after a
    validation pass superseded them. Each leaves the list once it is no
    longer observed, so the same fault raised again is a new one.
    ``unreadable`` is set only by :func:`decode_record`, never written.
    """

    scopes: tuple[ScopeRecord, ...] = ()
    history: tuple[HistoryEntry, ...] = ()
    unmanaged_since: float | None = None
    suppressed: tuple[str, ...] = ()
    hold: Hold | None = None
    unreadable: str = ""

    @property
    def node_scope(self) -> ScopeRecord | None:
        return next((s for s in self.scopes if s.scope.is_node), None)

    def scope_for_gpu(self, index: int) -> ScopeRecord | None:
        return next((s for s in self.scopes if s.scope.gpu_index == index), None)


@dataclass(frozen=True, slots=True)
class DecodedRecord:
    """A record read from the annotation; ``error`` says why it could not be, if so."""

    record: NodeRecord
    error: str | None = None


def label_value(record: NodeRecord) -> str:
    """The ``gpuwarden.io/state`` label for this record."""
    if record.unreadable:
        return LABEL_UNREADABLE
    if not record.scopes:
        return LABEL_UNMANAGED if record.unmanaged_since is not None else State.HEALTHY.value
    node = record.node_scope
    chosen = node if node is not None else min(record.scopes, key=lambda s: _LABEL_ORDER.index(s.state))
    value = chosen.state.value if node is not None else GPU_LABEL_PREFIX + chosen.state.value
    return DRY_RUN_LABEL_PREFIX + value if chosen.dry_run else value


# --------------------------------------------------------------------------
# The annotation's JSON
# --------------------------------------------------------------------------


def _fault_json(f: Fault) -> dict[str, Any]:
    out: dict[str, Any] = {"condition": f.condition, "reason": f.reason, "action": f.action.value}
    if f.gpu_index is not None:
        out["gpuIndex"] = f.gpu_index
    if f.gpu_uuid:
        out["gpuUuid"] = f.gpu_uuid
    if f.xid is not None:
        out["xid"] = f.xid
    if f.since is not None:
        out["since"] = f.since
    if f.message:
        out["message"] = f.message[:MESSAGE_LIMIT]
    return out


def _scope_json(s: ScopeRecord) -> dict[str, Any]:
    out: dict[str, Any] = {
        "scope": s.scope.key,
        "state": s.state.value,
        "need": s.need.value,
        "fault": _fault_json(s.fault),
        "gpus": list(s.gpus),
        "startedAt": s.started_at,
        "by": s.by,
        "why": s.why,
        "entered": dict(sorted(s.entered.items())),
        "attempts": {
            "reset": s.attempts.reset,
            "validation": s.attempts.validation,
            "escalation": s.attempts.escalation,
        },
    }
    if s.scope.gpu_uuid:
        out["gpuUuid"] = s.scope.gpu_uuid
    if s.fenced_gpus:
        out["fencedGpus"] = list(s.fenced_gpus)
    if s.dry_run:
        out["dryRun"] = True
    if s.cordon_confirmed:
        out["cordonConfirmed"] = True
    optional = {
        "resetRequestedAt": s.reset_requested_at,
        "repairedAt": s.repaired_at,
        "validationRequestedAt": s.validation_requested_at,
        "lastValidationPassAt": s.last_validation_pass_at,
        "drainPodsLeft": s.drain_pods_left,
    }
    out.update({k: v for k, v in optional.items() if v is not None})
    if s.last_reset is not None:
        r = s.last_reset
        out["lastReset"] = {"gpuIndex": r.gpu_index, "ok": r.ok, "at": r.at, "message": r.message[:MESSAGE_LIMIT]}
    if s.drain_blockers:
        out["drainBlockers"] = list(s.drain_blockers)
    if s.note:
        out["note"] = s.note
    return out


def encode_record(record: NodeRecord) -> str:
    """The annotation's value: compact JSON with sorted keys (stable, so an
    unchanged record is an unchanged annotation and no patch is sent)."""
    if record.unreadable:
        raise ValueError("an unreadable record is never written back: it would erase what could not be read")
    out: dict[str, Any] = {"version": RECORD_VERSION, "scopes": [_scope_json(s) for s in record.scopes]}
    if record.history:
        out["history"] = [
            {"target": h.target, "condition": h.condition, "reason": h.reason, "at": h.at} for h in record.history
        ]
    if record.unmanaged_since is not None:
        out["unmanagedSince"] = record.unmanaged_since
    if record.suppressed:
        out["suppressed"] = list(record.suppressed)
    if record.hold is not None:
        out["hold"] = {"reason": record.hold.reason, "since": record.hold.since}
    return json.dumps(out, sort_keys=True, separators=(",", ":"), allow_nan=False)


class _MalformedError(ValueError):
    """Raised inside the reader only; :func:`decode_record` turns it into an error."""


class _Reader:
    """Typed access to one JSON object, naming the path of whatever is wrong."""

    def __init__(self, data: object, where: str) -> None:
        if not isinstance(data, dict):
            raise _MalformedError(f"{where}: expected an object, got {type(data).__name__}")
        self._data: dict[str, object] = data
        self._where = where

    def _get(self, key: str, required: bool) -> object:
        if key not in self._data:
            if required:
                raise _MalformedError(f"{self._where}.{key}: missing")
            return None
        return self._data[key]

    def str_(self, key: str, required: bool = True, default: str = "") -> str:
        v = self._get(key, required)
        if v is None:
            return default
        if not isinstance(v, str):
            raise _MalformedError(f"{self._where}.{key}: expected a string")
        return v

    def int_(self, key: str, required: bool = True) -> int | None:
        v = self._get(key, required)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise _MalformedError(f"{self._where}.{key}: expected a non-negative integer")
        return v

    def num(self, key: str, required: bool = True) -> float | None:
        v = self._get(key, required)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise _MalformedError(f"{self._where}.{key}: expected a number")
        return float(v)

    def bool_(self, key: str) -> bool:
        v = self._get(key, False)
        if v is None:
            return False
        if not isinstance(v, bool):
            raise _MalformedError(f"{self._where}.{key}: expected true or false")
        return v

    def list_(self, key: str) -> list[object]:
        v = self._get(key, False)
        if v is None:
            return []
        if not isinstance(v, list):
            raise _MalformedError(f"{self._where}.{key}: expected a list")
        return v

    def obj(self, key: str, required: bool = True) -> _Reader | None:
        v = self._get(key, required)
        return None if v is None else _Reader(v, f"{self._where}.{key}")

    def ints(self, key: str) -> tuple[int, ...]:
        out = []
        for i, v in enumerate(self.list_(key)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise _MalformedError(f"{self._where}.{key}[{i}]: expected a GPU index")
            out.append(v)
        return tuple(out)

    def strs(self, key: str) -> tuple[str, ...]:
        out = []
        for i, v in enumerate(self.list_(key)):
            if not isinstance(v, str):
                raise _MalformedError(f"{self._where}.{key}[{i}]: expected a string")
            out.append(v)
        return tuple(out)

    def enum_(self, key: str, kind: type[State] | type[Action]) -> Any:
        v = self.str_(key)
        try:
            return kind(v)
        except ValueError:
            raise _MalformedError(f"{self._where}.{key}: unknown value {v!r}") from None

    def times(self, key: str) -> dict[str, float]:
        r = self.obj(key, required=False)
        if r is None:
            return {}
        out: dict[str, float] = {}
        for name in r._data:
            try:
                State(name)
            except ValueError:
                raise _MalformedError(f"{self._where}.{key}: unknown state {name!r}") from None
            value = r.num(name)
            assert value is not None
            out[name] = value
        return out


def _read_fault(r: _Reader) -> Fault:
    return Fault(
        condition=r.str_("condition"),
        reason=r.str_("reason"),
        action=r.enum_("action", Action),
        gpu_index=r.int_("gpuIndex", required=False),
        gpu_uuid=r.str_("gpuUuid", required=False),
        xid=r.int_("xid", required=False),
        since=r.num("since", required=False),
        message=r.str_("message", required=False),
    )


def _read_scope(r: _Reader) -> ScopeRecord:
    key = r.str_("scope")
    uuid = r.str_("gpuUuid", required=False)
    if key == NODE_SCOPE_KEY:
        scope = Scope.node()
    elif key.startswith("gpu-") and key[4:].isdigit():
        scope = Scope.gpu(int(key[4:]), uuid)
    else:
        raise _MalformedError(f"scope {key!r}: expected 'node' or 'gpu-N'")
    # The state first: an unknown one most likely means a newer gpuwarden
    # wrote the record, and that is the error worth reporting.
    state: State = r.enum_("state", State)
    if state is State.HEALTHY:
        raise _MalformedError(f"scope {key}: a healthy scope is not kept")
    fault = r.obj("fault")
    attempts = r.obj("attempts", required=False)
    reset = r.obj("lastReset", required=False)
    started = r.num("startedAt")
    assert fault is not None and started is not None
    return ScopeRecord(
        scope=scope,
        state=state,
        need=r.enum_("need", Action),
        fault=_read_fault(fault),
        gpus=r.ints("gpus"),
        started_at=started,
        by=r.str_("by"),
        why=r.str_("why"),
        fenced_gpus=r.ints("fencedGpus"),
        dry_run=r.bool_("dryRun"),
        cordon_confirmed=r.bool_("cordonConfirmed"),
        entered=r.times("entered"),
        attempts=Attempts(
            reset=attempts.int_("reset", required=False) or 0,
            validation=attempts.int_("validation", required=False) or 0,
            escalation=attempts.int_("escalation", required=False) or 0,
        )
        if attempts is not None
        else Attempts(),
        reset_requested_at=r.num("resetRequestedAt", required=False),
        last_reset=ResetResult(
            gpu_index=reset.int_("gpuIndex") or 0,
            ok=reset.bool_("ok"),
            at=reset.num("at") or 0.0,
            message=reset.str_("message", required=False),
        )
        if reset is not None
        else None,
        repaired_at=r.num("repairedAt", required=False),
        validation_requested_at=r.num("validationRequestedAt", required=False),
        last_validation_pass_at=r.num("lastValidationPassAt", required=False),
        drain_pods_left=r.int_("drainPodsLeft", required=False),
        drain_blockers=r.strs("drainBlockers"),
        note=r.str_("note", required=False),
    )


def _read_record(text: str) -> NodeRecord:
    r = _Reader(json.loads(text), "record")
    version = r.int_("version")
    if version != RECORD_VERSION:
        raise _MalformedError(f"record.version: {version} is not the version this gpuwarden reads ({RECORD_VERSION})")
    scopes = tuple(_read_scope(_Reader(s, f"record.scopes[{i}]")) for i, s in enumerate(r.list_("scopes")))
    keys = [s.scope.key for s in scopes]
    if len(set(keys)) != len(keys):
        raise _MalformedError("record.scopes: the same scope twice")
    history = []
    for i, h in enumerate(r.list_("history")):
        hr = _Reader(h, f"record.history[{i}]")
        at = hr.num("at")
        assert at is not None
        history.append(HistoryEntry(hr.str_("target"), hr.str_("condition"), hr.str_("reason"), at))
    hold = r.obj("hold", required=False)
    hold_since = hold.num("since") if hold is not None else None
    return NodeRecord(
        scopes=scopes,
        history=tuple(history),
        unmanaged_since=r.num("unmanagedSince", required=False),
        suppressed=r.strs("suppressed"),
        hold=Hold(hold.str_("reason"), hold_since) if hold is not None and hold_since is not None else None,
    )


def decode_record(text: str | None) -> DecodedRecord:
    """Read the annotation; never raises.

    No annotation (None or empty) is an empty record: the node was never
    remediated. Anything else that cannot be read returns an unreadable
    record and the reason, for the controller to report.
    """
    if not text:
        return DecodedRecord(NodeRecord())
    try:
        return DecodedRecord(_read_record(text))
    except (ValueError, TypeError, RecursionError) as exc:
        # json.JSONDecodeError and _MalformedError are ValueErrors; a deeply nested
        # document makes the parser recurse too far.
        error = f"cannot read the remediation record: {exc}"
        return DecodedRecord(NodeRecord(unreadable=error), error)
