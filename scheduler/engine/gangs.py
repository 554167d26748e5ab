"""Gang placement: a job's pods are placed together, at least ``min_member`` or none.

The limit check (:mod:`scheduler.engine.limits`) comes first, then a quick
count of free whole GPUs that refuses a gang the pool cannot hold without
looking at a node, then pod by pod placement (:mod:`scheduler.engine.scoring`)
on a statement that is rolled back if the gang falls short.
"""

from __future__ import annotations

from gpuwarden.contract import UnschedulableReason
from scheduler.engine.caches import Backlog, SessionCaches
from scheduler.engine.limits import limit_problem
from scheduler.engine.model import PendingReason
from scheduler.engine.reservations import release_for, reserved_place
from scheduler.engine.scoring import find_place, place_for
from scheduler.engine.state import TIERS, Cluster, JobState, PoolState, TaskState
from scheduler.engine.statement import Statement


def quick_reject(pool: PoolState, tasks: list[TaskState]) -> bool:
    """True when the pool cannot possibly hold ``tasks`` (ignores predicates)."""
    need_whole = 0
    shapes: dict[int, int] = {}
    for t in tasks:
        w = t.gpu.whole
        if w:
            need_whole += w
            shapes[w] = shapes.get(w, 0) + 1
    if need_whole == 0:
        return False
    if need_whole > pool.free_whole_total:
        return True
    # Each k-GPU pod needs a node with k free GPUs: count the slots.
    for k, count in shapes.items():
        slots = 0
        for tier in TIERS:
            for c, nodes in pool.whole_buckets[tier].items():
                if c >= k:
                    slots += len(nodes) * (c // k)
        if slots < count:
            return True
    return False


def place_job(
    cluster: Cluster,
    caches: SessionCaches,
    stmt: Statement,
    job: JobState,
    *,
    beyond_gang: bool = True,
    memo: Backlog | None = None,
) -> PendingReason | None:
    """Place the job's pending tasks: at least enough for its gang, or none.

    Tasks beyond ``min_member`` are placed while they fit (when
    ``beyond_gang``). Members that already succeeded count toward the
    gang: once they and the held ones make ``min_member``, every pending
    task is one beyond it (a Job whose last pods are fewer than its
    parallelism still places them). Returns None on success, else the
    reason it failed; on failure every placement made here is rolled back.

    ``memo`` is given only with a fresh statement and none other open: a
    gang it knows has no room is refused without a search (limits are
    checked first, so their reasons stay live), and a gang found without
    room is recorded there.
    """
    if job.error is not None:
        return job.error
    queue = job.queue
    assert queue is not None
    pool = job.pool
    assert pool is not None
    pending = job.pending_tasks()
    if not pending:
        return None
    required = job.gang_short
    if required > len(pending):
        exist = job.held + len(pending)
        done = job.spec.succeeded
        counted = f"{exist + done} exist or succeeded" if done else f"{exist} exist"
        return PendingReason(
            UnschedulableReason.GANG_INCOMPLETE,
            f"gang needs {job.spec.min_member} pods but only {counted}",
        )
    gang = pending[:required]
    if gang:
        problem = limit_problem(queue, cluster.job_request(gang), job.preemptible)
        if problem is not None:
            return problem
    if memo is not None:
        assert stmt.mark() == 0, "the memo judges a gang against the state with no statement open"
        if gang and memo.no_room(cluster, job, gang):
            job.unplaced = gang[0]  # its pods are alike: any of them explains it
            return _no_room()
    mark = stmt.mark()
    # The job's reserved room is its own: freed first, so the gang check
    # and the placement below count it (a rollback seats it again).
    release_for(stmt, job)
    if gang and quick_reject(pool, gang):
        stmt.rollback(mark)
        job.unplaced = gang[0]
        if memo is not None:
            memo.found_no_room(cluster, job, gang, counted=True)
        return _no_room()
    for i, task in enumerate(pending):
        in_gang = i < required
        if not in_gang and not beyond_gang:
            break
        problem = _place_task(cluster, caches, stmt, task)
        if problem is None:
            continue
        if in_gang:
            stmt.rollback(mark)
            # Only a gang that placed nothing is remembered: undoing placed
            # pods moves their nodes within placement's order, which a
            # skipped attempt would not, and later pods could land elsewhere.
            if memo is not None and i == 0 and problem == _no_room():
                memo.found_no_room(cluster, job, gang, counted=False)
            return problem
        break
    job.unplaced = None
    return None


def place_extra(cluster: Cluster, caches: SessionCaches, stmt: Statement, job: JobState) -> PendingReason | None:
    """Place one more pending task of a job whose gang is already held.

    Returns None when it was placed, else why not (the job keeps its gang
    and needs no reason of its own for the extras that wait).
    """
    pending = job.pending_tasks()
    if not pending:
        return None
    mark = stmt.mark()
    release_for(stmt, job)
    problem = _place_task(cluster, caches, stmt, pending[0])
    if problem is not None:
        stmt.rollback(mark)
    job.unplaced = None
    return problem


def _place_task(cluster: Cluster, caches: SessionCaches, stmt: Statement, task: TaskState) -> PendingReason | None:
    job = task.job
    assert job.queue is not None
    problem = limit_problem(job.queue, [task.milli, task.cpu, task.mem], job.preemptible)
    if problem is not None:
        return problem
    # Most jobs hold no reserved room: they go straight to the pool's order.
    reserved = reserved_place(task) if job.reserved else None
    found = place_for(cluster, caches, task, reserved) if reserved is not None else find_place(cluster, caches, task)
    if found is None:
        job.unplaced = task
        return _no_room()
    stmt.allocate(task, *found)
    return None


def _no_room() -> PendingReason:
    """The short reason recorded when no node has room.

    The full account (which nodes were excluded and why, what each lacked)
    is worked out by :mod:`scheduler.engine.explain` once the session's
    actions are done, against the final state.
    """
    return PendingReason(UnschedulableReason.INSUFFICIENT_RESOURCES, "no node has room")
