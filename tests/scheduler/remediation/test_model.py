"""The record on the Node: its annotation, its label, and reading bad ones."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from gpuwarden.contract import Action, ConditionType, Reason
from scheduler.engine.model import NodeCondition
from scheduler.remediation.model import (
    Attempts,
    Fault,
    HistoryEntry,
    Hold,
    NodeRecord,
    ResetResult,
    Scope,
    ScopeRecord,
    State,
    decode_record,
    encode_record,
    label_value,
)
from scheduler.remediation.observations import GpuIdentity, faults_from_conditions, xid_of
from tests.scheduler.remediation.builders import T0, xid


def full_record() -> NodeRecord:
    gpu = ScopeRecord(
        scope=Scope.gpu(3, "GPU-0003"),
        state=State.REPAIRING,
        need=Action.RESET_GPU,
        fault=xid(48, 3, Action.RESET_GPU),
        gpus=(3,),
        started_at=T0,
        by="gpuwarden-scheduler",
        why="XID 48 on GPU 3",
        fenced_gpus=(3,),
        entered={"quarantined": T0, "draining": T0 + 1, "repairing": T0 + 2},
        attempts=Attempts(reset=1),
        reset_requested_at=T0 + 2,
        last_reset=ResetResult(3, False, T0 + 1.5, "busy"),
        drain_pods_left=0,
        drain_blockers=("a/b: PodDisruptionBudget a/c",),
        note="why not",
    )
    return NodeRecord(
        scopes=(gpu,),
        history=(HistoryEntry("GPU-0003", "GpuXidError", "Xid48", T0),),
        unmanaged_since=T0 - 5,
        suppressed=("GpuMissing/GpuLost/node",),
        hold=Hold("circuit breaker: full", T0 - 1),
    )


def test_a_record_round_trips_through_its_annotation() -> None:
    record = full_record()
    text = encode_record(record)
    assert decode_record(text) == type(decode_record(text))(record)
    assert json.loads(text)["scopes"][0]["lastReset"] == {"gpuIndex": 3, "ok": False, "at": T0 + 1.5, "message": "busy"}
    assert encode_record(decode_record(text).record) == text


def test_no_annotation_is_a_node_never_remediated() -> None:
    for text in (None, ""):
        decoded = decode_record(text)
        assert decoded.error is None and decoded.record == NodeRecord()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{not json", "cannot read"),
        ("[]", "expected an object"),
        ('{"version": 2, "scopes": []}', "version: 2"),
        ('{"version": 1, "scopes": [{"scope": "gpu-1", "state": "sleeping"}]}', "unknown value 'sleeping'"),
        ('{"version": 1, "scopes": [{"scope": "disk"}]}', "expected 'node' or 'gpu-N'"),
        ('{"version": 1, "scopes": "none"}', "expected a list"),
        ("[" * 100000, "cannot read"),
    ],
)
def test_a_malformed_or_unknown_annotation_is_an_error_and_an_unreadable_record(text: str, says: str) -> None:
    decoded = decode_record(text)
    assert decoded.error is not None and says in decoded.error
    assert decoded.record.unreadable == decoded.error and decoded.record.scopes == ()
    assert label_value(decoded.record) == "unreadable"
    with pytest.raises(ValueError, match="never written back"):
        encode_record(decoded.record)


def test_a_healthy_scope_or_a_scope_twice_is_refused() -> None:
    scope = json.loads(encode_record(full_record()))["scopes"][0]
    twice = json.dumps({"version": 1, "scopes": [scope, scope]})
    assert "the same scope twice" in (decode_record(twice).error or "")
    healthy = json.dumps({"version": 1, "scopes": [{**scope, "state": "healthy"}]})
    assert "healthy scope" in (decode_record(healthy).error or "")


def test_the_label_shows_the_node_state_or_the_gpu_state_most_in_need_of_a_person() -> None:
    base = full_record().scopes[0]
    failed = replace(base, scope=Scope.gpu(5), state=State.FAILED)
    assert label_value(NodeRecord()) == "healthy"
    assert label_value(NodeRecord(unmanaged_since=T0)) == "unmanaged"
    assert label_value(NodeRecord(scopes=(base,))) == "gpu-repairing"
    assert label_value(NodeRecord(scopes=(base, failed))) == "gpu-failed"
    node = replace(base, scope=Scope.node(), state=State.VALIDATING, dry_run=True)
    assert label_value(NodeRecord(scopes=(failed, node))) == "dry-run-validating"


def test_faults_from_conditions_take_only_fatal_ones_one_per_gpu() -> None:
    conditions = (
        NodeCondition("GpuXidError", True, "Xid48", "msg", Action.RESET_GPU, (1, 4)),
        NodeCondition("GpuNvlinkDegraded", True, "NvlinkErrorRate", "", Action.RESTART_APP, (2,)),
        NodeCondition(ConditionType.GPU_MISSING.value, True, Reason.GPU_LOST.value, "", Action.REBOOT),
        NodeCondition("GpuXidError", False, "NoFatalXid"),
    )
    faults = faults_from_conditions(conditions, (GpuIdentity(1, "GPU-a"),), {("GpuXidError", "Xid48", 4): T0})
    assert faults == (
        Fault("GpuXidError", "Xid48", Action.RESET_GPU, 1, "GPU-a", 48, None, "msg"),
        Fault("GpuXidError", "Xid48", Action.RESET_GPU, 4, "", 48, T0, "msg"),
        Fault("GpuMissing", "GpuLost", Action.REBOOT),
    )
    assert xid_of("Xid79") == 79 and xid_of("XidBad") is None and xid_of("RowRemapFailure") is None
