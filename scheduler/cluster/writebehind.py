"""A cycle's bookkeeping writes, sent behind it on one thread, never holding it up.

What a cycle writes once its binds are out -- the derived PodGroups it found
missing, owners read again for groups whose spec drifted, PodGroup and Queue
status with their Events -- says what the cluster is; it decides nothing.
Only the newest of it matters, so the cycle hands each batch to this writer
and goes on. One batch is written at a time. A batch that arrives while
another is being written waits, and the batches of the cycles after it are
merged into the waiting one instead of queuing behind it.

Before, the cycle waited once a fixed number of batches were queued. Under
steady churn a cycle runs every few milliseconds, so the periodic flush of
the statuses deferred while binding (hundreds of PodGroups created and
written, seconds of API calls) filled that queue at once and held the
scheduling loop, and every pod that arrived meanwhile, for the whole flush.

Merging keeps what sequential writes would have left behind
(:meth:`WriteBatch.then`): the newest cycle's pending reasons, queue shares
and job facts; every group any merged cycle bound, created, refused an
eviction for or read the owners of; GPU-seconds lost summed over the merged
cycles, added to what the newest view's Queue shows; and the statuses
deferred while binding written as soon as any merged cycle asked for them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any

from gpuwarden.logconfig import get_logger
from scheduler.cluster.fence import LeaseLostError
from scheduler.cluster.grouping import GroupSpec
from scheduler.cluster.status import Finished, MembershipChange
from scheduler.engine.model import Decisions

log = get_logger(__name__)

GroupKey = tuple[str, str]  # namespace, name


@dataclass(frozen=True, slots=True)
class WriteBatch:
    """One cycle's bookkeeping, or several cycles' merged (see :meth:`then`)."""

    # Derived PodGroups to create, and groups whose owners are read again.
    specs: Mapping[GroupKey, GroupSpec]
    drifted: Mapping[GroupKey, tuple[GroupSpec, Mapping[str, Any]]]
    # Binds of every merged cycle; pending reasons and queue shares of the newest.
    decisions: Decisions
    gang_met: Collection[str]
    finished: Mapping[str, Finished]
    blocked: Mapping[str, str]
    shown_blocked: frozenset[str]
    # GPU-seconds lost to faults per queue in the merged cycles, and the
    # newest view's Queue objects, which show the total written so far.
    lost: Mapping[str, float]
    queues: Mapping[str, Mapping[str, Any]]
    queue_problems: Mapping[str, tuple[str, str]]
    defer_placed: bool
    # The cycles merged into this batch.
    cycles: int = 1
    # The PodGroups the newest cycle's view held (the status writer's "shown").
    podgroups: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    # The PodGroups added, replaced or deleted in the merged cycles' views
    # (None: any may have; the view was read whole).
    podgroups_changed: frozenset[tuple[str, str]] | None = frozenset()
    # The groups whose entry in ``finished`` changed in the merged cycles
    # (None: any may have; the status writer then looks at every one).
    finished_changed: frozenset[str] | None = None
    # The binds the merged cycles sent in the background: their bookkeeping
    # goes out once they are answered, as it did when the cycle waited for
    # them, so that its creates and status patches (and the writer's own
    # work, which takes the interpreter's lock from the bind threads) never
    # come between a bind and the API server.
    after: tuple[Future[Any], ...] = ()
    # The groups that entered or left ``gang_met`` since the version the
    # oldest merged cycle's change was made on (None: unknown, the status
    # writer then looks at every running group).
    gang_met_changed: MembershipChange | None = None

    def then(self, newer: WriteBatch) -> WriteBatch:
        """This batch and the ``newer`` one, as one batch that leaves what writing both in turn would."""
        lost = dict(self.lost)
        for queue, seconds in newer.lost.items():
            lost[queue] = lost.get(queue, 0.0) + seconds
        return WriteBatch(
            specs={**self.specs, **newer.specs},
            drifted={**self.drifted, **newer.drifted},
            decisions=replace(newer.decisions, binds=self.decisions.binds + newer.decisions.binds),
            gang_met=newer.gang_met,
            gang_met_changed=(
                self.gang_met_changed.then(newer.gang_met_changed, self.gang_met)
                if self.gang_met_changed is not None
                else None
            ),
            finished=newer.finished,
            blocked={**self.blocked, **newer.blocked},
            shown_blocked=newer.shown_blocked,
            lost=lost,
            queues=newer.queues,
            queue_problems=newer.queue_problems,
            defer_placed=self.defer_placed and newer.defer_placed,
            cycles=self.cycles + newer.cycles,
            podgroups=newer.podgroups,
            podgroups_changed=(
                None
                if self.podgroups_changed is None or newer.podgroups_changed is None
                else self.podgroups_changed | newer.podgroups_changed
            ),
            after=self.after + newer.after,
            finished_changed=(
                None
                if self.finished_changed is None or newer.finished_changed is None
                else self.finished_changed | newer.finished_changed
            ),
        )


@dataclass
class WriteBehind:
    """Writes batches with ``write`` on one background thread, at most one waiting; thread-safe.

    :meth:`submit` never blocks. :meth:`flush` waits until everything
    submitted so far is written (tests, and the runner before it lets go of
    the lease); :meth:`close` flushes and stops the thread.
    """

    write: Callable[[WriteBatch], None]
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _waiting: WriteBatch | None = None
    _draining: Future[None] | None = None
    _pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="cycle-writes"))
    merged: int = 0  # cycles whose batch was merged into a waiting one, for tests and logs

    def submit(self, batch: WriteBatch) -> None:
        with self._lock:
            if self._waiting is not None:
                self._waiting = self._waiting.then(batch)
                self.merged += batch.cycles
            else:
                self._waiting = batch
            if self._draining is None:
                self._draining = self._pool.submit(self._drain)

    def flush(self) -> None:
        while True:
            with self._lock:
                draining = self._draining
            if draining is None:
                return
            draining.result()

    def close(self) -> None:
        self.flush()
        self._pool.shutdown()

    def _drain(self) -> None:
        while True:
            with self._lock:
                batch = self._waiting
                self._waiting = None
                if batch is None:
                    self._draining = None
                    return
            try:
                wait(batch.after)
                self.write(batch)
            except LeaseLostError as error:
                log.info("cycle_writes_fenced", error=str(error))  # the lease went; the runner starts over
            except Exception as error:  # one bad batch must not stop the writes of the next
                log.error("cycle_writes_failed", error=repr(error), cycles=batch.cycles)
            except BaseException:
                # Not ours to swallow (an interpreter exit), but the next
                # submit must still find no drain running and start one.
                with self._lock:
                    self._draining = None
                raise
