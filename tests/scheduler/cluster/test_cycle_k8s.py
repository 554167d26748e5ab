"""Whole scheduling cycles against the real API server: objects in, pods bound, evicted, explained.

Nodes carry what the agent publishes (NodeConditions and a GPUNode written by
the agent's own publisher functions), Queues and PodGroups are the shipped
CRDs' objects, and every cycle reads a fresh listing of them, as the watch
cache would hand it over. There is no kubelet: a bound pod is marked Running
by the test, as the harness's stand-in does elsewhere.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client

from gpuwarden import contract
from gpuwarden.contract import Action
from gpuwarden.kube import KubeApi
from scheduler.cluster.assignment import decode_assignment
from scheduler.cluster.bind import Binder
from scheduler.cluster.cycle import DEFAULT_SLICE_ADMISSION, ClusterView, SchedulingCycle
from scheduler.cluster.retrying import RetryPolicy
from scheduler.cluster.sliceadmission import SliceAdmission
from tests.agent.publish.reports import xid_fault
from tests.harness import complete_pod_deletion, mark_pod_running, unique_name
from tests.scheduler.cluster.kube_objects import delete_queue, node_of, pod, podgroup, publish_health, slice_env
from tests.scheduler.cluster.test_owner_kinds_k8s import job, owned_pods

pytestmark = pytest.mark.k8s

GPUS = 8
NO_WAIT = RetryPolicy(attempts=3, sleep=lambda _s: None)


def _raw(response: Any) -> Any:
    return json.loads(response.data)


def view(k8s: client.ApiClient, node_names: set[str]) -> ClusterView:
    """What the watch cache would hold, listed now, limited to this test's nodes."""
    core = client.CoreV1Api(k8s)
    custom = client.CustomObjectsApi(k8s)
    nodes = {
        n["metadata"]["name"]: n
        for n in _raw(core.list_node(_preload_content=False))["items"]
        if n["metadata"]["name"] in node_names
    }
    gpunodes = {
        g["metadata"]["name"]: g
        for g in _raw(
            custom.list_cluster_custom_object(
                contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL, _preload_content=False
            )
        )["items"]
        if g["metadata"]["name"] in node_names
    }
    # An earlier test's pods linger while its namespace terminates: not this test's cluster.
    gone = {
        n["metadata"]["name"]
        for n in _raw(core.list_namespace(_preload_content=False))["items"]
        if (n.get("status") or {}).get("phase") == "Terminating"
    }
    pods = {
        p["metadata"]["uid"]: p
        for p in _raw(core.list_pod_for_all_namespaces(_preload_content=False))["items"]
        if (p["spec"].get("schedulerName") == contract.SCHEDULER_NAME or p["spec"].get("nodeName") in node_names)
        and p["metadata"]["namespace"] not in gone
    }
    queues = {
        q["metadata"]["name"]: q
        for q in _raw(
            custom.list_cluster_custom_object(
                contract.SCHEDULING_API_GROUP,
                contract.SCHEDULING_API_VERSION,
                contract.QUEUE_PLURAL,
                _preload_content=False,
            )
        )["items"]
    }
    podgroups = {
        (g["metadata"]["namespace"], g["metadata"]["name"]): g
        for g in _raw(
            custom.list_cluster_custom_object(
                contract.SCHEDULING_API_GROUP,
                contract.SCHEDULING_API_VERSION,
                contract.PODGROUP_PLURAL,
                _preload_content=False,
            )
        )["items"]
    }
    return ClusterView(nodes=nodes, gpunodes=gpunodes, pods=pods, queues=queues, podgroups=podgroups)


def new_cycle(
    k8s: client.ApiClient, default_queue: str = "default", slice_admission: SliceAdmission = DEFAULT_SLICE_ADMISSION
) -> SchedulingCycle:
    api = KubeApi(k8s, field_manager=contract.SCHEDULER_COMPONENT)
    return SchedulingCycle(
        api, default_queue=default_queue, binder=Binder(api, retry=NO_WAIT), slice_admission=slice_admission
    )


def podgroup_status(k8s: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    obj = client.CustomObjectsApi(k8s).get_namespaced_custom_object(
        contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION, namespace, contract.PODGROUP_PLURAL, name
    )
    status: dict[str, Any] = obj.get("status") or {}
    return status


def test_a_gang_waits_until_all_of_it_fits_then_binds_whole(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    nodes = set(cluster(2))
    q = queue(16)
    podgroup(k8s, namespace, "big", q, 24)
    for i in range(24):
        pod(k8s, namespace, f"big-{i}", group="big")
    cycle = new_cycle(k8s)

    result = cycle.run(view(k8s, nodes))
    assert result.decisions.binds == ()
    assert all(node_of(k8s, namespace, f"big-{i}") is None for i in range(24))
    status = podgroup_status(k8s, namespace, "big")
    (condition,) = status["conditions"]
    assert status["phase"] == "Pending" and condition["type"] == "Unschedulable" and condition["status"] == "True"

    # Room for the whole gang: a third node. All 24 bind in one cycle, 8 per node.
    nodes |= set(cluster(1))
    result = cycle.run(view(k8s, nodes))
    assert sum(1 for r in result.binds if r.ok) == 24
    placed = [node_of(k8s, namespace, f"big-{i}") for i in range(24)]
    assert sorted(placed.count(n) for n in nodes) == [8, 8, 8]
    assert podgroup_status(k8s, namespace, "big")["phase"] == "Running"
    # The stages the metrics show add up to the cycle.
    assert list(result.stage_seconds) == ["prepare", "engine", "execute", "bookkeeping"]
    assert sum(result.stage_seconds.values()) == pytest.approx(result.seconds)


def test_four_quarter_slices_share_one_gpu_each_with_its_assignment(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    nodes = set(cluster(1))
    q = queue(8)
    for i in range(4):
        podgroup(k8s, namespace, f"slice-{i}", q, 1)
        pod(
            k8s,
            namespace,
            f"slice-{i}",
            group=f"slice-{i}",
            gpus=0,
            annotations={contract.ANNOTATION_GPU_FRACTION: "0.25"},
            # As a webhook that sets no runtime class leaves a slice pod.
            env_from=slice_env(f"slice-{i}"),
        )
    new_cycle(k8s, slice_admission=SliceAdmission(runtime_class=None)).run(view(k8s, nodes))
    core = client.CoreV1Api(k8s)
    assigned = set()
    for i in range(4):
        stored = core.read_namespaced_pod(f"slice-{i}", namespace)
        assert stored.spec.node_name in nodes
        text = stored.metadata.annotations[contract.ANNOTATION_GPU_ASSIGNMENT]
        assigned.add(decode_assignment(text, node=stored.spec.node_name))
        assert json.loads(text)["gpus"][0]["memoryMiB"] == 81559 // 4
    assert len(assigned) == 1  # bin-packed onto one GPU


def test_a_malformed_gpu_annotation_leaves_the_pod_pending_with_an_event_saying_why(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    nodes = set(cluster(1))
    q = queue(8)
    podgroup(k8s, namespace, "bad", q, 1)
    pod(k8s, namespace, "bad-0", group="bad", gpus=0, annotations={contract.ANNOTATION_GPU_FRACTION: "1.5"})
    new_cycle(k8s).run(view(k8s, nodes))
    assert node_of(k8s, namespace, "bad-0") is None
    events = client.CoreV1Api(k8s).list_namespaced_event(namespace).items
    messages = [e.message for e in events if e.involved_object.name == "bad"]
    assert messages and "must be above 0 and at most 1" in messages[0]


def test_pods_of_a_job_get_a_pod_group_derived_from_the_job(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    nodes = set(cluster(1))
    q = queue(8)
    job = client.BatchV1Api(k8s).create_namespaced_job(
        namespace,
        client.V1Job(
            metadata=client.V1ObjectMeta(name="train", labels={contract.LABEL_QUEUE: q}),
            spec=client.V1JobSpec(
                parallelism=4,
                completions=4,
                manual_selector=True,
                selector=client.V1LabelSelector(match_labels={"job": "train"}),
                template=client.V1PodTemplateSpec(
                    metadata=client.V1ObjectMeta(labels={"job": "train"}),
                    spec=client.V1PodSpec(
                        restart_policy="Never",
                        scheduler_name=contract.SCHEDULER_NAME,
                        containers=[client.V1Container(name="main", image="registry.invalid/train:1")],
                    ),
                ),
            ),
        ),
    )
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": job.metadata.uid, "controller": True}
    # The test control plane runs no Job controller: the pods are made as it would make them.
    for i in range(4):
        pod(k8s, namespace, f"train-{i}", gpus=2, owner=owner)
    new_cycle(k8s, default_queue="nobody").run(view(k8s, nodes))
    groups = client.CustomObjectsApi(k8s).list_namespaced_custom_object(
        contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION, namespace, contract.PODGROUP_PLURAL
    )["items"]
    (group,) = groups
    assert group["spec"] == {"minMember": 4, "queue": q}
    assert group["metadata"]["ownerReferences"][0]["uid"] == job.metadata.uid
    assert all(node_of(k8s, namespace, f"train-{i}") in nodes for i in range(4))


def test_a_gpu_whose_xid_turns_fatal_loses_its_pods_and_only_that_gpu_stops_taking_work(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    (node,) = cluster(1)
    q = queue(8)
    for i in range(4):
        podgroup(k8s, namespace, f"w-{i}", q, 1)
        pod(k8s, namespace, f"w-{i}", group=f"w-{i}")
    cycle = new_cycle(k8s)
    cycle.run(view(k8s, {node}))
    core = client.CoreV1Api(k8s)
    held = {}
    for i in range(4):
        stored = core.read_namespaced_pod(f"w-{i}", namespace)
        mark_pod_running(k8s, f"w-{i}", namespace)
        (index,) = decode_assignment(stored.metadata.annotations[contract.ANNOTATION_GPU_ASSIGNMENT]) or (None,)
        held[index] = f"w-{i}"
    sick = min(held)
    # XID 48 (double-bit ECC) on one GPU: the agent recommends a GPU reset, which is per GPU.
    publish_health(k8s, node, replace(xid_fault(sick, 48), action=Action.RESET_GPU))
    for i in range(4, 8):
        podgroup(k8s, namespace, f"w-{i}", q, 1)
        pod(k8s, namespace, f"w-{i}", group=f"w-{i}")
    result = cycle.run(view(k8s, {node}))
    assert [e.eviction.pod for e in result.evictions] == [held[sick]]
    assert core.read_namespaced_pod(held[sick], namespace).metadata.deletion_timestamp is not None
    # Binds on a node that is losing a pod wait until it is gone (no double-booked room).
    assert all(node_of(k8s, namespace, f"w-{i}") is None for i in range(4, 8))
    complete_pod_deletion(k8s, held[sick], namespace)
    cycle.run(view(k8s, {node}))
    # The four new pods are placed, none of them on the sick GPU.
    for i in range(4, 8):
        stored = core.read_namespaced_pod(f"w-{i}", namespace)
        assert stored.spec.node_name == node
        assert decode_assignment(stored.metadata.annotations[contract.ANNOTATION_GPU_ASSIGNMENT]) != (sick,)


def groups_by_pod(k8s: client.ApiClient, namespace: str) -> dict[str, dict[str, Any]]:
    """Derived PodGroups of the one-pod Jobs below, by the name of the Job (and of its pod) that owns each."""
    items = client.CustomObjectsApi(k8s).list_namespaced_custom_object(
        contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION, namespace, contract.PODGROUP_PLURAL
    )["items"]
    return {g["metadata"]["ownerReferences"][0]["name"]: g for g in items if g["metadata"].get("ownerReferences")}


QUIET_S = 5.0


def job_pod(k8s: client.ApiClient, namespace: str, name: str, gpus: int) -> None:
    """A Job of one pod, both called ``name``: its group is the Job's, so it gets a PodGroup (a bare pod's
    group is lone and gets one only when it waits, see test_lone_pods_k8s)."""
    owned_pods(k8s, namespace, job(k8s, namespace, name, parallelism=1), [name], gpus=gpus)


def _deferring_cycle(
    k8s: client.ApiClient, default_queue: str, *, max_defer_s: float, quiet_s: float
) -> SchedulingCycle:
    api = KubeApi(k8s, field_manager=contract.SCHEDULER_COMPONENT)
    binder = Binder(api, retry=NO_WAIT)
    return SchedulingCycle(
        api,
        default_queue=default_queue,
        binder=binder,
        bookkeeping_max_defer_s=max_defer_s,
        bookkeeping_quiet_s=quiet_s,
    )


def test_while_cycles_bind_the_bookkeeping_of_placed_groups_waits_and_waiting_groups_are_written_at_once(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    nodes = set(cluster(1))
    # The quiet time is long enough that the second cycle surely comes within it on a busy machine.
    cycle = _deferring_cycle(k8s, queue(16), max_defer_s=30.0, quiet_s=QUIET_S)
    job_pod(k8s, namespace, "solo", gpus=1)
    job_pod(k8s, namespace, "wide", gpus=7)
    job_pod(k8s, namespace, "late", gpus=7)  # only one of the two 7-GPU pods has room: the other waits

    result = cycle.run(view(k8s, nodes))
    bound = sorted(b.pod for b in result.decisions.binds)
    assert len(bound) == 2 and "solo" in bound
    (waiting,) = {"wide", "late"} - set(bound)
    made = groups_by_pod(k8s, namespace)
    # A waiting group is news: created, with why, while the cycle bound others.
    assert list(made) == [waiting]
    assert podgroup_status(k8s, namespace, made[waiting]["metadata"]["name"])["phase"] == "Pending"

    # Right after a cycle that bound, a cycle that binds nothing is no quiet one yet ...
    assert cycle.run(view(k8s, nodes)).decisions.binds == ()
    assert sorted(groups_by_pod(k8s, namespace)) == [waiting]
    # ... once nothing was bound for bookkeeping_quiet_s, what waited is written.
    time.sleep(QUIET_S + 0.1)
    result = cycle.run(view(k8s, nodes))
    assert result.decisions.binds == ()
    made = groups_by_pod(k8s, namespace)
    assert sorted(made) == ["late", "solo", "wide"]
    for name in bound:
        assert podgroup_status(k8s, namespace, made[name]["metadata"]["name"])["phase"] == "Running"


def test_bookkeeping_waits_no_longer_than_its_limit_even_while_every_cycle_binds(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    nodes = set(cluster(1))
    cycle = _deferring_cycle(k8s, queue(8), max_defer_s=0.5, quiet_s=30.0)
    job_pod(k8s, namespace, "first", gpus=1)
    assert [b.pod for b in cycle.run(view(k8s, nodes)).decisions.binds] == ["first"]
    assert groups_by_pod(k8s, namespace) == {}
    time.sleep(0.6)
    job_pod(k8s, namespace, "second", gpus=1)
    assert [b.pod for b in cycle.run(view(k8s, nodes)).decisions.binds] == ["second"]
    made = groups_by_pod(k8s, namespace)
    assert sorted(made) == ["first", "second"]
    assert podgroup_status(k8s, namespace, made["first"]["metadata"]["name"])["phase"] == "Running"


def _queue_in_tree(k8s: client.ApiClient, name: str, gpu_quota: int, parent: str | None = None) -> None:
    spec: dict[str, Any] = {"resources": {"gpu": {"quota": gpu_quota}}}
    if parent is not None:
        spec["parentQueue"] = parent
    client.CustomObjectsApi(k8s).create_cluster_custom_object(
        contract.SCHEDULING_API_GROUP,
        contract.SCHEDULING_API_VERSION,
        contract.QUEUE_PLURAL,
        {
            "apiVersion": f"{contract.SCHEDULING_API_GROUP}/{contract.SCHEDULING_API_VERSION}",
            "kind": contract.QUEUE_KIND,
            "metadata": {"name": name},
            "spec": spec,
        },
    )


def _queue_status(k8s: client.ApiClient, name: str) -> dict[str, Any]:
    obj = client.CustomObjectsApi(k8s).get_cluster_custom_object(
        contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION, contract.QUEUE_PLURAL, name
    )
    status: dict[str, Any] = obj.get("status") or {}
    return status


def test_a_queue_whose_quota_is_over_subscribed_shows_what_is_guaranteed_and_why(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], scheduler_crds: None
) -> None:
    # dept's 8 GPUs (one 8-GPU node) hold its two teams' quotas of 6 + 6: each
    # asks for 8, each is guaranteed 4 and its Queue says so, and why.
    nodes = set(cluster(1))
    dept, team_a, team_b = unique_name("dept"), unique_name("team-a"), unique_name("team-b")
    _queue_in_tree(k8s, dept, 8)
    _queue_in_tree(k8s, team_a, 6, dept)
    _queue_in_tree(k8s, team_b, 6, dept)
    try:
        for team in (team_a, team_b):
            for i in range(8):
                pod(k8s, namespace, f"{team}-{i}", queue=team, gpus=1)
        cycle = new_cycle(k8s)
        cycle.run(view(k8s, nodes))

        for team in (team_a, team_b):
            status = _queue_status(k8s, team)
            assert status[contract.QUEUE_STATUS_GUARANTEED]["gpu"] == 4
            [note] = [c for c in status["conditions"] if c["type"] == contract.QueueConditionType.QUOTA_NOT_GUARANTEED]
            assert (note["status"], note["reason"]) == ("True", contract.QueueConditionReason.QUOTAS_EXCEED_BACKING)
            assert note["message"] == (
                "only 4 GPUs of its gpu quota of 6 GPUs is guaranteed (reclaim wins back no more): the quotas at "
                f"this queue's level add up to 12 GPUs and parent queue {dept}'s fair share is 8 GPUs"
            )
            assert note["lastTransitionTime"]
        # dept's own quota fits the pool: all of it is guaranteed, and nothing is said.
        top = _queue_status(k8s, dept)
        assert top[contract.QUEUE_STATUS_GUARANTEED]["gpu"] == 8
        [quiet] = [c for c in top["conditions"] if c["type"] == contract.QueueConditionType.QUOTA_NOT_GUARANTEED]
        assert (quiet["status"], quiet["reason"], quiet["message"]) == (
            "False",
            contract.QueueConditionReason.QUOTA_GUARANTEED,
            "",
        )
    finally:
        for name in (team_a, team_b, dept):
            delete_queue(k8s, name)


class _CollectorWatchingBinder(Binder):
    """A binder that notes, at each bind, whether Python's cyclic collector could run."""

    def __init__(self, api: KubeApi) -> None:
        super().__init__(api, retry=NO_WAIT)
        self.collector_on: list[bool] = []

    def bind_all(self, binds: Any, nodes: Any, **kwargs: Any) -> Any:
        self.collector_on.append(gc.isenabled())
        return super().bind_all(binds, nodes, **kwargs)


def test_no_collection_runs_between_a_placement_and_its_bind(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    nodes = set(cluster(1))
    api = KubeApi(k8s, field_manager=contract.SCHEDULER_COMPONENT)
    binder = _CollectorWatchingBinder(api)
    cycle = SchedulingCycle(api, default_queue=queue(8), binder=binder)
    pod(k8s, namespace, "one", gpus=1)
    assert gc.isenabled()
    assert [b.pod for b in cycle.run(view(k8s, nodes)).decisions.binds] == ["one"]
    assert binder.collector_on == [False]
    assert gc.isenabled()  # on again once the cycle ended
