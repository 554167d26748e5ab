"""Gangs whose members finish, and what a group's status says, with the connected cycle and the real API server.

The batch Job here gets its pods from the real Job controller (a
kube-controller-manager running only it, for the test's length): which pods
exist, and when the next ones come, is the controller's business, as in a
cluster. There is no kubelet: the test marks pods running and finished as
one would (``mark_pod_running``, ``mark_pod_finished``), and the Job
controller counts its completions from those statuses.
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
from scheduler.cluster.cycle import SchedulingCycle
from scheduler.engine.model import SchedulerConfig
from tests.harness import ControlPlane, mark_pod_finished, mark_pod_running, wait_for
from tests.scheduler.cluster.kube_objects import pod, podgroup
from tests.scheduler.cluster.test_cycle_k8s import NO_WAIT, podgroup_status, view

pytestmark = pytest.mark.k8s

GRACE_S = 60.0


@pytest.fixture
def job_controller(control_plane: ControlPlane) -> Iterator[None]:
    """The Job controller, running for one test."""
    with control_plane.extra_controllers("job"):
        yield


class Clock:
    """The cycle's clock, moved by the test: the stale-gang grace passes without waiting for it."""

    def __init__(self) -> None:
        self.now = 1_900_000_000.0

    def __call__(self) -> float:
        return self.now


def new_cycle(k8s: client.ApiClient, clock: Clock) -> SchedulingCycle:
    api = KubeApi(k8s, field_manager=contract.SCHEDULER_COMPONENT)
    return SchedulingCycle(
        api,
        config=SchedulerConfig(stale_gang_grace_s=GRACE_S),
        binder=Binder(api, retry=NO_WAIT),
        clock=clock,
    )


def _raw(response: Any) -> Any:
    return json.loads(response.data)


def job_pods(k8s: client.ApiClient, namespace: str, name: str) -> list[dict[str, Any]]:
    """The Job's pods, oldest first (the controller names them at random)."""
    listed = client.CoreV1Api(k8s).list_namespaced_pod(
        namespace, label_selector=f"batch.kubernetes.io/job-name={name}", _preload_content=False
    )
    items: list[dict[str, Any]] = _raw(listed)["items"]
    return sorted(items, key=lambda p: (p["metadata"]["creationTimestamp"], p["metadata"]["name"]))


def batch_job(
    k8s: client.ApiClient, namespace: str, name: str, queue: str, *, parallelism: int, completions: int
) -> None:
    body = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {contract.LABEL_QUEUE: queue}},
        "spec": {
            "parallelism": parallelism,
            "completions": completions,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "schedulerName": contract.SCHEDULER_NAME,
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.invalid/train:1",
                            "resources": {
                                "requests": {"cpu": "1", "memory": "1Gi", contract.RESOURCE_NVIDIA_GPU: "1"},
                                "limits": {contract.RESOURCE_NVIDIA_GPU: "1"},
                            },
                        }
                    ],
                }
            },
        },
    }
    client.BatchV1Api(k8s).create_namespaced_job(namespace, body)


def only_podgroup_status(k8s: client.ApiClient, namespace: str) -> dict[str, Any]:
    """The status of the namespace's one PodGroup (the one derived from its Job)."""
    (group,) = client.CustomObjectsApi(k8s).list_namespaced_custom_object(
        contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION, namespace, contract.PODGROUP_PLURAL
    )["items"]
    status: dict[str, Any] = group.get("status") or {}
    return status


def _names(pods: list[dict[str, Any]]) -> list[str]:
    return [p["metadata"]["name"] for p in pods]


def _waiting_for(k8s: client.ApiClient, namespace: str, name: str, count: int) -> list[dict[str, Any]]:
    """Wait until the Job controller has made ``count`` pods of the Job in all."""
    return wait_for(
        lambda: found if len(found := job_pods(k8s, namespace, name)) == count else None,
        60,
        description=f"the Job controller to create {count} pods of {name}",
    )


@pytest.mark.usefixtures("job_controller")
@pytest.mark.parametrize("finished_first", [2, 4], ids=["two-then-two", "four-at-once"])
def test_a_job_whose_first_pods_succeed_places_its_last_and_never_evicts_them_as_a_stale_gang(
    k8s: client.ApiClient,
    namespace: str,
    cluster: Callable[[int], list[str]],
    queue: Callable[..., str],
    finished_first: int,
) -> None:
    """Parallelism 4, completions 6: pods 0-3 succeed while 4 and 5 run (minMember 4, one GPU a pod).

    Finished two, then two: 4 and 5 come while 2 and 3 still run, and are
    left running two of a gang of four once those finish. Finished four at
    once: 4 and 5 are all that is left to place, fewer than minMember.
    """
    nodes = set(cluster(1))
    q = queue(8)
    batch_job(k8s, namespace, "batch", q, parallelism=4, completions=6)
    first = _waiting_for(k8s, namespace, "batch", 4)
    clock = Clock()
    cycle = new_cycle(k8s, clock)

    result = cycle.run(view(k8s, nodes))
    assert sorted(r.bind.pod for r in result.binds if r.ok) == sorted(_names(first))
    for name in _names(first):
        mark_pod_running(k8s, name, namespace)
    cycle.run(view(k8s, nodes))

    for name in _names(first)[:finished_first]:
        mark_pod_finished(k8s, name, namespace)
    made = _waiting_for(k8s, namespace, "batch", 4 + 2)
    last = [n for n in _names(made) if n not in _names(first)]
    result = cycle.run(view(k8s, nodes))
    assert sorted(r.bind.pod for r in result.binds if r.ok) == sorted(last), result.decisions.pending
    for name in last:
        mark_pod_running(k8s, name, namespace)
    for name in _names(first)[finished_first:]:
        mark_pod_finished(k8s, name, namespace)

    # 4 and 5 run, 0-3 succeeded: the gang of 4 is whole, through the grace and long after it.
    for step in (1.0, GRACE_S + 1, 10 * GRACE_S):
        clock.now += step
        result = cycle.run(view(k8s, nodes))
        assert result.decisions.evictions == ()
    core = client.CoreV1Api(k8s)
    for name in last:
        stored = core.read_namespaced_pod(name, namespace)
        assert stored.metadata.deletion_timestamp is None and stored.spec.node_name in nodes
    status = only_podgroup_status(k8s, namespace)
    assert status["phase"] == "Running"
    assert status["conditions"][0]["status"] == "False"

    # The last two succeed: the Job is complete, and so is its PodGroup.
    for name in last:
        mark_pod_finished(k8s, name, namespace)
    wait_for(
        lambda: (client.BatchV1Api(k8s).read_namespaced_job_status("batch", namespace).status.succeeded or 0) == 6,
        60,
        description="the Job controller to count six completions",
    )
    cycle.run(view(k8s, nodes))
    status = only_podgroup_status(k8s, namespace)
    assert status["phase"] == "Succeeded"
    assert status["conditions"][0]["message"] == "every pod finished: 6 succeeded"


def test_a_pod_group_says_succeeded_once_its_pods_all_succeeded_and_failed_when_its_gang_could_not_complete(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    nodes = set(cluster(1))
    q = queue(8)
    for group in ("done", "broken"):
        podgroup(k8s, namespace, group, q, 2)
        for i in range(2):
            pod(k8s, namespace, f"{group}-{i}", group=group)
    cycle = new_cycle(k8s, Clock())
    result = cycle.run(view(k8s, nodes))
    assert sum(1 for r in result.binds if r.ok) == 4
    for group in ("done", "broken"):
        for i in range(2):
            mark_pod_running(k8s, f"{group}-{i}", namespace)
    cycle.run(view(k8s, nodes))
    assert podgroup_status(k8s, namespace, "done")["phase"] == "Running"

    mark_pod_finished(k8s, "done-0", namespace)
    cycle.run(view(k8s, nodes))
    # One finished, one runs: still running.
    assert podgroup_status(k8s, namespace, "done")["phase"] == "Running"

    mark_pod_finished(k8s, "done-1", namespace)
    mark_pod_finished(k8s, "broken-0", namespace)
    mark_pod_finished(k8s, "broken-1", namespace, succeeded=False)
    result = cycle.run(view(k8s, nodes))
    # Groups with no pod left to run are not the engine's: they only get their final status.
    assert not {"done", "broken"} & {j.name for j in result.snapshot.jobs if j.namespace == namespace}
    done = podgroup_status(k8s, namespace, "done")
    assert done["phase"] == "Succeeded"
    assert done["conditions"][0]["message"] == "every pod finished: 2 succeeded"
    broken = podgroup_status(k8s, namespace, "broken")
    assert broken["phase"] == "Failed"
    assert broken["conditions"][0]["message"] == "every pod finished: 1 succeeded, 1 failed, fewer than minMember 2"


def test_a_gang_larger_than_its_pool_is_told_it_will_never_fit_and_no_reason_is_said_twice(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    nodes = set(cluster(2))  # 16 GPUs in the pool
    q = queue(16)
    podgroup(k8s, namespace, "busy", q, 1)
    pod(k8s, namespace, "busy-0", group="busy")  # one GPU of one node
    cycle = new_cycle(k8s, Clock())
    assert sum(1 for r in cycle.run(view(k8s, nodes)).binds if r.ok) == 1
    podgroup(k8s, namespace, "huge", q, 3)  # 3 x 8 = 24 GPUs: never in this pool
    podgroup(k8s, namespace, "wide", q, 2)  # 2 x 8 = 16 GPUs: once the busy pod is gone
    for i in range(3):
        pod(k8s, namespace, f"huge-{i}", group="huge", gpus=8)
    for i in range(2):
        pod(k8s, namespace, f"wide-{i}", group="wide", gpus=8)
    cycle.run(view(k8s, nodes))

    huge = podgroup_status(k8s, namespace, "huge")["conditions"][0]
    assert (huge["status"], huge["reason"]) == ("True", "InsufficientResources")
    assert huge["message"] == (
        "the gang needs 24 GPUs for 3 pods but pool default has 16 GPUs in all: it will never fit; "
        "lower its minMember or add nodes to the pool"
    )
    wide = podgroup_status(k8s, namespace, "wide")["conditions"][0]
    assert wide["reason"] == "InsufficientResources"
    assert wide["message"].startswith(
        "each pod needs 8 GPUs, 1 core, 4 GiB on one node; 1 of 2 eligible nodes of pool default have room "
        "(1 node with fewer than 8 free GPUs); "
        "the gang needs 16 GPUs for 2 pods, eligible nodes have 15 free (short by 1)"
    )
    assert "never fit" not in wide["message"]
    events = client.CoreV1Api(k8s).list_namespaced_event(namespace).items
    for group, condition in (("huge", huge), ("wide", wide)):
        (event,) = [e for e in events if e.involved_object.name == group]
        assert (event.reason, event.message) == ("InsufficientResources", condition["message"])
        # The reason is shown beside the message (kubectl, the demo's table): never inside it too.
        assert not event.message.startswith("InsufficientResources")
