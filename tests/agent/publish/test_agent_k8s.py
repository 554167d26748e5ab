"""The whole agent (sim backend) against the real control plane.

Faults are injected into the simulated node while the agent runs, and the
result is read the way a person would, with ``kubectl get node -o jsonpath``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from agent.model import Entity
from agent.publish.conditions import format_time
from agent.publish.settings import DEFAULT_EVENTS_NAMESPACE
from agent.sim.node import SimNode
from agent.sim.scenario import load_scenario
from gpuwarden.contract import RESOURCE_GPU_MEMORY, TAINT_QUARANTINE, ConditionType
from gpuwarden.kube import ApiError
from tests.agent.publish.conftest import SimAgent
from tests.harness import ControlPlane, KubectlError, create_gpu_node, unique_name, wait_for

pytestmark = pytest.mark.k8s

GPU_MIB = load_scenario("healthy").gpus.memory_mib
FULL = str(8 * GPU_MIB)
ONE_LESS = str(7 * GPU_MIB)


def _jsonpath(control_plane: ControlPlane, node: str, path: str) -> str:
    return control_plane.kubectl("get", "node", node, "-o", f"jsonpath={path}").stdout


def _condition(control_plane: ControlPlane, node: str, ctype: str) -> dict[str, Any]:
    raw = _jsonpath(control_plane, node, f'{{.status.conditions[?(@.type=="{ctype}")]}}')
    return json.loads(raw) if raw else {}


def _wait_condition(control_plane: ControlPlane, node: str, ctype: str, description: str) -> dict[str, Any]:
    """Wait until condition ``ctype`` is True on the node; return it."""

    def true_condition() -> dict[str, Any]:
        cond = _condition(control_plane, node, ctype)
        return cond if cond.get("status") == "True" else {}

    found: dict[str, Any] = wait_for(true_condition, timeout=30, interval=0.2, description=description)
    return found


def _capacity(control_plane: ControlPlane, node: str) -> tuple[str, str]:
    key = RESOURCE_GPU_MEMORY.replace(".", "\\.")
    return (
        _jsonpath(control_plane, node, f"{{.status.capacity.{key}}}"),
        _jsonpath(control_plane, node, f"{{.status.allocatable.{key}}}"),
    )


def _gpunode(control_plane: ControlPlane, node: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(control_plane.kubectl("get", "gpunode", node, "-o", "json").stdout)
    return result


def _healthy_published(control_plane: ControlPlane, node: str) -> bool:
    statuses = [_condition(control_plane, node, c.value).get("status") for c in ConditionType]
    return statuses == ["False"] * len(statuses) and _capacity(control_plane, node) == (FULL, FULL)


def _wait_healthy(control_plane: ControlPlane, node: str) -> None:
    wait_for(
        lambda: _healthy_published(control_plane, node),
        timeout=20,
        interval=0.2,
        description="every agent condition False and full gpu-memory capacity",
    )


# Faults a GPU reset repairs (a lost GPU or a failed remap needs the board
# replaced, and stays unhealthy after a reset).
RESET_FIXES = frozenset({"xid", "remap_pending", "nvlink_down", "pcie_width", "pcie_gen"})


@dataclass(frozen=True)
class Case:
    """One injected fault and what the Node must show for it."""

    kind: str
    params: dict[str, Any]
    condition: str
    reasons: frozenset[str]
    names: str  # text the condition message must contain
    gpu: int | None  # the GPU taken out of service, if any
    # Injected first: what the node must be doing for the fault to count.
    setup: tuple[tuple[str, dict[str, Any]], ...] = ()


CASES = [
    Case("xid", {"gpu": 2, "xid": 79}, "GpuXidError", frozenset({"Xid79"}), "GPU 2", 2),
    Case("remap_pending", {"gpu": 3}, "GpuMemoryDegraded", frozenset({"RowRemapPending"}), "GPU 3", 3),
    Case("remap_failure", {"gpu": 4}, "GpuMemoryDegraded", frozenset({"RowRemapFailure"}), "GPU 4", 4),
    Case("nvlink_down", {"gpu": 1, "link": 3}, "GpuNvlinkDegraded", frozenset({"NvlinkDown"}), "GPU 1", 1),
    Case("pcie_width", {"gpu": 5, "width": 8}, "GpuPcieDegraded", frozenset({"PcieWidthDegraded"}), "GPU 5", 5),
    Case(
        "ib_down",
        {"device": "mlx5_2", "port": 1},
        "InfinibandDegraded",
        frozenset({"IbPortDown", "MultipleFaults"}),
        "mlx5_2 port 1",
        None,
    ),
    Case("gpu_lost", {"gpu": 6}, "GpuMissing", frozenset({"GpuLost", "MultipleFaults"}), "GPU 6", 6),
    Case("mount_missing", {"path": "/mnt/shared"}, "StorageDegraded", frozenset({"MountMissing"}), "/mnt/shared", None),
    # Rates: one poll's growth far above the per-minute thresholds.
    Case(
        "nvlink_errors",
        {"gpu": 0, "link": 7, "count": 100_000},
        "GpuNvlinkDegraded",
        frozenset({"NvlinkErrorRate"}),
        "GPU 0",
        0,
    ),
    Case(
        "pcie_gen",
        {"gpu": 4, "gen": 4},
        "GpuPcieDegraded",
        frozenset({"PcieGenDegraded"}),
        "GPU 4",
        4,
        # A generation drop counts under load only (idle GPUs drop it to save power).
        setup=(("utilization", {"gpu": 4, "pct": 90}),),
    ),
    Case("pcie_replays", {"gpu": 7, "count": 100_000}, "GpuPcieDegraded", frozenset({"PcieReplayRate"}), "GPU 7", 7),
    Case(
        "ib_rate",
        {"device": "mlx5_3", "port": 1, "rate_gbps": 200.0},
        "InfinibandDegraded",
        frozenset({"IbRateDegraded"}),
        "mlx5_3 port 1",
        None,
    ),
    Case(
        "ib_link_downed",
        {"device": "mlx5_5", "port": 1},
        "InfinibandDegraded",
        frozenset({"IbLinkDowned"}),
        "mlx5_5 port 1",
        None,
    ),
    Case("mount_hung", {"path": "/mnt/shared"}, "StorageDegraded", frozenset({"MountHung"}), "/mnt/shared", None),
]


@pytest.mark.parametrize("case", CASES, ids=[c.kind for c in CASES])
def test_injected_fault_shows_in_condition_capacity_and_gpunode(
    control_plane: ControlPlane, gpu_node: str, sim_agent: Callable[..., SimAgent], case: Case
) -> None:
    kind, ctype, gpu = case.kind, case.condition, case.gpu
    ready_before = _condition(control_plane, gpu_node, "Ready")
    agent = sim_agent(gpu_node)
    for setup_kind, params in case.setup:
        agent.sim.inject(setup_kind, **params)
    _wait_healthy(control_plane, gpu_node)

    agent.sim.inject(kind, **case.params)
    cond = _wait_condition(control_plane, gpu_node, ctype, f"{ctype} True after {kind}")
    assert cond["reason"] in case.reasons
    assert case.names in cond["message"]
    assert "Recommended action:" in cond["message"]
    if gpu is not None:
        # The GPU's UUID and its PCI bus id as `nvidia-smi -i` takes it.
        sim_gpu = next(g for g in agent.sim.sample_gpus() if g.index == gpu)
        assert sim_gpu.uuid in cond["message"]
        assert sim_gpu.pci_bus_id in cond["message"]
        assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.0", sim_gpu.pci_bus_id)
        expected = ONE_LESS
    else:
        expected = FULL
    wait_for(
        lambda: _capacity(control_plane, gpu_node) == (expected, expected),
        timeout=10,
        interval=0.2,
        description=f"gpu-memory capacity {expected}",
    )

    def gpunode_shows_it() -> bool:
        status = _gpunode(control_plane, gpu_node).get("status", {})
        if gpu is not None:
            entry = status["gpus"][gpu]
            return entry["healthy"] is False and any(f["condition"] == ctype for f in entry["faults"])
        faults = [f for p in status.get("ibPorts", []) for f in p["faults"]] + status.get("nodeFaults", [])
        return any(f["condition"] == ctype for f in faults)

    wait_for(
        gpunode_shows_it,
        timeout=10,
        interval=0.2,
        description=f"GPUNode lists the {ctype} fault",
        ignore=(KubectlError,),
    )
    assert _condition(control_plane, gpu_node, "Ready") == ready_before

    if kind in RESET_FIXES:
        # Repaired (a GPU reset) and re-validated: the memory comes back.
        agent.sim.inject("gpu_reset", gpu=gpu)
        report = agent.monitor.last_report
        assert report is not None
        repaired = next(g for g in report.gpus if g.index == gpu)
        agent.monitor.clear(Entity.gpu(repaired.index, repaired.uuid, repaired.pci_bus_id).key)
        wait_for(
            lambda: _healthy_published(control_plane, gpu_node),
            timeout=20,
            interval=0.2,
            description="condition False and full capacity after repair",
        )


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        body: bytes = resp.read()
        return body.decode()


def test_agent_survives_an_api_server_outage_and_republishes(
    control_plane: ControlPlane, gpu_node: str, sim_agent: Callable[..., SimAgent]
) -> None:
    agent = sim_agent(gpu_node, metrics_port=0, metrics_host="127.0.0.1")
    _wait_healthy(control_plane, gpu_node)
    agent.sim.inject("xid", gpu=2, xid=79)
    xid_before = _wait_condition(control_plane, gpu_node, "GpuXidError", "GpuXidError True")
    wait_for(
        lambda: not _gpunode(control_plane, gpu_node)["status"]["gpus"][2]["healthy"],
        timeout=20,
        interval=0.2,
        description="GPUNode lists the XID",
        ignore=(KubectlError,),
    )
    # The first GPUNode write of a test run can outlast the 2 s API timeout
    # while the API server sets up the new CRD's storage: count from here.
    outages = agent.daemon.outages

    control_plane.stop_apiserver()
    try:
        agent.sim.inject("ib_down", device="mlx5_1", port=1)
        agent.sim.inject("xid", gpu=0, xid=13)
        wait_for(
            lambda: sum(agent.daemon.stats.snapshot()[1].values()) >= 3,
            timeout=20,
            interval=0.1,
            description="the publisher keeps retrying",
        )
        report = agent.monitor.last_report
        assert report is not None
        assert report.faults_for(ConditionType.INFINIBAND_DEGRADED)
        assert agent.daemon.liveness() == (True, "ok")
    finally:
        control_plane.start_apiserver()

    ib = _wait_condition(
        control_plane, gpu_node, "InfinibandDegraded", "InfinibandDegraded True after the API server is back"
    )
    assert "mlx5_1 port 1" in ib["message"]
    xid_after = _condition(control_plane, gpu_node, "GpuXidError")
    assert (xid_after["status"], xid_after["lastTransitionTime"]) == ("True", xid_before["lastTransitionTime"])
    core = client.CoreV1Api(client.ApiClient(control_plane.configuration()))
    try:
        wait_for(
            lambda: (
                "Xid13"
                in {
                    e.reason
                    for e in core.list_namespaced_event(
                        DEFAULT_EVENTS_NAMESPACE, field_selector=f"involvedObject.name={gpu_node}"
                    ).items
                }
            ),
            timeout=20,
            interval=0.2,
            description="the Event queued during the outage is written",
        )
    finally:
        core.api_client.close()
    assert agent.daemon.outages == outages + 1
    assert agent.daemon.server is not None
    metrics = _scrape(agent.daemon.server.port)
    errors = [
        float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("gpuwarden_api_errors_total{")
    ]
    assert sum(errors) >= 3
    assert 'gpuwarden_node_condition{condition="InfinibandDegraded"' in metrics


def _snapshot(control_plane: ControlPlane, node: str) -> dict[str, Any]:
    conds = {c.value: _condition(control_plane, node, c.value) for c in ConditionType}
    status = dict(_gpunode(control_plane, node)["status"])
    status.pop("observedTime", None)
    return {
        "conditions": {t: (c["status"], c["reason"], c["message"], c["lastTransitionTime"]) for t, c in conds.items()},
        "capacity": _capacity(control_plane, node),
        "gpunode": status,
    }


def test_restarted_agent_keeps_latched_faults_and_nothing_flaps(
    control_plane: ControlPlane,
    k8s: client.ApiClient,
    gpu_node: str,
    sim_agent: Callable[..., SimAgent],
    tmp_path: Path,
) -> None:
    # As the DaemonSet runs it: the kernel-log cursor in a per-boot file.
    cursor = str(tmp_path / "kmsg-cursor.json")
    before, events_before, sim = _latched_xid_and_narrow_link(control_plane, k8s, gpu_node, sim_agent, cursor)

    # The new process sees the same hardware in the same boot: the link is
    # still narrow, and the kernel log, read again from its start, still holds
    # the XID, which the previous run already announced.
    second = sim_agent(gpu_node, sim, kmsg_state_file=cursor)
    # Long enough for any non-latched fault to have cleared (clear_polls).
    polls = second.monitor.config.hysteresis.clear_polls + 2
    wait_for(
        lambda: second.monitor.polls >= polls and second.daemon.published_seq >= polls,
        timeout=20,
        interval=0.1,
        description=f"{polls} reports published by the restarted agent",
    )
    assert _snapshot(control_plane, gpu_node) == before
    # No "cleared" Event, and no fault announced a second time.
    assert _event_counts(k8s, gpu_node) == events_before
    assert all(kind == "Warning" for kind, _ in events_before)


def _event_counts(k8s: client.ApiClient, node: str) -> dict[tuple[str, str], int]:
    events = client.CoreV1Api(k8s).list_namespaced_event(
        DEFAULT_EVENTS_NAMESPACE, field_selector=f"involvedObject.name={node}"
    )
    return {(str(e.type), str(e.reason)): int(e.count or 1) for e in events.items}


def test_a_fault_lasting_many_polls_is_one_warning_event_and_its_clearing_one_normal(
    control_plane: ControlPlane, k8s: client.ApiClient, gpu_node: str, sim_agent: Callable[..., SimAgent]
) -> None:
    agent = sim_agent(gpu_node)
    _wait_healthy(control_plane, gpu_node)

    def published_after(polls: int) -> Callable[[], bool]:
        return lambda: agent.daemon.published_seq >= polls and agent.daemon.events.pending() == 0

    agent.sim.inject("pcie_width", gpu=5, width=8)
    _wait_condition(control_plane, gpu_node, "GpuPcieDegraded", "GpuPcieDegraded True")
    many = agent.monitor.polls + 10
    wait_for(published_after(many), timeout=30, interval=0.1, description=f"{many} reports published")
    assert _event_counts(k8s, gpu_node) == {("Warning", "PcieWidthDegraded"): 1}

    agent.sim.inject("gpu_reset", gpu=5)  # the link trains back to x16: the fault clears
    wait_for(
        lambda: _condition(control_plane, gpu_node, "GpuPcieDegraded").get("status") == "False",
        timeout=20,
        interval=0.2,
        description="GpuPcieDegraded False once the link is back",
    )
    many = agent.monitor.polls + 10
    wait_for(published_after(many), timeout=30, interval=0.1, description=f"{many} reports published")
    assert _event_counts(k8s, gpu_node) == {("Warning", "PcieWidthDegraded"): 1, ("Normal", "PcieHealthy"): 1}


def _gauge(port: int, name: str) -> float | None:
    """The value of an unlabelled gauge on the agent's /metrics, None when absent."""
    for family in text_string_to_metric_families(_scrape(port)):
        for sample in family.samples:
            if sample.name == name and not sample.labels:
                return float(sample.value)
    return None


def test_quarantine_taint_is_read_from_the_heartbeat_and_exported(
    control_plane: ControlPlane, k8s: client.ApiClient, gpu_node: str, sim_agent: Callable[..., SimAgent]
) -> None:
    settings: dict[str, Any] = {"heartbeat_period_s": 1.0, "metrics_port": 0, "metrics_host": "127.0.0.1"}
    agent = sim_agent(gpu_node, **settings)
    _wait_healthy(control_plane, gpu_node)
    assert agent.daemon.server is not None
    port = agent.daemon.server.port
    assert _gauge(port, "gpuwarden_node_quarantined") == 0
    assert _gauge(port, "gpuwarden_node_quarantined_since_timestamp_seconds") is None
    core = client.CoreV1Api(k8s)
    taint = {"key": TAINT_QUARANTINE, "value": "Xid79", "effect": "NoSchedule"}
    core.patch_node(gpu_node, {"spec": {"taints": [taint]}})
    wait_for(
        lambda: _gauge(port, "gpuwarden_node_quarantined") == 1,
        timeout=15,
        interval=0.2,
        description="the quarantine gauge follows the taint",
    )
    # No timeAdded on the taint: the start is when the agent first saw it,
    # and it is kept in the GPUNode for the next run.
    since = _gauge(port, "gpuwarden_node_quarantined_since_timestamp_seconds")
    assert since is not None
    first_seen = format_time(datetime.fromtimestamp(since, UTC))
    wait_for(
        lambda: _gpunode(control_plane, gpu_node)["status"].get("quarantinedSince") == first_seen,
        timeout=15,
        interval=0.2,
        description="the GPUNode records when the quarantine began",
    )
    agent.stop()

    restarted = sim_agent(gpu_node, **settings)
    assert restarted.daemon.server is not None
    port = restarted.daemon.server.port
    # Restored before the first publish, so this is no race with a new sighting.
    assert _gauge(port, "gpuwarden_node_quarantined_since_timestamp_seconds") == since

    # A taint that says when it was added is believed.
    added = "2026-01-02T03:04:05Z"
    core.patch_node(gpu_node, {"spec": {"taints": [{**taint, "timeAdded": added}]}})
    wait_for(
        lambda: (
            _gauge(port, "gpuwarden_node_quarantined_since_timestamp_seconds")
            == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp()
        ),
        timeout=15,
        interval=0.2,
        description="the start follows the taint's timeAdded",
    )
    core.patch_node(gpu_node, {"spec": {"taints": None}})
    wait_for(
        lambda: (
            _gauge(port, "gpuwarden_node_quarantined") == 0
            and _gauge(port, "gpuwarden_node_quarantined_since_timestamp_seconds") is None
            and "quarantinedSince" not in _gpunode(control_plane, gpu_node)["status"]
        ),
        timeout=15,
        interval=0.2,
        description="released: no start exported or recorded",
    )


def test_a_recreated_node_gets_its_conditions_capacity_and_gpunode_back(
    control_plane: ControlPlane, k8s: client.ApiClient, gpu_node: str, sim_agent: Callable[..., SimAgent]
) -> None:
    sim_agent(gpu_node, heartbeat_period_s=1.0)
    _wait_healthy(control_plane, gpu_node)
    core = client.CoreV1Api(k8s)
    core.delete_node(gpu_node)
    wait_for(lambda: not _jsonpath_or_empty(control_plane, gpu_node), timeout=10, description="node deleted")
    recreated = create_gpu_node(k8s, gpu_node).metadata
    assert recreated is not None
    new_uid = recreated.uid
    _wait_healthy(control_plane, gpu_node)

    def owned_by_new_node() -> bool:
        result = control_plane.kubectl("get", "gpunode", gpu_node, "-o", "json", check=False)
        if result.returncode != 0:
            return False
        owners = json.loads(result.stdout)["metadata"].get("ownerReferences", [])
        return [o["uid"] for o in owners] == [new_uid]

    wait_for(owned_by_new_node, timeout=30, interval=0.2, description="GPUNode owned by the new Node")


def test_a_node_name_that_names_no_node_counts_as_an_api_error(
    k8s: client.ApiClient, agent_manifests: None, sim_agent: Callable[..., SimAgent], capsys: pytest.CaptureFixture[str]
) -> None:
    """The commonest misconfiguration (the hostname is not the Node's name) must
    reach gpuwarden_api_errors_total, or GpuwardenAgentApiErrors never fires."""
    agent = sim_agent(unique_name("no-such-node"), backoff_cap_s=0.5)
    wait_for(
        lambda: agent.daemon.stats.snapshot()[1].get("get_node", 0) >= 2,
        timeout=20,
        description="the missing Node counted as failing get_node requests",
    )
    metric = [m for m in agent.daemon.metrics.collect() if m.name == "gpuwarden_api_errors"]
    assert any(s.labels == {"operation": "get_node"} and s.value >= 2 for m in metric for s in m.samples)
    captured = capsys.readouterr()
    assert "must be the Node's name" in captured.out + captured.err


def _jsonpath_or_empty(control_plane: ControlPlane, node: str) -> str:
    result = control_plane.kubectl("get", "node", node, "-o", "jsonpath={.metadata.uid}", check=False)
    return result.stdout if result.returncode == 0 else ""


def test_gpuwarden_agent_command_publishes_serves_probes_and_stops_on_sigterm(
    control_plane: ControlPlane, gpu_node: str
) -> None:
    env = {**os.environ, "NODE_NAME": gpu_node}  # as the DaemonSet's downward API would set it
    env.pop("GPUWARDEN_NODE_NAME", None)
    argv = [
        sys.executable,
        "-m",
        "gpuwarden.cli",
        "--log-format",
        "json",
        "agent",
        "--backend",
        "sim",
        "--scenario",
        "default",
        "--poll-interval",
        "0.5",
        "--kubeconfig",
        str(control_plane.kubeconfig),
        "--metrics-address",
        "127.0.0.1",
        "--metrics-port",
        "0",
    ]
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr or []), daemon=True)
    reader.start()
    try:
        wait_for(
            lambda: _condition(control_plane, gpu_node, "GpuMemoryDegraded").get("status") == "True",
            timeout=30,
            interval=0.2,
            description="the command publishes the default scenario's remap pending",
        )
        started = wait_for(
            lambda: next((json.loads(x) for x in list(lines) if '"http_server_started"' in x), None),
            timeout=10,
            description="the HTTP server's port in the log",
        )
        assert started is not None
        port = int(started["port"])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            assert resp.status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        reader.join(timeout=5)
    assert any('"agent_daemon_stopped"' in x for x in lines)


def test_a_fault_cleared_just_before_a_restart_stays_cleared(
    control_plane: ControlPlane, k8s: client.ApiClient, gpu_node: str, sim_agent: Callable[..., SimAgent]
) -> None:
    first = sim_agent(gpu_node)
    _wait_healthy(control_plane, gpu_node)
    first.sim.inject("xid", gpu=2, xid=79)
    _wait_condition(control_plane, gpu_node, "GpuXidError", "GpuXidError True")
    wait_for(
        lambda: not _gpunode(control_plane, gpu_node)["status"]["gpus"][2]["healthy"],
        timeout=10,
        interval=0.2,
        description="GPUNode lists the XID",
        ignore=(KubectlError,),
    )
    first.stop()
    # What a crash between the two writes of a repair leaves behind: the
    # condition already False, the GPUNode still listing the latched XID.
    client.CoreV1Api(k8s).patch_node_status(
        gpu_node,
        {
            "status": {
                "conditions": [
                    {
                        "type": "GpuXidError",
                        "status": "False",
                        "reason": "NoFatalXid",
                        "message": "No fatal XID on any GPU",
                        "lastTransitionTime": _condition(control_plane, gpu_node, "Ready")["lastTransitionTime"],
                    }
                ]
            }
        },
        _content_type="application/strategic-merge-patch+json",
    )
    second = sim_agent(gpu_node)
    polls = second.monitor.config.hysteresis.clear_polls + 2
    wait_for(
        lambda: second.daemon.published_seq >= polls,
        timeout=20,
        interval=0.1,
        description=f"{polls} reports published by the restarted agent",
    )
    assert _condition(control_plane, gpu_node, "GpuXidError")["status"] == "False"
    assert _capacity(control_plane, gpu_node) == (FULL, FULL)
    wait_for(
        lambda: _gpunode(control_plane, gpu_node)["status"]["gpus"][2]["healthy"],
        timeout=10,
        interval=0.2,
        description="GPUNode shows the GPU healthy again",
    )


@pytest.mark.parametrize("zeroed_maps", [("capacity", "allocatable"), ("allocatable",)], ids=["both", "allocatable"])
def test_capacity_someone_else_changed_is_put_back_after_the_next_heartbeat(
    control_plane: ControlPlane,
    k8s: client.ApiClient,
    gpu_node: str,
    sim_agent: Callable[..., SimAgent],
    zeroed_maps: tuple[str, ...],
) -> None:
    """A kubelet that lost its checkpoint zeroes extended resources when it
    re-registers; a tool may rewrite allocatable alone, which is what the
    scheduler places against."""
    agent = sim_agent(gpu_node, heartbeat_period_s=1.0, api_timeout_s=10.0)
    _wait_healthy(control_plane, gpu_node)
    wait_for(
        lambda: _gpunode(control_plane, gpu_node).get("status"),
        timeout=20,
        interval=0.2,
        description="GPUNode written",
        ignore=(KubectlError,),
    )
    outages = agent.daemon.outages
    zeroed = {"status": {field: {RESOURCE_GPU_MEMORY: "0"} for field in zeroed_maps}}
    changed = client.CoreV1Api(k8s).patch_node_status(
        gpu_node, zeroed, _content_type="application/strategic-merge-patch+json"
    )
    # The patch's own answer: a read after it could already see the agent's
    # repair (one heartbeat later, while kubectl is still starting).
    assert (changed.status.capacity[RESOURCE_GPU_MEMORY], changed.status.allocatable[RESOURCE_GPU_MEMORY]) != (
        FULL,
        FULL,
    )
    wait_for(
        lambda: _capacity(control_plane, gpu_node) == (FULL, FULL),
        timeout=15,
        interval=0.2,
        description="gpu-memory capacity restored",
    )
    # Found through the heartbeat's response, not by re-reading the Node, and
    # not by an outage's republish-everything.
    requests, _ = agent.daemon.stats.snapshot()
    assert requests.get("get_node", 0) == 1
    assert agent.daemon.outages == outages


def _latched_xid_and_narrow_link(
    control_plane: ControlPlane,
    k8s: client.ApiClient,
    node: str,
    sim_agent: Callable[..., SimAgent],
    kmsg_state_file: str | None = None,
) -> tuple[dict[str, Any], dict[tuple[str, str], int], SimNode]:
    """A first agent publishes a latched XID and a narrow PCIe link, then stops.

    Returns the Node's snapshot and its Event counts as that agent left them,
    and its simulated node (whose kernel log still holds the XID).
    """
    first = sim_agent(node, kmsg_state_file=kmsg_state_file)
    _wait_healthy(control_plane, node)
    first.sim.inject("xid", gpu=2, xid=79)
    first.sim.inject("pcie_width", gpu=5, width=8)
    wait_for(
        lambda: all(
            _condition(control_plane, node, t).get("status") == "True" for t in ("GpuXidError", "GpuPcieDegraded")
        ),
        timeout=20,
        interval=0.2,
        description="both faults published",
    )
    wait_for(lambda: first.daemon.events.pending() == 0, timeout=10, description="events written")
    wait_for(
        lambda: not _gpunode(control_plane, node)["status"]["gpus"][5]["healthy"],
        timeout=10,
        interval=0.2,
        description="GPUNode lists both faults",
        ignore=(KubectlError,),
    )
    snapshot, events = _snapshot(control_plane, node), _event_counts(k8s, node)
    first.stop()
    return snapshot, events, first.sim


def _restarted_sim() -> SimNode:
    """The same hardware after a restart: the link is still narrow, the XID is history."""
    sim = SimNode(load_scenario("healthy"))
    sim.inject("pcie_width", gpu=5, width=8)
    return sim


def test_reports_judged_before_a_late_restore_are_never_published(
    control_plane: ControlPlane, k8s: client.ApiClient, gpu_node: str, sim_agent: Callable[..., SimAgent]
) -> None:
    """The race, step by step: the agent starts while the API server is down.

    Its rules judge without the Node's faults: no XID (it is history) and a
    "new" narrow link. One such report is handed over only after the restore
    has run. None of them may reach the Node: GpuXidError would go False and
    True again, and the link's Warning Event would be announced twice.
    """
    before, events_before, _ = _latched_xid_and_narrow_link(control_plane, k8s, gpu_node, sim_agent)
    second = SimAgent(k8s, gpu_node, _restarted_sim())  # driven by hand: no threads
    try:
        daemon, monitor = second.daemon, second.monitor
        control_plane.stop_apiserver()
        try:
            with pytest.raises(ApiError):
                daemon.publish_once()  # the read-back fails
            daemon.on_report(*monitor.step())
            # During the outage: an application XID and a really new fault.
            second.sim.inject("xid", gpu=0, xid=13)
            second.sim.inject("ib_down", device="mlx5_1", port=1)
            early = monitor.step()
            assert not early[0].faults_for(ConditionType.GPU_XID_ERROR)
            daemon.on_report(*early)
            late = monitor.step()  # judged before the restore ...
        finally:
            control_plane.start_apiserver()
        daemon.publish_once()  # the restore; the reports it has are older
        daemon.on_report(*late)  # ... handed over after it
        daemon.publish_once()
        assert daemon.published_seq == 0
        daemon.on_report(*monitor.step())
        daemon.publish_once()
        assert daemon.published_seq == 4
    finally:
        second.monitor.close()

    after = _snapshot(control_plane, gpu_node)
    for ctype in ("GpuXidError", "GpuPcieDegraded"):
        assert after["conditions"][ctype] == before["conditions"][ctype]
    assert after["conditions"]["InfinibandDegraded"][0] == "True"
    events_after = _event_counts(k8s, gpu_node)
    # The faults the Node had are not announced again; the application XID
    # and the port that went down during the outage are.
    assert {k: v for k, v in events_after.items() if k in events_before} == events_before
    assert {k: v for k, v in events_after.items() if k not in events_before} == {
        ("Warning", "Xid13"): 1,
        ("Warning", "IbPortDown"): 1,
        ("Warning", "IbLinkDowned"): 1,  # the port going down counts in link_downed too
    }


def test_an_agent_started_while_the_api_server_is_down_keeps_latched_faults(
    control_plane: ControlPlane, k8s: client.ApiClient, gpu_node: str, sim_agent: Callable[..., SimAgent]
) -> None:
    before, events_before, _ = _latched_xid_and_narrow_link(control_plane, k8s, gpu_node, sim_agent)
    control_plane.stop_apiserver()
    try:
        second = sim_agent(gpu_node, _restarted_sim())
        wait_for(
            lambda: second.monitor.polls >= 4 and second.daemon.outages == 1,
            timeout=20,
            interval=0.1,
            description="the agent polls while it cannot read its Node back",
        )
    finally:
        control_plane.start_apiserver()
    polls = second.monitor.polls + second.monitor.config.hysteresis.clear_polls + 2
    wait_for(
        lambda: second.daemon.published_seq >= polls and second.daemon.events.pending() == 0,
        timeout=30,
        interval=0.1,
        description=f"{polls} reports published after the API server is back",
    )
    # Conditions, capacity and the GPUNode's fault detail, since-times
    # included: the still narrow link was judged again before the restore,
    # and the restore puts back when the Node says it was first seen.
    assert _snapshot(control_plane, gpu_node) == before
    assert _event_counts(k8s, gpu_node) == events_before


def test_liveness_fails_while_the_publisher_hangs_and_recovers_with_it(
    control_plane: ControlPlane, gpu_node: str, sim_agent: Callable[..., SimAgent]
) -> None:
    agent = sim_agent(gpu_node)
    _wait_healthy(control_plane, gpu_node)
    daemon = agent.daemon
    assert daemon.liveness() == (True, "ok")

    def judged_later() -> str:
        """Liveness as it will be once the stuck limit has passed from now."""
        return daemon.liveness(time.monotonic() + daemon.publisher_stuck_after_s + 30)[1]

    # Another flush that never ends (its writer lock held) stands for any
    # hang outside the API client: the publisher blocks in its next flush.
    with daemon.events._writer:
        agent.sim.inject("xid", gpu=0, xid=13)  # an Event, and a report to publish
        wait_for(
            lambda: "publisher stuck" in judged_later(),
            timeout=10,
            interval=0.1,
            description="the publisher counted as stuck once the limit has passed",
        )
        assert daemon.liveness() == (True, "ok")  # not yet: the limit has not passed
    wait_for(
        lambda: daemon.events.pending() == 0 and "publisher" not in judged_later(),
        timeout=10,
        interval=0.1,
        description="the publisher going again",
    )


def test_a_deleted_gpunode_is_recreated_within_a_few_heartbeats_and_the_log_says_why(
    control_plane: ControlPlane, k8s: client.ApiClient, gpu_node: str, sim_agent: Callable[..., SimAgent]
) -> None:
    """Nothing changes on a healthy node, so only the heartbeat can notice."""
    sim_agent(gpu_node, heartbeat_period_s=1.0)
    _wait_healthy(control_plane, gpu_node)
    before = wait_for(
        lambda: _gpunode(control_plane, gpu_node).get("status"),
        timeout=20,
        interval=0.2,
        description="GPUNode written",
        ignore=(KubectlError,),
    )
    with capture_logs() as logs:
        control_plane.kubectl("delete", "gpunode", gpu_node)
        after = wait_for(
            lambda: _gpunode(control_plane, gpu_node).get("status"),
            timeout=10,
            interval=0.2,
            description="GPUNode recreated",
            ignore=(KubectlError,),
        )
    assert {k: v for k, v in after.items() if k != "observedTime"} == {
        k: v for k, v in before.items() if k != "observedTime"
    }
    gone = [e for e in logs if e["event"] == "gpunode_missing"]
    assert gone and "deleted" in gone[0]["why"]


def test_a_failing_gpunode_holds_back_neither_the_conditions_nor_the_events(
    k8s: client.ApiClient, gpu_node: str, sim_agent: Callable[..., SimAgent]
) -> None:
    """With the GPUNode CRD missing (the API server answers its path with a bare
    404), PCIe and XID 13 must still reach the Node and the Events at once, and
    the retries resend only the GPUNode, not every condition."""
    agent = sim_agent(gpu_node, backoff_cap_s=0.5)
    api = agent.daemon.api

    def crd_missing(*_args: Any, **_kwargs: Any) -> Any:
        raise ApiError("gpunode", 404, "404 page not found")

    # The API server's own answer for a resource it does not serve, injected
    # at the request boundary so the other outputs still go to the real server.
    for name in ("get_gpunode", "create_gpunode", "patch_gpunode", "patch_gpunode_status"):
        setattr(api, name, crd_missing)
    agent.sim.inject("xid", gpu=1, xid=13)
    agent.sim.inject("pcie_width", gpu=2, width=8)
    core = client.CoreV1Api(k8s)

    def published() -> bool:
        reasons = {
            e.reason
            for e in core.list_namespaced_event(
                DEFAULT_EVENTS_NAMESPACE, field_selector=f"involvedObject.name={gpu_node}"
            ).items
        }
        node = core.read_node_status(gpu_node)
        pcie = [c for c in node.status.conditions if c.type == ConditionType.GPU_PCIE_DEGRADED.value]
        return "Xid13" in reasons and bool(pcie) and pcie[0].status == "True"

    wait_for(published, timeout=15, interval=0.2, description="conditions and Events written while GPUNode fails")
    before = agent.daemon.stats.snapshot()[0].get("patch_node_status", 0)
    time.sleep(3)  # several retries of the failing GPUNode, at a 0.5 s backoff cap
    after = agent.daemon.stats.snapshot()[0].get("patch_node_status", 0)
    assert after - before <= 1  # a heartbeat at most, not one condition patch per retry
