"""``kubectl gpuwarden`` against the real API server, over objects the agent and the scheduler wrote.

Nodes carry what the agent publishes (its own publisher functions); Queue and
PodGroup status, reservations, evictions and Events come from real scheduling
cycles, and remediation's labels from real remediation passes, as the leader
runs them. Each command is run as a person runs it, with the control plane's
kubeconfig, and its table and JSON are checked against the objects read back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from gpuwarden import contract
from gpuwarden.contract import Action
from gpuwarden.kube import KubeApi
from gpuwarden.kubectl_plugin.cli import main
from gpuwarden.localcluster import create_gpu_node
from scheduler.cluster.evict import Evictor
from scheduler.cluster.retrying import RetryPolicy
from scheduler.remediation.controller import RemediationController
from scheduler.remediation.policy import ControllerSettings, Settings
from tests.agent.publish.reports import ib_fault, xid_fault
from tests.harness import ControlPlane, complete_pod_deletion, mark_pod_running, running_control_plane, unique_name
from tests.scheduler.cluster.kube_objects import pod, podgroup, publish_health, refusing_pdb
from tests.scheduler.cluster.test_cycle_k8s import new_cycle, view
from tests.scheduler.cluster.test_owner_kinds_k8s import job
from tests.scheduler.remediation.dra_objects import GPUS as DRA_GPUS
from tests.scheduler.remediation.dra_objects import driver_slice

pytestmark = pytest.mark.k8s

REPO = Path(__file__).resolve().parents[3]
DRA = ("resource.k8s.io", "v1")
NO_WAIT = RetryPolicy(attempts=2, sleep=lambda _s: None)
# Three test nodes are a tiny pool: the default breaker (10 % out) would hold back the second quarantine.
TINY_POOL = Settings.from_mapping({"breaker": {"max_out_fraction": 1.0}})


def plugin(control_plane: ControlPlane | Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run ``kubectl gpuwarden ARGS`` with the control plane's kubeconfig: exit status, stdout, stderr."""
    kubeconfig = control_plane if isinstance(control_plane, Path) else control_plane.kubeconfig
    capsys.readouterr()
    code = main([*args, "--kubeconfig", str(kubeconfig), "--context", "admin"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def as_json(control_plane: ControlPlane | Path, capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    code, out, err = plugin(control_plane, capsys, *args, "-o", "json")
    assert code == 0, err
    return json.loads(out)


class Plugin:
    """``kubectl gpuwarden`` pointed at the test control plane."""

    def __init__(self, kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.kubeconfig = kubeconfig
        self.capsys = capsys

    def __call__(self, *args: str) -> tuple[int, str, str]:
        return plugin(self.kubeconfig, self.capsys, *args)

    def json(self, *args: str) -> Any:
        return as_json(self.kubeconfig, self.capsys, *args)


@pytest.fixture
def gw(control_plane: ControlPlane, capsys: pytest.CaptureFixture[str]) -> Plugin:
    return Plugin(control_plane.kubeconfig, capsys)


def rows(table: str) -> dict[str, list[str]]:
    """A table's lines split into cells, by their first cell."""
    return {line.split()[0]: line.split() for line in table.splitlines() if line.strip()}


class Clock:
    """Remediation's clock, moving on a little per pass as real cycles do."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC).timestamp()

    def __call__(self) -> float:
        self.now += 0.5
        return self.now


def remediate(k8s: client.ApiClient, nodes: set[str], passes: int) -> None:
    """Scheduling cycles, each followed by one remediation pass, as the leader runs them."""
    clock = Clock()
    for _ in range(passes):
        new_cycle(k8s).run(view(k8s, nodes))
        current = view(k8s, nodes)
        api = KubeApi(k8s, field_manager=contract.SCHEDULER_COMPONENT)
        controller = RemediationController(
            api, Evictor(api, retry=NO_WAIT), ControllerSettings(machine=TINY_POOL), clock=clock
        )
        assert controller.run(current.nodes, current.gpunodes, list(current.pods.values())).errors == []


def test_nodes_shows_healthy_gpus_conditions_remediation_and_infiniband(
    k8s: client.ApiClient,
    cluster: Callable[[int], list[str]],
    gw: Plugin,
) -> None:
    well, reset, reboot = cluster(3)
    publish_health(k8s, reset, replace(xid_fault(2, 48), action=Action.RESET_GPU))
    publish_health(k8s, reboot, xid_fault(5, 79), ib_fault("mlx5_1"))  # REBOOT and REPLACE: REPLACE wins
    remediate(k8s, {well, reset, reboot}, passes=3)  # quarantine, drain (nothing there), escalate
    stored = {n: client.CoreV1Api(k8s).read_node(n) for n in (reset, reboot)}
    labels = {n: node.metadata.labels for n, node in stored.items()}
    xid_message = next(c.message for c in stored[reboot].status.conditions if c.type == "GpuXidError")

    code, out, err = gw("nodes", well, reset, reboot)
    assert code == 0, err
    table = rows(out)
    assert table["NODE"] == ["NODE", "POOL", "GPUS", "IB", "STATE", "REPAIR", "QUARANTINED", "DRA", "CONDITIONS"]
    assert table[well] == [well, "default", "8/8", "2/2", "healthy", "-", "-", "-", "-"]
    assert table[reset][2:4] == ["7/8", "2/2"]
    assert table[reset][4] == labels[reset][contract.LABEL_REMEDIATION_STATE]
    assert table[reset][4].startswith("gpu-")
    assert table[reset][5:] == ["-", "2", "-", "GpuXidError(Xid48)"]
    assert table[reboot][2:] == [
        "7/8",
        "1/2",
        "escalated,cordoned",
        "REPLACE",
        "-",
        "-",
        "GpuXidError(Xid79),InfinibandDegraded(IbPortDown)",
    ]

    shown = {v["name"]: v for v in gw.json("nodes", well, reset, reboot)}
    assert list(shown) == sorted([well, reset, reboot])
    assert shown[reboot]["state"] == labels[reboot][contract.LABEL_REMEDIATION_STATE] == "escalated"
    assert shown[reboot]["repair_needed"] == labels[reboot][contract.LABEL_REPAIR_NEEDED] == "REPLACE"
    assert shown[reboot]["cordoned"] is True and shown[reboot]["action"] == "REPLACE"
    assert (shown[reboot]["ib_up"], shown[reboot]["ib_total"]) == (1, 2)
    assert [(c["type"], c["reason"]) for c in shown[reboot]["conditions"]] == [
        ("GpuXidError", "Xid79"),
        ("InfinibandDegraded", "IbPortDown"),
    ]
    assert shown[reboot]["conditions"][0]["message"] == xid_message
    assert shown[reset]["quarantined_gpus"] == "2" and shown[reset]["cordoned"] is False
    assert shown[well]["conditions"] == [] and shown[well]["gpus_healthy"] == 8
    assert shown[well]["dra_devices"] is None  # NVIDIA's DRA driver publishes nothing there

    # With no names, every GPU node is listed (other tests' nodes too); a name that is no node is an error.
    listed = {v["name"] for v in gw.json("nodes")}
    assert {well, reset, reboot} <= listed
    code, out, err = gw("nodes", well, "no-such-node")
    assert (code, out) == (1, "")
    assert err == "error: node not found: no-such-node\n"


@pytest.fixture
def tree(k8s: client.ApiClient, scheduler_crds: None) -> Iterator[Callable[[str, dict[str, Any]], str]]:
    """Makes Queues with any spec (a parent, several resources), removed after the test."""
    made: list[str] = []
    custom = client.CustomObjectsApi(k8s)

    def make(prefix: str, spec: dict[str, Any]) -> str:
        name = unique_name(prefix)
        custom.create_cluster_custom_object(
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
        made.append(name)
        return name

    yield make
    for name in reversed(made):
        custom.delete_cluster_custom_object(
            contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION, contract.QUEUE_PLURAL, name
        )


def _queue(k8s: client.ApiClient, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = client.CustomObjectsApi(k8s).get_cluster_custom_object(
        contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION, contract.QUEUE_PLURAL, name
    )
    return obj


def test_queues_shows_the_tree_with_quota_limit_fair_share_and_allocation_per_resource(
    k8s: client.ApiClient,
    namespace: str,
    cluster: Callable[[int], list[str]],
    tree: Callable[[str, dict[str, Any]], str],
    gw: Plugin,
) -> None:
    nodes = set(cluster(1))
    dept = tree("dept", {"resources": {"gpu": {"quota": 8}}})
    team_a = tree(
        "team-a",
        {
            "parentQueue": dept,
            "priority": 10,
            "resources": {"gpu": {"quota": 6, "limit": 8, "overQuotaWeight": 2}, "cpu": {"quota": "16"}},
        },
    )
    team_b = tree("team-b", {"parentQueue": dept, "resources": {"gpu": {"quota": 2}}})
    for i in range(3):  # no PodGroup: the cycle derives one per pod
        pod(k8s, namespace, f"a-{i}", queue=team_a, gpus=1)
    new_cycle(k8s).run(view(k8s, nodes))
    status = {q: _queue(k8s, q)["status"] for q in (dept, team_a, team_b)}
    assert status[team_a]["allocated"]["gpu"] == 3

    code, out, err = gw("queues")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == [
        "QUEUE",
        "RESOURCE",
        "QUOTA",
        "LIMIT",
        "WEIGHT",
        "GUARANTEED",
        "FAIR",
        "SHARE",
        "ALLOCATED",
        "REQUESTED",
        "GPU-S",
        "LOST",
    ]
    mine = [i for i, line in enumerate(lines) if set(line.split()[:1]) & {dept, team_a, team_b}]
    at = {lines[i].split()[0]: i for i in mine}
    # Parents first, children indented under them; team-a's two resources on two lines.
    assert at[dept] < at[team_a] < at[team_b]
    assert lines[at[team_a]].startswith(f"  {team_a}") and lines[at[dept]].startswith(dept)
    share, held = status[team_a]["fairShare"], status[team_a]["allocated"]
    promised = status[team_a]["guaranteed"]
    assert promised["gpu"] == min(6, share["gpu"])  # the quota as far as the fair share backs it
    row = [team_a, "gpu", "6", "8", "2", f"{promised['gpu']:g}", f"{share['gpu']:g}", "3", "3", "-"]
    assert lines[at[team_a]].split() == row
    assert lines[at[team_a] + 1].split() == [
        "cpu",
        "16",
        "none",
        "-",
        str(promised["cpu"]),
        str(share["cpu"]),
        str(held["cpu"]),
        str(status[team_a]["requested"]["cpu"]),
    ]
    assert lines[at[team_b]].split()[1:5] == ["gpu", "2", "none", "-"]
    assert lines[at[dept]].split()[1:4] == ["gpu", "8", "none"]

    shown = {q["name"]: q for q in gw.json("queues")}
    a = shown[team_a]
    assert (a["parent"], a["depth"], a["priority"]) == (dept, 1, 10)
    gpu, cpu, memory = a["resources"]  # memory is not governed, but team-a's pods hold some
    assert gpu == {
        "resource": "gpu",
        "governed": True,
        "quota": "6",
        "limit": "8",
        "over_quota_weight": "2",
        "guaranteed": f"{promised['gpu']:g}",
        "fair_share": f"{share['gpu']:g}",
        "allocated": "3",
        "requested": "3",
    }
    assert (cpu["resource"], cpu["quota"], cpu["limit"], cpu["allocated"]) == ("cpu", "16", None, str(held["cpu"]))
    assert (memory["governed"], memory["quota"], memory["allocated"]) == (False, None, held["memory"])
    assert shown[dept]["depth"] == 0 and shown[dept]["parent"] is None
    assert [r["resource"] for r in shown[team_b]["resources"]] == ["gpu"]
    assert a["gpu_seconds_lost_to_faults"] is None
    assert yaml.safe_load(gw("queues", "-o", "yaml")[1]) == list(shown.values())


def test_why_explains_a_gang_that_does_not_fit_found_through_its_job(
    k8s: client.ApiClient,
    namespace: str,
    cluster: Callable[[int], list[str]],
    queue: Callable[..., str],
    gw: Plugin,
) -> None:
    nodes = set(cluster(1))
    q = queue(16)
    owner = job(k8s, namespace, "train", parallelism=2, labels={contract.LABEL_QUEUE: q})
    ref = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": "train",
        "uid": owner["metadata"]["uid"],
        "controller": True,
    }
    for i in range(2):  # two 8-GPU pods, one 8-GPU node: the gang cannot start
        pod(k8s, namespace, f"train-{i}", gpus=8, owner=ref)
    new_cycle(k8s).run(view(k8s, nodes))
    (group,) = client.CustomObjectsApi(k8s).list_namespaced_custom_object(
        contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION, namespace, contract.PODGROUP_PLURAL
    )["items"]
    (condition,) = group["status"]["conditions"]

    code, out, err = gw("why", "train-1", "-n", namespace)
    assert code == 0, err
    first = out.splitlines()[0]
    assert first == f"Pod {namespace}/train-1: pending: {condition['reason']}: {condition['message']}"
    assert f"PodGroup: {group['metadata']['name']} (queue {q}, minMember 2, phase Pending)" in out
    assert f"Unschedulable=True {condition['reason']}" in out
    # The scheduler's Event about the group is listed with the pod's own.
    events = [line.split() for line in out.split("Events:")[1].splitlines()[2:]]
    assert any(e[1:4] == ["Warning", condition["reason"], f"podgroup/{group['metadata']['name']}"] for e in events)

    report = gw.json("why", "train-1", "-n", namespace)
    assert report["exists"] is True and report["node"] is None and report["queue"] == q
    assert report["pod_group"]["name"] == group["metadata"]["name"]
    assert report["pod_group"]["conditions"][0]["message"] == condition["message"]
    assert report["verdict"] == first.split(": ", 1)[1]
    assert any(e["source"] == contract.SCHEDULER_COMPONENT for e in report["events"])

    code, out, err = gw("why", "no-such-pod", "-n", namespace)
    assert (code, out) == (1, "")
    assert err == f'error: pods "no-such-pod" not found in namespace {namespace}\n'


def test_why_shows_an_eviction_a_budget_blocks_the_pod_it_evicted_and_what_the_fault_cost_the_queue(
    k8s: client.ApiClient,
    namespace: str,
    cluster: Callable[[int], list[str]],
    queue: Callable[..., str],
    gw: Plugin,
) -> None:
    (node,) = cluster(1)
    q = queue(8)
    podgroup(k8s, namespace, "gang", q, 2)
    for name in ("gang-0", "gang-1"):
        pod(k8s, namespace, name, group="gang")
    new_cycle(k8s).run(view(k8s, {node}))
    for name in ("gang-0", "gang-1"):
        mark_pod_running(k8s, name, namespace)
    stored = client.CoreV1Api(k8s).read_namespaced_pod("gang-0", namespace)
    sick = json.loads(stored.metadata.annotations[contract.ANNOTATION_GPU_ASSIGNMENT])["gpus"][0]["index"]
    client.CoreV1Api(k8s).patch_namespaced_pod("gang-1", namespace, {"metadata": {"labels": {"guard": "me"}}})
    refusing_pdb(k8s, namespace, "guard", {"guard": "me"})
    publish_health(k8s, node, replace(xid_fault(sick, 48), action=Action.RESET_GPU))
    result = new_cycle(k8s).run(view(k8s, {node}))
    assert {e.eviction.pod: e.outcome.value for e in result.evictions} == {"gang-0": "Evicted", "gang-1": "Refused"}

    # The pod that stays: placed, and the eviction of it refused by the budget.
    report = gw.json("why", "gang-1", "-n", namespace)
    blocked = next(c for c in report["pod_group"]["conditions"] if c["type"] == "EvictionBlocked")
    assert blocked["status"] == "True" and "gang-1" in blocked["message"]
    assert report["verdict"].startswith(f"placed on node {node} (Running); an eviction")
    assert blocked["message"] in report["verdict"]
    assert any(e["reason"] == "DisruptionBudget" and "gang-1" in e["message"] for e in report["events"])
    code, out, _ = gw("why", "gang-1", "-n", namespace)
    assert code == 0 and "EvictionBlocked=True DisruptionBudget" in out

    # The pod evicted off the sick GPU: terminating, with the Eviction API's mark on it.
    report = gw.json("why", "gang-0", "-n", namespace)
    assert report["verdict"].startswith(f"being evicted or deleted from node {node}")
    (target,) = [c for c in report["pod_conditions"] if c["type"] == "DisruptionTarget"]
    assert target["status"] == "True" and target["reason"] in report["verdict"]

    # The queue's loss, as the cycle wrote it.
    lost = _queue(k8s, q)["status"][contract.QUEUE_STATUS_GPU_SECONDS_LOST]
    assert lost > 0
    shown = {v["name"]: v for v in gw.json("queues")}
    assert shown[q]["gpu_seconds_lost_to_faults"] == pytest.approx(lost)
    code, out, _ = gw("queues")
    (line,) = [row for row in out.splitlines() if row.split()[:1] == [q]]
    assert line.split()[-1] == f"{lost:.0f}"

    # Once it is gone, its Events are what is left; with none, the pod is simply not found.
    complete_pod_deletion(k8s, "gang-0", namespace)
    code, out, err = gw("why", "gang-0", "-n", namespace)
    assert code == 1 and err == f'error: pods "gang-0" not found in namespace {namespace}\n'


def test_why_shows_the_room_reserved_for_a_job_while_its_victims_leave(
    k8s: client.ApiClient,
    namespace: str,
    cluster: Callable[[int], list[str]],
    queue: Callable[..., str],
    gw: Plugin,
) -> None:
    nodes = set(cluster(1))
    lender, owed = queue(4), queue(4)
    for i in range(8):  # the lender borrows every GPU while the other queue is idle
        podgroup(k8s, namespace, f"lend-{i}", lender, 1)
        pod(k8s, namespace, f"lend-{i}", group=f"lend-{i}")
    new_cycle(k8s).run(view(k8s, nodes))
    for i in range(8):
        mark_pod_running(k8s, f"lend-{i}", namespace)
    podgroup(k8s, namespace, "owed", owed, 1)
    pod(k8s, namespace, "owed-0", group="owed", gpus=4)
    new_cycle(k8s).run(view(k8s, nodes))  # reclaims four GPUs and holds them for owed
    (reserved,) = client.CustomObjectsApi(k8s).get_namespaced_custom_object(
        contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION, namespace, contract.PODGROUP_PLURAL, "owed"
    )["status"]["reservations"]

    report = gw.json("why", "owed-0", "-n", namespace)
    (room,) = report["pod_group"]["reservations"]
    assert room == {
        "node": reserved["node"],
        "gpus": reserved["gpus"],
        "gpu_memory_mib": [],
        "expires": reserved["expires"],
    }
    assert report["verdict"] == (
        f"pending; room is reserved for it on {reserved['node']} and it binds once the pods evicted for it are gone"
    )
    code, out, _ = gw("why", "owed-0", "-n", namespace)
    assert code == 0
    gpus = ",".join(map(str, reserved["gpus"]))
    assert [reserved["node"], gpus, "-", reserved["expires"]] in [line.split() for line in out.splitlines()]


def test_a_cluster_without_the_crds_and_a_server_that_does_not_answer_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    with running_control_plane() as bare:  # a fresh control plane: no CRD installed
        kubeconfig.write_bytes(bare.kubeconfig.read_bytes())
        for command, crd, install in (
            ("queues", "queues.scheduling.gpuwarden.io", "manifests/scheduler/"),
            ("nodes", "gpunodes.gpuwarden.io", "manifests/"),
        ):
            code, out, err = plugin(bare, capsys, command)
            assert (code, out) == (1, "")
            assert err.startswith(f"error: the {crd} CRD is not installed in the cluster at {bare.server}")
            assert install in err and err.count("\n") == 1
        server = bare.server
    # The same kubeconfig once the server has stopped.
    code, out, err = plugin(kubeconfig, capsys, "queues")
    assert (code, out) == (1, "")
    assert err.startswith(f"error: cannot reach the API server at {server}: ") and err.count("\n") == 1


def test_kubectl_finds_the_plugin_on_the_path(
    control_plane: ControlPlane, scheduler_crds: None, tmp_path: Path
) -> None:
    """``kubectl gpuwarden`` runs the ``kubectl-gpuwarden`` executable, as an installed console script would be."""
    shim = tmp_path / "kubectl-gpuwarden"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m gpuwarden.kubectl_plugin "$@"\n')
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [
            str(control_plane.binaries.kubectl),
            "gpuwarden",
            "queues",
            "-o",
            "json",
            f"--kubeconfig={control_plane.kubeconfig}",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert isinstance(json.loads(result.stdout), list)


def test_nodes_and_why_show_dra_devices_their_taints_and_the_claims_that_hold_them(
    k8s: client.ApiClient, gw: Plugin, namespace: str
) -> None:
    """A node whose GPUs NVIDIA's DRA driver publishes (no GPUNode, no device plugin), as the driver shapes it."""
    name = unique_name("dra-plugin-node")
    made = create_gpu_node(k8s, name, gpus=0)
    custom = client.CustomObjectsApi(k8s)
    raw = driver_slice(name, made.metadata.uid, DRA_GPUS)
    raw["spec"]["devices"][0]["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]
    made_slice = custom.create_cluster_custom_object(*DRA, "resourceslices", raw)
    rule_name = unique_name("gpuwarden-quarantine")
    rule = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": rule_name},
        "spec": {
            "deviceSelector": {"driver": "gpu.nvidia.com", "pool": name, "device": "gpu-0"},
            "taint": {"key": contract.TAINT_QUARANTINE, "value": "xid-48", "effect": "NoSchedule"},
        },
    }
    custom.create_cluster_custom_object(*DRA, "devicetaintrules", rule)
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "gpu-claim"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
    }
    custom.create_namespaced_custom_object(*DRA, namespace, "resourceclaims", claim)
    client.CoreV1Api(k8s).create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "claimer"},
            "spec": {
                "schedulerName": "nobody",
                "containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu-claim"}],
            },
        },
    )
    try:
        code, out, err = gw("nodes", name)
        assert code == 0, err
        table = rows(out)
        assert table[name][7] == "2(2tainted)"  # gpu-1 (the driver's XID taint) and gpu-0 (the rule's)
        assert table["gpu-1"][:4] == ["gpu-1", "gpu", DRA_GPUS[0].uuid, "-"]
        assert out.count("gpu.nvidia.com/xid=79:NoSchedule") == 1
        assert f"gpuwarden.io/quarantined=xid-48:NoSchedule (rule {rule_name})" in out
        (shown,) = gw.json("nodes", name)
        devices = {d["name"]: d for d in shown["dra_devices"]}
        assert devices["gpu-0"]["taints"] == [f"gpuwarden.io/quarantined=xid-48:NoSchedule (rule {rule_name})"]
        assert devices["gpu-1"]["taints"] == ["gpu.nvidia.com/xid=79:NoSchedule"]
        assert devices["gpu-0"]["claims"] == []

        report = gw.json("why", "claimer", "-n", namespace)
        assert report["claims"] == [{"name": "gpu", "claim": "gpu-claim", "allocated": False, "devices": []}]
        code, out, err = gw("why", "claimer", "-n", namespace)
        assert code == 0, err
        assert "  gpu: gpu-claim, not allocated" in out

        # Allocated gpu-0 (as kube-scheduler writes it): the claim holds it, and why shows the rule's taint on it.
        stored = custom.get_namespaced_custom_object(*DRA, namespace, "resourceclaims", "gpu-claim")
        stored["status"] = {
            "allocation": {
                "devices": {
                    "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": name, "device": "gpu-0"}]
                }
            }
        }
        custom.replace_namespaced_custom_object_status(*DRA, namespace, "resourceclaims", "gpu-claim", stored)
        code, out, err = gw("why", "claimer", "-n", namespace)
        assert code == 0, err
        taint = f"gpuwarden.io/quarantined=xid-48:NoSchedule (rule {rule_name})"
        assert f"  gpu: gpu-claim, allocated gpu.nvidia.com/{name}/gpu-0 [{taint}]" in out
        code, out, err = gw("nodes", name)
        assert rows(out)["gpu-0"][3] == f"{namespace}/gpu-claim"

        # A rule that names no single device is pointed out: it may taint many.
        broad = {
            **rule,
            "metadata": {"name": unique_name("broad")},
            "spec": {**rule["spec"], "deviceSelector": {"driver": "gpu.nvidia.com"}},
        }
        custom.create_cluster_custom_object(*DRA, "devicetaintrules", broad)
        try:
            code, out, err = gw("nodes", name)
            assert f"DeviceTaintRules that select more than one device: {broad['metadata']['name']}" in out
        finally:
            custom.delete_cluster_custom_object(*DRA, "devicetaintrules", broad["metadata"]["name"])
    finally:
        custom.delete_cluster_custom_object(*DRA, "devicetaintrules", rule_name)
        custom.delete_cluster_custom_object(*DRA, "resourceslices", made_slice["metadata"]["name"])
        client.CoreV1Api(k8s).delete_node(name)
