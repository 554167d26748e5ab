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

# A queue's place in line: ``(over, dominant share, name)`` for each level
# of its path, top-level first, laid out flat. Every level contributes three
# items, so comparing two flat keys orders queues exactly as comparing their
# per-level triples would, without a tuple per level.
QueueKey = tuple[int | float | str, ...]

_INF = float("inf")


def queue_key(queue: QueueState, capacity: list[int], need: list[int] | None = None) -> QueueKey:
    """The queue's place in line; ``need`` is what its next job asks for (GPU milli, CPU, memory).

    Allocate reads it for a queue on every turn that queue's ancestors
    take, thousands of times a session on a tree of a hundred queues, so the
    three resources are written out rather than looped over.
    """
    c0, c1, c2 = capacity
    if need is None:
        n0 = n1 = n2 = 0
    else:
        n0, n1, n2 = need
    asks = bool(n0 or n1 or n2)
    key: list[int | float | str] = []
    for q in queue.path:
        a0, a1, a2 = q.alloc
        if asks:
            s0, s1, s2 = q.share
            over = (
                1
                if (a0 + n0 > s0 and (n0 > 0 or a0 > 0))
                or (a1 + n1 > s1 and (n1 > 0 or a1 > 0))
                or (a2 + n2 > s2 and (n2 > 0 or a2 > 0))
                else 0
            )
        else:
            over = 0 if q.share_ratio() < 1.0 else 1
        # The dominant-resource share: the largest of allocation over the
        # pool's healthy capacity; held with no capacity at all is infinite.
        r0 = a0 / c0 if c0 > 0 else (_INF if a0 > 0 else 0.0)
        r1 = a1 / c1 if c1 > 0 else (_INF if a1 > 0 else 0.0)
        r2 = a2 / c2 if c2 > 0 else (_INF if a2 > 0 else 0.0)
        key += (over, max(0.0, r0, r1, r2), q.tree.name)
    return tuple(key)


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
