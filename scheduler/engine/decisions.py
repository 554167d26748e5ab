"""Working state to decisions: the last step of every session.

Only what the actions committed becomes a decision: each touched pod that
was running and now carries an eviction becomes an Eviction, each pending
pod now on a node a Bind; every job still waiting gets its reasons
(:mod:`scheduler.engine.explain`), and every queue its share figures,
among them how much of its quota healthy hardware does not back
(:func:`quota_shortfalls`).
"""

from __future__ import annotations

from scheduler.engine import explain
from scheduler.engine.caches import SessionCaches
from scheduler.engine.model import (
    UNLIMITED,
    Bind,
    Decisions,
    Eviction,
    JobStatus,
    QueueShare,
    Reservation,
    Resources,
)
from scheduler.engine.reservations import kept
from scheduler.engine.resources import CPU, GPU, MEMORY, RESOURCE_NAMES, RESOURCES, WHOLE_UNIT, format_amount
from scheduler.engine.state import Cluster, NodeState, PoolState, QueueState, TaskState


class Backing:
    """One queue's quota shortfall and the figures of its tree level, per resource."""

    __slots__ = ("backing", "level_quota", "shortfall")

    def __init__(self) -> None:
        self.shortfall = [0, 0, 0]
        self.backing = [0, 0, 0]
        self.level_quota = [0, 0, 0]


def split_shortfall(total: int, quotas: list[int], names: list[str], unit: int) -> list[int]:
    """Divide ``total`` (at most ``sum(quotas)``) in proportion to ``quotas``, in pieces of ``unit``.

    Each member first gets the whole units its exact proportional part
    holds; what is left goes one piece (a unit, or less where the rest or
    a quota leaves less) at a time to the members with the largest
    fractional part, ties by name, never above a member's quota. So the
    parts add up to ``total`` exactly, each is within a unit of its exact
    proportional part unless quotas cap others, and none exceeds its quota.
    """
    parts = [0] * len(quotas)
    whole = sum(quotas)
    if total <= 0 or whole <= 0:
        return parts
    scale = whole * unit
    rest: list[int] = []
    for i, q in enumerate(quotas):
        parts[i] = total * q // scale * unit
        rest.append(total * q - parts[i] * whole)
    left = total - sum(parts)
    order = sorted(range(len(quotas)), key=lambda i: (-rest[i], names[i]))
    while left > 0:
        for i in order:
            piece = min(unit, left, quotas[i] - parts[i])
            if piece > 0:
                parts[i] += piece
                left -= piece
                if left == 0:
                    break
    return parts


def quota_shortfalls(cluster: Cluster) -> dict[str, Backing]:
    """How much of each queue's quota the pool's healthy capacity cannot back.

    Per pool and resource, the top-level queues that set a quota for it
    (an ungoverned resource, or a quota of -1, promises nothing) share a
    shortfall of ``max(0, sum of their quotas - healthy capacity)`` in
    proportion to their quotas, in whole units (one GPU, one core, one GiB;
    a part of a unit only where quotas themselves are not whole), so the
    parts add up to the pool's shortfall exactly and none exceeds its
    queue's quota. A queue with a shortfall passes it down: its children
    that set a quota share the part of theirs that the backed rest of the
    parent's quota no longer covers, counting only what the fault took
    (children whose quotas add up to more than their parent's quota on a
    healthy pool are a configuration, not a fault, and show no shortfall).
    Quotas, not what a queue deserves at its current demand, are the
    measure: the figure then does not move with the queue's load. At the
    top, too, only the fault counts: quotas over-subscribing the pool's
    intact capacity on purpose show no shortfall while every GPU is healthy.
    """
    out = {name: Backing() for name in cluster.queues}
    levels: dict[str, list[QueueState]] = {}
    for q in cluster.queues.values():
        if q.parent is None:
            levels.setdefault(q.pool, []).append(q)
    for pool_name, tops in levels.items():
        pool = cluster.pools.get(pool_name)
        capacity = pool.capacity if pool is not None else [0, 0, 0]
        intact = _intact_capacity(pool) if pool is not None else [0, 0, 0]
        for r in RESOURCES:
            _level(cluster, out, tops, r, capacity[r], promised=intact[r])
    return out


def _intact_capacity(pool: PoolState) -> list[int]:
    """What the pool would offer with every node and GPU in service.

    Quotas that add up to more than this are a configuration (over-subscribed
    on purpose), not a fault; only the shortfall that missing hardware adds on
    top is reported. Summed once per state: a kept state's pool keeps its
    nodes from session to session, and the incremental update drops the sum
    when it replaces one of them (``Engine._replace_node``). Listing the
    specs to compare them was a pass over every node in every cycle.
    """
    if pool.intact is not None:
        return pool.intact
    total = [0, 0, 0]
    for node in pool.nodes:
        spec = node.spec
        total[GPU] += sum(g.milli_gpus for g in spec.gpus if not g.mig_enabled)
        total[CPU] += spec.cpu_milli
        total[MEMORY] += spec.memory_mib
    pool.intact = total
    return total


def _level(
    cluster: Cluster, out: dict[str, Backing], members: list[QueueState], r: int, backed: int, *, promised: int | None
) -> None:
    """Split one tree level's shortfall of resource ``r``.

    ``backed`` is what the level has; ``promised`` is the parent's quota
    (None at the top), so that only the part a fault took counts below it.
    """
    governed = [q for q in members if q.quota[r] != UNLIMITED]
    if not governed:
        return
    quotas = [q.quota[r] for q in governed]
    whole = sum(quotas)
    for q in governed:
        out[q.name].backing[r] = backed
        out[q.name].level_quota[r] = whole
    short = max(0, whole - backed) - (max(0, whole - promised) if promised is not None else 0)
    if short <= 0:
        return
    governed.sort(key=lambda q: q.name)
    parts = split_shortfall(short, [q.quota[r] for q in governed], [q.name for q in governed], WHOLE_UNIT[r])
    for q, part in zip(governed, parts, strict=True):
        out[q.name].shortfall[r] = part
        if part and q.tree.children:
            children = [cluster.queues[c.name] for c in q.tree.children if c.name in cluster.queues]
            _level(cluster, out, children, r, q.quota[r] - part, promised=q.quota[r])


def decisions(cluster: Cluster, caches: SessionCaches) -> Decisions:
    seen: set[int] = set()
    touched: list[TaskState] = []
    for task in cluster.touched:
        if id(task) not in seen:
            seen.add(id(task))
            touched.append(task)
    touched.sort(key=lambda t: (t.job.key, t.spec.name))
    binds: list[Bind] = []
    evictions: list[Eviction] = []
    reserve: list[Reservation] = []
    expires = cluster.now + cluster.reservation_ttl_s
    for task in touched:
        spec = task.spec
        job = task.job
        if task.was_running and task.eviction is not None:
            action, reason, beneficiary = task.eviction
            if task.node is not None:
                reason = f"{reason}; room kept for it on node {task.node.name}"
                # Its controller recreates the pod: the new pod of this job finds the room.
                reserve.append(_room(task, task.node, expires))
            evictions.append(
                Eviction(
                    job=job.key,
                    namespace=spec.namespace,
                    pod=spec.name,
                    uid=spec.uid,
                    node=spec.node or "",
                    action=action,
                    reason=reason,
                    beneficiary=beneficiary,
                )
            )
        elif not task.was_running and task.node is not None:
            node = task.node
            binds.append(
                Bind(
                    job=job.key,
                    namespace=spec.namespace,
                    pod=spec.name,
                    uid=spec.uid,
                    node=node.name,
                    gpu_indices=tuple(node.gpu_index[p] for p in task.gpu_pos),
                    gpu_memory_mib=task.slices if task.slices else None,
                    pipelined=node.evicted_here,
                )
            )
            if node.evicted_here:
                reserve.append(_room(task, node, expires))
    pending: list[JobStatus] = []
    # Only a pod that never ran can be pending: the jobs that have one are
    # enough to look at (in key order, like every job).
    for job in cluster.pending_jobs:
        if any(t.is_pending for t in job.tasks):
            pending.append(
                JobStatus(
                    job=job.key,
                    queue=job.spec.queue,
                    reasons=tuple(explain.reasons(caches, job, cluster)),
                )
            )
    backing = quota_shortfalls(cluster)
    shares = []
    for q in sorted(cluster.queues.values(), key=lambda q: (q.pool, q.name)):
        b = backing[q.name]
        shares.append(
            QueueShare(
                queue=q.name,
                pool=q.pool,
                fair_share=Resources.of(q.share),
                allocated=Resources.of(q.alloc),
                request=Resources.of(q.request),
                allocated_non_preemptible=Resources.of(q.np_alloc),
                quota_shortfall=Resources.of(b.shortfall),
                quota=Resources.of([max(0, v) for v in q.quota]),
                backing=Resources.of(b.backing),
                level_quota=Resources.of(b.level_quota),
                parent=q.parent.name if q.parent is not None else "",
                guaranteed=Resources.of(_guaranteed(q)),
                guarantee_note=_guarantee_note(cluster, q),
            )
        )
    return Decisions(tuple(binds), tuple(evictions), tuple(pending), tuple(shares), kept(cluster, reserve))


def _guaranteed(q: QueueState) -> list[int]:
    """What reclaim wins back for the queue (see ``actions.reclaim``): its quota as far as fair share backs it."""
    return [q.share[r] if q.quota[r] == UNLIMITED else min(q.quota[r], q.share[r]) for r in RESOURCES]


def _guarantee_note(cluster: Cluster, q: QueueState) -> str:
    """Why part of the queue's quota, at what it asks for now, is not guaranteed; empty when all of it is.

    The quota promises ``min(quota, request)``; the guarantee is that
    amount as far as the fair share covers it, and the fair share falls
    short of it only where the quotas of the queue's level add up to more
    than backs the level (capacity lost to faults, quotas over-subscribed on
    purpose, or a parent's share too small for its children's quotas).
    """
    parts: list[str] = []
    for r in RESOURCES:
        quota = q.quota[r]
        if quota == UNLIMITED:
            continue
        short = min(quota, q.request[r]) - q.share[r]
        if short <= 0:
            continue
        if q.parent is not None:
            level = [cluster.queues[c.name] for c in q.parent.tree.children if c.name in cluster.queues]
            where = f"parent queue {q.parent.name}'s fair share is {format_amount(r, q.parent.share[r])}"
        else:
            level = [s for s in cluster.queues.values() if s.parent is None and s.pool == q.pool]
            pool = cluster.pools.get(q.pool)
            where = f"the pool's healthy capacity is {format_amount(r, pool.capacity[r] if pool else 0)}"
        total = sum(s.quota[r] for s in level if s.quota[r] != UNLIMITED)
        parts.append(
            f"only {format_amount(r, q.share[r])} of its {RESOURCE_NAMES[r]} quota of {format_amount(r, quota)} "
            f"is guaranteed (reclaim wins back no more): the quotas at this queue's level add up to "
            f"{format_amount(r, total)} and {where}"
        )
    return "; ".join(parts)


def _room(task: TaskState, node: NodeState, expires: float) -> Reservation:
    """The room ``task`` takes on ``node``, reserved for its job until ``expires``."""
    return Reservation(
        job=task.job.key,
        node=node.name,
        gpu_indices=tuple(node.gpu_index[p] for p in task.gpu_pos),
        gpu_memory_mib=task.slices if task.slices else None,
        cpu_milli=task.cpu,
        memory_mib=task.mem,
        expires=expires,
    )
