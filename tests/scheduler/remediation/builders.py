"""Small constructors for the remediation tests: faults, nodes, and running the machine."""

from __future__ import annotations

from dataclasses import replace

from gpuwarden.contract import Action, ConditionType, xid_reason
from scheduler.remediation.machine import Transition, advance
from scheduler.remediation.model import Fault, NodeRecord
from scheduler.remediation.observations import GpuIdentity, Observations
from scheduler.remediation.policy import Settings

T0 = 1_700_000_000.0
GPUS = tuple(GpuIdentity(i, f"GPU-{i:04d}") for i in range(8))


def xid(number: int, gpu: int | None, action: Action, since: float | None = T0) -> Fault:
    """A GpuXidError fault as the agent reports it."""
    return Fault(
        condition=ConditionType.GPU_XID_ERROR.value,
        reason=xid_reason(number),
        action=action,
        gpu_index=gpu,
        gpu_uuid=f"GPU-{gpu:04d}" if gpu is not None else "",
        xid=number,
        since=since,
    )


def node(**changes: object) -> Observations:
    base = Observations(node="gpu-node-7", pool="default", gpus=GPUS)
    return replace(base, **changes)  # type: ignore[arg-type]


def run(record: NodeRecord, obs: Observations, now: float, settings: Settings | None = None) -> Transition:
    return advance(record, obs, now, settings or Settings())


def kinds(t: Transition) -> list[str]:
    return [type(s).__name__ for s in t.steps]
