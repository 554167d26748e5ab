"""The transition function, rule by rule, on hand-written observations."""

from __future__ import annotations

from dataclasses import replace

from gpuwarden.contract import ANNOTATION_ESCALATION_CLEARED, Action, ConditionType, Reason
from scheduler.remediation.breaker import BreakerVerdict
from scheduler.remediation.model import (
    Fault,
    HistoryEntry,
    NodeRecord,
    ResetResult,
    State,
    ValidationResult,
    decode_record,
)
from scheduler.remediation.observations import DrainProgress
from scheduler.remediation.policy import Settings
from scheduler.remediation.steps import (
    ClearEscalation,
    Cordon,
    Drain,
    EmitEvent,
    Escalate,
    EventReason,
    QuarantineGpu,
    RequestGpuReset,
    RequestValidation,
    ReturnGpu,
    StopManaging,
    Uncordon,
)
from tests.scheduler.remediation.builders import T0, kinds, node, run, xid

XID48 = xid(48, 3, Action.RESET_GPU)
XID79 = xid(79, 2, Action.REBOOT)
CORDONED = {"unschedulable": True, "quarantine_taint": True}


def reasons(t: object) -> list[str]:
    return [s.reason for s in t.steps if isinstance(s, EmitEvent)]  # type: ignore[attr-defined]


def gpu3_validating() -> NodeRecord:
    """GPU 3 quarantined, drained, reset at T0+30 and waiting for validation."""
    r = run(NodeRecord(), node(faults=(XID48,)), T0 + 10).record
    r = run(r, node(faults=(XID48,), drains=(DrainProgress("gpu-3", 0),)), T0 + 20).record
    r = run(r, node(faults=(XID48,), resets=(ResetResult(3, True, T0 + 30),)), T0 + 31).record
    scope = r.scope_for_gpu(3)
    assert scope is not None and scope.state is State.VALIDATING and scope.repaired_at == T0 + 30
    return r


def node_escalated() -> NodeRecord:
    """The node cordoned for XID 79, drained, escalated with REBOOT at T0+30."""
    r = run(NodeRecord(), node(faults=(XID79,)), T0 + 10).record
    r = run(r, node(faults=(XID79,), **CORDONED), T0 + 20).record
    r = run(r, node(faults=(XID79,), drains=(DrainProgress("node", 0),), **CORDONED), T0 + 30).record
    assert r.node_scope is not None and r.node_scope.state is State.ESCALATED
    return r


# ---------------------------------------------------------------- quarantine scope


def test_a_reset_gpu_fault_on_one_gpu_quarantines_that_gpu_only() -> None:
    t = run(NodeRecord(), node(faults=(XID48,)), T0)
    assert QuarantineGpu(3, "GPU-0003") in t.steps
    assert not any(isinstance(s, Cordon) for s in t.steps)
    assert Drain(t.record.scopes[0].scope, (3,), T0) in t.steps
    assert t.label == "gpu-draining"
    scope = t.record.scopes[0]
    assert (scope.scope.key, scope.need, scope.gpus, scope.by) == (
        "gpu-3",
        Action.RESET_GPU,
        (3,),
        "gpuwarden-scheduler",
    )
    assert scope.fault.xid == 48 and "XID 48 on GPU 3" in scope.why


def test_reboot_replace_and_node_level_faults_cordon_the_node_with_time_added() -> None:
    ib_down = Fault(ConditionType.INFINIBAND_DEGRADED.value, Reason.IB_PORT_DOWN.value, Action.REPLACE)
    missing = Fault(ConditionType.GPU_MISSING.value, Reason.GPU_COUNT_MISMATCH.value, Action.REBOOT)
    reset_no_gpu = Fault(ConditionType.GPU_NVLINK_DEGRADED.value, Reason.NVLINK_DOWN.value, Action.RESET_GPU)
    for fault, need in (
        (XID79, Action.REBOOT),
        (ib_down, Action.REPLACE),
        (missing, Action.REBOOT),
        (reset_no_gpu, Action.REBOOT),
    ):
        t = run(NodeRecord(), node(faults=(fault,)), T0)
        assert Cordon(T0) in t.steps, fault
        assert t.record.node_scope is not None and t.record.node_scope.need is need
        assert not any(isinstance(s, QuarantineGpu) for s in t.steps)
        assert t.label == "draining"


def test_a_fault_that_is_not_fatal_starts_nothing() -> None:
    flap = Fault(ConditionType.INFINIBAND_DEGRADED.value, Reason.IB_LINK_DOWNED.value, Action.RESTART_APP)
    t = run(NodeRecord(), node(faults=(flap,)), T0)
    assert t.steps == () and t.record == NodeRecord() and t.label == "healthy"


def test_a_node_fault_absorbs_the_gpu_workflow_and_returns_its_gpu_only_with_the_node() -> None:
    r = gpu3_validating()
    t = run(r, node(faults=(XID48, XID79)), T0 + 40)
    ns = t.record.node_scope
    assert ns is not None and [s.scope.key for s in t.record.scopes] == ["node"]
    assert ns.fenced_gpus == (3,) and QuarantineGpu(3, "GPU-0003") in t.steps and Cordon(T0 + 40) in t.steps
    assert not any(isinstance(s, ReturnGpu) for s in t.steps)
    r = run(t.record, node(faults=(XID79,), drains=(DrainProgress("node", 0),), **CORDONED), T0 + 50).record
    r = run(r, node(faults=(XID79,), escalation_cleared="rebooted", **CORDONED), T0 + 60).record
    t = run(r, node(validations=(ValidationResult(None, True, T0 + 70),), **CORDONED), T0 + 71)
    assert Uncordon() in t.steps and ReturnGpu(3, "GPU-0003") in t.steps and t.label == "healthy"


# ---------------------------------------------------------------- drain


def test_the_drain_waits_for_the_last_pod_and_reports_each_new_set_of_blockers_once() -> None:
    r = run(NodeRecord(), node(faults=(XID48,)), T0).record
    blocked = DrainProgress("gpu-3", 1, ("team/train-0: PodDisruptionBudget team/train",))
    t = run(r, node(faults=(XID48,), drains=(blocked,)), T0 + 5)
    assert reasons(t) == [EventReason.DRAIN_BLOCKED] and "team/train-0" in t.steps[-1].message  # type: ignore[union-attr]
    assert t.record.scopes[0].drain_blockers == blocked.blockers and t.record.scopes[0].drain_pods_left == 1
    again = run(t.record, node(faults=(XID48,), drains=(blocked,)), T0 + 10)
    assert reasons(again) == [] and again.record == t.record
    unmeasured = run(t.record, node(faults=(XID48,)), T0 + 15)
    assert unmeasured.record.scopes[0].state is State.DRAINING
    done = run(t.record, node(faults=(XID48,), drains=(DrainProgress("gpu-3", 0),)), T0 + 20)
    assert done.record.scopes[0].state is State.REPAIRING and RequestGpuReset(3, "GPU-0003", T0 + 20) in done.steps


def test_a_drain_past_its_timeout_fails_the_workflow_and_names_the_blockers() -> None:
    settings = Settings(drain_timeout_s=600)
    r = run(NodeRecord(), node(faults=(XID48,)), T0, settings).record
    blocked = DrainProgress("gpu-3", 1, ("team/p: PodDisruptionBudget team/pdb",))
    r = run(r, node(faults=(XID48,), drains=(blocked,)), T0 + 10, settings).record
    t = run(r, node(faults=(XID48,), drains=(blocked,)), T0 + 601, settings)
    assert t.record.scopes[0].state is State.FAILED and "team/pdb" in t.record.scopes[0].note
    assert EventReason.DRAIN_TIMED_OUT in reasons(t) and QuarantineGpu(3, "GPU-0003") in t.steps


def test_the_concurrent_drain_limit_queues_the_drain_with_one_event() -> None:
    full = BreakerVerdict(drain_allowed=False, reason="pool default already drains 10 nodes")
    t = run(NodeRecord(), node(faults=(XID48,), breaker=full), T0)
    assert t.record.scopes[0].state is State.QUARANTINED and not any(isinstance(s, Drain) for s in t.steps)
    assert reasons(t) == [EventReason.GPU_QUARANTINED, EventReason.DRAIN_QUEUED]
    again = run(t.record, node(faults=(XID48,), breaker=full), T0 + 5)
    assert reasons(again) == []
    freed = run(again.record, node(faults=(XID48,)), T0 + 10)
    assert freed.record.scopes[0].state is State.DRAINING


# ---------------------------------------------------------------- repair


def test_a_gpu_is_reset_validated_and_returned() -> None:
    r = gpu3_validating()
    held = run(r, node(faults=(XID48,)), T0 + 40)
    assert RequestValidation(r.scopes[0].scope, (3,), T0 + 31, T0 + 30) in held.steps
    t = run(r, node(faults=(XID48,), validations=(ValidationResult(3, True, T0 + 45),)), T0 + 50)
    assert ReturnGpu(3, "GPU-0003") in t.steps and t.record.scopes == ()
    assert reasons(t) == [EventReason.GPU_RETURNED]


def test_a_reset_result_from_before_the_request_does_not_count() -> None:
    r = run(NodeRecord(), node(faults=(XID48,), drains=(DrainProgress("gpu-3", 0),)), T0).record
    t = run(r, node(faults=(XID48,), resets=(ResetResult(3, True, T0 - 1),)), T0 + 5)
    assert t.record.scopes[0].state is State.REPAIRING


def test_a_failed_reset_escalates_to_a_reboot_of_the_whole_node() -> None:
    r = run(NodeRecord(), node(faults=(XID48,), drains=(DrainProgress("gpu-3", 0),)), T0).record
    t = run(r, node(faults=(XID48,), resets=(ResetResult(3, False, T0 + 5, "GPU in use"),)), T0 + 6)
    ns = t.record.node_scope
    assert ns is not None and ns.need is Action.REBOOT and ns.fenced_gpus == (3,) and ns.state is State.DRAINING
    assert Cordon(T0 + 6) in t.steps and EventReason.RESET_FAILED in reasons(t)
    assert "GPU in use" in ns.why


def test_a_reset_not_reported_in_time_counts_as_failed_and_is_retried_up_to_the_limit() -> None:
    settings = Settings(reset_timeout_s=100, max_reset_attempts=2)
    r = run(NodeRecord(), node(faults=(XID48,), drains=(DrainProgress("gpu-3", 0),)), T0, settings).record
    assert run(r, node(faults=(XID48,)), T0 + 100, settings).record == r
    retry = run(r, node(faults=(XID48,)), T0 + 101, settings)
    scope = retry.record.scopes[0]
    assert scope.state is State.REPAIRING and scope.attempts.reset == 2 and scope.reset_requested_at == T0 + 101
    out = run(retry.record, node(faults=(XID48,)), T0 + 202, settings)
    assert out.record.node_scope is not None and out.record.node_scope.need is Action.REBOOT


def test_reboot_is_escalated_to_people_and_cleared_by_their_annotation() -> None:
    r = node_escalated()
    ns = r.node_scope
    assert ns is not None and ns.attempts.escalation == 1
    t = run(
        run(NodeRecord(), node(faults=(XID79,)), T0 + 10).record,
        node(faults=(XID79,), drains=(DrainProgress("node", 0),), **CORDONED),
        T0 + 30,
    )
    escalate = next(s for s in t.steps if isinstance(s, Escalate))
    body = escalate.payload()
    assert (body["node"], body["need"], body["scope"], body["fault"]["xid"]) == ("gpu-node-7", "REBOOT", "node", 79)
    assert t.label == "escalated" and ANNOTATION_ESCALATION_CLEARED in t.steps[-1].message  # type: ignore[union-attr]
    waiting = run(r, node(faults=(XID79,), **CORDONED), T0 + 1000)
    assert waiting.record == r and kinds(waiting) == ["Cordon"]
    cleared = run(r, node(faults=(XID79,), escalation_cleared="ticket 42: rebooted", **CORDONED), T0 + 2000)
    scope = cleared.record.node_scope
    assert scope is not None and scope.state is State.VALIDATING and scope.repaired_at == T0 + 2000
    assert ClearEscalation() in cleared.steps and "ticket 42" in scope.note


def test_a_validation_pass_older_than_the_repair_returns_nothing() -> None:
    r = gpu3_validating()
    stale = (ValidationResult(3, True, T0 + 30), ValidationResult(None, True, T0 + 1))
    t = run(r, node(faults=(XID48,), validations=stale), T0 + 40)
    assert not any(isinstance(s, ReturnGpu) for s in t.steps) and t.record.scopes[0].state is State.VALIDATING


def test_a_node_wide_pass_validates_a_gpu_but_another_gpus_pass_does_not() -> None:
    r = gpu3_validating()
    other = run(r, node(validations=(ValidationResult(4, True, T0 + 45),)), T0 + 50)
    assert other.record.scopes[0].state is State.VALIDATING
    whole = run(r, node(validations=(ValidationResult(None, True, T0 + 45),)), T0 + 50)
    assert ReturnGpu(3, "GPU-0003") in whole.steps


def test_a_pass_waits_for_a_fault_whose_age_is_unknown_to_clear() -> None:
    r = gpu3_validating()
    unknown_age = replace(XID48, since=None)
    t = run(r, node(faults=(unknown_age,), validations=(ValidationResult(3, True, T0 + 45),)), T0 + 50)
    assert t.record.scopes[0].state is State.VALIDATING and t.record.scopes[0].last_validation_pass_at == T0 + 45
    assert (
        run(t.record, node(faults=(unknown_age,), validations=(ValidationResult(3, True, T0 + 45),)), T0 + 55).steps
        == t.steps[:2]
    )


def test_validation_failures_climb_the_ladder_reboot_then_replace_then_failed() -> None:
    r = gpu3_validating()
    t = run(r, node(faults=(XID48,), validations=(ValidationResult(3, False, T0 + 40, "dcgmi diag failed"),)), T0 + 41)
    ns = t.record.node_scope
    assert ns is not None and ns.need is Action.REBOOT and EventReason.VALIDATION_FAILED in reasons(t)
    r = run(t.record, node(faults=(XID48,), drains=(DrainProgress("node", 0),), **CORDONED), T0 + 50).record
    r = run(r, node(faults=(XID48,), escalation_cleared="rebooted", **CORDONED), T0 + 60).record
    t = run(r, node(faults=(XID48,), validations=(ValidationResult(None, False, T0 + 70),), **CORDONED), T0 + 71)
    ns = t.record.node_scope
    assert ns is not None and ns.state is State.ESCALATED and ns.need is Action.REPLACE
    assert any(isinstance(s, Escalate) and s.need is Action.REPLACE for s in t.steps)
    r = run(t.record, node(faults=(XID48,), escalation_cleared="replaced", **CORDONED), T0 + 80).record
    t = run(r, node(faults=(XID48,), validations=(ValidationResult(None, False, T0 + 90),), **CORDONED), T0 + 91)
    assert t.record.node_scope is not None and t.record.node_scope.state is State.FAILED and t.label == "failed"
    assert EventReason.REMEDIATION_FAILED in reasons(t) and Cordon(T0 + 41) in t.steps
    again = run(t.record, node(faults=(XID48,), escalation_cleared="looked at it", **CORDONED), T0 + 100)
    assert again.record.node_scope is not None and again.record.node_scope.state is State.VALIDATING


def test_no_validation_within_the_timeout_counts_as_a_failure() -> None:
    settings = Settings(validation_timeout_s=100)
    r = gpu3_validating()
    assert run(r, node(faults=(XID48,)), T0 + 131, settings).record == r
    t = run(r, node(faults=(XID48,)), T0 + 132, settings)
    assert t.record.node_scope is not None and t.record.node_scope.need is Action.REBOOT


# ---------------------------------------------------------------- repeat window


def test_a_fault_coming_back_during_validation_asks_for_replacement() -> None:
    r = gpu3_validating()
    back = replace(XID48, since=T0 + 35)
    t = run(r, node(faults=(back,)), T0 + 36)
    assert t.record.node_scope is not None and t.record.node_scope.need is Action.REPLACE


def test_a_gpu_fault_within_the_repeat_window_asks_for_replacement_and_outside_it_another_reset() -> None:
    history = (HistoryEntry("GPU-0003", "GpuXidError", "Xid48", T0),)
    again = replace(XID48, since=T0 + 86400)
    inside = run(NodeRecord(history=history), node(faults=(again,)), T0 + 6 * 86400)
    assert inside.record.node_scope is not None and inside.record.node_scope.need is Action.REPLACE
    assert EventReason.REPEAT_FAULT in reasons(inside) and Cordon(T0 + 6 * 86400) in inside.steps
    outside = run(NodeRecord(history=history), node(faults=(again,)), T0 + 8 * 86400)
    assert outside.record.node_scope is None and outside.record.scopes[0].need is Action.RESET_GPU
    assert outside.record.history == (HistoryEntry("GPU-0003", "GpuXidError", "Xid48", T0 + 8 * 86400),)


def test_a_replaced_gpu_is_new_hardware_for_the_repeat_window() -> None:
    history = (HistoryEntry("GPU-0003", "GpuXidError", "Xid48", T0),)
    new_board = replace(XID48, gpu_uuid="GPU-NEW")
    t = run(NodeRecord(history=history), node(faults=(new_board,)), T0 + 86400)
    assert t.record.node_scope is None and t.record.scopes[0].need is Action.RESET_GPU


def test_a_second_reboot_fault_within_the_window_asks_for_replacement() -> None:
    history = (HistoryEntry("node", "GpuXidError", "Xid79", T0),)
    t = run(NodeRecord(history=history), node(faults=(XID79,)), T0 + 3 * 86400)
    assert t.record.node_scope is not None and t.record.node_scope.need is Action.REPLACE


IB_RATE = Fault(ConditionType.INFINIBAND_DEGRADED.value, Reason.IB_RATE_DEGRADED.value, Action.REPLACE, since=T0)


def test_a_first_fault_that_asks_for_replacement_itself_is_no_repeat_fault() -> None:
    # The demo's InfiniBand port at half rate: REPLACE is the fault's own action,
    # and the node had no workflow before, so nothing may call it a repeat.
    t = run(NodeRecord(), node(faults=(IB_RATE,)), T0 + 10)
    assert t.record.node_scope is not None and t.record.node_scope.need is Action.REPLACE
    assert EventReason.REPEAT_FAULT not in reasons(t)
    assert EventReason.NODE_QUARANTINED in reasons(t)
    assert "repeat window" not in t.record.node_scope.why


def test_a_replacement_fault_again_within_the_window_is_a_repeat_fault() -> None:
    history = (HistoryEntry("node", IB_RATE.condition, IB_RATE.reason, T0),)
    t = run(NodeRecord(history=history), node(faults=(IB_RATE,)), T0 + 86400)
    assert t.record.node_scope is not None and t.record.node_scope.need is Action.REPLACE
    events = [s for s in t.steps if isinstance(s, EmitEvent) and s.reason == EventReason.REPEAT_FAULT]
    assert len(events) == 1 and "again within the repeat window" in events[0].message


def test_the_old_latched_fault_after_a_return_starts_nothing_but_the_same_fault_later_does() -> None:
    r = gpu3_validating()
    r = run(r, node(faults=(XID48,), validations=(ValidationResult(3, True, T0 + 45),)), T0 + 50).record
    lingering = run(r, node(faults=(XID48,)), T0 + 60)
    assert lingering.steps == () and lingering.record.scopes == ()
    cleared = run(lingering.record, node(), T0 + 70).record
    assert cleared.suppressed == ()
    again = run(cleared, node(faults=(replace(XID48, since=T0 + 80),)), T0 + 80)
    assert again.record.node_scope is not None and again.record.node_scope.need is Action.REPLACE


# ---------------------------------------------------------------- people


def test_a_node_cordoned_by_a_person_is_left_alone_with_one_event() -> None:
    t = run(NodeRecord(), node(faults=(XID79, XID48), unschedulable=True), T0)
    assert t.record.scopes == () and reasons(t) == [EventReason.QUARANTINE_HELD] and kinds(t) == ["EmitEvent"]
    assert t.record.hold is not None and "person" in t.record.hold.reason
    again = run(t.record, node(faults=(XID79, XID48), unschedulable=True), T0 + 10)
    assert again.steps == () and again.record == t.record
    uncordoned = run(again.record, node(faults=(XID79, XID48)), T0 + 20)
    assert uncordoned.record.node_scope is not None and uncordoned.record.hold is None


def test_a_manual_uncordon_mid_workflow_stops_management_until_a_new_fault() -> None:
    r = node_escalated()
    t = run(r, node(faults=(XID79,)), T0 + 40)
    assert kinds(t) == ["StopManaging", "EmitEvent"] and reasons(t) == [EventReason.MANUAL_UNCORDON]
    assert isinstance(t.steps[0], StopManaging) and t.record.scopes == () and t.label == "unmanaged"
    assert t.record.suppressed == (XID79.key,)
    same = run(t.record, node(faults=(XID79,)), T0 + 50)
    assert same.steps == () and same.label == "unmanaged"
    new = run(same.record, node(faults=(XID79, XID48)), T0 + 60)
    assert new.record.scope_for_gpu(3) is not None and new.record.unmanaged_since is None
    assert new.record.node_scope is None


def test_a_cordon_not_yet_applied_is_not_taken_for_a_manual_uncordon() -> None:
    r = run(NodeRecord(), node(faults=(XID79,)), T0).record
    t = run(r, node(faults=(XID79,)), T0 + 5)
    assert t.record.node_scope is not None and Cordon(T0) in t.steps
    assert not any(isinstance(s, StopManaging) for s in t.steps)


# ---------------------------------------------------------------- breaker


def test_the_breaker_holds_a_new_quarantine_with_one_event_and_lets_it_start_later() -> None:
    tripped = BreakerVerdict(quarantine_allowed=False, reason="pool default has 10 of 100 nodes out")
    t = run(NodeRecord(), node(faults=(XID79,), breaker=tripped), T0)
    assert t.record.scopes == () and kinds(t) == ["EmitEvent"] and "10 of 100" in t.steps[0].message  # type: ignore[union-attr]
    assert run(t.record, node(faults=(XID79,), breaker=tripped), T0 + 5).steps == ()
    later = run(t.record, node(faults=(XID79,)), T0 + 10)
    assert later.record.node_scope is not None and later.record.hold is None


def test_the_breaker_never_blocks_a_return_nor_a_node_already_out() -> None:
    tripped = BreakerVerdict(quarantine_allowed=False, drain_allowed=False, reason="tripped")
    r = gpu3_validating()
    t = run(r, node(validations=(ValidationResult(3, True, T0 + 45),), breaker=tripped), T0 + 50)
    assert ReturnGpu(3, "GPU-0003") in t.steps
    more = run(r, node(faults=(XID48, xid(48, 5, Action.RESET_GPU)), breaker=tripped), T0 + 50)
    assert more.record.scope_for_gpu(5) is not None


# ---------------------------------------------------------------- dry-run, lost records


def test_dry_run_records_and_emits_but_changes_nothing() -> None:
    dry = Settings(dry_run=True)
    t = run(NodeRecord(), node(faults=(XID79,)), T0, dry)
    assert all(isinstance(s, EmitEvent) for s in t.steps) and t.label == "dry-run-draining"
    assert t.record.node_scope is not None and t.record.node_scope.dry_run and t.record.history == ()
    t = run(t.record, node(faults=(XID79,), drains=(DrainProgress("node", 0),)), T0 + 10, dry)
    assert all(isinstance(s, EmitEvent) for s in t.steps)
    assert any(s.reason is EventReason.DRY_RUN and "escalate" in s.message for s in t.steps)  # type: ignore[union-attr]
    assert run(t.record, node(faults=(XID79,)), T0 + 10**6, dry).record == t.record


def test_leaving_dry_run_discards_dry_run_workflows_and_starts_for_real() -> None:
    r = run(NodeRecord(), node(faults=(XID79,)), T0, Settings(dry_run=True)).record
    t = run(r, node(faults=(XID79,)), T0 + 10)
    ns = t.record.node_scope
    assert ns is not None and not ns.dry_run and ns.started_at == T0 + 10 and Cordon(T0 + 10) in t.steps
    assert EventReason.DRY_RUN_DISCARDED in reasons(t)


def test_entering_dry_run_freezes_live_workflows() -> None:
    r = node_escalated()
    t = run(r, node(faults=(XID79,), escalation_cleared="done", **CORDONED), T0 + 50, Settings(dry_run=True))
    assert t.record == r and t.steps == ()


def test_an_unreadable_record_changes_nothing_and_is_not_written_back() -> None:
    bad = decode_record('{"version": 1, "scopes": [{"scope": "gpu-x"}]}').record
    t = run(bad, node(faults=(XID79,), validations=(ValidationResult(None, True, T0),)), T0 + 5)
    assert not t.persist and kinds(t) == ["EmitEvent"] and reasons(t) == [EventReason.RECORD_UNREADABLE]
    assert t.label == "unreadable"


def test_a_quarantine_without_a_record_is_adopted_and_needs_a_fresh_pass() -> None:
    t = run(NodeRecord(), node(validations=(ValidationResult(None, True, T0 - 10),), **CORDONED), T0)
    ns = t.record.node_scope
    assert ns is not None and ns.state is State.VALIDATING and ns.cordon_confirmed
    assert EventReason.ORPHAN_ADOPTED in reasons(t) and not any(isinstance(s, Uncordon) for s in t.steps)
    fresh = run(t.record, node(validations=(ValidationResult(None, True, T0 + 10),), **CORDONED), T0 + 20)
    assert Uncordon() in fresh.steps


def test_a_worse_fault_while_escalated_escalates_again_for_replacement() -> None:
    r = node_escalated()
    ib = Fault(ConditionType.INFINIBAND_DEGRADED.value, Reason.IB_PORT_MISSING.value, Action.REPLACE)
    t = run(r, node(faults=(XID79, ib), **CORDONED), T0 + 40)
    ns = t.record.node_scope
    assert ns is not None and ns.need is Action.REPLACE and ns.attempts.escalation == 2
    assert any(isinstance(s, Escalate) and s.need is Action.REPLACE for s in t.steps)
