"""Reservations: room freed for a job stays the job's across sessions.

A reclaim, a preemption or a consolidation evicts pods so that a job fits;
the evicted pods then take their termination grace period to leave, so the
job's binds are pipelined and cannot happen in the session that decided
them. What happens next, session by session:

1. While terminating pods still hold the reserved GPUs, the job is
   *awaiting* its room: it is still offered to allocate (room elsewhere is
   fine), but no action evicts anything more on its behalf. Without this,
   every session would see the job pending, the room still occupied, and
   evict the next victim.
2. Once the room is free, a *placeholder* holds it: a stand-in task seated
   on those GPUs and charged to the job's queue, so no other job can take
   it and fair share sees it as the job's. It is never a victim.
3. When the job is placed, its placeholders are released first (in the
   same statement, so a job that still does not fit keeps its room) and
   the job's pods are tried on its reserved nodes before anywhere else.

A reservation lapses when it expires, when its node or GPUs can no longer
take work (a fault, a cordon), or when something else now holds the room
(a pod of another scheduler, a reservation of another job). Lapsing is
logged; the job is then an ordinary pending job again.

Room is reserved per job, not per pod: a pod evicted by consolidation comes
back as a new pod of the same job (its controller recreates it), and that
pod finds the room kept for it.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuwarden.logconfig import get_logger
from scheduler.engine.model import Reservation, Task, TaskStatus
from scheduler.engine.predicates import static_exclusion
from scheduler.engine.resources import MILLI, GpuRequest
from scheduler.engine.scoring import fit_on_node, short_of_room
from scheduler.engine.state import Cluster, HeldRoom, JobState, NodeState, TaskState
from scheduler.engine.statement import Statement

log = get_logger(__name__)

_AWAITING_NOTE = "waiting for room reserved on node {node}: the pods evicted for it are still terminating"


def _room_request(res: Reservation) -> GpuRequest:
    if res.gpu_memory_mib is not None:
        return GpuRequest(memory_mib=max(res.gpu_memory_mib, default=1), devices=len(res.gpu_indices))
    return GpuRequest(whole=len(res.gpu_indices))


def _milli(res: Reservation, node: NodeState, positions: tuple[int, ...]) -> int:
    """Milli-GPUs the room is worth to the queue (whole GPUs, or each slice's share of its GPU)."""
    if res.gpu_memory_mib is None:
        if node.mig:  # a MIG device counts for its share of its GPU
            return sum(node.spec.gpus[p].milli_gpus for p in positions)
        return MILLI * len(positions)
    total = 0
    for p, mib in zip(positions, res.gpu_memory_mib, strict=True):
        size = node.gpu_mem[p]
        total += MILLI if size <= 0 else min(MILLI, -(-mib * MILLI // size))
    return total


def _positions(node: NodeState, res: Reservation) -> tuple[int, ...] | str:
    positions: list[int] = []
    for index in res.gpu_indices:
        p = node.position(index)
        if p is None:
            return f"node {node.name} has no GPU {index}"
        positions.append(p)
    if len(set(positions)) != len(positions):
        return f"GPU listed twice ({list(res.gpu_indices)})"
    if res.gpu_memory_mib is not None and len(res.gpu_memory_mib) != len(positions):
        return "slice sizes do not match the GPUs"
    return tuple(positions)


def _releasing_on(node: NodeState, positions: tuple[int, ...]) -> bool:
    wanted = set(positions)
    return any(task.releasing and (not wanted or wanted.intersection(task.gpu_pos)) for task in node.tasks)


def _free_for(node: NodeState, res: Reservation, positions: tuple[int, ...]) -> bool:
    if node.free_cpu < res.cpu_milli or node.free_mem < res.memory_mib:
        return False
    for i, p in enumerate(positions):
        if not node.gpu_ok[p] or node.gpu_whole[p]:
            return False
        if res.gpu_memory_mib is None:
            if node.gpu_slices[p]:
                return False
        elif node.gpu_free[p] < res.gpu_memory_mib[i]:
            return False
    return True


def _placeholder(job: JobState, res: Reservation, node: NodeState, positions: tuple[int, ...]) -> TaskState:
    spec = Task(
        name=f"reservation/{node.name}/{','.join(map(str, res.gpu_indices))}",
        namespace=job.spec.namespace,
        status=TaskStatus.RUNNING,
        cpu_milli=res.cpu_milli,
        memory_mib=res.memory_mib,
        node=node.name,
        gpu_indices=res.gpu_indices,
    )
    return TaskState(
        spec,
        job,
        _room_request(res),
        res.cpu_milli,
        res.memory_mib,
        _milli(res, node, positions),
        True,
        False,
        placeholder=True,
    )


def seat_reservations(
    cluster: Cluster, reservations: tuple[Reservation, ...], jobs: Mapping[str, JobState] | None = None
) -> list[NodeState]:
    """Seat each valid reservation's placeholder, or mark its job awaiting; log what lapsed.

    Called by the build once every running pod is seated and before the
    placement indexes exist, like a running pod. Returns the nodes that
    placeholders were seated on (whose index entries are then out of date
    if the indexes do exist). ``jobs`` is the cluster's jobs by key, where
    the caller keeps them. Each job that holds room is listed once in
    ``cluster.reserving``.
    """
    seated: list[NodeState] = []
    if not reservations:
        return seated
    if jobs is None:
        jobs = {job.key: job for job in cluster.jobs}
    for res in sorted(reservations, key=lambda r: (r.job, r.node, r.gpu_indices)):
        job = jobs.get(res.job)
        why = _lapsed(cluster, job, res)
        if why is not None:
            log.info("reservation_lapsed", job=res.job, node=res.node, gpus=list(res.gpu_indices), why=why)
            continue
        assert job is not None
        node = cluster.nodes[res.node]
        positions = _positions(node, res)
        assert not isinstance(positions, str)  # _lapsed checked
        if _free_for(node, res, positions):
            placeholder = _placeholder(job, res, node, positions)
            slices = res.gpu_memory_mib if res.gpu_memory_mib is not None else ()
            Cluster.seat(placeholder, node, positions, slices)
            seated.append(node)
            if job.queue is not None:
                Cluster.charge(job.queue, job.preemptible, placeholder.milli, placeholder.cpu, placeholder.mem)
            if not job.reserved:
                cluster.reserving.append(job)
            job.reserved.append(HeldRoom(res, node, placeholder))
        elif _releasing_on(node, positions):
            if not job.reserved:
                cluster.reserving.append(job)
            job.reserved.append(HeldRoom(res, node, awaiting=True))
            job.awaiting_room = True
            job.notes.append(_AWAITING_NOTE.format(node=node.name))
        else:
            log.info(
                "reservation_lapsed",
                job=res.job,
                node=res.node,
                gpus=list(res.gpu_indices),
                why="the room is held by other work",
            )
    return seated


def _lapsed(cluster: Cluster, job: JobState | None, res: Reservation) -> str | None:
    if res.expires <= cluster.now:
        return "expired"
    if job is None:
        return "the job is gone"
    if not any(t.is_pending for t in job.tasks):
        return "the job has no pending pod"
    node = cluster.nodes.get(res.node)
    if node is None:
        return "the node is gone"
    if not node.accepts:
        return f"the node takes no work ({node.excluded})"
    positions = _positions(node, res)
    if isinstance(positions, str):
        return positions
    bad = [node.gpu_index[p] for p in positions if not node.gpu_ok[p]]
    if bad:
        return f"GPUs {bad} take no work"
    return None


def release_for(stmt: Statement, job: JobState) -> None:
    """Free the job's seated room for its own placement (undone by a rollback)."""
    for held in job.reserved:
        placeholder = held.placeholder
        if placeholder is not None and placeholder.node is not None:
            stmt.unreserve(placeholder)


def reserved_nodes(job: JobState) -> list[NodeState]:
    """Nodes whose reserved room was released for the job: where its pods are tried first."""
    nodes: list[NodeState] = []
    for held in job.reserved:
        placeholder = held.placeholder
        if placeholder is not None and placeholder.node is None and held.node not in nodes:
            nodes.append(held.node)
    return nodes


def reserved_place(task: TaskState) -> tuple[NodeState, tuple[int, ...], tuple[int, ...]] | None:
    """A place for ``task`` in its job's released reserved room, or None.

    Tried before the pool's own order so that room held for a job across
    sessions is where the job lands, not merely room nobody else took: the
    reserved GPUs themselves first (else the job would take other free GPUs
    of the node and leave its reserved ones to someone else), then anything
    on a reserved node.
    """
    job = task.job
    for held in job.reserved:
        placeholder = held.placeholder
        if placeholder is None or placeholder.node is not None:
            continue
        if static_exclusion(held.node, task) is not None:
            continue
        exact = _exact_fit(held.node, held.reservation, task)
        if exact is not None:
            return held.node, *exact
    for node in reserved_nodes(job):
        if static_exclusion(node, task) is not None:
            continue
        found = fit_on_node(node, task)
        if found is not None:
            return node, *found
    return None


def _exact_fit(node: NodeState, res: Reservation, task: TaskState) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """``task`` on the reserved GPUs themselves, if they hold it now."""
    if short_of_room(node, task.cpu, task.mem):
        return None
    positions = _positions(node, res)
    if isinstance(positions, str):
        return None
    gpu = task.gpu
    if gpu.is_slice:
        fits = [
            p
            for p in positions
            if node.gpu_ok[p] and not node.gpu_whole[p] and node.gpu_free[p] >= gpu.slice_on(node.gpu_mem[p])
        ]
        if len(fits) < gpu.devices:
            return None
        chosen = tuple(fits[: gpu.devices])
        return chosen, tuple(gpu.slice_on(node.gpu_mem[p]) for p in chosen)
    if not gpu.whole:
        return None  # a pod without GPUs takes none of the reserved ones; any node-level fit will do
    devices = task.spec.devices
    free = [p for p in positions if node.gpu_ok[p] and not node.gpu_whole[p] and not node.gpu_slices[p]]
    if devices is not None:
        picked = devices.pick(node.name, [node.gpu_index[p] for p in free], gpu.whole)
        if picked is None:
            return None
        taken = set(picked)
        return tuple(p for p in free if node.gpu_index[p] in taken), ()
    free = [p for p in free if node.spec.gpus[p].parent is None]  # a MIG device only through a claim
    if len(free) < gpu.whole:
        return None
    return tuple(free[: gpu.whole]), ()


def kept(cluster: Cluster, new: list[Reservation]) -> tuple[Reservation, ...]:
    """Every reservation to hold after the session: unused old ones, then ``new`` ones, once each."""
    out: dict[tuple[str, str, tuple[int, ...]], Reservation] = {}
    for job in cluster.reserving:
        for held in job.reserved:
            if held.kept:
                res = held.reservation
                out.setdefault((res.job, res.node, res.gpu_indices), res)
    for res in new:
        out.setdefault((res.job, res.node, res.gpu_indices), res)
    return tuple(out[k] for k in sorted(out))
