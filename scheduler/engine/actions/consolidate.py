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
from scheduler.engine.state import Cluster, JobState, NodeState, PoolState, TaskState
from scheduler.engine.statement import Statement
from scheduler.engine.victims import evictable


@dataclass(slots=True)
class _PoolRoom:
    """Free room per pool, summed once per committed state (plans that fail leave the state as it was).

    Only nodes with a shared GPU that has room left offer any free part of
    one, and the placement index already lists them (the shared buckets),
    so the GPU sum walks those, not every GPU of the pool; MIG nodes are
    not in that index and are walked too.
    """

    cluster: Cluster
    seen: dict[str, tuple[int, list[int]]] = field(default_factory=dict)
    # Per pool, its nodes that take work, and those of them the shared buckets leave out.
    accepting: dict[str, tuple[list[NodeState], list[NodeState]]] = field(default_factory=dict)

    def free(self, pool: PoolState) -> list[int]:
        """Free milli-GPUs (whole free GPUs and the free part of shared ones), CPU and memory."""
        version = self.cluster.commit_version
        cached = self.seen.get(pool.name)
        if cached is not None and cached[0] == version:
            return cached[1]
        nodes = self.accepting.get(pool.name)
        if nodes is None:
            taking = [n for n in pool.nodes if n.accepts]
            nodes = self.accepting[pool.name] = (taking, [n for n in taking if n.mig])
        taking, unindexed = nodes
        cpu = 0
        mem = 0
        for n in taking:
            cpu += n.free_cpu
            mem += n.free_mem
        if self.cluster.indexed:
            shared = [n for tier in pool.shared_buckets for bucket in tier.values() for n in bucket.values()]
            shared += unindexed
        else:
            shared = taking
        total = [pool.free_whole_total * MILLI + sum(_shared_free(n) for n in shared), cpu, mem]
        self.seen[pool.name] = (version, total)
        return total


def _shared_free(node: NodeState) -> int:
    """The free part of ``node``'s shared GPUs, in milli-GPUs of each GPU's own size."""
    total = 0
    for p, ok in enumerate(node.gpu_ok):
        if ok and node.gpu_slices[p] and not node.gpu_whole[p] and node.gpu_mem[p] > 0:
            total += node.gpu_free[p] * MILLI // node.gpu_mem[p]
    return total


@dataclass(slots=True)
class _LiveVictims:
    """A pool's victims in victim order, less the jobs committed evictions left with nothing to evict.

    The session's victim index keeps such jobs listed, and every pod's
    search would walk past them again: after a few gangs are consolidated
    they are most of what it reads. A committed eviction is never undone
    within the session, so a job dropped here could never be a victim
    again; the committed evictions are read off ``cluster.touched``. Asked
    only between plans, when no statement is open.
    """

    cluster: Cluster
    ranked: list[JobState]
    read: int = 0  # how much of cluster.touched has been looked at

    def jobs(self) -> list[JobState]:
        touched = self.cluster.touched
        if len(touched) > self.read:
            gone = {
                t.job
                for t in touched[self.read :]
                if t.eviction is not None and not any(evictable(other) for other in t.job.tasks)
            }
            self.read = len(touched)
            if gone:
                self.ranked = [j for j in self.ranked if j not in gone]
        return self.ranked


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
    """Only whole, running jobs are moved: nothing half-started, nothing terminating.

    Nor a job whose pods hold GPUs through DRA claims (``Task.claimed``):
    its pods come back with claims whose selectors the move does not know,
    so the room it would reserve for them may be room they cannot take.
    """

    cache: dict[int, bool] = field(default_factory=dict)

    def __call__(self, job: JobState) -> bool:
        verdict = self.cache.get(id(job))
        if verdict is None:
            verdict = not any(t.is_pending or t.releasing or t.spec.claimed for t in job.tasks)
            self.cache[id(job)] = verdict
        return verdict


def run(cluster: Cluster, caches: SessionCaches) -> None:
    movable = _Movable()
    room = _PoolRoom(cluster)
    live: dict[str, _LiveVictims] = {}

    def admissible(victim: JobState, _tasks: Sequence[TaskState]) -> bool:
        return movable(victim)

    def relocate(stmt: Statement, mark: int) -> bool:
        return _relocate(cluster, caches, stmt, mark)

    def screen(node: NodeState, task: TaskState, evicted: Sequence[TaskState]) -> bool:
        return _whole_gpus_can_land(cluster, node, task, evicted)

    def plan(job: JobState, index: VictimIndex) -> EvictionPlan | None:
        if job.reasons and job.reasons[0].code is not UnschedulableReason.INSUFFICIENT_RESOURCES:
            return None
        pool = job.pool
        assert pool is not None
        if not _fits_in_total(room, pool, job):
            return None
        victims = live.get(pool.name)
        if victims is None:
            victims = live[pool.name] = _LiveVictims(cluster, index.by_pool.get(pool.name, []))
        return EvictionPlan(
            victims=victims.jobs().__iter__,
            is_candidate=movable,
            admissible=admissible,
            action=EvictionAction.CONSOLIDATE,
            reason=f"moved to make room for {job.key}",
            step=relocate,
            screen=screen,
            failure_note=(
                f"cannot consolidate: pool {pool.name} has the room in total, but no preemptible pods could be "
                "moved to put it on one node with every moved pod placed again elsewhere"
            ),
        )

    run_evictions(cluster, caches, plan, EvictionAction.CONSOLIDATE)


def _whole_gpus_can_land(cluster: Cluster, node: NodeState, task: TaskState, evicted: Sequence[TaskState]) -> bool:
    """Could the whole-GPU pods that ``evicted`` moves find places once ``task`` takes ``node``?

    A necessary condition, checked before the evictions are made and undone:
    moving a gang of fifty 8-GPU pods to make room for one pod needs fifty
    nodes with eight free GPUs afterwards, and without this check the search
    learns that it has forty-nine only after placing forty-nine of them.
    For each size ``k`` among the moved pods, the pods of ``k`` GPUs or more
    must not outnumber what the pool's nodes could hold of such pods, each
    node ``free // k`` of them, where ``free`` counts, on the nodes the
    evictions touch, every GPU they could free (an upper bound: a shared GPU
    is free only once all its slices go) and, on ``node``, less the GPUs
    ``task`` takes there. It ignores every other constraint, so it never
    refuses a set whose pods could land.
    """
    sizes = sorted((t.gpu.whole for t in evicted if t.gpu.whole > 0), reverse=True)
    if not sizes:
        return True
    pool = node.pool
    positions: dict[int, tuple[NodeState, set[int]]] = {id(node): (node, set())}
    for t in evicted:
        if t.node is not None and t.node.accepts and t.gpu_pos:
            positions.setdefault(id(t.node), (t.node, set()))[1].update(t.gpu_pos)
    touched: list[tuple[int, int]] = []  # (free whole GPUs now, at most after the evictions)
    for n, freed in positions.values():
        now = n.free_whole if n.accepts else 0
        after = min(sum(n.gpu_ok), n.free_whole + len(freed))
        if n is node:
            after -= task.gpu.whole
        touched.append((now, max(0, after)))
    if cluster.indexed:
        counts = [(c, len(nodes)) for tier in pool.whole_buckets for c, nodes in tier.items() if nodes]
    else:
        counts = [(n.free_whole, 1) for n in pool.nodes if n.accepts]
    need = 0
    for i, k in enumerate(sizes):
        need += 1
        if i + 1 < len(sizes) and sizes[i + 1] == k:
            continue  # count every pod of this size before comparing
        room = sum((c // k) * count for c, count in counts)
        room += sum(after // k - now // k for now, after in touched)
        if need > room:
            return False
    return True


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
