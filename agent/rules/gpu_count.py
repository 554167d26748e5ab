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

import json
import os
from collections.abc import Iterable
from pathlib import Path

from agent.config import AgentConfig
from agent.contract import Action, ConditionType, Reason
from agent.logconfig import get_logger
from agent.model import Entity
from agent.rules.base import Finding, RuleContext
from agent.samples import NodeSample

log = get_logger(__name__)

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def current_boot_id(path: str = BOOT_ID_PATH) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


class GpuCountRule:
    conditions = frozenset({ConditionType.GPU_MISSING})

    def __init__(self, config: AgentConfig, boot_id: str | None = None) -> None:
        self._configured = config.gpu.expected_count
        self._state_file = Path(config.gpu.state_file) if config.gpu.state_file else None
        self._boot_id = current_boot_id() if boot_id is None else boot_id
        self._max_seen = self._load()
        self._known: dict[str, str] = {}  # uuid -> description, for naming missing GPUs

    def _load(self) -> int:
        if self._state_file is None:
            return 0
        try:
            data = json.loads(self._state_file.read_text())
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as exc:
            log.warning("gpu_state_file_unreadable", path=str(self._state_file), error=str(exc))
            return 0
        if not isinstance(data, dict) or data.get("boot_id") != self._boot_id or not self._boot_id:
            return 0  # another boot: the node may have been repaired since
        count = data.get("max_gpus")
        return count if isinstance(count, int) and count >= 0 else 0

    def _save(self) -> None:
        if self._state_file is None:
            return
        tmp = self._state_file.with_name(self._state_file.name + ".tmp")
        try:
            self._state_file.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({"boot_id": self._boot_id, "max_gpus": self._max_seen}))
            os.replace(tmp, self._state_file)
        except OSError as exc:
            log.warning("gpu_state_file_unwritable", path=str(self._state_file), error=exc.strerror or str(exc))

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
