"""Preempt: within one queue, higher-priority work displaces lower.

Only strictly lower-priority, preemptible jobs of the same queue are
victims, cheapest first (lowest priority, then youngest). Because the room
comes from the queue's own allocation, preemption never changes how much a
queue holds against others; it only changes what the queue spends it on.
"""

from __future__ import annotations

from agent.contract import EvictionAction
from scheduler.engine.state import Cluster, JobState
from scheduler.engine.statement import Statement
from scheduler.engine.victims import (
    MAX_BENEFICIARIES,
    FailureMemo,
    beneficiaries,
    evictable,
    make_room,
    memo_key,
    running_jobs,
    victim_order,
)


def _always(_victim: JobState) -> bool:
    return True


def run(cluster: Cluster) -> None:
    memo = FailureMemo()
    tried = 0
    running = sorted((j for j in running_jobs(cluster) if j.preemptible), key=victim_order)
    for job in beneficiaries(cluster):
        if tried >= MAX_BENEFICIARIES:
            break
        candidates = {
            id(v): rank
            for rank, v in enumerate(running)
            if v.queue is job.queue and v.spec.priority < job.spec.priority and any(evictable(t) for t in v.tasks)
        }
        if not candidates:
            continue
        key = memo_key(job)
        if memo.known_failure(cluster, key):
            continue
        tried += 1
        stmt = Statement(cluster)
        reason = f"preempted by higher-priority {job.key} (priority {job.spec.priority})"
        if make_room(
            cluster,
            stmt,
            job,
            candidates=candidates,
            admissible=_always,
            action=EvictionAction.PREEMPT,
            reason=reason,
        ):
            stmt.commit()
            job.reasons = []
        else:
            stmt.rollback()
            memo.remember(cluster, key)
