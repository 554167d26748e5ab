"""Consolidate: defragment so that a job that fits in total fits on nodes.

A pending job may be short of room on every single node while the pool as a
whole has enough free (four free GPUs, one on each of four nodes, and a pod
that needs four on one). Consolidation moves preemptible running work out of
the way: it evicts victims on a node the job could use, places the job, and
then places every moved pod again elsewhere. It commits only if every moved
pod found a new place; the eviction names the beneficiary and where the
moved pod's room is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuwarden.contract import EvictionAction, UnschedulableReason
from scheduler.engine.caches import SessionCaches
from scheduler.engine.scoring import find_place
from scheduler.engine.state import Cluster, JobState, PoolState
from scheduler.engine.statement import Statement
from scheduler.engine.victims import (
    MAX_BENEFICIARIES,
    FailureMemo,
    beneficiaries,
    make_room,
    memo_key,
    victim_index,
)


def _fits_in_total(pool: PoolState, job: JobState) -> bool:
    pending = job.pending_tasks()
    required = pending[: max(1, job.spec.min_member - job.held)]
    need_gpus = sum(t.gpu.whole for t in required)
    if need_gpus > pool.free_whole_total:
        return False
    need_cpu = sum(t.cpu for t in required)
    need_mem = sum(t.mem for t in required)
    free_cpu = sum(n.free_cpu for n in pool.nodes if n.accepts)
    free_mem = sum(n.free_mem for n in pool.nodes if n.accepts)
    return need_cpu <= free_cpu and need_mem <= free_mem


@dataclass(slots=True)
class _Movable:
    """Only whole, running jobs are moved: nothing half-started, nothing terminating."""

    cache: dict[int, bool] = field(default_factory=dict)

    def __call__(self, job: JobState) -> bool:
        verdict = self.cache.get(id(job))
        if verdict is None:
            verdict = not any(t.is_pending or t.releasing for t in job.tasks)
            self.cache[id(job)] = verdict
        return verdict


def run(cluster: Cluster, caches: SessionCaches) -> None:
    memo = FailureMemo()
    tried = 0
    index = victim_index(cluster, caches)
    movable = _Movable()
    for job in beneficiaries(cluster):
        if tried >= MAX_BENEFICIARIES:
            break
        if job.reasons and job.reasons[0].code is not UnschedulableReason.INSUFFICIENT_RESOURCES:
            continue
        pool = job.pool
        assert pool is not None
        if not _fits_in_total(pool, job):
            continue
        key = memo_key(job)
        if memo.known_failure(cluster, key):
            continue
        tried += 1
        in_pool = index.by_pool.get(pool.name, [])
        stmt = Statement(cluster)
        if make_room(
            cluster,
            caches,
            stmt,
            job,
            victims=in_pool.__iter__,
            is_candidate=movable,
            admissible=movable,
            action=EvictionAction.CONSOLIDATE,
            reason=f"moved to make room for {job.key}",
        ) and _relocate(cluster, caches, stmt):
            stmt.commit()
            job.reasons = []
            job.notes = []
        else:
            stmt.rollback()
            memo.remember(cluster, key)


def _relocate(cluster: Cluster, caches: SessionCaches, stmt: Statement) -> bool:
    """Place every pod evicted in ``stmt`` again; False if any finds no room."""
    moved = [e.task for e in stmt.log if e.task.was_running and e.task.eviction is not None and e.task.node is None]
    for task in moved:
        found = find_place(cluster, caches, task)
        if found is None:
            return False
        stmt.allocate(task, *found)
    return True
