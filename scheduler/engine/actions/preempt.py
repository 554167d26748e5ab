"""Preempt: within one queue, higher-priority work displaces lower.

Only strictly lower-priority, preemptible jobs of the same queue are
victims, cheapest first (lowest priority, then youngest). Because the room
comes from the queue's own allocation, preemption never changes how much a
queue holds against others; it only changes what the queue spends it on.
That includes a queue at its limit: lower-priority work is evicted to bring
it back under the limit for the higher-priority job.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from gpuwarden.contract import EvictionAction
from scheduler.engine.caches import SessionCaches, VictimIndex
from scheduler.engine.eviction_plan import EvictionPlan, run_evictions
from scheduler.engine.state import Cluster, JobState, QueueState, TaskState
from scheduler.engine.victims import evictable


@dataclass(slots=True)
class _LowerInQueue:
    queue: QueueState
    priority: int
    ranked: list[JobState]

    def __call__(self, victim: JobState) -> bool:
        return victim.queue is self.queue and victim.spec.priority < self.priority

    def victims(self) -> Iterator[JobState]:
        # Ranked lowest priority first: stop at the first that is not lower.
        for victim in self.ranked:
            if victim.spec.priority >= self.priority:
                return
            yield victim


def _always(_victim: JobState, _tasks: Sequence[TaskState]) -> bool:
    return True


def run(cluster: Cluster, caches: SessionCaches) -> None:
    run_evictions(cluster, caches, _plan, EvictionAction.PREEMPT)


def _plan(job: JobState, index: VictimIndex) -> EvictionPlan | None:
    queue = job.queue
    assert queue is not None
    lower = _LowerInQueue(queue, job.spec.priority, index.by_queue.get(queue.name, []))
    if not any(any(evictable(t) for t in v.tasks) for v in lower.victims()):
        return None
    return EvictionPlan(
        victims=lower.victims,
        is_candidate=lower,
        admissible=_always,
        action=EvictionAction.PREEMPT,
        reason=f"preempted by higher-priority {job.key} (priority {job.spec.priority})",
        within_limits=True,
        failure_note=f"cannot preempt: evicting lower-priority work in queue {queue.name} would not make room",
    )
