"""Allocate: place pending jobs on free resources, neediest queue first.

Per node pool, queues take turns: the queue that should go next (one whose
next job keeps it within its fair share first, then lowest dominant-resource
share; see :mod:`scheduler.engine.ordering`) acts, and goes back in line with its new
standing. This happens in two rounds:

1. Each turn offers the queue's best job (priority, then age). Its gang
   (``minMember`` pods) is placed whole or not at all; its further pods
   only while the queue, and every queue above it, is still below its fair
   share.
2. Once every job has had its turn, the pods beyond ``minMember`` still
   waiting are placed, one per turn, in the same order.

So a job that could use far more than its gang takes the room beyond its
queue's share only once no queue below its own share has anything left to
place in the pool: taken earlier, that room would keep such a queue waiting
until the next session's reclaim undid it. One pod per turn in the second
round shares what is left between elastic jobs instead of handing it all to
the first.

A queue's key changes only on its own turn (its allocation and its next
job) or grows with its ancestors' allocation (nothing is released), so a
heap with re-check-on-pop keeps the order exact without re-sorting every
queue after every turn.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from scheduler.engine.caches import SessionCaches
from scheduler.engine.gangs import place_extra, place_job
from scheduler.engine.ordering import QueueKey, gang_need, job_key, queue_key
from scheduler.engine.state import Cluster, JobState, QueueState
from scheduler.engine.statement import Statement

# One turn of a queue over its line of jobs (best last); it pops the jobs it is done with.
_Turn = Callable[[QueueState, list[JobState]], None]


def run(cluster: Cluster, caches: SessionCaches) -> None:
    memo = caches.backlog
    if memo is not None:
        memo.allocate_begins(cluster)
    for pool_name in sorted(cluster.pools):
        _allocate_pool(cluster, caches, pool_name)
    if memo is not None:
        memo.allocate_ends(cluster)


def _allocate_pool(cluster: Cluster, caches: SessionCaches, pool_name: str) -> None:
    capacity = cluster.pools[pool_name].capacity
    # From the jobs the build found pending (a superset of those pending
    # now), not from every job of every queue: a cluster of running work
    # costs allocate nothing.
    lines: dict[str, list[JobState]] = {}
    for job in cluster.pending_jobs:
        queue = job.queue
        if queue is not None and queue.pool == pool_name and any(t.is_pending for t in job.tasks):
            lines.setdefault(queue.name, []).append(job)
    waiting: dict[str, list[JobState]] = {}
    for queue in cluster.queues.values():
        jobs = lines.get(queue.name)
        if jobs and queue.pool == pool_name:
            jobs.sort(key=job_key, reverse=True)
            waiting[queue.name] = jobs
    elastic: dict[str, list[JobState]] = {}

    def offer_job(queue: QueueState, jobs: list[JobState]) -> None:
        job = jobs.pop()
        if _place_within_share(cluster, caches, queue, job):
            elastic.setdefault(queue.name, []).append(job)

    def offer_extra(queue: QueueState, jobs: list[JobState]) -> None:
        job = jobs[-1]
        stmt = Statement(cluster)
        if place_extra(cluster, caches, stmt, job) is None:
            stmt.commit()
            if any(t.is_pending for t in job.tasks):
                return
        jobs.pop()

    _take_turns(cluster, capacity, waiting, offer_job)
    for jobs in elastic.values():
        jobs.reverse()
    _take_turns(cluster, capacity, elastic, offer_extra)


def _take_turns(cluster: Cluster, capacity: list[int], lines: dict[str, list[JobState]], turn: _Turn) -> None:
    """Give queues turns in queue order until every line is empty.

    A queue's key is worked out again only when it may have changed: each
    heap entry carries the turn it was computed after, and each queue the
    last turn that changed its allocation. A popped entry none of whose
    path changed since is current as it stands; on trees of a hundred
    queues that spares most of the key computations, which were the larger
    part of allocate.
    """

    queues = cluster.queues
    # What each queue's next job asks for changes only on that queue's own
    # turn, so it is worked out then, not each time the queue's key is read.
    needs = {name: gang_need(jobs[-1]) for name, jobs in lines.items()}
    changed: dict[QueueState, int] = {}  # the last turn that changed each queue's allocation

    def key_of(name: str) -> QueueKey:
        return queue_key(queues[name], capacity, needs[name])

    def stale(name: str, since: int) -> bool:
        return any(changed.get(q, -1) > since for q in queues[name].path)

    heap: list[tuple[QueueKey, str, int]] = [(key_of(name), name, 0) for name in lines]
    heapq.heapify(heap)
    turns = 0
    while heap:
        key, name, since = heapq.heappop(heap)
        if stale(name, since):
            current = key_of(name)
            if current != key:
                heapq.heappush(heap, (current, name, turns))
                continue
        queue = queues[name]
        held = (queue.alloc[0], queue.alloc[1], queue.alloc[2])
        jobs = lines[name]
        turn(queue, jobs)
        turns += 1
        # Taking room charges the queue and every queue above it, and
        # nothing else: its path is all a turn can change.
        if held != (queue.alloc[0], queue.alloc[1], queue.alloc[2]):
            for q in queue.path:
                changed[q] = turns
        if jobs:
            needs[name] = gang_need(jobs[-1])
            heapq.heappush(heap, (key_of(name), name, turns))


def _place_within_share(cluster: Cluster, caches: SessionCaches, queue: QueueState, job: JobState) -> bool:
    """Place the job's gang, then its further pods while its queue is below
    fair share; True when it has pods left for the second round."""
    stmt = Statement(cluster)
    # A fresh statement and no other open: what the backlog memo needs to
    # trust and to record a "no room" (scheduler.engine.backlog).
    problem = place_job(cluster, caches, stmt, job, beyond_gang=False, memo=caches.backlog)
    if problem is not None:
        job.reasons = [problem]
        return False
    job.reasons = []
    if len(job.tasks) + job.spec.succeeded <= job.spec.min_member:
        stmt.commit()  # a placed gang of every pod leaves none waiting
        return False
    pending = any(t.is_pending for t in job.tasks)
    while pending and all(q.share_ratio() < 1.0 for q in queue.path):
        if place_extra(cluster, caches, stmt, job) is not None:
            stmt.commit()
            return False
        pending = any(t.is_pending for t in job.tasks)
    stmt.commit()
    return pending
