"""Reclaim: a queue below its fair share takes back what others borrowed.

Over-quota allocation lends idle resources to queues that want more; when
the lender comes back for them, reclaim evicts preemptible work of queues
that hold more than their fair share. Two rules keep it fair:

- the reclaiming queue (and each of its ancestors not shared with the
  victim) must stay within its fair share after taking the job;
- a victim's queue (and each of its ancestors not shared with the
  reclaimer) must stay at or above its own fair share after the eviction.

Both are checked on the *contested* resource: GPUs for a job that asks for
GPUs, otherwise CPU and memory, so a GPU job does not fail to reclaim
because its queue happens to be above its share of CPU.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field

from gpuwarden.contract import EvictionAction
from scheduler.engine.caches import SessionCaches, VictimIndex
from scheduler.engine.eviction_plan import EvictionPlan, run_evictions
from scheduler.engine.resources import CPU, GPU, MEMORY, format_amount
from scheduler.engine.state import Cluster, JobState, QueueState
from scheduler.engine.victims import evictable, victim_order

_NO_FAIR_VICTIMS = (
    "cannot reclaim: no preemptible work on usable nodes can be taken without pushing its queue below its fair share"
)


def _gang_request(job: JobState) -> list[int]:
    pending = job.pending_tasks()
    required = pending[: max(1, job.gang_short)]
    return [sum(t.milli for t in required), sum(t.cpu for t in required), sum(t.mem for t in required)]


def _contested(need: list[int]) -> tuple[int, ...]:
    if need[GPU] > 0:
        return (GPU,)
    return tuple(r for r in (CPU, MEMORY) if need[r] > 0)


def _held(job: JobState) -> list[int]:
    held = [0, 0, 0]
    for t in job.tasks:
        if evictable(t):
            held[GPU] += t.milli
            held[CPU] += t.cpu
            held[MEMORY] += t.mem
    return held


def _no_fair_victims(queue: QueueState, need: list[int], contested: tuple[int, ...]) -> str:
    """Why no victim could be taken, naming a parent queue of the reclaimer
    that the gang would take over its own share: then only victims under
    that parent were allowed, and blaming the victims' shares would mislead."""
    over = [q.name for q in queue.path[:-1] if any(q.alloc[r] + need[r] > q.share[r] for r in contested)]
    if over:
        return (
            f"cannot reclaim: parent queue {over[-1]} would go over its own fair share, so only its sub-queues' "
            "preemptible work could be taken, and none of it can go without pushing its queue below its fair share"
        )
    return _NO_FAIR_VICTIMS


def _above_share(queue: QueueState, resources: tuple[int, ...]) -> bool:
    return any(q.alloc[r] > q.share[r] for q in queue.path for r in resources)


@dataclass(slots=True)
class _Fairness:
    """May this victim go? Both queues must stay on their side of fair share.

    The reclaimer's side is judged on what its queues held *before* the
    plan plus the whole gang: by the time a later pod of the gang needs a
    victim, the earlier pods are already charged, and adding the full
    request to that would count them twice.
    """

    reclaimer: QueueState
    need: list[int]
    contested: tuple[int, ...]
    before: dict[int, list[int]] = field(init=False)

    def __post_init__(self) -> None:
        self.before = {id(q): list(q.alloc) for q in self.reclaimer.path}

    def allows(self, victim: JobState) -> bool:
        assert victim.queue is not None
        contested = self.contested
        theirs = {id(q) for q in victim.queue.path}
        mine = {id(q) for q in self.reclaimer.path}
        for q in self.reclaimer.path:
            start = self.before[id(q)]
            if id(q) not in theirs and any(start[r] + self.need[r] > q.share[r] for r in contested):
                return False
        held = _held(victim)
        for q in victim.queue.path:
            if id(q) not in mine and any(q.alloc[r] - held[r] < q.share[r] for r in contested):
                return False
        return True


@dataclass(slots=True)
class _FromQueues:
    """Victims from the given queues, cheapest first across all of them."""

    names: frozenset[str]
    lists: list[list[JobState]]

    def __call__(self, victim: JobState) -> bool:
        return victim.queue is not None and victim.queue.name in self.names

    def victims(self) -> Iterator[JobState]:
        return heapq.merge(*self.lists, key=victim_order)


def run(cluster: Cluster, caches: SessionCaches) -> None:
    run_evictions(cluster, caches, _plan)


def _plan(job: JobState, index: VictimIndex) -> EvictionPlan | None:
    queue = job.queue
    assert queue is not None
    need = _gang_request(job)
    contested = _contested(need)
    if not contested:
        return None
    over = next((r for r in contested if queue.alloc[r] + need[r] > queue.share[r]), None)
    if over is not None:
        job.notes.append(
            f"cannot reclaim: queue {queue.name} holds {format_amount(over, queue.alloc[over])} of a "
            f"{format_amount(over, queue.share[over])} fair share and this needs "
            f"{format_amount(over, need[over])} more; only idle capacity can serve it"
        )
        return None
    names = [
        name
        for name, ranked in sorted(index.by_queue.items())
        if name != queue.name
        and ranked[0].pool is job.pool
        and ranked[0].queue is not None
        and _above_share(ranked[0].queue, contested)
    ]
    if not names:
        job.notes.append("cannot reclaim: no other queue holds preemptible work above its fair share")
        return None
    source = _FromQueues(frozenset(names), [index.by_queue[n] for n in names])
    return EvictionPlan(
        victims=source.victims,
        is_candidate=source,
        admissible=_Fairness(queue, need, contested).allows,
        action=EvictionAction.RECLAIM,
        reason=f"queue {queue.name} reclaims its fair share for {job.key}",
        failure_note=_no_fair_victims(queue, need, contested),
    )
