"""Invariants of the transition function over random histories of observations.

A history is a run of cycles: each picks faults from a small catalogue, a
cordon state, drain progress, agent reports with times around "now", a
person's clear and a breaker verdict. Records are carried from cycle to
cycle exactly as the controller would, through the annotation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.contract import Action, ConditionType, Reason
from scheduler.remediation.breaker import BreakerVerdict
from scheduler.remediation.machine import Transition, advance
from scheduler.remediation.model import (
    Fault,
    NodeRecord,
    ResetResult,
    ScopeRecord,
    State,
    ValidationResult,
    decode_record,
    encode_record,
)
from scheduler.remediation.observations import DrainProgress, Observations
from scheduler.remediation.policy import Settings
from scheduler.remediation.steps import (
    RETURN_STEPS,
    Cordon,
    EmitEvent,
    Escalate,
    EventReason,
    ReturnGpu,
    StopManaging,
    Uncordon,
)
from tests.scheduler.remediation.builders import T0, node, xid

SETTINGS = Settings(reset_timeout_s=600, validation_timeout_s=1800, drain_timeout_s=7200)
DRY = replace(SETTINGS, dry_run=True)

CATALOGUE: tuple[Fault, ...] = (
    xid(48, 0, Action.RESET_GPU),
    xid(48, 1, Action.RESET_GPU),
    xid(95, 1, Action.RESET_GPU),
    xid(79, 2, Action.REBOOT),
    Fault(ConditionType.GPU_NVLINK_DEGRADED.value, Reason.NVLINK_DOWN.value, Action.RESET_GPU, 0, "GPU-0000"),
    Fault(ConditionType.INFINIBAND_DEGRADED.value, Reason.IB_PORT_DOWN.value, Action.REPLACE),
    Fault(ConditionType.GPU_MISSING.value, Reason.GPU_LOST.value, Action.REBOOT),
    Fault(ConditionType.INFINIBAND_DEGRADED.value, Reason.IB_LINK_DOWNED.value, Action.RESTART_APP),
)
GPU_ONLY = tuple(f for f in CATALOGUE if f.action is Action.RESET_GPU and f.gpu_index is not None)
SCOPES = ("node", "gpu-0", "gpu-1")
OFFSETS = (-4000.0, -700.0, -1.0, 0.0, 1.0)
STEPS_DT = (1.0, 30.0, 700.0, 4000.0, 8 * 86400.0)


@dataclass(frozen=True)
class Cycle:
    """One cycle's observations, with agent times as offsets from its "now"."""

    dt: float
    faults: tuple[tuple[Fault, float | None], ...]
    unschedulable: bool
    taint: bool
    drains: tuple[tuple[str, int], ...]
    resets: tuple[tuple[int, bool, float], ...]
    validations: tuple[tuple[int | None, bool, float], ...]
    cleared: bool
    quarantine_allowed: bool
    drain_allowed: bool
    # Whether a person (or a crash) sets the cordon this cycle; otherwise the
    # Node is cordoned exactly when the last record asked for it.
    meddled: bool = False

    def observe(self, now: float, cordoned: bool = False) -> Observations:
        return node(
            faults=tuple(replace(f, since=None if age is None else now + age) for f, age in self.faults),
            unschedulable=self.unschedulable if self.meddled else cordoned,
            quarantine_taint=self.taint if self.meddled else cordoned,
            drains=tuple(DrainProgress(k, n, ("ns/p: PodDisruptionBudget ns/b",) if n else ()) for k, n in self.drains),
            resets=tuple(ResetResult(g, ok, now + off) for g, ok, off in self.resets),
            validations=tuple(ValidationResult(g, ok, now + off) for g, ok, off in self.validations),
            escalation_cleared="done" if self.cleared else None,
            breaker=BreakerVerdict(self.quarantine_allowed, self.drain_allowed, "tripped"),
        )


def cycles(faults: tuple[Fault, ...] = CATALOGUE) -> st.SearchStrategy[Cycle]:
    age = st.one_of(st.none(), st.sampled_from(OFFSETS))
    return st.builds(
        Cycle,
        dt=st.sampled_from(STEPS_DT),
        faults=st.lists(st.tuples(st.sampled_from(faults), age), max_size=3, unique_by=lambda x: x[0]).map(tuple),
        unschedulable=st.booleans(),
        taint=st.booleans(),
        drains=st.lists(st.tuples(st.sampled_from(SCOPES), st.integers(0, 2)), max_size=3).map(tuple),
        resets=st.lists(st.tuples(st.integers(0, 2), st.booleans(), st.sampled_from(OFFSETS)), max_size=2).map(tuple),
        validations=st.lists(
            st.tuples(st.one_of(st.none(), st.integers(0, 2)), st.booleans(), st.sampled_from(OFFSETS)), max_size=3
        ).map(tuple),
        cleared=st.booleans(),
        quarantine_allowed=st.booleans(),
        drain_allowed=st.booleans(),
        meddled=st.sampled_from((False, False, False, True)),
    )


# Node-wide faults absorb GPU workflows, so the GPU paths get a history of their own.
HISTORIES = st.one_of(st.lists(cycles(), min_size=1, max_size=14), st.lists(cycles(GPU_ONLY), min_size=1, max_size=14))


def play(history: list[Cycle], config: Settings = SETTINGS) -> list[tuple[NodeRecord, Observations, float, Transition]]:
    """Run the history; each record goes through the annotation before the next cycle, as on a cluster."""
    out = []
    record, now = NodeRecord(), T0
    for cycle in history:
        now += cycle.dt
        ours = record.node_scope is not None and not record.node_scope.dry_run
        obs = cycle.observe(now, ours)
        t = advance(record, obs, now, config)
        out.append((record, obs, now, t))
        record = decode_record(encode_record(t.record)).record
    return out


def repair_bound(scope: ScopeRecord | None, now: float) -> float:
    """The earliest a repair of this scope could have happened, as of the cycle that returns it."""
    if scope is not None and scope.state is State.VALIDATING and scope.repaired_at is not None:
        return scope.repaired_at
    if scope is not None and scope.state is State.REPAIRING and scope.reset_requested_at is not None:
        return scope.reset_requested_at
    return now


@settings(max_examples=400, deadline=None)
@given(HISTORIES)
def test_hardware_returns_only_on_a_pass_newer_than_its_repair(history: list[Cycle]) -> None:
    for before, obs, now, t in play(history):
        passes = [v for v in obs.validations if v.passed]
        returned_node = any(isinstance(s, Uncordon) for s in t.steps)
        if returned_node:
            bound = repair_bound(before.node_scope, now)
            assert any(v.gpu_index is None and v.at > bound for v in passes), (before, obs)
        for step in t.steps:
            if isinstance(step, ReturnGpu) and not returned_node:
                scope = before.scope_for_gpu(step.gpu_index)
                bound = repair_bound(scope, now)
                assert any(v.gpu_index in (None, step.gpu_index) and v.at > bound for v in passes), (before, obs)


@settings(max_examples=200, deadline=None)
@given(HISTORIES, cycles())
def test_the_breaker_never_blocks_a_return(history: list[Cycle], last: Cycle) -> None:
    trace = play(history)
    record, now = trace[-1][3].record, trace[-1][2] + last.dt
    steps = {}
    for allowed in (True, False):
        ours = record.node_scope is not None and not record.node_scope.dry_run
        obs = replace(last, quarantine_allowed=allowed, drain_allowed=allowed).observe(now, ours)
        steps[allowed] = [s for s in advance(record, obs, now, SETTINGS).steps if isinstance(s, RETURN_STEPS)]
    assert steps[True] == steps[False]


@settings(max_examples=200, deadline=None)
@given(HISTORIES)
def test_the_transition_is_deterministic_and_its_records_round_trip(history: list[Cycle]) -> None:
    for before, obs, now, t in play(history):
        assert advance(before, obs, now, SETTINGS) == t
        assert decode_record(encode_record(t.record)).record == t.record
        assert t.persist


@settings(max_examples=200, deadline=None)
@given(st.lists(cycles(GPU_ONLY), min_size=1, max_size=10))
def test_gpu_faults_that_reset_and_validate_never_cordon_the_node(history: list[Cycle]) -> None:
    # Resets that succeed, passes that come after them, and a repeat window
    # shorter than any cycle: nothing climbs the ladder, so nothing may touch
    # the node as a whole.
    healthy = [
        replace(
            c,
            unschedulable=False,
            taint=False,
            quarantine_allowed=True,
            resets=tuple((g, True, abs(off)) for g, _, off in c.resets),
            validations=tuple((g, True, abs(off) + 1) for g, _, off in c.validations),
            faults=tuple((f, None if age is None else -abs(age) - 10**6) for f, age in c.faults),
            dt=min(c.dt, 30.0),
        )
        for c in history
    ]
    for _, _, _, t in play(healthy, replace(SETTINGS, repeat_window_s=0.5)):
        assert not any(isinstance(s, Cordon | Uncordon | StopManaging) for s in t.steps)
        assert t.record.node_scope is None


@settings(max_examples=200, deadline=None)
@given(HISTORIES)
def test_dry_run_takes_no_changing_step(history: list[Cycle]) -> None:
    for _, _, _, t in play(history, DRY):
        assert all(isinstance(s, EmitEvent) for s in t.steps)
        assert t.record.history == ()


@settings(max_examples=300, deadline=None)
@given(HISTORIES)
def test_a_repeat_fault_is_only_written_for_hardware_with_a_workflow_in_the_window(history: list[Cycle]) -> None:
    # A fault whose own action is REPLACE (an InfiniBand port) asks for
    # replacement the first time too: that alone is no repeat.
    for before, obs, now, t in play(history):
        if EventReason.REPEAT_FAULT not in [s.reason for s in t.steps if isinstance(s, EmitEvent)]:
            continue
        targets = {"node"} | {f.target for f in obs.faults}
        window = now - SETTINGS.repeat_window_s
        assert any(h.target in targets and h.at >= window for h in before.history), (before, obs)


@settings(max_examples=200, deadline=None)
@given(HISTORIES)
def test_cordon_steps_come_only_from_a_node_workflow(history: list[Cycle]) -> None:
    for _, _, _, t in play(history):
        if any(isinstance(s, Cordon) for s in t.steps):
            assert t.record.node_scope is not None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_decoding_any_text_never_raises(text: str) -> None:
    decoded = decode_record(text)
    assert (decoded.error is None) == (decoded.record.unreadable == "")


@settings(max_examples=300, deadline=None)
@given(HISTORIES, JSON, st.sampled_from(["scopes", "history", "hold", "suppressed", "version", "unmanagedSince"]))
def test_a_damaged_record_never_raises_and_never_returns_hardware(history: list[Cycle], junk: object, key: str) -> None:
    before, obs, now, _ = play(history)[-1]
    data = json.loads(encode_record(before))
    data[key] = junk
    decoded = decode_record(json.dumps(data))
    t = advance(decoded.record, obs, now, SETTINGS)
    if decoded.error is not None:
        assert not t.persist and all(isinstance(s, EmitEvent) for s in t.steps)


def test_an_escalation_is_not_cleared_by_an_annotation_left_from_before_it() -> None:
    """A GPU reset that times out escalates to REBOOT; a leftover escalation-cleared annotation
    seen in that same pass must not return the unrepaired node (found by the breaker property)."""
    quiet = Cycle(1.0, (), False, False, (), (), (), False, False, False, False)
    fault = xid(48, 0, Action.RESET_GPU)
    first = Cycle(1.0, ((fault, None),), False, False, (("gpu-0", 0),), (), (), False, True, True, False)
    _, _, at, reached = play([quiet] * 9 + [first])[-1]
    record, now = reached.record, at + 700.0
    last = Cycle(700.0, (), False, False, (("node", 0),), (), ((None, True, 1.0),), True, True, True, False)
    ours = record.node_scope is not None and not record.node_scope.dry_run
    t = advance(record, last.observe(now, ours), now, SETTINGS)
    assert not any(isinstance(s, Uncordon) for s in t.steps)
    assert any(isinstance(s, Escalate) for s in t.steps)
