"""Restore and replay decisions, as pure functions: no threads, no API server."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from agent.model import Entity, EntityKind, EventType, Fault, HealthEvent
from agent.publish.conditions import ConditionState, desired_conditions
from agent.restore import (
    FaultTransition,
    RestoredFaults,
    events_after_restore,
    events_to_write,
    faults_from_conditions,
    faults_to_restore,
    hold,
    split_events,
)
from gpuwarden.contract import HEALTHY_REASONS, Action, ConditionType, Reason
from tests.agent.publish.reports import T0, app_xid_event, gpu_entity, ib_fault, remap_fault, report, xid_fault


def warning_for(fault: Fault) -> HealthEvent:
    return HealthEvent(EventType.WARNING, fault.reason, fault.message, fault.entity, T0)


def clearing(condition: ConditionType, entity: Entity) -> HealthEvent:
    return HealthEvent(EventType.NORMAL, HEALTHY_REASONS[condition], "cleared", entity, T0)


def test_split_events_tells_fault_transitions_from_occurrences() -> None:
    fault = xid_fault(2)
    app = app_xid_event(0, 13)
    cleared = clearing(ConditionType.INFINIBAND_DEGRADED, Entity.ib("mlx5_0", 1))
    plain, transitions = split_events(report(fault, events=(warning_for(fault), app, cleared)))
    assert plain == [app]
    assert [(t.condition, t.entity_key, t.reason) for t in transitions] == [
        (ConditionType.GPU_XID_ERROR, fault.entity.key, fault.reason),
        (ConditionType.INFINIBAND_DEGRADED, "ib/mlx5_0/1", None),
    ]


def test_restored_faults_know_their_own_and_every_fault_of_a_node_wide_condition() -> None:
    xid, remap = xid_fault(2), remap_fault(3)
    node_wide = replace(ib_fault(), entity=Entity.node())
    restored = RestoredFaults.of([xid, node_wide])
    assert restored.knew(FaultTransition(warning_for(xid), xid.condition, xid.entity.key, xid.reason))
    assert not restored.knew(FaultTransition(warning_for(remap), remap.condition, remap.entity.key, remap.reason))
    # A clearing Event names no reason: any fault of its condition on that entity.
    assert restored.knew(FaultTransition(warning_for(xid), xid.condition, xid.entity.key, None))
    assert not restored.knew(FaultTransition(warning_for(xid), xid.condition, gpu_entity(5).key, None))
    other_port = ib_fault("mlx5_7")
    assert restored.knew(
        FaultTransition(warning_for(other_port), other_port.condition, other_port.entity.key, other_port.reason)
    )


def test_faults_to_restore_keeps_detail_only_under_true_conditions_and_fills_in_the_rest() -> None:
    xid, remap = xid_fault(2), remap_fault(3)
    states = desired_conditions(report(xid, ib_fault()), {}, T0)
    # The GPUNode lists the XID fault in detail and a remap fault the Node
    # shows False (cleared just before the restart); the IB condition has no detail.
    faults = faults_to_restore(states, [xid, remap])
    assert faults[0] == xid
    assert remap not in faults
    (ib,) = faults[1:]
    assert (ib.condition, ib.reason, ib.entity.kind) == (
        ConditionType.INFINIBAND_DEGRADED,
        Reason.IB_PORT_DOWN,
        EntityKind.NODE,
    )


def test_a_false_condition_restores_nothing() -> None:
    state = ConditionState(ConditionType.GPU_XID_ERROR, False, "NoFatalXid", "", T0)
    assert faults_to_restore({ConditionType.GPU_XID_ERROR: state}, [xid_fault(1)]) == []


def test_before_any_restore_fault_events_are_held_and_occurrences_written() -> None:
    fault, app = xid_fault(2), app_xid_event(0, 13)
    write, held = events_to_write(report(fault, events=(warning_for(fault), app)), None, RestoredFaults.of([]))
    assert list(write) == [app]
    assert [t.event for t in held] == [warning_for(fault)]


def test_a_report_judged_after_the_restore_writes_everything() -> None:
    fault = xid_fault(2)
    r = replace(report(fault, events=(warning_for(fault),)), restore_epoch=1)
    write, held = events_to_write(r, 1, RestoredFaults.of([fault]))
    assert list(write) == [warning_for(fault)]
    assert held == []


def test_a_report_judged_during_the_restore_drops_what_the_node_already_showed() -> None:
    known, new, app = xid_fault(2), remap_fault(3), app_xid_event(0, 13)
    r = report(known, new, events=(warning_for(known), warning_for(new), app))
    write, held = events_to_write(r, 1, RestoredFaults.of([known]))
    assert list(write) == [app, warning_for(new)]
    assert held == []


def test_held_events_are_bounded_oldest_first() -> None:
    transitions = [
        FaultTransition(warning_for(f), f.condition, f.entity.key, f.reason) for f in (xid_fault(i) for i in range(5))
    ]
    kept, dropped = hold(transitions[:3], transitions[3:], limit=4)
    assert (kept, dropped) == (transitions[1:], 1)
    assert hold([], transitions[:2], limit=4) == (transitions[:2], 0)


def test_after_the_restore_held_events_about_known_faults_are_dropped() -> None:
    known, new = xid_fault(2), remap_fault(3)
    held = [FaultTransition(warning_for(f), f.condition, f.entity.key, f.reason) for f in (known, new)]
    assert events_after_restore(held, RestoredFaults.of([known])) == [warning_for(new)]
    later = replace(warning_for(new), time=T0 + timedelta(minutes=1))
    assert events_after_restore([replace(held[1], event=later)], RestoredFaults.of([])) == [later]


def test_true_conditions_without_gpunode_detail_become_node_faults() -> None:
    states = desired_conditions(report(xid_fault(2), ib_fault()), {}, T0)
    faults = faults_from_conditions(states, covered={ConditionType.INFINIBAND_DEGRADED})
    assert len(faults) == 1
    (fault,) = faults
    assert (fault.condition, fault.reason, fault.action) == (ConditionType.GPU_XID_ERROR, "Xid79", Action.REBOOT)
    # A latched condition keeps the GPU its message names (a node-wide fault would not count against it).
    assert fault.entity == gpu_entity(2) and fault.latched
    assert fault.since == T0
    assert "Recommended action" not in fault.message
    # Published again, the restored fault says the same as before.
    again = desired_conditions(report(fault), states, T0 + timedelta(minutes=1))
    assert again[ConditionType.GPU_XID_ERROR].message.endswith("Recommended action: REBOOT.")
    assert again[ConditionType.GPU_XID_ERROR].last_transition == T0


def test_unparseable_action_in_a_condition_message_falls_back_to_none() -> None:
    state = ConditionState(ConditionType.GPU_MISSING, True, "GpuLost", "GPU 6 gone. Recommended action: PRAY.", T0)
    (fault,) = faults_from_conditions({ConditionType.GPU_MISSING: state}, covered=set())
    assert fault.action is Action.NONE


def test_without_the_gpunode_the_gpus_a_latched_condition_names_stay_faulty() -> None:
    lost = Fault(
        condition=ConditionType.GPU_MISSING,
        reason=Reason.GPU_LOST,
        message=f"{gpu_entity(6).describe()} is lost (NVML: GPU is lost; unknown error); recommended action REBOOT",
        action=Action.REBOOT,
        entity=gpu_entity(6),
        since=T0,
        latched=True,
    )
    published = report(xid_fault(2), remap_fault(3), remap_fault(5, failure=True), lost)
    states = desired_conditions(published, {}, T0)
    assert states[ConditionType.GPU_MEMORY_DEGRADED].reason == Reason.MULTIPLE_FAULTS
    faults = faults_to_restore(states, [])  # the GPUNode is gone
    got = {(f.condition, f.reason, f.entity.key, f.action, f.latched) for f in faults}
    assert got == {
        (ConditionType.GPU_XID_ERROR, "Xid79", gpu_entity(2).key, Action.REBOOT, True),
        (ConditionType.GPU_MEMORY_DEGRADED, Reason.ROW_REMAP_PENDING, gpu_entity(3).key, Action.RESET_GPU, True),
        (ConditionType.GPU_MEMORY_DEGRADED, Reason.ROW_REMAP_FAILURE, gpu_entity(5).key, Action.REPLACE, True),
        (ConditionType.GPU_MISSING, Reason.GPU_LOST, gpu_entity(6).key, Action.REBOOT, True),
    }
    by_gpu = {f.entity.gpu_index: f.entity for f in faults}
    assert by_gpu[3] == gpu_entity(3)
    # Published again, each GPU is unhealthy, so out of capacity, and the
    # conditions stay True.
    again = report(*faults)
    assert {g.index for g in again.gpus if not g.healthy} == {2, 3, 5, 6}
    assert all(
        s.problem for t, s in desired_conditions(again, states, T0).items() if t in {f.condition for f in faults}
    )
