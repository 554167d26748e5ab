"""Gangs formed and sized from each operator's own spec, against the real API server.

As in :mod:`tests.scheduler.cluster.test_owner_kinds_k8s`: the owners are
created under their real group, version and plural, then the Jobs and pods
their operators' controllers would create, in the order those controllers
create them (a later stage only after the earlier one got what it waits
for), and one SchedulingCycle at a time reads the owners through the API.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from gpuwarden import contract
from gpuwarden.kube import KubeApi
from scheduler.cluster.owners import OwnerResolver
from tests.harness import ControlPlane
from tests.scheduler.cluster.owner_crds import JOBSET, RAYCLUSTER, RAYSERVICE, TRAINJOB
from tests.scheduler.cluster.test_owner_kinds_k8s import (
    _template,
    bound,
    custom_owner,
    job,
    members,
    new_cycle,
    owned_pods,
    owner_ref_json,
    podgroups,
    scheduler_api,
    view,
)

pytestmark = [pytest.mark.k8s, pytest.mark.usefixtures("owner_crds")]

JSON = dict[str, Any]
RJOB = "jobset.sigs.k8s.io/replicatedjob-name"


@pytest.fixture
def nodes(cluster: Callable[[int], list[str]]) -> Callable[[int], set[str]]:
    return lambda count: set(cluster(count))


def jobset_job(k8s: client.ApiClient, namespace: str, js: JSON, rjob: str, size: int) -> list[str]:
    """Job ``<jobset>-<rjob>-0`` and its ``size`` pods, as the JobSet and Job controllers make them.

    kubernetes-sigs/jobset@08dfbdfd pkg/controllers/jobset_controller.go
    (constructJob, labelAndAnnotateObject): the Job is owned by the JobSet
    and the replicated job's name is labelled on the Job and its pods.
    """
    name = f"{js['metadata']['name']}-{rjob}-0"
    child = job(k8s, namespace, name, parallelism=size, completions=size, owner=js, labels={RJOB: rjob})
    return owned_pods(k8s, namespace, child, [f"{name}-{i}" for i in range(size)], labels={RJOB: rjob})


def test_a_jobset_with_depends_on_starts_its_first_stage_without_waiting_for_the_next(
    k8s: client.ApiClient, namespace: str, nodes: Callable[[int], set[str]], queue: Callable[..., str]
) -> None:
    q = queue(16)
    # The shape of Trainer v2's initializer runtimes (kubeflow/trainer@8c0f5059
    # examples/yaml/05-multi-step.yaml): the trainer ``node`` job dependsOn
    # the initializer with status Complete.
    one = {"parallelism": 1, "completions": 1, "template": _template({})}
    two = {"parallelism": 2, "completions": 2, "template": _template({})}
    js = custom_owner(
        k8s,
        namespace,
        JOBSET,
        "finetune",
        {
            "replicatedJobs": [
                {"name": "initializer", "replicas": 1, "template": {"spec": one}},
                {
                    "name": "node",
                    "replicas": 1,
                    "dependsOn": [{"name": "initializer", "status": "Complete"}],
                    "template": {"spec": two},
                },
            ]
        },
        labels={contract.LABEL_QUEUE: q},
    )
    uid = js["metadata"]["uid"]
    placed = nodes(1)
    api = scheduler_api(k8s)
    cycle = new_cycle(api, default_queue="nobody")

    # The JobSet controller creates only the initializer's Job
    # (pkg/controllers/depends_on.go, dependencyReachedStatus): it must run
    # on its own, not wait for trainer pods that come only after it.
    initializer = jobset_job(k8s, namespace, js, "initializer", 1)
    result = cycle.run(view(k8s, namespace, placed))
    first = f"pg-finetune-initializer-{uid}"
    assert members(result, namespace) == {first: set(initializer)}
    assert bound(result) == set(initializer)
    group = podgroups(k8s, namespace)[first]
    assert group["spec"] == {"minMember": 1, "queue": q}
    assert group["metadata"]["ownerReferences"] == [owner_ref_json(js)]

    # The initializer completed: now the trainer Job, a gang of its own.
    client.CoreV1Api(k8s).patch_namespaced_pod_status(initializer[0], namespace, {"status": {"phase": "Succeeded"}})
    trainers = jobset_job(k8s, namespace, js, "node", 2)
    result = cycle.run(view(k8s, namespace, placed))
    second = f"pg-finetune-node-{uid}"
    assert members(result, namespace)[second] == set(trainers)
    assert bound(result) == set(trainers)
    assert podgroups(k8s, namespace)[second]["spec"] == {"minMember": 2, "queue": q}


def test_a_raycluster_without_replicas_and_min_replicas_two_is_a_gang_of_three(
    k8s: client.ApiClient, namespace: str, nodes: Callable[[int], set[str]], queue: Callable[..., str]
) -> None:
    q = queue(16)
    spec = {
        "headGroupSpec": {"rayStartParams": {}, "template": _template({"ray.io/node-type": "head"})},
        "workerGroupSpecs": [
            {
                "groupName": "gpu",
                # ``replicas`` left out by the user: KubeRay's CRD defaults it
                # to 0 (ray-project/kuberay@feeaf72f
                # ray-operator/config/crd/bases/ray.io_rayclusters.yaml), and
                # the API server stores that. The test CRD defaults nothing,
                # so the stored object is written here as the real one reads.
                "replicas": 0,
                "minReplicas": 2,
                "maxReplicas": 2147483647,
                "numOfHosts": 1,
                "rayStartParams": {},
                "template": _template({"ray.io/node-type": "worker"}),
            }
        ],
    }
    rc = custom_owner(k8s, namespace, RAYCLUSTER, "tune", spec, labels={contract.LABEL_QUEUE: q})
    # KubeRay creates the head and minReplicas workers (utils/util.go,
    # GetWorkerGroupDesiredReplicas clamps replicas to [minReplicas, maxReplicas]).
    names = owned_pods(k8s, namespace, rc, ["tune-head-x1", "tune-gpu-worker-a", "tune-gpu-worker-b"])
    result = new_cycle(scheduler_api(k8s), default_queue="nobody").run(view(k8s, namespace, nodes(1)))

    name = f"pg-tune-{rc['metadata']['uid']}"
    assert podgroups(k8s, namespace)[name]["spec"] == {"minMember": 3, "queue": q}
    assert bound(result) == set(names)


def _trainjob(k8s: client.ApiClient, namespace: str, labels: dict[str, str]) -> tuple[JSON, JSON]:
    """A TrainJob and the JobSet Trainer builds for it (named as it, owned by it, without its labels).

    kubeflow/trainer@8c0f5059 pkg/runtime/framework/plugins/jobset/jobset.go
    (Build): the JobSet gets the runtime template's labels, not the TrainJob's.
    """
    trainjob = custom_owner(
        k8s,
        namespace,
        TRAINJOB,
        "llama",
        {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 2}},
        labels=labels,
    )
    node = {"parallelism": 2, "completions": 2, "template": _template({})}
    js = custom_owner(
        k8s,
        namespace,
        JOBSET,
        "llama",
        {"replicatedJobs": [{"name": "node", "replicas": 1, "template": {"spec": node}}]},
        labels={"trainer.kubeflow.org/framework": "torch"},
        owner=trainjob,
    )
    return trainjob, js


def test_a_trainjobs_queue_label_reaches_its_pods_group(
    k8s: client.ApiClient, namespace: str, nodes: Callable[[int], set[str]], queue: Callable[..., str]
) -> None:
    q = queue(16)
    _, js = _trainjob(k8s, namespace, {contract.LABEL_KAI_QUEUE: q})
    names = jobset_job(k8s, namespace, js, "node", 2)
    api = scheduler_api(k8s)
    result = new_cycle(api, default_queue="nobody").run(view(k8s, namespace, nodes(1)))

    name = f"pg-llama-{js['metadata']['uid']}"
    group = podgroups(k8s, namespace)[name]
    assert group["spec"] == {"minMember": 2, "queue": q}
    assert group["metadata"]["ownerReferences"] == [owner_ref_json(js)]
    assert bound(result) == set(names)
    assert api.stats.snapshot()[0].get(f"get_{TRAINJOB.plural}") == 1


@pytest.fixture
def scheduler_identity(control_plane: ControlPlane, scheduler_rbac: None) -> Iterator[client.ApiClient]:
    with control_plane.impersonate("gpuwarden-scheduler", "gpuwarden") as sa:
        yield sa


def test_the_schedulers_service_account_follows_trainjobs_and_rayservices(
    k8s: client.ApiClient, namespace: str, scheduler_identity: client.ApiClient
) -> None:
    chains: dict[str, list[str]] = {}
    _, js = _trainjob(k8s, namespace, {})
    chains[jobset_job(k8s, namespace, js, "node", 1)[0]] = ["Job", "JobSet", "TrainJob"]
    service = custom_owner(k8s, namespace, RAYSERVICE, "serve", {})
    rc = custom_owner(k8s, namespace, RAYCLUSTER, "serve-abcde", {}, owner=service)
    chains[owned_pods(k8s, namespace, rc, ["serve-abcde-head-x"])[0]] = ["RayCluster", "RayService"]

    api = KubeApi(scheduler_identity, field_manager=contract.SCHEDULER_COMPONENT)
    resolver = OwnerResolver(api)
    pods = {p["metadata"]["name"]: p for p in view(k8s, namespace, set()).pods.values()}
    assert {name: [o["kind"] for o in resolver.chain(pods[name])] for name in chains} == chains
    assert api.stats.snapshot()[1] == {}, "an owner read was refused"
