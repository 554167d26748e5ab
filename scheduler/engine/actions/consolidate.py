"""Consolidate: defragment so that a job that fits in total fits on nodes.

A pending job may be short of room on every single node while the pool as a
whole has enough free (four free GPUs, one on each of four nodes, and a pod
that needs four on one; or two GPUs each half used by a slice, and a pod
that needs one whole GPU). Consolidation moves preemptible running work out
of the way: it evicts victims on a node the job could use, places the job,
and then places every moved pod again elsewhere (a slice onto the free half
of another GPU, packing slices to free a whole one). A placement counts only
if every pod it moved found a new place; when they do not, the victim search
tries other victims and other nodes (:mod:`scheduler.engine.victims`). The
eviction names the beneficiary and where the moved pod's room is kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuwarden.contract import EvictionAction, UnschedulableReason
from scheduler.engine.caches import SessionCaches, VictimIndex
from scheduler.engine.eviction_plan import EvictionPlan, run_evictions
from scheduler.engine.resources import CPU, GPU, MEMORY, MILLI
from scheduler.engine.scoring import find_place
from scheduler.engine.state import Cluster, JobState, PoolState, TaskState
from scheduler.engine.statement import Statement


@dataclass(slots=True)
class _PoolRoom:
    """Free room per pool, summed once per committed state (plans that fail leave the state as it was)."""

    cluster: Cluster
    seen: dict[str, tuple[int, list[int]]] = field(default_factory=dict)

    def free(self, pool: PoolState) -> list[int]:
        """Free milli-GPUs (whole free GPUs and the free part of shared ones), CPU and memory."""
        version = self.cluster.commit_version
        cached = self.seen.get(pool.name)
        if cached is not None and cached[0] == version:
            return cached[1]
        total = [pool.free_whole_total * MILLI, 0, 0]
        for n in pool.nodes:
            if not n.accepts:
                continue
            total[CPU] += n.free_cpu
            total[MEMORY] += n.free_mem
            for p, ok in enumerate(n.gpu_ok):
                if ok and n.gpu_slices[p] and not n.gpu_whole[p] and n.gpu_mem[p] > 0:
                    total[GPU] += n.gpu_free[p] * MILLI // n.gpu_mem[p]
        self.seen[pool.name] = (version, total)
        return total


def _fits_in_total(room: _PoolRoom, pool: PoolState, job: JobState) -> bool:
    """Could the pool hold the gang if its free room were in one place?

    Free GPU room counts whole free GPUs and the free memory of GPUs that
    slices share (in GPUs of their own size): two GPUs each half used
    together offer one, which packing the slices onto one GPU frees.
    """
    pending = job.pending_tasks()
    required = pending[: max(1, job.gang_short)]
    free = room.free(pool)
    need = [sum(t.gpu.whole for t in required) * MILLI, sum(t.cpu for t in required), sum(t.mem for t in required)]
    return all(need[r] <= free[r] for r in (GPU, CPU, MEMORY))


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
    room = _PoolRoom(cluster)

    def admissible(victim: JobState, _tasks: Sequence[TaskState]) -> bool:
        return movable(victim)

    def relocate(stmt: Statement, mark: int) -> bool:
        return _relocate(cluster, caches, stmt, mark)

    def plan(job: JobState, index: VictimIndex) -> EvictionPlan | None:
        if job.reasons and job.reasons[0].code is not UnschedulableReason.INSUFFICIENT_RESOURCES:
            return None
        pool = job.pool
        assert pool is not None
        if not _fits_in_total(room, pool, job):
            return None
        return EvictionPlan(
            victims=index.by_pool.get(pool.name, []).__iter__,
            is_candidate=movable,
            admissible=admissible,
            action=EvictionAction.CONSOLIDATE,
            reason=f"moved to make room for {job.key}",
            step=relocate,
            failure_note=(
                f"cannot consolidate: pool {pool.name} has the room in total, but no preemptible pods could be "
                "moved to put it on one node with every moved pod placed again elsewhere"
            ),
        )

    run_evictions(cluster, caches, plan)


def _relocate(cluster: Cluster, caches: SessionCaches, stmt: Statement, mark: int) -> bool:
    """Place every pod evicted in ``stmt`` since ``mark`` again; False if any finds no room."""
    moved = [
        e.task for e in stmt.log[mark:] if e.task.was_running and e.task.eviction is not None and e.task.node is None
    ]
    for task in moved:
        found = find_place(cluster, caches, task)
        if found is None:
            return False
        stmt.allocate(task, *found)
    return True
