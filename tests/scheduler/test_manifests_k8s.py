"""The scheduler's CRDs applied to the real API server.

What the schemas promise is only true if the API server enforces it: bad
quotas, weights, gang sizes and preemptibility are refused with a message a
person can act on; status is written only through its subresource; the
printer columns show what people look for; and the example queue tree both
applies and reads into the engine without a problem.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from gpuwarden import contract
from scheduler.cluster.queues import podgroup_spec, queue_from_object
from scheduler.engine.fairshare import build_tree
from scheduler.engine.model import UNGOVERNED, Queue
from tests.harness import ControlPlane, unique_name

pytestmark = pytest.mark.k8s

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests" / "scheduler"
EXAMPLE_QUEUES = MANIFESTS / "examples" / "queues.yaml"
GROUP = contract.SCHEDULING_API_GROUP
VERSION = contract.SCHEDULING_API_VERSION
API_VERSION = f"{GROUP}/{VERSION}"
QUEUE_CRD = f"{contract.QUEUE_PLURAL}.{GROUP}"
PODGROUP_CRD = f"{contract.PODGROUP_PLURAL}.{GROUP}"


@pytest.fixture
def custom(k8s: client.ApiClient, scheduler_crds: None) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(k8s)


@contextlib.contextmanager
def queues_deleted(custom: client.CustomObjectsApi, *names: str) -> Iterator[None]:
    try:
        yield
    finally:
        for name in names:
            with contextlib.suppress(client.ApiException):
                custom.delete_cluster_custom_object(GROUP, VERSION, contract.QUEUE_PLURAL, name)


def queue_manifest(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": contract.QUEUE_KIND, "metadata": {"name": name}, "spec": spec}


def podgroup_manifest(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": contract.PODGROUP_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def _table(text: str) -> list[list[str]]:
    """kubectl's table as cells: columns split where the header's words start."""
    lines = text.rstrip("\n").split("\n")
    header = lines[0]
    starts = [0, *(i for i in range(2, len(header)) if header[i] != " " and header[i - 2 : i] == "  ")]
    ends = [*starts[1:], None]
    return [[line[s:e].strip() for s, e in zip(starts, ends, strict=True)] for line in lines]


def _crd(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc


def test_the_crds_carry_the_contract_names(control_plane: ControlPlane) -> None:
    docs = [d for d in yaml.safe_load_all(control_plane.kubectl("kustomize", str(MANIFESTS / "crds")).stdout) if d]
    assert {(d["kind"], d["metadata"]["name"]) for d in docs} == {
        ("CustomResourceDefinition", QUEUE_CRD),
        ("CustomResourceDefinition", PODGROUP_CRD),
    }
    queue = _crd(MANIFESTS / "crds" / "crd-queues.yaml")["spec"]
    podgroup = _crd(MANIFESTS / "crds" / "crd-podgroups.yaml")["spec"]
    assert (queue["group"], queue["scope"], queue["names"]["kind"], queue["names"]["plural"]) == (
        GROUP,
        "Cluster",
        contract.QUEUE_KIND,
        contract.QUEUE_PLURAL,
    )
    assert (podgroup["group"], podgroup["scope"], podgroup["names"]["kind"], podgroup["names"]["plural"]) == (
        GROUP,
        "Namespaced",
        contract.PODGROUP_KIND,
        contract.PODGROUP_PLURAL,
    )
    (qv,) = queue["versions"]
    (pv,) = podgroup["versions"]
    assert qv["name"] == pv["name"] == VERSION
    qspec = qv["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert set(qspec) == {
        contract.QUEUE_SPEC_PARENT,
        contract.QUEUE_SPEC_PRIORITY,
        contract.QUEUE_SPEC_NODE_POOL,
        contract.QUEUE_SPEC_RESOURCES,
    }
    resources = qspec[contract.QUEUE_SPEC_RESOURCES]["properties"]
    assert set(resources) == {contract.QUEUE_RESOURCE_GPU, contract.QUEUE_RESOURCE_CPU, contract.QUEUE_RESOURCE_MEMORY}
    for setting in resources.values():
        assert set(setting["properties"]) == {
            contract.QUEUE_RESOURCE_QUOTA,
            contract.QUEUE_RESOURCE_LIMIT,
            contract.QUEUE_RESOURCE_OVER_QUOTA_WEIGHT,
        }
    qstatus = qv["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert set(qstatus) == {
        contract.QUEUE_STATUS_FAIR_SHARE,
        contract.QUEUE_STATUS_GUARANTEED,
        contract.QUEUE_STATUS_ALLOCATED,
        contract.QUEUE_STATUS_ALLOCATED_NON_PREEMPTIBLE,
        contract.QUEUE_STATUS_REQUESTED,
        contract.QUEUE_STATUS_GPU_SECONDS_LOST,
        contract.STATUS_CONDITIONS,
        contract.STATUS_OBSERVED_GENERATION,
    }
    pspec = pv["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert set(pspec) == {
        contract.PODGROUP_SPEC_MIN_MEMBER,
        contract.PODGROUP_SPEC_QUEUE,
        contract.PODGROUP_SPEC_PRIORITY_CLASS_NAME,
        contract.PODGROUP_SPEC_PREEMPTIBILITY,
    }
    assert pspec[contract.PODGROUP_SPEC_PREEMPTIBILITY]["enum"] == [p.value for p in contract.Preemptibility]
    pstatus = pv["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert set(pstatus) == {
        contract.PODGROUP_STATUS_PHASE,
        contract.PODGROUP_STATUS_SCHEDULED,
        contract.PODGROUP_STATUS_RESERVATIONS,
        contract.STATUS_CONDITIONS,
        contract.STATUS_OBSERVED_GENERATION,
    }
    assert pstatus[contract.PODGROUP_STATUS_PHASE]["enum"] == [p.value for p in contract.PodGroupPhase]
    reason_column = next(c for c in pv["additionalPrinterColumns"] if c["name"] == "Reason")
    assert contract.PodGroupConditionType.UNSCHEDULABLE in reason_column["jsonPath"]


def test_a_valid_queue_is_accepted_and_printed_with_its_share(
    control_plane: ControlPlane, custom: client.CustomObjectsApi
) -> None:
    parent, child = unique_name("dept"), unique_name("proj")
    with queues_deleted(custom, child, parent):
        custom.create_cluster_custom_object(
            GROUP, VERSION, contract.QUEUE_PLURAL, queue_manifest(parent, {"resources": {"gpu": {"quota": 16}}})
        )
        spec = {
            "parentQueue": parent,
            "priority": 10,
            "nodePool": "a100",
            "resources": {
                "gpu": {"quota": 2.5, "limit": 8, "overQuotaWeight": 2},
                "cpu": {"quota": "500m", "limit": 64},
                "memory": {"quota": "64Gi", "limit": "1.5Ti", "overQuotaWeight": 0},
            },
        }
        custom.create_cluster_custom_object(GROUP, VERSION, contract.QUEUE_PLURAL, queue_manifest(child, spec))
        status = {
            "fairShare": {"gpu": 4, "cpu": "1500m", "memory": "64Gi"},
            "guaranteed": {"gpu": 2.5, "cpu": "500m", "memory": "64Gi"},
            "allocated": {"gpu": 3.5, "cpu": "1", "memory": "32Gi"},
            "allocatedNonPreemptible": {"gpu": 1},
            "requested": {"gpu": 6, "cpu": 2, "memory": "128Gi"},
            "conditions": [
                {
                    "type": contract.QueueConditionType.QUOTA_NOT_BACKED,
                    "status": "True",
                    "reason": contract.QueueConditionReason.QUOTA_EXCEEDS_CAPACITY,
                    "message": "gpu quota 16 GPUs, healthy capacity 12 GPUs: 4 GPUs short",
                    "lastTransitionTime": "2025-01-01T00:00:00Z",
                }
            ],
        }
        custom.patch_cluster_custom_object_status(GROUP, VERSION, contract.QUEUE_PLURAL, child, {"status": status})
        stored = custom.get_cluster_custom_object(GROUP, VERSION, contract.QUEUE_PLURAL, child)
        assert stored["spec"] == spec
        assert stored["status"]["conditions"][0]["type"] == "QuotaNotBacked"
        assert stored["status"]["guaranteed"] == status["guaranteed"]  # in the schema: not pruned
        # What the API server stores reads into the engine as written.
        engine = queue_from_object(stored)
        assert isinstance(engine, Queue), engine
        assert (engine.gpu.quota, engine.cpu.quota, engine.memory.limit) == (2500, 500, 1536 * 1024)

        rows = _table(control_plane.kubectl("get", "queues", parent, child).stdout)
        assert rows[0] == ["NAME", "PARENT", "GPU QUOTA", "GPU LIMIT", "GUARANTEED", "FAIR SHARE", "ALLOCATED", "AGE"]
        by_name = {r[0]: r for r in rows[1:]}
        assert by_name[child][1:7] == [parent, "2.5", "8", "2.5", "4", "3.5"]
        assert by_name[parent][1:7] == ["", "16", "", "", "", ""]
        wide = _table(control_plane.kubectl("get", "queues", child, "-o", "wide").stdout)
        assert wide[0][-3:] == ["POOL", "PRIORITY", "AGE"]
        assert wide[1][-3:-1] == ["a100", "10"]


def test_a_valid_podgroup_is_accepted_and_printed_with_its_reason(
    control_plane: ControlPlane, custom: client.CustomObjectsApi, namespace: str
) -> None:
    spec = {"minMember": 4, "queue": "vision", "priorityClassName": "train", "preemptibility": "non-preemptible"}
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, contract.PODGROUP_PLURAL, podgroup_manifest("train", namespace, spec)
    )
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, contract.PODGROUP_PLURAL, podgroup_manifest("serve", namespace, {"queue": "nlp"})
    )
    status = {
        "phase": contract.PodGroupPhase.PENDING,
        "scheduled": 0,
        "conditions": [
            {
                "type": contract.PodGroupConditionType.UNSCHEDULABLE,
                "status": "True",
                "reason": contract.UnschedulableReason.OVER_LIMIT,
                "message": "queue vision has a gpu limit of 8 GPUs; it holds 6 GPUs and this needs 4 GPUs",
                "lastTransitionTime": "2025-01-01T00:00:00Z",
            }
        ],
    }
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, contract.PODGROUP_PLURAL, "train", {"status": status}
    )
    stored = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, contract.PODGROUP_PLURAL, "train")
    assert podgroup_spec(stored) == (4, "vision", "train", False)
    rows = _table(control_plane.kubectl("get", "podgroups", "-n", namespace).stdout)
    assert rows[0] == ["NAME", "QUEUE", "MINMEMBER", "PHASE", "REASON", "AGE"]
    by_name = {r[0]: r for r in rows[1:]}
    assert by_name["train"][1:5] == ["vision", "4", "Pending", "OverLimit"]
    assert by_name["serve"][1:5] == ["nlp", "", "", ""]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"resources": {"gpu": {"quota": -1}}}, "spec.resources.gpu.quota: Invalid value: -1"),
        ({"resources": {"gpu": {"limit": 2_000_000}}}, "spec.resources.gpu.limit: Invalid value"),
        ({"resources": {"gpu": {"overQuotaWeight": -0.5}}}, "spec.resources.gpu.overQuotaWeight: Invalid value"),
        ({"resources": {"gpu": {"overQuotaWeight": 2e6}}}, "spec.resources.gpu.overQuotaWeight: Invalid value"),
        ({"resources": {"gpu": {"quota": 8, "limit": 4}}}, "limit must not be below quota"),
        ({"resources": {"cpu": {"quota": "8", "limit": "500m"}}}, "limit must not be below quota"),
        ({"resources": {"cpu": {"quota": -2}}}, "spec.resources.cpu.quota: Invalid value: -2"),
        ({"resources": {"cpu": {"quota": "-2"}}}, 'spec.resources.cpu.quota: Invalid value: "-2"'),
        ({"resources": {"cpu": {"quota": 1.5}}}, "spec.resources.cpu.quota"),
        ({"resources": {"memory": {"quota": "64GB"}}}, 'spec.resources.memory.quota: Invalid value: "64GB"'),
        ({"priority": 2_000_000}, "spec.priority: Invalid value"),
        ({"parentQueue": ""}, "spec.parentQueue: Invalid value"),
    ],
)
def test_an_invalid_queue_is_refused_with_a_message(
    control_plane: ControlPlane, custom: client.CustomObjectsApi, spec: dict[str, Any], message: str
) -> None:
    name = unique_name("bad")
    with queues_deleted(custom, name):
        result = control_plane.kubectl("apply", "-f", "-", input=json.dumps(queue_manifest(name, spec)), check=False)
    assert result.returncode != 0, result.stdout
    assert message in result.stderr


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"queue": "q", "minMember": 0}, "spec.minMember: Invalid value: 0"),
        ({"queue": "q", "minMember": -3}, "spec.minMember: Invalid value: -3"),
        ({"queue": "q", "preemptibility": "sometimes"}, 'spec.preemptibility: Unsupported value: "sometimes"'),
        ({"minMember": 2}, "spec.queue: Required value"),
        ({"queue": ""}, "spec.queue: Invalid value"),
    ],
)
def test_an_invalid_podgroup_is_refused_with_a_message(
    control_plane: ControlPlane, scheduler_crds: None, namespace: str, spec: dict[str, Any], message: str
) -> None:
    manifest = podgroup_manifest("bad", namespace, spec)
    result = control_plane.kubectl("apply", "-f", "-", input=json.dumps(manifest), check=False)
    assert result.returncode != 0, result.stdout
    assert message in result.stderr


def test_status_is_written_only_through_its_subresource(custom: client.CustomObjectsApi, namespace: str) -> None:
    name = unique_name("status")
    with queues_deleted(custom, name):
        body = queue_manifest(name, {"resources": {"gpu": {"quota": 4}}})
        body["status"] = {"fairShare": {"gpu": 100}}
        created = custom.create_cluster_custom_object(GROUP, VERSION, contract.QUEUE_PLURAL, body)
        assert "status" not in created
        patched = custom.patch_cluster_custom_object(
            GROUP, VERSION, contract.QUEUE_PLURAL, name, {"spec": {"priority": 3}, "status": {"fairShare": {"gpu": 9}}}
        )
        assert patched["spec"]["priority"] == 3
        assert "status" not in patched
        # And the other way round: a status write leaves the spec alone.
        written = custom.patch_cluster_custom_object_status(
            GROUP,
            VERSION,
            contract.QUEUE_PLURAL,
            name,
            {"spec": {"priority": 7}, "status": {"fairShare": {"gpu": 2}}},
        )
        assert written["spec"]["priority"] == 3
        assert written["status"]["fairShare"] == {"gpu": 2}
        assert written["metadata"]["generation"] == patched["metadata"]["generation"]

    custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        contract.PODGROUP_PLURAL,
        {**podgroup_manifest("pg", namespace, {"queue": "q"}), "status": {"phase": "Running"}},
    )
    group = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, contract.PODGROUP_PLURAL, "pg")
    assert "status" not in group


def test_the_example_tree_applies_and_reads_into_the_engine(
    control_plane: ControlPlane, custom: client.CustomObjectsApi
) -> None:
    names = [d["metadata"]["name"] for d in yaml.safe_load_all(EXAMPLE_QUEUES.read_text()) if d]
    with queues_deleted(custom, *names):
        control_plane.kubectl("apply", "--validate=strict", "-f", str(EXAMPLE_QUEUES))
        items = custom.list_cluster_custom_object(GROUP, VERSION, contract.QUEUE_PLURAL)["items"]
        stored = [o for o in items if o["metadata"]["name"] in names]
        assert len(stored) == len(names) == 6
        queues = [queue_from_object(o) for o in stored]
        problems = [q for q in queues if isinstance(q, str)]
        assert not problems
        engine = [q for q in queues if isinstance(q, Queue)]
        tree = build_tree(engine)
        assert tree.errors == {}
        assert sorted(n for n, t in tree.queues.items() if t.is_leaf) == ["ci", "nlp", "serving", "vision"]
        assert sorted(t.name for t in tree.roots["default"]) == ["platform", "research"]
        # GPU quotas alone: CPU and memory are not governed anywhere.
        assert all(q.cpu == UNGOVERNED and q.memory == UNGOVERNED and q.gpu.governed for q in engine)


ALL = MANIFESTS.parent
SCHEDULER_SA = "system:serviceaccount:gpuwarden:gpuwarden-scheduler"


def _can(control_plane: ControlPlane, *args: str) -> bool:
    result = control_plane.kubectl("auth", "can-i", *args, f"--as={SCHEDULER_SA}", check=False)
    return result.stdout.strip() == "yes"


def test_one_overlay_installs_agent_and_scheduler_with_least_privilege(
    control_plane: ControlPlane, k8s: client.ApiClient, scheduler_crds: None
) -> None:
    control_plane.kubectl("apply", "-k", str(ALL))
    # Fail-closed with no webhook behind it: it would refuse the session's later slice pods.
    control_plane.kubectl("delete", "mutatingwebhookconfiguration", contract.WEBHOOK_COMPONENT, "--ignore-not-found")
    apps = client.AppsV1Api(k8s)
    deployment = apps.read_namespaced_deployment("gpuwarden-scheduler", "gpuwarden")
    assert deployment.spec.replicas == 2
    assert deployment.spec.template.spec.service_account_name == "gpuwarden-scheduler"
    assert deployment.spec.template.spec.containers[0].args == ["scheduler"]
    # The admission webhook runs beside it in every replica, leader or not.
    webhook = deployment.spec.template.spec.containers[1]
    assert webhook.args == ["webhook"] and webhook.readiness_probe.http_get.scheme == "HTTPS"
    assert apps.read_namespaced_daemon_set("gpuwarden-agent", "gpuwarden").spec.template.spec.containers[0].args == [
        "agent"
    ]
    # What a cycle does beyond binding and evicting: PodGroups for workloads
    # that name none, and a pod's owners read to size its gang.
    assert _can(control_plane, "create", "podgroups.scheduling.gpuwarden.io", "-n", "team-a")
    assert _can(control_plane, "get", "jobs.batch", "-n", "team-a")
    assert _can(control_plane, "update", "leases.coordination.k8s.io", "-n", "gpuwarden")
    # A slice pod's ConfigMap, written blind; the webhook's own Secret and configuration by name.
    assert _can(control_plane, "create", "configmaps", "-n", "team-a")
    assert _can(control_plane, "patch", "configmaps", "-n", "team-a")
    assert _can(control_plane, "update", "secrets/gpuwarden-webhook-tls", "-n", "gpuwarden")
    assert _can(control_plane, "patch", f"mutatingwebhookconfigurations/{contract.WEBHOOK_COMPONENT}")
    assert not _can(control_plane, "get", "configmaps", "-n", "team-a")
    assert not _can(control_plane, "get", "secrets", "-n", "gpuwarden")
    assert not _can(control_plane, "create", "secrets", "-n", "gpuwarden")
    assert not _can(control_plane, "patch", "mutatingwebhookconfigurations/someone-elses")
    # And nothing it does not need.
    assert not _can(control_plane, "get", "secrets", "-n", "team-a")
    assert not _can(control_plane, "update", "leases.coordination.k8s.io", "-n", "kube-system")
    # Remediation cordons and annotates Nodes and asks agents through GPUNode spec,
    # never writing either's status (health is the agent's).
    assert _can(control_plane, "patch", "nodes")
    assert _can(control_plane, "patch", "gpunodes.gpuwarden.io")
    assert not _can(control_plane, "patch", "nodes", "--subresource=status")
    assert not _can(control_plane, "patch", "gpunodes.gpuwarden.io", "--subresource=status")
    assert not _can(control_plane, "list", "jobs.batch", "-n", "team-a")
    # Owners of kinds this cluster does not serve (no Kubeflow here) are granted by name.
    role = client.RbacAuthorizationV1Api(k8s).read_cluster_role("gpuwarden-scheduler")
    assert any(
        "kubeflow.org" in r.api_groups and "pytorchjobs" in r.resources and r.verbs == ["get"] for r in role.rules
    )
