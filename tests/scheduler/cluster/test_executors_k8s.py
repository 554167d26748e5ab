"""The executors against the real API server: binds, evictions, status, Events, RBAC.

Nodes here have no kubelet, so a test marks pods running and finishes
graceful deletions itself (gpuwarden.localcluster.kubelet). The Queue and PodGroup
CRDs are created minimal (any spec and status, status subresource on) unless
the real ones are installed already; they are left in place because CRD
deletion is slow and another test may apply the real ones over them.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from gpuwarden import contract
from gpuwarden.kube import ApiError, KubeApi
from scheduler.cluster.assignment import decode_assignment
from scheduler.cluster.bind import Binder, BindOutcome, BindResult, binding_body
from scheduler.cluster.cycle import SchedulingCycle
from scheduler.cluster.evict import Evictor, EvictOutcome, eviction_body
from scheduler.cluster.fence import LeaseLostError
from scheduler.cluster.inflight import BindsInFlight
from scheduler.cluster.retrying import RetryPolicy
from scheduler.cluster.status import QUEUE_AMOUNTS_INTERVAL_S, StatusWriter, event_name, now_utc
from scheduler.engine.model import (
    Bind,
    Decisions,
    Eviction,
    Gpu,
    JobStatus,
    Node,
    PendingReason,
    QueueShare,
    Resources,
)
from tests.harness import (
    ControlPlane,
    complete_pod_deletion,
    create_gpu_node,
    mark_pod_finished,
    mark_pod_running,
    simple_pod,
    unique_name,
    wait_for,
)
from tests.scheduler.cluster.kube_objects import refusing_pdb

pytestmark = pytest.mark.k8s

REPO = Path(__file__).resolve().parents[3]
SCHEDULER_RBAC = REPO / "manifests" / "scheduler" / "rbac.yaml"
NAMESPACE_MANIFEST = REPO / "manifests" / "namespace.yaml"
SCHEDULER_NAMESPACE = "gpuwarden"
SCHEDULER_SERVICE_ACCOUNT = "gpuwarden-scheduler"
GPUS = 8
GPU_MIB = 81920
NO_WAIT = RetryPolicy(attempts=3, sleep=lambda _s: None)


# -- fixtures -------------------------------------------------------------------


@pytest.fixture
def nodes(k8s: client.ApiClient) -> Iterator[Callable[[], Node]]:
    """Makes 8-GPU nodes (API and engine view alike), deleted after the test."""
    made: list[str] = []

    def make() -> Node:
        name = unique_name("sched-node")
        create_gpu_node(k8s, name, gpus=GPUS)
        made.append(name)
        return Node(
            name=name, gpus=tuple(Gpu(index=i, uuid=f"GPU-{name}-{i}", memory_mib=GPU_MIB) for i in range(GPUS))
        )

    yield make
    core = client.CoreV1Api(k8s)
    for name in made:
        with contextlib.suppress(client.ApiException):
            core.delete_node(name)


def _pod(
    k8s: client.ApiClient, namespace: str, name: str, *, labels: dict[str, str] | None = None, node: str | None = None
) -> client.V1Pod:
    body = simple_pod(name, labels=labels, node_name=node)
    body.spec.scheduler_name = contract.SCHEDULER_NAME
    return client.CoreV1Api(k8s).create_namespaced_pod(namespace, body)


def _bind(pod: client.V1Pod, node: str, *, job: str = "job", gpus: tuple[int, ...] = (), **kw: Any) -> Bind:
    ns = pod.metadata.namespace
    return Bind(
        job=f"{ns}/{job}", namespace=ns, pod=pod.metadata.name, uid=pod.metadata.uid, node=node, gpu_indices=gpus, **kw
    )


def _eviction(pod: client.V1Pod, node: str, *, job: str = "victim") -> Eviction:
    ns = pod.metadata.namespace
    return Eviction(
        job=f"{ns}/{job}",
        namespace=ns,
        pod=pod.metadata.name,
        uid=pod.metadata.uid,
        node=node,
        action=contract.EvictionAction.RECLAIM,
        reason="queue over its fair share",
    )


def _api(k8s: client.ApiClient) -> KubeApi:
    return KubeApi(k8s, field_manager=contract.SCHEDULER_COMPONENT)


# -- binds ------------------------------------------------------------------------


def test_eight_pods_bind_at_once_each_with_its_assignment(
    k8s: client.ApiClient, namespace: str, nodes: Callable[[], Node]
) -> None:
    node = nodes()
    pods = [_pod(k8s, namespace, f"worker-{i}") for i in range(GPUS)]
    binds = [_bind(p, node.name, gpus=(i,)) for i, p in enumerate(pods)]
    # One of them takes a quarter of its GPU.
    binds[7] = _bind(pods[7], node.name, gpus=(7,), gpu_memory_mib=(GPU_MIB // 4,))
    api = _api(k8s)

    results = Binder(api, workers=8, retry=NO_WAIT).bind_all(binds, {node.name: node})

    assert [r.outcome for r in results] == [BindOutcome.BOUND] * GPUS
    assert api.stats.snapshot() == ({"create_pod_binding": GPUS}, {})
    core = client.CoreV1Api(k8s)
    for i, pod in enumerate(pods):
        stored = core.read_namespaced_pod(pod.metadata.name, namespace)
        assert stored.spec.node_name == node.name
        text = stored.metadata.annotations[contract.ANNOTATION_GPU_ASSIGNMENT]
        assert decode_assignment(text, node=node.name) == (i,)
        gpu = json.loads(text)["gpus"][0]
        assert gpu["uuid"] == f"GPU-{node.name}-{i}"
        assert gpu["memoryMiB"] == (GPU_MIB // 4 if i == 7 else GPU_MIB)


def test_failed_binds_leave_their_pods_pending_and_the_others_bind(
    k8s: client.ApiClient, namespace: str, nodes: Callable[[], Node]
) -> None:
    node, other = nodes(), nodes()
    good = [_pod(k8s, namespace, f"good-{i}") for i in range(3)]
    ghost = _pod(k8s, namespace, "to-a-ghost-node")
    taken = _pod(k8s, namespace, "already-bound", node=other.name)
    replaced = _pod(k8s, namespace, "replaced")
    stale_uid = replace(_bind(replaced, node.name, gpus=(6,)), uid="not-the-pods-uid")
    binds = [
        _bind(good[0], node.name, gpus=(0,)),
        _bind(ghost, "no-such-node", gpus=(1,)),
        _bind(good[1], node.name, gpus=(2,)),
        _bind(taken, node.name, gpus=(3,)),
        Bind(job=f"{namespace}/job", namespace=namespace, pod="never-created", uid="", node=node.name),
        stale_uid,
        _bind(good[2], node.name, gpus=(4,)),
        _bind(good[0], node.name, gpus=(0,)),  # twice: the second finds it bound here already
        _bind(good[1], node.name, gpus=(9,)),  # a GPU the node does not have
    ]
    nodes_view = {node.name: node, other.name: other}

    results = Binder(_api(k8s), workers=4, retry=NO_WAIT).bind_all(binds, nodes_view)

    assert [r.outcome for r in results] == [
        BindOutcome.BOUND,
        BindOutcome.FAILED,
        BindOutcome.BOUND,
        BindOutcome.CONFLICT,
        BindOutcome.FAILED,
        BindOutcome.CONFLICT,
        BindOutcome.BOUND,
        BindOutcome.BOUND,
        BindOutcome.FAILED,
    ]
    assert "no-such-node" in (results[1].error or "")
    assert "UID" in (results[5].error or ""), results[5].error
    assert "not found" in (results[4].error or "")
    assert "GPU 9" in (results[8].error or "")
    core = client.CoreV1Api(k8s)
    for pod in (ghost, replaced):
        stored = core.read_namespaced_pod(pod.metadata.name, namespace)
        assert stored.spec.node_name is None
        assert contract.ANNOTATION_GPU_ASSIGNMENT not in (stored.metadata.annotations or {})
    stored_taken = core.read_namespaced_pod(taken.metadata.name, namespace)
    assert stored_taken.spec.node_name == other.name
    assert contract.ANNOTATION_GPU_ASSIGNMENT not in (stored_taken.metadata.annotations or {})
    for pod in good:
        assert core.read_namespaced_pod(pod.metadata.name, namespace).spec.node_name == node.name


def test_binds_sent_in_the_background_leave_at_once_and_their_answers_come_to_the_next_taker(
    k8s: client.ApiClient, namespace: str, nodes: Callable[[], Node]
) -> None:
    node, other = nodes(), nodes()
    pods = [_pod(k8s, namespace, f"sent-{i}") for i in range(3)]
    taken = _pod(k8s, namespace, "bound-elsewhere", node=other.name)
    held, release = threading.Event(), threading.Event()
    caller = threading.current_thread()
    writers: list[tuple[str, threading.Thread]] = []

    def hold_binds(operation: str) -> None:
        if operation == "create_pod_binding":
            writers.append((operation, threading.current_thread()))
            if threading.current_thread() is not caller:
                held.set()
                release.wait(60)

    api = KubeApi(k8s, field_manager=contract.SCHEDULER_COMPONENT, write_guard=hold_binds)
    binder = Binder(api, workers=4, retry=NO_WAIT)
    inflight = BindsInFlight(binder)
    binds = [_bind(p, node.name, job=f"j{i}", gpus=(i,)) for i, p in enumerate(pods)]
    binds.append(_bind(taken, node.name, job="taken", gpus=(5,)))
    ghost = Bind(job=f"{namespace}/ghost", namespace=namespace, pod="never-created", uid="", node=node.name)
    answered: list[BindResult] = []
    try:
        inflight.send([*binds, ghost], {node.name: node})
        # The first request was written by the caller, before send returned; the others by the pool.
        assert writers[0][1] is caller
        # Sent, not answered: the caller is back while the pool's requests are held.
        wait_for(held.is_set, description="a bind on its way")
        assert len(inflight) >= 4
        answered += inflight.answered()
        assert [r.bind.pod for r in answered] in ([], ["sent-0"])
        with pytest.raises(ValueError, match="pipelined"):
            binder.submit(replace(binds[0], pipelined=True), node)
        with pytest.raises(ValueError, match="pipelined"):
            binder.start(replace(binds[0], pipelined=True), node)
    finally:
        release.set()
    wait_for(lambda: len(inflight) == 0, description="every bind answered")
    assert [thread for _, thread in writers[1:]] and all(thread is not caller for _, thread in writers[1:])
    answered += inflight.answered()
    answers = {r.bind.pod: r for r in answered}
    assert {pod: r.outcome for pod, r in answers.items()} == {
        "sent-0": BindOutcome.BOUND,
        "sent-1": BindOutcome.BOUND,
        "sent-2": BindOutcome.BOUND,
        "bound-elsewhere": BindOutcome.CONFLICT,
        "never-created": BindOutcome.FAILED,
    }
    assert inflight.answered() == [], "each answer is taken once"
    core = client.CoreV1Api(k8s)
    for pod in pods:
        assert core.read_namespaced_pod(pod.metadata.name, namespace).spec.node_name == node.name
    binder.close()


def test_a_bind_sent_in_the_background_and_refused_at_the_fence_ends_the_cycle_that_takes_its_answer(
    k8s: client.ApiClient, namespace: str, nodes: Callable[[], Node]
) -> None:
    """The first bind is written from the caller's thread (refused there, at once); the others from the pool."""
    node = nodes()
    good, late, last = (
        _pod(k8s, namespace, "before-the-lease-went"),
        _pod(k8s, namespace, "after-the-lease-went"),
        _pod(k8s, namespace, "sent-after-it-went"),
    )
    writes = itertools.count()

    def fence(operation: str) -> None:
        if next(writes) >= 1:  # the lease goes after the first write
            raise LeaseLostError(operation, 3)

    binder = Binder(KubeApi(k8s, field_manager=contract.SCHEDULER_COMPONENT, write_guard=fence), retry=NO_WAIT)
    inflight = BindsInFlight(binder)
    inflight.send(
        [_bind(good, node.name, job="good", gpus=(0,)), _bind(late, node.name, job="late", gpus=(1,))],
        {node.name: node},
    )
    wait_for(lambda: len(inflight) == 0, description="the first bind answered, the second refused")
    with pytest.raises(LeaseLostError):
        inflight.answered()
    assert inflight.answered() == [], "the answers before the refusal go with it: the runner starts over"
    # A cycle's first bind is refused before it leaves, in the cycle's own thread.
    with pytest.raises(LeaseLostError):
        inflight.send([_bind(last, node.name, job="last", gpus=(2,))], {node.name: node})
    assert len(inflight) == 0 and inflight.answered() == []
    core = client.CoreV1Api(k8s)
    assert core.read_namespaced_pod(good.metadata.name, namespace).spec.node_name == node.name
    for pod in (late, last):
        assert core.read_namespaced_pod(pod.metadata.name, namespace).spec.node_name is None
    binder.close()


def test_binds_and_evictions_refused_for_their_credentials_fail_with_the_api_servers_words(
    k8s: client.ApiClient, namespace: str, nodes: Callable[[], Node]
) -> None:
    """Binds and evictions leave through the client's pool, not its generated methods: its credentials, its errors."""
    node = nodes()
    pod = _pod(k8s, namespace, "stays-pending")
    config = copy.copy(k8s.configuration)
    config.api_key = {"authorization": "not-a-token-the-api-server-knows"}
    with client.ApiClient(config) as stranger:
        api = _api(stranger)
        with pytest.raises(ApiError) as bind:
            api.create_pod_binding(namespace, "stays-pending", binding_body(_bind(pod, node.name), None))
        with pytest.raises(ApiError) as evict:
            api.create_pod_eviction(namespace, "stays-pending", eviction_body(_eviction(pod, node.name), None))
    assert (bind.value.status, evict.value.status) == (401, 401)
    assert "Unauthorized" in bind.value.detail
    assert api.stats.snapshot()[1] == {"create_pod_binding": 1, "create_pod_eviction": 1}
    assert client.CoreV1Api(k8s).read_namespaced_pod("stays-pending", namespace).spec.node_name is None
    # The same calls with the right credentials: bound, then evicted.
    _api(k8s).create_pod_binding(namespace, "stays-pending", binding_body(_bind(pod, node.name), None))
    assert client.CoreV1Api(k8s).read_namespaced_pod("stays-pending", namespace).spec.node_name == node.name
    _api(k8s).create_pod_eviction(namespace, "stays-pending", eviction_body(_eviction(pod, node.name), None))


def test_a_pipelined_bind_waits_until_the_evictions_on_its_node_finish(
    k8s: client.ApiClient, namespace: str, nodes: Callable[[], Node]
) -> None:
    node = nodes()
    victim = _pod(k8s, namespace, "victim", node=node.name)
    mark_pod_running(k8s, victim.metadata.name, namespace)
    newcomer = _pod(k8s, namespace, "newcomer")
    eviction = _eviction(victim, node.name)
    pipelined = _bind(newcomer, node.name, gpus=(0,), pipelined=True)
    api = _api(k8s)
    binder = Binder(api, retry=NO_WAIT)

    # Not evicted yet (say a budget refused): the room is not free.
    first = binder.bind_all([pipelined], {node.name: node}, evictions=[eviction])
    assert first[0].outcome is BindOutcome.DEFERRED
    assert Evictor(api, retry=NO_WAIT).evict_all([eviction])[0].outcome is EvictOutcome.EVICTED
    # Terminating, still holding its GPU until the kubelet is done.
    assert binder.bind_all([pipelined], {node.name: node})[0].outcome is BindOutcome.DEFERRED
    complete_pod_deletion(k8s, victim.metadata.name, namespace)
    wait_for(lambda: not api.list_pods_on_node(node.name), description="the victim gone")

    assert binder.bind_all([pipelined], {node.name: node}, evictions=[eviction])[0].outcome is BindOutcome.BOUND
    assert client.CoreV1Api(k8s).read_namespaced_pod("newcomer", namespace).spec.node_name == node.name


def test_pipelined_binds_ask_about_their_nodes_at_once_and_finished_pods_hold_nothing(
    k8s: client.ApiClient, namespace: str, nodes: Callable[[], Node]
) -> None:
    """One list per node of a pipelined bind, of its pods that still run: a finished pod on it holds nothing."""
    node, other = nodes(), nodes()
    victim = _pod(k8s, namespace, "victim", node=node.name)
    mark_pod_running(k8s, victim.metadata.name, namespace)
    done = _pod(k8s, namespace, "done", node=other.name)
    mark_pod_running(k8s, done.metadata.name, namespace)
    mark_pod_finished(k8s, done.metadata.name, namespace)
    eviction = _eviction(victim, node.name)
    api = _api(k8s)
    binder = Binder(api, retry=NO_WAIT)
    assert Evictor(api, retry=NO_WAIT).evict_all([eviction])[0].outcome is EvictOutcome.EVICTED
    binds = [
        _bind(_pod(k8s, namespace, "onto-the-victims-room"), node.name, gpus=(0,), pipelined=True),
        _bind(_pod(k8s, namespace, "beside-a-finished-pod"), other.name, gpus=(0,), pipelined=True),
    ]
    asked = api.stats.snapshot()[0].get("list_pods_on_node", 0)

    results = binder.bind_all(binds, {node.name: node, other.name: other}, evictions=[eviction])

    assert [r.outcome for r in results] == [BindOutcome.DEFERRED, BindOutcome.BOUND]
    assert "victim" in (results[0].error or "")
    assert api.stats.snapshot()[0].get("list_pods_on_node", 0) == asked + 2
    assert sorted(p["metadata"]["name"] for p in api.list_pods_on_node(other.name)) == ["beside-a-finished-pod", "done"]
    assert [p["metadata"]["name"] for p in api.list_pods_on_node(other.name, running_only=True)] == [
        "beside-a-finished-pod"
    ]


# -- evictions ----------------------------------------------------------------------


def test_a_disruption_budget_refuses_and_is_never_bypassed_then_the_pod_goes(
    k8s: client.ApiClient, namespace: str, nodes: Callable[[], Node]
) -> None:
    node = nodes()
    labels = {"app": "guarded"}
    pod = _pod(k8s, namespace, "guarded", labels=labels, node=node.name)
    mark_pod_running(k8s, pod.metadata.name, namespace)
    refusing_pdb(k8s, namespace, "keep-one", labels)
    policy = client.PolicyV1Api(k8s)
    api = _api(k8s)
    evictor = Evictor(api, retry=NO_WAIT)
    eviction = _eviction(pod, node.name)

    refused = evictor.evict_all([eviction])[0]
    assert refused.outcome is EvictOutcome.REFUSED
    assert refused.attempts == 1  # a budget's no is not retried at once
    assert "disruption budget" in (refused.error or "")
    core = client.CoreV1Api(k8s)
    assert core.read_namespaced_pod(pod.metadata.name, namespace).metadata.deletion_timestamp is None
    assert "delete_pod" not in api.stats.snapshot()[0]

    policy.delete_namespaced_pod_disruption_budget("keep-one", namespace)
    gone = evictor.evict_all([eviction])[0]
    assert gone.outcome is EvictOutcome.EVICTED
    assert core.read_namespaced_pod(pod.metadata.name, namespace).metadata.deletion_timestamp is not None
    complete_pod_deletion(k8s, pod.metadata.name, namespace)
    wait_for(lambda: api.get_pod(namespace, pod.metadata.name) is None, description="the pod deleted")
    assert evictor.evict_all([eviction])[0].outcome is EvictOutcome.GONE


def test_a_new_pod_under_an_evicted_pods_name_is_left_alone(
    k8s: client.ApiClient, namespace: str, nodes: Callable[[], Node]
) -> None:
    node = nodes()
    pod = _pod(k8s, namespace, "reused-name", node=node.name)
    mark_pod_running(k8s, pod.metadata.name, namespace)
    stale = replace(_eviction(pod, node.name), uid="old")

    result = Evictor(_api(k8s), retry=NO_WAIT).evict_all([stale])[0]

    assert (result.outcome, result.attempts) == (EvictOutcome.FAILED, 1)
    assert "HTTP 409" in (result.error or ""), result.error
    assert "UID" in (result.error or ""), result.error
    assert client.CoreV1Api(k8s).read_namespaced_pod("reused-name", namespace).metadata.deletion_timestamp is None


def test_gangs_are_evicted_together_within_the_rate(
    k8s: client.ApiClient, namespace: str, nodes: Callable[[], Node]
) -> None:
    node = nodes()
    pods = [_pod(k8s, namespace, f"member-{i}", node=node.name) for i in range(4)]
    for p in pods:
        mark_pod_running(k8s, p.metadata.name, namespace)
    evictions = [_eviction(p, node.name, job=f"gang-{i % 2}") for i, p in enumerate(pods)]

    results = Evictor(_api(k8s), evictions_per_s=50, burst=2, retry=NO_WAIT).evict_all(evictions)

    assert [r.outcome for r in results] == [EvictOutcome.EVICTED] * 4
    core = client.CoreV1Api(k8s)
    assert all(core.read_namespaced_pod(p.metadata.name, namespace).metadata.deletion_timestamp for p in pods)


# -- status and Events ----------------------------------------------------------------


def _create_queue(k8s: client.ApiClient, name: str) -> None:
    client.CustomObjectsApi(k8s).create_cluster_custom_object(
        contract.SCHEDULING_API_GROUP,
        contract.SCHEDULING_API_VERSION,
        contract.QUEUE_PLURAL,
        {
            "apiVersion": f"{contract.SCHEDULING_API_GROUP}/{contract.SCHEDULING_API_VERSION}",
            "kind": contract.QUEUE_KIND,
            "metadata": {"name": name},
            "spec": {},
        },
    )


def _delete_queue(k8s: client.ApiClient, name: str) -> None:
    with contextlib.suppress(client.ApiException):
        client.CustomObjectsApi(k8s).delete_cluster_custom_object(
            contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION, contract.QUEUE_PLURAL, name
        )


def _create_pod_group(k8s: client.ApiClient, namespace: str, name: str, queue: str) -> dict[str, Any]:
    created: dict[str, Any] = client.CustomObjectsApi(k8s).create_namespaced_custom_object(
        contract.SCHEDULING_API_GROUP,
        contract.SCHEDULING_API_VERSION,
        namespace,
        contract.PODGROUP_PLURAL,
        {
            "apiVersion": f"{contract.SCHEDULING_API_GROUP}/{contract.SCHEDULING_API_VERSION}",
            "kind": contract.PODGROUP_KIND,
            "metadata": {"name": name},
            "spec": {"minMember": 2, "queue": queue},
        },
    )
    return created


def _status(k8s: client.ApiClient, plural: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    custom = client.CustomObjectsApi(k8s)
    g, v = contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION
    obj = (
        custom.get_namespaced_custom_object(g, v, namespace, plural, name)
        if namespace
        else custom.get_cluster_custom_object(g, v, plural, name)
    )
    status: dict[str, Any] = obj.get("status") or {}
    return status


def _pending(group: str, queue: str, *reasons: tuple[contract.UnschedulableReason, str]) -> JobStatus:
    return JobStatus(job=group, queue=queue, reasons=tuple(PendingReason(c, m) for c, m in reasons))


def _share(queue: str, gpu: int) -> QueueShare:
    return QueueShare(
        queue=queue,
        pool=contract.DEFAULT_NODE_POOL,
        fair_share=Resources(gpu=gpu, cpu=8000, memory=65536),
        allocated=Resources(gpu=1500, cpu=4000, memory=1536),
        request=Resources(gpu=4000, cpu=16000, memory=131072),
        guaranteed=Resources(gpu=min(gpu, 2500), cpu=8000, memory=65536),
    )


def _events(k8s: client.ApiClient, namespace: str, name: str) -> list[client.CoreV1Event]:
    found: list[client.CoreV1Event] = (
        client.CoreV1Api(k8s)
        .list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name},involvedObject.kind={contract.PODGROUP_KIND}"
        )
        .items
    )
    return found


def test_status_lands_once_per_change_and_pending_events_once_per_explanation(
    k8s: client.ApiClient, namespace: str, scheduler_crds: None
) -> None:
    queue = unique_name("team-a")
    _create_queue(k8s, queue)
    try:
        group = _create_pod_group(k8s, namespace, "train", queue)
        key = f"{namespace}/train"
        no_room = _pending(key, queue, (contract.UnschedulableReason.INSUFFICIENT_RESOURCES, "needs 4 GPUs, 2 free"))
        decisions = Decisions(pending=(no_room,), queue_shares=(_share(queue, 2000),))
        api = _api(k8s)
        t = [now_utc()]
        writer = StatusWriter(api, instance="test-scheduler", clock=lambda: t[0])

        first = writer.write(decisions)

        assert (first.pod_groups_patched, first.queues_patched, first.events_written) == (1, 1, 1)
        assert first.errors == []
        queue_now = _status(k8s, contract.QUEUE_PLURAL, queue)
        assert {k: v for k, v in queue_now.items() if k != "conditions"} == {
            "fairShare": {"gpu": 2, "cpu": "8", "memory": "64Gi"},
            "guaranteed": {"gpu": 2, "cpu": "8", "memory": "64Gi"},
            "allocated": {"gpu": 1.5, "cpu": "4", "memory": "1536Mi"},
            "allocatedNonPreemptible": {"gpu": 0, "cpu": "0", "memory": "0Mi"},
            "requested": {"gpu": 4, "cpu": "16", "memory": "128Gi"},
        }
        [backed, guaranteed, valid] = queue_now["conditions"]
        assert (backed["type"], backed["status"]) == ("QuotaNotBacked", "False")
        assert (guaranteed["type"], guaranteed["status"]) == ("QuotaNotGuaranteed", "False")
        assert (valid["type"], valid["status"], valid["reason"]) == ("Invalid", "False", "Valid")
        status = _status(k8s, contract.PODGROUP_PLURAL, "train", namespace)
        assert status["phase"] == "Pending"
        [condition] = status["conditions"]
        assert (condition["type"], condition["status"], condition["reason"]) == (
            "Unschedulable",
            "True",
            "InsufficientResources",
        )
        assert "needs 4 GPUs, 2 free" in condition["message"]
        transition = condition["lastTransitionTime"]
        [event] = _events(k8s, namespace, "train")
        assert (event.type, event.reason, event.count) == ("Warning", "InsufficientResources", 1)
        assert event.involved_object.uid == group["metadata"]["uid"]
        assert event.metadata.name == event_name(key)
        assert event.source.component == contract.SCHEDULER_COMPONENT

        # Unchanged cycles send nothing at all.
        sent = api.stats.total_requests()
        for _ in range(5):
            again = writer.write(decisions)
            assert (again.pod_groups_patched, again.queues_patched, again.events_written) == (0, 0, 0)
            assert again.unchanged == 2
        assert api.stats.total_requests() == sent

        # A new explanation: one status patch, the same Event continued.
        gang = _pending(
            key,
            queue,
            (contract.UnschedulableReason.GANG_INCOMPLETE, "1 of 2 pods fit"),
            (contract.UnschedulableReason.NO_ELIGIBLE_NODES, "node pool empty"),
        )
        changed = writer.write(Decisions(pending=(gang,), queue_shares=(_share(queue, 2000),)))
        assert (changed.pod_groups_patched, changed.queues_patched, changed.events_written) == (1, 0, 1)
        assert api.stats.total_requests() == sent + 2
        [condition] = _status(k8s, contract.PODGROUP_PLURAL, "train", namespace)["conditions"]
        assert condition["reason"] == "MultipleReasons"
        assert condition["lastTransitionTime"] == transition  # still True: no transition
        [event] = _events(k8s, namespace, "train")
        assert (event.reason, event.count) == ("MultipleReasons", 2)
        assert "GangIncomplete: 1 of 2 pods fit" in event.message

        # Placed: the condition turns False, no Event, and the queue's figures
        # move (amounts alone go out once QUEUE_AMOUNTS_INTERVAL_S passed).
        t[0] += timedelta(seconds=QUEUE_AMOUNTS_INTERVAL_S)
        placed = Bind(job=key, namespace=namespace, pod="train-0", uid="", node="n")
        done = writer.write(Decisions(binds=(placed,), queue_shares=(_share(queue, 3000),)))
        assert (done.pod_groups_patched, done.queues_patched, done.events_written) == (1, 1, 0)
        status = _status(k8s, contract.PODGROUP_PLURAL, "train", namespace)
        assert status["phase"] == "Running"
        assert status["conditions"][0]["status"] == "False"
        assert _status(k8s, contract.QUEUE_PLURAL, queue)["fairShare"]["gpu"] == 3
        assert len(_events(k8s, namespace, "train")) == 1
    finally:
        _delete_queue(k8s, queue)


def test_a_queue_short_of_backed_quota_shows_it_and_the_crd_accepts_it(
    k8s: client.ApiClient, scheduler_crds: None
) -> None:
    queue = unique_name("team-short")
    _create_queue(k8s, queue)
    try:
        g = 1000
        short = QueueShare(
            queue=queue,
            pool=contract.DEFAULT_NODE_POOL,
            fair_share=Resources(gpu=6 * g),
            allocated=Resources(gpu=3 * g, cpu=2000, memory=2048),
            request=Resources(gpu=8 * g),
            allocated_non_preemptible=Resources(gpu=2 * g, cpu=1000, memory=1024),
            quota_shortfall=Resources(gpu=2 * g),
            quota=Resources(gpu=8 * g),
            backing=Resources(gpu=40 * g),
            level_quota=Resources(gpu=48 * g),
        )
        writer = StatusWriter(_api(k8s), instance="test-scheduler")
        report = writer.write(Decisions(queue_shares=(short,)))
        assert report.errors == [] and report.queues_patched == 1

        status = _status(k8s, contract.QUEUE_PLURAL, queue)
        assert status["allocatedNonPreemptible"] == {"gpu": 2, "cpu": "1", "memory": "1Gi"}
        [condition, _guaranteed, _valid] = status["conditions"]
        assert (condition["type"], condition["status"], condition["reason"]) == (
            contract.QueueConditionType.QUOTA_NOT_BACKED.value,
            "True",
            "HealthyCapacityBelowQuotas",
        )
        assert condition["message"] == (
            "2 of 8 GPUs of this queue's quota are not backed: "
            "the pool's healthy capacity (40 GPUs) is below the sum of quotas (48 GPUs)"
        )
        assert condition["lastTransitionTime"]
    finally:
        _delete_queue(k8s, queue)


def test_status_of_objects_that_do_not_exist_is_reported_missing(
    k8s: client.ApiClient, namespace: str, scheduler_crds: None
) -> None:
    ghost_queue = unique_name("no-such-queue")
    decisions = Decisions(
        pending=(_pending(f"{namespace}/no-group", ghost_queue),),
        queue_shares=(_share(ghost_queue, 1000),),
    )
    api = _api(k8s)
    report = StatusWriter(api).write(decisions)
    assert sorted(report.missing) == sorted([f"{namespace}/no-group", f"queue {ghost_queue}"])
    assert report.errors == []
    # A PodGroup gone with its workload is an answer, not an API failure: the error count leaves it out.
    requests, errors = api.stats.snapshot()
    assert requests.get("patch_podgroup_status") == 1 and "patch_podgroup_status" not in errors


# -- RBAC ---------------------------------------------------------------------------


def test_rbac_grants_what_the_executors_use_and_nothing_on_secrets() -> None:
    docs = [d for d in yaml.safe_load_all(SCHEDULER_RBAC.read_text()) if d]
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    granted = {
        (g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
    # The deletes: pods, for remediation's delete-after-timeout drain policy, the
    # DeviceTaintRules of GPUs that returned, and the claims it made for pods'
    # nvidia.com/gpu served through DRA (the admission policies: only its own).
    assert {(g, r) for g, r, v in granted if v == "delete"} == {
        ("", "pods"),
        ("resource.k8s.io", "devicetaintrules"),
        ("resource.k8s.io", "resourceclaims"),
    }
    # Remediation writes Nodes and GPUNodes, never their status (health is the agent's).
    assert {("", "nodes", "patch"), ("gpuwarden.io", "gpunodes", "patch")} <= granted
    assert not {("", "nodes/status"), ("gpuwarden.io", "gpunodes/status")} & {(g, r) for g, r, _ in granted}
    assert not any(r == "secrets" for _, r, _ in granted)
    # ConfigMaps are written (a slice pod's, before its bind), never read.
    assert {v for _, r, v in granted if r == "configmaps"} == {"create", "patch"}
    assert {("", "pods/binding", "create"), ("", "pods/eviction", "create")} <= granted
    assert ("", "pods", "patch") not in granted  # the GPU assignment travels in the Binding
    leases = next(d for d in docs if d["kind"] == "Role")
    assert leases["metadata"]["namespace"] == SCHEDULER_NAMESPACE
    assert leases["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}
    ]


def _refused(call: Callable[[], object]) -> int | None:
    try:
        call()
    except client.ApiException as exc:
        status: int | None = exc.status
        return status
    return None


@pytest.mark.usefixtures("scheduler_crds", "scheduler_rbac")
def test_the_executors_work_as_the_schedulers_service_account_and_it_reads_no_secret(
    control_plane: ControlPlane, k8s: client.ApiClient, namespace: str, nodes: Callable[[], Node]
) -> None:
    node = nodes()
    to_bind = _pod(k8s, namespace, "to-bind")
    victim = _pod(k8s, namespace, "victim", node=node.name)
    mark_pod_running(k8s, victim.metadata.name, namespace)
    queue = unique_name("sa-queue")
    _create_queue(k8s, queue)
    _create_pod_group(k8s, namespace, "sa-group", queue)
    core_admin = client.CoreV1Api(k8s)
    core_admin.create_namespaced_secret(
        namespace, client.V1Secret(metadata=client.V1ObjectMeta(name="token"), string_data={"k": "v"})
    )
    try:
        with control_plane.impersonate(SCHEDULER_SERVICE_ACCOUNT, SCHEDULER_NAMESPACE) as sa:
            api = _api(sa)
            bound = Binder(api, retry=NO_WAIT).bind_all([_bind(to_bind, node.name, gpus=(1,))], {node.name: node})
            evicted = Evictor(api, retry=NO_WAIT).evict_all([_eviction(victim, node.name)])
            pending = _pending(
                f"{namespace}/sa-group", queue, (contract.UnschedulableReason.OVER_LIMIT, "queue at its limit")
            )
            report = StatusWriter(api).write(Decisions(pending=(pending,), queue_shares=(_share(queue, 1000),)))
            pipelined = _bind(to_bind, node.name, pipelined=True)
            Binder(api, retry=NO_WAIT).bind_all([pipelined], {node.name: node})  # lists the node's pods

            assert [r.outcome for r in bound] == [BindOutcome.BOUND]
            assert [r.outcome for r in evicted] == [EvictOutcome.EVICTED]
            assert (report.pod_groups_patched, report.queues_patched, report.events_written) == (1, 1, 1)
            assert report.errors == []
            assert api.stats.snapshot()[1] == {}, "a request of the scheduler was refused"

            core = client.CoreV1Api(sa)
            coordination = client.CoordinationV1Api(sa)
            lease = client.V1Lease(metadata=client.V1ObjectMeta(name=unique_name("lease")), spec=client.V1LeaseSpec())
            coordination.create_namespaced_lease(SCHEDULER_NAMESPACE, lease)
            refused = {
                "read a secret": _refused(lambda: core.read_namespaced_secret("token", namespace)),
                "list secrets": _refused(core.list_secret_for_all_namespaces),
                "create a pod": _refused(lambda: core.create_namespaced_pod(namespace, simple_pod("spawned"))),
                # Remediation may cordon a Node; its health (status) is the agent's alone.
                "patch node status": _refused(
                    lambda: core.patch_node_status(node.name, {"status": {"conditions": []}})
                ),
                "a lease elsewhere": _refused(lambda: coordination.create_namespaced_lease(namespace, lease)),
                "read an Event": _refused(lambda: core.list_namespaced_event(namespace)),
            }
            assert refused == dict.fromkeys(refused, 403)
    finally:
        _delete_queue(k8s, queue)


@pytest.mark.parametrize("in_background", [False, True], ids=["waited-for", "sent"])
def test_a_bind_onto_free_room_goes_out_beside_the_cycles_evictions(
    k8s: client.ApiClient, namespace: str, nodes: Callable[[], Node], in_background: bool
) -> None:
    """The cycle's binds that wait for no victim do not wait behind its evictions either.

    With binds in the background the bind onto free room is sent before the evictions and not waited for.
    """
    node = nodes()
    victim = _pod(k8s, namespace, "victim", node=node.name)
    mark_pod_running(k8s, victim.metadata.name, namespace)
    quick = _pod(k8s, namespace, "quick")
    later = _pod(k8s, namespace, "later")
    evicting, release = threading.Event(), threading.Event()

    def hold_evictions(operation: str) -> None:
        if operation == "create_pod_eviction":
            evicting.set()
            release.wait(60)

    api = _api(k8s)
    held = KubeApi(k8s, field_manager=contract.SCHEDULER_COMPONENT, write_guard=hold_evictions)
    cycle = SchedulingCycle(
        api,
        binder=Binder(api, retry=NO_WAIT),
        evictor=Evictor(held, retry=NO_WAIT),
        binds_in_background=in_background,
    )
    free = _bind(quick, node.name, job="quick", gpus=(1,))
    piped = _bind(later, node.name, job="later", gpus=(0,), pipelined=True)
    decisions = Decisions(binds=(piped, free), evictions=(_eviction(victim, node.name),))
    done: list[Any] = []
    runner = threading.Thread(target=lambda: done.append(cycle._execute(decisions, {node.name: node})))
    runner.start()
    try:
        wait_for(evicting.is_set, description="the eviction on its way")
        wait_for(
            lambda: client.CoreV1Api(k8s).read_namespaced_pod("quick", namespace).spec.node_name == node.name,
            description="the bind onto free room, while the eviction is held",
        )
        assert client.CoreV1Api(k8s).read_namespaced_pod("later", namespace).spec.node_name is None
    finally:
        release.set()
        runner.join(60)
        cycle.close()
    [executed] = done
    attempted, bound = executed.attempted, executed.bound
    assert [r.outcome for r in attempted] == [EvictOutcome.EVICTED]
    if in_background:
        assert executed.sent == (free,)  # answered to a later cycle
        [answer] = executed.sending
        assert answer.result(30).outcome is BindOutcome.BOUND
        # The pipelined bind waited for the eviction, and the victim is still terminating.
        assert [(r.bind.pod, r.outcome) for r in bound] == [("later", BindOutcome.DEFERRED)]
        return
    assert executed.sent == ()  # this cycle waits for every bind's answer
    # In the decisions' order; the pipelined bind waited for the eviction, and the victim is still terminating.
    assert [r.bind.pod for r in bound] == ["later", "quick"]
    assert [r.outcome for r in bound] == [BindOutcome.DEFERRED, BindOutcome.BOUND]
