"""Pod groups for pods that name none: derived from the workload that owns them.

A gang must be placed all or nothing, but users write Jobs, PyTorchJobs and
RayClusters, not PodGroups. A pod with ``schedulerName: gpuwarden`` and no
pod-group annotation gets a group derived from the workload at the top of its
owner chain, with the gang size that workload needs to make progress. An
operator that creates later pods only once earlier ones are scheduled, ready
or complete gets one gang per stage (or a minMember of what the first stage
creates), read from the owner's spec and told apart by the labels the
operator puts on each pod: a gang that counted pods of a later stage would
wait for pods that wait for it.

=========================  =====================================================
owner                      group and minMember
=========================  =====================================================
batch Job                  the Job; ``parallelism`` capped by ``completions``
JobSet                     the JobSet; sum of ``replicas`` x each Job's size
JobSet, ``dependsOn``      one group per stage, the replicated jobs listing the
                           same dependencies (none: the first); its Jobs' sum
JobSet, ``InOrder``        one group per replicated job; its Jobs' sum
JobSet, exclusive          each Job counts 1, its leader: followers are admitted
placement                  once it is scheduled (not with the node-selector way)
TrainJob (Trainer v2)      as its JobSet (initializers, then trainer ``node``)
PyTorchJob, TFJob,         the job; ``runPolicy.schedulingPolicy.minAvailable``,
MPIJob, XGBoostJob,        else the sum of replicas in ``spec.*ReplicaSpecs``
PaddleJob, JAXJob
(Kubeflow)
MPIJob v2beta1,            workers: the MPIJob, ``Worker.replicas`` (capped by
``WaitForWorkersReady``    ``minAvailable``); the launcher: its Job, 1
RayCluster, RayJob         the cluster (or job); the head plus each group's
                           ``replicas`` clamped to ``[minReplicas, maxReplicas]``
                           (``minReplicas`` when autoscaling; none if suspended)
                           x ``numOfHosts``
RayService                 each of its RayClusters, as a RayCluster
LeaderWorkerSet            one group per replica (group index); ``size``, or 1
                           with ``startupPolicy: LeaderReady`` or the
                           exclusive-topology annotation (workers come later)
Argo Workflow              one group per step pod; 1
Deployment, ReplicaSet,    one group per pod; 1
StatefulSet, DaemonSet
no owner                   one group per pod; 1
anything else              the top owner; 1 (its pods kept together, no gang)
=========================  =====================================================

The topmost owner of a gang kind decides, so a CronJob's runs are grouped by
their Job, a TrainJob's pods by its JobSet, and a RayJob's submitter pod
joins the RayJob's cluster group. Stages: a JobSet pod's replicated job is
its ``jobset.sigs.k8s.io/replicatedjob-name`` label (else its Job's; with
neither, its Job is its group); an MPIJob's launcher is the pod labelled
``training.kubeflow.org/job-role: launcher`` (else the one under a Job).
The chain is followed by owner reference (uid, else kind and name), never by
list position, so the result does not depend on the order the caller read
the owners in; an owner missing from the list (not readable, unknown kind)
is known by its reference alone and counts as minMember 1.

Group names are stable: ``pg-<owner name>-<owner uid>`` (a LeaderWorkerSet
adds the replica index, a staged JobSet the name of its stage's first
replicated job), so every pod of one workload, and every restart of the
pod-grouper, lands on the same PodGroup. An explicit
``scheduling.gpuwarden.io/pod-group`` annotation on the pod wins; the rest
of the spec is then only a fallback should that PodGroup not exist.

A group of one derived from the pod itself (one group per pod above) is
lone (:attr:`GroupSpec.lone`): its PodGroup is made only when the group has
something to explain, since for a pod placed at once it would only repeat
the pod (see :meth:`~.cycle.SchedulingCycle._podgroups_to_create`).

The queue comes from the ``gpuwarden.io/queue`` label, then KAI's
``kai.scheduler/queue``, looked up on the owners every pod of the group
shares, outermost first (operators copy labels down, never up: a TrainJob's
label is not on its JobSet), then the pod, then the rest of the chain; then
a Kubeflow job's ``runPolicy.schedulingPolicy.queue`` (the field Volcano
reads; a label names gpuwarden's queue explicitly, so it wins); else the
default queue. A Kubeflow job's ``schedulingPolicy.priorityClass`` wins
over the pod's priority class.
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
# LeaderWorkerSet: on the LWS, its workers are created once the leader is scheduled.
ANNOTATION_LWS_EXCLUSIVE = "leaderworkerset.sigs.k8s.io/exclusive-topology"
# JobSet: the replicated job a Job and its pods belong to (on both).
LABEL_JOBSET_REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
# JobSet exclusive placement (on the JobSet or a replicated job's template):
# followers are admitted once their Job's leader is scheduled, unless the
# node-selector strategy is used, which has no such wait.
ANNOTATION_JOBSET_EXCLUSIVE = "alpha.jobset.sigs.k8s.io/exclusive-topology"
ANNOTATION_JOBSET_NODE_SELECTOR = "alpha.jobset.sigs.k8s.io/node-selector"
# Kubeflow (mpi-operator v2): launcher or worker.
LABEL_KUBEFLOW_JOB_ROLE = "training.kubeflow.org/job-role"
# KubeRay's default maxReplicas (the CRD's default: math.MaxInt32).
RAY_MAX_REPLICAS = 2**31 - 1
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

    @property
    def lone(self) -> bool:
        """A group of one pod, derived from that pod itself (no owner, a Deployment's replica, a step pod).

        Its PodGroup would only repeat what the pod says: the scheduler
        makes one only when the group has something to explain (see
        :meth:`~.cycle.SchedulingCycle._podgroups_to_create`).
        """
        return self.min_member == 1 and self.owner is not None and self.owner.kind == "Pod"


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


def _annotations(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return _d(_d(obj.get("metadata")).get("annotations")) if obj is not None else {}


@dataclass(frozen=True, slots=True)
class _Stage:
    """The replicated jobs of a JobSet that its controller creates at one moment, and the pods they need at once."""

    name: str  # "" when the whole JobSet is one stage
    size: int


def _jobset_stages(jobset: Mapping[str, Any]) -> tuple[dict[str, _Stage], _Stage]:
    """Each replicated job's stage (by its name), and the whole JobSet as one stage.

    The JobSet controller creates a replicated job whose ``dependsOn`` lists
    others only once each of them is Ready or Complete, and with
    ``startupPolicy: InOrder`` each replicated job only once the one before
    it has started: one gang over every replicated job would wait for Jobs
    that come only after it runs. So each set of replicated jobs created
    together is its own stage: under InOrder each replicated job; with
    ``dependsOn`` those that list the same dependencies (those without any
    start at once). Under exclusive placement
    (``alpha.jobset.sigs.k8s.io/exclusive-topology`` on the JobSet or the
    replicated job's template, without the node-selector strategy) the
    JobSet's pod webhook admits a Job's followers only once its leader (index
    0) is scheduled, so a Job counts one pod, its leader.
    """
    spec = _d(jobset.get("spec"))
    js_annotations = _annotations(jobset)
    in_order = _s(_d(spec.get("startupPolicy")).get("startupPolicyOrder")) == "InOrder"
    rjobs = [r for r in _l(spec.get("replicatedJobs")) if isinstance(r, dict)]
    keys: list[tuple[str, tuple[tuple[str, str], ...]]] = []
    sizes: list[int] = []
    for position, rjob in enumerate(rjobs):
        name = _s(rjob.get("name"))
        template = _d(rjob.get("template"))
        # As the controller copies them onto the pods: the JobSet's, then the
        # template's, the node-selector flag only beside its exclusive key.
        copied: dict[str, Any] = {}
        for source in (js_annotations, _annotations(template)):
            if ANNOTATION_JOBSET_EXCLUSIVE in source:
                copied[ANNOTATION_JOBSET_EXCLUSIVE] = source[ANNOTATION_JOBSET_EXCLUSIVE]
                if ANNOTATION_JOBSET_NODE_SELECTOR in source:
                    copied[ANNOTATION_JOBSET_NODE_SELECTOR] = source[ANNOTATION_JOBSET_NODE_SELECTOR]
        exclusive = ANNOTATION_JOBSET_EXCLUSIVE in copied and ANNOTATION_JOBSET_NODE_SELECTOR not in copied
        per_job = 1 if exclusive else _job_size(_d(template.get("spec")))
        sizes.append(_count(rjob.get("replicas"), 1) * per_job)
        deps = tuple(
            sorted((_s(d.get("name")), _s(d.get("status"))) for d in _l(rjob.get("dependsOn")) if isinstance(d, dict))
        )
        keys.append((name, (("#order", str(position)),) if in_order else deps))
    whole = _Stage("", max(1, sum(sizes)))
    if not in_order and not any(deps for _, deps in keys):
        return {name: whole for name, _ in keys}, whole
    first: dict[tuple[tuple[str, str], ...], str] = {}
    totals: dict[tuple[tuple[str, str], ...], int] = {}
    for (name, deps), size in zip(keys, sizes, strict=True):
        first.setdefault(deps, name)
        totals[deps] = totals.get(deps, 0) + size
    stages: dict[str, _Stage] = {}
    for name, deps in keys:
        stages.setdefault(name, _Stage(first[deps] or "stage", max(1, totals[deps])))
    return stages, whole


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


def _mpi_waits_for_workers(link: _Link) -> bool:
    """mpi-operator v2 creates the launcher Job only once every worker pod is Ready."""
    if link.key != (_KUBEFLOW, "MPIJob") or link.obj is None:
        return False
    return _s(_d(link.obj.get("spec")).get("launcherCreationPolicy")) == "WaitForWorkersReady"


def _mpi_workers(spec: Mapping[str, Any]) -> int:
    """The gang of an MPIJob whose launcher comes later: its workers (``minAvailable`` caps it)."""
    workers = max(1, _count(_d(_d(spec.get("mpiReplicaSpecs")).get("Worker")).get("replicas"), 1))
    min_available = _d(_d(spec.get("runPolicy")).get("schedulingPolicy")).get("minAvailable")
    if isinstance(min_available, int) and not isinstance(min_available, bool) and min_available > 0:
        return min(min_available, workers)
    return workers


def _ray_size(cluster_spec: Mapping[str, Any]) -> int:
    """The head plus each worker group's pods, as KubeRay counts them.

    KubeRay's ``GetWorkerGroupDesiredReplicas``: a suspended group has none;
    else ``replicas`` clamped to ``[minReplicas, maxReplicas]`` (the CRD
    defaults 0, 0 and 2147483647: ``replicas`` omitted means ``minReplicas``),
    times ``numOfHosts``. With in-tree autoscaling the autoscaler moves
    ``replicas``, so the gang is what the cluster always keeps: each group's
    ``minReplicas`` (as KubeRay's Volcano integration sizes it).
    """
    autoscaling = cluster_spec.get("enableInTreeAutoscaling") is True
    total = 1  # the head
    for group in _l(cluster_spec.get("workerGroupSpecs")):
        if not isinstance(group, dict) or group.get("suspend") is True:
            continue
        minimum = _count(group.get("minReplicas"), 0)
        maximum = _count(group.get("maxReplicas"), RAY_MAX_REPLICAS)
        replicas = group.get("replicas")
        if autoscaling or not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < minimum:
            chosen = minimum
        else:
            chosen = min(replicas, maximum)
        total += chosen * max(1, _count(group.get("numOfHosts"), 1))
    return total


def _lws_size(lws: Mapping[str, Any]) -> int:
    spec = _d(lws.get("spec"))
    # LeaderReady: the worker StatefulSet is created only once the leader is
    # Ready; exclusive topology: only once the leader is scheduled. A gang of
    # ``size`` would wait for workers that wait for it.
    if spec.get("startupPolicy") == "LeaderReady" or ANNOTATION_LWS_EXCLUSIVE in _annotations(lws):
        return 1
    return max(1, _count(_d(spec.get("leaderWorkerTemplate")).get("size"), 1))


def _gang_size(link: _Link) -> int:
    if link.obj is None:
        return 1
    spec = _d(link.obj.get("spec"))
    group, kind = link.key
    if group == _BATCH:
        return _job_size(spec)
    if group == _JOBSET:
        return _jobset_stages(link.obj)[1].size
    if _mpi_waits_for_workers(link):
        return _mpi_workers(spec)
    if group == _KUBEFLOW:
        return _kubeflow_size(spec)
    if kind == "RayCluster":
        return _ray_size(spec)
    if kind == "RayJob":
        cluster = spec.get("rayClusterSpec")
        return _ray_size(cluster) if isinstance(cluster, dict) else 1
    if group == _LWS:
        return _lws_size(link.obj)
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


def _queue(labelled: list[Mapping[str, Any]], kubeflow: _Link | None, default_queue: str) -> str:
    for label in (LABEL_QUEUE, LABEL_KAI_QUEUE):
        for labels in labelled:
            value = labels.get(label)
            if isinstance(value, str) and value:
                return value
    if kubeflow is not None and kubeflow.obj is not None:
        policy = _d(_d(_d(kubeflow.obj.get("spec")).get("runPolicy")).get("schedulingPolicy"))
        queue = _s(policy.get("queue"))
        if queue:
            return queue
    return default_queue


@dataclass(frozen=True, slots=True)
class _Gang:
    """What a grouping owner makes of one of its pods: the group's name, size and owner."""

    name: str
    min_member: int
    owner: OwnerRef


def _own_group(link: _Link, suffix: str = "") -> _Gang:
    base = f"{link.ref.name}-{suffix}" if suffix else link.ref.name
    return _Gang(_group_name(base, link.ref.uid, link.ref.kind), _gang_size(link), link.ref)


def _jobset_gang(jobset: _Link, below: list[_Link], pod_labels: Mapping[str, Any], where: tuple[str, str]) -> _Gang:
    """The pod's stage of a JobSet (see :func:`_jobset_stages`), told by its replicated-job label."""
    if jobset.obj is None:
        return _own_group(jobset)
    stages, whole = _jobset_stages(jobset.obj)
    if all(stage is whole for stage in stages.values()):
        return _Gang(_group_name(jobset.ref.name, jobset.ref.uid, jobset.ref.kind), whole.size, jobset.ref)
    # The JobSet controller labels each Job and its pod template with the
    # replicated job's name (jobset_controller.go, labelAndAnnotateObject).
    rjob = _s(pod_labels.get(LABEL_JOBSET_REPLICATED_JOB))
    for link in reversed(below):
        rjob = rjob or _s(_labels(link.obj).get(LABEL_JOBSET_REPLICATED_JOB))
    stage = stages.get(rjob)
    if stage is None:
        warn.warning("jobset pod without a known replicated job; its Job is its group", where)
        if below:
            return _own_group(below[-1])
        return _Gang(_group_name(jobset.ref.name, jobset.ref.uid, jobset.ref.kind), 1, jobset.ref)
    name = _group_name(f"{jobset.ref.name}-{stage.name}", jobset.ref.uid, jobset.ref.kind)
    return _Gang(name, stage.size, jobset.ref)


def _mpi_gang(mpijob: _Link, below: list[_Link], pod_labels: Mapping[str, Any], pod_ref: OwnerRef) -> _Gang:
    """Workers are the MPIJob's gang; with WaitForWorkersReady the launcher, created once they are Ready, is apart."""
    if not _mpi_waits_for_workers(mpijob):
        return _own_group(mpijob)
    # mpi-operator v2 labels its pods training.kubeflow.org/job-role
    # (launcher or worker) and runs the launcher as a batch Job of its own.
    role = _s(pod_labels.get(LABEL_KUBEFLOW_JOB_ROLE))
    if role == "launcher" or (not role and any(link.key == (_BATCH, "Job") for link in below)):
        if below:
            launcher = below[-1]
            return _Gang(_group_name(launcher.ref.name, launcher.ref.uid, launcher.ref.kind), 1, launcher.ref)
        return _Gang(_group_name(pod_ref.name, pod_ref.uid, "pod"), 1, pod_ref)
    return _own_group(mpijob)


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
    pod_labels = _d(meta.get("labels"))
    namespace = _s(meta.get("namespace")) or "default"
    chain = _owner_chain(pod, owners)

    # The topmost owner of a gang kind, by its position in the chain.
    top = next((i for i in range(len(chain) - 1, -1, -1) if chain[i].key in _GANG_KINDS), -1)
    per_pod = top < 0 and (not chain or chain[-1].key in _PER_POD_KINDS)
    if top < 0 and not per_pod:
        top = len(chain) - 1  # an owner of a kind we do not know: keep its pods together
    grouping = chain[top] if top >= 0 else None
    if grouping is not None and grouping.key == (_ARGO, "Workflow"):
        per_pod = True
        grouping = None

    pod_ref = OwnerRef("v1", "Pod", pod_name, pod_uid)
    where = (namespace, pod_name)
    kubeflow = next((link for link in reversed(chain) if link.group == _KUBEFLOW and link.obj is not None), None)
    if grouping is None or per_pod:
        gang = _Gang(_group_name(pod_name, pod_uid, "pod"), 1, pod_ref)
    elif grouping.key == (_LWS, "LeaderWorkerSet"):
        index = _s(pod_labels.get(LABEL_LWS_GROUP_INDEX))
        if index.isdigit():
            gang = _own_group(grouping, index)
        else:
            warn.warning("leaderworkerset pod without group index; a group of its own", where)
            gang = _Gang(_group_name(pod_name, pod_uid, "pod"), 1, pod_ref)
    elif grouping.key == (_JOBSET, "JobSet"):
        gang = _jobset_gang(grouping, chain[:top], pod_labels, where)
    elif grouping.key == (_KUBEFLOW, "MPIJob"):
        gang = _mpi_gang(grouping, chain[:top], pod_labels, pod_ref)
    else:
        gang = _own_group(grouping)

    priority_class = _s(spec.get("priorityClassName"))
    if kubeflow is not None and kubeflow.obj is not None:
        policy = _d(_d(_d(kubeflow.obj.get("spec")).get("runPolicy")).get("schedulingPolicy"))
        priority_class = _s(policy.get("priorityClass")) or priority_class

    # Operators copy labels down (a RayJob's onto its RayCluster), never up,
    # and never a workload's own labels onto its pods: the outermost owner
    # that every pod of the group shares is where its user wrote the queue.
    if grouping is not None and not per_pod:
        labelled = [_labels(link.obj) for link in reversed(chain[top:])]
        labelled += [pod_labels, *(_labels(link.obj) for link in reversed(chain[:top]))]
    else:
        labelled = [pod_labels, *(_labels(link.obj) for link in reversed(chain))]
    queue = _queue(labelled, kubeflow, default_queue)

    name = gang.name
    explicit = _d(meta.get("annotations")).get(ANNOTATION_POD_GROUP)
    if isinstance(explicit, str) and explicit:
        name = explicit
    return GroupSpec(
        name=name,
        namespace=namespace,
        min_member=gang.min_member,
        queue=queue,
        priority_class_name=priority_class,
        owner=gang.owner,
    )
