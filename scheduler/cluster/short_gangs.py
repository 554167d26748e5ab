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

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from scheduler.cluster.assemble import JobChanges
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
    # The dated copies handed on, by job key (the gangs short now), and the
    # number of the snapshot whose changes were last read (JobChanges).
    _dated: dict[str, Job] = field(default_factory=dict)
    _serial: int | None = None

    def date(self, snapshot: Snapshot, now: float, changes: JobChanges | None = None) -> Snapshot:
        """``snapshot`` with ``below_min_member_since`` set on each job that is short (module docstring).

        A job the assembler handed over unchanged (the same object) was
        counted last cycle: its count, and the dated copy made of it, are
        reused. Given what the assembler changed since the snapshot last
        dated, only those jobs are counted: a cycle costs what changed,
        plus one pass over the jobs while some gang is short.
        """
        changed = changes.after(self._serial) if changes is not None else None
        self._serial = None  # until this snapshot is read in full
        dated = self._date_all(snapshot, now) if changed is None else self._date_changed(changed, now)
        if changes is not None:
            self._serial = changes.serial
        if dated is None:
            return snapshot
        return replace(snapshot, jobs=tuple(dated.get(job.key, job) for job in snapshot.jobs))

    def _date_changed(self, changed: Mapping[str, Job | None], now: float) -> dict[str, Job] | None:
        """Count the jobs in ``changed`` (a finished one counts as gone); the dated copies to hand on."""
        for key, job in changed.items():
            if job is None or not job.tasks:
                # Out of the snapshot. A finished job keeps its peak while it
                # is kept at all, as a full count keeps it until it prunes.
                self._memo.pop(key, None)
                if job is None:
                    self.peak.pop(key, None)
                self.since.pop(key, None)
                self._dated.pop(key, None)
                continue
            if self._lost_members(job):
                since = self.since.setdefault(key, now)
                copy = replace(job, below_min_member_since=since)
                self._memo[key] = (job, since, copy)
                self._dated[key] = copy
            else:
                self._memo[key] = (job, None, job)
                self.since.pop(key, None)
                self._dated.pop(key, None)
        return self._dated or None

    def _date_all(self, snapshot: Snapshot, now: float) -> dict[str, Job] | None:
        """Count every job of ``snapshot`` (reusing what is unchanged); the dated copies to hand on."""
        dated: dict[str, Job] = {}
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
                    dated[key] = memo[2]
                continue
            if self._lost_members(job):
                since = self.since.setdefault(key, now)
                copy = replace(job, below_min_member_since=since)
                dated[key] = copy
                kept[key] = (job, since, copy)
                seen.add(key)
            else:
                kept[key] = (job, None, job)
        for key in [k for k in self.since if k not in seen]:
            del self.since[key]
        limit = len(snapshot.jobs) + _PRUNE_SLACK
        if len(kept) > limit or len(self.peak) > limit:
            present = {job.key for job in snapshot.jobs}
            self._memo = {key: memo for key, memo in kept.items() if key in present}
            self.peak = {key: most for key, most in self.peak.items() if key in present}
        self._dated = dated
        return dated or None

    def _lost_members(self, job: Job) -> bool:
        """True when the job runs, counts fewer than minMember, and lost a member to get there."""
        running = sum(1 for t in job.tasks if t.status is TaskStatus.RUNNING)
        counted = running + job.succeeded
        most = self.peak.get(job.key, 0)
        if counted > most:
            self.peak[job.key] = most = counted
        return running > 0 and counted < job.min_member and (counted < most or job.failed > 0)
