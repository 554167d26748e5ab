"""Pods grouped by the workload that owns them, one test per owner kind, against the real API server.

Each test creates the owner as its operator's users write it (replica
counts, ``minAvailable``, queue labels) under the real group, version and
plural (the CRDs of :mod:`tests.scheduler.cluster.owner_crds`), then the pods
and intermediate owners that operator's controller would create, with owner
references to the real objects' UIDs: JobSet -> Job -> Pod, RayJob ->
RayCluster -> Pod, LeaderWorkerSet -> StatefulSet -> leader Pod ->
StatefulSet -> Pod, Deployment -> ReplicaSet -> Pod, CronJob -> Job -> Pod.
No controller runs (the control plane has only the garbage collector and the
namespace controller), so nothing else touches them. One SchedulingCycle
then reads the owners through the API, and the test checks the PodGroup it
created and what it bound.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from gpuwarden import contract
from gpuwarden.kube import KubeApi
from scheduler.cluster.bind import Binder
from scheduler.cluster.cycle import ClusterView, CycleResult, SchedulingCycle
from scheduler.cluster.owners import OwnerLookupError, OwnerResolver
from scheduler.cluster.retrying import RetryPolicy
from tests.harness import ControlPlane, free_ports, wait_for
from tests.scheduler.cluster.kube_objects import node_of, pod
from tests.scheduler.cluster.owner_crds import (
    JOBSET,
    LEADERWORKERSET,
    MPIJOB,
    PYTORCHJOB,
    RAYCLUSTER,
    RAYJOB,
    TFJOB,
    WORKFLOW,
    XGBOOSTJOB,
    OwnerKind,
)

pytestmark = [pytest.mark.k8s, pytest.mark.usefixtures("owner_crds")]

JSON = dict[str, Any]
NO_WAIT = RetryPolicy(attempts=3, sleep=lambda _s: None)
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"


def _raw(response: Any) -> Any:
    return json.loads(response.data)


def _items(response: Any) -> list[JSON]:
    items: list[JSON] = _raw(response)["items"]
    return items


# -- the cycle -----------------------------------------------------------------


def view(k8s: client.ApiClient, namespace: str, nodes: set[str]) -> ClusterView:
    """What the watch cache would hold for this test: its nodes, its namespace's pods and groups, all queues."""
    core = client.CoreV1Api(k8s)
    custom = client.CustomObjectsApi(k8s)
    scheduling = (contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION)
    return ClusterView(
        nodes={
            n["metadata"]["name"]: n
            for n in _items(core.list_node(_preload_content=False))
            if n["metadata"]["name"] in nodes
        },
        gpunodes={
            g["metadata"]["name"]: g
            for g in _items(
                custom.list_cluster_custom_object(
                    contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL, _preload_content=False
                )
            )
            if g["metadata"]["name"] in nodes
        },
        pods={p["metadata"]["uid"]: p for p in _items(core.list_namespaced_pod(namespace, _preload_content=False))},
        queues={
            q["metadata"]["name"]: q
            for q in _items(
                custom.list_cluster_custom_object(*scheduling, contract.QUEUE_PLURAL, _preload_content=False)
            )
        },
        podgroups={
            (namespace, g["metadata"]["name"]): g
            for g in _items(
                custom.list_namespaced_custom_object(
                    *scheduling, namespace, contract.PODGROUP_PLURAL, _preload_content=False
                )
            )
        },
    )


def scheduler_api(k8s: client.ApiClient) -> KubeApi:
    """The API wrapper a cycle uses; its request counts show how often owners were read."""
    return KubeApi(k8s, field_manager=contract.SCHEDULER_COMPONENT)


def new_cycle(api: KubeApi, default_queue: str, owners: OwnerResolver | None = None) -> SchedulingCycle:
    return SchedulingCycle(api, default_queue=default_queue, binder=Binder(api, retry=NO_WAIT), owners=owners)


def bound(result: CycleResult) -> set[str]:
    return {r.bind.pod for r in result.binds if r.ok}


def podgroups(k8s: client.ApiClient, namespace: str) -> dict[str, JSON]:
    """The PodGroups in the API, by name."""
    items = client.CustomObjectsApi(k8s).list_namespaced_custom_object(
        contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION, namespace, contract.PODGROUP_PLURAL
    )["items"]
    return {g["metadata"]["name"]: g for g in items}


def members(result: CycleResult, namespace: str) -> dict[str, set[str]]:
    """Which pods the cycle put in which group, by group name."""
    return {j.name: {t.name for t in j.tasks} for j in result.snapshot.jobs if j.namespace == namespace}


def gets(api: KubeApi, plural: str) -> int:
    return api.stats.snapshot()[0].get(f"get_{plural}", 0)


# -- owners as their users and controllers write them --------------------------


def ref(obj: JSON) -> JSON:
    """A controller reference to ``obj``, as every one of these controllers sets it."""
    meta = obj["metadata"]
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def owner_ref_json(obj: JSON) -> JSON:
    """The owner reference a derived PodGroup carries."""
    meta = obj["metadata"]
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": meta["name"], "uid": meta["uid"]}


def _meta(name: str, labels: dict[str, str] | None, owner: JSON | None) -> JSON:
    meta: JSON = {"name": name, "labels": labels or {}}
    if owner is not None:
        meta["ownerReferences"] = [ref(owner)]
    return meta


def custom_owner(
    k8s: client.ApiClient,
    namespace: str,
    kind: OwnerKind,
    name: str,
    spec: JSON,
    *,
    labels: dict[str, str] | None = None,
    owner: JSON | None = None,
) -> JSON:
    body = {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": _meta(name, labels, owner), "spec": spec}
    created: JSON = client.CustomObjectsApi(k8s).create_namespaced_custom_object(
        kind.group, kind.version, namespace, kind.plural, body
    )
    return created


def _template(labels: dict[str, str]) -> JSON:
    return {
        "metadata": {"labels": labels},
        "spec": {
            "schedulerName": contract.SCHEDULER_NAME,
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "registry.invalid/train:1"}],
        },
    }


def job(
    k8s: client.ApiClient,
    namespace: str,
    name: str,
    *,
    parallelism: int,
    completions: int | None = None,
    labels: dict[str, str] | None = None,
    owner: JSON | None = None,
) -> JSON:
    spec: JSON = {
        "parallelism": parallelism,
        "manualSelector": True,
        "selector": {"matchLabels": {"job": name}},
        "template": _template({"job": name}),
    }
    if completions is not None:
        spec["completions"] = completions
    body = {"apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(name, labels, owner), "spec": spec}
    created: JSON = _raw(client.BatchV1Api(k8s).create_namespaced_job(namespace, body, _preload_content=False))
    return created


def cronjob(k8s: client.ApiClient, namespace: str, name: str, *, labels: dict[str, str] | None = None) -> JSON:
    body = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": _meta(name, labels, None),
        "spec": {"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": _template({})}}},
    }
    created: JSON = _raw(client.BatchV1Api(k8s).create_namespaced_cron_job(namespace, body, _preload_content=False))
    return created


def apps_owner(
    k8s: client.ApiClient,
    namespace: str,
    kind: str,
    name: str,
    *,
    replicas: int,
    labels: dict[str, str] | None = None,
    owner: JSON | None = None,
    extra: JSON | None = None,
) -> JSON:
    """A Deployment, ReplicaSet or StatefulSet whose pods carry ``app=<name>``."""
    spec: JSON = {
        "replicas": replicas,
        "selector": {"matchLabels": {"app": name}},
        "template": {**_template({"app": name}), "spec": {**_template({})["spec"], "restartPolicy": "Always"}},
        **(extra or {}),
    }
    body = {"apiVersion": "apps/v1", "kind": kind, "metadata": _meta(name, labels, owner), "spec": spec}
    apps = client.AppsV1Api(k8s)
    create = {
        "Deployment": apps.create_namespaced_deployment,
        "ReplicaSet": apps.create_namespaced_replica_set,
        "StatefulSet": apps.create_namespaced_stateful_set,
    }[kind]
    created: JSON = _raw(create(namespace, body, _preload_content=False))
    return created


def owned_pods(
    k8s: client.ApiClient,
    namespace: str,
    owner: JSON,
    names: list[str],
    *,
    gpus: int = 1,
    labels: dict[str, str] | None = None,
) -> list[str]:
    for name in names:
        pod(k8s, namespace, name, gpus=gpus, owner=ref(owner), labels=labels)
    return names


@pytest.fixture
def nodes(cluster: Callable[[int], list[str]]) -> Callable[[int], set[str]]:
    return lambda count: set(cluster(count))


# -- Kubeflow --------------------------------------------------------------------


def test_a_pytorchjob_of_min_available_four_binds_only_when_four_fit_and_is_read_once(
    k8s: client.ApiClient, namespace: str, nodes: Callable[[int], set[str]], queue: Callable[..., str]
) -> None:
    q = queue(64)
    labels = {"training.kubeflow.org/job-name": "llama"}
    replica = {"template": _template(labels), "restartPolicy": "OnFailure"}
    ptj = custom_owner(
        k8s,
        namespace,
        PYTORCHJOB,
        "llama",
        {
            "runPolicy": {"schedulingPolicy": {"minAvailable": 4}},
            "pytorchReplicaSpecs": {"Master": {"replicas": 1, **replica}, "Worker": {"replicas": 5, **replica}},
        },
        labels={contract.LABEL_QUEUE: q},
    )
    names = owned_pods(k8s, namespace, ptj, ["llama-master-0"], gpus=4, labels=labels)
    names += owned_pods(k8s, namespace, ptj, [f"llama-worker-{i}" for i in range(5)], gpus=4, labels=labels)
    api = scheduler_api(k8s)
    cycle = new_cycle(api, default_queue="nobody")

    # One 8-GPU node holds two of the 4-GPU pods: not the four the job needs.
    placed = nodes(1)
    result = cycle.run(view(k8s, namespace, placed))
    assert bound(result) == set()
    name = f"pg-llama-{ptj['metadata']['uid']}"
    group = podgroups(k8s, namespace)[name]
    assert group["spec"] == {"minMember": 4, "queue": q}
    assert group["metadata"]["ownerReferences"] == [owner_ref_json(ptj)]
    assert members(result, namespace) == {name: set(names)}

    # A second node: four fit, and four bind in one cycle.
    placed |= nodes(1)
    result = cycle.run(view(k8s, namespace, placed))
    assert len(bound(result)) == 4
    assert sum(1 for n in names if node_of(k8s, namespace, n) in placed) == 4
    # Six pods, two cycles: the job was read once.
    assert gets(api, PYTORCHJOB.plural) == 1


def test_a_thousand_pods_of_one_jobset_cost_one_read_per_owner(k8s: client.ApiClient, namespace: str) -> None:
    js = custom_owner(k8s, namespace, JOBSET, "wide", {"replicatedJobs": [{"name": "w", "replicas": 1}]})
    child = job(k8s, namespace, "wide-w-0", parallelism=1000, owner=js)
    (first,) = owned_pods(k8s, namespace, child, ["wide-w-0-0"])
    stored = _raw(client.CoreV1Api(k8s).read_namespaced_pod(first, namespace, _preload_content=False))
    # The other 999 as the watch cache would hold them: the same owner, their own names.
    meta = stored["metadata"]
    copies = ({**stored, "metadata": {**meta, "name": f"wide-w-0-{i}", "uid": f"u{i}"}} for i in range(1, 1000))
    pods = [stored, *copies]
    api = scheduler_api(k8s)
    resolver = OwnerResolver(api)
    chains = [[o["kind"] for o in resolver.chain(p)] for p in pods]
    assert chains == [["Job", "JobSet"]] * 1000
    assert (gets(api, "jobs"), gets(api, JOBSET.plural), api.stats.total_requests()) == (1, 1, 2)


@pytest.mark.parametrize(
    "case",
    [
        (TFJOB, "tfReplicaSpecs", {"Chief": 1, "PS": 1, "Worker": 2}),
        (MPIJOB, "mpiReplicaSpecs", {"Launcher": 1, "Worker": 2}),
    ],
    ids=["tfjob", "mpijob"],
)
def test_a_kubeflow_job_without_min_available_is_a_gang_of_all_its_replicas(
    k8s: client.ApiClient,
    namespace: str,
    nodes: Callable[[int], set[str]],
    queue: Callable[..., str],
    case: tuple[OwnerKind, str, dict[str, int]],
) -> None:
    q = queue(16)
    kind, field, roles = case
    spec = {
        "runPolicy": {"cleanPodPolicy": "Running"},
        field: {role: {"replicas": n, "template": _template({})} for role, n in roles.items()},
    }
    # Written for KAI: the queue is KAI's label on the job.
    owner = custom_owner(k8s, namespace, kind, "mnist", spec, labels={contract.LABEL_KAI_QUEUE: q})
    names = [f"mnist-{role.lower()}-{i}" for role, n in roles.items() for i in range(n)]
    owned_pods(k8s, namespace, owner, names)
    placed = nodes(1)
    result = new_cycle(scheduler_api(k8s), default_queue="nobody").run(view(k8s, namespace, placed))

    name = f"pg-mnist-{owner['metadata']['uid']}"
    group = podgroups(k8s, namespace)[name]
    # Every replica of every role: four for the TFJob, three for the MPIJob.
    assert group["spec"] == {"minMember": len(names), "queue": q}
    assert len(names) == sum(roles.values())
    assert group["metadata"]["ownerReferences"] == [owner_ref_json(owner)]
    assert bound(result) == set(names)


# -- Ray -----------------------------------------------------------------------


def _ray_cluster_spec(workers: int, hosts: int) -> JSON:
    return {
        "headGroupSpec": {"rayStartParams": {}, "template": _template({"ray.io/node-type": "head"})},
        "workerGroupSpecs": [
            {
                "groupName": "gpu",
                "replicas": workers,
                "minReplicas": 1,
                "maxReplicas": 8,
                "numOfHosts": hosts,
                "rayStartParams": {},
                "template": _template({"ray.io/node-type": "worker"}),
            }
        ],
    }


def test_a_raycluster_is_a_gang_of_its_head_and_every_worker_host(
    k8s: client.ApiClient, namespace: str, nodes: Callable[[int], set[str]], queue: Callable[..., str]
) -> None:
    q = queue(16)
    rc = custom_owner(k8s, namespace, RAYCLUSTER, "serve", _ray_cluster_spec(2, 2), labels={contract.LABEL_QUEUE: q})
    names = owned_pods(k8s, namespace, rc, ["serve-head-x1"], labels={"ray.io/cluster": "serve"})
    # Two multi-host replicas of two hosts each: four worker pods.
    names += owned_pods(k8s, namespace, rc, [f"serve-gpu-worker-{i}" for i in range(4)])
    result = new_cycle(scheduler_api(k8s), default_queue="nobody").run(view(k8s, namespace, nodes(1)))

    group = podgroups(k8s, namespace)[f"pg-serve-{rc['metadata']['uid']}"]
    assert group["spec"] == {"minMember": 5, "queue": q}
    assert group["metadata"]["ownerReferences"] == [owner_ref_json(rc)]
    assert bound(result) == set(names)


def test_a_rayjob_groups_its_cluster_and_its_submitter_under_the_rayjob(
    k8s: client.ApiClient, namespace: str, nodes: Callable[[int], set[str]], queue: Callable[..., str]
) -> None:
    q = queue(16)
    cluster_spec = _ray_cluster_spec(3, 1)
    rj = custom_owner(
        k8s,
        namespace,
        RAYJOB,
        "tune",
        {"entrypoint": "python tune.py", "shutdownAfterJobFinishes": True, "rayClusterSpec": cluster_spec},
        labels={contract.LABEL_QUEUE: q},
    )
    # What KubeRay makes of it: a RayCluster owned by the RayJob, its pods,
    # and a submitter Job (also owned by the RayJob) with its pod.
    rc = custom_owner(k8s, namespace, RAYCLUSTER, "tune-raycluster-abcde", cluster_spec, owner=rj)
    names = owned_pods(k8s, namespace, rc, ["tune-head", *(f"tune-worker-{i}" for i in range(3))])
    submitter = job(k8s, namespace, "tune", parallelism=1, completions=1, owner=rj)
    names += owned_pods(k8s, namespace, submitter, ["tune-submitter"], gpus=0)
    api = scheduler_api(k8s)
    result = new_cycle(api, default_queue="nobody").run(view(k8s, namespace, nodes(1)))

    name = f"pg-tune-{rj['metadata']['uid']}"
    assert list(podgroups(k8s, namespace)) == [name]
    group = podgroups(k8s, namespace)[name]
    assert group["spec"] == {"minMember": 4, "queue": q}  # head plus three workers; the submitter comes after
    assert group["metadata"]["ownerReferences"] == [owner_ref_json(rj)]
    assert members(result, namespace) == {name: set(names)}
    assert bound(result) == set(names)
    assert (gets(api, RAYJOB.plural), gets(api, RAYCLUSTER.plural), gets(api, "jobs")) == (1, 1, 1)


# -- JobSet, LeaderWorkerSet, Argo -----------------------------------------------


def test_a_jobset_is_one_gang_of_every_replicated_job_read_once_per_owner(
    k8s: client.ApiClient, namespace: str, nodes: Callable[[int], set[str]], queue: Callable[..., str]
) -> None:
    q = queue(16)
    js = custom_owner(
        k8s,
        namespace,
        JOBSET,
        "pretrain",
        {
            "replicatedJobs": [
                {"name": "driver", "replicas": 1, "template": {"spec": {"parallelism": 1, "completions": 1}}},
                {"name": "workers", "replicas": 2, "template": {"spec": {"parallelism": 2, "completions": 2}}},
            ]
        },
        labels={contract.LABEL_QUEUE: q},
    )
    names: list[str] = []
    for rjob, index, size in (("driver", 0, 1), ("workers", 0, 2), ("workers", 1, 2)):
        child = job(k8s, namespace, f"pretrain-{rjob}-{index}", parallelism=size, completions=size, owner=js)
        names += owned_pods(k8s, namespace, child, [f"pretrain-{rjob}-{index}-{i}" for i in range(size)])
    api = scheduler_api(k8s)
    result = new_cycle(api, default_queue="nobody").run(view(k8s, namespace, nodes(1)))

    name = f"pg-pretrain-{js['metadata']['uid']}"
    group = podgroups(k8s, namespace)[name]
    assert group["spec"] == {"minMember": 5, "queue": q}
    assert group["metadata"]["ownerReferences"] == [owner_ref_json(js)]
    assert members(result, namespace) == {name: set(names)}
    assert bound(result) == set(names)
    # Five pods: each of the three Jobs read once, the JobSet once.
    assert (gets(api, "jobs"), gets(api, JOBSET.plural)) == (3, 1)


def _leaderworkerset(k8s: client.ApiClient, namespace: str, queue: str) -> tuple[JSON, list[list[str]]]:
    """A LeaderWorkerSet of two groups of three, with the StatefulSets and pods its controllers make."""
    lws = custom_owner(
        k8s,
        namespace,
        LEADERWORKERSET,
        "vllm",
        {
            "replicas": 2,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {"size": 3, "workerTemplate": _template({})},
        },
        labels={contract.LABEL_QUEUE: queue},
    )
    leaders = apps_owner(k8s, namespace, "StatefulSet", "vllm", replicas=2, owner=lws, labels={LWS_NAME: "vllm"})
    groups: list[list[str]] = []
    for index in range(2):
        labels = {LWS_NAME: "vllm", LWS_GROUP_INDEX: str(index)}
        leader_name = f"vllm-{index}"
        (leader_pod,) = owned_pods(k8s, namespace, leaders, [leader_name], labels={**labels, LWS_WORKER_INDEX: "0"})
        leader = _raw(client.CoreV1Api(k8s).read_namespaced_pod(leader_pod, namespace, _preload_content=False))
        leader.update(apiVersion="v1", kind="Pod")
        # The worker StatefulSet of a group is owned by the group's leader pod.
        workers = apps_owner(k8s, namespace, "StatefulSet", leader_name, replicas=2, owner=leader, labels=labels)
        names = [leader_name]
        for w in (1, 2):
            names += owned_pods(
                k8s, namespace, workers, [f"{leader_name}-{w}"], labels={**labels, LWS_WORKER_INDEX: str(w)}
            )
        groups.append(names)
    return lws, groups


def test_a_leaderworkerset_is_one_gang_per_group_through_the_leader_pod(
    k8s: client.ApiClient, namespace: str, nodes: Callable[[int], set[str]], queue: Callable[..., str]
) -> None:
    q = queue(16)
    lws, groups = _leaderworkerset(k8s, namespace, q)
    result = new_cycle(scheduler_api(k8s), default_queue="nobody").run(view(k8s, namespace, nodes(1)))

    uid = lws["metadata"]["uid"]
    expected = {f"pg-vllm-{i}-{uid}": set(names) for i, names in enumerate(groups)}
    assert members(result, namespace) == expected
    made = podgroups(k8s, namespace)
    assert set(made) == set(expected)
    for name in expected:
        assert made[name]["spec"] == {"minMember": 3, "queue": q}
        assert made[name]["metadata"]["ownerReferences"] == [owner_ref_json(lws)]
    assert bound(result) == {n for names in groups for n in names}


def test_an_argo_workflow_gets_one_group_per_step_pod(
    k8s: client.ApiClient, namespace: str, nodes: Callable[[int], set[str]], queue: Callable[..., str]
) -> None:
    q = queue(16)
    wf = custom_owner(
        k8s,
        namespace,
        WORKFLOW,
        "etl",
        {"entrypoint": "main", "templates": [{"name": "main", "steps": [[{"name": "a"}, {"name": "b"}]]}]},
        labels={contract.LABEL_QUEUE: q},
    )
    steps = owned_pods(
        k8s, namespace, wf, ["etl-a-1111", "etl-b-2222"], labels={"workflows.argoproj.io/workflow": "etl"}
    )
    cycle = new_cycle(scheduler_api(k8s), default_queue="nobody")
    # A group of one pod gets its PodGroup when it has news: with no node yet, both steps wait.
    cycle.run(view(k8s, namespace, set()))
    result = cycle.run(view(k8s, namespace, nodes(1)))

    core = client.CoreV1Api(k8s)
    made = podgroups(k8s, namespace)
    for step in steps:
        stored = core.read_namespaced_pod(step, namespace)
        group = made[f"pg-{step}-{stored.metadata.uid}"]
        assert group["spec"] == {"minMember": 1, "queue": q}
        assert group["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Pod", "name": step, "uid": stored.metadata.uid}
        ]
    assert len(made) == 2
    assert bound(result) == set(steps)


# -- built-in kinds -----------------------------------------------------------------


def test_deployments_statefulsets_and_bare_pods_get_one_group_per_pod(
    k8s: client.ApiClient, namespace: str, nodes: Callable[[int], set[str]], queue: Callable[..., str]
) -> None:
    q, default = queue(16), queue(16)
    deploy = apps_owner(k8s, namespace, "Deployment", "web", replicas=2, labels={contract.LABEL_QUEUE: q})
    rs = apps_owner(k8s, namespace, "ReplicaSet", "web-5d8f7", replicas=2, owner=deploy)
    names = owned_pods(k8s, namespace, rs, ["web-5d8f7-aaaaa", "web-5d8f7-bbbbb"])
    sts = apps_owner(
        k8s, namespace, "StatefulSet", "db", replicas=1, labels={contract.LABEL_QUEUE: q}, extra={"serviceName": "db"}
    )
    names += owned_pods(k8s, namespace, sts, ["db-0"])
    pod(k8s, namespace, "scratch")
    api = scheduler_api(k8s)
    cycle = new_cycle(api, default_queue=default)
    # A group of one pod gets its PodGroup when it has news: with no node yet, every pod waits.
    cycle.run(view(k8s, namespace, set()))
    result = cycle.run(view(k8s, namespace, nodes(1)))

    core = client.CoreV1Api(k8s)
    made = podgroups(k8s, namespace)
    assert len(made) == 4
    for name, expected_queue in [*((n, q) for n in names), ("scratch", default)]:
        uid = core.read_namespaced_pod(name, namespace).metadata.uid
        group = made[f"pg-{name}-{uid}"]
        assert group["spec"] == {"minMember": 1, "queue": expected_queue}
        assert group["metadata"]["ownerReferences"][0]["uid"] == uid
    assert bound(result) == {*names, "scratch"}
    # Two replicas of one ReplicaSet: it and its Deployment read once each.
    assert (gets(api, "replicasets"), gets(api, "deployments"), gets(api, "statefulsets")) == (1, 1, 1)


def test_a_cronjob_run_is_a_gang_of_its_job_in_the_cronjobs_queue(
    k8s: client.ApiClient, namespace: str, nodes: Callable[[int], set[str]], queue: Callable[..., str]
) -> None:
    q = queue(16)
    cron = cronjob(k8s, namespace, "nightly", labels={contract.LABEL_QUEUE: q})
    run = job(k8s, namespace, "nightly-29000000", parallelism=2, completions=2, owner=cron)
    names = owned_pods(k8s, namespace, run, ["nightly-29000000-a", "nightly-29000000-b"])
    result = new_cycle(scheduler_api(k8s), default_queue="nobody").run(view(k8s, namespace, nodes(1)))

    group = podgroups(k8s, namespace)[f"pg-nightly-29000000-{run['metadata']['uid']}"]
    assert group["spec"] == {"minMember": 2, "queue": q}
    assert group["metadata"]["ownerReferences"] == [owner_ref_json(run)]
    assert bound(result) == set(names)


# -- queues ----------------------------------------------------------------------


def test_the_queue_comes_from_our_label_before_kais_on_the_owner_before_the_pod_else_the_default(
    k8s: client.ApiClient, namespace: str, nodes: Callable[[int], set[str]], queue: Callable[..., str]
) -> None:
    on_pod, on_owner, kai, default = queue(8), queue(8), queue(8), queue(8)
    cases: dict[str, tuple[dict[str, str], dict[str, str], str]] = {
        # job name: (the Job's labels, the pod's labels, the queue expected)
        "pod-label": ({}, {contract.LABEL_QUEUE: on_pod}, on_pod),
        "owner-label": ({contract.LABEL_QUEUE: on_owner}, {}, on_owner),
        # Every pod of a gang shares its owner, so the owner's label decides.
        "owner-over-pod": ({contract.LABEL_QUEUE: on_owner}, {contract.LABEL_QUEUE: on_pod}, on_owner),
        "kai-on-pod": ({}, {contract.LABEL_KAI_QUEUE: kai}, kai),
        # Our label wins over KAI's wherever each is.
        "ours-over-kai": ({contract.LABEL_KAI_QUEUE: kai}, {contract.LABEL_QUEUE: on_pod}, on_pod),
        "no-label": ({}, {}, default),
    }
    expected: dict[str, str] = {}
    for name, (owner_labels, pod_labels, want) in cases.items():
        owner = job(k8s, namespace, name, parallelism=1, labels=owner_labels)
        owned_pods(k8s, namespace, owner, [f"{name}-0"], labels=pod_labels)
        expected[f"pg-{name}-{owner['metadata']['uid']}"] = want
    new_cycle(scheduler_api(k8s), default_queue=default).run(view(k8s, namespace, nodes(1)))

    made = podgroups(k8s, namespace)
    assert {name: g["spec"]["queue"] for name, g in made.items()} == expected


# -- owners that cannot be read ---------------------------------------------------


def test_owners_of_kinds_this_cluster_does_not_serve_group_their_pods_and_the_cycle_goes_on(
    k8s: client.ApiClient, namespace: str, nodes: Callable[[int], set[str]], queue: Callable[..., str]
) -> None:
    q = queue(16)
    # An XGBoostJob is a kind the scheduler follows, but its CRD is not
    # installed; a Widget is a kind it has never heard of. Neither exists
    # as an object: the API server does not check owner references.
    absent: list[tuple[JSON, list[str]]] = []
    for api_version, kind, name, uid in (
        (XGBOOSTJOB.api_version, XGBOOSTJOB.kind, "boost", "0b7a5d8e-1a6e-4d2a-9a51-7d1f3f0e0001"),
        ("example.com/v1", "Widget", "w", "0b7a5d8e-1a6e-4d2a-9a51-7d1f3f0e0002"),
    ):
        obj: JSON = {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "uid": uid}}
        names = [f"{name}-0", f"{name}-1"]
        absent.append((obj, owned_pods(k8s, namespace, obj, names, labels={contract.LABEL_QUEUE: q})))
    ptj = custom_owner(
        k8s,
        namespace,
        PYTORCHJOB,
        "fine",
        {"pytorchReplicaSpecs": {"Worker": {"replicas": 2, "template": _template({})}}},
        labels={contract.LABEL_QUEUE: q},
    )
    ptj_pods = owned_pods(k8s, namespace, ptj, ["fine-worker-0", "fine-worker-1"])
    api = scheduler_api(k8s)
    result = new_cycle(api, default_queue="nobody").run(view(k8s, namespace, nodes(1)))

    made = podgroups(k8s, namespace)
    for obj, names in absent:
        # Kept together under the reference, as a gang of one: its size cannot be known.
        name = f"pg-{obj['metadata']['name']}-{obj['metadata']['uid']}"
        assert made[name]["spec"] == {"minMember": 1, "queue": q}
        assert made[name]["metadata"]["ownerReferences"] == [owner_ref_json(obj)]
        assert members(result, namespace)[name] == set(names)
    assert made[f"pg-fine-{ptj['metadata']['uid']}"]["spec"] == {"minMember": 2, "queue": q}
    assert bound(result) == {*ptj_pods, *(n for _, names in absent for n in names)}
    # The missing kind was asked for once (a 404, no error); the unknown one never.
    requests, errors = api.stats.snapshot()
    assert requests.get(f"get_{XGBOOSTJOB.plural}") == 1
    assert "get_widgets" not in requests
    assert errors == {}


def test_pods_whose_owner_was_deleted_are_grouped_by_its_reference(
    k8s: client.ApiClient, namespace: str, nodes: Callable[[int], set[str]], queue: Callable[..., str]
) -> None:
    q = queue(16)
    gone = job(k8s, namespace, "gone", parallelism=3, completions=3, labels={contract.LABEL_QUEUE: q})
    orphans = owned_pods(k8s, namespace, gone, [f"gone-{i}" for i in range(3)], labels={contract.LABEL_QUEUE: q})
    other = job(k8s, namespace, "other", parallelism=2, labels={contract.LABEL_QUEUE: q})
    others = owned_pods(k8s, namespace, other, ["other-0", "other-1"])
    placed = nodes(1)
    # The watch cache can be behind the garbage collector: this view still
    # has the owner references of a job that is gone by the time the cycle
    # reads it. (Orphan: the pods stay, as a user who deletes only the job asks.)
    stale = view(k8s, namespace, placed)
    batch = client.BatchV1Api(k8s)
    batch.delete_namespaced_job("gone", namespace, propagation_policy="Orphan")

    def deleted() -> bool:
        try:
            batch.read_namespaced_job("gone", namespace)
        except client.ApiException as exc:
            return exc.status == 404
        return False

    wait_for(deleted, 30, description="the Job deleted")
    api = scheduler_api(k8s)
    result = new_cycle(api, default_queue="nobody").run(stale)

    name = f"pg-gone-{gone['metadata']['uid']}"
    assert members(result, namespace)[name] == set(orphans)
    group = next(j for j in result.snapshot.jobs if j.name == name)
    # Its size went with the job; the queue is the pods' own.
    assert (group.min_member, group.queue) == (1, q)
    assert bound(result) == {*orphans, *others}
    # The owner read was an answer (404), not an error. (The PodGroup made
    # for the gone job may already be collected with it when its status is
    # written; that write's 404 is the status writer's to judge.)
    assert not [op for op in api.stats.snapshot()[1] if op.startswith("get_")]


def test_an_owner_that_cannot_be_read_right_now_leaves_its_pods_for_a_later_cycle(
    k8s: client.ApiClient, namespace: str, nodes: Callable[[int], set[str]], queue: Callable[..., str]
) -> None:
    q = queue(16)
    owner = job(k8s, namespace, "patient", parallelism=3, completions=3, labels={contract.LABEL_QUEUE: q})
    names = owned_pods(k8s, namespace, owner, [f"patient-{i}" for i in range(3)])
    placed = nodes(1)
    api = scheduler_api(k8s)
    # Owner reads go to a port nothing listens on: a refused connection, as
    # from an API server that is restarting. A group of one would be a guess.
    (port,) = free_ports(1)
    unreachable = client.Configuration()
    unreachable.host = f"https://127.0.0.1:{port}"
    with client.ApiClient(unreachable) as down:
        owner_api = KubeApi(down, field_manager=contract.SCHEDULER_COMPONENT, timeout_s=2.0)
        resolver = OwnerResolver(owner_api)
        result = new_cycle(api, default_queue="nobody", owners=resolver).run(view(k8s, namespace, placed))
    assert podgroups(k8s, namespace) == {}
    assert bound(result) == set()
    assert members(result, namespace) == {}
    # Three pods, one failed read: the failure is remembered, not retried per pod.
    requests, errors = owner_api.stats.snapshot()
    assert requests == errors == {"get_jobs": 1}
    with pytest.raises(OwnerLookupError, match="patient"):
        resolver.chain(next(iter(view(k8s, namespace, placed).pods.values())))

    # The API answers again: the next cycle groups the whole gang.
    result = new_cycle(api, default_queue="nobody").run(view(k8s, namespace, placed))
    group = podgroups(k8s, namespace)[f"pg-patient-{owner['metadata']['uid']}"]
    assert group["spec"] == {"minMember": 3, "queue": q}
    assert bound(result) == set(names)


# -- least privilege --------------------------------------------------------------


@pytest.fixture
def scheduler_identity(control_plane: ControlPlane, scheduler_rbac: None) -> Iterator[client.ApiClient]:
    with control_plane.impersonate("gpuwarden-scheduler", "gpuwarden") as sa:
        yield sa


def test_the_schedulers_service_account_reads_every_owner_kind_and_nothing_more(
    k8s: client.ApiClient, namespace: str, queue: Callable[..., str], scheduler_identity: client.ApiClient
) -> None:
    q = queue(8)
    chains: dict[str, list[str]] = {}
    for kind in (PYTORCHJOB, TFJOB, MPIJOB, RAYCLUSTER, WORKFLOW):
        obj = custom_owner(k8s, namespace, kind, kind.plural, {})
        chains[owned_pods(k8s, namespace, obj, [f"{kind.plural}-0"])[0]] = [kind.kind]
    rj = custom_owner(k8s, namespace, RAYJOB, "rj", {})
    rc = custom_owner(k8s, namespace, RAYCLUSTER, "rj-raycluster", {}, owner=rj)
    chains[owned_pods(k8s, namespace, rc, ["rj-head"])[0]] = ["RayCluster", "RayJob"]
    js = custom_owner(k8s, namespace, JOBSET, "js", {})
    js_job = job(k8s, namespace, "js-w-0", parallelism=1, owner=js)
    chains[owned_pods(k8s, namespace, js_job, ["js-w-0-0"])[0]] = ["Job", "JobSet"]
    cron = cronjob(k8s, namespace, "cron")
    run = job(k8s, namespace, "cron-1", parallelism=1, owner=cron)
    chains[owned_pods(k8s, namespace, run, ["cron-1-0"])[0]] = ["Job", "CronJob"]
    deploy = apps_owner(k8s, namespace, "Deployment", "web", replicas=1)
    rs = apps_owner(k8s, namespace, "ReplicaSet", "web-1", replicas=1, owner=deploy)
    chains[owned_pods(k8s, namespace, rs, ["web-1-a"])[0]] = ["ReplicaSet", "Deployment"]
    _, groups = _leaderworkerset(k8s, namespace, q)
    chains[groups[0][1]] = ["StatefulSet", "Pod", "StatefulSet", "LeaderWorkerSet"]

    api = KubeApi(scheduler_identity, field_manager=contract.SCHEDULER_COMPONENT)
    resolver = OwnerResolver(api)
    pods = {p["metadata"]["name"]: p for p in view(k8s, namespace, set()).pods.values()}
    assert {name: [o["kind"] for o in resolver.chain(pods[name])] for name in chains} == chains
    assert api.stats.snapshot()[1] == {}, "an owner read was refused"
    # Read, never list or write.
    custom = client.CustomObjectsApi(scheduler_identity)
    kubeflow = (PYTORCHJOB.group, PYTORCHJOB.version, namespace, PYTORCHJOB.plural)
    with pytest.raises(client.ApiException) as listing:
        custom.list_namespaced_custom_object(*kubeflow)
    with pytest.raises(client.ApiException) as deleting:
        custom.delete_namespaced_custom_object(*kubeflow, PYTORCHJOB.plural)
    assert (listing.value.status, deleting.value.status) == (403, 403)
