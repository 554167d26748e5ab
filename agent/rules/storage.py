"""Storage rule: a configured shared mount that is missing or hung.

Jobs that checkpoint to shared storage hang with it, on perfectly healthy
GPUs, so the node should stop taking such work: ``MountMissing`` when the path
is not a mount point, ``MountHung`` when ``statvfs`` has not answered within
the mount's timeout (or failed). Both clear with hysteresis when the mount
answers again.
"""

from __future__ import annotations

from collections.abc import Iterable

from agent.config import AgentConfig
from agent.model import Entity
from agent.rules.base import Finding, RuleContext
from agent.samples import NodeSample
from gpuwarden.contract import Action, ConditionType, Reason


class StorageRule:
    conditions = frozenset({ConditionType.STORAGE_DEGRADED})

    def __init__(self, config: AgentConfig) -> None:
        self._cfg = config.storage

    def evaluate(self, sample: NodeSample, ctx: RuleContext) -> Iterable[Finding]:
        cond = ConditionType.STORAGE_DEGRADED
        for m in sample.mounts:
            entity = Entity.mount_point(m.path)
            if not m.mounted:
                yield Finding(
                    cond,
                    Reason.MOUNT_MISSING,
                    f"{entity.describe()} is not mounted ({m.error or 'not a mount point'}); "
                    f"recommended action {Action.REBOOT}",
                    Action.REBOOT,
                    entity,
                )
            elif not m.responsive:
                yield Finding(
                    cond,
                    Reason.MOUNT_HUNG,
                    f"{entity.describe()} does not answer ({m.error or 'timed out'}); "
                    f"recommended action {Action.REBOOT}",
                    Action.REBOOT,
                    entity,
                )
