"""Carrying out remediation's requests: GPU resets and validations, in their own thread.

:class:`Remediator` is handed the GPUNode's requests whenever the agent sees
the object (its watch, the heartbeat's read, every status patch's answer)
and the monitor's reports as they are judged. Its thread runs what is not
yet answered, one request at a time, oldest first, and hands the answers to
the GPUNode publisher (``on_answers``), which writes them with the rest of
the status. A reset or a diagnostic takes seconds to minutes: here it stops
neither detection nor publishing.

* **Reset** (one GPU): only once no process uses the GPU; until then the
  answer is ``Waiting``, naming how many processes, and the GPU is asked
  again every poll interval. The reset runs with the poll loop held
  (:meth:`Monitor.hold`); when it succeeds the GPU's faults, latched ones
  included, are cleared before the next poll, so its conditions and
  capacity come back once that poll and the following are clean (a signal
  the reset did not fix raises its fault again at once). A GPU whose UUID is
  no longer the one the request names is not reset: the answer is Failed, as
  it is for a reset that fails; the scheduler then escalates.
* **Validation** (listed GPUs, or the whole node): judged on reports made
  after the request began -- as many as ``hysteresis.raise_polls``, so a
  signal still present has had the polls it needs to raise its fault --
  with :func:`~agent.remediation.checks.health_checks`, then DCGM's quick
  diagnostic where DCGM is installed.

Requests already answered -- by this run, or by an earlier one whose answers
:meth:`Remediator.restore` took back from the GPUNode -- are not run again:
nothing runs before that restore. A reset answered ``Waiting`` is not
answered yet.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from agent.model import HealthReport
from agent.monitor import Monitor
from agent.remediation.checks import DcgmDiag, health_checks
from agent.remediation.model import (
    Check,
    RemediationCounts,
    RemediationSpec,
    ResetAnswer,
    ResetRequest,
    ValidationAnswer,
    ValidationRequest,
    answers_to_keep,
    status_json,
)
from agent.sources.base import BackendUnavailableError, GpuBackend, GpuResetError
from gpuwarden.contract import RESET_FAILED, RESET_SUCCEEDED, RESET_WAITING
from gpuwarden.kube import JSON
from gpuwarden.logconfig import get_logger

log = get_logger(__name__)

# How many PIDs a Waiting answer names (the count is always there).
_PIDS_NAMED = 8


def _now() -> datetime:
    return datetime.now(UTC)


class Remediator:
    """Runs the GPUNode's reset and validation requests; see the module docstring."""

    def __init__(
        self,
        monitor: Monitor,
        gpu: GpuBackend,
        on_answers: Callable[[JSON], None],
        *,
        dcgm: DcgmDiag | None = None,
        counts: RemediationCounts | None = None,
        clock: Callable[[], datetime] = _now,
        fresh_report_timeout_s: float | None = None,
    ) -> None:
        self.monitor = monitor
        self.gpu = gpu
        self._on_answers = on_answers
        cfg = monitor.config.remediation
        self.dcgm = dcgm or DcgmDiag(cfg.dcgmi, cfg.dcgm_diag_level, cfg.dcgm_diag_timeout_s)
        self.counts = counts or RemediationCounts()
        self._clock = clock
        self._interval = monitor.config.poll_interval_s
        self._fresh_polls = max(1, monitor.config.hysteresis.raise_polls)
        # A poll can wait behind a reset (Monitor.hold) or a slow NVML call.
        self._fresh_timeout_s = fresh_report_timeout_s or (
            (self._fresh_polls + 2) * self._interval + cfg.reset_timeout_s
        )
        self._cond = threading.Condition()
        self._spec = RemediationSpec()
        self._resets: dict[tuple[int, str], ResetAnswer] = {}
        self._validations: dict[tuple[tuple[int, ...], str], ValidationAnswer] = {}
        self._restored = False
        self._latest: HealthReport | None = None
        self._reports = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._published: JSON | None = None

    # ------------------------------------------------------------ inputs

    def restore(self, resets: tuple[ResetAnswer, ...], validations: tuple[ValidationAnswer, ...]) -> None:
        """Take back the answers an earlier run wrote; requests run from now on.

        Answers this run already gave (a restore after the API server came
        back) win over what the object said, which may predate them.
        """
        with self._cond:
            for a in resets:
                self._resets.setdefault(a.key, a)
            for v in validations:
                self._validations.setdefault(v.key, v)
            self._restored = True
            self._published = None
        self._wake.set()

    def set_spec(self, spec: RemediationSpec) -> None:
        """The requests as the GPUNode now holds them (any thread)."""
        with self._cond:
            if spec == self._spec:
                return
            self._spec = spec
        log.info(
            "remediation_requests_seen",
            resets=[(r.gpu, r.requested_at) for r in spec.resets],
            validations=[(list(v.gpus), v.requested_at) for v in spec.validations],
        )
        self._wake.set()

    def observe(self, report: HealthReport) -> None:
        """A report the monitor just judged (monitor thread)."""
        with self._cond:
            self._latest = report
            self._reports += 1
            self._cond.notify_all()

    # ------------------------------------------------------------ outputs

    def status(self) -> JSON:
        """``status.remediation`` as it stands."""
        with self._cond:
            resets, validations = answers_to_keep(self._spec, self._resets, self._validations)
        return status_json(resets, validations)

    def _publish(self) -> None:
        status = self.status()
        if status != self._published:
            self._published = status
            self._on_answers(status)

    # -------------------------------------------------------------- loop

    def run(self, stop: threading.Event) -> None:
        """Until ``stop``: carry out what is asked, then wait for news or a poll interval."""
        self._stop = stop
        while not stop.is_set():
            try:
                self.step()
            except Exception:
                # A bug must not end remediation for good: the next pass tries again.
                log.exception("remediation_step_failed")
            self._wake.wait(self._interval)
            self._wake.clear()

    def wake(self) -> None:
        self._wake.set()

    def step(self) -> None:
        """One pass over the requests not yet answered (public for tests)."""
        with self._cond:
            if not self._restored:
                return
            spec = self._spec
        for reset in sorted(spec.resets, key=lambda r: (r.requested_at, r.gpu)):
            if self._stop.is_set():
                return
            done = self._resets.get(reset.key)
            if done is None or not done.final:
                self._answer_reset(self._reset(reset))
        for validation in sorted(spec.validations, key=lambda v: (v.requested_at, v.gpus)):
            if self._stop.is_set():
                return
            if validation.key not in self._validations:
                answer = self._validate(validation)
                if answer is not None:
                    self._answer_validation(answer)
        self._publish()

    def _answer_reset(self, answer: ResetAnswer) -> None:
        with self._cond:
            before = self._resets.get(answer.key)
            self._resets[answer.key] = answer
        if answer.final:
            self.counts.reset(answer.result)
        if before is None or (before.result, before.message) != (answer.result, answer.message):
            log.info("gpu_reset_answered", gpu=answer.gpu, result=answer.result, message=answer.message)
        self._publish()

    def _answer_validation(self, answer: ValidationAnswer) -> None:
        with self._cond:
            self._validations[answer.key] = answer
        self.counts.validation(answer.passed)
        log.info(
            "validation_answered",
            gpus=list(answer.gpus) or "node",
            passed=answer.passed,
            failed=[c.name for c in answer.checks if not c.passed],
        )
        self._publish()

    # ------------------------------------------------------------- reset

    def _reset(self, req: ResetRequest) -> ResetAnswer:
        def answer(result: str, message: str, uuid: str = req.uuid) -> ResetAnswer:
            finished = None if result == RESET_WAITING else self._clock()
            return ResetAnswer(req.gpu, req.requested_at, result, message, uuid, finished)

        with self._cond:
            report = self._latest
        if report is None:
            return answer(RESET_WAITING, "the agent has not polled its GPUs yet")
        gpu = next((g for g in report.gpus if g.index == req.gpu), None)
        if gpu is None:
            return answer(RESET_FAILED, f"no GPU {req.gpu} on this node")
        if req.uuid and gpu.uuid and req.uuid != gpu.uuid:
            return answer(
                RESET_FAILED, f"GPU {req.gpu} is now {gpu.uuid}, not {req.uuid} as requested: not reset", gpu.uuid
            )
        uuid = gpu.uuid or req.uuid
        try:
            with self.monitor.hold():
                pids = self.gpu.running_processes(req.gpu)
                if pids:
                    shown = ", ".join(map(str, pids[:_PIDS_NAMED])) + (", ..." if len(pids) > _PIDS_NAMED else "")
                    return answer(RESET_WAITING, f"{len(pids)} processes still use GPU {req.gpu} (PIDs {shown})", uuid)
                started = time.monotonic()
                output = self.gpu.reset(req.gpu)
                finished = self._clock()
                # Before the next poll: it judges the GPU as the reset left it.
                cleared = self.monitor.clear_gpu(req.gpu, gpu.uuid, gpu.pci_bus_id, finished)
        except BackendUnavailableError as exc:
            return answer(RESET_WAITING, f"the GPU library cannot be used now, retrying: {exc}", uuid)
        except GpuResetError as exc:
            return answer(RESET_FAILED, str(exc), uuid)
        log.info(
            "gpu_reset",
            gpu=req.gpu,
            uuid=uuid,
            seconds=round(time.monotonic() - started, 3),
            faults_cleared=[f.reason for f in cleared],
        )
        return ResetAnswer(req.gpu, req.requested_at, RESET_SUCCEEDED, output, uuid, finished)

    # -------------------------------------------------------- validation

    def _fresh_report(self, after: int, polls: int) -> HealthReport | None:
        """The report ``polls`` reports after report number ``after``; None on timeout or stop."""
        deadline = time.monotonic() + self._fresh_timeout_s
        with self._cond:
            while self._reports < after + polls or self._latest is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stop.is_set():
                    return None
                self.monitor.wake()
                self._cond.wait(min(remaining, 0.5))
            return self._latest

    def _validate(self, req: ValidationRequest) -> ValidationAnswer | None:
        with self._cond:
            seen = self._reports
        report = self._fresh_report(seen, self._fresh_polls)
        if report is None:
            if self._stop.is_set():
                return None
            checks = [Check("fresh-poll", False, f"no poll completed within {self._fresh_timeout_s:g}s")]
        else:
            checks = health_checks(report, req.gpus)
            checks.append(self.dcgm.run(req.gpus))
        failed = [c for c in checks if not c.passed]
        if failed:
            message = "failed: " + "; ".join(f"{c.name}: {c.message}" for c in failed)
        else:
            message = f"all {len(checks)} checks passed"
        return ValidationAnswer(req.gpus, req.requested_at, not failed, self._clock(), message, tuple(checks))
