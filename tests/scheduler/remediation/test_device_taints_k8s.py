"""DeviceTaintRules for quarantined GPUs, against the real API server and the upstream kube-scheduler.

The publisher writes as the scheduler's ServiceAccount, under the shipped
RBAC and admission policies. The driver's side is as NVIDIA's DRA driver
publishes it (``dra_objects``): its DeviceClasses and a node's
ResourceSlice. kube-scheduler (the binary ``make controlplane`` builds)
allocates ResourceClaims for pods of ``schedulerName: default-scheduler``;
what it allocates shows that the rule keeps it off the quarantined device.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from agent.publish.gpunode import gpunode_object
from gpuwarden import contract
from gpuwarden.kube import ApiError, KubeApi
from gpuwarden.localcluster import ManagedProcess, create_gpu_node
from scheduler.remediation.devicetaints import DeviceTaintPublisher
from scheduler.remediation.policy import DeviceTaintEffect
from tests.harness import ControlPlane, unique_name
from tests.harness import kube_scheduler as start_kube_scheduler
from tests.scheduler.cluster.kube_objects import REPO, SCHEDULER_POLICY
from tests.scheduler.remediation.dra_objects import DEVICECLASSES, DRIVER, GPUS, driver_slice, gpunode_status
from tests.waiting import wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.usefixtures("scheduler_rbac", "gpunode_crd")]

DRA = ("resource.k8s.io", "v1")
SA, SA_NAMESPACE = "gpuwarden-scheduler", "gpuwarden"
JSON = dict[str, Any]


@pytest.fixture(scope="module")
def kube_scheduler(control_plane: ControlPlane) -> Iterator[ManagedProcess]:
    """The upstream kube-scheduler on the test control plane, for this module only."""
    with start_kube_scheduler(control_plane, "kube-scheduler-dra", "--v=1") as proc:
        yield proc


@pytest.fixture(scope="module")
def device_classes(control_plane: ControlPlane) -> None:
    """The DeviceClasses the driver's chart installs; kept (cluster-scoped, the same for every test)."""
    control_plane.kubectl("apply", "-f", str(DEVICECLASSES))


@pytest.fixture
def dra_node(k8s: client.ApiClient) -> Iterator[str]:
    """A GPU node with its GPUNode and the driver's ResourceSlice; everything removed afterwards."""
    name = unique_name("dra-node")
    node = create_gpu_node(k8s, name, gpus=len(GPUS))
    custom = client.CustomObjectsApi(k8s)
    custom.create_cluster_custom_object(
        contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL, gpunode_object(name, None)
    )
    custom.patch_cluster_custom_object_status(
        contract.API_GROUP,
        contract.API_VERSION,
        contract.GPUNODE_PLURAL,
        name,
        {"status": {"gpus": gpunode_status(GPUS)}},
    )
    made = custom.create_cluster_custom_object(*DRA, "resourceslices", driver_slice(name, node.metadata.uid, GPUS))
    try:
        yield name
    finally:
        with contextlib.suppress(client.ApiException):
            custom.delete_cluster_custom_object(*DRA, "resourceslices", made["metadata"]["name"])
        with contextlib.suppress(client.ApiException):
            custom.delete_cluster_custom_object(contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL, name)
        with contextlib.suppress(client.ApiException):
            client.CoreV1Api(k8s).delete_node(name)
        for rule in _rules(k8s).values():
            with contextlib.suppress(client.ApiException):
                custom.delete_cluster_custom_object(*DRA, "devicetaintrules", rule["metadata"]["name"])


@pytest.fixture
def publisher(control_plane: ControlPlane) -> Iterator[DeviceTaintPublisher]:
    with control_plane.impersonate(SA, SA_NAMESPACE) as api:
        yield DeviceTaintPublisher(KubeApi(api, field_manager=contract.SCHEDULER_COMPONENT))


def _rules(k8s: client.ApiClient) -> dict[str, JSON]:
    items = client.CustomObjectsApi(k8s).list_cluster_custom_object(*DRA, "devicetaintrules")["items"]
    return {r["metadata"]["name"]: r for r in items}


def _slices(k8s: client.ApiClient) -> dict[str, JSON]:
    items = client.CustomObjectsApi(k8s).list_cluster_custom_object(
        *DRA, "resourceslices", field_selector=f"spec.driver={DRIVER}"
    )["items"]
    return {s["metadata"]["name"]: s for s in items}


def _quarantine(k8s: client.ApiClient, node: str, gpus: str | None) -> None:
    client.CoreV1Api(k8s).patch_node(node, {"metadata": {"annotations": {contract.ANNOTATION_QUARANTINED_GPUS: gpus}}})


def _sync(
    k8s: client.ApiClient, publisher: DeviceTaintPublisher, node: str, *, slices: dict[str, JSON] | None = None
) -> None:
    """One sync over the cluster as a view would show it (this test's node only; ``slices`` instead of the API's)."""
    core = client.CoreV1Api(k8s)
    nodes = {node: k8s.sanitize_for_serialization(core.read_node(node))}
    gpunodes = {
        node: client.CustomObjectsApi(k8s).get_cluster_custom_object(
            contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL, node
        )
    }
    report = publisher.sync(nodes, gpunodes, _slices(k8s) if slices is None else slices, _rules(k8s))
    assert report is not None and report.errors == []


def _claim_pod(k8s: client.ApiClient, namespace: str, node: str) -> str:
    """A ResourceClaim for one GPU of the driver's class and a pod of kube-scheduler's using it, pinned to ``node``."""
    name = unique_name("claimer")
    client.CustomObjectsApi(k8s).create_namespaced_custom_object(
        *DRA,
        namespace,
        "resourceclaims",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
        },
    )
    client.CoreV1Api(k8s).create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {
                "schedulerName": "default-scheduler",
                "nodeSelector": {"kubernetes.io/hostname": node},
                "containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            },
        },
    )
    return name


def _allocated(k8s: client.ApiClient, namespace: str, claim: str) -> list[str]:
    obj = client.CustomObjectsApi(k8s).get_namespaced_custom_object(*DRA, namespace, "resourceclaims", claim)
    results = ((obj.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
    return [r["device"] for r in results]


def _unschedulable_message(k8s: client.ApiClient, namespace: str, pod: str) -> str:
    status = client.CoreV1Api(k8s).read_namespaced_pod(namespace=namespace, name=pod).status
    for condition in status.conditions or ():
        if condition.type == "PodScheduled" and condition.reason == "Unschedulable":
            return str(condition.message)
    return ""


@pytest.mark.usefixtures("kube_scheduler", "device_classes")
def test_a_quarantined_gpu_is_tainted_for_kube_scheduler_and_untainted_when_it_returns(
    k8s: client.ApiClient,
    dra_node: str,
    publisher: DeviceTaintPublisher,
    namespace: str,
) -> None:
    node = dra_node
    # GPU index 0 is the device node with minor 1: the driver's gpu-1, the
    # first device of the slice, which kube-scheduler would take first.
    _quarantine(k8s, node, "0")
    _sync(k8s, publisher, node)
    (rule,) = _rules(k8s).values()
    assert rule["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": node, "device": "gpu-1"}
    assert rule["spec"]["taint"]["key"] == contract.TAINT_QUARANTINE
    assert rule["spec"]["taint"]["effect"] == "NoSchedule"

    # kube-scheduler allocates the other GPU, every time.
    first = _claim_pod(k8s, namespace, node)
    wait_for(lambda: _allocated(k8s, namespace, first) != [], timeout=60, description="kube-scheduler allocates")
    assert _allocated(k8s, namespace, first) == ["gpu-0"]

    # With one GPU held and the other quarantined, a new claim finds no device.
    second = _claim_pod(k8s, namespace, node)
    wait_for(
        lambda: _unschedulable_message(k8s, namespace, second) != "",
        timeout=60,
        description="kube-scheduler finds no device for the second claim",
    )
    assert _allocated(k8s, namespace, second) == []

    # The GPU validated: remediation drops it from the annotation, the rule
    # goes, and kube-scheduler gives the waiting claim the GPU.
    _quarantine(k8s, node, None)
    _sync(k8s, publisher, node)
    assert _rules(k8s) == {}
    wait_for(lambda: _allocated(k8s, namespace, second) != [], timeout=90, description="the returned GPU allocated")
    assert _allocated(k8s, namespace, second) == ["gpu-1"]


def test_a_rule_deleted_by_hand_comes_back_and_a_changed_one_is_put_right(
    k8s: client.ApiClient, dra_node: str, publisher: DeviceTaintPublisher
) -> None:
    node = dra_node
    _quarantine(k8s, node, "0")
    _sync(k8s, publisher, node)
    (name,) = _rules(k8s)
    custom = client.CustomObjectsApi(k8s)
    custom.delete_cluster_custom_object(*DRA, "devicetaintrules", name)
    _sync(k8s, publisher, node)
    assert list(_rules(k8s)) == [name]
    # Someone pointed our rule elsewhere: the next sync puts it back on the quarantined device.
    rule = _rules(k8s)[name]
    rule["spec"]["deviceSelector"]["device"] = "gpu-0"
    custom.replace_cluster_custom_object(*DRA, "devicetaintrules", name, rule)
    _sync(k8s, publisher, node)
    assert _rules(k8s)[name]["spec"]["deviceSelector"]["device"] == "gpu-1"
    # Nothing to change: a sync writes nothing.
    before = _rules(k8s)[name]["metadata"]["resourceVersion"]
    _sync(k8s, publisher, node)
    assert _rules(k8s)[name]["metadata"]["resourceVersion"] == before


def test_the_scheduler_may_write_only_its_own_single_device_noschedule_rules(
    k8s: client.ApiClient, control_plane: ControlPlane, dra_node: str
) -> None:
    """The admission policy: RBAC lets the token write DeviceTaintRules, the policy narrows which."""
    foreign = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": unique_name("someone-elses")},
        "spec": {
            "deviceSelector": {"driver": DRIVER, "pool": dra_node, "device": "gpu-0"},
            "taint": {"key": "example.com/maintenance", "effect": "NoSchedule"},
        },
    }
    custom = client.CustomObjectsApi(k8s)
    custom.create_cluster_custom_object(*DRA, "devicetaintrules", foreign)
    ours = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": unique_name("gpuwarden-quarantine"),
            "labels": {contract.LABEL_MANAGED_BY: contract.SCHEDULER_COMPONENT},
        },
        "spec": {
            "deviceSelector": {"driver": DRIVER, "pool": dra_node, "device": "gpu-1"},
            "taint": {"key": contract.TAINT_QUARANTINE, "value": "xid-79", "effect": "NoSchedule"},
        },
    }
    with control_plane.impersonate(SA, SA_NAMESPACE) as api:
        as_scheduler = KubeApi(api, field_manager=contract.SCHEDULER_COMPONENT)

        def refused(call: Any) -> bool:
            try:
                call()
            except ApiError as err:
                return err.status == 403
            return False

        def evicting(body: JSON) -> JSON:
            bad = yaml.safe_load(yaml.safe_dump(body))
            bad["metadata"]["name"] = unique_name("bad")
            return bad

        no_execute = evicting(ours)
        no_execute["spec"]["taint"]["effect"] = "NoExecute"
        everything = evicting(ours)
        del everything["spec"]["deviceSelector"]
        unlabelled = evicting(ours)
        del unlabelled["metadata"]["labels"]
        other_key = evicting(ours)
        other_key["spec"]["taint"]["key"] = "example.com/quarantined"
        other_driver = evicting(ours)
        other_driver["spec"]["deviceSelector"]["driver"] = "fpga.example.com"
        # The policies take effect a moment after they are applied.
        wait_for(
            lambda: refused(lambda: as_scheduler.create_device_taint_rule(no_execute)),
            timeout=30,
            interval=0.5,
            description="the DeviceTaintRule policy in force",
        )
        for bad in (everything, unlabelled, other_key, other_driver):
            assert refused(lambda bad=bad: as_scheduler.create_device_taint_rule(bad)), bad["metadata"]["name"]
        assert refused(lambda: as_scheduler.delete_device_taint_rule(foreign["metadata"]["name"], ""))
        made = as_scheduler.create_device_taint_rule(ours)
        made["spec"]["taint"]["value"] = "xid-48"
        as_scheduler.replace_device_taint_rule(ours["metadata"]["name"], made)
        as_scheduler.delete_device_taint_rule(ours["metadata"]["name"], made["metadata"]["uid"])
    with contextlib.suppress(client.ApiException):
        custom.delete_cluster_custom_object(*DRA, "devicetaintrules", foreign["metadata"]["name"])


def test_a_rule_stays_while_its_gpu_is_out_even_when_its_device_cannot_be_told(
    k8s: client.ApiClient, dra_node: str, publisher: DeviceTaintPublisher
) -> None:
    """The driver's slice gone (its plugin restarting), or the collections unreadable: the rule protects on."""
    node = dra_node
    _quarantine(k8s, node, "1")
    _sync(k8s, publisher, node)
    (name,) = _rules(k8s)
    # No slice at all for the node now: the GPU is still quarantined, the rule stays.
    _sync(k8s, publisher, node, slices={})
    assert list(_rules(k8s)) == [name]
    # The lists could not be read: nothing is written either way.
    _quarantine(k8s, node, None)
    nodes = {node: k8s.sanitize_for_serialization(client.CoreV1Api(k8s).read_node(node))}
    assert publisher.sync(nodes, {}, {}, _rules(k8s), unknown=True) is None
    assert list(_rules(k8s)) == [name]
    # Once the GPU is back in service, the rule goes, slice or no slice.
    _sync(k8s, publisher, node, slices={})
    assert _rules(k8s) == {}


def _policy_doc(text: str, name: str) -> JSON:
    return next(
        d
        for d in yaml.safe_load_all(text)
        if d and d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == name
    )


def test_noexecute_rules_only_where_the_config_asks_and_the_policy_component_allows(
    k8s: client.ApiClient, control_plane: ControlPlane, dra_node: str, tmp_path: Path
) -> None:
    """NoExecute is opt-in twice: the remediation config's ``device_taint_effect`` and the policy's component.

    The shipped policy refuses a NoExecute rule and says which component
    allows it; an overlay with the component (rendered by kubectl kustomize
    as a user would) lets the publisher write it. The shipped policy is put
    back afterwards, whatever happens.
    """
    name = "gpuwarden-scheduler-device-taint-rules"
    shipped = _policy_doc(SCHEDULER_POLICY.read_text(), name)
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    base = os.path.relpath(REPO / "manifests" / "scheduler", overlay)
    component = os.path.relpath(REPO / "manifests" / "scheduler" / "components" / "noexecute-device-taints", overlay)
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [base],
                "components": [component],
            }
        )
    )
    allowing = _policy_doc(control_plane.kubectl("kustomize", str(overlay)).stdout, name)
    assert allowing["spec"]["variables"] == [{"name": "effects", "expression": "['NoSchedule', 'NoExecute']"}]
    assert {k: v for k, v in allowing["spec"].items() if k != "variables"} == {
        k: v for k, v in shipped["spec"].items() if k != "variables"
    }, "the component changes the allowed effects and nothing else"

    _quarantine(k8s, dra_node, "1")
    with control_plane.impersonate(SA, SA_NAMESPACE) as api:
        publisher = DeviceTaintPublisher(
            KubeApi(api, field_manager=contract.SCHEDULER_COMPONENT), effect=DeviceTaintEffect.NO_EXECUTE
        )
        core = client.CoreV1Api(k8s)
        nodes = {dra_node: k8s.sanitize_for_serialization(core.read_node(dra_node))}
        gpunodes = {
            dra_node: client.CustomObjectsApi(k8s).get_cluster_custom_object(
                contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL, dra_node
            )
        }

        def sync() -> list[str]:
            report = publisher.sync(nodes, gpunodes, _slices(k8s), _rules(k8s))
            assert report is not None
            return report.errors

        errors = sync()
        assert errors and "noexecute-device-taints component" in errors[0], errors

        def ours() -> dict[str, JSON]:
            return {n: r for n, r in _rules(k8s).items() if r["spec"]["deviceSelector"].get("pool") == dra_node}

        def drop_ours() -> None:
            for rule_name in ours():
                with contextlib.suppress(client.ApiException):
                    client.CustomObjectsApi(k8s).delete_cluster_custom_object(*DRA, "devicetaintrules", rule_name)

        try:
            try:
                control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(allowing))
                wait_for(lambda: sync() == [], timeout=30, interval=0.5, description="the component's policy in force")
                assert {r["spec"]["taint"]["effect"] for r in ours().values()} == {"NoExecute"}
            finally:
                control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(shipped))

            def refused_again() -> bool:
                drop_ours()  # one the old policy still let through, while the shipped one loads
                return bool(sync())

            wait_for(refused_again, timeout=30, interval=0.5, description="the shipped policy back in force")
        finally:
            _quarantine(k8s, dra_node, None)
            drop_ours()
