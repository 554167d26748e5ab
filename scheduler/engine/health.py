"""Which hardware faults take GPUs or nodes out of service: the one policy.

The agent reports problems as NodeConditions (status True = present) with a
recommended action; the scheduler must decide which of them make hardware
unusable. The rule, in one place:

- **Fatal** (capacity removed, running pods evicted, nothing new placed):
  - ``GpuXidError``: a fatal XID was seen and is latched until repair.
  - ``GpuMemoryDegraded`` with reason ``RowRemapFailure`` or
    ``RetiredPagesLimit``: the memory can no longer hide its bad rows.
  - ``GpuMissing``: the node has lost GPUs; what remains cannot be trusted
    to be the devices the pods were given.
  - any condition whose recommended action is ``RESET_GPU``, ``REBOOT`` or
    ``REPLACE``: the agent says the hardware must go through repair.
  A fatal condition that names GPU indices is fatal for those GPUs only; one
  that names none is fatal for the whole node. ``RESET_GPU`` is per GPU by
  nature; ``REBOOT``/``REPLACE`` and ``GpuMissing`` always take the node.
- **Degraded** (still usable, placed on last): every other True condition,
  e.g. NVLink or PCIe running below spec, an InfiniBand port at a lower
  rate, a pending row remap, hung storage.

A GPU with ``healthy`` False in the inventory is out of service whatever the
conditions say, and a node being drained by remediation is treated as fatal
for all of its GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuwarden.contract import Action, ConditionType, Reason
from scheduler.engine.model import Node

_FATAL_TYPES = frozenset({ConditionType.GPU_XID_ERROR.value, ConditionType.GPU_MISSING.value})
_NODE_WIDE_TYPES = frozenset({ConditionType.GPU_MISSING.value})
_FATAL_REASONS = {
    ConditionType.GPU_MEMORY_DEGRADED.value: frozenset(
        {Reason.ROW_REMAP_FAILURE.value, Reason.RETIRED_PAGES_LIMIT.value}
    ),
}
_FATAL_ACTIONS = frozenset({Action.RESET_GPU, Action.REBOOT, Action.REPLACE})
_NODE_WIDE_ACTIONS = frozenset({Action.REBOOT, Action.REPLACE})


@dataclass(frozen=True, slots=True)
class NodeHealth:
    """The verdict for one node.

    ``node_fatal`` names why the whole node is out (None if it is not);
    ``bad_gpus`` maps GPU index to why that GPU is out; ``degraded`` lists
    the non-fatal condition types present.
    """

    node_fatal: str | None
    bad_gpus: dict[int, str]
    degraded: tuple[str, ...]


def is_fatal(ctype: str, reason: str, action: Action) -> bool:
    """Whether a True condition takes hardware out of service (the rule above).

    Public so that remediation repairs exactly what placement refuses: a
    fault one side treats as fatal and the other does not would leave
    hardware fenced with nobody repairing it, or repaired while still placed.
    """
    return ctype in _FATAL_TYPES or reason in _FATAL_REASONS.get(ctype, frozenset()) or action in _FATAL_ACTIONS


def is_node_wide(ctype: str, action: Action, gpu_indices: tuple[int, ...]) -> bool:
    """Whether a fatal condition takes the whole node rather than the GPUs it names."""
    return ctype in _NODE_WIDE_TYPES or action in _NODE_WIDE_ACTIONS or not gpu_indices


def judge(node: Node) -> NodeHealth:
    node_fatal: str | None = "being drained by remediation" if node.draining else None
    bad: dict[int, str] = {}
    degraded: list[str] = []
    for cond in node.conditions:
        if not cond.status:
            continue
        label = f"{cond.type}/{cond.reason}" if cond.reason else cond.type
        if not is_fatal(cond.type, cond.reason, cond.action):
            degraded.append(cond.type)
            continue
        if is_node_wide(cond.type, cond.action, cond.gpu_indices):
            node_fatal = node_fatal or label
        else:
            for index in cond.gpu_indices:
                bad.setdefault(index, label)
    for gpu in node.gpus:
        if not gpu.healthy:
            bad.setdefault(gpu.index, "GPU reported unhealthy")
    return NodeHealth(node_fatal, bad, tuple(sorted(set(degraded))))
