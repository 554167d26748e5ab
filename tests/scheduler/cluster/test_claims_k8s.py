"""Pods with DRA ResourceClaims, placed and allocated by whole cycles against the real API server.

The node is a DRA node as the GPU Operator's DRA mode leaves it: no device
plugin (``nvidia.com/gpu`` 0), no GPUNode, only NVIDIA's DRA driver's
ResourceSlice (``dra_objects``) and its DeviceClasses. Claims come from
ResourceClaimTemplates through kube-controller-manager's own resourceclaim
controller, as in a cluster; the cycle runs as the scheduler's
ServiceAccount under the shipped RBAC, so the allocation it writes passes
the API server's checks of ``resourceclaims/status`` and
``resourceclaims/binding``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from gpuwarden import contract
from gpuwarden.kube import ApiError, KubeApi
from scheduler.cluster.bind import Binder
from scheduler.cluster.claims import FINALIZER
from scheduler.cluster.cycle import ClusterView, SchedulingCycle
from scheduler.runner import SchedulerRunner
from tests.harness import ControlPlane, unique_name
from tests.scheduler.cluster.dra_fixtures import DRA, FOUR
from tests.scheduler.cluster.fencing import PausedAfterCheck, wait_for_fence_policy
from tests.scheduler.cluster.kube_objects import create_queue, delete_queue, podgroup
from tests.scheduler.cluster.test_cycle_k8s import NO_WAIT, podgroup_status, view
from tests.scheduler.remediation.dra_objects import DRIVER
from tests.waiting import wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.usefixtures("scheduler_rbac", "scheduler_crds", "gpunode_crd")]

SA, SA_NAMESPACE = "gpuwarden-scheduler", "gpuwarden"
JSON = dict[str, Any]


def _raw(response: Any) -> Any:
    return json.loads(response.data)


@pytest.fixture(autouse=True)
def _claims_released(claims_released: None) -> None:
    """After each test, its claims' finalizers go (:func:`~tests.scheduler.cluster.dra_fixtures.claims_released`)."""


@pytest.fixture
def scheduler(control_plane: ControlPlane) -> Iterator[SchedulingCycle]:
    """A scheduling cycle that writes as the scheduler's ServiceAccount."""
    with control_plane.impersonate(SA, SA_NAMESPACE) as api:
        kube = KubeApi(api, field_manager=contract.SCHEDULER_COMPONENT)
        yield SchedulingCycle(kube, binder=Binder(kube, retry=NO_WAIT))


def dra_view(k8s: client.ApiClient, nodes: set[str]) -> ClusterView:
    custom = client.CustomObjectsApi(k8s)

    def listed(plural: str, namespaced: bool = False) -> dict[str, JSON]:
        if namespaced:
            items = _raw(custom.list_custom_object_for_all_namespaces(*DRA, plural, _preload_content=False))["items"]
            return {f"{o['metadata']['namespace']}/{o['metadata']['name']}": o for o in items}
        items = _raw(custom.list_cluster_custom_object(*DRA, plural, _preload_content=False))["items"]
        return {o["metadata"]["name"]: o for o in items}

    base = view(k8s, nodes)
    slices = {k: s for k, s in listed("resourceslices").items() if s["spec"].get("nodeName") in nodes}
    return ClusterView(
        nodes=base.nodes,
        gpunodes=base.gpunodes,
        pods=base.pods,
        queues=base.queues,
        podgroups=base.podgroups,
        resource_slices=slices,
        device_taint_rules=listed("devicetaintrules"),
        resource_claims=listed("resourceclaims", namespaced=True),
        device_classes=listed("deviceclasses"),
    )


def _template(
    k8s: client.ApiClient,
    namespace: str,
    count: int = 1,
    selector: str | None = None,
    requests: list[JSON] | None = None,
) -> str:
    """A claim template: one request ``gpu`` of ``count`` GPUs (with ``selector``), or ``requests`` as given."""
    name = unique_name("gpus")
    exactly: JSON = {"deviceClassName": "gpu.nvidia.com", "count": count}
    if selector is not None:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    requests = requests if requests is not None else [{"name": "gpu", "exactly": exactly}]
    client.CustomObjectsApi(k8s).create_namespaced_custom_object(
        *DRA,
        namespace,
        "resourceclaimtemplates",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": requests}}},
        },
    )
    return name


def _claim_pod(k8s: client.ApiClient, namespace: str, name: str, group: str, template: str) -> None:
    """A pod as a workload controller writes one that uses a claim template (its container names the claim)."""
    client.CoreV1Api(k8s).create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name, "annotations": {contract.ANNOTATION_POD_GROUP: group}},
            "spec": {
                "schedulerName": contract.SCHEDULER_NAME,
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.invalid/train:1",
                        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "claims": [{"name": "gpu"}]},
                    }
                ],
            },
        },
    )


def _claims_made(k8s: client.ApiClient, namespace: str, pods: list[str]) -> None:
    core = client.CoreV1Api(k8s)

    def made() -> bool:
        for name in pods:
            status = _raw(core.read_namespaced_pod(name, namespace, _preload_content=False)).get("status") or {}
            if not status.get("resourceClaimStatuses"):
                return False
        return True

    wait_for(made, timeout=30, description="the resourceclaim controller made the pods' claims")


def _alone(k8s: client.ApiClient, namespace: str, queue: str, name: str, template: str, *, made: bool = True) -> None:
    """A claim pod in a PodGroup of its own; with ``made``, once the resourceclaim controller made its claim."""
    podgroup(k8s, namespace, name, queue, 1)
    _claim_pod(k8s, namespace, name, name, template)
    if made:
        _claims_made(k8s, namespace, [name])


def _pod(k8s: client.ApiClient, namespace: str, name: str) -> JSON:
    return dict(_raw(client.CoreV1Api(k8s).read_namespaced_pod(name, namespace, _preload_content=False)))


def _claim_of(k8s: client.ApiClient, namespace: str, pod: str) -> JSON:
    (status,) = _pod(k8s, namespace, pod)["status"]["resourceClaimStatuses"]
    return dict(
        client.CustomObjectsApi(k8s).get_namespaced_custom_object(
            *DRA, namespace, "resourceclaims", status["resourceClaimName"]
        )
    )


def _condition(k8s: client.ApiClient, namespace: str, group: str) -> tuple[str, str]:
    (condition,) = podgroup_status(k8s, namespace, group)["conditions"]
    return condition["reason"], condition["message"]


@pytest.mark.usefixtures("claim_controller")
def test_claims_from_templates_are_allocated_reserved_and_bound(
    k8s: client.ApiClient,
    namespace: str,
    queue: Callable[..., str],
    dra_nodes: Callable[..., str],
    scheduler: SchedulingCycle,
) -> None:
    node = dra_nodes()
    q = queue(16)
    template = _template(k8s, namespace, count=2)
    pods = ["a", "b"]
    for name in pods:
        _alone(k8s, namespace, q, name, template, made=False)
    _claims_made(k8s, namespace, pods)

    scheduler.run(dra_view(k8s, {node}))

    taken: list[str] = []
    for name in pods:
        pod = _pod(k8s, namespace, name)
        assert pod["spec"].get("nodeName") == node, name
        claim = _claim_of(k8s, namespace, name)
        assert FINALIZER in claim["metadata"]["finalizers"]
        status = claim["status"]
        assert status["reservedFor"] == [{"resource": "pods", "name": name, "uid": pod["metadata"]["uid"]}]
        results = status["allocation"]["devices"]["results"]
        assert {(r["request"], r["driver"], r["pool"]) for r in results} == {("gpu", DRIVER, node)}
        assert len(results) == 2
        taken += [r["device"] for r in results]
        (term,) = status["allocation"]["nodeSelector"]["nodeSelectorTerms"]
        assert term["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": [node]}]
    # Four GPUs, four distinct devices.
    assert sorted(taken) == [f"gpu-{i}" for i in range(4)]

    # The node is full: a third pod waits, and its claim stays unallocated.
    _alone(k8s, namespace, q, "c", template)
    scheduler.run(dra_view(k8s, {node}))
    assert _pod(k8s, namespace, "c")["spec"].get("nodeName") is None
    assert not (_claim_of(k8s, namespace, "c").get("status") or {}).get("allocation")


@pytest.mark.usefixtures("claim_controller")
def test_mig_claims_get_instances_and_count_for_their_share_of_the_queue_s_gpus(
    k8s: client.ApiClient,
    namespace: str,
    queue: Callable[..., str],
    dra_nodes: Callable[..., str],
    scheduler: SchedulingCycle,
) -> None:
    """Static MIG as the driver publishes it: a 1-GPU queue runs four instances' pods, then no whole GPU more."""
    node = dra_nodes(mig={0: [("1g.5gb", 0), ("1g.5gb", 1), ("1g.5gb", 2), ("3g.20gb", 4)]})
    q = queue(1, limit=1)
    profile = "device.attributes['gpu.nvidia.com'].profile == '{}'"
    small = _template(
        k8s,
        namespace,
        requests=[
            {
                "name": "gpu",
                "exactly": {
                    "deviceClassName": "mig.nvidia.com",
                    "selectors": [{"cel": {"expression": profile.format("1g.5gb")}}],
                },
            }
        ],
    )
    large = _template(
        k8s,
        namespace,
        selector=None,
        requests=[
            {
                "name": "gpu",
                "exactly": {
                    "deviceClassName": "mig.nvidia.com",
                    "selectors": [{"cel": {"expression": profile.format("3g.20gb")}}],
                },
            }
        ],
    )
    pods = {"s0": small, "s1": small, "s2": small, "l0": large}
    for name, template in pods.items():
        _alone(k8s, namespace, q, name, template, made=False)
    _claims_made(k8s, namespace, list(pods))

    scheduler.run(dra_view(k8s, {node}))

    given: dict[str, str] = {}
    for name in pods:
        assert _pod(k8s, namespace, name)["spec"].get("nodeName") == node, name
        (result,) = _claim_of(k8s, namespace, name)["status"]["allocation"]["devices"]["results"]
        given[name] = result["device"]
    assert sorted(given[n] for n in ("s0", "s1", "s2")) == [f"gpu-0-mig-1g5gb-19-{i}" for i in range(3)]
    assert given["l0"] == "gpu-0-mig-3g20gb-9-4"

    # 3 x 1/7 + 3/7 of a GPU are held: a whole GPU more is past the queue's limit, though three are free.
    _alone(k8s, namespace, q, "whole", _template(k8s, namespace))
    scheduler.run(dra_view(k8s, {node}))
    assert _pod(k8s, namespace, "whole")["spec"].get("nodeName") is None
    reason, message = _condition(k8s, namespace, "whole")
    assert "limit" in message.lower(), (reason, message)


def test_a_pod_waits_for_its_claim_to_be_made_and_says_so(
    k8s: client.ApiClient,
    namespace: str,
    queue: Callable[..., str],
    dra_nodes: Callable[..., str],
    scheduler: SchedulingCycle,
) -> None:
    node = dra_nodes()
    q = queue(16)
    template = _template(k8s, namespace)
    _alone(k8s, namespace, q, "early", template, made=False)
    scheduler.run(dra_view(k8s, {node}))
    assert _pod(k8s, namespace, "early")["spec"].get("nodeName") is None
    reason, message = _condition(k8s, namespace, "early")
    assert reason == contract.UnschedulableReason.UNSUPPORTED_PLACEMENT.value
    assert "resourceclaim controller" in message, message


@pytest.mark.usefixtures("claim_controller")
def test_a_gang_of_claim_pods_is_allocated_whole_or_not_at_all(
    k8s: client.ApiClient,
    namespace: str,
    queue: Callable[..., str],
    dra_nodes: Callable[..., str],
    scheduler: SchedulingCycle,
) -> None:
    first = dra_nodes()
    q = queue(16)
    template = _template(k8s, namespace, count=2)
    pods = [f"g-{i}" for i in range(3)]
    podgroup(k8s, namespace, "g", q, 3)
    for name in pods:
        _claim_pod(k8s, namespace, name, "g", template)
    _claims_made(k8s, namespace, pods)

    # Six GPUs wanted, four there: nothing is allocated, nothing bound.
    scheduler.run(dra_view(k8s, {first}))
    for name in pods:
        assert _pod(k8s, namespace, name)["spec"].get("nodeName") is None
        claim = _claim_of(k8s, namespace, name)
        assert not (claim.get("status") or {}).get("allocation")
        assert FINALIZER not in (claim["metadata"].get("finalizers") or [])

    second = dra_nodes()
    scheduler.run(dra_view(k8s, {first, second}))
    nodes = [_pod(k8s, namespace, name)["spec"].get("nodeName") for name in pods]
    assert set(nodes) <= {first, second} and None not in nodes
    for name, node in zip(pods, nodes, strict=True):
        results = _claim_of(k8s, namespace, name)["status"]["allocation"]["devices"]["results"]
        assert {r["pool"] for r in results} == {node}


@pytest.mark.usefixtures("claim_controller")
def test_the_driver_s_xid_taint_keeps_claims_off_that_device_only(
    k8s: client.ApiClient,
    namespace: str,
    queue: Callable[..., str],
    dra_nodes: Callable[..., str],
    scheduler: SchedulingCycle,
) -> None:
    xid = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
    node = dra_nodes(taints={0: xid})
    q = queue(16)
    template = _template(k8s, namespace, count=3)
    _alone(k8s, namespace, q, "t", template)
    scheduler.run(dra_view(k8s, {node}))
    assert _pod(k8s, namespace, "t")["spec"].get("nodeName") == node
    results = _claim_of(k8s, namespace, "t")["status"]["allocation"]["devices"]["results"]
    assert sorted(r["device"] for r in results) == ["gpu-1", "gpu-2", "gpu-3"]


@pytest.mark.usefixtures("claim_controller")
def test_a_selector_that_fails_is_explained_on_the_podgroup_and_allocates_nothing(
    k8s: client.ApiClient,
    namespace: str,
    queue: Callable[..., str],
    dra_nodes: Callable[..., str],
    scheduler: SchedulingCycle,
) -> None:
    node = dra_nodes()
    q = queue(16)
    # Valid CEL, but the driver publishes no such attribute: an error, never "does not match".
    template = _template(k8s, namespace, selector='device.attributes["gpu.nvidia.com"].memorySize > 10')
    _alone(k8s, namespace, q, "bad", template)
    scheduler.run(dra_view(k8s, {node}))
    assert _pod(k8s, namespace, "bad")["spec"].get("nodeName") is None
    assert not (_claim_of(k8s, namespace, "bad").get("status") or {}).get("allocation")
    reason, message = _condition(k8s, namespace, "bad")
    assert reason == contract.UnschedulableReason.UNSUPPORTED_PLACEMENT.value
    assert "memorySize" in message and "no such key" in message, message


@pytest.mark.usefixtures("claim_controller")
def test_each_request_of_a_claim_gets_the_devices_its_own_selectors_allow(
    k8s: client.ApiClient,
    namespace: str,
    queue: Callable[..., str],
    dra_nodes: Callable[..., str],
    scheduler: SchedulingCycle,
) -> None:
    """One request for one named GPU, one for any two: the named one goes to its request, whatever the order."""
    node = dra_nodes()
    q = queue(16)
    exactly: JSON = {"deviceClassName": "gpu.nvidia.com"}
    wanted = FOUR[0].uuid  # the GPU the engine would otherwise give the first request it meets
    selector = {"cel": {"expression": f'device.attributes["gpu.nvidia.com"].uuid == "{wanted}"'}}
    name = _template(
        k8s,
        namespace,
        requests=[
            {"name": "any", "exactly": {**exactly, "count": 2}},
            {"name": "named", "exactly": {**exactly, "selectors": [selector]}},
        ],
    )
    _alone(k8s, namespace, q, "p", name)
    scheduler.run(dra_view(k8s, {node}))
    assert _pod(k8s, namespace, "p")["spec"].get("nodeName") == node
    results = _claim_of(k8s, namespace, "p")["status"]["allocation"]["devices"]["results"]
    by_request: dict[str, list[str]] = {}
    for result in results:
        by_request.setdefault(result["request"], []).append(result["device"])
    assert by_request["named"] == ["gpu-0"]
    assert len(by_request["any"]) == 2 and "gpu-0" not in by_request["any"]


@pytest.mark.usefixtures("claim_controller")
def test_a_claim_written_for_a_bind_that_failed_is_taken_back(
    k8s: client.ApiClient,
    namespace: str,
    queue: Callable[..., str],
    dra_nodes: Callable[..., str],
    scheduler: SchedulingCycle,
) -> None:
    node = dra_nodes()
    q = queue(16)
    template = _template(k8s, namespace)
    _alone(k8s, namespace, q, "undo", template)
    cycle_view = dra_view(k8s, {node})
    snapshot = scheduler.prepare(cycle_view, 0.0)
    (bind,) = scheduler.decide(snapshot).binds
    claims = scheduler.binder._claims  # the cycle's own writer, as the binder calls it
    assert claims is not None
    assert claims.hold(bind)
    # The bind runs on the pool; the next cycle may have made new plans meanwhile, without this pod.
    scheduler.claims.plans = {}
    assert claims.prepare(bind) is None
    allocated = _claim_of(k8s, namespace, "undo")
    assert allocated["status"]["allocation"] and FINALIZER in allocated["metadata"]["finalizers"]
    claims.settle(bind, bound=False)
    undone = _claim_of(k8s, namespace, "undo")
    assert not (undone.get("status") or {}).get("allocation")
    assert not (undone.get("status") or {}).get("reservedFor")
    assert FINALIZER not in (undone["metadata"].get("finalizers") or [])
    assert _pod(k8s, namespace, "undo")["spec"].get("nodeName") is None


def _gpu_pod(k8s: client.ApiClient, namespace: str, name: str, gpus: int) -> None:
    """A pod that asks for nvidia.com/gpu, as users write it (a limit), served through DRA where no plugin is."""
    client.CoreV1Api(k8s).create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name, "annotations": {contract.ANNOTATION_POD_GROUP: name}},
            "spec": {
                "schedulerName": contract.SCHEDULER_NAME,
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.invalid/train:1",
                        "resources": {
                            "requests": {"cpu": "1", "memory": "1Gi"},
                            "limits": {contract.RESOURCE_NVIDIA_GPU: str(gpus)},
                        },
                    }
                ],
            },
        },
    )


def test_nvidia_gpu_on_a_dra_node_gets_the_claim_kube_scheduler_would_make(
    k8s: client.ApiClient,
    namespace: str,
    queue: Callable[..., str],
    dra_nodes: Callable[..., str],
    scheduler: SchedulingCycle,
) -> None:
    """KEP-5004: no device plugin on the node, the driver's class names nvidia.com/gpu as its extended resource."""
    node = dra_nodes()
    q = queue(16)
    podgroup(k8s, namespace, "ext", q, 1)
    _gpu_pod(k8s, namespace, "ext", 2)
    scheduler.run(dra_view(k8s, {node}))

    pod = _pod(k8s, namespace, "ext")
    assert pod["spec"].get("nodeName") == node
    status = pod["status"]["extendedResourceClaimStatus"]
    # requests: cpu, memory, nvidia.com/gpu in name order: the GPU is the container's request 2.
    assert status["requestMappings"] == [
        {"containerName": "main", "resourceName": contract.RESOURCE_NVIDIA_GPU, "requestName": "container-0-request-2"}
    ]
    claim = client.CustomObjectsApi(k8s).get_namespaced_custom_object(
        *DRA, namespace, "resourceclaims", status["resourceClaimName"]
    )
    meta = claim["metadata"]
    assert meta["name"].startswith("ext-extended-resources-")
    assert meta["annotations"] == {"resource.kubernetes.io/extended-resource-claim": "true"}
    (owner,) = meta["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "Pod",
        "ext",
        pod["metadata"]["uid"],
        True,
    )
    (request,) = claim["spec"]["devices"]["requests"]
    assert request == {
        "name": "container-0-request-2",
        "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 2},
    }
    assert FINALIZER in meta["finalizers"]
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [(r["request"], r["pool"]) for r in results] == [("container-0-request-2", node)] * 2
    assert claim["status"]["reservedFor"] == [{"resource": "pods", "name": "ext", "uid": pod["metadata"]["uid"]}]

    # The next cycle sees the pod running on the claim's devices: a second pod gets the other two.
    podgroup(k8s, namespace, "ext2", q, 1)
    _gpu_pod(k8s, namespace, "ext2", 2)
    scheduler.run(dra_view(k8s, {node}))
    second = _pod(k8s, namespace, "ext2")
    assert second["spec"].get("nodeName") == node
    other = client.CustomObjectsApi(k8s).get_namespaced_custom_object(
        *DRA, namespace, "resourceclaims", second["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    )
    devices = {r["device"] for r in results} | {
        r["device"] for r in other["status"]["allocation"]["devices"]["results"]
    }
    assert devices == {f"gpu-{i}" for i in range(4)}


def test_the_claim_s_name_is_written_onto_the_pod_only_if_the_pod_did_not_change_meanwhile(  # noqa: PLR0917
    k8s: client.ApiClient,
    namespace: str,
    queue: Callable[..., str],
    dra_nodes: Callable[..., str],
    scheduler: SchedulingCycle,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """KEP-5004: the pod status patch names the resourceVersion read, so a write of another replica is not undone.

    Another writer changes the pod between the binder's read and its patch
    (as a new leader writing its own claim's name would): the patch fails
    with 409, and everything this bind wrote is taken back.
    """
    node = dra_nodes()
    q = queue(16)
    podgroup(k8s, namespace, "ext", q, 1)
    _gpu_pod(k8s, namespace, "ext", 1)
    api = scheduler.binder._api
    read = api.get_pod

    def read_then_someone_writes(ns: str, name: str) -> JSON | None:
        pod = read(ns, name)
        client.CoreV1Api(k8s).patch_namespaced_pod(name, ns, {"metadata": {"labels": {"touched": "yes"}}})
        return pod

    monkeypatch.setattr(api, "get_pod", read_then_someone_writes)
    (failed,) = scheduler.run(dra_view(k8s, {node})).binds
    assert not failed.ok and failed.error is not None and "409" in failed.error, failed.error
    pod = _pod(k8s, namespace, "ext")
    assert pod["spec"].get("nodeName") is None
    assert "extendedResourceClaimStatus" not in pod["status"]
    assert client.CustomObjectsApi(k8s).list_namespaced_custom_object(*DRA, namespace, "resourceclaims")["items"] == []


def test_nvidia_gpu_goes_to_a_device_plugin_node_without_a_claim_where_dra_has_no_room(  # noqa: PLR0917
    k8s: client.ApiClient,
    namespace: str,
    queue: Callable[..., str],
    dra_nodes: Callable[..., str],
    scheduler: SchedulingCycle,
    cluster: Callable[[int], list[str]],
) -> None:
    xid = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
    dra = dra_nodes(taints={i: xid for i in range(4)})
    (plugin,) = cluster(1)
    q = queue(16)
    podgroup(k8s, namespace, "plain", q, 1)
    _gpu_pod(k8s, namespace, "plain", 1)
    scheduler.run(dra_view(k8s, {dra, plugin}))
    pod = _pod(k8s, namespace, "plain")
    assert pod["spec"].get("nodeName") == plugin
    assert "extendedResourceClaimStatus" not in pod["status"]
    claims = client.CustomObjectsApi(k8s).list_namespaced_custom_object(*DRA, namespace, "resourceclaims")["items"]
    assert claims == []


@pytest.mark.usefixtures("claim_controller")
def test_a_replica_paused_before_its_allocations_writes_none_of_them_after_a_takeover(  # noqa: PLR0917
    request: pytest.FixtureRequest,
    control_plane: ControlPlane,
    k8s: client.ApiClient,
    namespace: str,
    queue: Callable[..., str],
    dra_nodes: Callable[..., str],
    fenced_replicas: Callable[[str], tuple[SchedulerRunner, threading.Event]],
) -> None:
    """The lease fence holds for claim allocations as for binds (claimbind's docstring).

    Replica A stamps its claims and passes its lease check for each
    allocation, then stands still (every bind worker paused just before its
    status write, A's lease no longer renewed). Replica B takes the lease
    over and gives every device to other pods. Then A's allocations go out:
    the API server must refuse each one, so no device is given twice.
    """
    node = dra_nodes()
    early = unique_name("q")  # its pods wait for the queue, so that one cycle of A places them all
    urgent = queue(16)
    template = _template(k8s, namespace)
    with control_plane.impersonate(SA, SA_NAMESPACE) as as_scheduler:
        wait_for_fence_policy(k8s, as_scheduler, namespace)

    a, _ = fenced_replicas("replica-a")
    wait_for(a.elector.is_leader, timeout=20, description="replica a leads")
    b, _ = fenced_replicas("replica-b")

    pause = PausedAfterCheck(a, "replace_resource_claim_status")
    answers: list[int | None] = []
    lock = threading.Lock()
    write_status = a.api.replace_resource_claim_status

    def recorded(namespace: str, name: str, body: JSON) -> JSON:
        try:
            answer = write_status(namespace, name, body)
        except ApiError as err:
            with lock:
                answers.append(err.status)
            assert err.status != 403 or "no longer holds the lease" in err.detail, err.detail
            raise
        with lock:
            answers.append(200)
        return answer

    a.api.replace_resource_claim_status = recorded  # type: ignore[method-assign]
    early_pods = [f"early-{i}" for i in range(4)]
    for name in early_pods:
        _alone(k8s, namespace, early, name, template, made=False)
    _claims_made(k8s, namespace, early_pods)
    create_queue(k8s, early, {"gpu": {"quota": 0}})
    request.addfinalizer(lambda: delete_queue(k8s, early))
    wait_for(pause.paused.is_set, timeout=30, description="replica a about to write an allocation, paused")
    # B must not touch A's claims (that would fail A's writes by resourceVersion,
    # not by the fence): their queue goes. The urgent pods come once A no
    # longer believes it leads, so that A does not act on them in its last moments.
    delete_queue(k8s, early)
    wait_for(lambda: not a.elector.is_leader(), timeout=20, description="replica a steps down")
    urgent_pods = [f"urgent-{i}" for i in range(4)]
    for name in urgent_pods:
        _alone(k8s, namespace, urgent, name, template, made=False)
    wait_for(b.elector.is_leader, timeout=20, description="replica b takes the lease over")
    wait_for(
        lambda: all(_pod(k8s, namespace, name)["spec"].get("nodeName") == node for name in urgent_pods),
        timeout=60,
        description="replica b gives every device to the urgent pods and binds them",
    )

    pause.wake()
    wait_for(lambda: len(answers) >= pause.passed, timeout=30, description="replica a's paused writes answered")
    assert answers and set(answers) == {403}, answers
    wait_for(lambda: a.resets >= 1, timeout=30, description="replica a drops its kept state")
    assert b.elector.is_leader()

    holders: dict[str, list[str]] = {}
    for claim in client.CustomObjectsApi(k8s).list_namespaced_custom_object(*DRA, namespace, "resourceclaims")["items"]:
        for result in ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", []):
            holders.setdefault(result["device"], []).append(claim["metadata"]["name"])
    assert sorted(holders) == [f"gpu-{i}" for i in range(4)]
    assert all(len(claims) == 1 for claims in holders.values()), holders
    for name in early_pods:
        assert _pod(k8s, namespace, name)["spec"].get("nodeName") is None
        assert not (_claim_of(k8s, namespace, name).get("status") or {}).get("allocation")
    for name in urgent_pods:
        stamp = _claim_of(k8s, namespace, name)["metadata"]["annotations"][contract.ANNOTATION_LEASE_HOLDER]
        assert stamp.startswith("replica-b#"), stamp
