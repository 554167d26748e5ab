"""A derived PodGroup follows its owner: resized, relabelled, against the real API server.

The owner is changed as its operator's users change it, and its pods as the
operator then does (KubeRay deletes the worker it no longer wants; the
pods stay as they were on a relabel). The cycle runs as the scheduler's
ServiceAccount under the shipped RBAC and admission policies, with a clock
the test moves past the stale-gang grace: a gang that shrank by its owner's
wish is not stale, and the PodGroup says what the owner says.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client

from gpuwarden import contract
from gpuwarden.kube import ApiError, KubeApi
from scheduler.cluster.bind import Binder
from scheduler.cluster.cycle import SchedulingCycle
from scheduler.cluster.groups import MANAGED_BY
from scheduler.cluster.owners import OwnerResolver
from scheduler.cluster.retrying import RetryPolicy
from scheduler.engine.model import SchedulerConfig
from tests.harness import ControlPlane, mark_pod_running
from tests.scheduler.cluster.owner_crds import RAYCLUSTER
from tests.scheduler.cluster.test_owner_kinds_k8s import (
    _ray_cluster_spec,
    custom_owner,
    job,
    owned_pods,
    podgroups,
    view,
)

pytestmark = [pytest.mark.k8s, pytest.mark.usefixtures("owner_crds", "scheduler_rbac")]

NO_WAIT = RetryPolicy(attempts=3, sleep=lambda _s: None)
GRACE_S = SchedulerConfig().stale_gang_grace_s


@pytest.fixture
def as_scheduler(control_plane: ControlPlane) -> Iterator[KubeApi]:
    with control_plane.impersonate("gpuwarden-scheduler", "gpuwarden") as api:
        yield KubeApi(api, field_manager=contract.SCHEDULER_COMPONENT)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _cycle(api: KubeApi, clock: Clock) -> SchedulingCycle:
    # Owners read afresh every cycle: the test changes them between cycles.
    return SchedulingCycle(
        api,
        default_queue="nobody",
        binder=Binder(api, retry=NO_WAIT),
        owners=OwnerResolver(api, ttl_s=0.0),
        clock=clock,
    )


def test_a_raycluster_scaled_down_keeps_its_head_and_worker_and_its_podgroup_follows(
    k8s: client.ApiClient,
    namespace: str,
    cluster: Callable[[int], list[str]],
    queue: Callable[..., str],
    as_scheduler: KubeApi,
) -> None:
    nodes = set(cluster(1))
    q = queue(8)
    rc = custom_owner(k8s, namespace, RAYCLUSTER, "tune", _ray_cluster_spec(2, 1), labels={contract.LABEL_QUEUE: q})
    pods = owned_pods(k8s, namespace, rc, ["tune-head", "tune-gpu-worker-a", "tune-gpu-worker-b"])
    clock = Clock()
    cycle = _cycle(as_scheduler, clock)
    first = cycle.run(view(k8s, namespace, nodes))
    cycle.flush()
    assert {r.bind.pod for r in first.binds if r.ok} == set(pods)
    for name in pods:
        mark_pod_running(k8s, name, namespace)
    name = f"pg-tune-{rc['metadata']['uid']}"
    created = podgroups(k8s, namespace)[name]
    assert created["spec"]["minMember"] == 3
    assert created["metadata"]["labels"][MANAGED_BY] == contract.SCHEDULER_COMPONENT

    # The user scales the worker group from 2 to 1; KubeRay deletes one worker.
    client.CustomObjectsApi(k8s).patch_namespaced_custom_object(
        RAYCLUSTER.group,
        RAYCLUSTER.version,
        namespace,
        RAYCLUSTER.plural,
        "tune",
        [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 1}],
        _content_type="application/json-patch+json",
    )
    client.CoreV1Api(k8s).delete_namespaced_pod("tune-gpu-worker-b", namespace, grace_period_seconds=0)
    evicted: list[str] = []
    for _ in range(3):  # past the stale-gang grace: a gang short of the old minMember would be evicted
        result = cycle.run(view(k8s, namespace, nodes))
        cycle.flush()
        evicted += [e.eviction.pod for e in result.evictions]
        clock.now += GRACE_S
    assert evicted == []
    job_of = {j.name: j for j in result.snapshot.jobs}[name]
    assert job_of.min_member == 2
    assert podgroups(k8s, namespace)[name]["spec"] == {"minMember": 2, "queue": q}


def test_a_jobs_new_queue_label_and_parallelism_reach_its_podgroup(
    k8s: client.ApiClient,
    namespace: str,
    cluster: Callable[[int], list[str]],
    queue: Callable[..., str],
    as_scheduler: KubeApi,
) -> None:
    nodes = set(cluster(1))
    before, after = queue(8), queue(8)
    j = job(k8s, namespace, "train", parallelism=2, labels={contract.LABEL_QUEUE: before})
    owned_pods(k8s, namespace, j, ["train-a", "train-b"], gpus=8)  # two 8-GPU pods on one node: one waits
    clock = Clock()
    cycle = _cycle(as_scheduler, clock)
    cycle.run(view(k8s, namespace, nodes))
    cycle.flush()
    name = f"pg-train-{j['metadata']['uid']}"
    assert podgroups(k8s, namespace)[name]["spec"] == {"minMember": 2, "queue": before}

    client.BatchV1Api(k8s).patch_namespaced_job(
        "train", namespace, {"metadata": {"labels": {contract.LABEL_QUEUE: after}}, "spec": {"parallelism": 1}}
    )
    result = cycle.run(view(k8s, namespace, nodes))
    cycle.flush()
    job_of = {j.name: j for j in result.snapshot.jobs}[name]
    assert (job_of.queue, job_of.min_member) == (after, 1)
    assert podgroups(k8s, namespace)[name]["spec"] == {"minMember": 1, "queue": after}


def _user_podgroup(k8s: client.ApiClient, namespace: str, name: str, queue: str) -> None:
    client.CustomObjectsApi(k8s).create_namespaced_custom_object(
        contract.SCHEDULING_API_GROUP,
        contract.SCHEDULING_API_VERSION,
        namespace,
        contract.PODGROUP_PLURAL,
        {
            "apiVersion": f"{contract.SCHEDULING_API_GROUP}/{contract.SCHEDULING_API_VERSION}",
            "kind": contract.PODGROUP_KIND,
            "metadata": {"name": name},
            "spec": {"minMember": 4, "queue": queue},
        },
    )


def _patch_status(api: KubeApi, namespace: str, name: str) -> int | None:
    try:
        api.patch_podgroup(namespace, name, {"spec": {"minMember": 1}})
    except ApiError as err:
        return err.status
    return 200


def test_the_scheduler_rewrites_only_the_podgroups_it_derived(
    k8s: client.ApiClient, namespace: str, queue: Callable[..., str], as_scheduler: KubeApi
) -> None:
    """A PodGroup a user wrote is read as written: the scheduler's token may not rewrite it."""
    q = queue(8)
    for i in range(30):  # policies take effect a moment after they are created: probe with throwaway groups
        _user_podgroup(k8s, namespace, f"probe-{i}", q)
        if _patch_status(as_scheduler, namespace, f"probe-{i}") == 403:
            break
        time.sleep(0.5)
    _user_podgroup(k8s, namespace, "users", q)
    assert _patch_status(as_scheduler, namespace, "users") == 403
    stored = client.CustomObjectsApi(k8s).get_namespaced_custom_object(
        contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION, namespace, contract.PODGROUP_PLURAL, "users"
    )
    assert stored["spec"]["minMember"] == 4


def test_a_derived_podgroup_deleted_while_its_job_runs_is_made_again_and_written(
    k8s: client.ApiClient,
    namespace: str,
    cluster: Callable[[int], list[str]],
    queue: Callable[..., str],
    as_scheduler: KubeApi,
) -> None:
    """Deleted by hand: the next cycle creates it again and writes its status afresh, not as the old one's."""
    nodes = set(cluster(1))
    q = queue(8)
    j = job(k8s, namespace, "rerun", parallelism=1, labels={contract.LABEL_QUEUE: q})
    owned_pods(k8s, namespace, j, ["rerun-a"])
    clock = Clock()
    cycle = _cycle(as_scheduler, clock)
    cycle.run(view(k8s, namespace, nodes))
    cycle.flush()
    name = f"pg-rerun-{j['metadata']['uid']}"
    first = podgroups(k8s, namespace)[name]
    assert first["status"]["phase"] == "Running"
    client.CustomObjectsApi(k8s).delete_namespaced_custom_object(
        contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION, namespace, contract.PODGROUP_PLURAL, name
    )
    for _ in range(50):  # the delete is seen by the next view
        if name not in podgroups(k8s, namespace):
            break
        time.sleep(0.1)
    cycle.run(view(k8s, namespace, nodes))
    cycle.flush()
    again = podgroups(k8s, namespace)[name]
    assert again["metadata"]["uid"] != first["metadata"]["uid"]
    assert again.get("status", {}).get("phase") == "Running"  # written, not taken for the old one's
    cycle.run(view(k8s, namespace, nodes))
    cycle.flush()
    assert podgroups(k8s, namespace)[name]["metadata"]["uid"] == again["metadata"]["uid"]
