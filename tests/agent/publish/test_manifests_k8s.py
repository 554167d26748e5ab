"""The shipped manifests applied to the real API server, and the agent's RBAC proven.

The agent runs as its ServiceAccount (impersonated, so RBAC decides exactly
as for the pod's token): everything it publishes works, and what it must not
do -- patch a pod, read a secret, change the Node's spec -- is refused.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from agent.config import config_from_dict
from agent.publish.settings import DEFAULT_EVENTS_NAMESPACE
from agent.sim.node import SimNode
from agent.sim.scenario import load_scenario
from gpuwarden import contract
from gpuwarden.kube import KubeApi
from tests.agent.publish.conftest import AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT, MANIFESTS, SimAgent
from tests.harness import ControlPlane, simple_pod, wait_for

pytestmark = pytest.mark.k8s

MONITORING_CRDS = Path(__file__).resolve().parent / "fixtures" / "monitoring-crds.yaml"


def _rendered(control_plane: ControlPlane, path: Path) -> list[dict[str, Any]]:
    out = control_plane.kubectl("kustomize", str(path)).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_base_applies_and_its_objects_are_served(control_plane: ControlPlane, agent_manifests: None) -> None:
    docs = _rendered(control_plane, MANIFESTS)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert kinds == {
        ("Namespace", AGENT_NAMESPACE),
        ("CustomResourceDefinition", f"{contract.GPUNODE_PLURAL}.{contract.API_GROUP}"),
        ("ServiceAccount", AGENT_SERVICE_ACCOUNT),
        ("ConfigMap", "gpuwarden-agent"),
        ("ClusterRole", "gpuwarden-agent"),
        ("ClusterRoleBinding", "gpuwarden-agent"),
        ("Role", "gpuwarden-agent-events"),
        ("RoleBinding", "gpuwarden-agent-events"),
        ("DaemonSet", "gpuwarden-agent"),
        ("Service", "gpuwarden-agent"),
        ("ValidatingAdmissionPolicy", "gpuwarden-agent-node-status"),
        ("ValidatingAdmissionPolicyBinding", "gpuwarden-agent-node-status"),
        ("ValidatingAdmissionPolicy", "gpuwarden-agent-gpunodes"),
        ("ValidatingAdmissionPolicyBinding", "gpuwarden-agent-gpunodes"),
        ("ValidatingAdmissionPolicy", "gpuwarden-agent-events"),
        ("ValidatingAdmissionPolicyBinding", "gpuwarden-agent-events"),
        # The scheduler's half of the base (manifests/scheduler/, tested in tests/scheduler/).
        ("CustomResourceDefinition", f"{contract.QUEUE_PLURAL}.{contract.SCHEDULING_API_GROUP}"),
        ("CustomResourceDefinition", f"{contract.PODGROUP_PLURAL}.{contract.SCHEDULING_API_GROUP}"),
        ("ServiceAccount", "gpuwarden-scheduler"),
        ("ClusterRole", "gpuwarden-scheduler"),
        ("ClusterRoleBinding", "gpuwarden-scheduler"),
        ("Role", "gpuwarden-scheduler-leader-election"),
        ("RoleBinding", "gpuwarden-scheduler-leader-election"),
        ("Deployment", "gpuwarden-scheduler"),
        ("Service", "gpuwarden-scheduler"),
        # What the scheduler's token may change, and the lease fence (manifests/scheduler/admission-policy.yaml).
        *(
            (kind, f"gpuwarden-scheduler-{name}")
            for name in (
                "nodes",
                "gpunodes",
                "configmaps",
                "webhook-configuration",
                "pod-status",
                "podgroups",
                "pod-deletion",
                "device-taint-rules",
                "resource-claims",
                "fence",
            )
            for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
        ),
        # The scheduler's admission webhook for GPU-sharing pods.
        ("Service", "gpuwarden-webhook"),
        ("Secret", "gpuwarden-webhook-tls"),
        ("MutatingWebhookConfiguration", "gpuwarden-webhook"),
        ("Role", "gpuwarden-webhook"),
        ("RoleBinding", "gpuwarden-webhook"),
        ("ClusterRole", "gpuwarden-webhook"),
        ("ClusterRoleBinding", "gpuwarden-webhook"),
        # What keeps a pod's GPU-sharing annotations as they were created.
        ("ValidatingAdmissionPolicy", "gpuwarden-gpu-sharing-fixed"),
        ("ValidatingAdmissionPolicyBinding", "gpuwarden-gpu-sharing-fixed"),
    }
    # As the API server stores it (defaults applied), not as written.
    ds = _get_json(control_plane, "daemonset")
    pod = ds["spec"]["template"]["spec"]
    # It tolerates the quarantine taint and any other, NoExecute included.
    for taint in (contract.TAINT_QUARANTINE, "nvidia.com/gpu", "example.com/someone-elses"):
        assert any(
            t.get("operator") == "Exists" and t.get("key") in (None, taint) and t.get("effect") in (None, "NoExecute")
            for t in pod["tolerations"]
        ), taint
    container = pod["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["resources"]["requests"]
    assert container["resources"]["limits"]
    env = {e["name"]: e for e in container["env"]}
    assert env["GPUWARDEN_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["sys"]["readOnly"]
    assert mounts["kmsg"]["readOnly"]
    # The shipped config file is one the agent accepts, and its state file
    # lives on the writable host mount.
    config_map = _get_json(control_plane, "configmap")
    config = config_from_dict(yaml.safe_load(config_map["data"]["agent.yaml"]))
    assert env["GPUWARDEN_CONFIG"]["value"] == mounts["config"]["mountPath"] + "/agent.yaml"
    assert config.gpu.state_file is not None
    assert config.gpu.state_file.startswith(mounts["state"]["mountPath"] + "/")
    # Every GPUWARDEN_* variable the DaemonSet sets backs a flag of `gpuwarden agent`.
    assert {n for n in env if n.startswith("GPUWARDEN_")} <= _agent_flag_envs()


def _agent_flag_envs() -> set[str]:
    from gpuwarden.cli import build_parser
    from gpuwarden.flags import env_name

    top = build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    parsers = [top, sub.choices["agent"]]
    return {env_name(opt) for p in parsers for a in p._actions for opt in a.option_strings if opt.startswith("--")}


def test_cluster_role_grants_only_get_on_pods_and_nothing_on_secrets(control_plane: ControlPlane) -> None:
    docs = _rendered(control_plane, MANIFESTS)
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    resources = {r for rule in role["rules"] for r in rule["resources"]}
    assert resources == {"nodes", "nodes/status", "gpunodes", "gpunodes/status", "pods"}
    # The GPU holders' uid and scheduler, read by name: no list or watch of the cluster's pods.
    assert [rule["verbs"] for rule in role["rules"] if "pods" in rule["resources"]] == [["get"]]
    # Events only where Node Events live, not cluster-wide.
    events = next(d for d in docs if d["kind"] == "Role")
    assert events["metadata"]["namespace"] == DEFAULT_EVENTS_NAMESPACE
    assert [r["resources"] for r in events["rules"]] == [["events"]]
    binding = next(d for d in docs if d["kind"] == "RoleBinding")
    assert binding["metadata"]["namespace"] == DEFAULT_EVENTS_NAMESPACE
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": AGENT_SERVICE_ACCOUNT, "namespace": AGENT_NAMESPACE}
    ]
    for rule in [*role["rules"], *events["rules"]]:
        assert "*" not in rule["verbs"]
        assert "delete" not in rule["verbs"]
        if "nodes/status" in rule["resources"]:
            assert rule["verbs"] == ["patch"]


@pytest.fixture(scope="module")
def monitoring_crds(control_plane: ControlPlane, agent_manifests: None) -> Iterator[None]:
    """prometheus-operator's CRDs, once for the module: deleted and re-applied per test, a CRD
    still being deleted would swallow the next test's apply."""
    control_plane.kubectl("apply", "-f", str(MONITORING_CRDS))
    for crd in ("servicemonitors.monitoring.coreos.com", "prometheusrules.monitoring.coreos.com"):
        control_plane.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")
    try:
        yield
    finally:
        control_plane.kubectl("delete", "-f", str(MONITORING_CRDS), "--ignore-not-found", "--wait=false", check=False)


def test_monitoring_objects_apply_with_strict_validation(control_plane: ControlPlane, monitoring_crds: None) -> None:
    path = str(MANIFESTS / "monitoring")
    try:
        control_plane.kubectl("apply", "--validate=strict", "-k", path)
        rule = json.loads(
            control_plane.kubectl(
                "get", "prometheusrule", "gpuwarden-agent", "-n", AGENT_NAMESPACE, "-o", "json"
            ).stdout
        )
        rules_file = yaml.safe_load((MANIFESTS / "monitoring" / "gpuwarden-rules.yaml").read_text())
        assert rule["spec"] == rules_file
        # The dashboard, for Grafana's sidecar: its label, and the file as it is.
        dashboard = json.loads(
            control_plane.kubectl("get", "configmap", "gpuwarden-dashboard", "-n", AGENT_NAMESPACE, "-o", "json").stdout
        )
        assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
        shipped = (MANIFESTS / "monitoring" / "gpuwarden-dashboard.json").read_text()
        assert dashboard["data"] == {"gpuwarden-dashboard.json": shipped}
        for name in ("gpuwarden-agent", "gpuwarden-scheduler"):
            monitor = json.loads(
                control_plane.kubectl("get", "servicemonitor", name, "-n", AGENT_NAMESPACE, "-o", "json").stdout
            )
            service = json.loads(
                control_plane.kubectl("get", "service", name, "-n", AGENT_NAMESPACE, "-o", "json").stdout
            )
            # Each ServiceMonitor selects its Service and scrapes its named port.
            assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
            assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
            relabel = monitor["spec"]["endpoints"][0]["relabelings"]
            assert {"targetLabel": "job", "replacement": name, "action": "replace"} in relabel
    finally:
        control_plane.kubectl("delete", "-k", path, "--ignore-not-found", "--wait=false", check=False)


def test_secure_metrics_component_turns_the_agent_and_its_scrape_to_authenticated_tls(
    control_plane: ControlPlane, monitoring_crds: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An overlay as the component's header describes it: base, monitoring and the component.
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    root = Path(os.path.relpath(MANIFESTS, overlay))
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [str(root), str(root / "monitoring")],
                "components": [str(root / "secure-metrics")],
            }
        )
    )
    docs = _rendered(control_plane, overlay)
    # Valid for the API server, strictly, without changing what the session applied.
    control_plane.kubectl("apply", "--dry-run=server", "--validate=strict", "-k", str(overlay))
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    delegator = by_kind[("ClusterRoleBinding", "gpuwarden-agent-auth-delegator")]
    assert delegator["roleRef"]["name"] == "system:auth-delegator"
    assert delegator["subjects"] == [
        {"kind": "ServiceAccount", "name": AGENT_SERVICE_ACCOUNT, "namespace": AGENT_NAMESPACE}
    ]
    reader = by_kind[("ClusterRole", "gpuwarden-metrics-reader")]
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    # The agent's own ClusterRole is unchanged: the reviews come from the built-in role alone.
    assert by_kind[("ClusterRole", "gpuwarden-agent")] == next(
        d
        for d in _rendered(control_plane, MANIFESTS)
        if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "gpuwarden-agent"
    )

    container = by_kind[("DaemonSet", "gpuwarden-agent")]["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    # The DaemonSet's environment is a valid agent command line, in the mode the component means.
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    from gpuwarden.cli import build_parser
    from gpuwarden.serving import MetricsSecurity, security_from_args

    assert security_from_args(build_parser().parse_args(["agent"])) == MetricsSecurity(tls=True, auth="delegated")

    endpoint = by_kind[("ServiceMonitor", "gpuwarden-agent")]["spec"]["endpoints"][0]
    assert endpoint["scheme"] == "https"
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}
    # Everything else about the scrape (relabelling to the node label) is kept.
    plain = yaml.safe_load((MANIFESTS / "monitoring" / "servicemonitor.yaml").read_text())["spec"]["endpoints"][0]
    assert {k: v for k, v in endpoint.items() if k not in {"scheme", "bearerTokenFile", "tlsConfig"}} == plain


def _get_json(control_plane: ControlPlane, kind: str) -> dict[str, Any]:
    out = control_plane.kubectl("get", kind, "gpuwarden-agent", "-n", AGENT_NAMESPACE, "-o", "json").stdout
    result: dict[str, Any] = json.loads(out)
    return result


def _refused(call: Callable[[], object]) -> int | None:
    try:
        call()
    except client.ApiException as exc:
        status: int | None = exc.status
        return status
    return None


def test_agent_publishes_as_its_service_account_and_is_refused_the_rest(
    control_plane: ControlPlane,
    k8s: client.ApiClient,
    gpu_node: str,
    namespace: str,
) -> None:
    core_admin = client.CoreV1Api(k8s)
    core_admin.create_namespaced_pod(namespace, simple_pod("victim", node_name=gpu_node))
    core_admin.create_namespaced_secret(
        namespace, client.V1Secret(metadata=client.V1ObjectMeta(name="token"), string_data={"k": "v"})
    )
    with control_plane.impersonate(AGENT_SERVICE_ACCOUNT, AGENT_NAMESPACE) as sa:
        # The whole agent, publishing as the ServiceAccount: the default
        # scenario starts with faults, so conditions, capacity, the GPUNode
        # and Events are all written.
        agent = SimAgent(sa, gpu_node, SimNode(load_scenario("default"))).start()
        admin = KubeApi(k8s, field_manager=contract.AGENT_COMPONENT)
        try:
            wait_for(
                lambda: (admin.get_gpunode(gpu_node) or {}).get("status", {}).get("gpuCount") == 8,
                timeout=20,
                description="the agent's GPUNode",
            )
            node: dict[str, Any] = wait_for(
                lambda: _node_with_condition(admin, gpu_node, "GpuMemoryDegraded", "True"),
                timeout=20,
                description="GpuMemoryDegraded True on the node",
            )
            assert node["status"]["capacity"][contract.RESOURCE_GPU_MEMORY] == str(7 * 81559)
            wait_for(lambda: agent.daemon.events.pending() == 0, timeout=20, description="events written")
            assert agent.daemon.stats.snapshot()[1] == {}, "a request of the agent was refused"
        finally:
            agent.stop()
        events = core_admin.list_namespaced_event(
            DEFAULT_EVENTS_NAMESPACE, field_selector=f"involvedObject.name={gpu_node}"
        ).items
        assert {e.reason for e in events} >= {"RowRemapPending", "IbPortDown", "Xid13"}

        core = client.CoreV1Api(sa)
        custom = client.CustomObjectsApi(sa)
        refused = {
            "patch a pod": _refused(
                lambda: core.patch_namespaced_pod("victim", namespace, {"metadata": {"labels": {"a": "b"}}})
            ),
            "list pods": _refused(core.list_pod_for_all_namespaces),
            "read a secret": _refused(lambda: core.read_namespaced_secret("token", namespace)),
            "list secrets": _refused(core.list_secret_for_all_namespaces),
            "patch the node spec": _refused(lambda: core.patch_node(gpu_node, {"spec": {"unschedulable": True}})),
            "delete the node": _refused(lambda: core.delete_node(gpu_node)),
            "replace node status": _refused(lambda: core.replace_node_status(gpu_node, core_admin.read_node(gpu_node))),
            "delete its GPUNode": _refused(
                lambda: custom.delete_cluster_custom_object(
                    contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL, gpu_node
                )
            ),
            "create an Event in a workload's namespace": _refused(
                lambda: core.create_namespaced_event(
                    namespace,
                    client.CoreV1Event(
                        metadata=client.V1ObjectMeta(name="spoof"),
                        involved_object=client.V1ObjectReference(kind="Pod", name="victim", namespace=namespace),
                        reason="Spoofed",
                        message="x",
                    ),
                )
            ),
            "list Events cluster-wide": _refused(core.list_event_for_all_namespaces),
            "evict a pod": _refused(
                lambda: core.create_namespaced_pod_eviction(
                    "victim",
                    namespace,
                    client.V1Eviction(metadata=client.V1ObjectMeta(name="victim", namespace=namespace)),
                )
            ),
        }
        assert refused == dict.fromkeys(refused, 403)


def _node_with_condition(api: KubeApi, name: str, ctype: str, status: str) -> dict[str, Any]:
    """The Node once condition ``ctype`` has ``status``, else an empty dict."""
    node = api.get_node(name) or {}
    for cond in (node.get("status") or {}).get("conditions", []):
        if cond["type"] == ctype and cond["status"] == status:
            return node
    return {}
