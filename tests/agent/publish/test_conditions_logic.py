"""Condition content without an API server: messages, reasons, transitions."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from agent.publish.conditions import (
    MAX_FAULT_TEXT,
    MAX_LISTED_FAULTS,
    ConditionState,
    condition_message,
    conditions_from_node,
    conditions_held_by_errors,
    desired_conditions,
)
from gpuwarden.contract import HEALTHY_REASONS, ConditionType, Reason
from tests.agent.publish.reports import T0, ib_fault, remap_fault, report, xid_fault


def test_healthy_report_gives_every_condition_false_with_its_healthy_reason() -> None:
    states = desired_conditions(report(), {}, T0)
    assert set(states) == set(ConditionType)
    for ctype, state in states.items():
        assert state.status == "False"
        assert state.reason == HEALTHY_REASONS[ctype]
        assert state.message


def test_fault_message_names_gpu_uuid_bus_id_and_action() -> None:
    states = desired_conditions(report(xid_fault(3)), {}, T0)
    xid = states[ConditionType.GPU_XID_ERROR]
    assert xid.status == "True"
    assert xid.reason == "Xid79"
    assert "GPU 3" in xid.message
    assert "GPU-0003-aaaa" in xid.message
    assert "00000000:1B:00.0" in xid.message
    assert xid.message.endswith("Recommended action: REBOOT.")
    assert states[ConditionType.GPU_MEMORY_DEGRADED].status == "False"


def test_ib_fault_message_names_device_and_port() -> None:
    state = desired_conditions(report(ib_fault("mlx5_1", 1)), {}, T0)[ConditionType.INFINIBAND_DEGRADED]
    assert state.reason == Reason.IB_PORT_DOWN
    assert "mlx5_1 port 1" in state.message
    assert "Recommended action: REPLACE" in state.message


def test_several_gpus_listed_in_one_message_with_worst_action() -> None:
    faults = [remap_fault(5), remap_fault(2, failure=True)]
    state = desired_conditions(report(*faults), {}, T0)[ConditionType.GPU_MEMORY_DEGRADED]
    assert state.reason == Reason.MULTIPLE_FAULTS
    assert state.message.index("GPU 2") < state.message.index("GPU 5")
    assert state.message.endswith("Recommended action: REPLACE.")


def test_long_lists_are_bounded_with_and_n_more() -> None:
    faults = [xid_fault(i) for i in range(8)]
    message = condition_message(faults)
    assert f"and {8 - MAX_LISTED_FAULTS} more" in message
    assert "GPU 7" not in message
    assert message.endswith("Recommended action: REBOOT.")


@given(st.lists(st.text(min_size=0, max_size=2000), min_size=1, max_size=40))
def test_message_length_is_bounded_whatever_the_fault_texts(texts: list[str]) -> None:
    faults = [replace(xid_fault(i), message=t) for i, t in enumerate(texts)]
    message = condition_message(faults)
    bound = MAX_LISTED_FAULTS * (MAX_FAULT_TEXT + 2) + 80
    assert len(message) <= bound
    assert message.endswith("Recommended action: REBOOT.")


def test_transition_time_kept_while_status_unchanged_and_moved_on_flip() -> None:
    first = desired_conditions(report(xid_fault(0)), {}, T0)
    later = T0 + timedelta(minutes=5)
    # Another GPU joins: reason/message change, status does not.
    second = desired_conditions(report(xid_fault(0), xid_fault(1, 48)), first, later)
    assert second[ConditionType.GPU_XID_ERROR].last_transition == T0
    assert second[ConditionType.GPU_XID_ERROR].reason == Reason.MULTIPLE_FAULTS
    assert second[ConditionType.GPU_PCIE_DEGRADED].last_transition == T0
    cleared = desired_conditions(report(time=later), second, later + timedelta(seconds=40))
    assert cleared[ConditionType.GPU_XID_ERROR].last_transition == later  # when it cleared, not when written
    assert cleared[ConditionType.GPU_XID_ERROR].status == "False"


def test_a_transition_is_dated_when_it_was_detected_not_when_it_was_written() -> None:
    """A cold start or an API outage's backoff delays the write, not the fault."""
    detected = T0 + timedelta(seconds=3)
    written = T0 + timedelta(seconds=43)
    states = desired_conditions(
        report(xid_fault(0, since=detected), xid_fault(1, since=T0 + timedelta(seconds=9))), {}, written
    )
    assert states[ConditionType.GPU_XID_ERROR].last_transition == detected  # the earliest fault
    # A detection time ahead of the writer's clock (a clock step) is never published as the future.
    ahead = desired_conditions(report(xid_fault(0, since=written + timedelta(hours=1))), {}, written)
    assert ahead[ConditionType.GPU_XID_ERROR].last_transition == written


def test_failed_probe_keeps_a_true_condition_true() -> None:
    before = desired_conditions(report(ib_fault("mlx5_0", 1)), {}, T0)
    later = T0 + timedelta(seconds=10)
    after = desired_conditions(report(errors=("infiniband: sysfs read failed",)), before, later)
    assert after[ConditionType.INFINIBAND_DEGRADED] == before[ConditionType.INFINIBAND_DEGRADED]


def test_probe_errors_hold_the_conditions_of_their_source_and_unknown_ones_hold_all() -> None:
    assert conditions_held_by_errors(["something odd happened"]) == frozenset(ConditionType)
    gpu = conditions_held_by_errors(["gpu: NVML Shared Library Not Found"])
    assert ConditionType.GPU_MISSING in gpu
    assert ConditionType.STORAGE_DEGRADED not in gpu
    assert conditions_held_by_errors(["infiniband: [Errno 2] No such file: /sys/class/infiniband"]) == {
        ConditionType.INFINIBAND_DEGRADED
    }
    assert conditions_held_by_errors(["storage: storage probe failed: OSError()"]) == {ConditionType.STORAGE_DEGRADED}


def test_conditions_read_back_from_a_node_ignore_other_types_and_bad_entries() -> None:
    node = {
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-29T09:00:00Z"},
                {
                    "type": "GpuXidError",
                    "status": "True",
                    "reason": "Xid79",
                    "message": "GPU 0: Xid 79",
                    "lastTransitionTime": "2026-11-29T09:30:00Z",
                },
                {"type": "GpuMissing", "status": "Maybe", "lastTransitionTime": "2026-11-29T09:30:00Z"},
                {"type": "StorageDegraded", "status": "False"},
                "not a condition",
            ]
        }
    }
    found = conditions_from_node(node)
    assert set(found) == {ConditionType.GPU_XID_ERROR}
    assert found[ConditionType.GPU_XID_ERROR].problem
    assert found[ConditionType.GPU_XID_ERROR].last_transition == T0 - timedelta(minutes=30)


def test_rule_action_tail_is_stated_once_and_mixed_actions_are_kept_per_fault() -> None:
    single = replace(remap_fault(3), message="row remap pending; recommended action RESET_GPU")
    message = condition_message([single])
    assert message.count("RESET_GPU") == 1
    assert message.endswith("Recommended action: RESET_GPU.")
    mixed = condition_message([single, remap_fault(4, failure=True)])
    assert "[RESET_GPU]" in mixed
    assert "[REPLACE]" in mixed
    assert mixed.endswith("Recommended action: REPLACE.")


@given(st.lists(st.sets(st.integers(min_value=0, max_value=7), max_size=4), min_size=1, max_size=12))
def test_transition_times_move_exactly_when_status_flips(polls: list[set[int]]) -> None:
    """Over any sequence of polls, lastTransitionTime changes iff the status does."""
    previous: dict[ConditionType, ConditionState] = {}
    for step, failing in enumerate(polls):
        now = T0 + timedelta(seconds=10 * step)
        faults = (xid_fault(i, since=now) for i in sorted(failing))
        states = desired_conditions(report(*faults, time=now), previous, now)
        xid = states[ConditionType.GPU_XID_ERROR]
        assert xid.problem == bool(failing)
        before = previous.get(ConditionType.GPU_XID_ERROR)
        if before is None or before.problem != xid.problem:
            assert xid.last_transition == now
        else:
            assert xid.last_transition == before.last_transition
        for i in failing:
            assert f"GPU {i} " in xid.message  # at most MAX_LISTED_FAULTS fail here: all are named
        previous = states
