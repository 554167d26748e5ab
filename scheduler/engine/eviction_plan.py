"""The loop that consolidate, reclaim and preempt share: plan, try, commit or forget.

Each of those actions walks the jobs whose gang is still short, in
allocate's order, and for each one asks the victim search
(:mod:`scheduler.engine.victims`) to make room on a statement; the plan is
committed whole or rolled back. The actions differ only in which jobs they
plan for, who may be a victim and in what order, and what they tell the job
when it fails; each says so in an :class:`EvictionPlan`, and the loop, the
cap and the failure memo are written once, here.

Cost is bounded: a plan is not retried for a beneficiary of the same shape
once one failed and nothing was committed since (``FailureMemo``), and each
action plans for ``MAX_BENEFICIARIES`` jobs per session at most. Across
sessions, a plan that failed is not searched again while the session's
input stays the same (:mod:`scheduler.engine.backlog`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpuwarden.contract import EvictionAction
from scheduler.engine.caches import SessionCaches, VictimIndex
from scheduler.engine.ordering import QueueKey, gang_need, job_key, queue_key
from scheduler.engine.state import Cluster, JobState
from scheduler.engine.statement import Statement
from scheduler.engine.victims import Admissible, Predicate, Screen, Step, make_room, victim_index

MAX_BENEFICIARIES = 32


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
        job.gang_short,
        tuple(t.shape for t in pending),
    )


def beneficiaries(cluster: Cluster) -> list[JobState]:
    """Jobs whose gang is still short, in allocate's order (queue, then job).

    An action looks at the first ``MAX_BENEFICIARIES`` it can act on; the
    rest keep their allocate reason and are looked at again next cycle,
    which bounds the cost of a session with thousands of pending jobs. A
    job awaiting room that earlier evictions are still freeing is no
    beneficiary: evicting more for it would take twice what it needs.
    """
    jobs = [
        job
        for job in cluster.pending_jobs
        if job.error is None
        and job.queue is not None
        and job.pool is not None
        and not job.awaiting_room
        and job.needs_gang()
    ]
    # A queue's key depends only on the queue and what the job asks for: a
    # backlog of thousands has a few dozen distinct ones, worked out once each.
    keys: dict[tuple[str, int, int, int], QueueKey] = {}

    def allocate_order(job: JobState) -> tuple[object, ...]:
        queue = job.queue
        assert queue is not None and job.pool is not None  # kept only such jobs
        need = gang_need(job)
        asked = (queue.name, need[0], need[1], need[2])
        key = keys.get(asked)
        if key is None:
            key = keys[asked] = queue_key(queue, job.pool.capacity, need)
        return (key, job_key(job))

    jobs.sort(key=allocate_order)
    return jobs


@dataclass(slots=True)
class EvictionPlan:
    """What an action will try for one beneficiary (see ``victims.make_room``).

    ``victims()`` yields candidate jobs cheapest first, ``is_candidate``
    filters them and ``admissible`` is asked just before each eviction
    (with the pods that would go: a whole job, or an elastic job's pods
    beyond minMember); it must only get harder to pass as more is evicted,
    which lets the search drop a victim refused on its own. ``step`` must
    succeed after each pod placed by evicting, against the state with its
    room made, or the search tries other victims and nodes (consolidate
    places the moved pods again there); ``screen``, when given, refuses a
    set of evictions on paper when ``step`` could not succeed after it,
    so the search does not make and undo them. ``finish`` is a last check of the
    whole plan before anything is committed. ``failure_note`` is added to the job's notes when the
    plan fails or is known to fail, so its pending reason says what was tried.
    """

    victims: Callable[[], Iterable[JobState]]
    is_candidate: Predicate
    admissible: Admissible
    action: EvictionAction
    reason: str
    within_limits: bool = False
    step: Step | None = None
    screen: Screen | None = None
    finish: Callable[[Cluster, SessionCaches, Statement], bool] | None = None
    failure_note: str | None = None


# Per beneficiary: the plan to try, or None to pass the job over.
PlanFor = Callable[[JobState, VictimIndex], EvictionPlan | None]


def run_evictions(cluster: Cluster, caches: SessionCaches, plan_for: PlanFor, action: EvictionAction) -> None:
    """Try ``plan_for``'s plan for each beneficiary; commit the ones that succeed.

    A committed plan clears the job's reasons and notes: it is placed, and
    what earlier actions tried for it no longer matters. ``action`` names
    the caller's plans for the backlog memo.
    """
    memo = FailureMemo()
    backlog = caches.backlog
    tried = 0
    index: VictimIndex | None = None  # built for the first beneficiary: most sessions have none
    for job in beneficiaries(cluster):
        if tried >= MAX_BENEFICIARIES:
            break
        # With the same input as before, a job that got no plan gets none
        # again, with the same notes: most of a backlog, every session.
        if backlog is not None:
            notes = backlog.no_plan_before(action, job)
            if notes is not None:
                job.notes.extend(notes)
                continue
        noted = len(job.notes)
        if index is None:
            index = victim_index(cluster, caches)
        plan = plan_for(job, index)
        if plan is None:
            if backlog is not None:
                backlog.no_plan(action, job, tuple(job.notes[noted:]))
            continue
        key = memo_key(job)
        if memo.known_failure(cluster, key):
            if plan.failure_note is not None:
                job.notes.append(plan.failure_note)
            continue
        tried += 1
        stmt = Statement(cluster)
        # A plan the same input already saw fail on paper fails so again:
        # it counts as tried and leaves what that failure left, without the search.
        released = cluster.release_version
        if backlog is not None and backlog.plan_failed_before(action, job):
            made = False
        else:
            made = make_room(
                cluster,
                caches,
                stmt,
                job,
                victims=plan.victims,
                is_candidate=plan.is_candidate,
                admissible=plan.admissible,
                action=plan.action,
                reason=plan.reason,
                within_limits=plan.within_limits,
                step=plan.step,
                screen=plan.screen,
            ) and (plan.finish is None or plan.finish(cluster, caches, stmt))
        if made:
            stmt.commit()
            job.reasons = []
            job.notes = []
        else:
            stmt.rollback()
            memo.remember(cluster, key)
            # Only a plan that failed on paper is remembered: one that
            # evicted and rolled back moved nodes and pods within
            # placement's order, which skipping it would not.
            if backlog is not None and cluster.release_version == released:
                backlog.plan_failed(action, job)
            if plan.failure_note is not None:
                job.notes.append(plan.failure_note)
