"""The agent (sim backend) answering remediation's requests through its GPUNode, against the real API server.

The requests are written as the scheduler's remediation writes them: a patch
of the GPUNode's spec by another client. What the agent does is read back
from the API server: its answers in status.remediation, and the GPU's
condition and gpu-memory capacity on the Node.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client

from agent.remediation.model import format_instant, parse_instant
from agent.sim.node import SimNode
from agent.sim.scenario import load_scenario
from gpuwarden import contract
from gpuwarden.contract import RESOURCE_GPU_MEMORY, ConditionType
from tests.agent.publish.conftest import SimAgent
from tests.harness import wait_for

pytestmark = pytest.mark.k8s

GPU_MIB = load_scenario("healthy").gpus.memory_mib
GROUP = (contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL)


def _gpunode(k8s: client.ApiClient, node: str) -> dict[str, Any]:
    obj: dict[str, Any] = client.CustomObjectsApi(k8s).get_cluster_custom_object(*GROUP, node)
    return obj


def _ask(k8s: client.ApiClient, node: str, remediation: dict[str, Any]) -> None:
    """What the scheduler's remediation does: write the requests into the GPUNode's spec."""
    client.CustomObjectsApi(k8s).patch_cluster_custom_object(
        *GROUP, node, {"spec": {contract.GPUNODE_REMEDIATION: remediation}}
    )


def _answer(k8s: client.ApiClient, node: str, kind: str, requested_at: str) -> dict[str, Any]:
    status = _gpunode(k8s, node).get("status") or {}
    entries = (status.get(contract.GPUNODE_REMEDIATION) or {}).get(kind) or []
    found: dict[str, Any] = next((e for e in entries if e["requestedAt"] == requested_at), {})
    return found


def _xid_condition(k8s: client.ApiClient, node: str) -> str:
    conditions = client.CoreV1Api(k8s).read_node(node).status.conditions or []
    return next((c.status for c in conditions if c.type == ConditionType.GPU_XID_ERROR.value), "")


def _capacity(k8s: client.ApiClient, node: str) -> str:
    return str((client.CoreV1Api(k8s).read_node(node).status.capacity or {}).get(RESOURCE_GPU_MEMORY))


def test_a_reset_and_a_validation_asked_on_the_gpunode_are_answered_and_the_gpu_returns(
    k8s: client.ApiClient, gpu_node: str, sim_agent: Callable[..., SimAgent]
) -> None:
    sim = SimNode(load_scenario("healthy"), identity=gpu_node)
    agent = sim_agent(gpu_node, sim)
    wait_for(lambda: _capacity(k8s, gpu_node) == str(8 * GPU_MIB), timeout=20, interval=0.2, description="capacity")

    sim.inject("xid", gpu=2, xid=48)
    wait_for(lambda: _xid_condition(k8s, gpu_node) == "True", timeout=20, interval=0.2, description="Xid48 raised")
    wait_for(lambda: _capacity(k8s, gpu_node) == str(7 * GPU_MIB), timeout=10, interval=0.2, description="GPU 2 out")
    sim.inject("processes", gpu=2, count=1)

    uuid = next(g.uuid for g in sim.sample_gpus() if g.index == 2)
    reset_at = format_instant(datetime.now(UTC))
    resets = [{"gpu": 2, "uuid": uuid, "requestedAt": reset_at}]
    _ask(k8s, gpu_node, {"resets": resets})
    waiting = wait_for(
        lambda: _answer(k8s, gpu_node, "resets", reset_at),
        timeout=10,
        interval=0.1,
        description="the reset answered",
    )
    assert waiting["result"] == contract.RESET_WAITING
    assert "1 processes still use GPU 2" in waiting["message"]
    assert sim.resets == []

    sim.inject("processes", gpu=2, count=0)
    done = wait_for(
        lambda: (a := _answer(k8s, gpu_node, "resets", reset_at)).get("result") == contract.RESET_SUCCEEDED and a,
        timeout=10,
        interval=0.1,
        description="the reset Succeeded",
    )
    assert done["uuid"] == uuid
    assert sim.resets == [2]
    wait_for(lambda: _xid_condition(k8s, gpu_node) == "False", timeout=20, interval=0.2, description="Xid48 cleared")
    wait_for(lambda: _capacity(k8s, gpu_node) == str(8 * GPU_MIB), timeout=10, interval=0.2, description="GPU 2 back")

    validate_at = format_instant(datetime.now(UTC))
    _ask(k8s, gpu_node, {"resets": resets, "validations": [{"gpus": [2], "requestedAt": validate_at}]})
    verdict = wait_for(
        lambda: _answer(k8s, gpu_node, "validations", validate_at),
        timeout=20,
        interval=0.1,
        description="the validation answered",
    )
    assert verdict["passed"] is True, verdict
    assert verdict["gpus"] == [2]
    repaired, validated = parse_instant(done["finishedAt"]), parse_instant(verdict["finishedAt"])
    assert repaired is not None and validated is not None and validated > repaired
    assert {c["name"] for c in verdict["checks"]} >= {"xid", "memory", "nvlink", "pcie", "dcgm-diag"}
    assert agent.daemon.remediation_counts.snapshot() == (
        {contract.RESET_SUCCEEDED: 1, contract.RESET_FAILED: 0},
        {"passed": 1, "failed": 0},
    )
    answers_before = _gpunode(k8s, gpu_node)["status"][contract.GPUNODE_REMEDIATION]

    # Restarted on the same node: the kernel log still holds the XID 48 line and
    # is read again from its start, and the requests are still in the spec.
    agent.stop()
    second = sim_agent(gpu_node, sim)
    polls = second.monitor.config.hysteresis.clear_polls + 3
    wait_for(
        lambda: second.daemon.published_seq >= polls,
        timeout=20,
        interval=0.1,
        description=f"{polls} reports published by the restarted agent",
    )
    assert sim.resets == [2]
    assert _xid_condition(k8s, gpu_node) == "False"
    assert _capacity(k8s, gpu_node) == str(8 * GPU_MIB)
    assert _gpunode(k8s, gpu_node)["status"][contract.GPUNODE_REMEDIATION] == answers_before
    assert second.daemon.remediation_counts.snapshot()[0][contract.RESET_SUCCEEDED] == 0


def test_a_reset_that_fails_is_answered_failed_and_the_gpu_stays_out(
    k8s: client.ApiClient, gpu_node: str, sim_agent: Callable[..., SimAgent], tmp_path: Any
) -> None:
    scenario = tmp_path / "failing-reset.yaml"
    scenario.write_text("name: failing-reset\nreset:\n  fail_gpus: [5]\n  error: GPU 5 is in a bad state\n")
    sim = SimNode(load_scenario(str(scenario)), identity=gpu_node)
    sim_agent(gpu_node, sim)
    sim.inject("xid", gpu=5, xid=48)
    wait_for(lambda: _xid_condition(k8s, gpu_node) == "True", timeout=20, interval=0.2, description="Xid48 raised")
    wait_for(
        lambda: not _gpunode(k8s, gpu_node)["status"]["gpus"][5]["healthy"],
        timeout=10,
        interval=0.2,
        description="the GPUNode lists GPU 5 unhealthy",
        ignore=(client.ApiException, KeyError),
    )
    reset_at = format_instant(datetime.now(UTC))
    _ask(k8s, gpu_node, {"resets": [{"gpu": 5, "requestedAt": reset_at}]})
    answer = wait_for(
        lambda: (a := _answer(k8s, gpu_node, "resets", reset_at)).get("result") == contract.RESET_FAILED and a,
        timeout=10,
        interval=0.1,
        description="the reset Failed",
    )
    assert answer["message"] == "GPU 5 is in a bad state"
    assert _xid_condition(k8s, gpu_node) == "True"
    assert _capacity(k8s, gpu_node) == str(7 * GPU_MIB)
