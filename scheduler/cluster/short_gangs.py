"""When each running gang first fell short of its minMember after losing a member.

Stale-gang eviction (:mod:`scheduler.engine.actions.stale_gangs`) evicts a
running gang that has been short for longer than its grace. The engine sees
one snapshot; how long a gang has been short, and whether it is short
because it lost something, takes memory across cycles, which this module
keeps for the scheduling cycle.

A gang counts its members running and those that succeeded: a batch Job
whose first pods completed while its last ones run is whole, and so is one
whose remaining pods are fewer than its minMember because the rest are
done. A gang is short, and dated, when that count is below minMember *and*
it lost a member: the count is below the most it was ever seen with (a
member that ran has failed, been deleted or evicted), or one of its members
failed. A gang that has only not grown to minMember yet lost nothing and is
never dated: an operator that creates its pods in stages, or a gang whose
later pods are still being created or placed, keeps what it runs, and the
pods that wait are explained instead. Failed members count for nothing.

The most each job was seen with is kept while the job is in the
snapshots, by this replica only: a new leader starts counting afresh and
dates a gang that was short when it took over only once it loses a member
that leader saw, or one of its members fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from scheduler.engine.model import Job, Snapshot, TaskStatus

# Jobs no longer in the snapshot whose memory may linger before it is pruned.
_PRUNE_SLACK = 1024


@dataclass(slots=True, eq=False)
class ShortGangs:
    """Dates short gangs in one scheduler's snapshots, cycle after cycle (one per scheduling loop)."""

    # Per job key: when it was first seen short (while it stays short).
    since: dict[str, float] = field(default_factory=dict)
    # Per job key: the most members seen running or succeeded at once.
    peak: dict[str, int] = field(default_factory=dict)
    # Per job key: the job last seen, when it was dated (None: not short) and the copy handed on.
    _memo: dict[str, tuple[Job, float | None, Job]] = field(default_factory=dict)

    def date(self, snapshot: Snapshot, now: float) -> Snapshot:
        """``snapshot`` with ``below_min_member_since`` set on each job that is short (module docstring).

        A job the assembler handed over unchanged (the same object) was
        counted last cycle: its count, and the dated copy made of it, are
        reused.
        """
        jobs = []
        seen: set[str] = set()
        kept = self._memo
        for job in snapshot.jobs:
            key = job.key
            memo = kept.get(key)
            # A dated copy holds only while the gang stayed short: a job that
            # left the snapshot and came back (the same object) is dated anew.
            if memo is not None and memo[0] is job and (memo[1] is None or self.since.get(key) == memo[1]):
                if memo[1] is not None:
                    seen.add(key)
                jobs.append(memo[2])
                continue
            if self._lost_members(job):
                since = self.since.setdefault(key, now)
                dated = replace(job, below_min_member_since=since)
                jobs.append(dated)
                kept[key] = (job, since, dated)
                seen.add(key)
            else:
                kept[key] = (job, None, job)
                jobs.append(job)
        for key in [k for k in self.since if k not in seen]:
            del self.since[key]
        limit = len(snapshot.jobs) + _PRUNE_SLACK
        if len(kept) > limit or len(self.peak) > limit:
            present = {job.key for job in snapshot.jobs}
            self._memo = {key: memo for key, memo in kept.items() if key in present}
            self.peak = {key: most for key, most in self.peak.items() if key in present}
        return replace(snapshot, jobs=tuple(jobs))

    def _lost_members(self, job: Job) -> bool:
        """True when the job runs, counts fewer than minMember, and lost a member to get there."""
        running = sum(1 for t in job.tasks if t.status is TaskStatus.RUNNING)
        counted = running + job.succeeded
        most = self.peak.get(job.key, 0)
        if counted > most:
            self.peak[job.key] = most = counted
        return running > 0 and counted < job.min_member and (counted < most or job.failed > 0)
