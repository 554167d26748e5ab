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
  its engine Task, converted on first use;
- per pod group, its Job, reused while the group's info, its tasks and its
  earliest creation time are unchanged.

What is left per cycle is one pass of dictionary look-ups over the pods
(group membership can change without the pod changing: a PodGroup created,
the pod-grouper's answer) and the assembly of the changed jobs. The result
equals ``snapshot_from`` over the same objects, in the same order
(tests/scheduler/cluster/test_assemble.py checks it after random event
sequences); a change to the rules is made in :mod:`.convert`, whose helpers
this module calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuwarden.contract import ANNOTATION_POD_GROUP, SCHEDULER_NAME
from scheduler.cluster.convert import (
    GroupInfo,
    creation_epoch,
    external_job,
    external_task_from_pod,
    keyed_node,
    takes_work,
    task_from_pod,
    warn,
    with_external_queues,
)
from scheduler.engine.model import Job, Node, Queue, SchedulerConfig, Snapshot, Task

# What a pod is to the snapshot, whatever the groups are this cycle.
_SKIP = 0  # finished, malformed, another scheduler's unbound pod, or ours pending but deleted or gated
_FOREIGN = 1  # another scheduler's bound pod: holds capacity on its node
_OURS = 2  # ours: placed by its group, if the group is known

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
    task: Task | None = None
    external: Task | None = None

    def our_task(self) -> Task:
        if self.task is None:
            self.task = task_from_pod(self.obj)
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
    if isinstance(phase, str) and phase in _TERMINAL_PHASES:
        return _PodFacts(pod, _SKIP)
    raw_node = spec.get("nodeName")
    node = raw_node if isinstance(raw_node, str) else ""
    if spec.get("schedulerName") != SCHEDULER_NAME:
        return _PodFacts(pod, _FOREIGN if node else _SKIP, node)
    meta = pod.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
    if not node and (meta.get("deletionTimestamp") or spec.get("schedulingGates")):
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
    )


@dataclass(slots=True)
class _JobMemo:
    info: GroupInfo
    tasks: tuple[Task, ...]
    stamp: str
    job: Job


@dataclass(slots=True)
class _NodeMemo:
    node: object
    gpunode: object
    value: Node


class SnapshotAssembler:
    """Snapshots from cache views, each object converted once per version; one per scheduling loop.

    Not thread-safe: the loop that runs the cycles owns it.
    """

    def __init__(self) -> None:
        self._nodes: dict[str, _NodeMemo] = {}
        self._pods: dict[str, _PodFacts] = {}
        self._jobs: dict[tuple[str, str], _JobMemo] = {}

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
    ) -> Snapshot:
        """``snapshot_from(nodes, gpunodes, pods.values(), ...)``, from memoized conversions.

        ``pods`` is keyed by anything that names a pod for as long as it lives
        (the cycle uses UIDs); the rest is as for ``snapshot_from``.
        """
        engine_nodes = {name: self._node(name, obj, gpunodes.get(name)) for name, obj in nodes.items()}
        if len(self._nodes) > len(nodes):
            self._nodes = {name: memo for name, memo in self._nodes.items() if name in nodes}

        by_uid = pod_groups or {}
        members: dict[tuple[str, str], list[Task]] = {}
        earliest: dict[tuple[str, str], str] = {}
        foreign: dict[str, list[_PodFacts]] = {}
        held: dict[str, set[int]] = {}
        facts_of = self.pod_facts
        for key, pod in pods.items():
            facts = facts_of(key, pod)
            kind = facts.kind
            if kind == _SKIP:
                continue
            if kind == _FOREIGN:
                foreign.setdefault(facts.node, []).append(facts)
                continue
            group = facts.group or by_uid.get(facts.uid)
            gkey = (facts.namespace, group) if group else None
            if gkey is None or gkey not in groups:
                ident = f"{facts.namespace}/{facts.name}"
                if facts.node:
                    foreign.setdefault(facts.node, []).append(facts)
                    warn.warning("bound pod has no known pod group; counted as held", ("nogroup", ident), pod=ident)
                else:
                    warn.warning("pending pod has no known pod group yet", ("nogroup", ident), pod=ident, group=group)
                continue
            task = facts.task or facts.our_task()
            tasks = members.get(gkey)
            if tasks is None:
                members[gkey] = [task]
            else:
                tasks.append(task)
            if task.gpu_indices and task.node is not None:
                held.setdefault(task.node, set()).update(task.gpu_indices)
            created = facts.created
            if created is not None:
                first = earliest.get(gkey)
                if first is None or created < first:
                    earliest[gkey] = created
        if len(self._pods) > len(pods) + max(1024, len(pods) // 4):
            self._pods = {key: facts for key, facts in self._pods.items() if key in pods}

        jobs = [self._job(key, groups[key], tasks, earliest.get(key), now) for key, tasks in members.items()]
        if len(self._jobs) > len(members):
            self._jobs = {key: memo for key, memo in self._jobs.items() if key in members}

        external_pools: set[str] = set()
        for node_name, node_pods in foreign.items():
            engine_node = engine_nodes.get(node_name)
            if engine_node is None or not takes_work(engine_node):
                continue
            tasks = [f.foreign_task() for f in node_pods]
            jobs.append(external_job(engine_node, tasks, held.get(node_name, set()), now))
            external_pools.add(engine_node.pool)
        return Snapshot(
            nodes=tuple(engine_nodes.values()),
            queues=with_external_queues(queues, external_pools),
            jobs=tuple(jobs),
            now=now,
            config=config,
        )

    def _job(self, key: tuple[str, str], info: GroupInfo, members: list[Task], stamp: str | None, now: float) -> Job:
        tasks = tuple(members)
        memo = self._jobs.get(key)
        if memo is not None and stamp is not None and memo.stamp == stamp and memo.info == info and memo.tasks == tasks:
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
        )
        if stamp is not None:
            self._jobs[key] = _JobMemo(info, tasks, stamp, job)
        else:
            self._jobs.pop(key, None)
        return job
