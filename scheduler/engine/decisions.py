"""Working state to decisions: the last step of every session.

Only what the actions committed becomes a decision: each touched pod that
was running and now carries an eviction becomes an Eviction, each pending
pod now on a node a Bind; every job still waiting gets its reasons
(:mod:`scheduler.engine.explain`), and every queue its share figures.
"""

from __future__ import annotations

from scheduler.engine import explain
from scheduler.engine.caches import SessionCaches
from scheduler.engine.model import Bind, Decisions, Eviction, JobStatus, QueueShare, Resources
from scheduler.engine.state import Cluster, TaskState


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
    for task in touched:
        spec = task.spec
        job = task.job
        if task.was_running and task.eviction is not None:
            action, reason, beneficiary = task.eviction
            if task.node is not None:
                reason = f"{reason}; room kept for it on node {task.node.name}"
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
    pending: list[JobStatus] = []
    for job in cluster.jobs:
        if any(t.is_pending for t in job.tasks):
            pending.append(
                JobStatus(
                    job=job.key,
                    queue=job.spec.queue,
                    reasons=tuple(explain.reasons(caches, job)),
                )
            )
    shares = [
        QueueShare(
            queue=q.name,
            pool=q.pool,
            fair_share=Resources.of(q.share),
            allocated=Resources.of(q.alloc),
            request=Resources.of(q.request),
        )
        for q in sorted(cluster.queues.values(), key=lambda q: (q.pool, q.name))
    ]
    return Decisions(tuple(binds), tuple(evictions), tuple(pending), tuple(shares))
