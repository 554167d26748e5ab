"""Stale gangs: a running gang that lost members for too long is evicted whole.

A gang below ``min_member`` cannot make progress but holds its resources.
The Kubernetes side records when it first saw the gang short
(``below_min_member_since``); once that is longer ago than the grace period
and the gang is still short after this session's allocation, every pod of
it is evicted so the job can start again whole.
"""

from __future__ import annotations

from gpuwarden.contract import EvictionAction
from scheduler.engine.caches import SessionCaches
from scheduler.engine.state import Cluster
from scheduler.engine.statement import Statement
from scheduler.engine.victims import evictable


def run(cluster: Cluster, caches: SessionCaches) -> None:
    stmt = Statement(cluster)
    for job in cluster.jobs:
        since = job.spec.below_min_member_since
        if since is None or cluster.now - since < cluster.stale_gang_grace_s:
            continue
        held = job.held
        if held == 0 or held >= job.spec.min_member:
            continue
        reason = (
            f"gang has {held} of {job.spec.min_member} required pods running "
            f"for {cluster.now - since:.0f}s (grace {cluster.stale_gang_grace_s:.0f}s)"
        )
        for task in job.tasks:
            if evictable(task):
                stmt.evict(task, EvictionAction.STALE_GANG, reason, None)
    stmt.commit()
