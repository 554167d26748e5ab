"""Validation: the agent's own checks on a fresh poll, and DCGM's short diagnostic.

Hardware returns to service only on a pass newer than its repair, so a
validation must judge the hardware as it is now: the checks read a report
judged after the request came (see :class:`agent.remediation.worker.Remediator`),
with the same rules that raise the node's conditions. A GPU passes when no
fault is active on it in each family -- XID, memory (row remap pending or
failed, retired pages), NVLink, PCIe (width or generation below maximum,
replays) -- and it is present and reachable; the whole node also needs its
InfiniBand ports and its node-wide faults (GPU count, storage) clean. A
family the rules could not judge this poll (NVML failing, sysfs unreadable)
fails: unknown is not healthy.

When DCGM is installed (``dcgmi`` on PATH) its quick diagnostic,
``dcgmi diag -r 1``, runs too, under a timeout; where it is not, the check is
reported as skipped (passed, and saying so), since many nodes carry no DCGM
and that must not keep hardware out of service.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from agent.model import EntityKind, Fault, HealthReport
from agent.remediation.model import Check
from gpuwarden.contract import ConditionType

DCGM_CHECK = "dcgm-diag"
# What each GPU check covers: its name and the condition whose faults fail it.
GPU_CHECKS: tuple[tuple[str, ConditionType], ...] = (
    ("gpu-present", ConditionType.GPU_MISSING),
    ("xid", ConditionType.GPU_XID_ERROR),
    ("memory", ConditionType.GPU_MEMORY_DEGRADED),
    ("nvlink", ConditionType.GPU_NVLINK_DEGRADED),
    ("pcie", ConditionType.GPU_PCIE_DEGRADED),
)
NODE_CHECKS: tuple[tuple[str, ConditionType | None], ...] = (
    ("infiniband", ConditionType.INFINIBAND_DEGRADED),
    ("node-faults", None),
)
# How many faults one check's message names before "and N more".
_NAMED = 4


def _describe(faults: Sequence[Fault]) -> str:
    named = "; ".join(f.message or f"{f.reason} on {f.entity.describe()}" for f in faults[:_NAMED])
    more = len(faults) - _NAMED
    return f"{named}; and {more} more" if more > 0 else named


def _unjudged(report: HealthReport, condition: ConditionType) -> Check | None:
    if condition not in report.unjudged:
        return None
    why = "; ".join(report.errors) or "its rule failed"
    return Check("", False, f"{condition.value} could not be judged this poll ({why})")


def health_checks(report: HealthReport, gpus: Sequence[int]) -> list[Check]:
    """The agent's checks of ``gpus`` (empty: the whole node) on ``report``.

    A fault that names no GPU under a GPU condition (one restored from a
    condition whose GPUNode detail was lost) fails that check for every
    GPU: it may be about any of them.
    """
    listed = {g.index: g for g in report.gpus}
    scope = sorted(set(gpus)) if gpus else sorted(listed)
    wanted = set(scope)
    checks: list[Check] = []
    for name, condition in GPU_CHECKS:
        unjudged = _unjudged(report, condition)
        if unjudged is not None:
            checks.append(Check(name, False, unjudged.message))
            continue
        faults = [
            f
            for f in report.faults_for(condition)
            if (f.entity.kind is EntityKind.GPU and f.entity.gpu_index in wanted)
            or (f.entity.kind is EntityKind.NODE and condition is not ConditionType.GPU_MISSING)
        ]
        if condition is ConditionType.GPU_MISSING:
            absent = [i for i in scope if i not in listed]
            if absent or faults:
                text = f"GPU {', '.join(map(str, absent))} not found on the node" if absent else ""
                checks.append(Check(name, False, "; ".join(x for x in (text, _describe(faults)) if x)))
            else:
                checks.append(Check(name, True, f"GPU {', '.join(map(str, scope))} present"))
            continue
        if faults:
            checks.append(Check(name, False, _describe(faults)))
        else:
            checks.append(Check(name, True, f"no {condition.value} fault"))
    if gpus:
        return checks
    for name, node_condition in NODE_CHECKS:
        if node_condition is not None:
            unjudged = _unjudged(report, node_condition)
            if unjudged is not None:
                checks.append(Check(name, False, unjudged.message))
                continue
            faults = list(report.faults_for(node_condition))
            ok = f"no {node_condition.value} fault"
        else:
            faults = [f for f in report.faults if f.entity.kind in (EntityKind.NODE, EntityKind.MOUNT)]
            ok = "no node-wide fault"
        checks.append(Check(name, False, _describe(faults)) if faults else Check(name, True, ok))
    return checks


@dataclass(frozen=True, slots=True)
class DcgmDiag:
    """``dcgmi diag -r <level>`` on the GPUs validated, under a timeout.

    ``binary`` is looked up on PATH when the check runs, so DCGM installed
    after the agent started is used from then on.
    """

    binary: str = "dcgmi"
    level: int = 1
    timeout_s: float = 300.0

    def run(self, gpus: Sequence[int]) -> Check:
        path = shutil.which(self.binary)
        if path is None:
            return Check(DCGM_CHECK, True, f"skipped: {self.binary} is not on PATH (DCGM not installed)")
        command = [path, "diag", "-r", str(self.level)]
        if gpus:
            command += ["-i", ",".join(str(g) for g in sorted(set(gpus)))]
        shown = " ".join([self.binary, *command[1:]])
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=self.timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return Check(DCGM_CHECK, False, f"{shown} did not finish within {self.timeout_s:g}s (killed)")
        except OSError as exc:
            return Check(DCGM_CHECK, False, f"{shown} could not run: {exc}")
        if done.returncode == 0:
            return Check(DCGM_CHECK, True, f"{shown} passed")
        return Check(DCGM_CHECK, False, f"{shown} exited with status {done.returncode}: {_failures(done.stdout)}")


def _failures(output: str) -> str:
    """What a failing diagnostic says: its lines that report a failure, else its last lines.

    ``dcgmi diag`` prints a table whose failing rows say ``Fail``; the rest
    of the table (passes, skips) would only crowd the message.
    """
    lines = [line.strip(" |") for line in output.splitlines() if line.strip(" |+-=")]
    failing = [line for line in lines if "fail" in line.lower() or "error" in line.lower()]
    chosen = failing or lines[-3:]
    return "; ".join(" ".join(line.split()) for line in chosen)[:1024] or "no output"
