"""Stand-in operators: each creates what its operator creates, in the same order and on the same conditions.

The real operators cannot run against the test control plane (no images,
no kubelets), yet what the scheduler must cope with is exactly how they
create pods: the owner chain, the labels, and above all *when* a later
stage appears (after the earlier one is scheduled, ready or complete). Each
class here does one operator's part, following the source file and revision
its docstring cites (the findings are in ``OPERATORS.md`` beside this file):
``step()`` reads the API server and does what that operator's reconcile
would do next, nothing more. A test loops, stepping the stand-ins and the
stand-in :class:`Kubelet` while the connected scheduler binds, until what it
waits for holds (:func:`drive`).

Where a batch Job is involved the kube-controller-manager's Job controller
runs for real (``ControlPlane.extra_controllers("job")``): the stand-ins
create Jobs, never the Jobs' pods.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from kubernetes import client

from gpuwarden import contract
from gpuwarden.localcluster.devices import DeviceManager
from tests.harness import complete_pod_deletion, mark_pod_finished, mark_pod_running
from tests.scheduler.cluster.owner_crds import JOBSET, LEADERWORKERSET, PYTORCHJOB, RAYCLUSTER, TRAINJOB, OwnerKind
from tests.waiting import wait_for

JSON = dict[str, Any]
IMAGE = "registry.invalid/train:1"

# JobSet's keys (kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go).
JS_NAME = "jobset.sigs.k8s.io/jobset-name"
JS_UID = "jobset.sigs.k8s.io/jobset-uid"
JS_RJOB = "jobset.sigs.k8s.io/replicatedjob-name"
JS_RJOB_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"
JS_GLOBAL_REPLICAS = "jobset.sigs.k8s.io/global-replicas"
JS_JOB_INDEX = "jobset.sigs.k8s.io/job-index"
JS_JOB_GLOBAL_INDEX = "jobset.sigs.k8s.io/job-global-index"
JS_JOB_KEY = "jobset.sigs.k8s.io/job-key"
JS_RESTART = "jobset.sigs.k8s.io/restart-attempt"
# Trainer v2 (kubeflow/trainer pkg/constants).
TRAINER_STEP = "trainer.kubeflow.org/trainjob-ancestor-step"
# LeaderWorkerSet (kubernetes-sigs/lws api/leaderworkerset/v1/leaderworkerset_types.go).
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"
LWS_REVISION = "leaderworkerset.sigs.k8s.io/template-revision-hash"
LWS_SIZE = "leaderworkerset.sigs.k8s.io/size"
LWS_LEADER_NAME = "leaderworkerset.sigs.k8s.io/leader-name"
LWS_EXCLUSIVE = "leaderworkerset.sigs.k8s.io/exclusive-topology"
# Kubeflow (training-operator and mpi-operator).
KF_OPERATOR = "training.kubeflow.org/operator-name"
KF_JOB_NAME = "training.kubeflow.org/job-name"
KF_JOB_ROLE = "training.kubeflow.org/job-role"
KF_REPLICA_TYPE = "training.kubeflow.org/replica-type"
KF_REPLICA_INDEX = "training.kubeflow.org/replica-index"
# KubeRay (ray-project/kuberay ray-operator/controllers/ray/utils/constant.go).
RAY_CLUSTER = "ray.io/cluster"
RAY_NODE_TYPE = "ray.io/node-type"
RAY_GROUP = "ray.io/group"


class Steps(Protocol):
    """A stand-in: one reconcile of what it stands in for."""

    def step(self) -> None: ...


def _raw(response: Any) -> Any:
    return json.loads(response.data)


def controller_ref(obj: Mapping[str, Any]) -> JSON:
    """``metav1.NewControllerRef`` / controller-runtime's ``SetControllerReference``."""
    meta = obj["metadata"]
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def pod_template(labels: Mapping[str, str] | None = None, *, gpus: int = 1, container: str = "main") -> JSON:
    """A pod template as a gpuwarden user writes it: the operator's example, plus schedulerName and a GPU request."""
    resources: JSON = {"requests": {"cpu": "1", "memory": "4Gi"}}
    if gpus:
        resources["requests"][contract.RESOURCE_NVIDIA_GPU] = str(gpus)
        resources["limits"] = {contract.RESOURCE_NVIDIA_GPU: str(gpus)}
    return {
        "metadata": {"labels": dict(labels or {})},
        "spec": {
            "schedulerName": contract.SCHEDULER_NAME,
            "containers": [{"name": container, "image": IMAGE, "resources": resources}],
        },
    }


def is_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def is_bound(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))


def phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


class Kube:
    """The few reads and writes the stand-ins make, as raw JSON (as the operators' typed clients see it)."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.namespace = namespace
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    def pods(self, selector: str = "") -> list[JSON]:
        listed = self.core.list_namespaced_pod(self.namespace, label_selector=selector, _preload_content=False)
        # A list's items carry no kind; the typed objects an operator reads do.
        items: list[JSON] = [{"apiVersion": "v1", "kind": "Pod", **p} for p in _raw(listed)["items"]]
        return sorted(items, key=lambda p: p["metadata"]["name"])

    def jobs(self, selector: str) -> dict[str, JSON]:
        listed = self.batch.list_namespaced_job(self.namespace, label_selector=selector, _preload_content=False)
        return {j["metadata"]["name"]: j for j in _raw(listed)["items"]}

    def get(self, kind: OwnerKind, name: str) -> JSON | None:
        try:
            got: JSON = self.custom.get_namespaced_custom_object(
                kind.group, kind.version, self.namespace, kind.plural, name
            )
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return got

    def create(self, kind: OwnerKind, body: JSON) -> JSON:
        made: JSON = self.custom.create_namespaced_custom_object(
            kind.group, kind.version, self.namespace, kind.plural, body
        )
        return made

    def create_pod(self, body: JSON) -> None:
        try:
            self.core.create_namespaced_pod(self.namespace, body)
        except client.ApiException as exc:
            if exc.status != 409:  # made by an earlier step whose read came before the write was visible
                raise

    def create_job(self, body: JSON) -> None:
        try:
            self.batch.create_namespaced_job(self.namespace, body)
        except client.ApiException as exc:
            if exc.status != 409:
                raise


def drive(
    steppers: Iterable[Steps],
    until: Callable[[], bool],
    *,
    timeout: float = 60.0,
    description: str,
) -> None:
    """Step every stand-in (operators first, the kubelet last) until ``until()`` holds, while the scheduler binds."""
    order = list(steppers)

    def turn() -> bool:
        for stepper in order:
            stepper.step()
        return until()

    wait_for(turn, timeout, interval=0.2, description=description)


class Kubelet:
    """The kubelets of the fake nodes: a bound pod runs and is Ready soon after it is bound.

    ``finishes`` names the pods that exit (code 0) a step after they run, as
    an initializer or a finished worker does. A deleted pod (by its operator)
    is removed for good, as a kubelet does once its containers stopped; the
    names are kept in :attr:`deleted`, so a test can tell them from evictions.

    Every node has its kubelet's device manager
    (:class:`gpuwarden.localcluster.devices.DeviceManager`): a pod bound
    there gets its GPUs from it, chosen among those the device plugin
    offers and never from gpuwarden's assignment, and one it cannot serve
    fails at admission (UnexpectedAdmissionError) as on a real kubelet.
    ``devices`` names a node's manager (one a sim agent reads over
    PodResources); a node without one gets a plain manager offering as many
    devices as the Node's allocatable ``nvidia.com/gpu``. :attr:`refused`
    counts the pods refused: a test that expects every bound pod to run
    checks it is 0, i.e. gpuwarden never bound more GPUs than a node has.
    """

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        finishes: Callable[[JSON], bool] = lambda _pod: False,
        devices: Mapping[str, DeviceManager] | None = None,
    ) -> None:
        self.api = api
        self.kube = Kube(api, namespace)
        self.finishes = finishes
        self.devices = dict(devices or {})
        self.deleted: set[str] = set()

    @property
    def refused(self) -> int:
        """Pods the nodes' device managers could not serve (failed at admission)."""
        return sum(m.refused for m in self.devices.values())

    def _manager(self, node: str) -> DeviceManager | None:
        if not node:
            return None
        found = self.devices.get(node)
        if found is None:
            obj = client.CoreV1Api(self.api).read_node(node)
            count = int((obj.status.allocatable or {}).get(contract.RESOURCE_NVIDIA_GPU, "0"))
            ids = tuple(f"GPU-{node}-{i}" for i in range(count))
            found = self.devices[node] = DeviceManager(lambda: ids, node=node)
        return found

    def step(self) -> None:
        ns = self.kube.namespace
        for pod in self.kube.pods():
            name = pod["metadata"]["name"]
            manager = self._manager(str(pod["spec"].get("nodeName") or ""))
            if pod["metadata"].get("deletionTimestamp"):
                self.deleted.add(name)
                complete_pod_deletion(self.api, name, ns)
                if manager is not None:
                    manager.release(ns, name)
            elif not is_bound(pod):
                continue
            elif phase(pod) == "Pending":
                with contextlib.suppress(client.ApiException):  # deleted meanwhile
                    if manager is not None and manager.admit(pod) is None:
                        mark_pod_finished(self.api, name, ns, succeeded=False)
                        continue
                    mark_pod_running(self.api, name, ns)
            elif phase(pod) == "Running" and self.finishes(pod):
                with contextlib.suppress(client.ApiException):
                    mark_pod_finished(self.api, name, ns)
                    if manager is not None:
                        manager.release(ns, name)  # its containers stopped


# -- JobSet and Trainer v2 ------------------------------------------------------


def _job_hash_key(namespace: str, name: str) -> str:
    """jobset_controller.go ``JobHashKey``: sha1 of ``<namespace>/<job name>``."""
    return hashlib.sha1(f"{namespace}/{name}".encode(), usedforsecurity=False).hexdigest()


def _job_size(spec: Mapping[str, Any]) -> int:
    parallelism = int(spec.get("parallelism", 1))
    completions = spec.get("completions")
    return min(parallelism, int(completions)) if completions is not None else parallelism


def _job_ready(job: Mapping[str, Any]) -> bool:
    status = job.get("status") or {}
    return int(status.get("ready") or 0) + int(status.get("succeeded") or 0) >= _job_size(job["spec"])


def _job_finished(job: Mapping[str, Any], kind: str) -> bool:
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


class JobSetStandIn:
    """The JobSet controller, for one JobSet: its Jobs, stage by stage.

    Follows kubernetes-sigs/jobset@08dfbdfd6827
    ``pkg/controllers/jobset_controller.go`` (``reconcileReplicatedJobs``,
    ``constructJob``, ``labelAndAnnotateObject``), ``pkg/controllers/depends_on.go``
    (``dependencyReachedStatus``) and ``pkg/controllers/startup_policy.go``
    (``inOrderStartupPolicy``), with the webhook's defaults
    (``pkg/webhooks/jobset_webhook.go``: ``replicas: 1``, ``completionMode:
    Indexed``, ``restartPolicy: OnFailure``, the JobSet name as subdomain).
    A replicated job with ``dependsOn`` gets its Jobs once each dependency
    has all its Jobs Ready (``status.ready + succeeded >= min(parallelism,
    completions)``) or Complete; under ``startupPolicy: InOrder`` one
    replicated job at a time, the next once every Job of it is started.
    The Jobs' pods come from the real Job controller.
    """

    def __init__(self, api: client.ApiClient, namespace: str, name: str) -> None:
        self.kube = Kube(api, namespace)
        self.name = name

    def step(self) -> None:
        jobset = self.kube.get(JOBSET, self.name)
        if jobset is None:
            return
        spec = jobset["spec"]
        rjobs = spec["replicatedJobs"]
        jobs = self.kube.jobs(f"{JS_NAME}={self.name}")
        in_order = (spec.get("startupPolicy") or {}).get("startupPolicyOrder") == "InOrder"
        global_replicas = sum(int(r.get("replicas", 1)) for r in rjobs)
        offset = 0
        for rjob in rjobs:
            replicas = int(rjob.get("replicas", 1))
            names = [f"{self.name}-{rjob['name']}-{i}" for i in range(replicas)]
            if not self._dependencies_reached(rjobs, rjob, jobs):
                offset += replicas
                continue
            for index, name in enumerate(names):
                if name not in jobs:
                    self.kube.create_job(self._job(jobset, rjob, index, offset + index, global_replicas))
            if in_order and not all(n in jobs and self._started(jobs[n]) for n in names):
                return  # inOrderStartupPolicy: the next replicated job waits for this one
            offset += replicas

    def _rjob_jobs(self, rjob_name: str, rjobs: list[JSON], jobs: Mapping[str, JSON]) -> list[JSON | None]:
        (rjob,) = [r for r in rjobs if r["name"] == rjob_name]
        return [jobs.get(f"{self.name}-{rjob_name}-{i}") for i in range(int(rjob.get("replicas", 1)))]

    def _dependencies_reached(self, rjobs: list[JSON], rjob: JSON, jobs: Mapping[str, JSON]) -> bool:
        for dep in rjob.get("dependsOn") or []:
            made = self._rjob_jobs(dep["name"], rjobs, jobs)
            if dep["status"] == "Complete":
                reached = all(j is not None and _job_finished(j, "Complete") for j in made)
            else:  # Ready: ready + succeeded + failed Jobs == replicas
                reached = all(j is not None and (_job_ready(j) or _job_finished(j, "Failed")) for j in made)
            if not reached:
                return False
        return True

    @staticmethod
    def _started(job: Mapping[str, Any]) -> bool:
        return _job_ready(job) or _job_finished(job, "Complete") or _job_finished(job, "Failed")

    def _job(self, jobset: JSON, rjob: JSON, index: int, global_index: int, global_replicas: int) -> JSON:
        ns = self.kube.namespace
        name = f"{self.name}-{rjob['name']}-{index}"
        keys = {
            JS_NAME: self.name,
            JS_UID: jobset["metadata"]["uid"],
            JS_RJOB: rjob["name"],
            JS_RJOB_REPLICAS: str(rjob.get("replicas", 1)),
            JS_GLOBAL_REPLICAS: str(global_replicas),
            JS_JOB_INDEX: str(index),
            JS_JOB_GLOBAL_INDEX: str(global_index),
            JS_JOB_KEY: _job_hash_key(ns, name),
            JS_RESTART: "0",
        }
        template = copy.deepcopy(rjob["template"])
        meta = template.setdefault("metadata", {})
        job_spec = template["spec"]
        job_spec.setdefault("completionMode", "Indexed")
        pod = job_spec["template"]
        pod_meta = pod.setdefault("metadata", {})
        pod_meta["labels"] = {**(pod_meta.get("labels") or {}), **keys}
        pod_meta["annotations"] = {**(pod_meta.get("annotations") or {}), **keys}
        pod["spec"].setdefault("restartPolicy", "OnFailure")
        pod["spec"].setdefault("subdomain", self.name)
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "labels": {**(meta.get("labels") or {}), **keys},
                "annotations": {**(meta.get("annotations") or {}), **keys},
                "ownerReferences": [controller_ref(jobset)],
            },
            "spec": job_spec,
        }


class TrainJobStandIn:
    """Kubeflow Trainer v2, for one TrainJob: the JobSet its runtime describes, then that JobSet's Jobs.

    Follows kubeflow/trainer@8c0f5059bd51
    ``pkg/runtime/framework/plugins/jobset/jobset.go`` (``Build``) and
    ``builder.go`` (``Initializer``, ``Trainer``): the JobSet is named as the
    TrainJob and owned by it, carries the runtime template's labels (not
    the TrainJob's), and its replicated job labelled
    ``trainjob-ancestor-step: trainer`` runs ``numNodes`` pods
    (``parallelism = completions``). ``runtime`` is the
    ClusterTrainingRuntime's spec (``mlPolicy``, ``template``): the test
    control plane serves no runtime kinds, so the stand-in is handed it.
    Then the JobSet controller's part, by :class:`JobSetStandIn`.
    """

    def __init__(self, api: client.ApiClient, namespace: str, name: str, runtime: JSON) -> None:
        self.kube = Kube(api, namespace)
        self.name = name
        self.runtime = runtime
        self.jobset = JobSetStandIn(api, namespace, name)

    def step(self) -> None:
        if self.kube.get(JOBSET, self.name) is None:
            trainjob = self.kube.get(TRAINJOB, self.name)
            if trainjob is None:
                return
            self.kube.create(JOBSET, self._jobset(trainjob))
        self.jobset.step()

    def _jobset(self, trainjob: JSON) -> JSON:
        template = copy.deepcopy(self.runtime["template"])
        trainer = trainjob["spec"].get("trainer") or {}
        nodes = int(trainer.get("numNodes", self.runtime.get("mlPolicy", {}).get("numNodes", 1)))
        for rjob in template["spec"]["replicatedJobs"]:
            if (rjob["template"].get("metadata") or {}).get("labels", {}).get(TRAINER_STEP) != "trainer":
                continue
            rjob["replicas"] = 1
            rjob["template"]["spec"]["parallelism"] = nodes
            rjob["template"]["spec"]["completions"] = nodes
        meta = template.get("metadata") or {}
        return {
            "apiVersion": JOBSET.api_version,
            "kind": JOBSET.kind,
            "metadata": {
                "name": self.name,
                "labels": dict(meta.get("labels") or {}),
                "annotations": dict(meta.get("annotations") or {}),
                "ownerReferences": [controller_ref(trainjob)],
            },
            "spec": template["spec"],
        }


# -- LeaderWorkerSet --------------------------------------------------------------


def _group_key(namespace: str, leader: str) -> str:
    """The LWS pod webhook's group key: a sha1 of ``<namespace>/<leader pod name>``."""
    return hashlib.sha1(f"{namespace}/{leader}".encode(), usedforsecurity=False).hexdigest()


class LeaderWorkerSetStandIn:
    """The LeaderWorkerSet controller, its pod controller and webhook, with the StatefulSet controller's pods.

    Follows kubernetes-sigs/lws@060ab4da17ee
    ``pkg/controllers/leaderworkerset_controller.go``
    (``constructLeaderStatefulSetApplyConfiguration``), ``pkg/controllers/pod_controller.go``
    (``Reconcile``, ``constructWorkerStatefulSetApplyConfiguration``,
    ``setNodeSelectorForWorkerPods``) and ``pkg/webhooks/pod_webhook.go``
    (``Default``). The leader StatefulSet ``<lws>`` (owned by the LWS) and
    its pods ``<lws>-<i>``; per leader, a worker StatefulSet named as the
    leader pod and owned by it, with pods ``<lws>-<i>-<j>``, created once
    the leader exists (``LeaderCreated``), is Ready (``LeaderReady``) or,
    with the exclusive-topology annotation, is scheduled (then its workers
    get a nodeSelector on the leader's topology value). The StatefulSet
    controller does not run here; the stand-in makes its pods, with the
    StatefulSet as their controller, as it would.
    """

    def __init__(self, api: client.ApiClient, namespace: str, name: str) -> None:
        self.kube = Kube(api, namespace)
        self.name = name

    def step(self) -> None:
        lws = self.kube.get(LEADERWORKERSET, self.name)
        if lws is None:
            return
        spec = lws["spec"]
        template = spec["leaderWorkerTemplate"]
        size = int(template.get("size", 1))
        leader_template = template.get("leaderTemplate") or template["workerTemplate"]
        leader_sts = self._statefulset(self.name, lws, int(spec.get("replicas", 1)), leader_template, lws)
        pods = {p["metadata"]["name"]: p for p in self.kube.pods(f"{LWS_NAME}={self.name}")}
        exclusive = (lws["metadata"].get("annotations") or {}).get(LWS_EXCLUSIVE)
        for i in range(int(spec.get("replicas", 1))):
            leader = f"{self.name}-{i}"
            if leader not in pods:
                labels = {LWS_WORKER_INDEX: "0", LWS_GROUP_INDEX: str(i)}
                self._pod(leader, leader_sts, leader_template, labels, {LWS_SIZE: str(size)}, leader, exclusive)
                continue
            if size == 1 or not self._leader_allows_workers(spec, pods[leader], exclusive):
                continue
            worker_sts = self._statefulset(
                leader, pods[leader], size - 1, template["workerTemplate"], lws, selector_value=leader
            )
            node_selector = None
            if exclusive:
                node = self.kube.core.read_node(pods[leader]["spec"]["nodeName"])
                node_selector = {exclusive: node.metadata.labels[exclusive]}
            for j in range(1, size):
                name = f"{leader}-{j}"
                if name not in pods:
                    labels = {LWS_WORKER_INDEX: str(j), LWS_GROUP_INDEX: str(i)}
                    notes = {LWS_SIZE: str(size), LWS_LEADER_NAME: leader}
                    self._pod(
                        name, worker_sts, template["workerTemplate"], labels, notes, leader, exclusive, node_selector
                    )

    @staticmethod
    def _leader_allows_workers(spec: Mapping[str, Any], leader: JSON, exclusive: str | None) -> bool:
        if exclusive:
            return is_bound(leader)  # pod_controller.go: the leader must be scheduled first
        if spec.get("startupPolicy") == "LeaderReady":
            return is_ready(leader)
        return True  # LeaderCreated

    def _statefulset(
        self,
        name: str,
        owner: JSON,
        replicas: int,
        template: JSON,
        lws: JSON,
        *,
        selector_value: str | None = None,
    ) -> JSON:
        """The StatefulSet ``name`` (made if missing): leader set (owned by the LWS) or a group's worker set."""
        try:
            found: JSON = _raw(
                self.kube.apps.read_namespaced_stateful_set(name, self.kube.namespace, _preload_content=False)
            )
            return found
        except client.ApiException as exc:
            if exc.status != 404:
                raise
        select = {LWS_NAME: self.name}
        if selector_value is not None:
            select = {**select, LWS_GROUP_KEY: _group_key(self.kube.namespace, selector_value)}
        else:
            select = {**select, LWS_WORKER_INDEX: "0"}
        pod = copy.deepcopy(template)
        pod.setdefault("metadata", {})["labels"] = {**(pod["metadata"].get("labels") or {}), **select}
        body = {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {
                "name": name,
                "labels": dict(lws["metadata"].get("labels") or {}),
                "annotations": dict(lws["metadata"].get("annotations") or {}),
                "ownerReferences": [controller_ref(owner)],
            },
            "spec": {
                "replicas": replicas,
                "podManagementPolicy": "Parallel",
                "serviceName": self.name,
                "selector": {"matchLabels": select},
                "template": pod,
            },
        }
        made = self.kube.apps.create_namespaced_stateful_set(self.kube.namespace, body, _preload_content=False)
        created: JSON = _raw(made)
        return created

    def _pod(  # noqa: PLR0917
        self,
        name: str,
        statefulset: JSON,
        template: JSON,
        labels: Mapping[str, str],
        annotations: Mapping[str, str],
        leader: str,
        exclusive: str | None,
        node_selector: Mapping[str, str] | None = None,
    ) -> None:
        """A pod of ``statefulset``, as the StatefulSet controller makes it and the LWS pod webhook completes it."""
        pod = copy.deepcopy(template)
        meta = pod.get("metadata") or {}
        notes = {**(meta.get("annotations") or {}), **annotations}
        if exclusive:
            notes[LWS_EXCLUSIVE] = exclusive
        spec = pod["spec"]
        spec.setdefault("restartPolicy", "Always")
        if node_selector:
            spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **node_selector}
        self.kube.create_pod(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "labels": {
                        **(meta.get("labels") or {}),
                        LWS_NAME: self.name,
                        LWS_REVISION: "1",
                        LWS_GROUP_KEY: _group_key(self.kube.namespace, leader),
                        **labels,
                    },
                    "annotations": notes,
                    "ownerReferences": [controller_ref(statefulset)],
                },
                "spec": {**spec, "hostname": name, "subdomain": self.name},
            }
        )


# -- mpi-operator v2 ----------------------------------------------------------------


class MPIJobStandIn:
    """mpi-operator's controller (MPIJob ``kubeflow.org/v2beta1``): worker pods, then the launcher Job.

    Follows kubeflow/mpi-operator@caa3c47fc42e ``pkg/controller/mpi_job_controller.go``
    (``syncHandler``, ``getOrCreateWorker``, ``newWorker``, ``newLauncherJob``,
    ``countReadyWorkerPods``, ``defaultLabels``): worker pods
    ``<job>-worker-<i>`` owned by the MPIJob, labelled with the operator,
    job name, ``job-role: worker`` and the replica index; the launcher is a
    batch Job ``<job>-launcher`` owned by the MPIJob, created in the same
    pass with ``launcherCreationPolicy: AtStartup`` and, with
    ``WaitForWorkersReady``, only once every worker pod is Ready. The
    launcher's pod comes from the real Job controller.
    """

    def __init__(self, api: client.ApiClient, namespace: str, kind: OwnerKind, name: str) -> None:
        self.kube = Kube(api, namespace)
        self.kind = kind
        self.name = name

    def _labels(self, role: str) -> dict[str, str]:
        return {KF_OPERATOR: "mpi-operator", KF_JOB_NAME: self.name, KF_JOB_ROLE: role}

    def step(self) -> None:
        mpijob = self.kube.get(self.kind, self.name)
        if mpijob is None:
            return
        specs = mpijob["spec"]["mpiReplicaSpecs"]
        workers = {p["metadata"]["name"]: p for p in self.kube.pods(f"{KF_JOB_NAME}={self.name},{KF_JOB_ROLE}=worker")}
        replicas = int(specs["Worker"].get("replicas", 1))
        for i in range(replicas):
            name = f"{self.name}-worker-{i}"
            if name in workers:
                continue
            template = copy.deepcopy(specs["Worker"]["template"])
            labels = {**(template.get("metadata") or {}).get("labels", {}), **self._labels("worker")}
            labels[KF_REPLICA_INDEX] = str(i)
            self.kube.create_pod(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name, "labels": labels, "ownerReferences": [controller_ref(mpijob)]},
                    "spec": {**template["spec"], "hostname": name, "subdomain": self.name},
                }
            )
        policy = mpijob["spec"].get("launcherCreationPolicy", "AtStartup")
        ready = sum(1 for p in workers.values() if is_ready(p))
        if policy == "WaitForWorkersReady" and ready < replicas:
            return  # countReadyWorkerPods(worker) != len(worker): no launcher yet
        if f"{self.name}-launcher" not in self.kube.jobs(f"app={self.name}"):
            self.kube.create_job(self._launcher(mpijob))

    def _launcher(self, mpijob: JSON) -> JSON:
        template = copy.deepcopy(mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"])
        meta = template.setdefault("metadata", {})
        meta["labels"] = {**(meta.get("labels") or {}), **self._labels("launcher")}
        template["spec"].setdefault("restartPolicy", "OnFailure")
        template["spec"]["hostname"] = f"{self.name}-launcher"
        template["spec"]["subdomain"] = self.name
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": f"{self.name}-launcher",
                "labels": {"app": self.name},
                "ownerReferences": [controller_ref(mpijob)],
            },
            "spec": {"backoffLimit": 6, "podReplacementPolicy": "Failed", "template": template},
        }


# -- KubeRay ------------------------------------------------------------------------


def ray_desired_workers(group: Mapping[str, Any]) -> int:
    """utils/util.go ``GetWorkerGroupDesiredReplicas``: replicas clamped to [minReplicas, maxReplicas], x numOfHosts."""
    if group.get("suspend") is True:
        return 0
    minimum = int(group.get("minReplicas", 0))
    maximum = int(group.get("maxReplicas", 2**31 - 1))
    replicas = group.get("replicas")
    chosen = minimum if replicas is None or int(replicas) < minimum else min(int(replicas), maximum)
    return chosen * int(group.get("numOfHosts", 1))


class RayClusterStandIn:
    """KubeRay's RayCluster controller: the head and each group's workers, created or deleted to the desired count.

    Follows ray-project/kuberay@feeaf72facab
    ``ray-operator/controllers/ray/raycluster_controller.go``
    (``reconcilePods``, ``createHeadPod``, ``createWorkerPod``),
    ``ray-operator/controllers/ray/common/pod.go`` (``labelPod``) and
    ``utils/util.go`` (``GetWorkerGroupDesiredReplicas``): head and workers
    in one reconcile, without waiting for each other; pods named
    ``<cluster>-head-<random>`` and ``<cluster>-<group>-worker-<random>``;
    a group above its desired count (autoscaling off) loses workers chosen
    at random: here the newest, which is as good a pick.
    """

    def __init__(self, api: client.ApiClient, namespace: str, name: str) -> None:
        self.kube = Kube(api, namespace)
        self.name = name

    def _labels(self, node_type: str, group: str) -> dict[str, str]:
        return {
            "ray.io/is-ray-node": "yes",
            RAY_CLUSTER: self.name,
            RAY_NODE_TYPE: node_type,
            RAY_GROUP: group,
            "ray.io/identifier": f"{self.name}-{node_type}",
            "app.kubernetes.io/name": "kuberay",
            "app.kubernetes.io/created-by": "kuberay-operator",
        }

    def _create(self, cluster: JSON, template: JSON, prefix: str, labels: dict[str, str]) -> None:
        pod = copy.deepcopy(template)
        meta = pod.get("metadata") or {}
        self.kube.core.create_namespaced_pod(
            self.kube.namespace,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "generateName": prefix,
                    "labels": {**(meta.get("labels") or {}), **labels},
                    "ownerReferences": [controller_ref(cluster)],
                },
                "spec": {**pod["spec"], "restartPolicy": pod["spec"].get("restartPolicy", "Always")},
            },
        )

    def step(self) -> None:
        cluster = self.kube.get(RAYCLUSTER, self.name)
        if cluster is None:
            return
        pods = [p for p in self.kube.pods(f"{RAY_CLUSTER}={self.name}") if not p["metadata"].get("deletionTimestamp")]
        spec = cluster["spec"]
        if not any(p["metadata"]["labels"][RAY_NODE_TYPE] == "head" for p in pods):
            self._create(
                cluster, spec["headGroupSpec"]["template"], f"{self.name}-head-", self._labels("head", "headgroup")
            )
        for group in spec.get("workerGroupSpecs") or []:
            name = group["groupName"]
            mine = [p for p in pods if p["metadata"]["labels"][RAY_GROUP] == name]
            desired = ray_desired_workers(group)
            for _ in range(desired - len(mine)):
                self._create(cluster, group["template"], f"{self.name}-{name}-worker-", self._labels("worker", name))
            newest = sorted(mine, key=lambda p: (p["metadata"]["creationTimestamp"], p["metadata"]["name"]))
            for pod in newest[desired:]:
                self.kube.core.delete_namespaced_pod(pod["metadata"]["name"], self.kube.namespace)


# -- Kubeflow training-operator v1 ------------------------------------------------


class PyTorchJobStandIn:
    """The training-operator's PyTorchJob controller: every replica's pod in one pass.

    Follows kubeflow/trainer@4445c12aa62e (v1.9.4)
    ``pkg/controller.v1/common/pod.go`` (``ReconcilePods``, ``createNewPod``)
    and ``pkg/controller.v1/common/job_controller.go`` (``GenLabels``,
    ``GenOwnerReference``): pods ``<job>-<type>-<i>`` owned by the
    PyTorchJob, labelled with the operator, job name, lower-cased replica
    type and index, ``job-role: master`` on the Master. An exited pod keeps
    its phase and is never re-created (``restartPolicy: OnFailure`` restarts
    in place; ``cleanPodPolicy: None`` keeps it after the job ends).
    """

    def __init__(self, api: client.ApiClient, namespace: str, name: str) -> None:
        self.kube = Kube(api, namespace)
        self.name = name

    def step(self) -> None:
        job = self.kube.get(PYTORCHJOB, self.name)
        if job is None:
            return
        existing = {p["metadata"]["name"] for p in self.kube.pods(f"{KF_JOB_NAME}={self.name}")}
        for rtype, replica in sorted(job["spec"]["pytorchReplicaSpecs"].items()):
            for i in range(int(replica.get("replicas", 1))):
                name = f"{self.name}-{rtype.lower()}-{i}"
                if name in existing:
                    continue
                template = copy.deepcopy(replica["template"])
                labels = {
                    **(template.get("metadata") or {}).get("labels", {}),
                    KF_OPERATOR: "pytorchjob-controller",
                    KF_JOB_NAME: self.name,
                    KF_REPLICA_TYPE: rtype.lower(),
                    KF_REPLICA_INDEX: str(i),
                }
                if rtype == "Master":
                    labels[KF_JOB_ROLE] = "master"
                spec = {**template["spec"], "restartPolicy": replica.get("restartPolicy", "OnFailure")}
                self.kube.create_pod(
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {"name": name, "labels": labels, "ownerReferences": [controller_ref(job)]},
                        "spec": spec,
                    }
                )
