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
from scheduler.engine.caches import SessionCaches, VictimIndex
from scheduler.engine.eviction_plan import EvictionPlan, run_evictions
from scheduler.engine.scoring import find_place
from scheduler.engine.state import Cluster, JobState, PoolState
from scheduler.engine.statement import Statement


def _fits_in_total(pool: PoolState, job: JobState) -> bool:
    pending = job.pending_tasks()
    required = pending[: max(1, job.gang_short)]
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
    movable = _Movable()

    def plan(job: JobState, index: VictimIndex) -> EvictionPlan | None:
        if job.reasons and job.reasons[0].code is not UnschedulableReason.INSUFFICIENT_RESOURCES:
            return None
        pool = job.pool
        assert pool is not None
        if not _fits_in_total(pool, job):
            return None
        return EvictionPlan(
            victims=index.by_pool.get(pool.name, []).__iter__,
            is_candidate=movable,
            admissible=movable,
            action=EvictionAction.CONSOLIDATE,
            reason=f"moved to make room for {job.key}",
            finish=_relocate,
        )

    run_evictions(cluster, caches, plan)


def _relocate(cluster: Cluster, caches: SessionCaches, stmt: Statement) -> bool:
    """Place every pod evicted in ``stmt`` again; False if any finds no room."""
    moved = [e.task for e in stmt.log if e.task.was_running and e.task.eviction is not None and e.task.node is None]
    for task in moved:
        found = find_place(cluster, caches, task)
        if found is None:
            return False
        stmt.allocate(task, *found)
    return True
