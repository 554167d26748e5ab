"""PodGroup and Queue status from the engine's decisions, and Events for pending pod groups.

Every cycle produces a status for every pending group and every queue, but
almost all of them equal the last cycle's. The writer keeps what it last
wrote per object and sends a merge patch to the status subresource only when
that changed, so a steady cluster costs no status requests. Times are kept
out of the comparison: a condition's ``lastTransitionTime`` moves only when
its status flips.

A pending group's explanation also goes into one Warning Event per group
whose name is derived from the group, so the explanation's history reads as
one Event whose message and count change, written when the explanation
changes and never merely because a cycle ran. Kubernetes keeps Events an
hour; the condition holds the current explanation for as long as it lasts.

PodGroup phase, as far as one cycle's decisions tell: ``Pending`` while the
engine has pods of the group to place and placed none this cycle,
``Running`` once it placed some or its gang is met (the ``Unschedulable``
condition stays True while pods beyond those are still waiting). A group
none of whose pods is left to run (:func:`finished_phase`) is
``Succeeded``, or ``Failed`` when some failed and fewer than minMember
succeeded. A group the decisions say nothing about keeps what was written
last.
"""

from __future__ import annotations

import hashlib
import itertools
import socket
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from threading import Lock
from types import MappingProxyType
from typing import Any

from gpuwarden import contract
from gpuwarden.kube import JSON, ApiError, KubeApi
from gpuwarden.logconfig import get_logger
from scheduler.cluster.evict import EvictOutcome, EvictResult
from scheduler.cluster.quantity import format_cpu, format_gpus, format_memory
from scheduler.engine.model import Decisions, Job, JobStatus, QueueShare, Resources

log = get_logger(__name__)

CONDITION_UNSCHEDULABLE = contract.PodGroupConditionType.UNSCHEDULABLE.value
# Reason of a False Unschedulable condition.
REASON_SCHEDULED = contract.PODGROUP_SCHEDULED_REASON
# Reason of a True condition with several different reason codes.
REASON_MULTIPLE = "MultipleReasons"
CONDITION_EVICTION_BLOCKED = contract.PodGroupConditionType.EVICTION_BLOCKED.value
REASON_BUDGET = "DisruptionBudget"
CONDITION_QUOTA_NOT_BACKED = contract.QueueConditionType.QUOTA_NOT_BACKED.value
CONDITION_INVALID = contract.QueueConditionType.INVALID.value
REASON_VALID = contract.QueueConditionReason.VALID.value
# Reasons of the QuotaNotBacked condition.
REASON_HEALTHY_CAPACITY_SHORT = "HealthyCapacityBelowQuotas"
REASON_QUOTA_BACKED = "QuotaBacked"
CONDITION_QUOTA_NOT_GUARANTEED = contract.QueueConditionType.QUOTA_NOT_GUARANTEED.value
REASON_QUOTAS_EXCEED_BACKING = contract.QueueConditionReason.QUOTAS_EXCEED_BACKING.value
REASON_QUOTA_GUARANTEED = contract.QueueConditionReason.QUOTA_GUARANTEED.value
MAX_MESSAGE = 1024


def now_utc() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def format_time(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- pure: what to write ------------------------------------------------------


def resource_list(res: Resources) -> dict[str, int | float | str]:
    """A resource vector as the Queue CRD's status holds it: GPUs as a number, CPU and memory as quantities."""
    return {"gpu": format_gpus(res.gpu), "cpu": format_cpu(res.cpu), "memory": format_memory(res.memory)}


def queue_status(shares: Sequence[QueueShare]) -> JSON:
    """One queue's status; a queue with shares in several node pools shows their sums."""

    def total(pick: Callable[[QueueShare], Resources]) -> Resources:
        return Resources(
            gpu=sum(pick(s).gpu for s in shares),
            cpu=sum(pick(s).cpu for s in shares),
            memory=sum(pick(s).memory for s in shares),
        )

    return {
        contract.QUEUE_STATUS_FAIR_SHARE: resource_list(total(lambda s: s.fair_share)),
        contract.QUEUE_STATUS_GUARANTEED: resource_list(total(lambda s: s.guaranteed)),
        contract.QUEUE_STATUS_ALLOCATED: resource_list(total(lambda s: s.allocated)),
        contract.QUEUE_STATUS_ALLOCATED_NON_PREEMPTIBLE: resource_list(total(lambda s: s.allocated_non_preemptible)),
        contract.QUEUE_STATUS_REQUESTED: resource_list(total(lambda s: s.request)),
        "conditions": [quota_not_backed(shares), quota_not_guaranteed(shares), valid()],
    }


def _condition_states(status: JSON) -> list[tuple[Any, Any, Any]]:
    """What a status's conditions say, without their messages (which may quote amounts)."""
    return [(c.get("type"), c.get("status"), c.get("reason")) for c in status.get("conditions") or ()]


def valid() -> JSON:
    """The Invalid condition of a queue that takes work."""
    return {"type": CONDITION_INVALID, "status": "False", "reason": REASON_VALID, "message": ""}


def invalid_queue_status(reason: str, message: str) -> JSON:
    """The status of a queue that cannot take work: only why (it has no share and holds nothing of its own).

    The amounts are cleared rather than left at what the queue showed
    while it was valid, which would read as current.
    """
    return {
        contract.QUEUE_STATUS_FAIR_SHARE: None,
        contract.QUEUE_STATUS_GUARANTEED: None,
        contract.QUEUE_STATUS_ALLOCATED: None,
        contract.QUEUE_STATUS_ALLOCATED_NON_PREEMPTIBLE: None,
        contract.QUEUE_STATUS_REQUESTED: None,
        "conditions": [{"type": CONDITION_INVALID, "status": "True", "reason": reason, "message": _clip(message)}],
    }


def _amount(resource: str, value: int) -> str:
    if resource == "gpu":
        gpus = format_gpus(value)
        return f"{gpus} GPU" if gpus == 1 else f"{gpus} GPUs"
    if resource == "cpu":
        return f"{format_cpu(value)} CPU"
    return f"{format_memory(value)} memory"


def quota_not_backed(shares: Sequence[QueueShare]) -> JSON:
    """The QuotaNotBacked condition (without its time): True while healthy hardware backs less than the quota.

    The message names, per resource, the shortfall and why, so the queue's
    users see that a fault, not another team, is why their work waits.
    """
    parts: list[str] = []
    for share in shares:
        for resource in ("gpu", "cpu", "memory"):
            short = getattr(share.quota_shortfall, resource)
            if short <= 0:
                continue
            quota = getattr(share.quota, resource)
            backing = _amount(resource, getattr(share.backing, resource))
            level = _amount(resource, getattr(share.level_quota, resource))
            if share.parent:
                why = (
                    f"the backed part of parent queue {share.parent}'s quota ({backing}) "
                    f"is below the sum of its child queues' quotas ({level})"
                )
            else:
                why = f"the pool's healthy capacity ({backing}) is below the sum of quotas ({level})"
            whole = _amount(resource, quota)
            verb = "is" if resource == "gpu" and format_gpus(short) == 1 else "are"
            parts.append(
                f"{_amount(resource, short).split(' ')[0]} of {whole} of this queue's quota {verb} not backed: {why}"
            )
    if not parts:
        return {"type": CONDITION_QUOTA_NOT_BACKED, "status": "False", "reason": REASON_QUOTA_BACKED, "message": ""}
    message = "; ".join(parts)
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 1] + "…"
    return {
        "type": CONDITION_QUOTA_NOT_BACKED,
        "status": "True",
        "reason": REASON_HEALTHY_CAPACITY_SHORT,
        "message": message,
    }


def quota_not_guaranteed(shares: Sequence[QueueShare]) -> JSON:
    """The QuotaNotGuaranteed condition (without its time): True while part of what the quota promises is not.

    Users read a quota as a promise, so a queue whose quota reclaim will
    not win back in full (the quotas of its level add up to more than backs
    them) says so, and the engine's note says how much and why. It follows
    demand: what the quota promises is ``min(quota, requested)``, so an idle
    queue on an over-subscribed level is not flagged. A queue with shares in
    several node pools names the pool of each note.
    """
    noted = [s for s in shares if s.guarantee_note]
    if not noted:
        return {
            "type": CONDITION_QUOTA_NOT_GUARANTEED,
            "status": "False",
            "reason": REASON_QUOTA_GUARANTEED,
            "message": "",
        }
    if len(shares) == 1:
        message = noted[0].guarantee_note
    else:
        message = "; ".join(f"node pool {s.pool}: {s.guarantee_note}" for s in noted)
    return {
        "type": CONDITION_QUOTA_NOT_GUARANTEED,
        "status": "True",
        "reason": REASON_QUOTAS_EXCEED_BACKING,
        "message": _clip(message),
    }


def explanation(status: JobStatus) -> tuple[str, str]:
    """(reason, message) of a pending group: the engine's reasons, in its order.

    The reason is shown next to the message everywhere (the condition,
    the Event, ``kubectl describe``, the demo), so a message whose reasons
    share one code does not repeat it; only a ``MultipleReasons`` message
    names each part's code, since the reason alone does not say them.
    """
    codes = list(dict.fromkeys(r.code.value for r in status.reasons))
    reason = codes[0] if len(codes) == 1 else REASON_MULTIPLE if codes else "Pending"
    if len(codes) > 1:
        message = "; ".join(f"{r.code.value}: {r.message}" for r in status.reasons)
    else:
        message = "; ".join(r.message for r in status.reasons) or "waiting to be placed"
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 1] + "…"
    return reason, message


# A group's end: its phase (Succeeded or Failed) and what its pods came to.
Finished = tuple[contract.PodGroupPhase, str]


def finished_phase(job: Job) -> Finished | None:
    """How a group ended, once none of its pods is left to run or to place; None until then.

    Succeeded, unless some member failed and fewer than minMember
    succeeded: then Failed. A member that failed and was replaced (a Job's
    retries) does not fail a group whose gang went on to complete; a group
    whose gang never completed because members failed did fail. A group
    that has never had a finished member is not finished (its pods are
    gone, not done), and keeps what was written last.
    """
    if job.tasks or not (job.succeeded or job.failed):
        return None
    counts = f"{job.succeeded} succeeded" + (f", {job.failed} failed" if job.failed else "")
    if job.failed and job.succeeded < job.min_member:
        return contract.PodGroupPhase.FAILED, f"every pod finished: {counts}, fewer than minMember {job.min_member}"
    return contract.PodGroupPhase.SUCCEEDED, f"every pod finished: {counts}"


def pod_group_status(
    pending: JobStatus | None, placed_now: bool, blocked: str | None = None, finished: Finished | None = None
) -> JSON:
    """The status of one group, without times; None ``pending`` means nothing of it waits.

    ``blocked`` says which of its evictions were refused and why; the
    ``EvictionBlocked`` condition is there only while one is. ``finished``
    is how the group ended (:func:`finished_phase`), None while it runs.
    """
    if pending is None:
        said = finished[1] if finished is not None else ""
        condition = {"type": CONDITION_UNSCHEDULABLE, "status": "False", "reason": REASON_SCHEDULED, "message": said}
    else:
        reason, message = explanation(pending)
        condition = {"type": CONDITION_UNSCHEDULABLE, "status": "True", "reason": reason, "message": message}
    running = pending is None or placed_now
    phase = contract.PodGroupPhase.RUNNING if running else contract.PodGroupPhase.PENDING
    if finished is not None and pending is None:
        phase = finished[0]
    conditions = [condition]
    if blocked is not None:
        conditions.append(
            {"type": CONDITION_EVICTION_BLOCKED, "status": "True", "reason": REASON_BUDGET, "message": blocked}
        )
    return {"phase": phase.value, "conditions": conditions}


def refusals(results: Iterable[EvictResult]) -> dict[str, str]:
    """Per group, what its refused evictions say (the EvictionBlocked message and Event)."""
    found: dict[str, list[str]] = {}
    for r in results:
        if r.outcome is EvictOutcome.REFUSED:
            ev = r.eviction
            what = f"eviction of pod {ev.namespace}/{ev.pod} ({ev.action.value})"
            found.setdefault(ev.job, []).append(f"{what} {r.error or 'refused'}; retried next cycle")
    return {job: _clip("; ".join(sorted(lines))) for job, lines in found.items()}


def _clip(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 1] + "…"


def event_name(group: str, kind: str = CONDITION_UNSCHEDULABLE) -> str:
    """The Event name of a group for one kind of news: stable across cycles and restarts."""
    name = group.partition("/")[2]
    digest = hashlib.sha256(f"{group}\x1f{kind}".encode()).hexdigest()[:10]
    return f"{name[:200]}.{digest}"


def _condition(status: JSON, kind: str) -> JSON | None:
    return next((c for c in status.get("conditions", ()) if c.get("type") == kind), None)


def _blocked_in(status: JSON) -> bool:
    return _condition(status, CONDITION_EVICTION_BLOCKED) is not None


def shows_blocked(podgroup: Mapping[str, object]) -> bool:
    """Whether a PodGroup shows EvictionBlocked now: a new leader clears what it no longer sees."""
    status = podgroup.get("status")
    return isinstance(status, dict) and isinstance(status.get("conditions"), list) and _blocked_in(status)


# -- writing --------------------------------------------------------------------


# What a write told of no finished group is: the same mapping every time, so the next write knows nothing ended.
_NONE_FINISHED: Mapping[str, Finished] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class MembershipChange:
    """The names that entered or left a collection since an earlier version of it, ``since``.

    The cycle hands the status writer the groups whose minMember runs as a
    new unchanging version whenever one changes, with this: the writer,
    which holds on to the version of its last call, then looks at what
    changed instead of comparing every running group. Any other ``since``
    (a batch was lost, the cycle started over) means a full look.
    """

    since: object  # compared by identity
    names: frozenset[str]

    def then(self, newer: MembershipChange | None, current: object) -> MembershipChange | None:
        """This change followed by ``newer``, made on ``current`` (the version this one led to)."""
        if newer is None or newer.since is not current:
            return None
        return MembershipChange(self.since, self.names | newer.names)


class _Placed(Collection[str]):
    """The groups a write counts as placed: the ones bound this cycle, and the running ones (``given``)."""

    __slots__ = ("bound", "given", "running")

    def __init__(self, bound: frozenset[str], running: Collection[str], given: object) -> None:
        self.bound = bound
        self.running = running  # looked up in, so a set or a mapping
        self.given = given  # as the caller gave it: what a later MembershipChange names as its since

    @classmethod
    def of(cls, decisions: Decisions, gang_met: Iterable[str]) -> _Placed:
        bound = frozenset(b.job for b in decisions.binds)
        running: Collection[str] = gang_met if isinstance(gang_met, (AbstractSet, Mapping)) else frozenset(gang_met)
        return cls(bound, running, gang_met)

    def materialized(self) -> _Placed:
        """The same groups in one set: for a call that looks at all of them anyway."""
        return _Placed(frozenset(), self.bound | set(self.running), self.given)

    def __contains__(self, group: object) -> bool:
        return group in self.bound or group in self.running

    def __len__(self) -> int:
        running = self.running
        return len(running) + sum(1 for group in self.bound if group not in running)

    def __iter__(self) -> Iterator[str]:
        yield from self.running
        running = self.running
        yield from (group for group in self.bound if group not in running)


@dataclass
class StatusReport:
    """What one :meth:`StatusWriter.write` sent; ``unchanged`` objects cost nothing."""

    pod_groups_patched: int = 0
    queues_patched: int = 0
    events_written: int = 0
    unchanged: int = 0
    # First statuses of groups placed in full, held back while cycles bind,
    # and Queue amounts held back for QUEUE_AMOUNTS_INTERVAL_S.
    deferred: int = 0
    # Lone pods' groups with no PodGroup, running or ended with nothing to explain: not written.
    unmirrored: int = 0
    # Objects that do not exist (no PodGroup for a job, a Queue deleted).
    missing: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass
class _EventState:
    """What one Event of a group last said, and its count."""

    explanation: tuple[str, str] | None = None
    count: int = 0


@dataclass
class _Group:
    status: JSON
    transitions: dict[str, str]  # condition type -> lastTransitionTime
    uid: str = ""
    events: dict[str, _EventState] = field(default_factory=dict)  # by kind (condition type)

    def event(self, kind: str) -> _EventState:
        return self.events.setdefault(kind, _EventState())


# Threads writing PodGroup status at once (see StatusWriter).
STATUS_WORKERS = 16
# A Queue whose conditions stand is written at most this often (its amounts move with every bind).
QUEUE_AMOUNTS_INTERVAL_S = 5.0


class StatusWriter:
    """Writes PodGroup/Queue status and pending Events, each only when it changed.

    One per scheduler (the last-written state is its memory); calls are
    serialized. After a restart the first cycle writes every object once.
    Within a call the PodGroups are written from ``workers`` threads: each
    group's patch and Event are its own, and a fill of thousands of new
    groups would otherwise hold up the next cycle for a round trip each.
    """

    def __init__(
        self,
        api: KubeApi,
        *,
        clock: Callable[[], datetime] = now_utc,
        instance: str | None = None,
        workers: int = STATUS_WORKERS,
        pace: Callable[[], object] | None = None,
        queue_interval_s: float = QUEUE_AMOUNTS_INTERVAL_S,
    ) -> None:
        self._api = api
        # Under steady arrivals every bind moves a queue's allocated amounts,
        # and a patch per bind (with its watch echo) cost the process as much
        # CPU as the binds: amounts wait up to this long, a condition that
        # changes goes out at once.
        self._queue_interval_s = queue_interval_s
        self._queue_written_at: dict[str, datetime] = {}
        self._workers = workers
        # Called before each PodGroup status patch (a token bucket's take):
        # bookkeeping written behind the cycles goes out at a steady rate.
        self._pace = pace
        self._clock = clock
        self._instance = instance or socket.gethostname()
        self._groups: dict[str, _Group] = {}
        # Groups whose written status shows EvictionBlocked (written again, so the condition goes).
        self._blocked: set[str] = set()
        # Groups whose final status (how they ended) stands as written: they
        # leave the groups each call looks at until something else is said of them.
        self._final: dict[str, Finished] = {}
        # The finished mapping of the last call, and those of its groups that
        # were written (or tried) then rather than settled.
        self._finished_seen: Mapping[str, Finished] | None = None
        # The watched PodGroups of the current write (see write's podgroups).
        self._shown: Mapping[tuple[str, str], Mapping[str, Any]] = {}
        self._unsettled: set[str] = set()
        # The groups placed (or running) at the last call, those of them
        # that call wrote (found settled, or written again, by the next),
        # and those it deferred: a group placed then and now and settled or
        # still deferred is not looked at again until another input
        # (pending, blocked, ended) or a forget names it.
        self._placed_before: _Placed | None = None
        # Groups both placed and finished at the last call (looked at again each call while they are),
        # and those pending then: one placed both times that waits no more (an elastic job's extras) is news.
        self._placed_finished: set[str] = set()
        self._pending_before: set[str] = set()
        self._recheck: set[str] = set()
        self._deferred: set[str] = set()
        # Per group, the inputs its written status and Events were last found to match (_unchanged).
        self._said: dict[str, tuple[object, ...]] = {}
        self._queues: dict[str, JSON] = {}
        self._queue_transitions: dict[str, dict[str, str]] = {}  # queue -> condition type -> time
        self._lock = Lock()

    def write(
        self,
        decisions: Decisions,
        gang_met: Iterable[str] = (),
        blocked: Mapping[str, str] | None = None,
        shown_blocked: Iterable[str] = (),
        lost_totals: Mapping[str, float] | None = None,
        *,
        queue_problems: Mapping[str, tuple[str, str]] | None = None,
        defer_placed: bool = False,
        finished: Mapping[str, Finished] | None = None,
        podgroups: Mapping[tuple[str, str], Mapping[str, Any]] | None = None,
        finished_changed: Collection[str] | None = None,
        unmirrored: Callable[[str], bool] | None = None,
        gang_met_changed: MembershipChange | None = None,
    ) -> StatusReport:
        """Statuses and Events for one cycle's decisions.

        ``gang_met`` names the groups whose minMember already runs: one with
        more pods waiting (an elastic job's extras) is Running, not Pending.
        ``gang_met_changed`` names the groups that entered or left it since
        an earlier ``gang_met`` (its ``since``); when that is the one of
        this writer's last call, the running groups cost what changed, not
        a pass over every one of them (None: every one is looked at).
        ``blocked`` maps a group to what its refused evictions say
        (:func:`refusals`); ``shown_blocked`` names the groups whose objects
        show the condition now, so that it is cleared even by a writer that
        did not set it. With ``defer_placed`` a group placed in full whose
        status was never written waits (a later cycle writes it): a busy
        scheduler sends its binds first. ``queue_problems`` maps a Queue that
        cannot take work to the (reason, message) of its Invalid condition.
        ``finished`` maps a group none of whose pods is left to run to how
        it ended (:func:`finished_phase`); ``finished_changed`` names the
        groups whose entry changed since the mapping of the last call (None:
        unknown), so that a new mapping costs its changes, not a walk over
        every finished group. ``podgroups`` are the watched
        PodGroups by (namespace, name): a group this writer has not written
        yet whose object already shows the status it would write is taken
        as written, so that a new leader does not patch every PodGroup of
        the cluster's history once. ``unmirrored`` says of a group that it is
        a lone pod's with no PodGroup made (the cycle makes one only when
        the group has news): while it is neither pending nor blocked,
        nothing is written for it, placed or ended.
        """
        report = StatusReport()
        with self._lock:
            self._shown = podgroups or {}
            self._write_groups(
                decisions.pending,
                _Placed.of(decisions, gang_met),
                blocked or {},
                set(shown_blocked),
                report,
                defer_placed=defer_placed,
                finished=finished,
                finished_changed=finished_changed,
                unmirrored=unmirrored,
                gang_met_changed=gang_met_changed,
            )
            self._write_queues(decisions.queue_shares, lost_totals or {}, queue_problems or {}, report)
        # A line when something went out (or failed); a write that only
        # found everything as it was says so at debug: under steady
        # arrivals that was a second line per cycle, written on a thread
        # the cycles share the interpreter with.
        wrote = report.pod_groups_patched or report.queues_patched or report.events_written or report.errors
        (log.info if wrote else log.debug)(
            "status_written",
            pod_groups=report.pod_groups_patched,
            queues=report.queues_patched,
            events=report.events_written,
            unchanged=report.unchanged,
            deferred=report.deferred,
            unmirrored=report.unmirrored,
            errors=len(report.errors),
        )
        return report

    def forget_finished(self) -> None:
        """Look at every finished group on the next write: changes named since may not cover what it last saw."""
        with self._lock:
            self._finished_seen = None

    def forget_gone(
        self,
        podgroups: Mapping[tuple[str, str], Mapping[str, Any]],
        changed: Iterable[tuple[str, str]] | None,
    ) -> int:
        """Forget the groups whose PodGroup is gone from ``podgroups`` or was made anew (another UID).

        ``changed`` names the PodGroups that changed since the last call
        (None: any may have, every group known here is checked). What was
        written for a deleted PodGroup would otherwise be kept for the
        process's life, and a PodGroup made again under the same name would
        be taken as showing the old one's status and never be written.
        Returns how many groups were forgotten.
        """
        with self._lock:
            candidates: Iterable[tuple[str, str]] = changed if changed is not None else []
            if changed is None:
                known_groups = set(itertools.chain(self._groups, self._final, self._said))
                candidates = [(ns, name) for ns, _, name in (group.partition("/") for group in known_groups)]
            gone: list[str] = []
            for namespace, name in candidates:
                group = f"{namespace}/{name}"
                obj = podgroups.get((namespace, name))
                if obj is None:
                    if group in self._groups or group in self._final or group in self._said:
                        gone.append(group)
                    continue
                known = self._groups.get(group)
                meta = obj.get("metadata")
                uid = meta.get("uid") if isinstance(meta, dict) else None
                if known is not None and known.uid and uid and uid != known.uid:
                    gone.append(group)
        for group in gone:
            self.forget(pod_group=group)
        return len(gone)

    def forget(self, *, pod_group: str | None = None, queue: str | None = None) -> None:
        """Drop what was written for a deleted object, so a new one of that name is written afresh."""
        with self._lock:
            if pod_group is not None:
                self._groups.pop(pod_group, None)
                self._blocked.discard(pod_group)
                self._final.pop(pod_group, None)
                self._unsettled.add(pod_group)  # looked at again even if nothing else ended since
                self._recheck.add(pod_group)  # ... or if it still runs
                self._said.pop(pod_group, None)
            if queue is not None:
                self._queues.pop(queue, None)
                self._queue_transitions.pop(queue, None)
                self._queue_written_at.pop(queue, None)

    # -- PodGroups ------------------------------------------------------------

    def _write_groups(
        self,
        pending: Sequence[JobStatus],
        placed_now: _Placed,
        blocked: Mapping[str, str],
        shown: set[str],
        report: StatusReport,
        *,
        gang_met_changed: MembershipChange | None = None,
        defer_placed: bool = False,
        finished: Mapping[str, Finished] | None = None,
        finished_changed: Collection[str] | None = None,
        unmirrored: Callable[[str], bool] | None = None,
    ) -> None:
        by_job = {s.job: s for s in pending}
        finished = finished if finished is not None else _NONE_FINISHED
        # Unknown until this call has looked: a call that fails before then
        # leaves the next one to look at every finished group.
        seen, self._finished_seen = self._finished_seen, None
        # The very mapping of the last call (nothing ended since), a new one
        # whose changes are named, or none finished then or now.
        ends_known = seen is not None and (
            finished is seen or finished_changed is not None or (not finished and not seen)
        )
        ends_changed: Collection[str] = (finished_changed or ()) if ends_known else ()
        # Unknown until this call is done: a call that fails leaves the next
        # one to look at every placed group. So does one that cannot tell
        # which groups stopped being finished (one placed at both calls
        # would show how it ended).
        placed_before, self._placed_before = self._placed_before, None
        if not ends_known:
            placed_before = None
        # The placed groups that may differ from the last call's: all of
        # them unless the running groups that changed are named since them.
        newly: Collection[str]
        if placed_before is not None and gang_met_changed is not None and gang_met_changed.since is placed_before.given:
            newly = placed_now.bound | gang_met_changed.names
        else:
            newly = placed_now = placed_now.materialized()
        # A group blocked last time is written again, so the condition goes.
        was_blocked = shown | self._blocked
        final = self._final
        ended: dict[str, Finished] = {}
        candidates: Iterable[str] = finished
        placed_finished, self._placed_finished = self._placed_finished, set()
        if ends_known:
            # The very mapping of the last call (nothing ended since), or a
            # new one whose changes are named: of its groups, only those not
            # settled then, changed since, or named again now, can need a
            # write. Thousands of finished groups left in place by their
            # Jobs would otherwise be walked on every call. A finished group
            # that is placed is named: placed and finished at the last call
            # too, newly placed, or newly finished.
            named = itertools.chain(by_job, newly, blocked, was_blocked, ends_changed, placed_finished)
            candidates = self._unsettled | {group for group in named if group in finished}

        def news(group: str) -> bool:
            """Something to say of ``group`` beyond how it runs or ended: it waits, or an eviction was refused."""
            return group in by_job or group in blocked or group in was_blocked

        def silent(group: str) -> bool:
            """A lone pod's group with no PodGroup made and no news: nothing is written or kept for it."""
            return unmirrored is not None and not news(group) and unmirrored(group)

        for group in candidates:
            how = finished.get(group)
            if how is None:
                continue
            if group in placed_now:
                self._placed_finished.add(group)
            settled = final.get(group) == how and not (
                group in by_job or group in placed_now or group in blocked or group in was_blocked
            )
            if settled:
                report.unchanged += 1  # written as it ended, and nothing new said of it since
            elif silent(group):
                # Ended: nothing to write, and nothing kept (no PodGroup's
                # deletion would ever make this writer forget it again).
                report.unmirrored += 1
            else:
                ended[group] = how
        self._finished_seen = finished
        self._unsettled = set(ended)
        # Every running group is placed at every call: walking them all was
        # the writer's cost at a thousand running groups, twenty calls a
        # second, on a thread the cycles share the interpreter with. Those
        # placed at the last call too and settled then are unchanged (the
        # same inputs, and nothing since forgot what was said of them);
        # those it deferred wait on, unlooked at, while the scheduler is busy.
        # What is placed now and was not, and how many were placed both
        # times, come from the groups that changed (``newly``), not from
        # set operations over every running group.
        said_of = set(by_job) | set(blocked) | was_blocked | set(ended)
        deferred: set[str] = set()
        if placed_before is None:
            look = said_of | set(placed_now)
        else:
            fresh = {group for group in newly if group in placed_now and group not in placed_before}
            both = len(placed_now) - len(fresh)  # placed now and at the last call
            reopened = {
                group
                for group in itertools.chain(self._recheck, said_of, ends_changed, self._pending_before)
                if group in placed_now and group in placed_before
            }
            waiting = {
                group
                for group in self._deferred
                if group in placed_now and group in placed_before and group not in reopened
            }
            kept = both - len(reopened)  # placed both times, settled or deferred then, and no news now
            look = said_of | fresh | reopened
            if defer_placed:
                deferred = waiting  # still never written, and still waiting
                report.deferred += len(deferred)
                report.unchanged += kept - len(deferred)
            else:
                look |= waiting  # their wait is over
                report.unchanged += kept - len(waiting)
        recheck: set[str] = set()
        groups: list[str] = []
        for group in sorted(look):
            end = ended.get(group)
            if silent(group):
                # Placed: not looked at again while it runs (see kept), nor
                # written once it ends (above).
                report.unmirrored += 1
                continue
            if defer_placed and group not in self._groups and not news(group):
                report.deferred += 1
                deferred.add(group)
                continue
            if self._unchanged(group, by_job.get(group), group in placed_now, blocked.get(group), end):
                report.unchanged += 1
                self._settle(group, end)
            else:
                groups.append(group)
                recheck.add(group)  # found settled by the next call, or written again if this write fails

        def one(group: str) -> StatusReport:
            # A report per group, merged below: the threads share no counters.
            mine = StatusReport()
            self._write_group(group, by_job.get(group), group in placed_now, blocked.get(group), mine, ended.get(group))
            return mine

        if len(groups) <= 1 or self._workers <= 1:
            parts = [one(g) for g in groups]
        else:
            with ThreadPoolExecutor(min(self._workers, len(groups)), thread_name_prefix="status") as pool:
                parts = list(pool.map(one, groups))
        for part in parts:
            report.pod_groups_patched += part.pod_groups_patched
            report.events_written += part.events_written
            report.unchanged += part.unchanged
            report.missing.extend(part.missing)
            report.errors.extend(part.errors)
        self._recheck = recheck
        self._deferred = deferred
        self._placed_before = placed_now
        self._pending_before = set(by_job)

    def _unchanged(
        self,
        group: str,
        pending: JobStatus | None,
        placed_now: bool,
        blocked: str | None,
        finished: Finished | None = None,
    ) -> bool:
        """Nothing to send for this group: its status and both Events' news are the ones last written.

        Once that is found, the inputs it was found for are kept (``_said``):
        a running group is told the same every cycle, and the same inputs
        are then unchanged at the cost of one comparison, not of building
        its status again. A write forgets them.
        """
        said = (pending, placed_now, blocked, finished)
        if self._said.get(group) == said:
            return True
        known = self._known(group)
        if known is None or known.status != pod_group_status(pending, placed_now, blocked, finished):
            return False
        news = explanation(pending) if pending is not None else None
        budget = (REASON_BUDGET, blocked) if blocked is not None else None
        same = (
            known.event(CONDITION_UNSCHEDULABLE).explanation == news
            and known.event(CONDITION_EVICTION_BLOCKED).explanation == budget
        )
        if same:
            self._said[group] = said
        return same

    def _write_group(  # noqa: PLR0917 (one call site, all positional)
        self,
        group: str,
        pending: JobStatus | None,
        placed_now: bool,
        blocked: str | None,
        report: StatusReport,
        finished: Finished | None = None,
    ) -> None:
        namespace, _, name = group.partition("/")
        self._said.pop(group, None)
        desired = pod_group_status(pending, placed_now, blocked, finished)
        known = self._known(group)
        if known is not None and known.status == desired:
            report.unchanged += 1
        else:
            now = format_time(self._clock())
            transitions: dict[str, str] = {}
            conditions = []
            for condition in desired["conditions"]:
                kind = condition["type"]
                before = _condition(known.status, kind) if known is not None else None
                same = before is not None and before["status"] == condition["status"]
                transitions[kind] = known.transitions.get(kind, now) if same and known is not None else now
                conditions.append({**condition, "lastTransitionTime": transitions[kind]})
            body = {**desired, "conditions": conditions}
            if self._pace is not None:
                self._pace()
            try:
                reply = self._api.patch_podgroup_status(namespace, name, {"status": body})
            except ApiError as err:
                self._record_error(group, err, report)
                return
            if reply is None:  # the PodGroup is gone (with its workload)
                self._record_missing(group, report)
                return
            uid = str((reply.get("metadata") or {}).get("uid") or "")
            if known is None:
                known = self._groups[group] = _Group(desired, transitions, uid)
            known.status, known.transitions, known.uid = desired, transitions, uid or known.uid
            if _blocked_in(desired):
                self._blocked.add(group)
            else:
                self._blocked.discard(group)
            report.pod_groups_patched += 1
        self._settle(group, finished)
        self._write_event(
            group, known, CONDITION_UNSCHEDULABLE, explanation(pending) if pending is not None else None, report
        )
        self._write_event(
            group, known, CONDITION_EVICTION_BLOCKED, (REASON_BUDGET, blocked) if blocked is not None else None, report
        )

    def _known(self, group: str) -> _Group | None:
        """What this writer knows ``group`` shows: what it wrote, else what its watched object shows."""
        known = self._groups.get(group)
        if known is not None:
            return known
        namespace, _, name = group.partition("/")
        obj = self._shown.get((namespace, name))
        status = obj.get("status") if obj is not None else None
        listed = status.get("conditions") if isinstance(status, dict) else None
        if not isinstance(status, dict) or not isinstance(listed, list):
            return None
        conditions: list[JSON] = []
        transitions: dict[str, str] = {}
        for condition in listed:
            if not isinstance(condition, dict):
                return None
            plain = {k: v for k, v in condition.items() if k != "lastTransitionTime"}
            when = condition.get("lastTransitionTime")
            if isinstance(when, str) and isinstance(plain.get("type"), str):
                transitions[plain["type"]] = when
            conditions.append(plain)
        meta = obj.get("metadata") if obj is not None else None
        uid = str(meta.get("uid") or "") if isinstance(meta, dict) else ""
        # Compared as a status written here would be: the phase and the
        # conditions without their times; a mismatch is simply written.
        known = _Group({"phase": status.get("phase"), "conditions": conditions}, transitions, uid)
        self._groups[group] = known
        return known

    def _settle(self, group: str, finished: Finished | None) -> None:
        """Note whether ``group``'s written status is its final one (see ``_final``)."""
        if finished is None:
            self._final.pop(group, None)
        else:
            self._final[group] = finished

    def _record_error(self, what: str, err: ApiError, report: StatusReport) -> None:
        if err.status == 404:
            self._record_missing(what, report)
        else:
            report.errors.append(f"{what}: {err}")
            log.warning("status_write_failed", object=what, status=err.status, error=err.detail)

    @staticmethod
    def _record_missing(what: str, report: StatusReport) -> None:
        report.missing.append(what)
        log.debug("status_object_missing", object=what)

    # -- Events ---------------------------------------------------------------

    def _write_event(
        self, group: str, known: _Group, kind: str, now: tuple[str, str] | None, report: StatusReport
    ) -> None:
        """One Event per group and kind, written when what it says changes (its count grows)."""
        state = known.event(kind)
        if now == state.explanation:
            return
        if now is None:
            state.explanation = None
            return
        namespace = group.partition("/")[0]
        reason, message = now
        stamp = format_time(self._clock())
        ev_name = event_name(group, kind)
        try:
            if state.count == 0:
                try:
                    self._api.create_event(namespace, self._event_body(group, known, kind, now, stamp))
                    state.count = 1
                except ApiError as err:
                    if err.status != 409:
                        raise
                    # Written by an earlier run of the scheduler: continue it
                    # (its count is not ours to know, so it is left alone).
                    self._api.patch_event(
                        namespace, ev_name, {"reason": reason, "message": message, "lastTimestamp": stamp}
                    )
                    state.count = 1
            else:
                count = state.count + 1
                self._api.patch_event(
                    namespace,
                    ev_name,
                    {"reason": reason, "message": message, "lastTimestamp": stamp, "count": count},
                )
                state.count = count
        except ApiError as err:
            # The explanation stays unrecorded, so the next cycle tries again.
            if err.status == 404 and state.count:
                state.count = 0  # expired (Events live an hour): create it anew next time
            report.errors.append(f"event {namespace}/{ev_name}: {err}")
            log.warning("pending_event_failed", pod_group=group, kind=kind, status=err.status, error=err.detail)
            return
        state.explanation = now
        report.events_written += 1

    def _event_body(self, group: str, known: _Group, kind: str, now: tuple[str, str], stamp: str) -> JSON:
        namespace, _, name = group.partition("/")
        involved: JSON = {
            "apiVersion": f"{contract.SCHEDULING_API_GROUP}/{contract.SCHEDULING_API_VERSION}",
            "kind": contract.PODGROUP_KIND,
            "name": name,
            "namespace": namespace,
        }
        if known.uid:
            involved["uid"] = known.uid
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": event_name(group, kind), "namespace": namespace},
            "involvedObject": involved,
            "type": "Warning",
            "reason": now[0],
            "message": now[1],
            "source": {"component": contract.SCHEDULER_COMPONENT},
            "reportingComponent": contract.SCHEDULER_COMPONENT,
            "reportingInstance": self._instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }

    # -- Queues ---------------------------------------------------------------

    def _write_queues(
        self,
        shares: Sequence[QueueShare],
        lost: Mapping[str, float],
        problems: Mapping[str, tuple[str, str]],
        report: StatusReport,
    ) -> None:
        by_queue: dict[str, list[QueueShare]] = {}
        for share in shares:
            by_queue.setdefault(share.queue, []).append(share)
        wanted: dict[str, JSON] = {}
        for queue, mine in by_queue.items():
            wanted[queue] = queue_status(mine)
        for queue, (reason, message) in problems.items():
            wanted[queue] = invalid_queue_status(reason, message)
        for queue, desired in sorted(wanted.items()):
            if queue in lost:
                desired[contract.QUEUE_STATUS_GPU_SECONDS_LOST] = lost[queue]
            known = self._queues.get(queue)
            if known == desired:
                report.unchanged += 1
                continue
            clock = self._clock()
            last = self._queue_written_at.get(queue)
            if (
                known is not None
                and last is not None
                and (clock - last).total_seconds() < self._queue_interval_s
                and _condition_states(known) == _condition_states(desired)
            ):
                report.deferred += 1
                continue
            now = format_time(clock)
            before = self._queue_transitions.get(queue, {})
            transitions: dict[str, str] = {}
            conditions = []
            for condition in desired["conditions"]:
                kind = condition["type"]
                was = _condition(known, kind) if known is not None else None
                same = was is not None and was["status"] == condition["status"] and kind in before
                transitions[kind] = before[kind] if same else now
                conditions.append({**condition, "lastTransitionTime": transitions[kind]})
            body = {**desired, "conditions": conditions}
            try:
                self._api.patch_queue_status(queue, {"status": body})
            except ApiError as err:
                self._record_error(f"queue {queue}", err, report)
                continue
            self._queues[queue] = desired
            self._queue_transitions[queue] = transitions
            self._queue_written_at[queue] = clock
            report.queues_patched += 1
