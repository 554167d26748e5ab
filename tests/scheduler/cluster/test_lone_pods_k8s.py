"""A lone pod's group gets a PodGroup only when it has something to explain, against the real API server.

A bare pod (or a Deployment's replica) is a group of one derived from the
pod itself. Placed at once, it runs and ends as the pod shows, and its
PodGroup would only repeat that at three writes per pod (create, Running,
the final status). So: none is made, and nothing is written for it, through
its whole life. A lone pod that waits is news: its PodGroup is made with the
explanation, and from then on it is written like any group's. A PodGroup
that already exists (made before, by an earlier version) is written as
always.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kubernetes import client

from gpuwarden import contract
from gpuwarden.kube import KubeApi
from scheduler.cluster.bind import Binder
from scheduler.cluster.cycle import SchedulingCycle
from scheduler.cluster.retrying import RetryPolicy
from tests.harness import mark_pod_finished, mark_pod_running
from tests.scheduler.cluster.kube_objects import pod
from tests.scheduler.cluster.test_owner_kinds_k8s import apps_owner, bound, new_cycle, podgroups, scheduler_api, view

pytestmark = pytest.mark.k8s

SCHEDULING = (contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION)
NO_WAIT = RetryPolicy(attempts=3, sleep=lambda _s: None)


def _writes(api: KubeApi) -> dict[str, int]:
    """The PodGroup writes the cycle's API made, answered or not."""
    ok, failed = api.stats.snapshot()
    return {
        key: ok.get(key, 0) + failed.get(key, 0)
        for key in ("create_podgroup", "patch_podgroup_status", "patch_podgroup")
        if ok.get(key, 0) + failed.get(key, 0)
    }


def _group_name(k8s: client.ApiClient, namespace: str, name: str) -> str:
    uid = client.CoreV1Api(k8s).read_namespaced_pod(name, namespace).metadata.uid
    return f"pg-{name}-{uid}"


def test_a_bare_pod_placed_at_once_gets_no_podgroup_and_no_write_through_its_life(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    nodes = set(cluster(1))
    q = queue(8)
    pod(k8s, namespace, "lone", queue=q)
    api = scheduler_api(k8s)
    cycle = new_cycle(api, default_queue="nobody")
    assert bound(cycle.run(view(k8s, namespace, nodes))) == {"lone"}
    mark_pod_running(k8s, "lone", namespace)
    cycle.run(view(k8s, namespace, nodes))
    mark_pod_finished(k8s, "lone", namespace)
    result = cycle.run(view(k8s, namespace, nodes))
    cycle.flush()
    assert not {j.name for j in result.snapshot.jobs if j.namespace == namespace}  # finished: set apart
    assert podgroups(k8s, namespace) == {}
    assert _writes(api) == {}
    # Its pod deleted, the group leaves what the cycle keeps.
    client.CoreV1Api(k8s).delete_namespaced_pod("lone", namespace, grace_period_seconds=0)
    cycle.run(view(k8s, namespace, nodes))
    assert cycle._lone == {}


@pytest.mark.parametrize("background", [False, True], ids=["on-the-cycle", "behind-the-cycles"])
def test_a_lone_pod_that_waits_gets_its_podgroup_explained_and_written_from_then_on(
    k8s: client.ApiClient,
    namespace: str,
    cluster: Callable[[int], list[str]],
    queue: Callable[..., str],
    background: bool,
) -> None:
    """Also with the writes behind the cycles, as the scheduler runs them: the writer asks the cycle's state."""
    nodes = set(cluster(1))
    q = queue(16)
    pod(k8s, namespace, "big", queue=q, gpus=8)
    api = scheduler_api(k8s)
    cycle = SchedulingCycle(
        api, default_queue="nobody", binder=Binder(api, retry=NO_WAIT), writes_in_background=background
    )
    try:
        assert bound(cycle.run(view(k8s, namespace, nodes))) == {"big"}
        mark_pod_running(k8s, "big", namespace)
        pod(k8s, namespace, "waits", queue=q)  # the node's 8 GPUs are taken
        result = cycle.run(view(k8s, namespace, nodes))
        cycle.flush()
        assert bound(result) == set()
        name = _group_name(k8s, namespace, "waits")
        made = podgroups(k8s, namespace)
        assert set(made) == {name}  # the placed one still has none
        assert made[name]["spec"] == {"minMember": 1, "queue": q}
        assert made[name]["metadata"]["ownerReferences"][0]["kind"] == "Pod"
        status = made[name]["status"]
        assert status["phase"] == "Pending"
        unschedulable = next(
            c for c in status["conditions"] if c["type"] == contract.PodGroupConditionType.UNSCHEDULABLE
        )
        assert unschedulable["status"] == "True" and unschedulable["message"]

        # Room comes: it is placed, and its PodGroup says so, then how it ended.
        mark_pod_finished(k8s, "big", namespace)
        assert bound(cycle.run(view(k8s, namespace, nodes))) == {"waits"}
        cycle.flush()
        assert podgroups(k8s, namespace)[name]["status"]["phase"] == "Running"
        mark_pod_running(k8s, "waits", namespace)
        cycle.run(view(k8s, namespace, nodes))
        mark_pod_finished(k8s, "waits", namespace)
        cycle.run(view(k8s, namespace, nodes))
        cycle.flush()
        assert podgroups(k8s, namespace)[name]["status"]["phase"] == "Succeeded"
        assert set(podgroups(k8s, namespace)) == {name}
        assert _writes(api)["create_podgroup"] == 1
    finally:
        cycle.close()


def test_a_podgroup_made_before_for_a_lone_pod_is_written_as_always(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    """A cluster upgraded from a version that made one for every pod: those PodGroups keep telling the truth."""
    nodes = set(cluster(1))
    q = queue(8)
    created = pod(k8s, namespace, "older", queue=q)
    name = f"pg-older-{created.metadata.uid}"
    client.CustomObjectsApi(k8s).create_namespaced_custom_object(
        *SCHEDULING,
        namespace,
        contract.PODGROUP_PLURAL,
        {
            "apiVersion": "/".join(SCHEDULING),
            "kind": contract.PODGROUP_KIND,
            "metadata": {
                "name": name,
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "older", "uid": created.metadata.uid}],
            },
            "spec": {"minMember": 1, "queue": q},
        },
    )
    cycle = new_cycle(scheduler_api(k8s), default_queue="nobody")
    assert bound(cycle.run(view(k8s, namespace, nodes))) == {"older"}
    cycle.flush()
    assert podgroups(k8s, namespace)[name]["status"]["phase"] == "Running"
    mark_pod_finished(k8s, "older", namespace)
    cycle.run(view(k8s, namespace, nodes))
    cycle.flush()
    assert podgroups(k8s, namespace)[name]["status"]["phase"] == "Succeeded"


def test_a_deployments_replicas_are_lone_and_a_jobs_single_pod_is_not(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    """A Job of one pod is still the Job's group (its retries are its pods too): it gets its PodGroup."""
    nodes = set(cluster(1))
    q = queue(8)
    rs = apps_owner(k8s, namespace, "ReplicaSet", "web", replicas=0, labels={contract.LABEL_QUEUE: q})
    ref = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": rs["metadata"]["uid"]}
    ref |= {"controller": True, "blockOwnerDeletion": True}
    pod(k8s, namespace, "web-1", owner=ref)
    batch = client.BatchV1Api(k8s).create_namespaced_job(
        namespace,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "once", "labels": {contract.LABEL_QUEUE: q}},
            "spec": {
                "parallelism": 1,
                "completions": 1,
                "manualSelector": True,
                "selector": {"matchLabels": {"job": "once"}},
                "suspend": True,  # its pod is the test's, as the Job controller would make it
                "template": {
                    "metadata": {"labels": {"job": "once"}},
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": "registry.invalid/x:1"}],
                    },
                },
            },
        },
    )
    job_ref = {"apiVersion": "batch/v1", "kind": "Job", "name": "once", "uid": batch.metadata.uid, "controller": True}
    pod(k8s, namespace, "once-abc", owner=job_ref)
    cycle: SchedulingCycle = new_cycle(scheduler_api(k8s), default_queue="nobody")
    assert bound(cycle.run(view(k8s, namespace, nodes))) == {"web-1", "once-abc"}
    cycle.flush()
    assert set(podgroups(k8s, namespace)) == {f"pg-once-{batch.metadata.uid}"}
