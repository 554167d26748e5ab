"""The engine's Snapshot, assembled each cycle from conversions made once per object.

:func:`scheduler.cluster.convert.snapshot_from` converts every Node, GPUNode
and Pod on every call: at 5,000 nodes and 150,000 pods that is over a second
a cycle, spent again on objects that did not change. The watch cache never
changes an entry in place (an update replaces it, :mod:`.cache`), so an
entry that is the same object as last cycle's has the same conversion. A
:class:`SnapshotAssembler` keeps, per key, the entry it last saw and what
was read from it:

- per node, the engine Node, redone when the Node or its GPUNode entry is a
  different object;
- per pod, what deciding its place in the snapshot needs (terminal phase,
  scheduler, binding, gates, namespace, annotated group, creation time) and
  its engine Task, converted on first use (a finished pod of ours has none:
  it is only counted in its group's ``succeeded`` or ``failed``);
- per pod group, its Job, reused while the group's info, its tasks and its
  earliest creation time are unchanged.

Told what changed since the previous call (:class:`Changes`: the keys the
watch cache logged, the groups whose info changed, the pods whose derived
group changed), it goes further and touches only those: it keeps each
group's members and each node's other-scheduler pods, re-places the pods
that changed (and the pods of a group that appeared or vanished), and
rebuilds only the jobs and external jobs they belong to. Without changes it
places every pod, as on the first cycle.

Either way the result is ``snapshot_from`` over the same objects, up to the
order of jobs and of pods within a job, which the engine does not depend on
(it sorts both; :func:`canonical` puts two snapshots in one order to compare
them). tests/scheduler/cluster/test_assemble.py checks it after random event
sequences, with and without change lists; a change to the rules is made in
:mod:`.convert`, whose helpers this module calls.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuwarden.contract import ANNOTATION_POD_GROUP, SCHEDULER_NAME
from gpuwarden.logconfig import get_logger
from scheduler.cluster.convert import (
    GroupInfo,
    creation_epoch,
    external_job,
    external_task_from_pod,
    is_bystander,
    keyed_node,
    takes_work,
    task_from_pod,
    task_order,
    warn,
    with_external_queues,
)
from scheduler.cluster.sliceadmission import SliceAdmission
from scheduler.engine.model import Job, Node, Queue, SchedulerConfig, Snapshot, Task

log = get_logger(__name__)

# What a pod is to the snapshot, whatever the groups are this cycle.
_SKIP = 0  # malformed, another scheduler's unbound or finished pod, or ours pending but deleted or gated
_FOREIGN = 1  # another scheduler's bound pod: holds capacity on its node
_OURS = 2  # ours: placed by its group (or counted there, once finished), if the group is known

# How a pod of ours has finished: not yet, successfully, or not.
_ACTIVE = 0
_SUCCEEDED = 1
_FAILED = 2

_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(slots=True)
class _PodFacts:
    """What one cache entry of a pod says, read once; ``obj`` is the entry it was read from."""

    obj: Any
    kind: int
    node: str = ""
    namespace: str = ""
    name: str = ""
    uid: str = ""
    group: str | None = None
    created: str | None = None
    finished: int = _ACTIVE
    task: Task | None = None
    external: Task | None = None

    def our_task(self, admission: SliceAdmission | None) -> Task:
        if self.task is None:
            self.task = task_from_pod(self.obj, admission)
        return self.task

    def foreign_task(self) -> Task:
        if self.external is None:
            self.external = external_task_from_pod(self.obj)
        return self.external


def _read_pod(pod: object) -> _PodFacts:
    """The same reading, field by field, as :func:`~scheduler.cluster.convert.snapshot_from`'s loop."""
    if not isinstance(pod, dict):
        warn.warning("pod malformed", ("pod", type(pod).__name__), value=repr(pod)[:200])
        return _PodFacts(pod, _SKIP)
    spec = pod.get("spec")
    status = pod.get("status")
    if not isinstance(spec, dict):
        spec = {}
    phase = status.get("phase") if isinstance(status, dict) else None
    finished = _ACTIVE
    if isinstance(phase, str) and phase in _TERMINAL_PHASES:
        finished = _SUCCEEDED if phase == "Succeeded" else _FAILED
    raw_node = spec.get("nodeName")
    node = raw_node if isinstance(raw_node, str) else ""
    if spec.get("schedulerName") != SCHEDULER_NAME:
        return _PodFacts(pod, _FOREIGN if node and not finished else _SKIP, node)
    meta = pod.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
    if not finished and not node and (meta.get("deletionTimestamp") or spec.get("schedulingGates")):
        return _PodFacts(pod, _SKIP)
    raw_namespace = meta.get("namespace")
    annotations = meta.get("annotations")
    group = annotations.get(ANNOTATION_POD_GROUP) if isinstance(annotations, dict) else None
    uid = meta.get("uid")
    name = meta.get("name")
    created = meta.get("creationTimestamp")
    return _PodFacts(
        pod,
        _OURS,
        node,
        namespace=(raw_namespace if isinstance(raw_namespace, str) else "") or "default",
        name=name if isinstance(name, str) else "",
        uid=uid if isinstance(uid, str) else "",
        group=group if isinstance(group, str) and group else None,
        created=created if isinstance(created, str) else None,
        finished=finished,
    )


@dataclass(slots=True)
class _JobMemo:
    info: GroupInfo
    tasks: tuple[Task, ...]
    finished: tuple[int, int]  # succeeded, failed
    stamp: str
    job: Job


@dataclass(slots=True)
class _NodeMemo:
    node: object
    gpunode: object
    value: Node


@dataclass(frozen=True, slots=True)
class Changes:
    """What changed since the assembler's previous snapshot.

    ``nodes``: names whose Node or GPUNode entry changed; ``pods``: keys of
    pod entries added, replaced or removed; ``groups``: group keys whose
    info changed, appeared or vanished; ``pod_groups``: UIDs whose derived
    group changed.
    """

    nodes: Collection[str] = frozenset()
    pods: Collection[str] = frozenset()
    groups: Collection[tuple[str, str]] = frozenset()
    pod_groups: Collection[str] = frozenset()


@dataclass(frozen=True, slots=True)
class JobChanges:
    """The jobs whose object one snapshot replaced, added or dropped, numbered by snapshot.

    ``jobs`` maps each such job's key to its new object (finished or not),
    or to None when it is gone; it is None for a snapshot built afresh. A
    pass that keeps per-job results works on these alone, and reads
    everything when it missed a snapshot (a cycle that failed before it
    ran): :meth:`after` tells it which.
    """

    serial: int
    jobs: Mapping[str, Job | None] | None

    def after(self, serial: int | None) -> Mapping[str, Job | None] | None:
        """The changes for a pass that last read snapshot number ``serial``; None: read every job."""
        return self.jobs if serial is not None and serial + 1 == self.serial else None


@dataclass(slots=True)
class _Place:
    """Where one pod entry counts in the kept state, so that it can be taken out again."""

    facts: _PodFacts
    wanted: tuple[str, str] | None = None  # the group it names or was given, known or not
    uid: str | None = None  # indexed by uid: it names no group, so pod_groups may give it one
    member: tuple[str, str] | None = None  # the job it is a task of
    foreign: str = ""  # the node whose external job holds it
    held: str = ""  # the node on which it holds GPU indices


def canonical(snapshot: Snapshot) -> Snapshot:
    """``snapshot`` with its jobs by key and each job's pods by namespace, name and uid.

    The engine reads a snapshot in this order whatever order it comes in,
    so two snapshots equal after this give the same decisions.
    """
    jobs = sorted(
        (replace(job, tasks=tuple(sorted(job.tasks, key=task_order))) for job in snapshot.jobs),
        key=lambda job: job.key,
    )
    return replace(snapshot, nodes=tuple(sorted(snapshot.nodes, key=lambda n: n.name)), jobs=tuple(jobs))


def _facts_order(facts: _PodFacts) -> tuple[str, str, str]:
    return (facts.namespace, facts.name, facts.uid)


@dataclass(slots=True)
class _State:
    """What the previous snapshot was made of, kept to update it by what changed."""

    engine_nodes: dict[str, Node] = field(default_factory=dict)
    # The snapshot's tuple of them, the same object until one changes: the
    # engine and the cycle then know at once that no node did.
    nodes_out: tuple[Node, ...] | None = None
    places: dict[str, _Place] = field(default_factory=dict)
    wanting: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    keys_of_uid: dict[str, set[str]] = field(default_factory=dict)
    members: dict[tuple[str, str], dict[str, _PodFacts]] = field(default_factory=dict)
    foreign: dict[str, dict[str, _PodFacts]] = field(default_factory=dict)
    held: dict[str, dict[str, tuple[int, ...]]] = field(default_factory=dict)
    # The jobs with a pod left to run or to place, and those with none (finished).
    jobs: dict[tuple[str, str], Job] = field(default_factory=dict)
    done: dict[tuple[str, str], Job] = field(default_factory=dict)
    externals: dict[str, Job] = field(default_factory=dict)
    # The pool of each node with an external job, and how many such nodes
    # each pool has: the pools that need a reserved queue, kept as external
    # jobs come and go (a pass over every node with one was a cycle's cost).
    external_pool: dict[str, str] = field(default_factory=dict)
    pool_externals: dict[str, int] = field(default_factory=dict)
    # The queues of the last snapshot, with the queues and pools they were made of.
    queues_out: tuple[Sequence[Queue], frozenset[str], tuple[Queue, ...]] | None = None
    # Per node that takes no work, other schedulers' pods there that placement rules read.
    bystanders: dict[str, tuple[Task, ...]] = field(default_factory=dict)
    known_groups: set[tuple[str, str]] = field(default_factory=set)
    # Jobs none of whose pods has a creation time: created "now", so rebuilt every time.
    unstamped: set[tuple[str, str]] = field(default_factory=set)


class SnapshotAssembler:
    """Snapshots from cache views, each object converted once per version; one per scheduling loop.

    Not thread-safe: the loop that runs the cycles owns it.
    """

    def __init__(self, admission: SliceAdmission | None = None) -> None:
        # As for snapshot_from: what a pending slice pod must carry to be placed.
        self._admission = admission
        self._nodes: dict[str, _NodeMemo] = {}
        self._pods: dict[str, _PodFacts] = {}
        self._jobs: dict[tuple[str, str], _JobMemo] = {}
        self._state = _State()
        # What the last snapshot changed of the jobs (their keys include the
        # external jobs'); the cycle's passes after the assembler work on
        # these alone (:mod:`.cycle`).
        self.job_changes = JobChanges(0, None)

    @property
    def finished_jobs(self) -> Mapping[tuple[str, str], Job]:
        """The jobs of the last snapshot none of whose pods is left to run (see ``finished_apart``)."""
        return self._state.done

    def has_job(self, key: tuple[str, str]) -> bool:
        """Whether the last snapshot has the group ``key`` as a job, finished or not."""
        state = self._state
        return key in state.jobs or key in state.done

    def pod_facts(self, key: str, pod: Mapping[str, Any]) -> _PodFacts:
        """What ``pod`` (the cache's entry under ``key``) says; read anew only when the entry was replaced."""
        facts = self._pods.get(key)
        if facts is None or facts.obj is not pod:
            facts = _read_pod(pod)
            self._pods[key] = facts
        return facts

    def _node(self, name: str, obj: Mapping[str, Any], gpunode: Mapping[str, Any] | None) -> Node:
        memo = self._nodes.get(name)
        if memo is None or memo.node is not obj or memo.gpunode is not gpunode:
            memo = _NodeMemo(obj, gpunode, keyed_node(name, obj, gpunode))
            self._nodes[name] = memo
        return memo.value

    def snapshot(  # noqa: PLR0917 (the order of snapshot_from's parameters)
        self,
        nodes: Mapping[str, Mapping[str, Any]],
        gpunodes: Mapping[str, Mapping[str, Any]],
        pods: Mapping[str, Mapping[str, Any]],
        queues: Sequence[Queue],
        groups: Mapping[tuple[str, str], GroupInfo],
        now: float,
        config: SchedulerConfig,
        *,
        pod_groups: Mapping[str, str] | None = None,
        changes: Changes | None = None,
        finished_apart: bool = False,
    ) -> Snapshot:
        """``snapshot_from(nodes, gpunodes, pods.values(), ...)``, from memoized conversions.

        ``pods`` is keyed by anything that names a pod for as long as it lives
        (the cycle uses UIDs); the rest is as for ``snapshot_from``.
        ``changes`` says what changed since the previous call (the caller
        vouches for it); without it every pod is placed again.
        ``finished_apart`` leaves the jobs none of whose pods is left to run
        out of the snapshot's jobs; :attr:`finished_jobs` has them.
        """
        by_uid = pod_groups or {}
        state = self._state
        dirty_jobs: set[tuple[str, str]] = set()
        dirty_nodes: set[str] = set()
        before: dict[str, Job | None] | None = None
        if changes is None:
            state = self._state = _State()
            for name, obj in nodes.items():
                state.engine_nodes[name] = self._node(name, obj, gpunodes.get(name))
            if len(self._nodes) > len(nodes):
                self._nodes = {name: memo for name, memo in self._nodes.items() if name in nodes}
            state.known_groups = set(groups)
            facts_of = self.pod_facts
            for key, pod in pods.items():
                self._place(key, facts_of(key, pod), groups, by_uid, dirty_jobs, dirty_nodes)
            if len(self._pods) > len(pods) + max(1024, len(pods) // 4):
                self._pods = {key: facts for key, facts in self._pods.items() if key in pods}
            dirty_nodes.update(state.engine_nodes)
        else:
            for name in changes.nodes:
                node_obj = nodes.get(name)
                if node_obj is None:
                    if state.engine_nodes.pop(name, None) is not None:
                        state.nodes_out = None
                    self._nodes.pop(name, None)
                else:
                    engine_node = self._node(name, node_obj, gpunodes.get(name))
                    if state.engine_nodes.get(name) is not engine_node:
                        state.engine_nodes[name] = engine_node
                        state.nodes_out = None
                dirty_nodes.add(name)
            again = set(changes.pods)
            for uid in changes.pod_groups:
                again.update(state.keys_of_uid.get(uid, ()))
            for gkey in changes.groups:
                dirty_jobs.add(gkey)
                present = gkey in groups
                if present != (gkey in state.known_groups):
                    again.update(state.wanting.get(gkey, ()))
                    if present:
                        state.known_groups.add(gkey)
                    else:
                        state.known_groups.discard(gkey)
            for key in again:
                self._unplace(key, dirty_jobs, dirty_nodes)
                entry = pods.get(key)
                if entry is None:
                    self._pods.pop(key, None)
                else:
                    self._place(key, self.pod_facts(key, entry), groups, by_uid, dirty_jobs, dirty_nodes)
            dirty_jobs.update(state.unstamped)
            before = self._jobs_of(dirty_jobs, dirty_nodes)

        for gkey in dirty_jobs:
            self._assemble_job(gkey, groups, now)
        if len(self._jobs) > len(state.jobs) + len(state.done) + 1024:
            self._jobs = {key: memo for key, memo in self._jobs.items() if key in state.jobs or key in state.done}
        pools = self._externals(dirty_nodes)
        changed = None if before is None else self._changed_jobs(before, dirty_jobs, dirty_nodes)
        self.job_changes = JobChanges(self.job_changes.serial + 1, changed)
        done = () if finished_apart else tuple(state.done.values())
        return Snapshot(
            nodes=self._nodes_out(),
            queues=self._queues(queues, pools),
            jobs=(*state.jobs.values(), *done, *state.externals.values()),
            now=now,
            config=config,
            bystanders=tuple(sorted((t for ts in state.bystanders.values() for t in ts), key=task_order)),
        )

    def _nodes_out(self) -> tuple[Node, ...]:
        state = self._state
        if state.nodes_out is None:
            state.nodes_out = tuple(state.engine_nodes.values())
        return state.nodes_out

    def _jobs_of(self, dirty_jobs: set[tuple[str, str]], dirty_nodes: set[str]) -> dict[str, Job | None]:
        """The jobs (finished or not, and the external jobs of ``dirty_nodes``) the state holds now, by key."""
        state = self._state
        found: dict[str, Job | None] = {}
        for gkey in dirty_jobs:
            job = state.jobs.get(gkey) or state.done.get(gkey)
            if job is not None:
                found[job.key] = job
        for name in dirty_nodes:
            external = state.externals.get(name)
            if external is not None:
                found[external.key] = external
        return found

    def _changed_jobs(
        self, before: Mapping[str, Job | None], dirty_jobs: set[tuple[str, str]], dirty_nodes: set[str]
    ) -> dict[str, Job | None]:
        """The jobs whose object is not the one ``before`` held (see :class:`JobChanges`)."""
        after = self._jobs_of(dirty_jobs, dirty_nodes)
        changed = {key: job for key, job in after.items() if before.get(key) is not job}
        for key in before:
            if key not in after:
                changed[key] = None
        return changed

    def _place(  # noqa: PLR0917 (one call site per mode, all positional)
        self,
        key: str,
        facts: _PodFacts,
        groups: Mapping[tuple[str, str], GroupInfo],
        by_uid: Mapping[str, str],
        dirty_jobs: set[tuple[str, str]],
        dirty_nodes: set[str],
    ) -> None:
        """Count the pod entry where ``snapshot_from``'s loop would, and remember where."""
        kind = facts.kind
        if kind == _SKIP:
            return
        state = self._state
        place = _Place(facts)
        state.places[key] = place
        if kind == _FOREIGN:
            self._add_foreign(place, key, facts.node, dirty_nodes)
            return
        group = facts.group
        if group is None:
            uid = facts.uid
            place.uid = uid
            keys = state.keys_of_uid.get(uid)
            if keys is None:
                state.keys_of_uid[uid] = {key}
            else:
                keys.add(key)
            group = by_uid.get(uid)
        gkey = (facts.namespace, group) if group else None
        if gkey is not None:
            place.wanted = gkey
            wanting = state.wanting.get(gkey)
            if wanting is None:
                state.wanting[gkey] = {key}
            else:
                wanting.add(key)
        if gkey is None or gkey not in groups:
            if facts.finished:
                return  # holds nothing, and counts for no group yet
            ident = f"{facts.namespace}/{facts.name}"
            if facts.node:
                self._add_foreign(place, key, facts.node, dirty_nodes)
                warn.warning("bound pod has no known pod group; counted as held", ("nogroup", ident), pod=ident)
            else:
                # Usually a race (the operator's PodGroup is a watch event behind its
                # pods); one that lasts is told on the pod (scheduler.cluster.ungrouped).
                log.debug("pending_pod_waits_for_its_pod_group", pod=ident, group=group)
            return
        place.member = gkey
        members = state.members.get(gkey)
        if members is None:
            state.members[gkey] = {key: facts}
        else:
            members[key] = facts
        dirty_jobs.add(gkey)
        if facts.finished:
            return  # counted by its group, holding nothing
        task = facts.task or facts.our_task(self._admission)
        if task.gpu_indices and task.node is not None:
            place.held = task.node
            held = state.held.get(task.node)
            if held is None:
                state.held[task.node] = {key: task.gpu_indices}
            else:
                held[key] = task.gpu_indices
            dirty_nodes.add(task.node)

    def _add_foreign(self, place: _Place, key: str, node: str, dirty_nodes: set[str]) -> None:
        place.foreign = node
        pods = self._state.foreign.get(node)
        if pods is None:
            self._state.foreign[node] = {key: place.facts}
        else:
            pods[key] = place.facts
        dirty_nodes.add(node)

    def _unplace(self, key: str, dirty_jobs: set[tuple[str, str]], dirty_nodes: set[str]) -> None:
        """Take the pod entry out of everything :meth:`_place` put it in."""
        state = self._state
        place = state.places.pop(key, None)
        if place is None:
            return
        if place.wanted is not None:
            _discard(state.wanting, place.wanted, key)
        if place.uid is not None:
            _discard(state.keys_of_uid, place.uid, key)
        if place.member is not None:
            _discard(state.members, place.member, key)
            dirty_jobs.add(place.member)
        if place.foreign:
            _discard(state.foreign, place.foreign, key)
            dirty_nodes.add(place.foreign)
        if place.held:
            _discard(state.held, place.held, key)
            dirty_nodes.add(place.held)

    def _assemble_job(self, gkey: tuple[str, str], groups: Mapping[tuple[str, str], GroupInfo], now: float) -> None:
        state = self._state
        members = state.members.get(gkey)
        info = groups.get(gkey)
        if not members or info is None:
            state.jobs.pop(gkey, None)
            state.done.pop(gkey, None)
            state.unstamped.discard(gkey)
            self._jobs.pop(gkey, None)
            return
        ordered = sorted(members.values(), key=_facts_order) if len(members) > 1 else list(members.values())
        stamp: str | None = None
        tasks: list[Task] = []
        succeeded = failed = 0
        for facts in ordered:
            if facts.finished == _SUCCEEDED:
                succeeded += 1
            elif facts.finished == _FAILED:
                failed += 1
            else:
                tasks.append(facts.task or facts.our_task(self._admission))
            created = facts.created
            if created is not None and (stamp is None or created < stamp):
                stamp = created
        job = self._job(gkey, info, tasks, (succeeded, failed), stamp, now)
        if tasks:
            state.jobs[gkey] = job
            state.done.pop(gkey, None)
        else:
            state.done[gkey] = job
            state.jobs.pop(gkey, None)
        if stamp is None:
            state.unstamped.add(gkey)
        else:
            state.unstamped.discard(gkey)

    def _externals(self, dirty_nodes: set[str]) -> frozenset[str]:
        """Rebuild the external jobs of ``dirty_nodes``; the pools external jobs are in."""
        state = self._state
        externals = state.externals
        for name in dirty_nodes:
            node_pods = state.foreign.get(name)
            engine_node = state.engine_nodes.get(name)
            if not node_pods or engine_node is None or not takes_work(engine_node):
                externals.pop(name, None)
                state.bystanders.pop(name, None)
                if node_pods and engine_node is not None:
                    found = tuple(t for t in (f.foreign_task() for f in node_pods.values()) if is_bystander(t))
                    if found:
                        state.bystanders[name] = found
                continue
            state.bystanders.pop(name, None)
            held: set[int] = set()
            for indices in state.held.get(name, {}).values():
                held.update(indices)
            tasks = [f.foreign_task() for f in node_pods.values()]
            job = external_job(engine_node, tasks, held)
            # A node is dirty whenever a pod of ours binds or ends there:
            # the same external job as before stays the same object, so that
            # the engine (which diffs jobs by identity) does not take it out
            # and put it back.
            before = externals.get(name)
            externals[name] = before if before == job else job
        counts = state.pool_externals
        for name in dirty_nodes:
            pool = state.external_pool.pop(name, None)
            if pool is not None:
                counts[pool] -= 1
                if not counts[pool]:
                    del counts[pool]
            if name in externals:
                pool = state.engine_nodes[name].pool
                state.external_pool[name] = pool
                counts[pool] = counts.get(pool, 0) + 1
        return frozenset(counts)

    def _queues(self, queues: Sequence[Queue], pools: frozenset[str]) -> tuple[Queue, ...]:
        """The real queues and the pools' reserved ones: the same tuple while neither changed."""
        state = self._state
        out = state.queues_out
        if out is None or out[0] is not queues or out[1] != pools:
            out = state.queues_out = (queues, pools, with_external_queues(queues, pools))
        return out[2]

    def _job(  # noqa: PLR0917 (one call site)
        self,
        key: tuple[str, str],
        info: GroupInfo,
        members: list[Task],
        finished: tuple[int, int],
        stamp: str | None,
        now: float,
    ) -> Job:
        tasks = tuple(members)
        memo = self._jobs.get(key)
        if (
            memo is not None
            and stamp is not None
            and memo.stamp == stamp
            and memo.info == info
            and memo.tasks == tasks
            and memo.finished == finished
        ):
            return memo.job
        created = creation_epoch(stamp) if stamp is not None else None
        job = Job(
            name=key[1],
            queue=info.queue,
            namespace=key[0],
            uid=info.uid,
            priority=info.priority,
            preemptible=info.preemptible,
            min_member=max(1, info.min_member),
            created=created if created is not None else now,
            tasks=tasks,
            below_min_member_since=info.below_min_member_since,
            succeeded=finished[0],
            failed=finished[1],
        )
        if stamp is not None:
            self._jobs[key] = _JobMemo(info, tasks, finished, stamp, job)
        else:
            self._jobs.pop(key, None)
        return job


def _discard(index: dict[Any, Any], slot: Any, key: str) -> None:
    """Remove ``key`` from the set or dict ``index[slot]``, and the slot once empty."""
    held = index.get(slot)
    if held is None:
        return
    if isinstance(held, set):
        held.discard(key)
    else:
        held.pop(key, None)
    if not held:
        del index[slot]
