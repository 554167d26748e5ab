"""GPU memory rule: row remapping (Ampere+) and page retirement (older).

A pending remap means the GPU recorded a bad row that takes effect only after
a reset: ``RowRemapPending`` with ``RESET_GPU``. A remap failure means a bank
ran out of spare rows: ``RowRemapFailure`` with ``REPLACE``. On pre-Ampere
GPUs, retired pages pending a reset, or more retired pages than the
configured limit, are the equivalent. All of them latch: the counter going
quiet does not repair the memory.
"""

from __future__ import annotations

from collections.abc import Iterable

from agent.config import AgentConfig
from agent.rules.base import Finding, RuleContext
from agent.samples import NodeSample
from gpuwarden.contract import Action, ConditionType, Reason


class MemoryRule:
    conditions = frozenset({ConditionType.GPU_MEMORY_DEGRADED})

    def __init__(self, config: AgentConfig) -> None:
        self._limit = config.gpu.retired_pages_limit

    def evaluate(self, sample: NodeSample, ctx: RuleContext) -> Iterable[Finding]:
        cond = ConditionType.GPU_MEMORY_DEGRADED
        for gpu in sample.gpus:
            if gpu.lost:
                continue
            entity = ctx.gpu_entity(gpu)
            rows = gpu.remapped_rows
            if rows is not None:
                if rows.failure:
                    yield Finding(
                        cond,
                        Reason.ROW_REMAP_FAILURE,
                        f"{entity.describe()}: row remapping failed, no spare rows left "
                        f"({rows.uncorrectable} uncorrectable, {rows.correctable} correctable rows remapped); "
                        f"recommended action {Action.REPLACE}",
                        Action.REPLACE,
                        entity,
                        latched=True,
                    )
                if rows.pending:
                    yield Finding(
                        cond,
                        Reason.ROW_REMAP_PENDING,
                        f"{entity.describe()}: row remap pending, takes effect after a GPU reset "
                        f"({rows.uncorrectable} uncorrectable, {rows.correctable} correctable rows remapped); "
                        f"recommended action {Action.RESET_GPU}",
                        Action.RESET_GPU,
                        entity,
                        latched=True,
                    )
            pages = gpu.retired_pages
            if pages is not None:
                total = pages.single_bit_ecc + pages.double_bit_ecc
                if total >= self._limit:
                    yield Finding(
                        cond,
                        Reason.RETIRED_PAGES_LIMIT,
                        f"{entity.describe()}: {total} pages retired (limit {self._limit}); "
                        f"recommended action {Action.REPLACE}",
                        Action.REPLACE,
                        entity,
                        latched=True,
                    )
                if pages.pending:
                    yield Finding(
                        cond,
                        Reason.RETIRED_PAGES_PENDING,
                        f"{entity.describe()}: retired pages pending a GPU reset "
                        f"({pages.double_bit_ecc} double-bit, {pages.single_bit_ecc} single-bit); "
                        f"recommended action {Action.RESET_GPU}",
                        Action.RESET_GPU,
                        entity,
                        latched=True,
                    )
