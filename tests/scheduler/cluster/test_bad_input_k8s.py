"""Input the API server accepts and the scheduler cannot use: said where the user looks, then scheduled once fixed.

Each test runs the scheduler's cycles as its ServiceAccount (the shipped
RBAC, by impersonation) against the real API server: a Queue whose quota the
CRD's pattern admits but no cluster holds, a pod naming a PodGroup that does
not exist, and GPU-sharing annotations on a pod that never met the webhook.
Every cycle reads a fresh listing, as the watch cache would hand it over;
one SchedulingCycle runs them all, as the leader that stays in office.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from gpuwarden import contract
from gpuwarden.kube import KubeApi
from gpuwarden.localcluster import ControlPlane
from scheduler.cluster.bind import Binder
from scheduler.cluster.cycle import SchedulingCycle
from scheduler.cluster.ungrouped import missing_message
from scheduler.engine.resources import parse_gpu_request
from tests.harness import unique_name
from tests.scheduler.cluster.kube_objects import create_queue, delete_queue, node_of, pod, podgroup
from tests.scheduler.cluster.test_cycle_k8s import NO_WAIT, podgroup_status, view

pytestmark = [pytest.mark.k8s, pytest.mark.usefixtures("scheduler_crds", "scheduler_rbac")]

SCHEDULER_NAMESPACE = "gpuwarden"
SCHEDULER_SERVICE_ACCOUNT = "gpuwarden-scheduler"


@pytest.fixture
def as_scheduler(control_plane: ControlPlane) -> Iterator[Callable[..., SchedulingCycle]]:
    """Cycles acting as the scheduler's ServiceAccount (the shipped RBAC); each keeps its state, as one leader."""
    with control_plane.impersonate(SCHEDULER_SERVICE_ACCOUNT, SCHEDULER_NAMESPACE) as sa:

        def make(*, incremental: bool = True) -> SchedulingCycle:
            api = KubeApi(sa, field_manager=contract.SCHEDULER_COMPONENT)
            return SchedulingCycle(api, binder=Binder(api, retry=NO_WAIT), incremental=incremental)

        yield make


def _custom(k8s: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(k8s)


def _queue(k8s: client.ApiClient, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = _custom(k8s).get_cluster_custom_object(
        contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION, contract.QUEUE_PLURAL, name
    )
    return obj


def _conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status.get("conditions") or []}


def _events(k8s: client.ApiClient, namespace: str, kind: str, name: str) -> list[client.CoreV1Event]:
    items = client.CoreV1Api(k8s).list_namespaced_event(namespace).items
    return [e for e in items if e.involved_object.kind == kind and e.involved_object.name == name]


@pytest.fixture
def raw_queue(k8s: client.ApiClient) -> Iterator[Callable[[dict[str, Any]], str]]:
    """Queues with a spec as written (the ``queue`` fixture writes GPU quotas only), removed afterwards."""
    made: list[str] = []

    def make(resources: dict[str, Any]) -> str:
        name = unique_name("q")
        create_queue(k8s, name, resources)
        made.append(name)
        return name

    yield make
    for name in made:
        delete_queue(k8s, name)


@pytest.mark.parametrize(
    ("resource", "amount", "problem"),
    [
        ("cpu", "9999999999999999999999999999E", "cores is beyond any cluster"),
        ("cpu", "1e999", "exponent out of range"),
        ("memory", "1e30", "bytes is beyond any cluster"),
    ],
)
def test_a_queue_whose_quota_no_cluster_holds_says_why_on_itself_and_its_pods_until_fixed(
    k8s: client.ApiClient,
    namespace: str,
    *,
    cluster: Callable[[int], list[str]],
    raw_queue: Callable[[dict[str, Any]], str],
    as_scheduler: Callable[..., SchedulingCycle],
    resource: str,
    amount: str,
    problem: str,
) -> None:
    nodes = set(cluster(1))
    q = raw_queue({"gpu": {"quota": 8}, resource: {"quota": amount}})
    podgroup(k8s, namespace, "train", q, 1)
    pod(k8s, namespace, "train-0", group="train")
    cycle = as_scheduler()

    cycle.run(view(k8s, nodes))
    assert node_of(k8s, namespace, "train-0") is None
    invalid = _conditions(_queue(k8s, q).get("status") or {})["Invalid"]
    assert (invalid["status"], invalid["reason"]) == ("True", "InvalidSpec")
    assert invalid["message"].startswith(f"queue {q} is invalid: spec.resources.{resource}.quota: ")
    assert problem in invalid["message"]
    waiting = _conditions(podgroup_status(k8s, namespace, "train"))["Unschedulable"]
    assert (waiting["status"], waiting["reason"]) == ("True", "InvalidQueue")
    assert invalid["message"] in waiting["message"] and "does not exist" not in waiting["message"]
    (event,) = _events(k8s, namespace, contract.PODGROUP_KIND, "train")
    assert event.reason == "InvalidQueue" and problem in event.message

    # Fixed by its owner: the same leader clears the condition and places the pod.
    _custom(k8s).patch_cluster_custom_object(
        contract.SCHEDULING_API_GROUP,
        contract.SCHEDULING_API_VERSION,
        contract.QUEUE_PLURAL,
        q,
        {"spec": {"resources": {resource: {"quota": "64" if resource == "cpu" else "64Gi"}}}},
    )
    cycle.run(view(k8s, nodes))
    assert node_of(k8s, namespace, "train-0") in nodes
    status = _queue(k8s, q)["status"]
    conditions = _conditions(status)
    assert (conditions["Invalid"]["status"], conditions["Invalid"]["reason"]) == ("False", "Valid")
    assert status["allocated"]["gpu"] == 1


@pytest.mark.parametrize("incremental", [True, False], ids=["incremental", "whole-view"])
def test_a_pod_naming_a_missing_pod_group_is_told_why_on_itself_and_schedules_once_it_exists(
    k8s: client.ApiClient,
    namespace: str,
    *,
    cluster: Callable[[int], list[str]],
    queue: Callable[..., str],
    as_scheduler: Callable[..., SchedulingCycle],
    incremental: bool,
) -> None:
    nodes = set(cluster(1))
    q = queue(8)
    pod(k8s, namespace, "orphan-0", group="later")
    cycle = as_scheduler(incremental=incremental)
    core = client.CoreV1Api(k8s)

    cycle.run(view(k8s, nodes))
    stored = core.read_namespaced_pod("orphan-0", namespace)
    assert stored.spec.node_name is None
    (scheduled,) = [c for c in stored.status.conditions or [] if c.type == "PodScheduled"]
    assert (scheduled.status, scheduled.reason) == ("False", "Unschedulable")
    assert scheduled.message == missing_message(namespace, "later")
    assert "does not exist" in scheduled.message and contract.ANNOTATION_POD_GROUP in scheduled.message
    (event,) = _events(k8s, namespace, "Pod", "orphan-0")
    assert (event.type, event.reason) == ("Warning", "PodGroupNotFound")
    assert event.involved_object.uid == stored.metadata.uid and event.message == scheduled.message
    # A cycle with nothing new writes nothing new.
    cycle.run(view(k8s, nodes))
    assert [e.count for e in _events(k8s, namespace, "Pod", "orphan-0")] == [1]

    # The PodGroup is created: the same leader places the pod, and the binding says it is scheduled.
    podgroup(k8s, namespace, "later", q, 1)
    cycle.run(view(k8s, nodes))
    stored = core.read_namespaced_pod("orphan-0", namespace)
    assert stored.spec.node_name in nodes
    conditions = {c.type: c.status for c in stored.status.conditions or []}
    assert conditions.get("PodScheduled") == "True"


def test_a_grouped_pod_that_still_waits_loses_the_reason_it_no_longer_has(
    k8s: client.ApiClient,
    namespace: str,
    cluster: Callable[[int], list[str]],
    queue: Callable[..., str],
    as_scheduler: Callable[..., SchedulingCycle],
) -> None:
    nodes = set(cluster(1))
    q = queue(8)
    pod(k8s, namespace, "big-0", group="big", gpus=16)  # fits no 8-GPU node
    cycle = as_scheduler()
    cycle.run(view(k8s, nodes))
    core = client.CoreV1Api(k8s)
    assert any(c.type == "PodScheduled" for c in core.read_namespaced_pod("big-0", namespace).status.conditions or [])

    podgroup(k8s, namespace, "big", q, 1)
    cycle.run(view(k8s, nodes))
    stored = core.read_namespaced_pod("big-0", namespace)
    assert stored.spec.node_name is None
    assert not any(c.type == "PodScheduled" for c in stored.status.conditions or []), "a stale reason stays"
    # Its group explains it now.
    assert _conditions(podgroup_status(k8s, namespace, "big"))["Unschedulable"]["reason"] == "NoEligibleNodes"


BOUNDS = [
    {contract.ANNOTATION_GPU_FRACTION: "1e-300"},
    {contract.ANNOTATION_GPU_FRACTION: "0." + "5" * 4998},
    {contract.ANNOTATION_KAI_GPU_MEMORY: "99999999999"},
    {contract.ANNOTATION_GPU_MEMORY: "1024", contract.ANNOTATION_GPU_FRACTION_NUM_DEVICES: "100"},
]


def test_a_slice_pod_that_skipped_the_webhook_is_refused_with_the_webhooks_words(
    k8s: client.ApiClient,
    namespace: str,
    cluster: Callable[[int], list[str]],
    queue: Callable[..., str],
    as_scheduler: Callable[..., SchedulingCycle],
) -> None:
    nodes = set(cluster(1))
    q = queue(8)
    for i, notes in enumerate(BOUNDS):
        podgroup(k8s, namespace, f"slice-{i}", q, 1)
        # No webhook serves this namespace: the annotations reach the scheduler as written.
        pod(k8s, namespace, f"slice-{i}-0", group=f"slice-{i}", gpus=0, annotations=notes)
    as_scheduler().run(view(k8s, nodes))
    for i, notes in enumerate(BOUNDS):
        assert node_of(k8s, namespace, f"slice-{i}-0") is None
        words = parse_gpu_request(0, notes)
        assert isinstance(words, str)
        waiting = _conditions(podgroup_status(k8s, namespace, f"slice-{i}"))["Unschedulable"]
        assert waiting["reason"] == "InvalidRequest"
        assert waiting["message"] == f"pod slice-{i}-0: {words}"
