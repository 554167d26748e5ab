"""GPU count rule: GPUs lost, or fewer GPUs than the node should have.

A GPU NVML reports as lost (``GPU_IS_LOST``) is ``GpuLost``, latched, with
``REBOOT``: only a reboot (or a board replacement) brings it back. Fewer GPUs
enumerated than expected is ``GpuCountMismatch``; the expected count is the
configured one, else the most seen since boot. An agent restarted after a GPU
vanished would otherwise take the smaller count as normal, so with
``gpu.state_file`` set the count is kept in that file together with the
kernel's boot id, and a restart within the same boot starts from it. When
NVML itself is unavailable nothing is judged: "unknown" is not "zero GPUs".
"""

from __future__ import annotations

from collections.abc import Iterable

from agent.bootstate import BootState, current_boot_id
from agent.config import AgentConfig
from agent.model import Entity
from agent.rules.base import Finding, RuleContext
from agent.samples import NodeSample
from gpuwarden.contract import Action, ConditionType, Reason


class GpuCountRule:
    conditions = frozenset({ConditionType.GPU_MISSING})

    def __init__(self, config: AgentConfig, boot_id: str | None = None) -> None:
        self._configured = config.gpu.expected_count
        boot = current_boot_id() if boot_id is None else boot_id
        self._state = BootState(config.gpu.state_file, boot) if config.gpu.state_file else None
        self._max_seen = self._load()
        self._known: dict[str, str] = {}  # uuid -> description, for naming missing GPUs

    def _load(self) -> int:
        count = self._state.load().get("max_gpus") if self._state is not None else None
        return count if isinstance(count, int) and count >= 0 else 0

    def _save(self) -> None:
        if self._state is not None:
            self._state.save({"max_gpus": self._max_seen})

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
                    f"{entity.describe()} is lost ({'; '.join(gpu.errors) or 'NVML: GPU is lost'}); "
                    f"recommended action {Action.REBOOT}",
                    Action.REBOOT,
                    entity,
                    latched=True,
                    immediate=True,
                )
        if len(sample.gpus) > self._max_seen:
            self._max_seen = len(sample.gpus)
            self._save()
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
