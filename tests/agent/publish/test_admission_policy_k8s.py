"""The agent's token may write only its own node's health: the shipped admission policy, for real.

The token is what a DaemonSet pod gets: a ServiceAccount token bound to a pod
on node A, which makes the API server name the node in the request's user
info. With it the agent writes its conditions and gpu-memory on A, and
nothing else: not node B, not A's labels, the kubelet's conditions or another
capacity, and not another node's GPUNode.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from agent.publish.gpunode import gpunode_object, owner_reference
from agent.publish.settings import DEFAULT_EVENTS_NAMESPACE
from agent.sim.node import SimNode
from agent.sim.scenario import load_scenario
from gpuwarden import contract
from gpuwarden.kube import KubeApi
from gpuwarden.podresources.fake import FakePodResources
from gpuwarden.podresources.v1 import api_pb2 as pb
from tests.agent.publish.conftest import (
    AGENT_NAMESPACE,
    AGENT_SERVICE_ACCOUNT,
    MANIFESTS,
    SimAgent,
    delete_node_and_leftovers,
)
from tests.harness import ControlPlane, create_gpu_node, simple_pod, temporary_namespace, unique_name
from tests.waiting import wait_for

pytestmark = pytest.mark.k8s


@pytest.fixture
def two_nodes(k8s: client.ApiClient, agent_manifests: None) -> Iterator[tuple[str, str]]:
    names = (unique_name("vap-a"), unique_name("vap-b"))
    for name in names:
        create_gpu_node(k8s, name, gpus=8)
    try:
        yield names
    finally:
        for name in names:
            delete_node_and_leftovers(k8s, name)


@contextlib.contextmanager
def _agent_on(control_plane: ControlPlane, k8s: client.ApiClient, node: str) -> Iterator[client.ApiClient]:
    """A client with the token a DaemonSet pod of the agent on ``node`` would mount; the pod is deleted after."""
    core = client.CoreV1Api(k8s)
    pod = core.create_namespaced_pod(
        AGENT_NAMESPACE,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name=unique_name("gpuwarden-agent")),
            spec=client.V1PodSpec(
                node_name=node,
                service_account_name=AGENT_SERVICE_ACCOUNT,
                containers=[client.V1Container(name="agent", image="registry.invalid/gpuwarden:test")],
            ),
        ),
    )
    try:
        token = core.create_namespaced_service_account_token(
            AGENT_SERVICE_ACCOUNT,
            AGENT_NAMESPACE,
            client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(
                    audiences=[],
                    expiration_seconds=3600,
                    bound_object_ref=client.V1BoundObjectReference(
                        kind="Pod", api_version="v1", name=pod.metadata.name, uid=pod.metadata.uid
                    ),
                )
            ),
        ).status.token
        config = control_plane.configuration()
        config.api_key = {"authorization": token}
        with client.ApiClient(config) as api:
            yield api
    finally:
        with contextlib.suppress(client.ApiException):
            core.delete_namespaced_pod(pod.metadata.name, AGENT_NAMESPACE, grace_period_seconds=0)


def _status_patch(api: client.ApiClient, node: str, body: dict[str, Any]) -> int:
    """The HTTP status of a strategic-merge patch of nodes/status (200 when allowed)."""
    try:
        client.CoreV1Api(api).patch_node_status(node, body)
    except client.ApiException as exc:
        return int(exc.status)
    return 200


def _own_condition(status: str = "True") -> dict[str, Any]:
    return {
        "type": contract.ConditionType.GPU_PCIE_DEGRADED.value,
        "status": status,
        "reason": "PcieWidthDegraded",
        "message": "GPU 2: PCIe link x8, device maximum x16. Recommended action: RESET_GPU.",
    }


def test_the_agents_token_writes_only_its_own_nodes_health(
    control_plane: ControlPlane, k8s: client.ApiClient, two_nodes: tuple[str, str]
) -> None:
    node_a, node_b = two_nodes
    with _agent_on(control_plane, k8s, node_a) as agent:
        # Policies take effect once the API server has loaded them.
        wait_for(
            lambda: _status_patch(agent, node_b, {"status": {"conditions": [_own_condition()]}}) == 403,
            timeout=30,
            interval=0.5,
            description="the agent on A refused B's status",
        )
        assert _status_patch(agent, node_a, {"status": {"conditions": [_own_condition()]}}) == 200
        assert _status_patch(agent, node_a, {"status": {"capacity": {contract.RESOURCE_GPU_MEMORY: "652472"}}}) == 200
        refused = [
            {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}},
            {"metadata": {"annotations": {"example.com/owned": "yes"}}},
            {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "Gone", "message": "x"}]}},
            {"status": {"allocatable": {contract.RESOURCE_NVIDIA_GPU: "0"}}},
            {"status": {"capacity": {"cpu": "1"}}},
        ]
        assert [_status_patch(agent, node_a, body) for body in refused] == [403] * len(refused)
        stored = client.CoreV1Api(k8s).read_node(node_a)
        assert "node-role.kubernetes.io/control-plane" not in (stored.metadata.labels or {})
        assert stored.status.allocatable[contract.RESOURCE_NVIDIA_GPU] == "8"
        ready = next(c for c in stored.status.conditions if c.type == "Ready")
        assert ready.status == "True"

        # GPUNodes: its own, not another node's, and no finalizers.
        custom = client.CustomObjectsApi(agent)

        def create(name: str, **meta: Any) -> int:
            body = gpunode_object(name, None)
            body["metadata"].update(meta)
            try:
                custom.create_cluster_custom_object(
                    contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL, body
                )
            except client.ApiException as exc:
                return int(exc.status)
            return 201

        assert create(node_b) == 403
        assert create(node_a, finalizers=["example.com/keep"]) == 403
        assert create(node_a) == 201


def test_the_agent_answers_in_status_remediation_but_never_writes_the_spec(
    control_plane: ControlPlane, k8s: client.ApiClient, two_nodes: tuple[str, str]
) -> None:
    node_a, _ = two_nodes
    group = (contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL)
    asked = {"resets": [{"gpu": 1, "requestedAt": "2026-12-01T10:00:00Z"}]}
    answered = {
        "resets": [
            {
                "gpu": 1,
                "requestedAt": "2026-12-01T10:00:00Z",
                "result": contract.RESET_SUCCEEDED,
                "finishedAt": "2026-12-01T10:00:05.250000Z",
            }
        ],
        "validations": [],
    }
    with _agent_on(control_plane, k8s, node_a) as agent:
        custom = client.CustomObjectsApi(agent)

        def status_of(call: Any, *args: Any) -> int:
            try:
                call(*group, *args)
            except client.ApiException as exc:
                return int(exc.status)
            return 200

        forged = gpunode_object(node_a, None)
        forged["spec"][contract.GPUNODE_REMEDIATION] = {"validations": [{"requestedAt": "2026-12-01T10:00:00Z"}]}
        wait_for(
            lambda: status_of(custom.create_cluster_custom_object, forged) == 403,
            timeout=30,
            interval=0.5,
            description="the agent refused a GPUNode created with remediation requests",
        )
        assert status_of(custom.create_cluster_custom_object, gpunode_object(node_a, None)) == 200
        # The scheduler asks (an administrator's client here).
        client.CustomObjectsApi(k8s).patch_cluster_custom_object(
            *group, node_a, {"spec": {contract.GPUNODE_REMEDIATION: asked}}
        )
        # The agent sees the request through its own watch's list (RBAC: list with its name).
        listed = custom.list_cluster_custom_object(*group, field_selector=f"metadata.name={node_a}")
        assert [i["spec"][contract.GPUNODE_REMEDIATION] for i in listed["items"]] == [asked]
        # It answers in status, and may not rewrite, drop or add to the requests.
        patch = {"status": {contract.GPUNODE_REMEDIATION: answered}}
        assert status_of(custom.patch_cluster_custom_object_status, node_a, patch) == 200
        for spec in ({contract.GPUNODE_REMEDIATION: None}, {contract.GPUNODE_REMEDIATION: {"resets": []}}):
            assert status_of(custom.patch_cluster_custom_object, node_a, {"spec": spec}) == 403
        # A spec sent to the status subresource is not applied.
        sneaky = {"spec": {contract.GPUNODE_REMEDIATION: None}, "status": {"gpuCount": 8}}
        assert status_of(custom.patch_cluster_custom_object_status, node_a, sneaky) == 200
    stored = client.CustomObjectsApi(k8s).get_cluster_custom_object(*group, node_a)
    assert stored["spec"][contract.GPUNODE_REMEDIATION] == asked
    assert stored["status"][contract.GPUNODE_REMEDIATION] == answered


def _wait_for_policies(agent: client.ApiClient, other_node: str) -> None:
    """Policies take effect once the API server has loaded them."""
    wait_for(
        lambda: _status_patch(agent, other_node, {"status": {"conditions": [_own_condition()]}}) == 403,
        timeout=30,
        interval=0.5,
        description="the agent's policies loaded",
    )


# What the agent's token tries to write in each field of NodeStatus it does
# not own (every field of Kubernetes 1.37's NodeStatus but conditions,
# capacity and allocatable; test_every_node_status_field_is_held_by_the_policy
# checks that against the API server's schema).
FORBIDDEN_STATUS = {
    "phase": "Terminated",
    "addresses": [{"type": "InternalIP", "address": "10.66.66.66"}],
    # The port the API server dials for exec, attach and logs.
    "daemonEndpoints": {"kubeletEndpoint": {"Port": 6666}},
    "nodeInfo": {"kernelVersion": "6.6.6"},
    "images": [{"names": ["registry.invalid/planted:1"], "sizeBytes": 1}],
    "volumesInUse": ["kubernetes.io/csi/planted^vol-1"],
    "volumesAttached": [{"name": "kubernetes.io/csi/planted^vol-1", "devicePath": "/dev/planted"}],
    "config": {"error": "planted"},
    "runtimeHandlers": [{"name": "planted", "features": {"recursiveReadOnlyMounts": True}}],
    "features": {"supplementalGroupsPolicy": True},
    "declaredFeatures": ["Planted"],
}


def test_the_agents_token_changes_no_other_field_of_its_nodes_status_nor_its_metadata(
    control_plane: ControlPlane, k8s: client.ApiClient, two_nodes: tuple[str, str]
) -> None:
    node_a, node_b = two_nodes
    core = client.CoreV1Api(k8s)
    before = k8s.sanitize_for_serialization(core.read_node(node_a))
    namespace_uid = core.read_namespace("default").metadata.uid
    with _agent_on(control_plane, k8s, node_a) as agent:
        _wait_for_policies(agent, node_b)
        answers = {
            field: _status_patch(agent, node_a, {"status": {field: value}}) for field, value in FORBIDDEN_STATUS.items()
        }
        metadata = {
            "finalizers": {"metadata": {"finalizers": ["example.com/hold"]}},
            "ownerReferences": {
                "metadata": {
                    "ownerReferences": [
                        {"apiVersion": "v1", "kind": "Namespace", "name": "default", "uid": namespace_uid}
                    ]
                }
            },
        }
        answers.update({f"metadata.{key}": _status_patch(agent, node_a, body) for key, body in metadata.items()})
        # The spec is not reachable through nodes/status: the API server keeps the stored one.
        spec_answer = _status_patch(agent, node_a, {"spec": {"unschedulable": True, "taints": None}})
        # What it owns still goes through.
        assert _status_patch(agent, node_a, {"status": {"conditions": [_own_condition()]}}) == 200
    # status.config is dropped by the API server itself unless the node already
    # reports one (dynamic kubelet config is gone); stored or not, it is checked below.
    assert answers.pop("config") in (200, 403)
    assert answers == dict.fromkeys(answers, 403)
    assert spec_answer in (200, 403)
    after = k8s.sanitize_for_serialization(core.read_node(node_a))
    assert after["spec"] == before["spec"]
    for field in FORBIDDEN_STATUS:
        assert after["status"].get(field) == before["status"].get(field), field
    assert after["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == 10250
    for key in ("labels", "annotations", "finalizers", "ownerReferences"):
        assert after["metadata"].get(key) == before["metadata"].get(key), key


def _policy(name: str) -> dict[str, Any]:
    docs = yaml.safe_load_all((MANIFESTS / "admission-policy.yaml").read_text())
    return next(d for d in docs if d and d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == name)


def test_every_node_status_field_is_held_by_the_policy(control_plane: ControlPlane) -> None:
    """Each field of NodeStatus that this API server serves is named by the policy (and tried above).

    A release that adds a field to NodeStatus (as 1.33 added features and
    1.35 declaredFeatures) fails this test until the policy holds it too.
    """
    schema = json.loads(control_plane.kubectl("get", "--raw", "/openapi/v3/api/v1").stdout)
    fields = set(schema["components"]["schemas"]["io.k8s.api.core.v1.NodeStatus"]["properties"])
    owned = {"conditions", "capacity", "allocatable"}
    assert owned <= fields
    assert fields - owned == set(FORBIDDEN_STATUS)
    expressions = " ".join(v["expression"] for v in _policy("gpuwarden-agent-node-status")["spec"]["validations"])
    for field in fields - owned:
        assert f"object.?status.?{field} == oldObject.?status.?{field}" in expressions, field


def _gpunode(name: str, *, owners: list[dict[str, Any]] | None = None, **meta: Any) -> dict[str, Any]:
    body = gpunode_object(name, None)
    if owners is not None:
        body["metadata"]["ownerReferences"] = owners
    body["metadata"].update(meta)
    return body


def test_the_agents_token_creates_its_gpunode_owned_by_its_node_and_never_changes_its_metadata(
    control_plane: ControlPlane, k8s: client.ApiClient, two_nodes: tuple[str, str]
) -> None:
    node_a, node_b = two_nodes
    core = client.CoreV1Api(k8s)
    uid_a, uid_b = (core.read_node(n).metadata.uid for n in (node_a, node_b))
    group = (contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL)
    own = owner_reference(node_a, uid_a)
    with _agent_on(control_plane, k8s, node_a) as agent:
        _wait_for_policies(agent, node_b)
        custom = client.CustomObjectsApi(agent)

        def answer(call: Any, *args: Any) -> int:
            try:
                call(*group, *args)
            except client.ApiException as exc:
                return int(exc.status)
            return 200

        create = custom.create_cluster_custom_object
        refused_creates = {
            "owned by another node": _gpunode(node_a, owners=[owner_reference(node_b, uid_b)]),
            "owned by something else": _gpunode(
                node_a, owners=[{"apiVersion": "v1", "kind": "Namespace", "name": node_a, "uid": uid_a}]
            ),
            "owned twice": _gpunode(node_a, owners=[own, {**own, "uid": uid_b}]),
            "as its controller": _gpunode(node_a, owners=[{**own, "controller": True}]),
            "with labels": _gpunode(node_a, owners=[own], labels={"example.com/x": "y"}),
            "with annotations": _gpunode(node_a, owners=[own], annotations={"example.com/x": "y"}),
        }
        wrong_spec = _gpunode(node_a, owners=[own])
        wrong_spec["spec"]["nodeName"] = node_b
        refused_creates["for another node in its spec"] = wrong_spec
        answers = {why: answer(create, body) for why, body in refused_creates.items()}
        assert answers == dict.fromkeys(answers, 403)
        # What the agent creates (agent/publish/gpunode.py) is allowed.
        assert answer(create, gpunode_object(node_a, uid_a)) == 200

        patch, patch_status = custom.patch_cluster_custom_object, custom.patch_cluster_custom_object_status
        refused_patches = {
            "drop its owner": {"metadata": {"ownerReferences": None}},
            "label it": {"metadata": {"labels": {"example.com/x": "y"}}},
            "annotate it": {"metadata": {"annotations": {"example.com/x": "y"}}},
            "hold it with a finalizer": {"metadata": {"finalizers": ["example.com/hold"]}},
        }
        answers = {why: answer(patch, node_a, body) for why, body in refused_patches.items()}
        assert answers == dict.fromkeys(answers, 403)
        # Through the status subresource metadata is not applied; the status is.
        status = {"status": {"gpuCount": 8}, "metadata": {"ownerReferences": None, "labels": {"example.com/x": "y"}}}
        assert answer(patch_status, node_a, status) == 200
    stored = client.CustomObjectsApi(k8s).get_cluster_custom_object(*group, node_a)
    assert stored["metadata"]["ownerReferences"] == [own]
    assert "labels" not in stored["metadata"] and "finalizers" not in stored["metadata"]
    assert stored["status"]["gpuCount"] == 8


def _event(node: str, **overrides: Any) -> dict[str, Any]:
    """An Event as the agent writes one (agent/publish/events.py), with ``overrides``."""
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": unique_name(f"{node}.ev")},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
        "type": "Warning",
        "reason": "Xid13",
        "message": "GPU 0: graphics engine exception",
        "source": {"component": contract.AGENT_COMPONENT, "host": node},
        "reportingComponent": contract.AGENT_COMPONENT,
        "reportingInstance": node,
        "firstTimestamp": "2026-12-01T10:00:00Z",
        "lastTimestamp": "2026-12-01T10:00:00Z",
        "count": 1,
    }
    body.update(overrides)
    return body


def test_the_agents_token_writes_events_only_about_its_own_node(
    control_plane: ControlPlane, k8s: client.ApiClient, two_nodes: tuple[str, str], namespace: str
) -> None:
    node_a, node_b = two_nodes
    admin = client.CoreV1Api(k8s)
    # The kubelet's Event about node A: the agent may not rewrite it.
    kubelets = _event(
        node_a,
        reason="NodeReady",
        type="Normal",
        source={"component": "kubelet", "host": node_a},
        reportingComponent="kubelet",
    )
    admin.create_namespaced_event(DEFAULT_EVENTS_NAMESPACE, kubelets)
    with _agent_on(control_plane, k8s, node_a) as agent:
        _wait_for_policies(agent, node_b)
        core = client.CoreV1Api(agent)

        def create(body: dict[str, Any], where: str = DEFAULT_EVENTS_NAMESPACE) -> int:
            try:
                core.create_namespaced_event(where, body)
            except client.ApiException as exc:
                return int(exc.status)
            return 201

        def patch(name: str, body: dict[str, Any]) -> int:
            try:
                core.patch_namespaced_event(name, DEFAULT_EVENTS_NAMESPACE, body)
            except client.ApiException as exc:
                return int(exc.status)
            return 200

        # A pod in the Event's own namespace: an Event about an object elsewhere is invalid anyway (422).
        pod = {"apiVersion": "v1", "kind": "Pod", "name": "victim", "namespace": DEFAULT_EVENTS_NAMESPACE, "uid": "u"}
        refused = {
            "about node B": create(_event(node_b)),
            "about node B, claiming B's host": create(
                _event(node_b, source={"component": contract.AGENT_COMPONENT, "host": node_b}, reportingInstance=node_b)
            ),
            "about a pod": create(_event(node_a, involvedObject=pod)),
            "about A with a related pod": create(_event(node_a, related=pod)),
            "about A, as the kubelet": create(
                _event(node_a, source={"component": "kubelet", "host": node_a}, reportingComponent="kubelet")
            ),
            "about A, from B's agent": create(_event(node_a, reportingInstance=node_b)),
            "with a label": create(_event(node_a, metadata={"name": unique_name("ev"), "labels": {"a": "b"}})),
            "in a workload's namespace": create(_event(node_a), namespace),
            "in the agent's own namespace": create(_event(node_a), AGENT_NAMESPACE),
            "rewrite the kubelet's Event": patch(kubelets["metadata"]["name"], {"count": 2}),
        }
        own = _event(node_a)
        assert create(own) == 201
        refused["rewrite its own Event's message"] = patch(own["metadata"]["name"], {"message": "all is well"})
        refused["point its own Event at node B"] = patch(own["metadata"]["name"], {"involvedObject": {"name": node_b}})
        refused["replace its own Event"] = _answer(
            lambda: core.replace_namespaced_event(own["metadata"]["name"], DEFAULT_EVENTS_NAMESPACE, _event(node_a))
        )
        refused["write through events.k8s.io"] = _answer(
            lambda: client.EventsV1Api(agent).create_namespaced_event(
                DEFAULT_EVENTS_NAMESPACE,
                {
                    "apiVersion": "events.k8s.io/v1",
                    "kind": "Event",
                    "metadata": {"name": unique_name("ev")},
                    "eventTime": "2026-12-01T10:00:00.000000Z",
                    "reportingController": contract.AGENT_COMPONENT,
                    "reportingInstance": node_a,
                    "action": "Spoof",
                    "reason": "Spoofed",
                    "regarding": {"kind": "Node", "name": node_b},
                    "type": "Normal",
                },
            )
        )
        # Aggregation (count and lastTimestamp) is what the agent patches.
        assert patch(own["metadata"]["name"], {"count": 2, "lastTimestamp": "2026-12-01T10:01:00Z"}) == 200
    assert refused == dict.fromkeys(refused, 403)
    assert admin.read_namespaced_event(kubelets["metadata"]["name"], DEFAULT_EVENTS_NAMESPACE).count == 1
    stored = admin.read_namespaced_event(own["metadata"]["name"], DEFAULT_EVENTS_NAMESPACE)
    assert (stored.count, stored.message, stored.involved_object.name) == (2, own["message"], node_a)


def _answer(call: Any) -> int:
    try:
        call()
    except client.ApiException as exc:
        return int(exc.status)
    return 200


def test_the_whole_agent_publishes_with_its_pod_bound_token_and_nothing_is_refused(
    control_plane: ControlPlane, k8s: client.ApiClient, two_nodes: tuple[str, str]
) -> None:
    """Conditions, capacity, the GPUNode and aggregated Events, as the DaemonSet pod on node A writes them."""
    node_a, node_b = two_nodes
    admin = KubeApi(k8s, field_manager=contract.AGENT_COMPONENT)
    with _agent_on(control_plane, k8s, node_a) as agent_api:
        _wait_for_policies(agent_api, node_b)
        agent = SimAgent(agent_api, node_a, SimNode(load_scenario("default"))).start()
        try:
            _wait_published(admin, agent, node_a)
        finally:
            agent.stop()
        assert agent.daemon.stats.snapshot()[1] == {}, "a request of the agent was refused"
    node = admin.get_node(node_a) or {}
    assert node["status"]["capacity"][contract.RESOURCE_GPU_MEMORY] == str(7 * 81559)
    gpunode = admin.get_gpunode(node_a) or {}
    assert [o["uid"] for o in gpunode["metadata"]["ownerReferences"]] == [node["metadata"]["uid"]]
    events = (
        client.CoreV1Api(k8s)
        .list_namespaced_event(DEFAULT_EVENTS_NAMESPACE, field_selector=f"involvedObject.name={node_a}")
        .items
    )
    assert {e.reason for e in events} >= {"RowRemapPending", "IbPortDown", "Xid13"}


def _wait_published(admin: KubeApi, agent: SimAgent, node_a: str) -> None:
    wait_for(
        lambda: (admin.get_gpunode(node_a) or {}).get("status", {}).get("gpuCount") == 8,
        timeout=30,
        description="the agent's GPUNode",
    )
    wait_for(
        lambda: any(
            c["type"] == "GpuMemoryDegraded" and c["status"] == "True"
            for c in (admin.get_node(node_a) or {}).get("status", {}).get("conditions", [])
        ),
        timeout=30,
        description="GpuMemoryDegraded True on node A",
    )
    wait_for(lambda: agent.daemon.events.pending() == 0, timeout=30, description="events written")


def _holding(uuid: str, namespace: str, pod: str, container: str = "main") -> pb.PodResources:
    return pb.PodResources(
        name=pod,
        namespace=namespace,
        containers=[
            pb.ContainerResources(
                name=container, devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[uuid])]
            )
        ],
    )


def _gpus(admin: KubeApi, node: str) -> list[dict[str, Any]]:
    return list(((admin.get_gpunode(node) or {}).get("status") or {}).get("gpus") or [])


def test_the_agent_publishes_who_holds_each_gpu_from_podresources_with_its_token(
    control_plane: ControlPlane, k8s: client.ApiClient, two_nodes: tuple[str, str]
) -> None:
    """The kubelet's PodResources answer, joined with the pods' UID and scheduler, lands in the GPUNode.

    Written by the agent with the pod-bound token of node A: the CRD keeps the
    new fields and the admission policy and RBAC refuse none of its requests
    (the pod reads included). The kubelet then goes away: the holders stay,
    status.podResources says why.
    """
    node_a, node_b = two_nodes
    admin = KubeApi(k8s, field_manager=contract.AGENT_COMPONENT)
    core = client.CoreV1Api(k8s)
    sim = SimNode(load_scenario("default"))
    probe = sim.hardware().gpu
    probe.open()
    uuids = [g.uuid for g in probe.sample()]
    probe.close()
    with (
        temporary_namespace(k8s, "holders") as namespace,
        tempfile.TemporaryDirectory(prefix="pr-") as sockets,
        FakePodResources(os.path.join(sockets, "kubelet.sock")) as kubelet,
        _agent_on(control_plane, k8s, node_a) as agent_api,
    ):
        ours = simple_pod("trainer-0", node_name=node_a)
        ours.spec.scheduler_name = contract.SCHEDULER_NAME
        ours = core.create_namespaced_pod(namespace, ours)
        theirs = core.create_namespaced_pod(namespace, simple_pod("notebook", node_name=node_a))
        kubelet.set_answers(
            pb.ListPodResourcesResponse(
                pod_resources=[
                    _holding(uuids[0], namespace, "trainer-0"),
                    _holding(uuids[1], namespace, "notebook"),
                    # Named by the kubelet, unknown to the API server (deleted meanwhile).
                    _holding(uuids[2], namespace, "gone"),
                ]
            ),
            pb.AllocatableResourcesResponse(
                devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=uuids[:7])]
            ),
        )
        _wait_for_policies(agent_api, node_b)
        agent = SimAgent(agent_api, node_a, sim, pod_resources_socket=kubelet.path).start()
        try:
            gpus = wait_for(
                lambda: (g := _gpus(admin, node_a)) and g[0].get("pods") and g[1].get("pods") and g,
                timeout=30,
                description="the GPUs' holders in the GPUNode",
            )
            assert gpus[0]["pods"] == [
                {
                    "namespace": namespace,
                    "name": "trainer-0",
                    "container": "main",
                    "resource": "nvidia.com/gpu",
                    "uid": ours.metadata.uid,
                    "schedulerName": contract.SCHEDULER_NAME,
                }
            ]
            assert gpus[1]["pods"][0]["uid"] == theirs.metadata.uid
            assert gpus[1]["pods"][0]["schedulerName"] == "default-scheduler"
            assert "uid" not in gpus[2]["pods"][0]
            assert [g["allocatable"] for g in gpus] == [True] * 7 + [False]
            assert (admin.get_gpunode(node_a) or {})["status"][contract.GPUNODE_POD_RESOURCES] == {"ok": True}

            kubelet.vanish()
            status = wait_for(
                lambda: (
                    (s := (admin.get_gpunode(node_a) or {}).get("status") or {})
                    .get(contract.GPUNODE_POD_RESOURCES, {})
                    .get("ok")
                    is False
                    and s
                ),
                timeout=30,
                description="the failed read in status.podResources",
            )
            assert status[contract.GPUNODE_POD_RESOURCES]["reason"] == "missing"
            assert status["gpus"][0]["pods"] == gpus[0]["pods"]
        finally:
            agent.stop()
        assert agent.daemon.stats.snapshot()[1] == {}, "a request of the agent was refused"
        # The pod reads are by name, never a list of the cluster's pods.
        requests = agent.daemon.stats.snapshot()[0]
        assert requests.get("get_pod", 0) >= 3 and "list_pods_on_node" not in requests
