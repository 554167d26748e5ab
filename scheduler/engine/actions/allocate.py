"""Allocate: place pending jobs on free resources, neediest queue first.

Per node pool, queues take turns: the queue that should go next (below fair
share first, then lowest dominant-resource share; see
:mod:`scheduler.engine.ordering`) offers its best job (priority, then age),
the job is placed whole or not at all, and the queue goes back in line with
its new standing. Queue keys only grow while allocate runs (nothing is
released), so a heap with re-check-on-pop keeps the order exact without
re-sorting every queue after every job.
"""

from __future__ import annotations

import heapq

from scheduler.engine.caches import SessionCaches
from scheduler.engine.gangs import place_job
from scheduler.engine.ordering import job_key, queue_key
from scheduler.engine.state import Cluster, JobState, QueueState
from scheduler.engine.statement import Statement

_Key = tuple[tuple[int, float, str], ...]


def run(cluster: Cluster, caches: SessionCaches) -> None:
    for pool_name in sorted(cluster.pools):
        capacity = cluster.pools[pool_name].capacity
        waiting: dict[str, list[JobState]] = {}
        heap: list[tuple[_Key, str, QueueState]] = []
        for queue in cluster.queues.values():
            if queue.pool != pool_name:
                continue
            jobs = sorted((j for j in queue.jobs if any(t.is_pending for t in j.tasks)), key=job_key, reverse=True)
            if jobs:
                waiting[queue.name] = jobs
                heap.append((queue_key(queue, capacity), queue.name, queue))
        heapq.heapify(heap)
        while heap:
            key, name, queue = heapq.heappop(heap)
            current = queue_key(queue, capacity)
            if current != key:
                heapq.heappush(heap, (current, name, queue))
                continue
            jobs = waiting[name]
            job = jobs.pop()
            stmt = Statement(cluster)
            problem = place_job(cluster, caches, stmt, job)
            if problem is None:
                stmt.commit()
                job.reasons = []
            else:
                job.reasons = [problem]
            if jobs:
                heapq.heappush(heap, (queue_key(queue, capacity), name, queue))
