"""Who goes first: queue order and job order, shared by every action.

Queues are compared level by level down the tree, the way a person would
pick: first among the top-level queues, then among that one's children. At
each level a queue below its fair share comes before one at or above it,
then the lower dominant-resource share (allocation over the pool's healthy
capacity) comes first, then the name. Within a queue, jobs go by priority
(highest first), then age (oldest first), then name.
"""

from __future__ import annotations

from scheduler.engine.resources import RESOURCES
from scheduler.engine.state import JobState, QueueState


def queue_key(queue: QueueState, capacity: list[int]) -> tuple[tuple[int, float, str], ...]:
    return tuple(_level_key(q, capacity) for q in queue.path)


def _level_key(q: QueueState, capacity: list[int]) -> tuple[int, float, str]:
    below = 0 if q.share_ratio() < 1.0 else 1
    drs = 0.0
    for r in RESOURCES:
        cap = capacity[r]
        if cap > 0:
            drs = max(drs, q.alloc[r] / cap)
        elif q.alloc[r] > 0:
            drs = float("inf")
    return (below, drs, q.name)


def job_key(job: JobState) -> tuple[int, float, str]:
    return (-job.spec.priority, job.spec.created, job.key)
