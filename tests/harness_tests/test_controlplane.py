"""The test control plane behaves like a cluster in the ways gpuwarden relies on.

Every other Kubernetes test trusts these behaviours (binding, eviction with
PodDisruptionBudgets, garbage collection, namespace deletion, kubectl, an
API-server restart that keeps its data); if the harness got one wrong, those
tests would pass against a cluster that does not exist. The fake kubelet and
impersonation have their own test modules.
"""

from __future__ import annotations

import base64
from typing import cast

import pytest
import urllib3
import yaml
from kubernetes import client, config

from tests.harness import (
    ControlPlane,
    KubectlError,
    complete_pod_deletion,
    create_gpu_node,
    mark_pod_running,
    running_control_plane,
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


class _StubPlane:
    def __init__(self) -> None:
        self.stops = 0

    def stop(self) -> None:
        self.stops += 1


def test_running_control_plane_stops_it_when_the_block_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scripts rely on the context manager alone to leave no servers behind."""
    stub = _StubPlane()
    monkeypatch.setattr(ControlPlane, "start", classmethod(lambda cls, binaries=None: stub))
    with pytest.raises(KeyboardInterrupt), running_control_plane() as plane:
        assert cast(object, plane) is stub
        raise KeyboardInterrupt
    assert stub.stops == 1


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
