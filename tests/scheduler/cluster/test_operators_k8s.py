"""Each operator's workload, created stage by stage by its stand-in, scheduled by the connected scheduler.

The scheduler runs as in a cluster: a :class:`SchedulerRunner` in a thread,
as the scheduler's ServiceAccount, watching the real API server. The
stand-in operators of :mod:`tests.scheduler.cluster.standins` create the
pods as their operators do, each later stage only once what its operator
waits for holds (the earlier pods Ready, scheduled or complete), and the
real Job controller makes the pods of every batch Job. Each test checks
that every pod got bound in the end, that nothing was evicted, and the
minMember of each derived PodGroup (one per stage where the operator
stages its pods).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes import client

from gpuwarden import contract
from scheduler.cluster.cycle import CycleResult
from scheduler.cluster.evict import EvictResult
from scheduler.cluster.leader import LeaderElectionConfig
from scheduler.engine.model import SchedulerConfig
from scheduler.runner import RunnerSettings, SchedulerRunner
from tests.harness import ControlPlane
from tests.scheduler.cluster.dra_fixtures import DRA
from tests.scheduler.cluster.fencing import LEASE_NAME, LEASE_NAMESPACE, forget_lease
from tests.scheduler.cluster.owner_crds import (
    JOBSET,
    LEADERWORKERSET,
    MPIJOB,
    PYTORCHJOB,
    RAYCLUSTER,
    SERVE_TIMEOUT_S,
    TRAINJOB,
    OwnerKind,
)
from tests.scheduler.cluster.standins import (
    JS_NAME,
    KF_JOB_NAME,
    LWS_NAME,
    RAY_CLUSTER,
    TRAINER_STEP,
    JobSetStandIn,
    Kube,
    Kubelet,
    LeaderWorkerSetStandIn,
    MPIJobStandIn,
    PyTorchJobStandIn,
    RayClusterStandIn,
    TrainJobStandIn,
    drive,
    is_bound,
    phase,
    pod_template,
)
from tests.scheduler.remediation.dra_objects import DRIVER
from tests.waiting import wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.usefixtures("owner_crds", "scheduler_rbac")]

JSON = dict[str, Any]
MPIJOB_V2 = OwnerKind(MPIJOB.group, "v2beta1", MPIJOB.kind, MPIJOB.plural)


@dataclass
class Scheduler:
    """The connected scheduler of one test, and every eviction it made (from each cycle, not only the last)."""

    runner: SchedulerRunner
    evictions: list[EvictResult] = field(default_factory=list)

    def record(self, result: CycleResult) -> None:
        self.evictions.extend(result.evictions)

    def assert_evicted_nothing(self) -> None:
        assert self.evictions == []
        last = self.runner.last
        assert last is not None
        assert last.evictions == ()
        assert last.decisions.evictions == ()


@pytest.fixture
def job_controller(control_plane: ControlPlane) -> Iterator[None]:
    """The kube-controller-manager's Job controller, for one test."""
    with control_plane.extra_controllers("job"):
        yield


@pytest.fixture
def scheduler(control_plane: ControlPlane, k8s: client.ApiClient) -> Iterator[Callable[..., Scheduler]]:
    """Starts the connected scheduler as its ServiceAccount on the shipped Lease; stops it after the test."""
    forget_lease(k8s)
    started: list[tuple[threading.Event, threading.Thread, client.ApiClient]] = []

    def start(config: SchedulerConfig | None = None) -> Scheduler:
        lease = LeaderElectionConfig(
            namespace=LEASE_NAMESPACE,
            name=LEASE_NAME,
            identity="operators",
            lease_duration_s=10.0,
            renew_deadline_s=8.0,
            retry_period_s=0.5,
        )
        api = control_plane.impersonate("gpuwarden-scheduler", "gpuwarden")
        settings = RunnerSettings(
            period_s=0.3, lease=lease, remediation=None, metrics_port=None, config=config or SchedulerConfig()
        )
        runner = SchedulerRunner(api, settings)
        found = Scheduler(runner)
        runner.on_cycle = found.record
        stop = threading.Event()
        thread = threading.Thread(target=runner.run, args=(stop,), name="operators-scheduler", daemon=True)
        thread.start()
        started.append((stop, thread, api))
        wait_for(runner.elector.is_leader, 20, description="the scheduler leading")
        return found

    try:
        yield start
    finally:
        for stop, _, _ in started:
            stop.set()
        for _, thread, api in started:
            thread.join(30)
            api.close()
        forget_lease(k8s)
    assert not any(thread.is_alive() for _, thread, _ in started)


# -- helpers -----------------------------------------------------------------------


def create(kube: Kube, kind: OwnerKind, name: str, spec: JSON, labels: dict[str, str] | None = None) -> JSON:
    body = {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": {"name": name, "labels": labels or {}}}
    return kube.create(kind, {**body, "spec": spec})


def min_members(k8s: client.ApiClient, namespace: str) -> dict[str, int]:
    items = client.CustomObjectsApi(k8s).list_namespaced_custom_object(
        contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION, namespace, contract.PODGROUP_PLURAL
    )["items"]
    return {g["metadata"]["name"]: g["spec"]["minMember"] for g in items}


def queues(k8s: client.ApiClient, namespace: str) -> set[str]:
    items = client.CustomObjectsApi(k8s).list_namespaced_custom_object(
        contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION, namespace, contract.PODGROUP_PLURAL
    )["items"]
    return {g["spec"]["queue"] for g in items}


def wait_for_groups(k8s: client.ApiClient, namespace: str, expected: dict[str, int]) -> None:
    """The derived PodGroups, exactly these, with these minMembers (bookkeeping writes may trail the binds)."""
    wait_for(lambda: min_members(k8s, namespace) == expected, 40, interval=0.3, description=f"PodGroups {expected}")


def all_bound(kube: Kube, selector: str, count: int) -> Callable[[], bool]:
    def check() -> bool:
        pods = kube.pods(selector)
        return len(pods) == count and all(is_bound(p) for p in pods)

    return check


def assert_nothing_evicted(found: Scheduler, kube: Kube, kubelet: Kubelet, deleted_by_operator: int = 0) -> None:
    found.assert_evicted_nothing()
    assert kubelet.refused == 0, "a device manager refused a pod: gpuwarden bound more GPUs than its node has"
    assert len(kubelet.deleted) == deleted_by_operator
    assert [p["metadata"]["name"] for p in kube.pods() if p["metadata"].get("deletionTimestamp")] == []


# -- JobSet ------------------------------------------------------------------------


@pytest.mark.usefixtures("job_controller")
def test_a_jobsets_dependent_replicated_job_is_created_once_the_first_is_ready_and_each_stage_is_its_own_gang(
    k8s: client.ApiClient,
    namespace: str,
    cluster: Callable[[int], list[str]],
    queue: Callable[..., str],
    scheduler: Callable[..., Scheduler],
) -> None:
    cluster(2)
    q = queue(64)
    found = scheduler()
    kube = Kube(k8s, namespace)
    leader = {"parallelism": 2, "completions": 2, "template": pod_template()}
    workers = {"parallelism": 4, "completions": 4, "template": pod_template()}
    js = create(
        kube,
        JOBSET,
        "serve",
        {
            "replicatedJobs": [
                {"name": "leader", "replicas": 1, "template": {"spec": leader}},
                {
                    "name": "workers",
                    "replicas": 2,
                    "dependsOn": [{"name": "leader", "status": "Ready"}],
                    "template": {"spec": workers},
                },
            ]
        },
        labels={contract.LABEL_QUEUE: q},
    )
    operator, kubelet = JobSetStandIn(k8s, namespace, "serve"), Kubelet(k8s, namespace)

    # Stage one alone: the workers' Jobs do not exist until the leader's pods are Ready.
    drive([operator, kubelet], all_bound(kube, f"{JS_NAME}=serve", 2), description="the leader stage bound")
    # (The kubelet marks pods Ready last in each turn: the stand-in has not seen them Ready yet.)
    assert set(kube.jobs(f"{JS_NAME}=serve")) == {"serve-leader-0"}
    drive(
        [operator, kubelet],
        all_bound(kube, f"{JS_NAME}=serve", 2 + 2 * 4),
        description="the workers' stage created and bound",
    )
    uid = js["metadata"]["uid"]
    wait_for_groups(k8s, namespace, {f"pg-serve-leader-{uid}": 2, f"pg-serve-workers-{uid}": 8})
    assert queues(k8s, namespace) == {q}
    assert_nothing_evicted(found, kube, kubelet)


@pytest.mark.usefixtures("job_controller")
def test_a_jobset_started_in_order_gets_each_replicated_job_after_the_previous_started(
    k8s: client.ApiClient,
    namespace: str,
    cluster: Callable[[int], list[str]],
    queue: Callable[..., str],
    scheduler: Callable[..., Scheduler],
) -> None:
    cluster(2)
    q = queue(64)
    found = scheduler()
    kube = Kube(k8s, namespace)
    rjobs = [
        {
            "name": name,
            "replicas": 1,
            "template": {"spec": {"parallelism": n, "completions": n, "template": pod_template()}},
        }
        for name, n in (("driver", 1), ("ps", 2), ("worker", 4))
    ]
    js = create(
        kube,
        JOBSET,
        "ordered",
        {"startupPolicy": {"startupPolicyOrder": "InOrder"}, "replicatedJobs": rjobs},
        labels={contract.LABEL_QUEUE: q},
    )
    operator, kubelet = JobSetStandIn(k8s, namespace, "ordered"), Kubelet(k8s, namespace)
    created: list[set[str]] = []

    def watch_order() -> bool:
        created.append(set(kube.jobs(f"{JS_NAME}=ordered")))
        return all_bound(kube, f"{JS_NAME}=ordered", 7)()

    drive([operator, kubelet], watch_order, description="every replicated job created in turn and bound")
    # The Jobs came one replicated job at a time, in spec order.
    seen = [s for i, s in enumerate(created) if i == 0 or s != created[i - 1]]
    assert seen[-1] == {"ordered-driver-0", "ordered-ps-0", "ordered-worker-0"}
    assert all(s in ({"ordered-driver-0"}, {"ordered-driver-0", "ordered-ps-0"}, seen[-1]) for s in seen)
    uid = js["metadata"]["uid"]
    wait_for_groups(
        k8s, namespace, {f"pg-ordered-driver-{uid}": 1, f"pg-ordered-ps-{uid}": 2, f"pg-ordered-worker-{uid}": 4}
    )
    assert_nothing_evicted(found, kube, kubelet)


# -- Trainer v2 -----------------------------------------------------------------------

# The shape of kubeflow/trainer@8c0f5059bd51 examples/yaml/05-multi-step.yaml's
# runtime (an initializer, then the trainer ``node`` job dependsOn it Complete),
# its pod templates as a gpuwarden user writes them (schedulerName, GPUs).
RUNTIME: JSON = {
    "mlPolicy": {"numNodes": 1},
    "template": {
        "metadata": {"labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "dataset-initializer",
                    "template": {
                        "metadata": {"labels": {TRAINER_STEP: "dataset-initializer"}},
                        "spec": {"template": pod_template(gpus=0, container="dataset-initializer")},
                    },
                },
                {
                    "name": "node",
                    "dependsOn": [{"name": "dataset-initializer", "status": "Complete"}],
                    "template": {
                        "metadata": {"labels": {TRAINER_STEP: "trainer"}},
                        "spec": {"template": pod_template(container="node")},
                    },
                },
            ]
        },
    },
}


@pytest.mark.usefixtures("job_controller")
def test_a_trainjob_runs_its_initializer_then_its_trainer_nodes_in_the_queue_labelled_on_the_trainjob(
    k8s: client.ApiClient,
    namespace: str,
    cluster: Callable[[int], list[str]],
    queue: Callable[..., str],
    scheduler: Callable[..., Scheduler],
) -> None:
    cluster(2)
    q = queue(64)
    found = scheduler()
    kube = Kube(k8s, namespace)
    create(
        kube,
        TRAINJOB,
        "tune",
        {"runtimeRef": {"name": "torch-with-dataset-init"}, "trainer": {"numNodes": 3}},
        labels={contract.LABEL_KAI_QUEUE: q},
    )
    operator = TrainJobStandIn(k8s, namespace, "tune", RUNTIME)
    # The initializer exits once it ran; the trainer nodes keep running.
    kubelet = Kubelet(k8s, namespace, finishes=lambda p: "dataset-initializer" in p["metadata"]["name"])

    def trained() -> bool:
        nodes = kube.pods(f"{JS_NAME}=tune,jobset.sigs.k8s.io/replicatedjob-name=node")
        return len(nodes) == 3 and all(is_bound(p) for p in nodes)

    drive([operator, kubelet], trained, description="the initializer completed and the trainer nodes bound")
    (initializer,) = kube.pods("jobset.sigs.k8s.io/replicatedjob-name=dataset-initializer")
    assert phase(initializer) == "Succeeded"
    jobset = kube.get(JOBSET, "tune")
    assert jobset is not None and jobset["metadata"]["ownerReferences"][0]["kind"] == "TrainJob"
    assert contract.LABEL_KAI_QUEUE not in jobset["metadata"]["labels"]
    uid = jobset["metadata"]["uid"]
    wait_for_groups(k8s, namespace, {f"pg-tune-dataset-initializer-{uid}": 1, f"pg-tune-node-{uid}": 3})
    # The label is on the TrainJob only; the JobSet and the pods carry none.
    assert queues(k8s, namespace) == {q}
    assert_nothing_evicted(found, kube, kubelet)


# -- LeaderWorkerSet ------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["LeaderReady", "exclusive-topology"])
def test_a_leaderworkerset_gets_its_workers_after_its_leaders_and_binds_every_group(  # noqa: PLR0917
    k8s: client.ApiClient,
    namespace: str,
    cluster: Callable[[int], list[str]],
    queue: Callable[..., str],
    scheduler: Callable[..., Scheduler],
    policy: str,
) -> None:
    cluster(2)
    q = queue(64)
    found = scheduler()
    kube = Kube(k8s, namespace)
    spec: JSON = {"replicas": 2, "leaderWorkerTemplate": {"size": 4, "workerTemplate": pod_template()}}
    annotations = {}
    if policy == "LeaderReady":
        spec["startupPolicy"] = "LeaderReady"
    else:
        annotations["leaderworkerset.sigs.k8s.io/exclusive-topology"] = "kubernetes.io/hostname"
    lws = kube.create(
        LEADERWORKERSET,
        {
            "apiVersion": LEADERWORKERSET.api_version,
            "kind": LEADERWORKERSET.kind,
            "metadata": {"name": "vllm", "labels": {contract.LABEL_QUEUE: q}, "annotations": annotations},
            "spec": spec,
        },
    )
    operator, kubelet = LeaderWorkerSetStandIn(k8s, namespace, "vllm"), Kubelet(k8s, namespace)
    if policy == "LeaderReady":
        drive([operator, kubelet], all_bound(kube, f"{LWS_NAME}=vllm", 2), description="the leaders bound")
        assert [p["metadata"]["name"] for p in kube.pods(f"{LWS_NAME}=vllm")] == ["vllm-0", "vllm-1"]
    drive([operator, kubelet], all_bound(kube, f"{LWS_NAME}=vllm", 2 * 4), description="both groups bound")

    uid = lws["metadata"]["uid"]
    wait_for_groups(k8s, namespace, {f"pg-vllm-0-{uid}": 1, f"pg-vllm-1-{uid}": 1})
    if policy == "exclusive-topology":
        # Each group's workers on its leader's node (the nodeSelector the LWS pod controller gives them).
        nodes: dict[str, set[str]] = {}
        for p in kube.pods(f"{LWS_NAME}=vllm"):
            nodes.setdefault(p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"], set()).add(
                p["spec"]["nodeName"]
            )
        assert all(len(n) == 1 for n in nodes.values()), nodes
    assert_nothing_evicted(found, kube, kubelet)


# -- mpi-operator v2 --------------------------------------------------------------------


@pytest.fixture
def mpijob_v2(k8s: client.ApiClient, owner_crds: object) -> Iterator[OwnerKind]:
    """mpijobs.kubeflow.org served at v2beta1 as well, for one test.

    The session's CRD (owner_crds.py) serves v1 only, for the training
    operator's MPIJob. A CRD may serve several versions with one stored;
    without a conversion webhook the API server changes only the
    apiVersion, which is all an open schema needs: v1 stays the storage
    version, v2beta1 is added and removed again after the test.
    """
    ext = client.ApiextensionsV1Api(k8s)
    name = MPIJOB.crd_name
    crd = ext.read_custom_resource_definition(name)
    (stored,) = [v for v in k8s.sanitize_for_serialization(crd.spec.versions) if v["name"] == MPIJOB.version]  # type: ignore[no-untyped-call]
    served = {**stored, "name": MPIJOB_V2.version, "storage": False}
    ext.patch_custom_resource_definition(name, {"spec": {"versions": [stored, served]}})
    custom = client.CustomObjectsApi(k8s)
    wait_for(
        lambda: (
            custom.list_namespaced_custom_object(MPIJOB_V2.group, MPIJOB_V2.version, "default", MPIJOB.plural)
            is not None
        ),
        SERVE_TIMEOUT_S,
        description="mpijobs served at v2beta1",
        ignore=(client.ApiException,),
    )
    try:
        yield MPIJOB_V2
    finally:
        ext.patch_custom_resource_definition(name, {"spec": {"versions": [stored]}})


@pytest.mark.usefixtures("job_controller")
def test_an_mpijob_waiting_for_its_workers_gets_its_launcher_once_they_are_ready_each_its_own_gang(  # noqa: PLR0917
    k8s: client.ApiClient,
    namespace: str,
    cluster: Callable[[int], list[str]],
    queue: Callable[..., str],
    scheduler: Callable[..., Scheduler],
    mpijob_v2: OwnerKind,
) -> None:
    cluster(2)
    q = queue(64)
    found = scheduler()
    kube = Kube(k8s, namespace)
    # kubeflow/mpi-operator@caa3c47f examples/v2beta1/pi/pi.yaml's shape, with
    # launcherCreationPolicy WaitForWorkersReady and GPUs on the workers.
    mpijob = create(
        kube,
        mpijob_v2,
        "pi",
        {
            "slotsPerWorker": 1,
            "launcherCreationPolicy": "WaitForWorkersReady",
            "runPolicy": {"cleanPodPolicy": "Running"},
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": pod_template(gpus=0, container="mpi-launcher")},
                "Worker": {"replicas": 4, "template": pod_template(gpus=4, container="mpi-worker")},
            },
        },
        labels={contract.LABEL_QUEUE: q},
    )
    operator, kubelet = MPIJobStandIn(k8s, namespace, mpijob_v2, "pi"), Kubelet(k8s, namespace)
    drive([operator, kubelet], all_bound(kube, f"{KF_JOB_NAME}=pi", 4), description="the workers bound")
    assert kube.jobs("app=pi") == {}  # no launcher before every worker is Ready
    drive([operator, kubelet], all_bound(kube, f"{KF_JOB_NAME}=pi", 4 + 1), description="workers, then the launcher")

    launcher = kube.jobs("app=pi")["pi-launcher"]
    assert launcher["metadata"]["ownerReferences"][0]["apiVersion"] == "kubeflow.org/v2beta1"
    wait_for_groups(
        k8s,
        namespace,
        {f"pg-pi-{mpijob['metadata']['uid']}": 4, f"pg-pi-launcher-{launcher['metadata']['uid']}": 1},
    )
    assert queues(k8s, namespace) == {q}
    assert_nothing_evicted(found, kube, kubelet)


# -- KubeRay ----------------------------------------------------------------------------


def test_a_raycluster_of_min_replicas_two_is_a_gang_of_three_that_follows_its_scale_down_without_evicting(
    k8s: client.ApiClient,
    namespace: str,
    cluster: Callable[[int], list[str]],
    queue: Callable[..., str],
    scheduler: Callable[..., Scheduler],
) -> None:
    cluster(1)
    q = queue(64)
    found = scheduler()
    kube = Kube(k8s, namespace)
    group: JSON = {
        "groupName": "gpu",
        # ``replicas`` omitted by the user: KubeRay's CRD stores its default, 0
        # (ray-project/kuberay@feeaf72f ray-operator/config/crd/bases/ray.io_rayclusters.yaml);
        # the test CRD defaults nothing, so the stored object is written as the real one reads.
        "replicas": 0,
        "minReplicas": 2,
        "maxReplicas": 2147483647,
        "numOfHosts": 1,
        "rayStartParams": {},
        "template": pod_template(gpus=2, container="ray-worker"),
    }
    rc = create(
        kube,
        RAYCLUSTER,
        "tune",
        {
            "headGroupSpec": {"rayStartParams": {}, "template": pod_template(gpus=0, container="ray-head")},
            "workerGroupSpecs": [group],
        },
        labels={contract.LABEL_QUEUE: q},
    )
    operator, kubelet = RayClusterStandIn(k8s, namespace, "tune"), Kubelet(k8s, namespace)
    drive([operator, kubelet], all_bound(kube, f"{RAY_CLUSTER}=tune", 3), description="head and two workers bound")
    name = f"pg-tune-{rc['metadata']['uid']}"
    wait_for_groups(k8s, namespace, {name: 3})
    cycles = found.runner.cycles

    # The user lowers minReplicas to 1; KubeRay deletes one worker. The gang follows to 2.
    kube.custom.patch_namespaced_custom_object(
        RAYCLUSTER.group,
        RAYCLUSTER.version,
        namespace,
        RAYCLUSTER.plural,
        "tune",
        {"spec": {"workerGroupSpecs": [{**group, "minReplicas": 1}]}},
    )

    def followed() -> bool:
        running = [p for p in kube.pods(f"{RAY_CLUSTER}=tune") if phase(p) == "Running"]
        return len(running) == 2 and min_members(k8s, namespace) == {name: 2} and found.runner.cycles > cycles + 3

    drive([operator, kubelet], followed, description="one worker gone, the PodGroup at 2")
    assert len(kube.pods(f"{RAY_CLUSTER}=tune")) == 2
    assert_nothing_evicted(found, kube, kubelet, deleted_by_operator=1)


# -- members finishing at different times ---------------------------------------------

GRACE_S = 2.0


def test_a_pytorchjobs_workers_finishing_one_by_one_never_get_the_rest_evicted_as_a_stale_gang(
    k8s: client.ApiClient,
    namespace: str,
    cluster: Callable[[int], list[str]],
    queue: Callable[..., str],
    scheduler: Callable[..., Scheduler],
) -> None:
    """Master and three workers; workers 1 and 2 exit while the master and worker 0 run.

    The grace is short, so a gang counting only running members (2 of 4)
    would be evicted within the test; one counting the finished ones is whole.
    """
    cluster(1)
    q = queue(64)
    found = scheduler(SchedulerConfig(stale_gang_grace_s=GRACE_S))
    kube = Kube(k8s, namespace)
    replica = {"restartPolicy": "OnFailure", "template": pod_template(gpus=2, container="pytorch")}
    job = create(
        kube,
        PYTORCHJOB,
        "bert",
        {"pytorchReplicaSpecs": {"Master": {"replicas": 1, **replica}, "Worker": {"replicas": 3, **replica}}},
        labels={contract.LABEL_QUEUE: q},
    )
    operator = PyTorchJobStandIn(k8s, namespace, "bert")
    finishing: set[str] = set()
    kubelet = Kubelet(k8s, namespace, finishes=lambda p: p["metadata"]["name"] in finishing)
    drive([operator, kubelet], all_bound(kube, f"{KF_JOB_NAME}=bert", 4), description="the gang bound")
    wait_for_groups(k8s, namespace, {f"pg-bert-{job['metadata']['uid']}": 4})

    def phases() -> dict[str, str]:
        return {p["metadata"]["name"]: phase(p) for p in kube.pods(f"{KF_JOB_NAME}=bert")}

    for worker in ("bert-worker-2", "bert-worker-1"):
        finishing.add(worker)
        drive([operator, kubelet], lambda w=worker: phases()[w] == "Succeeded", description=f"{worker} finished")
        # Past the grace, many cycles later: the master and worker 0 still run.
        until = time.monotonic() + 2 * GRACE_S
        cycles = found.runner.cycles
        drive(
            [operator, kubelet],
            lambda c=cycles, u=until: time.monotonic() > u and found.runner.cycles > c + 5,
            description="cycles past the grace",
        )
    assert phases() == {
        "bert-master-0": "Running",
        "bert-worker-0": "Running",
        "bert-worker-1": "Succeeded",
        "bert-worker-2": "Succeeded",
    }
    assert_nothing_evicted(found, kube, kubelet)


@pytest.fixture
def job_and_claim_controllers(control_plane: ControlPlane) -> Iterator[None]:
    """The Job controller and the resourceclaim controller (claims from templates), for one test."""
    with control_plane.extra_controllers("job", "resourceclaim-controller"):
        yield


@pytest.mark.usefixtures("job_and_claim_controllers", "claims_released")
def test_a_jobset_whose_pods_use_a_claim_template_is_allocated_whole_and_every_device_once(
    k8s: client.ApiClient,
    namespace: str,
    queue: Callable[..., str],
    scheduler: Callable[..., Scheduler],
    dra_nodes: Callable[..., str],
) -> None:
    """A JobSet on DRA nodes: the Job controller makes pods naming the template, the claim controller their claims.

    Its two replicated Jobs of four pods are one gang of eight GPUs on two
    nodes of four: every claim is allocated on its pod's node and reserved
    for it, and no device goes to two claims.
    """
    nodes = {dra_nodes(), dra_nodes()}
    q = queue(64)
    found = scheduler()
    kube = Kube(k8s, namespace)
    claims = client.CustomObjectsApi(k8s)
    claims.create_namespaced_custom_object(
        *DRA,
        namespace,
        "resourceclaimtemplates",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}},
        },
    )
    template = pod_template(gpus=0)
    template["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    template["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    workers = {"parallelism": 4, "completions": 4, "template": template}
    js = create(
        kube,
        JOBSET,
        "dra",
        {"replicatedJobs": [{"name": "workers", "replicas": 2, "template": {"spec": workers}}]},
        labels={contract.LABEL_QUEUE: q},
    )
    operator, kubelet = JobSetStandIn(k8s, namespace, "dra"), Kubelet(k8s, namespace)
    drive([operator, kubelet], all_bound(kube, f"{JS_NAME}=dra", 8), description="the JobSet's pods bound")
    wait_for_groups(k8s, namespace, {f"pg-dra-{js['metadata']['uid']}": 8})

    given: dict[tuple[str, str], str] = {}
    for pod in kube.pods(f"{JS_NAME}=dra"):
        (status,) = pod["status"]["resourceClaimStatuses"]
        claim = claims.get_namespaced_custom_object(*DRA, namespace, "resourceclaims", status["resourceClaimName"])
        assert claim["status"]["reservedFor"] == [
            {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
        ]
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert result["pool"] == pod["spec"]["nodeName"] in nodes
        assert (result["pool"], result["device"]) not in given, "a device given to two claims"
        given[(result["pool"], result["device"])] = pod["metadata"]["name"]
    assert len(given) == 8
    assert_nothing_evicted(found, kube, kubelet)
