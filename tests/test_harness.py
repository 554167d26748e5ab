"""The test control plane behaves like a cluster in the ways gpuwarden relies on.

Every other Kubernetes test trusts these behaviours (status patches that keep
the kubelet's conditions, binding, eviction with PodDisruptionBudgets, garbage
collection, namespace deletion, RBAC through impersonation); if the harness
got one wrong, those tests would pass against a cluster that does not exist.
"""

from __future__ import annotations

import base64
import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml
from kubernetes import client, config

from gpuwarden import contract
from tests.harness import (
    RUN_DIR_PREFIX,
    TAINT_NOT_READY,
    ControlPlane,
    ControlPlaneError,
    KubectlError,
    complete_pod_deletion,
    create_gpu_node,
    find_binaries,
    mark_pod_running,
    reap_leftovers,
    simple_pod,
    temporary_namespace,
    unique_name,
    wait_for,
)

# Garbage collection and namespace deletion wait for the controller
# manager's informers on a loaded 2-core machine.
CONTROLLER_TIMEOUT_S = 60.0


def _status(err: client.ApiException) -> int:
    return int(err.status or 0)


def _gone(read: object) -> bool:
    """True once ``read()`` answers 404."""
    try:
        read()  # type: ignore[operator]
    except client.ApiException as err:
        if _status(err) == 404:
            return True
        raise
    return False


def _condition(node: client.V1Node, kind: str) -> dict[str, Any]:
    """The condition ``kind`` of a node as a dict ({} when absent)."""
    conditions = node.to_dict()["status"]["conditions"] or []
    return next((c for c in conditions if c["type"] == kind), {})


# ---------------------------------------------------------------------------
# Helpers that need no cluster
# ---------------------------------------------------------------------------


def test_wait_for_returns_first_truthy_value() -> None:
    answers = iter([None, 0, "", "ready", "later"])
    assert wait_for(lambda: next(answers), timeout=5, interval=0) == "ready"


def test_wait_for_timeout_names_condition_and_last_value() -> None:
    def never_ready() -> int:
        return 0

    with pytest.raises(TimeoutError, match=r"never_ready not true within 0\.05s; last call returned 0"):
        wait_for(never_ready, timeout=0.05, interval=0.01)


def test_wait_for_retries_ignored_exceptions_only() -> None:
    calls = {"n": 0}

    def flaky() -> str:
        calls["n"] += 1
        if calls["n"] < 3:
            raise KeyError("not yet")
        return "done"

    assert wait_for(flaky, timeout=5, interval=0, ignore=(KeyError,)) == "done"
    with pytest.raises(ZeroDivisionError):
        wait_for(lambda: 1 // 0, timeout=5, interval=0, ignore=(KeyError,))
    empty: dict[str, str] = {}
    with pytest.raises(TimeoutError, match="raised KeyError"):
        wait_for(lambda: empty["missing"], timeout=0.05, interval=0.01, ignore=(KeyError,))


def test_unique_name_is_a_distinct_dns_label() -> None:
    names = {unique_name("GPU_Node.x") for _ in range(50)}
    assert len(names) == 50
    for name in names:
        assert name.startswith("gpu-node-x-")
        assert len(name) <= 63
        assert all(c.isdigit() or c == "-" or c.islower() for c in name)
    assert len(unique_name("p" * 200)) <= 63


def test_missing_binaries_fail_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWARDEN_CACHE", str(tmp_path))
    for var in ("ETCD", "KUBE_APISERVER", "KUBE_CONTROLLER_MANAGER", "KUBECTL"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ControlPlaneError, match="make controlplane") as err:
        find_binaries()
    assert str(tmp_path / "etcd-") in str(err.value)

    monkeypatch.setenv("KUBE_APISERVER", str(tmp_path / "nowhere"))
    with pytest.raises(ControlPlaneError, match=r"KUBE_APISERVER=.*nowhere is not an executable file"):
        find_binaries()


def test_reap_leftovers_kills_only_a_dead_runs_processes(tmp_path: Path) -> None:
    finished = subprocess.Popen(["true"])
    finished.wait()
    dead_pid = finished.pid
    orphan_dir = tmp_path / f"{RUN_DIR_PREFIX}{dead_pid}-abc"
    live_dir = tmp_path / f"{RUN_DIR_PREFIX}{os.getpid()}-def"
    orphan_dir.mkdir()
    live_dir.mkdir()
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    orphan = subprocess.Popen([*sleeper, str(orphan_dir)], start_new_session=True)
    bystander = subprocess.Popen([*sleeper, "unrelated"], start_new_session=True)
    try:
        (orphan_dir / "pids").write_text(f"{orphan.pid}\n{bystander.pid}\n")
        (live_dir / "pids").write_text(f"{bystander.pid}\n")

        assert reap_leftovers(tmp_path) == [orphan_dir]

        assert orphan.wait(10) == -9
        assert bystander.poll() is None
        assert not orphan_dir.exists()
        assert live_dir.exists()
    finally:
        for proc in (orphan, bystander):
            proc.kill()
            proc.wait()


# ---------------------------------------------------------------------------
# The control plane
# ---------------------------------------------------------------------------


@pytest.mark.k8s
def test_kubeconfig_names_the_server_its_ca_and_the_admin(control_plane: ControlPlane) -> None:
    print(f"control plane ready in {control_plane.startup_seconds:.1f}s")
    kubeconfig = yaml.safe_load(control_plane.kubeconfig.read_text())
    cluster = kubeconfig["clusters"][0]["cluster"]
    assert cluster["server"] == control_plane.server
    assert control_plane.server.startswith("https://127.0.0.1:")
    assert base64.b64decode(cluster["certificate-authority-data"]) == control_plane.ca_file.read_bytes()
    assert kubeconfig["users"][0]["user"]["token"] == control_plane.admin_token


@pytest.mark.k8s
def test_kubeconfig_loads_with_the_kubernetes_config_loader(control_plane: ControlPlane) -> None:
    with config.new_client_from_config(config_file=str(control_plane.kubeconfig)) as api:  # type: ignore[no-untyped-call]
        names = [ns.to_dict()["metadata"]["name"] for ns in client.CoreV1Api(api).list_namespace().items]
    assert "default" in names
    assert "kube-system" in names


@pytest.mark.k8s
def test_gpu_node_is_ready_untainted_and_has_gpu_capacity(k8s: client.ApiClient) -> None:
    name = unique_name("gpu-node")
    created = create_gpu_node(k8s, name, gpus=4, gpu_memory_mib=4 * 81920, labels={contract.LABEL_NODE_POOL: "a"})
    plain_name = unique_name("plain-node")
    try:
        node = created.to_dict()
        assert node["metadata"]["labels"][contract.LABEL_NODE_POOL] == "a"
        assert node["metadata"]["labels"]["kubernetes.io/hostname"] == name
        for resources in (node["status"]["capacity"], node["status"]["allocatable"]):
            assert resources[contract.RESOURCE_NVIDIA_GPU] == "4"
            assert resources[contract.RESOURCE_GPU_MEMORY] == str(4 * 81920)
            assert resources["cpu"] == "64"
        ready = _condition(created, "Ready")
        assert (ready["status"], ready["reason"]) == ("True", "KubeletReady")
        assert all(t["key"] != TAINT_NOT_READY for t in node["spec"]["taints"] or [])

        plain = create_gpu_node(k8s, plain_name, gpus=2).to_dict()
        assert plain["status"]["capacity"][contract.RESOURCE_NVIDIA_GPU] == "2"
        assert contract.RESOURCE_GPU_MEMORY not in plain["status"]["capacity"]
    finally:
        for node_name in (name, plain_name):
            with contextlib.suppress(client.ApiException):
                client.CoreV1Api(k8s).delete_node(node_name)


@pytest.mark.k8s
def test_admission_taints_new_nodes_not_ready(k8s: client.ApiClient) -> None:
    """The taint create_gpu_node lifts is really added by the API server."""
    core = client.CoreV1Api(k8s)
    name = unique_name("bare-node")
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name)))
    try:
        taints = core.read_node(name).to_dict()["spec"]["taints"] or []
        assert [(t["key"], t["effect"]) for t in taints] == [(TAINT_NOT_READY, "NoSchedule")]
    finally:
        core.delete_node(name)


@pytest.mark.k8s
def test_strategic_merge_condition_patch_keeps_kubelet_conditions(k8s: client.ApiClient) -> None:
    core = client.CoreV1Api(k8s)
    name = unique_name("gpu-node")
    create_gpu_node(k8s, name)
    try:
        patch = {
            "status": {
                "conditions": [
                    {
                        "type": contract.ConditionType.GPU_XID_ERROR.value,
                        "status": "True",
                        "reason": contract.xid_reason(79),
                        "message": "GPU 0 fell off the bus",
                        "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ]
            }
        }
        core.patch_node_status(name, patch)
        node = core.read_node_status(name)

        xid = _condition(node, contract.ConditionType.GPU_XID_ERROR)
        assert (xid["status"], xid["reason"]) == ("True", "Xid79")
        ready = _condition(node, "Ready")
        assert (ready["status"], ready["reason"]) == ("True", "KubeletReady")
        for kubelet_type in ("MemoryPressure", "DiskPressure", "PIDPressure"):
            assert _condition(node, kubelet_type)["status"] == "False"
    finally:
        core.delete_node(name)


@pytest.mark.k8s
def test_pod_is_bound_through_the_binding_subresource(k8s: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(k8s)
    node = unique_name("gpu-node")
    create_gpu_node(k8s, node)
    try:
        core.create_namespaced_pod(namespace, simple_pod("worker"))
        binding = client.V1Binding(
            metadata=client.V1ObjectMeta(name="worker"),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=node),
        )
        # The API answers a Status, not a Binding, so the response is not
        # deserialized; an error status still raises ApiException.
        core.create_namespaced_pod_binding("worker", namespace, binding, _preload_content=False)
        pod = core.read_namespaced_pod("worker", namespace).to_dict()
        assert pod["spec"]["node_name"] == node
        scheduled = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
        assert scheduled["status"] == "True"
    finally:
        core.delete_node(node)


def _pdb_status(generation: int, allowed: int, healthy: int) -> dict[str, object]:
    """The status the disruption controller would write (it does not run here)."""
    return {
        "status": {
            "observedGeneration": generation,
            "disruptionsAllowed": allowed,
            "currentHealthy": healthy,
            "desiredHealthy": 1,
            "expectedPods": 1,
        }
    }


@pytest.mark.k8s
def test_eviction_honours_the_pod_disruption_budget(k8s: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(k8s)
    policy = client.PolicyV1Api(k8s)
    node = unique_name("gpu-node")
    create_gpu_node(k8s, node)
    try:
        core.create_namespaced_pod(namespace, simple_pod("trainer", labels={"app": "trainer"}, node_name=node))
        mark_pod_running(k8s, "trainer", namespace)
        pdb = policy.create_namespaced_pod_disruption_budget(
            namespace,
            client.V1PodDisruptionBudget(
                metadata=client.V1ObjectMeta(name="trainer"),
                spec=client.V1PodDisruptionBudgetSpec(
                    min_available=1, selector=client.V1LabelSelector(match_labels={"app": "trainer"})
                ),
            ),
        )
        eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="trainer", namespace=namespace))

        # Status not yet observed: the server refuses until a controller has processed the budget.
        with pytest.raises(client.ApiException) as unprocessed:
            core.create_namespaced_pod_eviction("trainer", namespace, eviction)
        assert _status(unprocessed.value) == 429
        assert "still being processed" in str(unprocessed.value.body)

        generation = pdb.to_dict()["metadata"]["generation"]
        policy.patch_namespaced_pod_disruption_budget_status("trainer", namespace, _pdb_status(generation, 0, 1))
        with pytest.raises(client.ApiException) as blocked:
            core.create_namespaced_pod_eviction("trainer", namespace, eviction)
        assert _status(blocked.value) == 429
        assert "disruption budget" in str(blocked.value.body)
        assert core.read_namespaced_pod("trainer", namespace).to_dict()["metadata"]["deletion_timestamp"] is None

        policy.patch_namespaced_pod_disruption_budget_status("trainer", namespace, _pdb_status(generation, 1, 2))
        core.create_namespaced_pod_eviction("trainer", namespace, eviction)

        # A bound pod terminates gracefully: it waits for its (absent) kubelet.
        pod = core.read_namespaced_pod("trainer", namespace).to_dict()
        assert pod["metadata"]["deletion_timestamp"] is not None
        status = policy.read_namespaced_pod_disruption_budget_status("trainer", namespace).to_dict()["status"]
        assert status["disruptions_allowed"] == 0
        assert "trainer" in (status["disrupted_pods"] or {})

        complete_pod_deletion(k8s, "trainer", namespace)
        assert wait_for(lambda: _gone(lambda: core.read_namespaced_pod("trainer", namespace)))
    finally:
        core.delete_node(node)


@pytest.mark.k8s
def test_namespace_deletion_completes(k8s: client.ApiClient) -> None:
    core = client.CoreV1Api(k8s)
    with temporary_namespace(k8s, "doomed") as ns:
        core.create_namespaced_config_map(ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="data")))
        core.create_namespaced_pod(ns, simple_pod("idle"))
    # temporary_namespace deleted it; the namespace controller empties it and removes the finalizer.
    assert wait_for(
        lambda: _gone(lambda: core.read_namespace(ns)),
        timeout=CONTROLLER_TIMEOUT_S,
        interval=0.2,
        description=f"namespace {ns} deleted",
    )


@pytest.mark.k8s
def test_owned_object_is_garbage_collected(k8s: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(k8s)
    owner = core.create_namespaced_config_map(namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner")))
    uid = owner.to_dict()["metadata"]["uid"]
    ref = client.V1OwnerReference(api_version="v1", kind="ConfigMap", name="owner", uid=uid)
    core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owned", owner_references=[ref]))
    )
    core.delete_namespaced_config_map("owner", namespace)
    assert wait_for(
        lambda: _gone(lambda: core.read_namespaced_config_map("owned", namespace)),
        timeout=CONTROLLER_TIMEOUT_S,
        interval=0.2,
        description="owned ConfigMap garbage-collected",
    )


@pytest.mark.k8s
def test_impersonated_service_account_has_its_identity_and_only_its_rbac(
    control_plane: ControlPlane, k8s: client.ApiClient, namespace: str
) -> None:
    with control_plane.impersonate("reader", namespace) as api:
        review = client.AuthenticationV1Api(api).create_self_subject_review(client.V1SelfSubjectReview())
        info = review.to_dict()["status"]["user_info"]
        assert info["username"] == f"system:serviceaccount:{namespace}:reader"
        expected = {"system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"}
        assert set(info["groups"]) == expected

        core = client.CoreV1Api(api)
        with pytest.raises(client.ApiException) as denied:
            core.list_namespaced_config_map(namespace)
        assert _status(denied.value) == 403

        rbac = client.RbacAuthorizationV1Api(k8s)
        rbac.create_namespaced_role(
            namespace,
            client.V1Role(
                metadata=client.V1ObjectMeta(name="read-configmaps"),
                rules=[client.V1PolicyRule(api_groups=[""], resources=["configmaps"], verbs=["list"])],
            ),
        )
        rbac.create_namespaced_role_binding(
            namespace,
            client.V1RoleBinding(
                metadata=client.V1ObjectMeta(name="reader"),
                role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="read-configmaps"),
                subjects=[client.RbacV1Subject(kind="ServiceAccount", name="reader", namespace=namespace)],
            ),
        )
        wait_for(lambda: core.list_namespaced_config_map(namespace), ignore=(client.ApiException,))
        with pytest.raises(client.ApiException) as still_denied:
            core.list_namespaced_pod(namespace)
        assert _status(still_denied.value) == 403


@pytest.mark.k8s
def test_kubectl_runs_with_the_admin_kubeconfig(control_plane: ControlPlane) -> None:
    version = control_plane.kubectl("version", "-o", "json")
    assert '"serverVersion"' in version.stdout
    assert '"gitVersion"' in version.stdout
    assert control_plane.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"

    created = control_plane.kubectl(
        "apply", "-f", "-", input="apiVersion: v1\nkind: Namespace\nmetadata:\n  name: " + unique_name("kubectl") + "\n"
    )
    assert "created" in created.stdout

    with pytest.raises(KubectlError, match=r"(?s)NotFound|not found") as err:
        control_plane.kubectl("get", "node", unique_name("absent"))
    assert err.value.returncode != 0
    unchecked = control_plane.kubectl("get", "node", unique_name("absent"), check=False)
    assert unchecked.returncode != 0
    assert "not found" in unchecked.stderr


@pytest.mark.k8s
def test_api_server_restart_keeps_data_and_port(control_plane: ControlPlane, k8s: client.ApiClient) -> None:
    core = client.CoreV1Api(k8s)
    name = unique_name("survivor")
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    server = control_plane.server

    control_plane.stop_apiserver()
    try:
        assert not control_plane.apiserver_running()
        with pytest.raises(urllib3.exceptions.MaxRetryError):
            core.read_namespace(name, _request_timeout=2)
    finally:
        control_plane.start_apiserver()

    assert control_plane.server == server
    assert control_plane.apiserver_running()
    assert core.read_namespace(name).to_dict()["metadata"]["name"] == name
    core.delete_namespace(name)
