"""One long-lived remediation controller against the real API server observes only what changed.

The leader keeps one controller for its term and runs a pass after every
scheduling cycle. A pass over a healthy cluster must not convert every Node
and GPUNode again: it observes a node when its Node or GPUNode changed since
the last pass, or when the node has work in hand (a record, a fault), and
leaves every other node's last transition standing. These tests count the
nodes converted (``node_from_objects`` calls and ``report.observed``), not
time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client

from gpuwarden import contract
from gpuwarden.contract import Action
from gpuwarden.dra import Device, Taint
from gpuwarden.kube import KubeApi
from scheduler.cluster.evict import Evictor
from scheduler.engine.model import Node
from scheduler.remediation import controller as controller_module
from scheduler.remediation.controller import RemediationController, RemediationReport
from tests.agent.publish.reports import xid_fault
from tests.scheduler.cluster.kube_objects import publish_health
from tests.scheduler.cluster.test_cycle_k8s import view
from tests.scheduler.remediation.test_controller_k8s import NO_WAIT, Clock

pytestmark = pytest.mark.k8s


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The name of every Node the controller converts, in order."""
    seen: list[str] = []
    real = controller_module.node_from_objects

    def counting(node: Any, gpunode: Any) -> Node:
        seen.append(node["metadata"]["name"])
        return real(node, gpunode)

    monkeypatch.setattr(controller_module, "node_from_objects", counting)
    yield seen


def _controller(k8s: client.ApiClient) -> RemediationController:
    api = KubeApi(k8s, field_manager=contract.SCHEDULER_COMPONENT)
    return RemediationController(api, Evictor(api, retry=NO_WAIT), clock=Clock())


def _pass(k8s: client.ApiClient, controller: RemediationController, nodes: set[str]) -> RemediationReport:
    current = view(k8s, nodes)
    report = controller.run(current.nodes, current.gpunodes, current.pods.values())
    assert report.errors == [], report.errors
    return report


def _state(k8s: client.ApiClient, name: str) -> str | None:
    labels = client.CoreV1Api(k8s).read_node(name).metadata.labels or {}
    state: str | None = labels.get(contract.LABEL_REMEDIATION_STATE)
    return state


def test_a_pass_with_no_change_observes_no_node_and_a_changed_node_is_observed_once(
    k8s: client.ApiClient, cluster: Callable[[int], list[str]], conversions: list[str]
) -> None:
    names = cluster(3)
    nodes = set(names)
    controller = _controller(k8s)

    first = _pass(k8s, controller, nodes)
    assert sorted(first.observed) == sorted(names)
    assert all(_state(k8s, n) == "healthy" for n in names)  # the first pass labels every node
    # Its own label patches changed the Nodes: read once more, found quiet.
    assert sorted(_pass(k8s, controller, nodes).observed) == sorted(names)

    conversions.clear()
    quiet = _pass(k8s, controller, nodes)
    assert quiet.observed == [] and conversions == []
    # The nodes it left alone are still in its report, as the metrics read it.
    assert sorted(quiet.transitions) == sorted(names)
    assert {t.label for t in quiet.transitions.values()} == {"healthy"}

    # A person labels one Node: that one is read again, once.
    client.CoreV1Api(k8s).patch_node(names[1], {"metadata": {"labels": {"team": "vision"}}})
    assert _pass(k8s, controller, nodes).observed == [names[1]]
    assert conversions == [names[1], names[1]]  # the pool counts and the observation
    assert _pass(k8s, controller, nodes).observed == []


def test_a_fault_is_observed_at_once_and_its_node_every_pass_until_it_is_done(
    k8s: client.ApiClient, cluster: Callable[[int], list[str]], conversions: list[str]
) -> None:
    names = cluster(3)
    nodes = set(names)
    controller = _controller(k8s)
    for _ in range(2):
        _pass(k8s, controller, nodes)
    assert _pass(k8s, controller, nodes).observed == []

    sick = names[0]
    publish_health(k8s, sick, replace(xid_fault(1, 48), action=Action.RESET_GPU))
    report = _pass(k8s, controller, nodes)
    assert report.observed == [sick]
    assert _state(k8s, sick) in {"gpu-quarantined", "gpu-draining"}
    # A workflow in hand has timers: its node is observed on every pass, the others on none.
    for _ in range(2):
        assert _pass(k8s, controller, nodes).observed == [sick]
    assert {n for n, t in _pass(k8s, controller, nodes).transitions.items() if t.label == "healthy"} == set(names[1:])


def test_a_deleted_node_leaves_the_report(k8s: client.ApiClient, cluster: Callable[[int], list[str]]) -> None:
    names = cluster(2)
    nodes = set(names)
    controller = _controller(k8s)
    for _ in range(2):
        _pass(k8s, controller, nodes)
    client.CoreV1Api(k8s).delete_node(names[0])
    report = _pass(k8s, controller, nodes)
    assert sorted(report.transitions) == sorted(report.pools) == [names[1]]


def test_a_node_whose_driver_taints_changed_is_observed_and_no_other(
    k8s: client.ApiClient, cluster: Callable[[int], list[str]], conversions: list[str]
) -> None:
    """NVIDIA's DRA driver's health taints are an input like the Node's: a change re-observes that node only."""
    names = cluster(3)
    nodes = set(names)
    controller = _controller(k8s)

    def run(driver: dict[str, tuple[Device, ...]]) -> RemediationReport:
        current = view(k8s, nodes)
        report = controller.run(current.nodes, current.gpunodes, current.pods.values(), driver)
        assert report.errors == [], report.errors
        return report

    run({})
    run({})  # its own label patches read back
    assert run({}).observed == []
    sick = sorted(names)[1]
    (uuid,) = [g["uuid"] for g in view(k8s, nodes).gpunodes[sick]["status"]["gpus"] if g["index"] == 3]
    tainted = Device(
        "gpu.nvidia.com",
        sick,
        "gpu-7",  # the device's minor is not the GPU's index: the UUID names the GPU
        uuid,
        kind="gpu",
        taints=(Taint("gpu.nvidia.com/xid", "48", "NoSchedule", time_added="2026-12-01T10:00:00Z"),),
    )
    conversions.clear()
    report = run({sick: (tainted,)})
    assert report.observed == [sick] and set(conversions) == {sick}
    transition = report.transitions[sick]
    (scope,) = transition.record.scopes
    assert (scope.fault.reason, scope.fault.gpu_index, scope.scope.gpu_index) == ("Xid48", 3, 3)
