"""The GPUNode's remediation requests and answers, and the checks, as pure functions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from agent.model import Entity, Fault, GpuStatus, HealthReport
from agent.remediation.checks import health_checks
from agent.remediation.model import (
    MAX_ENTRIES,
    RemediationSpec,
    ResetAnswer,
    ResetRequest,
    ValidationAnswer,
    ValidationRequest,
    answers_from_gpunode,
    answers_to_keep,
    format_instant,
    repaired_at,
    spec_from_gpunode,
    status_json,
    without_repaired,
)
from gpuwarden.contract import RESET_FAILED, RESET_SUCCEEDED, RESET_WAITING, Action, ConditionType

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
ASKED = "2026-12-01T10:00:00Z"


def test_the_spec_is_read_leniently_one_bad_entry_costing_no_other() -> None:
    obj = {
        "metadata": {"name": "n"},
        "spec": {
            "remediation": {
                "resets": [
                    {"gpu": 2, "uuid": "GPU-2", "requestedAt": ASKED},
                    {"gpu": -1, "requestedAt": ASKED},
                    {"gpu": 3, "requestedAt": "yesterday"},
                    "nonsense",
                ],
                "validations": [{"requestedAt": ASKED}, {"gpus": [4, 1, 4], "requestedAt": ASKED}, {"gpus": "all"}],
            }
        },
    }
    spec = spec_from_gpunode(obj)
    assert spec.resets == (ResetRequest(2, ASKED, "GPU-2"),)
    assert spec.validations == (ValidationRequest((), ASKED), ValidationRequest((1, 4), ASKED))
    assert spec_from_gpunode({"spec": {"nodeName": "n"}}) == RemediationSpec()
    assert spec_from_gpunode(None) == RemediationSpec()


def test_answers_round_trip_through_the_status_with_fractions_of_a_second() -> None:
    finished = T0 + timedelta(seconds=5, microseconds=123456)
    reset = ResetAnswer(2, ASKED, RESET_SUCCEEDED, "reset", "GPU-2", finished)
    waiting = ResetAnswer(3, ASKED, RESET_WAITING, "1 processes still use GPU 3 (PIDs 7)")
    validation = ValidationAnswer((2,), ASKED, True, finished + timedelta(microseconds=1), "all passed")
    status = status_json([waiting, reset], [validation])
    assert status["resets"][0]["finishedAt"] == "2026-12-01T10:00:05.123456Z"
    assert "finishedAt" not in status["resets"][1]
    resets, validations = answers_from_gpunode({"status": {"remediation": status}})
    assert set(resets) == {reset, waiting}
    assert validations == (validation,)
    assert validations[0].finished_at > reset.finished_at  # type: ignore[operator]
    assert format_instant(finished) == "2026-12-01T10:00:05.123456Z"


def test_answers_kept_are_those_asked_and_each_gpus_last_successful_reset() -> None:
    def answer(gpu: int, hour: int, result: str = RESET_SUCCEEDED) -> ResetAnswer:
        at = f"2026-12-01T{hour:02d}:00:00Z"
        return ResetAnswer(gpu, at, result, "", f"GPU-{gpu}", T0 + timedelta(hours=hour))

    old, newer, failed, asked = answer(1, 1), answer(1, 2), answer(1, 3, RESET_FAILED), answer(2, 4)
    resets = {a.key: a for a in (old, newer, failed, asked)}
    spec = RemediationSpec(resets=(ResetRequest(2, asked.requested_at),))
    kept, validations = answers_to_keep(spec, resets, {})
    assert kept == [newer, asked]
    assert validations == []
    many = {answer(0, h % 24).key: answer(0, h % 24) for h in range(100)}
    spec_many = RemediationSpec(resets=tuple(ResetRequest(0, k[1]) for k in many))
    assert len(answers_to_keep(spec_many, many, {})[0]) <= MAX_ENTRIES


def test_a_repair_drops_the_faults_it_repaired_from_a_restore() -> None:
    finished = T0 + timedelta(minutes=5)
    repaired = repaired_at([ResetAnswer(2, ASKED, RESET_SUCCEEDED, "", "GPU-2", finished)])
    assert repaired == {"gpu/GPU-2": finished}
    entity = Entity.gpu(2, "GPU-2", "00000000:3A:00.0")

    def fault(since: datetime, on: Entity = entity) -> Fault:
        return Fault(ConditionType.GPU_XID_ERROR, "Xid48", "x", Action.RESET_GPU, on, since, latched=True)

    before, after = fault(T0), fault(finished + timedelta(seconds=1))
    other = fault(T0, Entity.gpu(3, "GPU-3", None))
    assert without_repaired([before, after, other], repaired) == [after, other]
    assert repaired_at([ResetAnswer(2, ASKED, RESET_FAILED, "", "GPU-2", finished)]) == {}


def _report(
    *faults: Fault, unjudged: frozenset[ConditionType] = frozenset(), errors: tuple[str, ...] = ()
) -> HealthReport:
    gpus = tuple(GpuStatus(i, f"GPU-{i}", "", "H100", 81559, 0, False, True) for i in range(2))
    return HealthReport(node="n", time=T0, gpus=gpus, faults=faults, unjudged=unjudged, errors=errors)


def test_checks_judge_only_the_gpus_asked_and_treat_unknown_as_failed() -> None:
    fault = Fault(
        ConditionType.GPU_PCIE_DEGRADED,
        "PcieWidthDegraded",
        "GPU 1: x8",
        Action.REBOOT,
        Entity.gpu(1, "GPU-1", None),
        T0,
    )
    by_name = {c.name: c for c in health_checks(_report(fault), [0])}
    assert all(c.passed for c in by_name.values())
    by_name = {c.name: c for c in health_checks(_report(fault), [1])}
    assert not by_name["pcie"].passed and by_name["pcie"].message == "GPU 1: x8"
    missing = {c.name: c for c in health_checks(_report(), [5])}
    assert not missing["gpu-present"].passed and "GPU 5 not found" in missing["gpu-present"].message
    blind = _report(unjudged=frozenset({ConditionType.GPU_NVLINK_DEGRADED}), errors=("gpu: NVML is not initialised",))
    nvlink = next(c for c in health_checks(blind, [0]) if c.name == "nvlink")
    assert not nvlink.passed and "NVML is not initialised" in nvlink.message
    node = [c.name for c in health_checks(_report(), [])]
    assert node == ["gpu-present", "xid", "memory", "nvlink", "pcie", "infiniband", "node-faults"]
