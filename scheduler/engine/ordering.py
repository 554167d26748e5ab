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

from scheduler.engine.resources import CPU, GPU, MEMORY
from scheduler.engine.state import JobState, QueueState, TaskState


def queue_key(
    queue: QueueState, capacity: list[int], need: list[int] | None = None
) -> tuple[tuple[int, float, str], ...]:
    """The queue's place in line; ``need`` is what its next job asks for (GPU milli, CPU, memory)."""
    return tuple(_level_key(q, capacity, need) for q in queue.path)


def _level_key(q: QueueState, capacity: list[int], need: list[int] | None) -> tuple[int, float, str]:
    # Read once per queue per turn of allocate, for every level of its path:
    # written out over the three resources rather than looped, which halves
    # the cost of the queue order on trees of a hundred queues.
    alloc = q.alloc
    a0, a1, a2 = alloc[0], alloc[1], alloc[2]
    if need is None or not (need[0] or need[1] or need[2]):
        over = 0 if q.share_ratio() < 1.0 else 1
    else:
        share = q.share
        n0, n1, n2 = need[0], need[1], need[2]
        over = (
            1
            if (a0 + n0 > share[0] and (n0 > 0 or a0 > 0))
            or (a1 + n1 > share[1] and (n1 > 0 or a1 > 0))
            or (a2 + n2 > share[2] and (n2 > 0 or a2 > 0))
            else 0
        )
    drs = 0.0
    for a, cap in ((a0, capacity[0]), (a1, capacity[1]), (a2, capacity[2])):
        if cap > 0:
            drs = max(drs, a / cap)
        elif a > 0:
            drs = float("inf")
    return (over, drs, q.tree.name)


def gang_need(job: JobState) -> list[int]:
    """What placing the job's gang (or, once it is whole, its next pod) would add to its queue."""
    # One pass over the tasks (gang_short would take another): read once per
    # job per allocate, for every pending job in the cluster.
    held = 0
    pending: list[TaskState] = []
    for t in job.tasks:
        if t.node is not None:
            if not t.releasing:
                held += 1
        elif not t.was_running:
            pending.append(t)
    count = max(1, job.spec.min_member - held - job.spec.succeeded)
    need = [0, 0, 0]
    for t in pending[:count]:
        need[GPU] += t.milli
        need[CPU] += t.cpu
        need[MEMORY] += t.mem
    return need


def job_key(job: JobState) -> tuple[int, float, str]:
    return (-job.spec.priority, job.spec.created, job.key)
