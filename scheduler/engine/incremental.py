"""Sessions that keep their working state from one cycle to the next.

:func:`~scheduler.engine.session.run_session` builds the working state from
the whole snapshot every time: at 5,000 nodes and 150,000 running pods that
build is most of a cycle (KAI's maintainers report the same of their
snapshot), although from one cycle to the next only a few pods and nodes
change. :class:`Engine` keeps the state instead. After a session it undoes
what the session did (every committed statement, through the same exact
inverse primitives a rollback uses, and the reservations' placeholders), so
the state is again the one its snapshot built; the next snapshot is then
applied as a difference: jobs and nodes whose objects are not the same
(the cycle's assembler hands unchanged ones over by identity) are taken out
and put back, and everything derived from all of them (fair shares,
reservations, the order of lists) is computed as the build computes it.

The contract is strict: ``Engine().run(s)`` returns exactly what
``run_session(s)`` returns, for every sequence of snapshots (a property
test holds it to that). Where the difference would be hard to apply
exactly, the state is simply built again: the queue tree or the config
changed, a node came or went or changed its pool or GPUs, the input had
duplicates or running pods with guessed GPUs (whose seating depends on the
order of the build), or a statement was left open. An exception in a
session or while applying a difference drops the kept state (it may be
half changed) and reaches the caller; the next session builds afresh.
"""

from __future__ import annotations

import bisect
import itertools
import operator
import time
from collections.abc import Mapping
from dataclasses import dataclass

from gpuwarden.logconfig import get_logger
from scheduler.engine.backlog import BacklogMemo
from scheduler.engine.build import JobBuilder, add_capacity, build_state, make_node, seat_running, share_out
from scheduler.engine.caches import PoolStatics
from scheduler.engine.fairshare import QueueTree
from scheduler.engine.model import Decisions, Job, Node, Reservation, Snapshot
from scheduler.engine.reservations import seat_reservations
from scheduler.engine.session import act, collector_paused
from scheduler.engine.state import Cluster, JobState, NodeState, TaskState
from scheduler.engine.statement import Statement

log = get_logger(__name__)


class _RebuildError(Exception):
    """The difference cannot be applied exactly: build the state from the snapshot."""


@dataclass(slots=True, eq=False)
class _Kept:
    cluster: Cluster
    builder: JobBuilder
    tree: QueueTree
    snapshot: Snapshot
    jobs: dict[str, JobState]
    # The same jobs by the identity of their spec: which of a snapshot's
    # jobs are new is then a difference of two key sets, at C speed.
    by_spec: dict[int, JobState]
    # Each pool's static verdicts on its nodes (placement's eligibility per
    # pod shape): good until one of the pool's nodes is replaced.
    statics: dict[str, PoolStatics]


def _dismantle(kept: _Kept) -> None:
    """Break the reference cycles of a kept state that is dropped, so that reference counting frees it.

    The working state is a graph of cycles (a task and its job, a task and
    its node, a node and its pool, a queue in its own path, a tree queue and
    its parent). The scheduler process collects only young garbage and
    freezes what survives (:mod:`scheduler.collector`): a kept state dropped
    whole (nodes came or went, the queues changed) would otherwise stay
    until the hourly sweep, at 150,000 pods about a hundred megabytes each
    time. Emptying the lists that point back is enough.
    """
    cluster = kept.cluster
    for job in itertools.chain(cluster.jobs, kept.jobs.values()):
        job.tasks.clear()
        job.reserved.clear()
        job.unplaced = None
    for node in cluster.nodes.values():
        node.tasks.clear()
    for pool in cluster.pools.values():
        pool.nodes.clear()
        for buckets in itertools.chain(pool.whole_buckets, pool.shared_buckets):
            buckets.clear()
    for queue in cluster.queues.values():
        queue.path.clear()
        queue.jobs.clear()
    for tree_queue in kept.tree.queues.values():
        tree_queue.children.clear()
    for held in (cluster.touched, cluster.pending_jobs, cluster.dated_gangs, cluster.reserving, cluster.sick):
        held.clear()
    cluster.journal = None
    cluster.dirty = None
    cluster.pod_index = None
    kept.statics.clear()


def _seat_order(task: TaskState) -> tuple[str, int]:
    """A node's holders in the order the build seats them: jobs by key, then each job's pods in its order.

    Placeholders are never among them: they are seated after this sort and
    taken out before the next.
    """
    return task.job.key, task.rank


class Engine:
    """``run_session`` for a process that schedules cycle after cycle.

    Not thread-safe: one scheduling loop owns it. ``rebuilds`` and
    ``updates`` count how each session's state came about (for metrics and
    benchmarks). ``memo``, when given, is what its sessions learn of the
    backlog and skip next time (:mod:`scheduler.engine.backlog`).
    """

    def __init__(self, memo: BacklogMemo | None = None) -> None:
        self.memo = memo
        self._kept: _Kept | None = None
        self.rebuilds = 0
        self.updates = 0

    def run(self, snapshot: Snapshot, timings: dict[str, float] | None = None) -> Decisions:
        """One session over ``snapshot``; ``timings`` as for ``run_session``, plus ``undo``."""
        with collector_paused():
            clock = time.perf_counter
            start = clock()
            try:
                kept = self._prepare(snapshot)
                cluster = kept.cluster
                built = clock()
                result = act(cluster, [("build", built - start)], timings, snapshot, self.memo, statics=kept.statics)
                start = clock()
                if not self._undo(kept):
                    self.drop()
            except BaseException:
                self.drop()  # half applied or half undone: the next session builds afresh
                if self.memo is not None:
                    self.memo.abandon()
                raise
            if timings is not None:
                timings["undo"] = clock() - start
            return result

    def drop(self) -> None:
        """Forget the kept state (the next session builds afresh), its reference cycles broken."""
        kept, self._kept = self._kept, None
        if kept is not None:
            _dismantle(kept)

    # -- before a session ---------------------------------------------------------

    def _prepare(self, snapshot: Snapshot) -> _Kept:
        kept = self._kept
        self._kept = None
        if kept is not None:
            try:
                self._apply(kept, snapshot)
            except _RebuildError as why:
                log.debug("engine_state_rebuilt", why=str(why))
                _dismantle(kept)
                kept = None
        if kept is None:
            kept = self._build(snapshot)
            self.rebuilds += 1
        else:
            self.updates += 1
        self._kept = kept
        return kept

    @staticmethod
    def _build(snapshot: Snapshot) -> _Kept:
        cluster, builder, tree = build_state(snapshot)
        cluster.journal = []
        cluster.dirty = set()
        by_key = {job.key: job for job in cluster.jobs}
        by_spec = {id(job.spec): job for job in cluster.jobs}
        return _Kept(cluster, builder, tree, snapshot, by_key, by_spec, {})

    def _apply(self, kept: _Kept, snapshot: Snapshot) -> None:
        """Bring the kept state (as its own snapshot built it) to ``snapshot``."""
        old = kept.snapshot
        if kept.builder.irregular:
            raise _RebuildError("the state was built from irregular input")
        if snapshot.config != old.config:
            raise _RebuildError("the config changed")
        if snapshot.queues != old.queues or snapshot.invalid_queues != old.invalid_queues:
            raise _RebuildError("the queues changed")
        cluster = kept.cluster
        changed = self._changed_nodes(cluster, snapshot.nodes, old.nodes)
        jobs = kept.jobs
        gone: list[JobState] = []
        added: list[Job] = []
        # The same job objects as last time (a cycle that changed only
        # statuses or nodes): nothing to diff, checked at C speed.
        if len(snapshot.jobs) != len(old.jobs) or not all(map(operator.is_, snapshot.jobs, old.jobs)):
            # Which specs came and went, by identity: the job lists are a
            # cluster's history and every cycle changes a handful of them.
            by_spec = kept.by_spec
            delta = job_delta(old.jobs, snapshot.jobs, by_spec)
            if delta is None:
                specs = dict(zip(map(id, snapshot.jobs), snapshot.jobs, strict=True))
                if len(specs) != len(snapshot.jobs):
                    raise _RebuildError("a job is listed twice")
                delta = (
                    [by_spec[i].spec for i in by_spec.keys() - specs.keys()],
                    [specs[i] for i in specs.keys() - by_spec.keys()],
                )
            gone = sorted((by_spec[id(spec)] for spec in delta[0]), key=_job_key)
            added = sorted(delta[1], key=_spec_key)
        for job in gone:
            self._remove(kept, job)
        for node, node_spec in changed:
            self._replace_node(kept, node, node_spec)
        if kept.builder.irregular:
            raise _RebuildError("a changed node's running pods had guessed GPUs")
        builder = kept.builder
        dirty = cluster.dirty
        assert dirty is not None
        for spec in added:
            key = spec.key
            if key in jobs:
                raise _RebuildError("a job is listed twice")
            # The builder appends to each list; the job goes where a build
            # in key order would have put it.
            job = builder.add(key, spec)
            jobs[key] = job
            kept.by_spec[id(spec)] = job
            for items in _lists_of(cluster, job):
                _move_last_in_order(items, job)
            for task in job.tasks:
                if task.node is not None:
                    dirty.add(task.node)
        if builder.irregular:
            raise _RebuildError("a new job had irregular pods")
        cluster.now = snapshot.now
        cluster.set_bystanders(snapshot.bystanders)
        share_out(cluster, kept.tree)
        self._canonical(kept, snapshot.reservations)
        kept.snapshot = snapshot

    @staticmethod
    def _changed_nodes(
        cluster: Cluster, nodes: tuple[Node, ...], before: tuple[Node, ...]
    ) -> list[tuple[NodeState, Node]]:
        if nodes is before or (len(nodes) == len(before) and all(map(operator.is_, nodes, before))):
            return []  # the kept state was built from these very objects
        if len(nodes) != len(cluster.nodes):
            raise _RebuildError("nodes came or went")
        seen: set[str] = set()
        changed: list[tuple[NodeState, Node]] = []
        for spec in nodes:
            state = cluster.nodes.get(spec.name)
            if state is None or spec.name in seen:
                raise _RebuildError("nodes came or went")
            seen.add(spec.name)
            if state.spec is spec:
                continue
            if spec.pool != state.spec.pool or [g.memory_mib for g in spec.gpus] != state.gpu_mem:
                # The pool's GPU sizes decide how slices are charged and what never fits.
                raise _RebuildError(f"node {spec.name} changed its pool or GPUs")
            changed.append((state, spec))
        return changed

    @staticmethod
    def _remove(kept: _Kept, job: JobState) -> None:
        """Unseat and uncharge a job that changed or went (the exact inverse of its build)."""
        cluster = kept.cluster
        for task in job.tasks:
            if task.node is not None:
                cluster.release(task)
        kept.builder.forget(job)
        for items in _lists_of(cluster, job):
            _take_out(items, job)
        queue = job.queue
        if queue is not None:
            for r, amount in enumerate(job.demand):
                queue.demand[r] -= amount
        del kept.jobs[job.key]
        del kept.by_spec[id(job.spec)]
        # Its tasks point back at it, so a job left to itself waits for the
        # cycle collector: under steady churn every departure did, and the
        # collections that found them paused every thread for 5-30 ms, a
        # few times a minute (single-pod churn, scheduler_soak.py). Nothing
        # reads a removed job again; without these references it goes as
        # its last reference does.
        job.tasks = []
        job.reserved = []
        job.unplaced = None

    @staticmethod
    def _replace_node(kept: _Kept, old: NodeState, spec: Node) -> None:
        """A node whose object changed (health, labels, taints): a new state in the old one's place."""
        cluster = kept.cluster
        holders = sorted(old.tasks, key=_seat_order)
        for task in holders:
            cluster.release(task)
        cluster.unindex(old)
        add_capacity(old, -1)
        pool = old.pool
        node = make_node(spec, pool, old.pidx)
        pool.nodes[old.pidx] = node
        pool.intact = None  # summed from its nodes' specs (scheduler.engine.decisions)
        cluster.nodes[spec.name] = node
        kept.statics.pop(pool.name, None)
        if old.is_sick or node.is_sick:
            cluster.find_sick()
        add_capacity(node)
        for task in holders:
            if seat_running(cluster.nodes, task):
                kept.builder.irregular += 1
            queue = task.job.queue
            if queue is not None:
                Cluster.charge(queue, task.job.preemptible, task.milli, task.cpu, task.mem)
        dirty = cluster.dirty
        assert dirty is not None
        dirty.add(node)

    @staticmethod
    def _canonical(kept: _Kept, reservations: tuple[Reservation, ...]) -> None:
        """Indexes up to date and every list in the order a fresh build leaves it.

        Placement walks index buckets in insertion order and health
        eviction walks a node's holders in theirs; a build inserts nodes by
        pool index and holders by job key, so those lists are sorted back
        into that order wherever a holder came or went. Reservations are
        seated last, as the build seats them.
        """
        cluster = kept.cluster
        dirty = cluster.dirty
        assert dirty is not None
        live = [node for node in dirty if cluster.nodes.get(node.name) is node]
        for node in live:
            node.tasks.sort(key=_seat_order)
        live.extend(seat_reservations(cluster, reservations, kept.jobs))
        buckets: dict[int, dict[int, NodeState]] = {}
        for node in live:
            cluster.refresh_index(node)
            pool = node.pool
            if node.bucket is not None:
                bucket = pool.whole_buckets[node.tier][node.bucket]
                buckets[id(bucket)] = bucket
            if node.shared_key is not None:
                bucket = pool.shared_buckets[node.tier][node.shared_key]
                buckets[id(bucket)] = bucket
        for bucket in buckets.values():
            ordered = sorted(bucket.items())
            bucket.clear()
            bucket.update(ordered)
        dirty.clear()

    # -- after a session ----------------------------------------------------------

    @staticmethod
    def _undo(kept: _Kept) -> bool:
        """Take back everything the session did, so the state is its snapshot's again.

        False if it cannot be: a statement was left neither committed nor
        rolled back, so what it applied is in no journal.
        """
        cluster = kept.cluster
        journal = cluster.journal
        assert journal is not None
        if cluster.applied != len(journal):
            log.warning("engine_state_dropped", open_entries=cluster.applied - len(journal))
            return False
        Statement(cluster).undo_committed()
        for job in cluster.reserving:
            for held in job.reserved:
                placeholder = held.placeholder
                if placeholder is not None and placeholder.node is not None:
                    cluster.release(placeholder)
            job.reserved = []
            job.awaiting_room = False
        cluster.reserving = []
        # What a session notes on a job (its reasons, what reclaim tried,
        # the pod that found no room) it notes only on a job with a pending
        # pod: the others keep nothing of it to take back.
        for job in cluster.pending_jobs:
            if job.reasons:
                job.reasons = []
            if job.notes:
                job.notes = []
            job.unplaced = None
            job.awaiting_room = False
        dirty = cluster.dirty
        assert dirty is not None
        for node in dirty:
            node.evicted_here = False
        cluster.touched = []
        cluster.release_version = 0
        cluster.commit_version = 0
        return True


# How many jobs may come, go or be replaced between two snapshots before
# job_delta leaves the diff to sets: each costs it a few object creations.
_DELTA_LIMIT = 64


def job_delta(
    old: tuple[Job, ...], new: tuple[Job, ...], known: Mapping[int, object]
) -> tuple[list[Job], list[Job]] | None:
    """The jobs of ``old`` not in ``new``, and of ``new`` not in ``old``, by identity; None if not cheaply told.

    ``known`` holds ``id`` of every job of ``old``. The snapshot lists jobs
    in the order the assembler keeps them (a replaced job where it was, a
    new one after the others), so between two cycles both tuples are the
    same objects in the same order but for a few. Runs of the same objects
    are skipped at C speed; at each difference, a job of ``new`` that was
    not in ``old`` is added, and otherwise the job of ``old`` there is gone.
    With 2,200 jobs, building a dict of the new tuple and two set
    differences took a fifth of the incremental engine's cycle; this costs
    what changed plus a scan. None (the caller diffs by sets) when more
    than ``_DELTA_LIMIT`` changed, or when a job of ``old`` shows up out of
    its order, which this walk would misread as gone.
    """
    gone: list[Job] = []
    added: list[Job] = []
    i = j = 0
    n_old, n_new = len(old), len(new)
    olds, news = iter(old), iter(new)
    # Whether old[i] (new[j]) was taken from its iterator by the last scan and must be given back.
    old_taken = new_taken = False
    while i < n_old and j < n_new:
        if len(gone) + len(added) > _DELTA_LIMIT:
            return None
        left = itertools.chain((old[i],), olds) if old_taken else olds
        right = itertools.chain((new[j],), news) if new_taken else news
        first = next(itertools.compress(itertools.count(), map(operator.is_not, left, right)), None)
        if first is None:  # the same objects to the end of the shorter tuple
            run = min(n_old - i, n_new - j)
            i += run
            j += run
            break
        i += first
        j += first
        if id(new[j]) in known:  # a job of old's, out of step: the one of old's here is gone
            gone.append(old[i])
            i += 1
            old_taken, new_taken = False, True
        else:
            added.append(new[j])
            j += 1
            old_taken, new_taken = True, False
    gone.extend(old[i:])
    for spec in new[j:]:
        if id(spec) in known:
            return None
        added.append(spec)
    return gone, added


def _job_key(job: JobState) -> str:
    return job.key


def _spec_key(spec: Job) -> str:
    return spec.key


def _lists_of(cluster: Cluster, job: JobState) -> list[list[JobState]]:
    """The key-ordered lists a build puts ``job`` in (see :meth:`JobBuilder.add`)."""
    lists = [cluster.jobs]
    if job.queue is not None:
        lists.append(job.queue.jobs)
    if job.has_pending:
        lists.append(cluster.pending_jobs)
    if job.spec.below_min_member_since is not None:
        lists.append(cluster.dated_gangs)
    return lists


def _move_last_in_order(items: list[JobState], job: JobState) -> None:
    """Move ``job``, which the builder has just appended to ``items``, to its place in key order."""
    if not items or items[-1] is not job:
        raise _RebuildError("the builder did not list a new job where expected")
    items.pop()
    bisect.insort(items, job, key=_job_key)


def _take_out(items: list[JobState], job: JobState) -> None:
    """Remove ``job`` from the key-ordered ``items``."""
    at = bisect.bisect_left(items, job.key, key=_job_key)
    if at == len(items) or items[at] is not job:
        raise _RebuildError(f"job {job.key} is not where key order puts it")
    del items[at]
