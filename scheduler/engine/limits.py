"""Queue limits and quotas: may the queue take this much more at all?

Checked before any node is looked at, for every queue on the path from the
top level down, so a refusal names the queue and the limit that was hit.
A resource a queue does not govern (quota and limit both unbounded, see
``model.UNGOVERNED``) passes both checks for that queue: a GPU-only queue
admits non-preemptible pods whatever CPU and memory they ask for.

A queue whose ``overQuotaWeight`` for a resource is 0 never borrows: its
quota of that resource bounds it like a limit, for preemptible work too and
however idle the cluster is (fair share already gives it nothing beyond
quota; this keeps placement to the same rule).
"""

from __future__ import annotations

from gpuwarden.contract import UnschedulableReason
from scheduler.engine.model import UNLIMITED, PendingReason
from scheduler.engine.resources import RESOURCE_NAMES, RESOURCES, format_amount
from scheduler.engine.state import QueueState


def limit_problem(queue: QueueState, request: list[int], preemptible: bool) -> PendingReason | None:
    """Refuse work that would take a queue (or an ancestor) over its limit,
    or non-preemptible work beyond quota."""
    for q in queue.path:
        for r in RESOURCES:
            limit = q.limit[r]
            if request[r] and limit != UNLIMITED and q.alloc[r] + request[r] > limit:
                over = q.alloc[r] + request[r] - limit
                return PendingReason(
                    UnschedulableReason.OVER_LIMIT,
                    f"queue {q.name} has a {RESOURCE_NAMES[r]} limit of {format_amount(r, limit)}; "
                    f"it holds {format_amount(r, q.alloc[r])} and this needs {format_amount(r, request[r])} "
                    f"({format_amount(r, over)} over)",
                )
            quota = q.quota[r]
            if request[r] and not q.borrows[r] and q.alloc[r] + request[r] > quota:
                return PendingReason(
                    UnschedulableReason.OVER_LIMIT,
                    f"queue {q.name} never borrows {RESOURCE_NAMES[r]} (overQuotaWeight 0), so its quota of "
                    f"{format_amount(r, quota)} is its limit; it holds {format_amount(r, q.alloc[r])} and this "
                    f"needs {format_amount(r, request[r])}",
                )
    if not preemptible:
        for q in queue.path:
            for r in RESOURCES:
                quota = q.quota[r]
                if request[r] and quota != UNLIMITED and q.np_alloc[r] + request[r] > quota:
                    left = max(0, quota - q.np_alloc[r])
                    return PendingReason(
                        UnschedulableReason.NON_PREEMPTIBLE_OVER_QUOTA,
                        f"non-preemptible work must fit in quota: queue {q.name} has a {RESOURCE_NAMES[r]} "
                        f"quota of {format_amount(r, quota)} with {format_amount(r, left)} left for "
                        f"non-preemptible work, and this needs {format_amount(r, request[r])}",
                    )
    return None
