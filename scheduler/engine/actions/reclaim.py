"""Reclaim: a queue below its quota or fair share takes back what others borrowed.

Over-quota allocation lends idle resources to queues that want more; when
the lender comes back for them, reclaim evicts preemptible work of queues
that hold more than they are owed. Which rule applies depends on the
reclaimer:

- **Within its quota** (the quota is guaranteed). When the reclaiming
  queue, and each of its ancestors not shared with the victim, stays within
  its *guaranteed* amount after taking the job, a victim may be taken from
  any queue that holds more than its own guaranteed amount when the victim
  goes. A queue's guaranteed amount is ``min(quota, fair share)``: its quota
  as far as the pool's healthy capacity backs it (quotas that add up to
  more than the pool are cut the way fair share cuts them, by priority and
  then in proportion, so what is guaranteed adds up to what exists). Victims
  go whole (or an elastic job down to its minMember), so the last one taken
  can leave its queue below its guarantee by up to one job; it then cannot
  reclaim back from a queue that holds no more than its own guarantee, so
  nothing flaps. This is the rule that makes a quota a promise: a queue
  holding twice its quota in one gang cannot keep a queue owed its quota at
  zero just because evicting the gang would take it below its fair share.
- **Beyond its quota, within its fair share.** The reclaimer (and each
  ancestor not shared with the victim) must stay within its fair share
  after taking the job, and a victim's queue (and each ancestor not shared
  with the reclaimer) must stay at or above its own fair share after the
  eviction.

Both are checked on the *contested* resource: GPUs for a job that asks for
GPUs, otherwise CPU and memory, so a GPU job does not fail to reclaim
because its queue happens to be above its share of CPU. Both rules only get
harder to pass as more is evicted, which the victim search relies on.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from gpuwarden.contract import EvictionAction
from scheduler.engine.caches import SessionCaches, VictimIndex
from scheduler.engine.eviction_plan import EvictionPlan, run_evictions
from scheduler.engine.model import UNLIMITED
from scheduler.engine.resources import CPU, GPU, MEMORY, format_amount
from scheduler.engine.state import Cluster, JobState, QueueState, TaskState
from scheduler.engine.victims import held_by, victim_order

_NO_FAIR_VICTIMS = (
    "cannot reclaim: no preemptible work on usable nodes can be taken without pushing its queue below its fair share"
)
_NO_GUARANTEED_VICTIMS = (
    "cannot reclaim: no preemptible work on usable nodes of a queue holding more than its guaranteed quota "
    "can make room"
)


def _gang_request(job: JobState) -> list[int]:
    pending = job.pending_tasks()
    required = pending[: max(1, job.gang_short)]
    return [sum(t.milli for t in required), sum(t.cpu for t in required), sum(t.mem for t in required)]


def _contested(need: list[int]) -> tuple[int, ...]:
    if need[GPU] > 0:
        return (GPU,)
    return tuple(r for r in (CPU, MEMORY) if need[r] > 0)


def guaranteed(queue: QueueState, r: int) -> int:
    """What of resource ``r`` the queue is guaranteed: its quota as far as fair share backs it."""
    quota = queue.quota[r]
    share = queue.share[r]
    return share if quota == UNLIMITED else min(quota, share)


def _no_fair_victims(
    queue: QueueState, need: list[int], contested: tuple[int, ...], victim_queues: list[QueueState]
) -> str:
    """Why no victim could be taken, naming a parent queue of the reclaimer
    that the gang would take over its own share: then only victims under
    that parent were allowed, and blaming the victims' shares would mislead.
    A parent that also holds every queue victims could come from is no
    reason: taking from its own sub-queues leaves what it holds unchanged."""
    over = [
        q.name
        for q in queue.path[:-1]
        if any(q.alloc[r] + need[r] > q.share[r] for r in contested) and not all(q in v.path for v in victim_queues)
    ]
    if over:
        return (
            f"cannot reclaim: parent queue {over[-1]} would go over its own fair share, so only its sub-queues' "
            "preemptible work could be taken, and none of it can go without pushing its queue below its fair share"
        )
    if all(queue.alloc[r] + need[r] <= guaranteed(queue, r) for r in contested):
        return _NO_GUARANTEED_VICTIMS
    return _NO_FAIR_VICTIMS


def _above(queue: QueueState, resources: tuple[int, ...], *, guarantee: bool) -> bool:
    if guarantee:
        return any(q.alloc[r] > guaranteed(q, r) for q in queue.path for r in resources)
    return any(q.alloc[r] > q.share[r] for q in queue.path for r in resources)


@dataclass(slots=True)
class _Fairness:
    """May these pods of this victim go? See the module docstring for the two rules.

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

    def allows(self, victim: JobState, tasks: Sequence[TaskState]) -> bool:
        assert victim.queue is not None
        contested = self.contested
        theirs = {id(q) for q in victim.queue.path}
        mine = {id(q) for q in self.reclaimer.path}
        mine_only = [q for q in self.reclaimer.path if id(q) not in theirs]
        owed = all(self.before[id(q)][r] + self.need[r] <= guaranteed(q, r) for q in mine_only for r in contested)
        if not owed and any(self.before[id(q)][r] + self.need[r] > q.share[r] for q in mine_only for r in contested):
            return False
        held = held_by(tasks)
        theirs_only = [q for q in victim.queue.path if id(q) not in mine]
        if all(q.alloc[r] - held[r] >= q.share[r] for q in theirs_only for r in contested):
            return True
        if not owed or not any(held[r] > 0 for r in contested):
            return False
        return all(q.alloc[r] > guaranteed(q, r) for q in theirs_only for r in contested if held[r] > 0)


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
    run_evictions(cluster, caches, _plan, EvictionAction.RECLAIM)


def _plan(job: JobState, index: VictimIndex) -> EvictionPlan | None:
    queue = job.queue
    assert queue is not None
    need = _gang_request(job)
    contested = _contested(need)
    if not contested:
        return None
    # The leaf's own standing picks the rule; ``_Fairness`` checks each
    # ancestor the victim does not share.
    owed = all(queue.alloc[r] + need[r] <= guaranteed(queue, r) for r in contested)
    over = next((r for r in contested if queue.alloc[r] + need[r] > queue.share[r]), None)
    if over is not None and not owed:
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
        and _above(ranked[0].queue, contested, guarantee=owed)
    ]
    if not names:
        floor = "its guaranteed quota" if owed else "its fair share"
        job.notes.append(f"cannot reclaim: no other queue holds preemptible work above {floor}")
        return None
    source = _FromQueues(frozenset(names), [index.by_queue[n] for n in names])
    victim_queues = [q for q in (index.by_queue[n][0].queue for n in names) if q is not None]
    return EvictionPlan(
        victims=source.victims,
        is_candidate=source,
        admissible=_Fairness(queue, need, contested).allows,
        action=EvictionAction.RECLAIM,
        reason=(
            f"queue {queue.name} reclaims its guaranteed quota for {job.key}"
            if owed
            else f"queue {queue.name} reclaims its fair share for {job.key}"
        ),
        failure_note=_no_fair_victims(queue, need, contested, victim_queues),
    )
