"""Stale gangs: a running gang that lost members for too long is evicted whole.

A gang below ``min_member`` cannot make progress but holds its resources.
What counts toward ``min_member`` is what the rest of the engine counts:
members holding resources and members that finished successfully. A batch
Job whose first pods completed while its last ones run is whole, not short.

The Kubernetes side records when it first saw the gang short after it
lost a member (``below_min_member_since``): a member that had run and is
neither running nor succeeded any more (it failed, was deleted or evicted).
A gang that is short only because some of its members do not exist or have
not been placed yet (an operator that creates its pods in stages, a gang
that grew) is never dated, so it is never evicted for it: the pods that
wait are explained, and the gang keeps what it holds. Once the date is
longer ago than the grace period and the gang is still short after this
session's allocation, every pod of it is evicted so the job can start
again whole.
"""

from __future__ import annotations

from gpuwarden.contract import EvictionAction
from scheduler.engine.caches import SessionCaches
from scheduler.engine.state import Cluster
from scheduler.engine.statement import Statement
from scheduler.engine.victims import evictable


def run(cluster: Cluster, caches: SessionCaches) -> None:
    stmt = Statement(cluster)
    for job in cluster.dated_gangs:
        since = job.spec.below_min_member_since
        if since is None or cluster.now - since < cluster.stale_gang_grace_s:
            continue
        held = job.held
        if held == 0 or job.gang_short == 0:
            continue
        done = job.spec.succeeded
        finished = f" and {done} succeeded" if done else ""
        reason = (
            f"gang has {held} of {job.spec.min_member} required pods running{finished} "
            f"for {cluster.now - since:.0f}s (grace {cluster.stale_gang_grace_s:.0f}s)"
        )
        for task in job.tasks:
            if evictable(task):
                stmt.evict(task, EvictionAction.STALE_GANG, reason, None)
    stmt.commit()
