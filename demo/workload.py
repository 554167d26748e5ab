"""The demo's workload: job streams arriving over time, and a stand-in Kubeflow training operator.

Each stream of the scenario (:class:`~demo.scenario.StreamSpec`) submits a
job every ``every_s`` seconds (sooner on a bigger cluster) while fewer than
``max_pending`` of its jobs wait, into its queue's department namespace
(in the scenario's last ``settle_s`` seconds no gang arrives, and those
still waiting are withdrawn):

* ``job``: a batch Job; the controller manager's Job controller makes its
  pods, and makes new ones when an eviction takes them (the pod failure
  policy ignores disruptions, so an eviction costs no retry);
* ``pytorchjob``: a Kubeflow PyTorchJob (master and workers); the training
  operator is not run, so :class:`StandInOperator` makes its pods with the
  owner references the operator writes, remakes an evicted one, and marks
  the job Succeeded when all have;
* ``pod``: bare pods, one per job.

Every pod names the scheduler, its queue (label ``gpuwarden.io/queue``), its
GPUs (``nvidia.com/gpu``) or its slice (``gpuwarden.io/gpu-fraction``) and
its scripted duration, which the stand-in kubelet plays out. Gangs need no
PodGroup: the scheduler derives one from the Job or PyTorchJob.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from kubernetes import client

from demo.kube import items, meta, sub
from demo.kubelet import ANNOTATION_DURATION, LABEL_JOB, LABEL_PART_OF, PART_OF
from demo.scenario import DemoScenario, Owner, QueueSpec, StreamSpec
from gpuwarden import contract
from gpuwarden.logconfig import get_logger

log = get_logger(__name__)

LABEL_STREAM = "demo.gpuwarden.io/stream"
IMAGE = "registry.invalid/gpuwarden-demo/train:1"

PYTORCH_GROUP = "kubeflow.org"
PYTORCH_VERSION = "v1"
PYTORCH_PLURAL = "pytorchjobs"
LABEL_PYTORCH_JOB = "training.kubeflow.org/job-name"
LABEL_PYTORCH_ROLE = "training.kubeflow.org/replica-type"
LABEL_PYTORCH_INDEX = "training.kubeflow.org/replica-index"

JSON = dict[str, Any]


def department_of(queue: str, queues: Iterable[QueueSpec]) -> str:
    """The root of ``queue``'s branch: the namespace its jobs run in."""
    parents = {q.name: q.parent for q in queues}
    seen: set[str] = set()
    while parents.get(queue) and queue not in seen:
        seen.add(queue)
        queue = parents[queue]
    return queue


def queue_objects(queues: Iterable[QueueSpec], pool_gpus: Mapping[str, int]) -> list[JSON]:
    """The Queue objects of the tree, each in its department's pool, percentages turned into GPUs."""
    queues = list(queues)
    by_name = {q.name: q for q in queues}
    objects = []
    for q in queues:
        pool = by_name[department_of(q.name, queues)].pool
        gpus = pool_gpus.get(pool, 0)
        gpu: JSON = {}
        if q.quota_pct is not None:
            gpu["quota"] = round(q.quota_pct * gpus / 100)
        if q.limit_pct is not None:
            gpu["limit"] = max(gpu.get("quota", 0), round(q.limit_pct * gpus / 100))
        if q.over_quota_weight is not None:
            gpu["overQuotaWeight"] = q.over_quota_weight
        spec: JSON = {"nodePool": pool, "resources": {"gpu": gpu}}
        if q.parent:
            spec["parentQueue"] = q.parent
        if q.priority:
            spec["priority"] = q.priority
        objects.append(
            {
                "apiVersion": f"{contract.SCHEDULING_API_GROUP}/{contract.SCHEDULING_API_VERSION}",
                "kind": contract.QUEUE_KIND,
                "metadata": {"name": q.name, "labels": {LABEL_PART_OF: PART_OF}},
                "spec": spec,
            }
        )
    return objects


def pod_template(stream: StreamSpec, job: str) -> JSON:
    """The pod every job of ``stream`` runs (its template, for Jobs and PyTorchJobs)."""
    annotations = {ANNOTATION_DURATION: f"{stream.duration_s:g}"}
    limits: JSON = {}
    if stream.fraction is not None:
        annotations[contract.ANNOTATION_GPU_FRACTION] = f"{stream.fraction:g}"
    else:
        limits[contract.RESOURCE_NVIDIA_GPU] = str(stream.gpus)
    labels = {LABEL_PART_OF: PART_OF, LABEL_STREAM: stream.name, LABEL_JOB: job, contract.LABEL_QUEUE: stream.queue}
    resources: JSON = {"requests": {"cpu": "1", "memory": "4Gi"}}
    if limits:
        resources["limits"] = limits
    return {
        "metadata": {"labels": labels, "annotations": annotations},
        "spec": {
            "schedulerName": contract.SCHEDULER_NAME,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "main", "image": IMAGE, "resources": resources}],
        },
    }


def job_object(stream: StreamSpec, name: str) -> JSON:
    labels = {LABEL_PART_OF: PART_OF, LABEL_STREAM: stream.name, contract.LABEL_QUEUE: stream.queue}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "parallelism": stream.pods,
            "completions": stream.pods,
            "completionMode": "Indexed",
            "backoffLimit": 6,
            # An eviction (a drain, a reclaim) is not the job's failure.
            "podFailurePolicy": {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]},
            "template": pod_template(stream, name),
        },
    }


def pytorchjob_object(stream: StreamSpec, name: str) -> JSON:
    template = pod_template(stream, name)
    template["spec"]["containers"][0]["name"] = "pytorch"
    specs: JSON = {"Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template}}
    if stream.pods > 1:
        specs["Worker"] = {"replicas": stream.pods - 1, "restartPolicy": "OnFailure", "template": template}
    labels = {LABEL_PART_OF: PART_OF, LABEL_STREAM: stream.name, contract.LABEL_QUEUE: stream.queue}
    return {
        "apiVersion": f"{PYTORCH_GROUP}/{PYTORCH_VERSION}",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "labels": labels},
        "spec": {"pytorchReplicaSpecs": specs, "runPolicy": {"schedulingPolicy": {"minAvailable": stream.pods}}},
    }


def bare_pod(stream: StreamSpec, name: str) -> JSON:
    template = pod_template(stream, name)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template["metadata"], "name": name},
        "spec": template["spec"],
    }


@dataclass(slots=True)
class _StreamState:
    spec: StreamSpec
    namespace: str
    every_s: float
    next_at: float
    submitted: int = 0
    recent: dict[str, float] = field(default_factory=dict)


class Workload:
    """Submits the scenario's job streams over time; see the module docstring."""

    def __init__(self, api: client.ApiClient, scenario: DemoScenario, nodes: int, duration_s: float) -> None:
        self._api = api
        self._settle_from = duration_s - scenario.settle_s
        scale = scenario.scale(nodes)
        self._streams = [
            _StreamState(
                s,
                department_of(s.queue, scenario.queues),
                s.every_s / scale,
                s.start_s,
            )
            for s in scenario.workload
        ]
        self._initial = {s.name: max(1, round(s.initial * scale)) if s.initial else 0 for s in scenario.workload}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-workload", daemon=True)
        self._started = 0.0
        self._withdrawn = False
        self.submitted = 0
        self.withdrawn = 0

    @property
    def namespaces(self) -> list[str]:
        return sorted({s.namespace for s in self._streams})

    def start(self) -> None:
        self._started = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        for state in self._streams:
            for _ in range(self._initial[state.spec.name]):
                self._submit(state)
        while not self._stop.wait(0.5):
            try:
                self._tick(time.monotonic() - self._started)
            except client.ApiException as exc:
                log.warning("demo_workload_tick_failed", status=exc.status, reason=exc.reason)

    def _tick(self, elapsed: float) -> None:
        pending = self._pending_jobs()
        now = time.monotonic()
        if elapsed >= self._settle_from and not self._withdrawn:
            self._withdrawn = True
            self._withdraw_gangs(pending)
        for state in self._streams:
            if elapsed < state.next_at or (state.spec.pods > 1 and elapsed >= self._settle_from):
                continue
            state.next_at = max(state.next_at + state.every_s, elapsed)
            state.recent = {k: t for k, t in state.recent.items() if now - t < 5.0}
            waiting = pending.get(state.spec.name, set()) | set(state.recent)
            if len(waiting) < state.spec.max_pending:
                self._submit(state)

    def _withdraw_gangs(self, pending: Mapping[str, set[str]]) -> None:
        """The settling begins: gangs that have not started are withdrawn by their owners.

        A waiting gang still counts in its queue's request, and so in its fair
        share, which it may never fit: withdrawn, the share is what the
        queue's placeable work asks for.
        """
        for state in self._streams:
            if state.spec.pods <= 1:
                continue
            for name in sorted(pending.get(state.spec.name, set())):
                try:
                    if state.spec.owner == Owner.PYTORCHJOB:
                        client.CustomObjectsApi(self._api).delete_namespaced_custom_object(
                            PYTORCH_GROUP, PYTORCH_VERSION, state.namespace, PYTORCH_PLURAL, name
                        )
                    else:
                        client.BatchV1Api(self._api).delete_namespaced_job(
                            name, state.namespace, propagation_policy="Background"
                        )
                    self.withdrawn += 1
                except client.ApiException as exc:
                    log.warning("demo_withdraw_failed", job=f"{state.namespace}/{name}", status=exc.status)

    def _pending_jobs(self) -> dict[str, set[str]]:
        """Per stream, the jobs with a pod not yet placed."""
        listing = client.CoreV1Api(self._api).list_pod_for_all_namespaces(
            label_selector=f"{LABEL_PART_OF}={PART_OF}", field_selector="spec.nodeName="
        )
        found: dict[str, set[str]] = {}
        for pod in items(self._api, listing):
            metadata = meta(pod)
            labels: Mapping[str, str] = metadata.get("labels") or {}
            if not metadata.get("deletionTimestamp") and LABEL_STREAM in labels:
                found.setdefault(labels[LABEL_STREAM], set()).add(labels.get(LABEL_JOB, str(metadata.get("name"))))
        return found

    def _submit(self, state: _StreamState) -> None:
        state.submitted += 1
        name = f"{state.spec.name}-{state.submitted}"
        ns = state.namespace
        try:
            if state.spec.owner == Owner.JOB:
                # The generated client takes the object as JSON as well as as its model.
                client.BatchV1Api(self._api).create_namespaced_job(ns, job_object(state.spec, name))  # type: ignore[arg-type]
            elif state.spec.owner == Owner.PYTORCHJOB:
                client.CustomObjectsApi(self._api).create_namespaced_custom_object(
                    PYTORCH_GROUP, PYTORCH_VERSION, ns, PYTORCH_PLURAL, pytorchjob_object(state.spec, name)
                )
            else:
                client.CoreV1Api(self._api).create_namespaced_pod(ns, bare_pod(state.spec, name))  # type: ignore[arg-type]
        except client.ApiException as exc:
            log.warning("demo_submit_failed", job=f"{ns}/{name}", status=exc.status, reason=exc.reason)
            return
        state.recent[name] = time.monotonic()
        self.submitted += 1


class StandInOperator:
    """Kubeflow's training operator, as far as the demo needs it: PyTorchJob pods, remade when evicted."""

    def __init__(self, api: client.ApiClient, namespaces: list[str]) -> None:
        self._api = api
        self._namespaces = namespaces
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-operator", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            for ns in self._namespaces:
                try:
                    self._reconcile(ns)
                except client.ApiException as exc:
                    log.warning("demo_operator_failed", namespace=ns, status=exc.status, reason=exc.reason)

    def _reconcile(self, ns: str) -> None:
        custom = client.CustomObjectsApi(self._api)
        core = client.CoreV1Api(self._api)
        listed = cast(JSON, custom.list_namespaced_custom_object(PYTORCH_GROUP, PYTORCH_VERSION, ns, PYTORCH_PLURAL))
        jobs: list[JSON] = listed.get("items") or []
        by_job: dict[str, dict[str, JSON]] = {}
        for pod in items(self._api, core.list_namespaced_pod(ns, label_selector=LABEL_PYTORCH_JOB)):
            labels = meta(pod).get("labels") or {}
            by_job.setdefault(str(labels.get(LABEL_PYTORCH_JOB)), {})[str(meta(pod).get("name"))] = pod
        for job in jobs:
            status = job.get("status") or {}
            if any(c.get("type") == "Succeeded" and c.get("status") == "True" for c in status.get("conditions", [])):
                continue
            name = job["metadata"]["name"]
            have = by_job.get(name, {})
            wanted = self._replicas(job)
            done = 0
            for pod_name, (role, index, template) in wanted.items():
                existing = have.get(pod_name)
                if existing is None:
                    with contextlib.suppress(client.ApiException):
                        body = self._pod(job, pod_name, role, index, template)
                        core.create_namespaced_pod(ns, body)  # type: ignore[arg-type]
                elif sub(existing, "status").get("phase") == "Succeeded":
                    done += 1
            if wanted and done == len(wanted):
                now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                condition = {
                    "type": "Succeeded",
                    "status": "True",
                    "reason": "PyTorchJobSucceeded",
                    "lastTransitionTime": now,
                }
                with contextlib.suppress(client.ApiException):
                    custom.patch_namespaced_custom_object(
                        PYTORCH_GROUP,
                        PYTORCH_VERSION,
                        ns,
                        PYTORCH_PLURAL,
                        name,
                        {"status": {"conditions": [condition]}},
                    )

    @staticmethod
    def _replicas(job: JSON) -> dict[str, tuple[str, int, JSON]]:
        name = job["metadata"]["name"]
        wanted: dict[str, tuple[str, int, JSON]] = {}
        for role, spec in (job.get("spec", {}).get("pytorchReplicaSpecs") or {}).items():
            for i in range(int(spec.get("replicas", 1))):
                wanted[f"{name}-{role.lower()}-{i}"] = (role, i, spec.get("template") or {})
        return wanted

    @staticmethod
    def _pod(job: JSON, name: str, role: str, index: int, template: JSON) -> JSON:
        meta = template.get("metadata") or {}
        labels = {
            **(meta.get("labels") or {}),
            LABEL_PYTORCH_JOB: job["metadata"]["name"],
            LABEL_PYTORCH_ROLE: role.lower(),
            LABEL_PYTORCH_INDEX: str(index),
        }
        owner = {
            "apiVersion": f"{PYTORCH_GROUP}/{PYTORCH_VERSION}",
            "kind": "PyTorchJob",
            "name": job["metadata"]["name"],
            "uid": job["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": meta.get("annotations") or {},
                "ownerReferences": [owner],
            },
            "spec": template.get("spec") or {},
        }
