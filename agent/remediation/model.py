"""Remediation's requests and the agent's answers, as the GPUNode carries them.

The scheduler's remediation writes ``spec.remediation`` (``resets``: one GPU
each; ``validations``: listed GPUs, or the whole node when the list is
empty); the agent answers in ``status.remediation``, each answer echoing its
request's ``requestedAt`` verbatim. That echo is what tells the scheduler a
fresh answer from a stale one, and what tells a restarted agent which
requests it has already carried out: a request whose answer is final
(a reset Succeeded or Failed, any validation verdict) is never run again.
A reset answered ``Waiting`` (processes still use the GPU) is not final.

Everything here is pure: parsing is lenient (an entry that does not parse
is skipped and counted, so one bad entry costs no other), and the status
written is bounded as the CRD bounds it (64 entries per list, messages of
4 KiB).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from agent.model import Entity, Fault
from gpuwarden.contract import (
    GPUNODE_REMEDIATION,
    REMEDIATION_REQUESTED_AT,
    REMEDIATION_RESETS,
    REMEDIATION_VALIDATIONS,
    RESET_FAILED,
    RESET_SUCCEEDED,
    RESET_WAITING,
)
from gpuwarden.kube import JSON
from gpuwarden.logconfig import get_logger
from gpuwarden.timefmt import parse_time as parse_instant

log = get_logger(__name__)


def format_instant(ts: datetime) -> str:
    """RFC 3339 with microseconds: a validation must be seen to finish after
    the reset it follows, often within the same second."""
    return ts.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


# The CRD's bounds: maxItems of each list, maxLength of a message.
MAX_ENTRIES = 64
MAX_MESSAGE = 4096
RESET_RESULTS = frozenset({RESET_WAITING, RESET_SUCCEEDED, RESET_FAILED})


def clip(message: str) -> str:
    """``message`` within the CRD's length limit."""
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."


@dataclass(frozen=True, slots=True)
class ResetRequest:
    """Reset GPU ``gpu`` (``uuid``, when given, must still be the GPU at that index)."""

    gpu: int
    requested_at: str
    uuid: str = ""

    @property
    def key(self) -> tuple[int, str]:
        return (self.gpu, self.requested_at)


@dataclass(frozen=True, slots=True)
class ValidationRequest:
    """Validate ``gpus`` (empty: the whole node)."""

    gpus: tuple[int, ...]
    requested_at: str

    @property
    def key(self) -> tuple[tuple[int, ...], str]:
        return (self.gpus, self.requested_at)

    @property
    def node_scope(self) -> bool:
        return not self.gpus


@dataclass(frozen=True, slots=True)
class RemediationSpec:
    resets: tuple[ResetRequest, ...] = ()
    validations: tuple[ValidationRequest, ...] = ()


@dataclass(frozen=True, slots=True)
class Check:
    """One check of a validation: its name, verdict and what it found."""

    name: str
    passed: bool
    message: str = ""


@dataclass(frozen=True, slots=True)
class ResetAnswer:
    gpu: int
    requested_at: str
    result: str  # RESET_WAITING, RESET_SUCCEEDED or RESET_FAILED
    message: str = ""
    uuid: str = ""
    finished_at: datetime | None = None

    @property
    def key(self) -> tuple[int, str]:
        return (self.gpu, self.requested_at)

    @property
    def final(self) -> bool:
        return self.result != RESET_WAITING


@dataclass(frozen=True, slots=True)
class ValidationAnswer:
    gpus: tuple[int, ...]
    requested_at: str
    passed: bool
    finished_at: datetime
    message: str = ""
    checks: tuple[Check, ...] = ()

    @property
    def key(self) -> tuple[tuple[int, ...], str]:
        return (self.gpus, self.requested_at)


class RemediationCounts:
    """Results so far, for the metrics: resets by result, validations by verdict."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.resets: dict[str, int] = dict.fromkeys((RESET_SUCCEEDED, RESET_FAILED), 0)
        self.validations: dict[str, int] = {"passed": 0, "failed": 0}

    def reset(self, result: str) -> None:
        with self._lock:
            self.resets[result] = self.resets.get(result, 0) + 1

    def validation(self, passed: bool) -> None:
        with self._lock:
            self.validations["passed" if passed else "failed"] += 1

    def snapshot(self) -> tuple[dict[str, int], dict[str, int]]:
        with self._lock:
            return dict(self.resets), dict(self.validations)


# ---------------------------------------------------------------- parsing


def _remediation(obj: JSON | None, part: str) -> JSON:
    section = (obj or {}).get(part)
    remediation = section.get(GPUNODE_REMEDIATION) if isinstance(section, dict) else None
    return remediation if isinstance(remediation, dict) else {}


def _entries(section: JSON, key: str) -> list[Any]:
    raw = section.get(key)
    return raw if isinstance(raw, list) else []


def _index(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _gpus(value: Any) -> tuple[int, ...] | None:
    if value is None:
        return ()
    if not isinstance(value, list):
        return None
    indices = [_index(v) for v in value]
    if any(i is None for i in indices):
        return None
    return tuple(sorted({i for i in indices if i is not None}))


def _requested_at(raw: JSON) -> str | None:
    value = raw.get(REMEDIATION_REQUESTED_AT)
    return value if isinstance(value, str) and parse_instant(value) is not None else None


def _warn_skipped(obj: JSON | None, part: str, skipped: int) -> None:
    if skipped:
        name = ((obj or {}).get("metadata") or {}).get("name")
        log.warning("remediation_entries_malformed", gpunode=name, part=part, skipped=skipped)


def spec_from_gpunode(obj: JSON | None) -> RemediationSpec:
    """The requests in a GPUNode's ``spec.remediation`` (none when absent)."""
    section = _remediation(obj, "spec")
    skipped = 0
    resets: list[ResetRequest] = []
    for raw in _entries(section, REMEDIATION_RESETS):
        gpu = _index(raw.get("gpu")) if isinstance(raw, dict) else None
        at = _requested_at(raw) if isinstance(raw, dict) else None
        if gpu is None or at is None:
            skipped += 1
            continue
        uuid = raw.get("uuid")
        resets.append(ResetRequest(gpu, at, uuid if isinstance(uuid, str) else ""))
    validations: list[ValidationRequest] = []
    for raw in _entries(section, REMEDIATION_VALIDATIONS):
        gpus = _gpus(raw.get("gpus")) if isinstance(raw, dict) else None
        at = _requested_at(raw) if isinstance(raw, dict) else None
        if gpus is None or at is None:
            skipped += 1
            continue
        validations.append(ValidationRequest(gpus, at))
    _warn_skipped(obj, "spec", skipped)
    return RemediationSpec(tuple(resets), tuple(validations))


def answers_from_gpunode(obj: JSON | None) -> tuple[tuple[ResetAnswer, ...], tuple[ValidationAnswer, ...]]:
    """The answers a previous run wrote in ``status.remediation``."""
    section = _remediation(obj, "status")
    skipped = 0
    resets: list[ResetAnswer] = []
    for raw in _entries(section, REMEDIATION_RESETS):
        if not isinstance(raw, dict):
            skipped += 1
            continue
        gpu, at, result = _index(raw.get("gpu")), _requested_at(raw), raw.get("result")
        if gpu is None or at is None or result not in RESET_RESULTS:
            skipped += 1
            continue
        resets.append(
            ResetAnswer(
                gpu=gpu,
                requested_at=at,
                result=str(result),
                message=str(raw.get("message") or ""),
                uuid=str(raw.get("uuid") or ""),
                finished_at=parse_instant(raw.get("finishedAt")),
            )
        )
    validations: list[ValidationAnswer] = []
    for raw in _entries(section, REMEDIATION_VALIDATIONS):
        if not isinstance(raw, dict):
            skipped += 1
            continue
        gpus, at, finished = _gpus(raw.get("gpus")), _requested_at(raw), parse_instant(raw.get("finishedAt"))
        if gpus is None or at is None or finished is None or not isinstance(raw.get("passed"), bool):
            skipped += 1
            continue
        checks = tuple(
            Check(str(c.get("name")), bool(c.get("passed")), str(c.get("message") or ""))
            for c in raw.get("checks") or []
            if isinstance(c, dict) and c.get("name")
        )
        validations.append(
            ValidationAnswer(gpus, at, bool(raw["passed"]), finished, str(raw.get("message") or ""), checks)
        )
    _warn_skipped(obj, "status", skipped)
    return tuple(resets), tuple(validations)


# ---------------------------------------------------------------- writing


_EPOCH = datetime.fromtimestamp(0, UTC)


def _asked(a: ResetAnswer | ValidationAnswer) -> datetime:
    """When the request was made, for ordering (its text may be spelled in more than one way)."""
    return parse_instant(a.requested_at) or _EPOCH


def reset_json(a: ResetAnswer) -> JSON:
    out: JSON = {"gpu": a.gpu, REMEDIATION_REQUESTED_AT: a.requested_at, "result": a.result}
    if a.uuid:
        out["uuid"] = a.uuid
    if a.message:
        out["message"] = clip(a.message)
    if a.finished_at is not None:
        out["finishedAt"] = format_instant(a.finished_at)
    return out


def validation_json(a: ValidationAnswer) -> JSON:
    out: JSON = {
        "gpus": list(a.gpus),
        REMEDIATION_REQUESTED_AT: a.requested_at,
        "passed": a.passed,
        "finishedAt": format_instant(a.finished_at),
        "checks": [
            {"name": c.name, "passed": c.passed, **({"message": clip(c.message)} if c.message else {})}
            for c in a.checks
        ],
    }
    if a.message:
        out["message"] = clip(a.message)
    return out


def status_json(resets: Iterable[ResetAnswer], validations: Iterable[ValidationAnswer]) -> JSON:
    """``status.remediation`` for these answers, oldest request first."""
    return {
        REMEDIATION_RESETS: [reset_json(a) for a in sorted(resets, key=lambda a: (_asked(a), a.gpu))],
        REMEDIATION_VALIDATIONS: [validation_json(a) for a in sorted(validations, key=lambda a: (_asked(a), a.gpus))],
    }


def answers_to_keep(
    spec: RemediationSpec,
    resets: Mapping[tuple[int, str], ResetAnswer],
    validations: Mapping[tuple[tuple[int, ...], str], ValidationAnswer],
) -> tuple[list[ResetAnswer], list[ValidationAnswer]]:
    """The answers the status keeps: one per request still asked, and each
    GPU's latest successful reset.

    An answer whose request left the spec is done with, except a GPU's last
    successful reset: it says when that GPU was repaired, which a restarted
    agent needs so that XIDs from before the repair, still in the kernel log
    it reads again from the start, do not raise their faults again
    (:func:`repaired_at`). Each list stays within the CRD's bound, the
    newest kept.
    """
    asked_resets = {r.key for r in spec.resets}
    asked_validations = {v.key for v in spec.validations}
    kept_resets = [a for k, a in resets.items() if k in asked_resets]
    last_success: dict[int, ResetAnswer] = {}
    for a in resets.values():
        if a.result == RESET_SUCCEEDED and a.key not in asked_resets:
            best = last_success.get(a.gpu)
            if best is None or _asked(a) > _asked(best):
                last_success[a.gpu] = a
    kept_resets += last_success.values()
    kept_validations = [a for k, a in validations.items() if k in asked_validations]
    kept_resets.sort(key=lambda a: (_asked(a), a.gpu))
    kept_validations.sort(key=lambda a: (_asked(a), a.gpus))
    return kept_resets[-MAX_ENTRIES:], kept_validations[-MAX_ENTRIES:]


def without_repaired(faults: Iterable[Fault], repaired: Mapping[str, datetime]) -> list[Fault]:
    """``faults`` less those on a GPU raised no later than its last successful reset.

    A restart right after a reset, before the cleared conditions were
    published, would otherwise restore the faults the reset repaired.
    """
    return [
        f
        for f in faults
        if not (f.entity.uuid and (when := repaired.get(Entity.gpu(0, f.entity.uuid, None).key)) and f.since <= when)
    ]


def repaired_at(resets: Iterable[ResetAnswer]) -> dict[str, datetime]:
    """GPU entity key -> when its latest successful reset finished.

    What :meth:`agent.monitor.Monitor.restore` takes as ``cleared_at``: kernel-log
    events from before the repair are history.
    """
    out: dict[str, datetime] = {}
    for a in resets:
        if a.result != RESET_SUCCEEDED or a.finished_at is None or not a.uuid:
            continue
        key = Entity.gpu(a.gpu, a.uuid, None).key
        if key not in out or out[key] < a.finished_at:
            out[key] = a.finished_at
    return out
