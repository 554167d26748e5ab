"""Resets and validations carried out by the Remediator over a running monitor on the sim backend.

The monitor polls in its own thread as in the daemon, handing each report to
the Remediator; requests are given as the GPUNode's spec would give them,
and answers are what the GPUNode's status would get.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agent.config import config_from_dict
from agent.monitor import Monitor
from agent.remediation.model import (
    RemediationSpec,
    ResetAnswer,
    ResetRequest,
    ValidationRequest,
    answers_from_gpunode,
)
from agent.remediation.worker import Remediator
from agent.sim.node import SimNode
from agent.sim.scenario import Scenario, SimGpus, SimInfiniband, SimReset
from gpuwarden.contract import RESET_FAILED, RESET_SUCCEEDED, RESET_WAITING, ConditionType
from gpuwarden.kube import JSON
from tests.waiting import wait_for

ASKED = "2026-12-01T10:00:00Z"
LATER = "2026-12-01T11:00:00Z"


class Harness:
    """A sim node, its monitor polling in a thread, and a Remediator fed by it."""

    def __init__(self, sim: SimNode) -> None:
        self.sim = sim
        config = config_from_dict({"poll_interval_s": 0.05, "remediation": {"dcgmi": "dcgmi"}})
        self.monitor = Monitor(config, sim.hardware(), "node-a")
        self.answers: list[JSON] = []
        self.remediator = Remediator(self.monitor, self.monitor.hardware.gpu, self.answers.append)
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=self.monitor.run, args=(self.stop, lambda report, _: self.remediator.observe(report)), daemon=True
        )

    def start(self) -> Harness:
        self.thread.start()
        wait_for(lambda: self.monitor.last_report is not None, timeout=5, interval=0.01, description="a first poll")
        return self

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.monitor.close()

    def ask(self, spec: RemediationSpec) -> None:
        self.remediator.set_spec(spec)
        self.remediator.step()

    def status(self) -> JSON:
        return self.answers[-1] if self.answers else {}

    def faults_on(self, gpu: int) -> list[str]:
        report = self.monitor.last_report
        assert report is not None
        return [f.reason for f in report.faults if f.entity.gpu_index == gpu]


@pytest.fixture
def harness() -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def make(**scenario: Any) -> Harness:
        sc = Scenario(gpus=SimGpus(count=4, nvlinks=4), infiniband=SimInfiniband(hcas=2), **scenario)
        h = Harness(SimNode(sc))
        h.remediator.restore((), ())
        made.append(h)
        return h.start()

    yield make
    for h in made:
        h.close()


@pytest.fixture(autouse=True)
def no_dcgm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH with no dcgmi on it unless a test puts one in ``bin``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin")
    return bin_dir


def _reset(h: Harness, gpu: int, at: str = ASKED) -> dict[str, Any]:
    entries = h.status().get("resets", [])
    found: dict[str, Any] = next(e for e in entries if e["gpu"] == gpu and e["requestedAt"] == at)
    return found


def _validation(h: Harness, at: str = ASKED) -> dict[str, Any]:
    found: dict[str, Any] = next(e for e in h.status().get("validations", []) if e["requestedAt"] == at)
    return found


def test_a_reset_waits_for_the_gpus_processes_then_clears_its_latched_faults(
    harness: Callable[..., Harness],
) -> None:
    h = harness()
    h.sim.inject("xid", gpu=1, xid=48)
    wait_for(lambda: "Xid48" in h.faults_on(1), timeout=5, interval=0.02, description="XID 48 raised")
    h.sim.inject("processes", gpu=1, count=2)
    uuid = h.sim.sample_gpus()[1].uuid
    h.ask(RemediationSpec(resets=(ResetRequest(1, ASKED, uuid),)))
    waiting = _reset(h, 1)
    assert waiting["result"] == RESET_WAITING
    assert "2 processes still use GPU 1" in waiting["message"]
    assert "finishedAt" not in waiting
    assert h.sim.resets == []

    h.sim.inject("processes", gpu=1, count=0)
    h.remediator.step()
    done = _reset(h, 1)
    assert done["result"] == RESET_SUCCEEDED
    assert done["uuid"] == uuid and "successfully reset" in done["message"]
    assert datetime.fromisoformat(done["finishedAt"]) > datetime.now(UTC) - timedelta(minutes=1)
    assert h.sim.resets == [1]
    wait_for(lambda: h.faults_on(1) == [], timeout=5, interval=0.02, description="GPU 1's faults cleared")
    report = h.monitor.last_report
    assert report is not None and all(g.healthy for g in report.gpus)
    # Answered: another pass does not reset again.
    h.remediator.step()
    assert h.sim.resets == [1]
    assert h.remediator.counts.snapshot()[0] == {RESET_SUCCEEDED: 1, RESET_FAILED: 0}


def test_a_failed_reset_is_answered_failed_with_the_error(harness: Callable[..., Harness]) -> None:
    h = harness(reset=SimReset(fail_gpus=[2], error="GPU 2 needs a node reboot"))
    h.sim.inject("xid", gpu=2, xid=48)
    wait_for(lambda: "Xid48" in h.faults_on(2), timeout=5, interval=0.02, description="XID 48 raised")
    h.ask(RemediationSpec(resets=(ResetRequest(2, ASKED),)))
    answer = _reset(h, 2)
    assert answer["result"] == RESET_FAILED
    assert answer["message"] == "GPU 2 needs a node reboot"
    assert "finishedAt" in answer
    # The fault stays: nothing was repaired.
    assert "Xid48" in h.faults_on(2)
    h.remediator.step()
    assert h.sim.resets == [2]


def test_a_gpu_that_is_no_longer_the_one_asked_for_is_not_reset(harness: Callable[..., Harness]) -> None:
    h = harness()
    h.ask(RemediationSpec(resets=(ResetRequest(0, ASKED, "GPU-someone-else"),)))
    answer = _reset(h, 0)
    assert answer["result"] == RESET_FAILED and "not reset" in answer["message"]
    assert h.sim.resets == []
    h.ask(RemediationSpec(resets=(ResetRequest(7, ASKED),)))
    assert _reset(h, 7)["result"] == RESET_FAILED
    assert h.sim.resets == []


def test_requests_answered_before_a_restart_are_not_run_again() -> None:
    sim = SimNode(Scenario(gpus=SimGpus(count=2, nvlinks=4)))
    h = Harness(sim)
    earlier = ResetAnswer(1, ASKED, RESET_SUCCEEDED, "done", sim.sample_gpus()[1].uuid, datetime.now(UTC))
    h.remediator.set_spec(RemediationSpec(resets=(ResetRequest(1, ASKED), ResetRequest(0, LATER))))
    h.remediator.step()
    assert sim.resets == []  # nothing runs before the answers are restored
    h.remediator.restore((earlier,), ())
    h.start()
    try:
        h.remediator.step()
        assert sim.resets == [0]
        assert [e["result"] for e in h.status()["resets"]] == [RESET_SUCCEEDED, RESET_SUCCEEDED]
    finally:
        h.close()


def test_a_validation_after_a_reset_passes_and_names_dcgm_skipped(harness: Callable[..., Harness]) -> None:
    h = harness()
    h.sim.inject("remap_pending", gpu=3)
    wait_for(lambda: "RowRemapPending" in h.faults_on(3), timeout=5, interval=0.02, description="remap pending")
    h.ask(RemediationSpec(resets=(ResetRequest(3, ASKED),)))
    assert _reset(h, 3)["result"] == RESET_SUCCEEDED
    h.ask(RemediationSpec(resets=(ResetRequest(3, ASKED),), validations=(ValidationRequest((3,), LATER),)))
    answer = _validation(h, LATER)
    assert answer["passed"] is True, answer
    assert answer["gpus"] == [3]
    assert datetime.fromisoformat(answer["finishedAt"]) > datetime.fromisoformat(_reset(h, 3)["finishedAt"])
    checks = {c["name"]: c for c in answer["checks"]}
    assert set(checks) == {"gpu-present", "xid", "memory", "nvlink", "pcie", "dcgm-diag"}
    assert checks["dcgm-diag"]["passed"] and checks["dcgm-diag"]["message"].startswith("skipped")
    # Answered once: the verdict stands.
    h.remediator.step()
    assert h.remediator.counts.snapshot()[1] == {"passed": 1, "failed": 0}


@pytest.mark.parametrize(
    ("kind", "params", "failing"),
    [
        ("remap_failure", {"gpu": 1}, "memory"),
        ("nvlink_down", {"gpu": 1, "link": 2}, "nvlink"),
        ("pcie_width", {"gpu": 1, "width": 8}, "pcie"),
        ("xid", {"gpu": 1, "xid": 79}, "xid"),
        ("gpu_lost", {"gpu": 1}, "gpu-present"),
    ],
)
def test_a_validation_fails_on_the_check_whose_fault_is_present(
    harness: Callable[..., Harness], kind: str, params: dict[str, Any], failing: str
) -> None:
    h = harness()
    h.sim.inject(kind, **params)
    h.ask(RemediationSpec(validations=(ValidationRequest((1,), ASKED),)))
    answer = _validation(h)
    assert answer["passed"] is False
    failed = {c["name"] for c in answer["checks"] if not c["passed"]}
    assert failing in failed
    assert f"{failing}:" in answer["message"]
    # The other GPUs are fine: a validation of GPU 0 alone passes.
    h.ask(RemediationSpec(validations=(ValidationRequest((0,), LATER),)))
    assert _validation(h, LATER)["passed"] is True


@pytest.mark.parametrize(
    ("kind", "params", "failing"),
    [
        ("ib_down", {"device": "mlx5_1", "port": 1}, "infiniband"),
        ("mount_hung", {"path": "/mnt/shared"}, "node-faults"),
    ],
)
def test_the_node_scope_also_checks_ports_and_node_faults(
    harness: Callable[..., Harness], kind: str, params: dict[str, Any], failing: str
) -> None:
    h = harness(mounts=["/mnt/shared"])
    h.ask(RemediationSpec(validations=(ValidationRequest((), ASKED),)))
    assert _validation(h)["passed"] is True
    h.sim.inject(kind, **params)
    wanted = {ConditionType.INFINIBAND_DEGRADED, ConditionType.STORAGE_DEGRADED}

    def raised() -> bool:
        report = h.monitor.last_report
        return report is not None and any(f.condition in wanted for f in report.faults)

    wait_for(
        raised,
        timeout=5,
        interval=0.02,
        description=f"{kind} raised",
    )
    # A GPU-scope validation does not look at ports or mounts.
    h.ask(RemediationSpec(validations=(ValidationRequest((0, 1, 2, 3), LATER),)))
    assert _validation(h, LATER)["passed"] is True
    node_scope = "2026-12-01T12:00:00Z"
    h.ask(RemediationSpec(validations=(ValidationRequest((), node_scope),)))
    answer = _validation(h, node_scope)
    assert answer["passed"] is False
    assert [c["name"] for c in answer["checks"] if not c["passed"]] == [failing]


def _dcgmi(bin_dir: Path, status: int, output: str) -> Path:
    calls = bin_dir / "dcgmi-calls"
    script = bin_dir / "dcgmi"
    script.write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\ncat <<\'EOF\'\n{output}\nEOF\nexit {status}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return calls


def test_dcgm_diag_runs_when_dcgmi_is_on_path(harness: Callable[..., Harness], no_dcgm: Path) -> None:
    calls = _dcgmi(no_dcgm, 0, "| Deployment | Pass |")
    h = harness()
    h.ask(RemediationSpec(validations=(ValidationRequest((2,), ASKED),)))
    answer = _validation(h)
    dcgm = next(c for c in answer["checks"] if c["name"] == "dcgm-diag")
    assert answer["passed"] is True and dcgm["passed"] is True
    assert dcgm["message"] == "dcgmi diag -r 1 -i 2 passed"
    assert calls.read_text().split() == ["diag", "-r", "1", "-i", "2"]


def test_a_failing_dcgm_diag_fails_the_validation_with_its_failing_lines(
    harness: Callable[..., Harness], no_dcgm: Path
) -> None:
    table = "\n".join(
        [
            "+---------------------------+------------------------------------------------+",
            "| Diagnostic                | Result                                         |",
            "| Deployment                | Pass                                           |",
            "| Memory                    | Fail - GPU 0: uncorrectable ECC errors found   |",
            "+---------------------------+------------------------------------------------+",
        ]
    )
    _dcgmi(no_dcgm, 226, table)
    h = harness()
    h.ask(RemediationSpec(validations=(ValidationRequest((), ASKED),)))
    answer = _validation(h)
    dcgm = next(c for c in answer["checks"] if c["name"] == "dcgm-diag")
    assert answer["passed"] is False and dcgm["passed"] is False
    assert dcgm["message"] == (
        "dcgmi diag -r 1 exited with status 226: Memory | Fail - GPU 0: uncorrectable ECC errors found"
    )
    assert "dcgm-diag: dcgmi diag -r 1 exited" in answer["message"]


def test_the_answers_read_back_as_the_scheduler_and_a_restarted_agent_read_them(
    harness: Callable[..., Harness],
) -> None:
    h = harness()
    h.ask(RemediationSpec(resets=(ResetRequest(0, ASKED),), validations=(ValidationRequest((0,), LATER),)))
    resets, validations = answers_from_gpunode({"status": {"remediation": h.status()}})
    assert [(r.gpu, r.requested_at, r.result) for r in resets] == [(0, ASKED, RESET_SUCCEEDED)]
    assert [(v.gpus, v.requested_at, v.passed) for v in validations] == [((0,), LATER, True)]
    assert validations[0].checks and all(c.passed for c in validations[0].checks)
