"""Where a pending pod's volumes let it run, judged before the engine sees it.

kube-scheduler's volume filters bind a pod to where its storage is. Of
those, gpuwarden judges what it can read from a bound claim:

- **VolumeBinding** for a bound claim: the volume's ``nodeAffinity`` (a
  local volume, a zonal disk) joins the pod's required node terms;
- **VolumeZone**: a volume labelled with its zone or region
  (``topology.kubernetes.io/zone``, ``/region``, values joined by ``__``)
  keeps the pod in them.

And refuses, with the reason on the pod's PodGroup (``UnsupportedPlacement``),
what it cannot judge, rather than bind where the storage cannot follow:

- a claim that does not exist, or is being deleted;
- a claim that is not bound yet: with ``volumeBindingMode:
  WaitForFirstConsumer`` the scheduler must choose the node and bind a
  volume for it, which gpuwarden does not do (provision the claim first, or
  let kube-scheduler place such pods);
- a bound claim whose volume is not there;
- a ``ReadWriteOncePod`` claim (only one pod may use it; which pods use it
  is not tracked here).

Not judged: per-node limits on attached CSI volumes (NodeVolumeLimits).

Judging happens on the snapshot, after it is assembled, so the per-pod
conversion stays independent of claims; a job is rebuilt only while one of
its pending pods has a claim, and each verdict is kept until the claim or
its volume changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpuwarden.kube import JSON
from scheduler.cluster.assemble import JobChanges
from scheduler.cluster.placement import UnreadableError, node_terms, with_volume_terms
from scheduler.engine.model import Job, NodeTerm, Requirement, Snapshot, Task, TaskStatus

_ZONE_LABELS = ("topology.kubernetes.io/zone", "topology.kubernetes.io/region")
_LEGACY_ZONE_LABELS = {
    "failure-domain.beta.kubernetes.io/zone": "topology.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region": "topology.kubernetes.io/region",
}


def _field(obj: Mapping[str, Any] | None, *path: str) -> Any:
    value: Any = obj
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _volume_terms(volume: JSON, name: str) -> tuple[tuple[NodeTerm, ...], ...]:
    """What a bound volume says about nodes: its node affinity, and its zone labels."""
    out: list[tuple[NodeTerm, ...]] = []
    required = _field(volume, "spec", "nodeAffinity", "required")
    if required is not None:
        terms = node_terms(required, f"persistentvolume {name} spec.nodeAffinity.required")
        if not terms:
            raise UnreadableError(f"persistentvolume {name}: node affinity with no term matches no node")
        out.append(terms)
    labels = _field(volume, "metadata", "labels")
    if isinstance(labels, dict):
        for label, value in labels.items():
            key = _LEGACY_ZONE_LABELS.get(label, label)
            if key in _ZONE_LABELS and isinstance(value, str) and value:
                out.append((NodeTerm(expressions=(Requirement(key, "In", tuple(value.split("__"))),)),))
    return tuple(out)


def _verdict(namespace: str, claim: str, claims: Mapping[str, JSON], volumes: Mapping[str, JSON]) -> object:
    """For one claim: its volume's node terms, or the reason the pod must wait (a str)."""
    pvc = claims.get(f"{namespace}/{claim}")
    if pvc is None:
        return f"persistentvolumeclaim {claim} not found"
    if _field(pvc, "metadata", "deletionTimestamp"):
        return f"persistentvolumeclaim {claim} is being deleted"
    modes = _field(pvc, "spec", "accessModes")
    if isinstance(modes, list) and "ReadWriteOncePod" in modes:
        return f"persistentvolumeclaim {claim} is ReadWriteOncePod, which gpuwarden does not judge"
    bound = _field(pvc, "spec", "volumeName")
    if not isinstance(bound, str) or not bound:
        storage = _field(pvc, "spec", "storageClassName")
        return (
            f"persistentvolumeclaim {claim} is not bound yet"
            + (f" (storage class {storage})" if isinstance(storage, str) and storage else "")
            + ": gpuwarden does not choose or bind volumes, so a claim that waits for its first consumer "
            "stays unbound; bind it first (volumeBindingMode Immediate) or let kube-scheduler place this pod"
        )
    volume = volumes.get(bound)
    if volume is None:
        return f"persistentvolume {bound} of claim {claim} not found"
    try:
        return _volume_terms(volume, bound)
    except UnreadableError as why:
        return str(why)


@dataclass(slots=True)
class _Memo:
    job: Job
    inputs: tuple[object, ...]
    judged: Job


@dataclass(slots=True)
class VolumeJudge:
    """Applies what pending pods' claims say to a snapshot; one per scheduling loop (it keeps verdicts)."""

    _memo: dict[str, _Memo] = field(default_factory=dict)
    # Jobs last seen with no pending pod that has a claim, by identity (the
    # entry keeps its job alive, so the id is not reused): the snapshot keeps
    # a job that did not change as the same object, so most of a large
    # cluster's jobs (running work) cost one lookup, not a scan of their
    # pods, per cycle.
    _plain: dict[int, Job] = field(default_factory=dict)
    # The keys of the jobs with a pod that has a claim, kept from the
    # assembler's changes (JobChanges), and the number of the snapshot they
    # were last brought up to: while no job has one (a cluster that uses no
    # claims, or none waiting) a cycle does not walk the jobs at all.
    _claiming: set[str] = field(default_factory=set)
    _serial: int | None = None

    def apply(
        self,
        snapshot: Snapshot,
        claims: Mapping[str, JSON],
        volumes: Mapping[str, JSON],
        changes: JobChanges | None = None,
    ) -> Snapshot:
        """``snapshot`` with each pending pod's volume terms, or its reason to wait, in its task.

        ``changes`` are the assembler's since the snapshot this judge last
        saw; with them, a snapshot none of whose jobs has a claim is handed
        back at once.
        """
        if changes is not None and self._none_claiming(snapshot, changes):
            self._plain.clear()
            self._memo.clear()
            return snapshot
        jobs: list[Job] | None = None
        seen: set[str] = set()
        plain = self._plain
        kept: dict[int, Job] = {}
        for i, job in enumerate(snapshot.jobs):
            if plain.get(id(job)) is job or not any(t.claims for t in job.tasks):
                kept[id(job)] = job
                continue
            seen.add(job.key)
            judged = self._judge(job, claims, volumes)
            if judged is not job:
                if jobs is None:
                    jobs = list(snapshot.jobs)
                jobs[i] = judged
        self._plain = kept
        if len(self._memo) > len(seen):
            self._memo = {k: m for k, m in self._memo.items() if k in seen}
        return snapshot if jobs is None else replace(snapshot, jobs=tuple(jobs))

    def _none_claiming(self, snapshot: Snapshot, changes: JobChanges) -> bool:
        """Bring ``_claiming`` up to ``changes``; True when no job of the snapshot has a claim."""
        changed = changes.after(self._serial)
        self._serial = None
        claiming = self._claiming
        if changed is None:
            claiming.clear()
            claiming.update(job.key for job in snapshot.jobs if any(t.claims for t in job.tasks))
        else:
            for key, job in changed.items():
                if job is not None and any(t.claims for t in job.tasks):
                    claiming.add(key)
                else:
                    claiming.discard(key)
        self._serial = changes.serial
        return not claiming

    def _judge(self, job: Job, claims: Mapping[str, JSON], volumes: Mapping[str, JSON]) -> Job:
        # What the verdicts depend on: the claims' and their volumes' cache
        # entries, which the cache replaces on every change (never edits).
        inputs: list[object] = []
        for task in job.tasks:
            for claim in task.claims:
                pvc = claims.get(f"{job.namespace}/{claim}")
                bound = _field(pvc, "spec", "volumeName")
                inputs.append(pvc)
                inputs.append(volumes.get(bound) if isinstance(bound, str) else None)
        memo = self._memo.get(job.key)
        if (
            memo is not None
            and memo.job is job
            and len(memo.inputs) == len(inputs)
            and all(a is b for a, b in zip(memo.inputs, inputs, strict=True))
        ):
            return memo.judged
        tasks = tuple(_judged(t, job.namespace, claims, volumes) for t in job.tasks)
        judged = job if all(a is b for a, b in zip(tasks, job.tasks, strict=True)) else replace(job, tasks=tasks)
        self._memo[job.key] = _Memo(job, tuple(inputs), judged)
        return judged


def _judged(task: Task, namespace: str, claims: Mapping[str, JSON], volumes: Mapping[str, JSON]) -> Task:
    if not task.claims or task.status is not TaskStatus.PENDING or task.unplaceable:
        return task
    terms: list[tuple[NodeTerm, ...]] = []
    for claim in task.claims:
        verdict = _verdict(namespace, claim, claims, volumes)
        if isinstance(verdict, str):
            return replace(task, unplaceable=verdict)
        assert isinstance(verdict, tuple)
        terms.extend(verdict)
    if not terms:
        return task
    return replace(task, placement=with_volume_terms(task.placement, tuple(terms)))
