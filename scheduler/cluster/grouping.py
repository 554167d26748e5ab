"""Pod groups for pods that name none: derived from the workload that owns them.

A gang must be placed all or nothing, but users write Jobs, PyTorchJobs and
RayClusters, not PodGroups. A pod with ``schedulerName: gpuwarden`` and no
pod-group annotation gets a group derived from the workload at the top of its
owner chain, with the gang size that workload needs to make progress:

=========================  =====================================================
owner                      group and minMember
=========================  =====================================================
batch Job                  the Job; ``parallelism`` capped by ``completions``
JobSet                     the JobSet; sum of ``replicas`` x each Job's size
PyTorchJob, TFJob,         the job; ``runPolicy.schedulingPolicy.minAvailable``,
MPIJob (Kubeflow)          else the sum of replicas in ``spec.*ReplicaSpecs``
RayCluster, RayJob         the cluster (or job); the head plus each worker group's
                           replicas (``minReplicas`` when autoscaling) x hosts
LeaderWorkerSet            one group per replica (group index); ``size``, or 1
                           with ``startupPolicy: LeaderReady`` (workers come later)
Argo Workflow              one group per step pod; 1
Deployment, ReplicaSet,    one group per pod; 1
StatefulSet, DaemonSet
no owner                   one group per pod; 1
anything else              the top owner; 1 (its pods kept together, no gang)
=========================  =====================================================

The topmost owner of a gang kind decides, so a CronJob's runs are grouped by
their Job, and a RayJob's submitter pod joins the RayJob's cluster group.
The chain is followed by owner reference (uid, else kind and name), never by
list position, so the result does not depend on the order the caller read
the owners in; an owner missing from the list (not readable, unknown kind)
is known by its reference alone and counts as minMember 1.

Group names are stable: ``pg-<owner name>-<owner uid>`` (a LeaderWorkerSet
adds the replica index), so every pod of one workload, and every restart of
the pod-grouper, lands on the same PodGroup. An explicit
``scheduling.gpuwarden.io/pod-group`` annotation on the pod wins; the rest
of the spec is then only a fallback should that PodGroup not exist.

The queue comes from the ``gpuwarden.io/queue`` label, then KAI's
``kai.scheduler/queue``, looked up on the grouping owner before the pod (every
pod of a group must agree, and the workload is the one thing they share),
then on the rest of the chain; else the default queue.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuwarden.contract import ANNOTATION_POD_GROUP, LABEL_KAI_QUEUE, LABEL_QUEUE
from scheduler.cluster.logonce import WarnOnce

warn = WarnOnce(__name__)

DEFAULT_QUEUE = "default"
GROUP_NAME_PREFIX = "pg-"
LABEL_LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
# Owner chains deeper than this are malformed (or loop); the walk stops.
MAX_CHAIN = 16
# Kubernetes object names are DNS subdomains: at most 253 characters.
MAX_NAME = 253
# A uid is 36 characters; anything longer in a malformed object is cut.
MAX_UID = 64

_BATCH = "batch"
_JOBSET = "jobset.x-k8s.io"
_KUBEFLOW = "kubeflow.org"
_RAY = "ray.io"
_LWS = "leaderworkerset.x-k8s.io"
_ARGO = "argoproj.io"
_APPS = "apps"

_GANG_KINDS = frozenset(
    {
        (_BATCH, "Job"),
        (_JOBSET, "JobSet"),
        (_KUBEFLOW, "PyTorchJob"),
        (_KUBEFLOW, "TFJob"),
        (_KUBEFLOW, "MPIJob"),
        (_KUBEFLOW, "XGBoostJob"),
        (_KUBEFLOW, "PaddleJob"),
        (_KUBEFLOW, "JAXJob"),
        (_RAY, "RayCluster"),
        (_RAY, "RayJob"),
        (_LWS, "LeaderWorkerSet"),
        (_ARGO, "Workflow"),
    }
)
# Owners whose pods are independent replicas: one group per pod.
_PER_POD_KINDS = frozenset(
    {(_APPS, "Deployment"), (_APPS, "ReplicaSet"), (_APPS, "StatefulSet"), (_APPS, "DaemonSet"), ("", "Pod")}
)
_INVALID_NAME_CHARS = re.compile(r"[^a-z0-9.-]+")


@dataclass(frozen=True, slots=True)
class OwnerRef:
    """An owner reference, for the PodGroup the scheduler creates (garbage-collected with it)."""

    api_version: str
    kind: str
    name: str
    uid: str

    def to_json(self) -> dict[str, str]:
        return {"apiVersion": self.api_version, "kind": self.kind, "name": self.name, "uid": self.uid}


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """The PodGroup a pod belongs to, as derived from its owners."""

    name: str
    namespace: str
    min_member: int
    queue: str
    priority_class_name: str = ""
    owner: OwnerRef | None = None


@dataclass(frozen=True, slots=True)
class _Link:
    """One step of the owner chain: the reference, and the object if the caller had it."""

    ref: OwnerRef
    obj: Mapping[str, Any] | None

    @property
    def group(self) -> str:
        return _api_group(self.ref.api_version)

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.ref.kind)


def _api_group(api_version: str) -> str:
    return api_version.rpartition("/")[0] if "/" in api_version else ""


def _d(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _l(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _s(value: object) -> str:
    return value if isinstance(value, str) else ""


def _count(value: object, default: int) -> int:
    """A non-negative integer field; ``default`` when absent or malformed."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return default


def _ref_of(raw: object) -> OwnerRef | None:
    if not isinstance(raw, dict):
        return None
    kind, name = _s(raw.get("kind")), _s(raw.get("name"))
    if not kind or not name:
        return None
    return OwnerRef(_s(raw.get("apiVersion")), kind, name, _s(raw.get("uid")))


def _controller_ref(obj: Mapping[str, Any]) -> OwnerRef | None:
    """The object's controller owner; else, deterministically, the least of its owners."""
    refs = [r for r in _l(_d(obj.get("metadata")).get("ownerReferences")) if isinstance(r, dict)]
    controllers = [r for r in refs if r.get("controller") is True]
    parsed = [ref for ref in (_ref_of(r) for r in (controllers or refs)) if ref is not None]
    if not parsed:
        return None
    return min(parsed, key=lambda r: (r.kind, r.name, r.uid, r.api_version))


def _index(owners: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Mapping[str, Any]], dict[tuple[str, str], Any]]:
    """Owners by uid and by (kind, name); an identity listed twice keeps the least by content."""
    by_uid: dict[str, Mapping[str, Any]] = {}
    by_name: dict[tuple[str, str], Mapping[str, Any]] = {}
    for obj in owners:
        if not isinstance(obj, dict):
            continue
        meta = _d(obj.get("metadata"))
        uid, kind, name = _s(meta.get("uid")), _s(obj.get("kind")), _s(meta.get("name"))
        if uid:
            other = by_uid.get(uid)
            by_uid[uid] = obj if other is None or repr(obj) < repr(other) else other
        if kind and name:
            other = by_name.get((kind, name))
            by_name[(kind, name)] = obj if other is None or repr(obj) < repr(other) else other
    return by_uid, by_name


def _owner_chain(pod: Mapping[str, Any], owners: Sequence[Mapping[str, Any]]) -> list[_Link]:
    """The pod's owners from its controller up, following references (not list order)."""
    by_uid, by_name = _index(owners)
    chain: list[_Link] = []
    seen: set[tuple[str, str, str]] = set()
    ref = _controller_ref(pod)
    while ref is not None and len(chain) < MAX_CHAIN:
        ident = (ref.kind, ref.name, ref.uid)
        if ident in seen:
            break
        seen.add(ident)
        obj = by_uid.get(ref.uid) if ref.uid else None
        if obj is None and not ref.uid:
            obj = by_name.get((ref.kind, ref.name))
        chain.append(_Link(ref, obj))
        if obj is None:
            break
        ref = _controller_ref(obj)
    return chain


def _job_size(job_spec: Mapping[str, Any]) -> int:
    parallelism = _count(job_spec.get("parallelism"), 1)
    completions = job_spec.get("completions")
    if isinstance(completions, int) and not isinstance(completions, bool) and completions >= 0:
        parallelism = min(parallelism, completions)
    return max(1, parallelism)


def _jobset_size(spec: Mapping[str, Any]) -> int:
    total = 0
    for rjob in _l(spec.get("replicatedJobs")):
        if not isinstance(rjob, dict):
            continue
        replicas = _count(rjob.get("replicas"), 1)
        job_spec = _d(_d(rjob.get("template")).get("spec"))
        total += replicas * _job_size(job_spec)
    return max(1, total)


def _kubeflow_size(spec: Mapping[str, Any]) -> int:
    policy = _d(_d(spec.get("runPolicy")).get("schedulingPolicy"))
    min_available = policy.get("minAvailable")
    if isinstance(min_available, int) and not isinstance(min_available, bool) and min_available > 0:
        return min_available
    total = 0
    for key in sorted(k for k in spec if isinstance(k, str)):
        if not key.endswith("ReplicaSpecs"):
            continue
        for role in _d(spec[key]).values():
            if isinstance(role, dict):
                total += _count(role.get("replicas"), 1)
    return max(1, total)


def _ray_size(cluster_spec: Mapping[str, Any]) -> int:
    autoscaling = cluster_spec.get("enableInTreeAutoscaling") is True
    total = 1  # the head
    for group in _l(cluster_spec.get("workerGroupSpecs")):
        if not isinstance(group, dict):
            continue
        minimum = group.get("minReplicas")
        replicas = group.get("replicas")
        chosen = minimum if (autoscaling and minimum is not None) or replicas is None else replicas
        hosts = max(1, _count(group.get("numOfHosts"), 1))
        total += _count(chosen, _count(minimum, 1)) * hosts
    return total


def _gang_size(link: _Link) -> int:
    if link.obj is None:
        return 1
    spec = _d(link.obj.get("spec"))
    group, kind = link.key
    if group == _BATCH:
        return _job_size(spec)
    if group == _JOBSET:
        return _jobset_size(spec)
    if group == _KUBEFLOW:
        return _kubeflow_size(spec)
    if kind == "RayCluster":
        return _ray_size(spec)
    if kind == "RayJob":
        cluster = spec.get("rayClusterSpec")
        return _ray_size(cluster) if isinstance(cluster, dict) else 1
    if group == _LWS:
        # LeaderReady: the worker StatefulSet is created only once the leader
        # runs, so a gang of ``size`` would wait for pods that never come.
        if spec.get("startupPolicy") == "LeaderReady":
            return 1
        return max(1, _count(_d(spec.get("leaderWorkerTemplate")).get("size"), 1))
    return 1


def _group_name(base: str, uid: str, kind: str) -> str:
    """``pg-<base>-<uid>`` as a valid object name; the kind stands in for a missing uid."""
    tail = f"-{uid}" if uid else ""
    head = GROUP_NAME_PREFIX if uid else f"{GROUP_NAME_PREFIX}{kind}-"
    text = _INVALID_NAME_CHARS.sub("-", f"{head}{base}".lower())
    tail = _INVALID_NAME_CHARS.sub("-", tail.lower())[:MAX_UID]
    text = text[: MAX_NAME - len(tail)] + tail
    return text.strip("-.") or GROUP_NAME_PREFIX.rstrip("-")


def _labels(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return _d(_d(obj.get("metadata")).get("labels")) if obj is not None else {}


def _queue(labelled: list[Mapping[str, Any]], default_queue: str) -> str:
    for label in (LABEL_QUEUE, LABEL_KAI_QUEUE):
        for labels in labelled:
            value = labels.get(label)
            if isinstance(value, str) and value:
                return value
    return default_queue


def derive_group(
    pod: Mapping[str, Any], owners: Sequence[Mapping[str, Any]], *, default_queue: str = DEFAULT_QUEUE
) -> GroupSpec:
    """The pod group for ``pod`` given its owner chain (raw objects, any order).

    Pure and deterministic: the same pod and the same owners give the same
    group whatever order the owners come in. Never raises on malformed
    objects; a field that cannot be read falls back to a group of one.
    """
    meta = _d(pod.get("metadata"))
    spec = _d(pod.get("spec"))
    pod_name = _s(meta.get("name"))
    pod_uid = _s(meta.get("uid"))
    namespace = _s(meta.get("namespace")) or "default"
    chain = _owner_chain(pod, owners)

    grouping: _Link | None = None
    for link in reversed(chain):
        if link.key in _GANG_KINDS:
            grouping = link
            break
    per_pod = grouping is None and (not chain or chain[-1].key in _PER_POD_KINDS)
    if grouping is None and not per_pod:
        grouping = chain[-1]  # an owner of a kind we do not know: keep its pods together
    if grouping is not None and grouping.key == (_ARGO, "Workflow"):
        per_pod = True
        grouping = None

    pod_ref = OwnerRef("v1", "Pod", pod_name, pod_uid)
    priority_class = _s(spec.get("priorityClassName"))
    if grouping is None or per_pod:
        name = _group_name(pod_name, pod_uid, "pod")
        min_member = 1
        owner = pod_ref
    elif grouping.key == (_LWS, "LeaderWorkerSet"):
        index = _s(_d(meta.get("labels")).get(LABEL_LWS_GROUP_INDEX))
        if index.isdigit():
            name = _group_name(f"{grouping.ref.name}-{index}", grouping.ref.uid, grouping.ref.kind)
            min_member = _gang_size(grouping)
            owner = grouping.ref
        else:
            warn.warning("leaderworkerset pod without group index; a group of its own", (namespace, pod_name))
            name, min_member, owner = _group_name(pod_name, pod_uid, "pod"), 1, pod_ref
    else:
        name = _group_name(grouping.ref.name, grouping.ref.uid, grouping.ref.kind)
        min_member = _gang_size(grouping)
        owner = grouping.ref
        if grouping.group == _KUBEFLOW and grouping.obj is not None:
            policy = _d(_d(_d(grouping.obj.get("spec")).get("runPolicy")).get("schedulingPolicy"))
            priority_class = _s(policy.get("priorityClass")) or priority_class

    labelled = [_labels(grouping.obj) if grouping is not None else {}, _d(meta.get("labels"))]
    labelled += [_labels(link.obj) for link in reversed(chain)]
    queue = _queue(labelled, default_queue)

    explicit = _d(meta.get("annotations")).get(ANNOTATION_POD_GROUP)
    if isinstance(explicit, str) and explicit:
        name = explicit
    return GroupSpec(
        name=name,
        namespace=namespace,
        min_member=min_member,
        queue=queue,
        priority_class_name=priority_class,
        owner=owner,
    )
