"""The remediation state machine: (record, observations, now, settings) -> (record, steps).

:func:`advance` is a pure function. The controller reads the Node, its
GPUNode and the pods into :class:`Observations`, calls it, carries out the
steps, and writes the returned record back (annotation and label). It is
called every cycle for every node; when nothing changed it returns the same
record and only the hold steps, which the controller finds already true.

Each workflow (one GPU, or the whole node) goes::

    healthy -> quarantined -> draining -> repairing -> validating -> healthy
                                      \\-> escalated -/       |
                                                             v
                                      (next rung up, or failed)

The rules, and why:

- **One GPU, not eight.** A fault whose action is ``RESET_GPU`` on one GPU
  quarantines that GPU only: the node's other GPUs keep their work. Faults
  that need ``REBOOT`` or ``REPLACE``, and faults that name no GPU, take the
  whole node: it is cordoned and tainted ``gpuwarden.io/quarantined`` with
  ``timeAdded``. A whole-node workflow absorbs the node's GPU workflows.
  What counts as a fault is what the engine's health judge calls fatal, so
  remediation repairs exactly what placement refuses.
- **A person's cordon is theirs.** A node cordoned by someone else (a
  cordon with no gpuwarden cordon in the record) gets no new workflow while
  the cordon lasts; the fault is recorded as held. Workflows already under
  way on single GPUs go on: they touch only their GPU.
- **A person's uncordon ends the workflow.** If a node gpuwarden cordoned
  is uncordoned by hand, gpuwarden takes its taint and fences off, records
  the faults present as the person's business, and starts again only for a
  fault not among them.
- **Drain in order.** Quarantine first, then drain when the pool's breaker
  has a drain slot; the drain is done when no pod is left on the scope. A
  drain that lasts longer than ``drain_timeout_s`` fails the workflow: a
  person must look at what blocks it (the record names the blockers).
- **Repair.** A GPU workflow asks the node's agent to reset the GPU; a
  reset that fails, or is not reported within ``reset_timeout_s``, is tried
  again up to ``max_reset_attempts`` and then escalates to ``REBOOT`` (which
  takes the whole node, so it is drained first). ``REBOOT`` and ``REPLACE``
  are escalated to people (Event, ``gpuwarden.io/repair-needed`` label,
  webhook); they clear it by annotating the node
  ``gpuwarden.io/escalation-cleared``.
- **Validate before return.** Hardware goes back only on a validation pass
  the agent reported after the repair (reset done, or escalation cleared).
  A failed validation, one not reported within ``validation_timeout_s``, or
  the fault coming back after the repair, moves one rung up: a GPU goes to
  ``REBOOT`` of its node (``REPLACE`` if the fault came back), a rebooted
  node to ``REPLACE``, a replaced one to ``failed``, where only a person's
  clear (re-validation) or uncordon moves it.
- **Repeat offenders are replaced.** A fault on hardware (a GPU by UUID, or
  the node) that already started a workflow within ``repeat_window_s``
  (7 days) escalates to ``REPLACE`` instead of another reset or reboot:
  hardware that keeps failing costs more in lost work than a replacement.
- **The breaker never blocks a return.** It only decides whether a new
  quarantine may start and whether a drain slot is free; nothing on the way
  back to service asks it.
- **Dry-run** records the workflow (flagged ``dryRun``, label
  ``dry-run-...``) and writes Events saying what it would do, and changes
  nothing: no hold steps, and every other changing step becomes a DryRun
  Event. Dry-run workflows never time out (what they would wait for is never
  asked) and do not count as repeat history. Switching dry-run off discards
  dry-run workflows, which start again for real from the current faults;
  switching it on freezes live workflows where they are.
- **Unreadable record: hands off.** If the annotation cannot be read the
  machine changes nothing, keeps every fence, and reports it each cycle.
  A cordoned node with gpuwarden's taint but no record (someone deleted the
  annotation, or a step ran whose record was never written) is adopted: a
  new whole-node workflow that needs a fresh validation pass before return.

Times from the agent (reset and validation results, fault ``since``) are
compared with times from the scheduler (when a repair was asked or cleared);
the cluster's clocks are assumed synchronised to well under a poll interval.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpuwarden.contract import ANNOTATION_ESCALATION_CLEARED, ANNOTATION_REMEDIATION_STATE, Action, worst_action
from scheduler.engine.health import is_fatal, is_node_wide
from scheduler.remediation.model import (
    DRA_DRIVER_REPORT,
    NODE_SCOPE_KEY,
    Attempts,
    Fault,
    HistoryEntry,
    Hold,
    NodeRecord,
    Scope,
    ScopeRecord,
    State,
    ValidationResult,
    label_value,
)
from scheduler.remediation.observations import Observations
from scheduler.remediation.policy import Settings
from scheduler.remediation.steps import (
    HOLD_STEPS,
    ClearEscalation,
    Cordon,
    Drain,
    EmitEvent,
    Escalate,
    EventReason,
    EventType,
    QuarantineGpu,
    RequestGpuReset,
    RequestValidation,
    ReturnGpu,
    Step,
    StopManaging,
    Uncordon,
)

NOTE_DRAIN_QUEUED = "waiting for a drain slot in the pool"
NOTE_PERSON_CORDON = "the node was cordoned by a person; gpuwarden leaves it alone until it is uncordoned"
# How many blockers the record and the Event name; the rest are counted.
BLOCKER_LIMIT = 10
# More rounds than there are states: every round moves some workflow one state on.
_MAX_ROUNDS = 12


@dataclass(frozen=True, slots=True)
class Transition:
    """What :func:`advance` returns.

    ``persist`` False means the record could not be read and must not be
    written back (it would erase what a person needs to see).
    """

    record: NodeRecord
    steps: tuple[Step, ...]
    persist: bool = True

    @property
    def label(self) -> str:
        """The value for the Node's ``gpuwarden.io/state`` label."""
        return label_value(self.record)


def advance(record: NodeRecord, obs: Observations, now: float, settings: Settings) -> Transition:
    """The next record and the steps to take; deterministic, never raises on any observation."""
    if record.unreadable:
        message = (
            f"{record.unreadable}; gpuwarden keeps this node's quarantine as it is until the "
            f"{ANNOTATION_REMEDIATION_STATE} annotation is fixed or removed"
        )
        return Transition(record, (EmitEvent(EventType.WARNING, EventReason.RECORD_UNREADABLE, message),), False)
    cycle = _Cycle(obs, now, settings)
    return cycle.finish(cycle.run(record))


def _what(scope: Scope) -> str:
    return "the node" if scope.is_node else f"GPU {scope.gpu_index}"


def _by_driver(f: Fault) -> bool:
    """Whether NVIDIA's DRA driver, not the agent, reported the fault (a device taint)."""
    return f.message.startswith(DRA_DRIVER_REPORT)


def _describe_fault(f: Fault) -> str:
    where = f"GPU {f.gpu_index}" if f.gpu_index is not None else "the node"
    name = f"XID {f.xid}" if f.xid is not None else f"{f.condition}/{f.reason}"
    if _by_driver(f):  # not the agent's: say who saw it
        return f"{name} on {where} (recommended action {f.action}; {f.message.partition('): ')[0]}))"
    return f"{name} on {where} (recommended action {f.action})"


def _worse(a: Action, b: Action) -> bool:
    """Whether ``a`` is a more expensive action than ``b``."""
    return a != b and worst_action([a, b]) == a


def _node_wide(f: Fault) -> bool:
    return is_node_wide(f.condition, f.action, () if f.gpu_index is None else (f.gpu_index,))


def _put(rec: NodeRecord, scope: ScopeRecord) -> NodeRecord:
    key = scope.scope.key
    others = [s for s in rec.scopes if s.scope.key != key]
    return replace(rec, scopes=tuple(sorted([*others, scope], key=lambda s: s.scope.key)))


def _drop(rec: NodeRecord, key: str) -> NodeRecord:
    return replace(rec, scopes=tuple(s for s in rec.scopes if s.scope.key != key))


class _Cycle:
    """One call of :func:`advance`: the observations, and the edge steps so far."""

    def __init__(self, obs: Observations, now: float, settings: Settings) -> None:
        self.obs = obs
        self.now = now
        self.s = settings
        self.dry = settings.dry_run
        self.edges: list[Step] = []
        self.active = tuple(f for f in obs.faults if is_fatal(f.condition, f.reason, f.action))

    # ------------------------------------------------------------------ shared pieces

    def event(self, kind: EventType, reason: EventReason, message: str) -> None:
        self.edges.append(EmitEvent(kind, reason, message))

    def enter(self, s: ScopeRecord, state: State, **changes: object) -> ScopeRecord:
        entered = {**s.entered, state.value: self.now}
        fields: dict[str, object] = {"note": "", **changes}
        return replace(s, state=state, entered=entered, **fields)  # type: ignore[arg-type]

    def faults_of(self, rec: NodeRecord, s: ScopeRecord) -> list[Fault]:
        live = [f for f in self.active if f.key not in rec.suppressed]
        if s.scope.is_node:
            return live
        return [f for f in live if f.gpu_index == s.scope.gpu_index and not _node_wide(f)]

    def repeat(self, rec: NodeRecord, target: str) -> bool:
        return any(h.target == target and h.at >= self.now - self.s.repeat_window_s for h in rec.history)

    def remember(self, rec: NodeRecord, f: Fault, target: str) -> NodeRecord:
        if self.dry:
            return rec
        history = (*rec.history, HistoryEntry(target, f.condition, f.reason, self.now))
        return replace(rec, history=history[-self.s.history_limit :])

    # ------------------------------------------------------------------ the cycle

    def run(self, rec: NodeRecord) -> NodeRecord:
        rec = self.prune(rec)
        rec = self.switch_mode(rec)
        rec = self.manual_uncordon(rec)
        rec = self.confirm_cordon(rec)
        rec = self.adopt_orphan(rec)
        rec = self.unmanaged(rec)
        rec = self.start(rec)
        for _ in range(_MAX_ROUNDS):
            before = rec
            for key in [s.scope.key for s in rec.scopes]:
                scope = next((s for s in rec.scopes if s.scope.key == key), None)
                if scope is not None and scope.dry_run == self.dry:
                    rec = self.step_scope(rec, scope)
            if rec == before:
                break
        return rec

    def prune(self, rec: NodeRecord) -> NodeRecord:
        oldest = self.now - self.s.repeat_window_s
        history = tuple(sorted((h for h in rec.history if h.at >= oldest), key=lambda h: h.at))
        return replace(rec, history=history[-self.s.history_limit :])

    def switch_mode(self, rec: NodeRecord) -> NodeRecord:
        if self.dry:
            return rec
        for s in rec.scopes:
            if s.dry_run:
                self.event(
                    EventType.NORMAL,
                    EventReason.DRY_RUN_DISCARDED,
                    f"dry-run workflow for {_what(s.scope)} discarded: remediation is live now",
                )
        return replace(rec, scopes=tuple(s for s in rec.scopes if not s.dry_run))

    def manual_uncordon(self, rec: NodeRecord) -> NodeRecord:
        ns = rec.node_scope
        if self.dry or ns is None or ns.dry_run or not ns.cordon_confirmed or self.obs.unschedulable:
            return rec
        reason = f"the node was uncordoned by hand while {ns.state}; gpuwarden stops managing it until a new fault"
        self.edges.append(StopManaging(ns.fenced_gpus, reason))
        self.event(EventType.WARNING, EventReason.MANUAL_UNCORDON, reason)
        suppressed = tuple(sorted({f.key for f in self.active}))
        return replace(rec, scopes=(), unmanaged_since=self.now, suppressed=suppressed, hold=None)

    def confirm_cordon(self, rec: NodeRecord) -> NodeRecord:
        ns = rec.node_scope
        if ns is not None and not ns.dry_run and not ns.cordon_confirmed and self.obs.unschedulable:
            return _put(rec, replace(ns, cordon_confirmed=True))
        return rec

    def adopt_orphan(self, rec: NodeRecord) -> NodeRecord:
        ns = rec.node_scope
        if self.dry or not (self.obs.unschedulable and self.obs.quarantine_taint) or ns is not None:
            return rec
        faults = sorted(self.active, key=lambda f: (not _node_wide(f), f.key))
        if faults:
            f = faults[0]
            rec = self.start_node(rec, f, worst_action([Action.REBOOT, f.action]), _describe_fault(f))
        else:
            f = Fault("Unknown", "RecordLost", Action.REBOOT)
            gpus = tuple(sorted(g.index for g in self.obs.gpus))
            scope = ScopeRecord(
                scope=Scope.node(),
                state=State.VALIDATING,
                need=Action.REBOOT,
                fault=f,
                gpus=gpus,
                started_at=self.now,
                by="unknown (record lost)",
                why="quarantined by gpuwarden with no record of why",
                entered={State.VALIDATING.value: self.now},
                attempts=Attempts(validation=1),
                repaired_at=self.now,
                validation_requested_at=self.now,
            )
            rec = _put(rec, scope)
        ns = rec.node_scope
        assert ns is not None
        rec = _put(rec, replace(ns, cordon_confirmed=True))
        self.event(
            EventType.WARNING,
            EventReason.ORPHAN_ADOPTED,
            "the node carries gpuwarden's quarantine but no remediation record; "
            "it stays quarantined until the agent validates it again",
        )
        return rec

    def unmanaged(self, rec: NodeRecord) -> NodeRecord:
        keys = {f.key for f in self.active}
        suppressed = tuple(k for k in rec.suppressed if k in keys)
        since = rec.unmanaged_since
        if since is not None and any(f.key not in suppressed for f in self.active):
            since = None
        return replace(rec, suppressed=suppressed, unmanaged_since=since)

    # ------------------------------------------------------------------ new workflows

    def gate(self, rec: NodeRecord) -> str:
        """Why no new workflow may start now ("" if one may)."""
        ns = rec.node_scope
        if self.obs.unschedulable and (ns is None or ns.dry_run):
            return NOTE_PERSON_CORDON
        already_out = any(s.dry_run == self.dry for s in rec.scopes)
        if not self.obs.breaker.quarantine_allowed and not already_out:
            return f"circuit breaker: {self.obs.breaker.reason or 'too much of the pool is out'}"
        return ""

    def start(self, rec: NodeRecord) -> NodeRecord:
        live = [f for f in self.active if f.key not in rec.suppressed]
        node_faults = sorted(
            (f for f in live if _node_wide(f)),
            key=lambda f: (-list(Action).index(f.action), f.key),
        )
        gpu_faults = sorted((f for f in live if not _node_wide(f)), key=lambda f: (f.gpu_index or 0, f.key))
        blocked = ""
        ns = rec.node_scope
        if ns is not None:
            if node_faults and ns.dry_run == self.dry:
                rec = self.upgrade(rec, ns, node_faults[0])
            return self.set_hold(rec, "")
        wanted: Fault | None = node_faults[0] if node_faults else None
        need = worst_action([Action.REBOOT, wanted.action]) if wanted is not None else Action.REBOOT
        why = _describe_fault(wanted) if wanted is not None else ""
        # Whether the repeat window, not the fault itself, decides: a fault
        # whose own action is REPLACE (an InfiniBand port at a lower rate, a
        # row remap failure) asks for replacement the first time too, and is
        # no repeat offender for that.
        own, repeat = need, wanted is not None and self.repeat(rec, NODE_SCOPE_KEY)
        if repeat:
            need, why = Action.REPLACE, f"{why}, again within the repeat window"
        if wanted is None:
            for f in gpu_faults:
                assert f.gpu_index is not None
                if rec.scope_for_gpu(f.gpu_index) is None and self.repeat(rec, f.target):
                    wanted, need, own, repeat = f, Action.REPLACE, f.action, True
                    why = f"{_describe_fault(f)}, again within the repeat window"
                    break
        if wanted is not None:
            blocked = self.gate(rec)
            if not blocked:
                if repeat:
                    instead = "replacement instead of repair" if own is not Action.REPLACE else "replacement again"
                    self.event(EventType.WARNING, EventReason.REPEAT_FAULT, f"{why}: {instead}")
                return self.set_hold(self.start_node(rec, wanted, need, why), "")
            return self.set_hold(rec, blocked)
        for f in gpu_faults:
            assert f.gpu_index is not None
            if rec.scope_for_gpu(f.gpu_index) is not None:
                continue
            blocked = self.gate(rec)
            if blocked:
                break
            rec = self.start_gpu(rec, f)
        return self.set_hold(rec, blocked)

    def set_hold(self, rec: NodeRecord, reason: str) -> NodeRecord:
        if not reason:
            return replace(rec, hold=None)
        if rec.hold is not None and rec.hold.reason == reason:
            return rec
        faults = ", ".join(_describe_fault(f) for f in self.active if f.key not in rec.suppressed)
        self.event(EventType.WARNING, EventReason.QUARANTINE_HELD, f"not quarantined ({reason}): {faults}")
        return replace(rec, hold=Hold(reason, self.now))

    def start_gpu(self, rec: NodeRecord, f: Fault) -> NodeRecord:
        assert f.gpu_index is not None
        index = f.gpu_index
        uuid = f.gpu_uuid or self.obs.uuid_of(index)
        why = _describe_fault(f)
        scope = ScopeRecord(
            scope=Scope.gpu(index, uuid),
            state=State.QUARANTINED,
            need=Action.RESET_GPU,
            fault=f,
            gpus=(index,),
            started_at=self.now,
            by=self.s.actor,
            why=why,
            fenced_gpus=(index,),
            dry_run=self.dry,
            entered={State.QUARANTINED.value: self.now},
        )
        self.event(
            EventType.WARNING,
            EventReason.GPU_QUARANTINED,
            f"GPU {index} quarantined for {why}; the node's other GPUs keep working",
        )
        return self.remember(_put(rec, scope), f, f.target)

    def start_node(self, rec: NodeRecord, f: Fault, need: Action, why: str) -> NodeRecord:
        absorbed = [s for s in rec.scopes if not s.scope.is_node and s.dry_run == self.dry]
        fenced = tuple(sorted({g for s in absorbed for g in s.fenced_gpus}))
        gpus = tuple(sorted({g.index for g in self.obs.gpus} | set(fenced)))
        scope = ScopeRecord(
            scope=Scope.node(),
            state=State.QUARANTINED,
            need=need,
            fault=f,
            gpus=gpus,
            started_at=self.now,
            by=self.s.actor,
            why=why,
            fenced_gpus=fenced,
            dry_run=self.dry,
            entered={State.QUARANTINED.value: self.now},
        )
        for s in absorbed:
            rec = _drop(rec, s.scope.key)
        self.event(EventType.WARNING, EventReason.NODE_QUARANTINED, f"node cordoned for {why}; {need} needed")
        return self.remember(_put(rec, scope), f, NODE_SCOPE_KEY)

    def upgrade(self, rec: NodeRecord, ns: ScopeRecord, f: Fault) -> NodeRecord:
        """A worse node-wide fault while the node is on its way to repair."""
        need = worst_action([Action.REBOOT, f.action])
        if not _worse(need, ns.need) or ns.state not in (State.QUARANTINED, State.DRAINING, State.ESCALATED):
            return rec
        why = f"{_describe_fault(f)} while the node waits for {ns.need}"
        ns = replace(ns, need=need, fault=f, why=why)
        if ns.state is State.ESCALATED:
            return _put(rec, self.escalated(ns, need, why))
        return _put(rec, ns)

    # ------------------------------------------------------------------ one workflow, one state on

    def step_scope(self, rec: NodeRecord, s: ScopeRecord) -> NodeRecord:
        if s.state is State.QUARANTINED:
            return self.quarantined(rec, s)
        if s.state is State.DRAINING:
            return self.draining(rec, s)
        if s.state is State.REPAIRING:
            return self.repairing(rec, s)
        if s.state in (State.ESCALATED, State.FAILED):
            return self.waiting_for_people(rec, s)
        if s.state is State.VALIDATING:
            return self.validating(rec, s)
        # A healthy scope is never kept (the record reader refuses one).
        return _drop(rec, s.scope.key)

    def quarantined(self, rec: NodeRecord, s: ScopeRecord) -> NodeRecord:
        node_draining = any(o.state is State.DRAINING for o in rec.scopes if o.scope.key != s.scope.key)
        if self.obs.breaker.drain_allowed or node_draining:
            self.event(EventType.NORMAL, EventReason.DRAIN_STARTED, f"draining the pods of {_what(s.scope)}")
            return _put(rec, self.enter(s, State.DRAINING, drain_pods_left=None, drain_blockers=()))
        if s.note != NOTE_DRAIN_QUEUED:
            detail = self.obs.breaker.reason or NOTE_DRAIN_QUEUED
            self.event(EventType.NORMAL, EventReason.DRAIN_QUEUED, f"{_what(s.scope)} quarantined; {detail}")
            return _put(rec, replace(s, note=NOTE_DRAIN_QUEUED))
        return rec

    def draining(self, rec: NodeRecord, s: ScopeRecord) -> NodeRecord:
        progress = self.obs.drain_for(s.scope.key)
        if progress is not None:
            blockers = tuple(progress.blockers[:BLOCKER_LIMIT])
            left = max(0, progress.pods_left)
            if blockers and blockers != s.drain_blockers:
                more = len(progress.blockers) - len(blockers)
                extra = f" and {more} more" if more > 0 else ""
                self.event(
                    EventType.WARNING,
                    EventReason.DRAIN_BLOCKED,
                    f"{left} pods left on {_what(s.scope)}; held by {'; '.join(blockers)}{extra}",
                )
            s = replace(s, drain_pods_left=left, drain_blockers=blockers)
            if left == 0:
                return self.drained(rec, s)
        if not s.dry_run and self.now - s.since > self.s.drain_timeout_s:
            held = "; ".join(s.drain_blockers) or "no blocker reported"
            why = f"the drain of {_what(s.scope)} did not finish within {self.s.drain_timeout_s:g}s ({held})"
            self.event(EventType.WARNING, EventReason.DRAIN_TIMED_OUT, f"{why}; a person must look")
            return _put(rec, self.enter(s, State.FAILED, note=why))
        return _put(rec, s)

    def drained(self, rec: NodeRecord, s: ScopeRecord) -> NodeRecord:
        if s.scope.is_node:
            return _put(rec, self.escalated(s, s.need, s.why))
        if s.need is not Action.RESET_GPU:
            return self.promote(rec, s, s.need, s.why)
        attempts = replace(s.attempts, reset=s.attempts.reset + 1)
        self.event(EventType.NORMAL, EventReason.RESET_REQUESTED, f"asked the agent to reset GPU {s.scope.gpu_index}")
        return _put(rec, self.enter(s, State.REPAIRING, reset_requested_at=self.now, attempts=attempts))

    def repairing(self, rec: NodeRecord, s: ScopeRecord) -> NodeRecord:
        index = s.scope.gpu_index
        if index is None:
            # Only GPU workflows reset; a node in this state (hand-edited record) goes to people.
            return _put(rec, self.escalated(s, s.need, s.why))
        asked = s.reset_requested_at if s.reset_requested_at is not None else s.since
        results = [r for r in self.obs.resets if r.gpu_index == index and r.at >= asked]
        result = max(results, key=lambda r: (r.at, r.ok), default=None)
        if result is not None and result.ok:
            self.event(EventType.NORMAL, EventReason.VALIDATION_REQUESTED, f"GPU {index} reset; validating it")
            return _put(rec, self.validate(s, result.at, last_reset=result))
        timed_out = not s.dry_run and self.now - asked > self.s.reset_timeout_s
        if result is None and not timed_out:
            return rec
        why = (
            f"the reset of GPU {index} failed: {result.message or 'no detail'}"
            if result is not None
            else f"the reset of GPU {index} was not reported within {self.s.reset_timeout_s:g}s"
        )
        if s.attempts.reset < self.s.max_reset_attempts:
            self.event(EventType.WARNING, EventReason.RESET_FAILED, f"{why}; trying again")
            attempts = replace(s.attempts, reset=s.attempts.reset + 1)
            retry = replace(s, reset_requested_at=self.now, attempts=attempts, last_reset=result or s.last_reset)
            return _put(rec, retry)
        self.event(EventType.WARNING, EventReason.RESET_FAILED, f"{why}; the node needs {Action.REBOOT}")
        return self.promote(rec, replace(s, last_reset=result or s.last_reset), Action.REBOOT, why)

    def waiting_for_people(self, rec: NodeRecord, s: ScopeRecord) -> NodeRecord:
        cleared = self.obs.escalation_cleared
        # An escalation raised in this very pass cannot have been cleared:
        # the annotation seen is a leftover from an earlier one (this pass's
        # Escalate removes it), and taking it would return the node unrepaired.
        if cleared is None or s.entered.get(State.ESCALATED.value) == self.now:
            return rec
        self.edges.append(ClearEscalation())
        self.event(
            EventType.NORMAL,
            EventReason.ESCALATION_CLEARED,
            f"{ANNOTATION_ESCALATION_CLEARED}={cleared!r}: validating {_what(s.scope)} before it returns",
        )
        return _put(rec, self.validate(s, self.now, note=f"cleared by a person: {cleared}"[:256]))

    def validating(self, rec: NodeRecord, s: ScopeRecord) -> NodeRecord:
        repaired = s.repaired_at if s.repaired_at is not None else s.since
        faults = self.faults_of(rec, s)
        back = [f for f in faults if f.since is not None and f.since > repaired]
        if back:
            return self.failed_validation(rec, s, f"{_describe_fault(back[0])} came back after the repair", True)
        results = [v for v in self.obs.validations if self.applies(s, v) and v.at > repaired]
        latest = max(results, key=lambda v: (v.at, not v.passed), default=None)
        if latest is not None and not latest.passed:
            return self.failed_validation(rec, s, f"validation failed: {latest.message or 'no detail'}", False)
        if latest is not None:
            pending = [f for f in faults if f.since is None]
            if not pending:
                return self.returned(rec, s, latest)
            waiting = replace(
                s,
                last_validation_pass_at=latest.at,
                note=f"validated; waiting for {_describe_fault(pending[0])} to clear",
            )
            return rec if waiting == s else _put(rec, waiting)
        if not s.dry_run and self.now - s.since > self.s.validation_timeout_s:
            why = f"no validation result within {self.s.validation_timeout_s:g}s"
            return self.failed_validation(rec, s, why, False)
        return rec

    @staticmethod
    def applies(s: ScopeRecord, v: ValidationResult) -> bool:
        if s.scope.is_node:
            return v.gpu_index is None
        return v.gpu_index is None or v.gpu_index == s.scope.gpu_index

    def failed_validation(self, rec: NodeRecord, s: ScopeRecord, why: str, came_back: bool) -> NodeRecord:
        self.event(EventType.WARNING, EventReason.VALIDATION_FAILED, f"{_what(s.scope)}: {why}")
        if not s.scope.is_node:
            return self.promote(rec, s, Action.REPLACE if came_back else Action.REBOOT, why)
        if s.attempts.escalation == 0 and not came_back:
            return _put(rec, self.escalated(s, s.need, why))
        if s.need is not Action.REPLACE:
            return _put(rec, self.escalated(s, Action.REPLACE, why))
        self.event(
            EventType.WARNING,
            EventReason.REMEDIATION_FAILED,
            f"{_what(s.scope)} still fails after {Action.REPLACE}: {why}; it stays quarantined until a person "
            f"clears it ({ANNOTATION_ESCALATION_CLEARED}) or uncordons the node",
        )
        return _put(rec, self.enter(s, State.FAILED, note=why))

    def returned(self, rec: NodeRecord, s: ScopeRecord, passed: ValidationResult) -> NodeRecord:
        uuids = {g.index: g.uuid for g in self.obs.gpus}
        if s.scope.is_node:
            self.edges.append(Uncordon())
        for g in s.fenced_gpus:
            self.edges.append(ReturnGpu(g, uuids.get(g, "") or (s.scope.gpu_uuid if g == s.scope.gpu_index else "")))
        # Latched faults from before the repair may still be on the Node for a
        # moment (the agent clears them after its pass): they must not start a
        # new workflow, which the repeat window would turn into a replacement.
        faults = self.faults_of(rec, s)
        superseded = {f.key for f in faults}
        rec = replace(rec, suppressed=tuple(sorted(set(rec.suppressed) | superseded)))
        reason = EventReason.NODE_RETURNED if s.scope.is_node else EventReason.GPU_RETURNED
        # The DRA driver's taint outlives the repair (it goes when the driver's plugin restarts):
        # say so where people look, or the GPU seems back while no DRA claim can have it.
        lingering = sorted({f.message.partition(" (")[0][len(DRA_DRIVER_REPORT) :] for f in faults if _by_driver(f)})
        still = (
            f"; NVIDIA's DRA driver still taints device {', '.join(lingering)}, so no DRA claim gets it until "
            f"the driver's kubelet plugin on {self.obs.node} restarts (a reboot restarts it)"
            if lingering
            else ""
        )
        self.event(
            EventType.NORMAL,
            reason,
            f"{_what(s.scope)} passed validation at {passed.at:.0f} (after the repair) and is back in service{still}",
        )
        return _drop(rec, s.scope.key)

    # ------------------------------------------------------------------ shared moves

    def validate(self, s: ScopeRecord, repaired_at: float, **changes: object) -> ScopeRecord:
        attempts = replace(s.attempts, validation=s.attempts.validation + 1)
        return self.enter(
            s, State.VALIDATING, repaired_at=repaired_at, validation_requested_at=self.now, attempts=attempts, **changes
        )

    def escalated(self, s: ScopeRecord, need: Action, why: str) -> ScopeRecord:
        attempts = replace(s.attempts, escalation=s.attempts.escalation + 1)
        self.edges.append(Escalate(self.obs.node, self.obs.pool, need, s.scope, s.gpus, s.fault, why, self.now))
        self.event(
            EventType.WARNING,
            EventReason.REPAIR_ESCALATED,
            f"{need} needed for {why}; once done: kubectl annotate node {self.obs.node} "
            f"{ANNOTATION_ESCALATION_CLEARED}=<what was done>",
        )
        return self.enter(s, State.ESCALATED, need=need, attempts=attempts, note=why)

    def promote(self, rec: NodeRecord, s: ScopeRecord, need: Action, why: str) -> NodeRecord:
        """A GPU workflow that needs more than a reset: the whole node, drained first."""
        if self.repeat(rec, NODE_SCOPE_KEY):
            need, why = Action.REPLACE, f"{why}; the node was remediated within the repeat window"
        ns = rec.node_scope
        if ns is not None and ns.dry_run == self.dry:
            # Already covered by a node workflow (cannot happen through start, which absorbs).
            return _drop(rec, s.scope.key)
        return self.start_node(rec, s.fault, need, why)

    # ------------------------------------------------------------------ the steps

    def holds(self, rec: NodeRecord) -> list[Step]:
        out: list[Step] = []
        for s in rec.scopes:
            if s.dry_run != self.dry:
                continue
            if s.scope.is_node:
                out.append(Cordon(s.started_at))
            out.extend(QuarantineGpu(g, self.obs.uuid_of(g) or s.scope.gpu_uuid) for g in s.fenced_gpus)
            if s.state is State.DRAINING:
                gpus = () if s.scope.is_node else s.gpus
                out.append(Drain(s.scope, gpus, s.since))
            elif s.state is State.REPAIRING and s.scope.gpu_index is not None:
                asked = s.reset_requested_at if s.reset_requested_at is not None else s.since
                out.append(RequestGpuReset(s.scope.gpu_index, s.scope.gpu_uuid, asked))
            elif s.state is State.VALIDATING:
                asked = s.validation_requested_at if s.validation_requested_at is not None else s.since
                repaired = s.repaired_at if s.repaired_at is not None else s.since
                out.append(RequestValidation(s.scope, s.gpus, asked, repaired))
        return out

    def finish(self, rec: NodeRecord) -> Transition:
        if not self.dry:
            return Transition(rec, (*self.holds(rec), *self.edges))
        steps: list[Step] = []
        for step in self.edges:
            if isinstance(step, EmitEvent):
                steps.append(step)
            elif not isinstance(step, HOLD_STEPS):
                steps.append(EmitEvent(EventType.NORMAL, EventReason.DRY_RUN, f"dry run: would {step.describe()}"))
        return Transition(rec, tuple(steps))
