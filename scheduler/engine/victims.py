"""Making room for a pending job by evicting others: shared by consolidate,
reclaim and preempt, which differ only in who may be a victim.

The plan is built node by node, the way a person would clear space: for
each task of the beneficiary's gang that does not fit anywhere as things
stand, pick a node it could use (static predicates pass) where evicting
candidate victims would free enough, evict them there in the action's victim
order until the task fits, and place it. A victim job is evicted whole (its
tasks on other nodes too): half a gang is worth nothing to anyone. If any
task cannot be placed the whole plan is rolled back.

Cost is bounded: at most ``MAX_NODES_TRIED`` nodes are tried per task, and
an action gives up on a beneficiary shape once a plan for it failed and
nothing was committed since (``FailureMemo``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from agent.contract import EvictionAction
from scheduler.engine.ordering import job_key, queue_key
from scheduler.engine.placement import eligibility, find_place, fit_on_node, limit_problem
from scheduler.engine.state import Cluster, JobState, NodeState, TaskState
from scheduler.engine.statement import Statement

MAX_NODES_TRIED = 8


def evictable(task: TaskState) -> bool:
    return task.was_running and task.node is not None and not task.releasing and task.eviction is None


def running_jobs(cluster: Cluster) -> list[JobState]:
    return [j for j in cluster.jobs if any(evictable(t) for t in j.tasks)]


def victim_order(job: JobState) -> tuple[int, float, str]:
    """Cheapest victims first: lowest priority, then youngest, then name."""
    return (job.spec.priority, -job.spec.created, job.key)


@dataclass(slots=True)
class FailureMemo:
    """Plans that failed, remembered until something is committed."""

    failed: dict[tuple[object, ...], int] = field(default_factory=dict)

    def known_failure(self, cluster: Cluster, key: tuple[object, ...]) -> bool:
        return self.failed.get(key) == cluster.commit_version

    def remember(self, cluster: Cluster, key: tuple[object, ...]) -> None:
        self.failed[key] = cluster.commit_version


def memo_key(job: JobState) -> tuple[object, ...]:
    pending = job.pending_tasks()
    return (
        job.queue.name if job.queue else "",
        job.spec.priority,
        job.preemptible,
        job.spec.min_member - job.held,
        tuple(t.shape for t in pending),
    )


MAX_BENEFICIARIES = 32


def beneficiaries(cluster: Cluster) -> list[JobState]:
    """Jobs whose gang is still short, in allocate's order (queue, then job).

    At most ``MAX_BENEFICIARIES`` per action and session: the rest keep
    their allocate reason and are looked at again next cycle, which bounds
    the cost of a session with thousands of pending jobs.
    """
    waiting = [j for j in cluster.jobs if j.error is None and j.queue is not None and j.needs_gang()]
    keyed = []
    for job in waiting:
        assert job.queue is not None and job.pool is not None
        keyed.append((queue_key(job.queue, job.pool.capacity), job_key(job), job))
    keyed.sort(key=lambda k: (k[0], k[1]))
    return [k[2] for k in keyed]


def evict_job(stmt: Statement, victim: JobState, action: EvictionAction, reason: str, beneficiary: str) -> None:
    for task in victim.tasks:
        if evictable(task):
            stmt.evict(task, action, reason, beneficiary)


def _potential_ok(node: NodeState, task: TaskState, candidates: dict[int, int]) -> tuple[bool, int]:
    """Could evicting candidates on ``node`` make room for ``task``? And how many GPUs must go."""
    cpu = node.free_cpu
    mem = node.free_mem
    victim_positions: dict[int, int] = {}
    for t in node.tasks:
        if id(t.job) in candidates and evictable(t):
            cpu += t.cpu
            mem += t.mem
            for p in t.gpu_pos:
                victim_positions[p] = victim_positions.get(p, 0) + 1
    if cpu < task.cpu or mem < task.mem:
        return False, 0
    # A GPU comes free only if every holder on it is a candidate.
    freeable = 0
    for p, count in victim_positions.items():
        if node.gpu_ok[p] and node.gpu_whole[p] + node.gpu_slices[p] == count:
            freeable += 1
    need = task.gpu.devices if task.gpu.is_slice else task.gpu.whole
    if task.gpu.is_slice:
        return node.free_whole + freeable + len(victim_positions) >= need, max(0, need - node.free_whole)
    return node.free_whole + freeable >= need, max(0, need - node.free_whole)


def _clear_node(
    stmt: Statement,
    *,
    node: NodeState,
    task: TaskState,
    candidates: dict[int, int],
    admissible: Callable[[JobState], bool],
    action: EvictionAction,
    reason: str,
) -> bool:
    victims = sorted(
        {id(t.job): t.job for t in node.tasks if id(t.job) in candidates and evictable(t)}.values(),
        key=lambda j: candidates[id(j)],
    )
    for victim in victims:
        if not admissible(victim):
            continue
        evict_job(stmt, victim, action, reason, task.job.key)
        found = fit_on_node(node, task)
        if found is not None:
            stmt.allocate(task, node, *found)
            return True
    return False


def make_room(
    cluster: Cluster,
    stmt: Statement,
    job: JobState,
    *,
    candidates: dict[int, int],
    admissible: Callable[[JobState], bool],
    action: EvictionAction,
    reason: str,
) -> bool:
    """Place ``job``'s gang by evicting candidate victims; all or nothing.

    ``candidates`` maps ``id(victim job)`` to its rank (lower goes first).
    On success the evictions and placements stay in ``stmt`` (not committed);
    on failure ``stmt`` is rolled back to where it was.
    """
    pool = job.pool
    queue = job.queue
    if pool is None or queue is None or job.error is not None:
        return False
    pending = job.pending_tasks()
    required = max(0, job.spec.min_member - job.held)
    gang = pending[: max(required, 1)] if pending else []
    if not gang or len(pending) < required:
        return False
    mark = stmt.mark()
    for task in gang:
        if limit_problem(queue, [task.milli, task.cpu, task.mem], job.preemptible) is not None:
            stmt.rollback(mark)
            return False
        found = find_place(cluster, task)
        if found is not None:
            stmt.allocate(task, *found)
            continue
        elig = eligibility(pool, task)
        options: list[tuple[int, str, NodeState]] = []
        for node in pool.nodes:
            if not elig[node.pidx]:
                continue
            ok, gpus_to_free = _potential_ok(node, task, candidates)
            if ok:
                options.append((gpus_to_free, node.name, node))
        options.sort(key=lambda o: (o[0], o[1]))
        placed = False
        for _, _, node in options[:MAX_NODES_TRIED]:
            node_mark = stmt.mark()
            if _clear_node(
                stmt, node=node, task=task, candidates=candidates, admissible=admissible, action=action, reason=reason
            ):
                placed = True
                break
            stmt.rollback(node_mark)
        if not placed:
            stmt.rollback(mark)
            return False
    return True
