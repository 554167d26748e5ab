"""GPU count rule: GPUs lost, or fewer GPUs than the node should have.

A GPU NVML reports as lost (``GPU_IS_LOST``) is ``GpuLost``, latched, with
``REBOOT``: only a reboot (or a board replacement) brings it back. Fewer GPUs
enumerated than expected is ``GpuCountMismatch``; the expected count is the
configured one, else the most seen since the agent started. When NVML itself
is unavailable nothing is judged: "unknown" is not "zero GPUs".
"""

from __future__ import annotations

from collections.abc import Iterable

from agent.config import AgentConfig
from agent.contract import Action, ConditionType, Reason
from agent.model import Entity
from agent.rules.base import Finding, RuleContext
from agent.samples import NodeSample


class GpuCountRule:
    def __init__(self, config: AgentConfig) -> None:
        self._configured = config.gpu.expected_count
        self._max_seen = 0
        self._known: dict[str, str] = {}  # uuid -> description, for naming missing GPUs

    def evaluate(self, sample: NodeSample, ctx: RuleContext) -> Iterable[Finding]:
        if sample.gpu_source_error is not None:
            return
        cond = ConditionType.GPU_MISSING
        present = [g for g in sample.gpus if not g.lost]
        for gpu in sample.gpus:
            entity = ctx.gpu_entity(gpu)
            if gpu.uuid:
                self._known[gpu.uuid] = entity.describe()
            if gpu.lost:
                yield Finding(
                    cond,
                    Reason.GPU_LOST,
                    f"{entity.describe()} is lost (NVML: GPU is lost, fallen off the bus); "
                    f"recommended action {Action.REBOOT}",
                    Action.REBOOT,
                    entity,
                    latched=True,
                    immediate=True,
                )
        self._max_seen = max(self._max_seen, len(sample.gpus))
        expected = self._configured if self._configured is not None else self._max_seen
        if len(present) < expected:
            visible = {g.uuid for g in present}
            missing = sorted(desc for uuid, desc in self._known.items() if uuid not in visible)
            names = f": missing {'; '.join(missing)}" if missing else ""
            yield Finding(
                cond,
                Reason.GPU_COUNT_MISMATCH,
                f"node: {len(present)} of {expected} expected GPUs usable{names}; recommended action {Action.REBOOT}",
                Action.REBOOT,
                Entity.node(),
            )
