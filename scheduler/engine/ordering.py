"""Who goes first: queue order and job order, shared by every action.

Queues are compared level by level down the tree, the way a person would
pick: first among the top-level queues, then among that one's children. At
each level a queue that its next job keeps within its fair share comes
before one that the job would take over it (or that is over it already),
then the lower dominant-resource share (allocation over the pool's healthy
capacity) comes first, then the name. Judging a queue by what its next job
would do, not by where it stands, is what keeps allocation from handing a
queue more than its share on a name tie-break while another queue below its
share has a job that fits: reclaim would only evict it again in the same
session. Within a queue, jobs go by priority (highest first), then age
(oldest first), then name.
"""

from __future__ import annotations

from scheduler.engine.resources import CPU, GPU, MEMORY, RESOURCES
from scheduler.engine.state import JobState, QueueState


def queue_key(
    queue: QueueState, capacity: list[int], need: list[int] | None = None
) -> tuple[tuple[int, float, str], ...]:
    """The queue's place in line; ``need`` is what its next job asks for (GPU milli, CPU, memory)."""
    return tuple(_level_key(q, capacity, need) for q in queue.path)


def _level_key(q: QueueState, capacity: list[int], need: list[int] | None) -> tuple[int, float, str]:
    if need is None or not any(need):
        over = 0 if q.share_ratio() < 1.0 else 1
    else:
        over = 0
        for r in RESOURCES:
            after = q.alloc[r] + need[r]
            if after > q.share[r] and (need[r] > 0 or q.alloc[r] > 0):
                over = 1
                break
    drs = 0.0
    for r in RESOURCES:
        cap = capacity[r]
        if cap > 0:
            drs = max(drs, q.alloc[r] / cap)
        elif q.alloc[r] > 0:
            drs = float("inf")
    return (over, drs, q.name)


def gang_need(job: JobState) -> list[int]:
    """What placing the job's gang (or, once it is whole, its next pod) would add to its queue."""
    need = [0, 0, 0]
    count = max(1, job.gang_short)
    for t in job.tasks:
        if not t.is_pending:
            continue
        need[GPU] += t.milli
        need[CPU] += t.cpu
        need[MEMORY] += t.mem
        count -= 1
        if count == 0:
            break
    return need


def job_key(job: JobState) -> tuple[int, float, str]:
    return (-job.spec.priority, job.spec.created, job.key)
