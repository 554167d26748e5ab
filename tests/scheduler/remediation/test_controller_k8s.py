"""The remediation controller against the real API server: quarantine, drain, repair, validate, return.

Each step is one scheduling cycle followed by one remediation pass over a
fresh listing, as the leader runs them. The agent's side (its health, its
answers to reset and validation requests) is written the way the agent
writes it: NodeConditions and GPUNode status through the agent's own
publisher functions, answers into ``status.remediation``. A fresh
controller is used for every pass: all it knows is on the Node.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client

from gpuwarden import contract
from gpuwarden.contract import Action
from gpuwarden.kube import KubeApi
from scheduler.cluster.assignment import decode_assignment
from scheduler.cluster.evict import Evictor
from scheduler.cluster.retrying import RetryPolicy
from scheduler.remediation.controller import RemediationController
from scheduler.remediation.policy import ControllerSettings, Settings
from tests.agent.publish.reports import xid_fault
from tests.harness import complete_pod_deletion, mark_pod_running, unique_name
from tests.scheduler.cluster.kube_objects import foreign_pod, pod, podgroup, publish_health
from tests.scheduler.cluster.test_cycle_k8s import new_cycle, view

pytestmark = pytest.mark.k8s

NO_WAIT = RetryPolicy(attempts=2, sleep=lambda _s: None)


class Clock:
    """The controller's clock; each pass moves it on a little, as real cycles do."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC).timestamp()

    def __call__(self) -> float:
        self.now += 0.5
        return self.now


def _pass(
    k8s: client.ApiClient, nodes: set[str], clock: Clock, settings: ControllerSettings | None = None
) -> RemediationController:
    """One scheduling cycle, then one remediation pass, over fresh listings."""
    new_cycle(k8s).run(view(k8s, nodes))
    current = view(k8s, nodes)
    api = KubeApi(k8s, field_manager=contract.SCHEDULER_COMPONENT)
    controller = RemediationController(api, Evictor(api, retry=NO_WAIT), settings, clock=clock)
    report = controller.run(current.nodes, current.gpunodes, list(current.pods.values()))
    assert report.errors == [], report.errors
    return controller


def _node(k8s: client.ApiClient, name: str) -> Any:
    return client.CoreV1Api(k8s).read_node(name)


def _gpunode(k8s: client.ApiClient, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = client.CustomObjectsApi(k8s).get_cluster_custom_object(
        contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL, name
    )
    return obj


def _state(k8s: client.ApiClient, name: str) -> str | None:
    labels = _node(k8s, name).metadata.labels or {}
    state: str | None = labels.get(contract.LABEL_REMEDIATION_STATE)
    return state


def _record(k8s: client.ApiClient, name: str) -> dict[str, Any]:
    text = (_node(k8s, name).metadata.annotations or {}).get(contract.ANNOTATION_REMEDIATION_STATE)
    return json.loads(text) if text else {}


def _answer(k8s: client.ApiClient, name: str, kind: str, **fields: Any) -> None:
    """The agent's answer to the current request of ``kind``, finished now."""
    asked = _gpunode(k8s, name)["spec"][contract.GPUNODE_REMEDIATION][kind]
    assert len(asked) == 1, asked
    answer = {**asked[0], "finishedAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), **fields}
    client.CustomObjectsApi(k8s).patch_cluster_custom_object_status(
        contract.API_GROUP,
        contract.API_VERSION,
        contract.GPUNODE_PLURAL,
        name,
        {"status": {contract.GPUNODE_REMEDIATION: {kind: [answer]}}},
    )


def _gpus(k8s: client.ApiClient, namespace: str, name: str) -> tuple[int, ...]:
    stored = client.CoreV1Api(k8s).read_namespaced_pod(name, namespace)
    return decode_assignment(stored.metadata.annotations[contract.ANNOTATION_GPU_ASSIGNMENT]) or ()


def test_a_reset_fault_quarantines_one_gpu_drains_it_resets_validates_and_returns_it(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    (node,) = cluster(1)
    nodes = {node}
    clock = Clock()
    q = queue(8)
    for i in range(3):
        podgroup(k8s, namespace, f"w-{i}", q, 1)
        pod(k8s, namespace, f"w-{i}", group=f"w-{i}")
    new_cycle(k8s).run(view(k8s, nodes))
    held = {}
    for i in range(3):
        mark_pod_running(k8s, f"w-{i}", namespace)
        held[_gpus(k8s, namespace, f"w-{i}")[0]] = f"w-{i}"
    sick = min(held)

    # XID 48 on one GPU: that GPU is quarantined and drained, the node is not cordoned.
    publish_health(k8s, node, replace(xid_fault(sick, 48), action=Action.RESET_GPU))
    _pass(k8s, nodes, clock)
    stored = _node(k8s, node)
    assert stored.spec.unschedulable is not True
    assert stored.metadata.annotations[contract.ANNOTATION_QUARANTINED_GPUS] == str(sick)
    assert _state(k8s, node) in {"gpu-quarantined", "gpu-draining"}
    assert client.CoreV1Api(k8s).read_namespaced_pod(held[sick], namespace).metadata.deletion_timestamp is not None
    others = [p for g, p in held.items() if g != sick]
    assert all(
        client.CoreV1Api(k8s).read_namespaced_pod(p, namespace).metadata.deletion_timestamp is None for p in others
    )

    # The pod leaves; the drain is done and the agent is asked to reset the GPU.
    complete_pod_deletion(k8s, held[sick], namespace)
    _pass(k8s, nodes, clock)
    _pass(k8s, nodes, clock)
    assert _state(k8s, node) == "gpu-repairing"
    (asked,) = _gpunode(k8s, node)["spec"][contract.GPUNODE_REMEDIATION][contract.REMEDIATION_RESETS]
    assert asked["gpu"] == sick

    # The agent resets it (and its latched fault clears); then validation.
    _answer(k8s, node, contract.REMEDIATION_RESETS, result=contract.RESET_SUCCEEDED)
    publish_health(k8s, node)
    _pass(k8s, nodes, clock)
    assert _state(k8s, node) == "gpu-validating"
    remediation = _gpunode(k8s, node)["spec"][contract.GPUNODE_REMEDIATION]
    assert remediation[contract.REMEDIATION_RESETS] == []
    assert remediation[contract.REMEDIATION_VALIDATIONS][0]["gpus"] == [sick]

    # A pass: the GPU returns to service and takes work again.
    _answer(k8s, node, contract.REMEDIATION_VALIDATIONS, passed=True)
    _pass(k8s, nodes, clock)
    stored = _node(k8s, node)
    assert _state(k8s, node) == "healthy"
    assert contract.ANNOTATION_QUARANTINED_GPUS not in (stored.metadata.annotations or {})
    for i in range(6):
        podgroup(k8s, namespace, f"new-{i}", q, 1)
        pod(k8s, namespace, f"new-{i}", group=f"new-{i}")
    new_cycle(k8s).run(view(k8s, nodes))
    placed = {g for i in range(6) for g in _gpus(k8s, namespace, f"new-{i}")}
    assert sick in placed, "the returned GPU takes work again"


def test_a_reboot_fault_cordons_escalates_waits_for_people_validates_and_returns_the_node(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    (node,) = cluster(1)
    nodes = {node}
    clock = Clock()
    calls: list[dict[str, Any]] = []

    def post(url: str, body: bytes, timeout: float) -> None:
        calls.append({"url": url, **json.loads(body)})

    settings = ControllerSettings(machine=Settings(), webhook_url="http://tickets.invalid/hook")
    publish_health(k8s, node, xid_fault(2, 79))  # fallen off the bus: REBOOT

    def run_pass() -> None:
        new_cycle(k8s).run(view(k8s, nodes))
        current = view(k8s, nodes)
        api = KubeApi(k8s, field_manager=contract.SCHEDULER_COMPONENT)
        controller = RemediationController(api, Evictor(api, retry=NO_WAIT), settings, clock=clock, post=post)
        assert controller.run(current.nodes, current.gpunodes, list(current.pods.values())).errors == []

    for _ in range(3):  # quarantine, drain (nothing to drain), escalate
        run_pass()
    stored = _node(k8s, node)
    assert stored.spec.unschedulable is True
    (taint,) = [t for t in stored.spec.taints or [] if t.key == contract.TAINT_QUARANTINE]
    assert taint.time_added is not None
    assert _state(k8s, node) == "escalated"
    assert stored.metadata.labels[contract.LABEL_REPAIR_NEEDED] == "REBOOT"
    assert [c["need"] for c in calls] == ["REBOOT"] and calls[0]["node"] == node
    assert _record(k8s, node)["scopes"][0]["by"] == contract.SCHEDULER_COMPONENT

    # People reboot it and say so; the fault is gone; validation, then return.
    publish_health(k8s, node)
    client.CoreV1Api(k8s).patch_node(
        node, {"metadata": {"annotations": {contract.ANNOTATION_ESCALATION_CLEARED: "TICKET-42"}}}
    )
    run_pass()
    assert _state(k8s, node) == "validating"
    assert contract.LABEL_REPAIR_NEEDED not in (_node(k8s, node).metadata.labels or {})
    _answer(k8s, node, contract.REMEDIATION_VALIDATIONS, passed=True)
    run_pass()
    stored = _node(k8s, node)
    assert _state(k8s, node) == "healthy"
    assert stored.spec.unschedulable is not True
    assert not [t for t in stored.spec.taints or [] if t.key == contract.TAINT_QUARANTINE]
    assert len(calls) == 1, "escalated once"


def test_a_pass_over_a_view_that_has_not_caught_up_with_the_last_write_does_not_repeat_it(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]]
) -> None:
    # The leader's next pass can start before the watch brought back the Node
    # the last pass patched: taking a person's clear twice would write the
    # Event twice and restart the validation it began.
    (node,) = cluster(1)
    nodes = {node}
    clock = Clock()
    publish_health(k8s, node, xid_fault(2, 79))
    for _ in range(3):  # quarantine, drain, escalate
        _pass(k8s, nodes, clock)
    assert _state(k8s, node) == "escalated"
    publish_health(k8s, node)
    client.CoreV1Api(k8s).patch_node(
        node, {"metadata": {"annotations": {contract.ANNOTATION_ESCALATION_CLEARED: "T-7"}}}
    )
    stale = view(k8s, nodes)
    api = KubeApi(k8s, field_manager=contract.SCHEDULER_COMPONENT)
    controller = RemediationController(api, Evictor(api, retry=NO_WAIT), clock=clock)
    assert controller.run(stale.nodes, stale.gpunodes, list(stale.pods.values())).errors == []
    assert _state(k8s, node) == "validating"
    first = _record(k8s, node)
    # Again over the same listing, as a watch cache one write behind has it.
    assert controller.run(stale.nodes, stale.gpunodes, list(stale.pods.values())).errors == []
    assert _record(k8s, node) == first, "the validation asked for is still the one asked for"
    events = client.CoreV1Api(k8s).list_namespaced_event("default", field_selector=f"involvedObject.name={node}").items
    assert [e.reason for e in events].count("EscalationCleared") == 1
    # Once the view has the write (or anything later), it is the view that counts again.
    fresh = view(k8s, nodes)
    assert controller.run(fresh.nodes, fresh.gpunodes, list(fresh.pods.values())).errors == []
    assert _state(k8s, node) == "validating"


def test_dry_run_records_and_reports_but_changes_nothing(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]]
) -> None:
    (node,) = cluster(1)
    clock = Clock()
    publish_health(k8s, node, xid_fault(1, 79))
    dry = ControllerSettings(machine=Settings(dry_run=True))
    for _ in range(3):
        _pass(k8s, {node}, clock, dry)
    stored = _node(k8s, node)
    assert stored.spec.unschedulable is not True
    assert not [t for t in stored.spec.taints or [] if t.key == contract.TAINT_QUARANTINE]
    assert _state(k8s, node).startswith("dry-run-")
    events = client.CoreV1Api(k8s).list_namespaced_event("default", field_selector=f"involvedObject.name={node}").items
    assert any(e.reason == "DryRun" for e in events)


def test_a_person_uncordoning_mid_workflow_stops_management_until_a_new_fault(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]]
) -> None:
    (node,) = cluster(1)
    clock = Clock()
    publish_health(k8s, node, xid_fault(0, 79))
    _pass(k8s, {node}, clock)
    _pass(k8s, {node}, clock)
    assert _node(k8s, node).spec.unschedulable is True
    client.CoreV1Api(k8s).patch_node(node, {"spec": {"unschedulable": False}})
    _pass(k8s, {node}, clock)
    stored = _node(k8s, node)
    assert stored.spec.unschedulable is not True
    assert not [t for t in stored.spec.taints or [] if t.key == contract.TAINT_QUARANTINE]
    assert _state(k8s, node) == "unmanaged"
    for _ in range(2):
        _pass(k8s, {node}, clock)
    assert _node(k8s, node).spec.unschedulable is not True, "the same fault starts nothing again"
    events = client.CoreV1Api(k8s).list_namespaced_event("default", field_selector=f"involvedObject.name={node}").items
    assert any(e.reason == "ManualUncordon" for e in events)
    # A new fault (another GPU, another XID) is managed again.
    publish_health(k8s, node, xid_fault(0, 79), xid_fault(5, 95))
    _pass(k8s, {node}, clock)
    _pass(k8s, {node}, clock)
    assert _node(k8s, node).spec.unschedulable is True


def test_the_breaker_stops_new_quarantines_while_a_validated_node_still_returns(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]]
) -> None:
    # A pool of 10 nodes with a limit of 10 % (one node out at a time).
    names = cluster(10)
    pool = unique_name("pool")
    for name in names:
        client.CoreV1Api(k8s).patch_node(name, {"metadata": {"labels": {contract.LABEL_NODE_POOL: pool}}})
    nodes = set(names)
    clock = Clock()
    first, *rest = sorted(names)
    publish_health(k8s, first, xid_fault(0, 79))
    for _ in range(3):
        _pass(k8s, nodes, clock)
    assert _state(k8s, first) == "escalated"
    # 30 % of the pool fails at once: the breaker holds them, they stay schedulable.
    failing = rest[:3]
    for name in failing:
        publish_health(k8s, name, xid_fault(1, 79))
    _pass(k8s, nodes, clock)
    for name in failing:
        assert _node(k8s, name).spec.unschedulable is not True
        assert _record(k8s, name)["hold"]["reason"].startswith("circuit breaker")
    # Meanwhile the first node is repaired, validated and returns: the breaker never blocks that.
    publish_health(k8s, first)
    client.CoreV1Api(k8s).patch_node(
        first, {"metadata": {"annotations": {contract.ANNOTATION_ESCALATION_CLEARED: "T-1"}}}
    )
    _pass(k8s, nodes, clock)
    _answer(k8s, first, contract.REMEDIATION_VALIDATIONS, passed=True)
    _pass(k8s, nodes, clock)
    assert _state(k8s, first) == "healthy" and _node(k8s, first).spec.unschedulable is not True
    # With the first back, one held node may go out now (the limit is one).
    _pass(k8s, nodes, clock)
    out = [n for n in failing if _node(k8s, n).spec.unschedulable is True]
    assert len(out) == 1


def test_a_fault_back_within_the_window_is_escalated_to_replace_and_a_restart_mid_drain_resumes(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    (node,) = cluster(1)
    nodes = {node}
    clock = Clock()
    q = queue(8)
    podgroup(k8s, namespace, "w", q, 1)
    pod(k8s, namespace, "w", group="w")
    new_cycle(k8s).run(view(k8s, nodes))
    mark_pod_running(k8s, "w", namespace)
    (gpu,) = _gpus(k8s, namespace, "w")

    publish_health(k8s, node, replace(xid_fault(gpu, 48), action=Action.RESET_GPU))
    _pass(k8s, nodes, clock)
    assert _state(k8s, node) == "gpu-draining"
    # The scheduler restarts mid-drain: a new controller (each _pass builds one)
    # finds the drain in the Node's record and finishes it once the pod is gone.
    _pass(k8s, nodes, clock)
    assert _state(k8s, node) == "gpu-draining"
    complete_pod_deletion(k8s, "w", namespace)
    _pass(k8s, nodes, clock)
    _pass(k8s, nodes, clock)
    assert _state(k8s, node) == "gpu-repairing"
    _answer(k8s, node, contract.REMEDIATION_RESETS, result=contract.RESET_SUCCEEDED)
    publish_health(k8s, node)
    _pass(k8s, nodes, clock)
    _answer(k8s, node, contract.REMEDIATION_VALIDATIONS, passed=True)
    _pass(k8s, nodes, clock)
    assert _state(k8s, node) == "healthy"

    # The same GPU fails again days later (inside the 7-day window): no second reset, REPLACE.
    clock.now += 3 * 86400
    later = datetime.fromtimestamp(clock.now, UTC).replace(microsecond=0)
    publish_health(k8s, node, replace(xid_fault(gpu, 48, since=later), action=Action.RESET_GPU))
    for _ in range(3):
        _pass(k8s, nodes, clock)
    stored = _node(k8s, node)
    assert stored.spec.unschedulable is True, "a replacement takes the node"
    assert stored.metadata.labels[contract.LABEL_REPAIR_NEEDED] == "REPLACE"
    events = client.CoreV1Api(k8s).list_namespaced_event("default", field_selector=f"involvedObject.name={node}").items
    assert any(e.reason == "RepeatFault" for e in events)


class _AgentWritesFirst(KubeApi):
    """The real API, with one write by someone else landing before the controller's first Node patch.

    The race of the field: the pass reads the Node, the agent writes its
    status (a condition, a reset answered), then the pass's patch arrives
    with the version it read and is refused with 409.
    """

    def __init__(self, k8s: client.ApiClient, meddle: Callable[[], None]) -> None:
        super().__init__(k8s, field_manager=contract.SCHEDULER_COMPONENT)
        self._meddle: Callable[[], None] | None = meddle

    def patch_node(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        meddle, self._meddle = self._meddle, None
        if meddle is not None:
            meddle()
        return super().patch_node(name, patch)


def _quarantine_pass(k8s: client.ApiClient, node: str, meddle: Callable[[], None]) -> list[str]:
    current = view(k8s, {node})
    api = _AgentWritesFirst(k8s, meddle)
    controller = RemediationController(api, Evictor(api, retry=NO_WAIT), clock=Clock())
    return controller.run(current.nodes, current.gpunodes, list(current.pods.values())).errors


def test_a_record_refused_only_because_the_agent_wrote_the_nodes_status_is_written_against_the_new_version(
    k8s: client.ApiClient, cluster: Callable[[int], list[str]]
) -> None:
    # The steps of the pass (the agent asked to reset the idle GPU) have
    # gone out; dropping the record would let the GPU be reset and returned
    # with no quarantine ever on record.
    (node,) = cluster(1)
    publish_health(k8s, node, replace(xid_fault(3, 48), action=Action.RESET_GPU))

    def agent_heartbeat() -> None:
        client.CoreV1Api(k8s).patch_node_status(node, {"status": {"capacity": {"example.com/tick": "1"}}})

    assert _quarantine_pass(k8s, node, agent_heartbeat) == []
    assert _state(k8s, node) is not None and str(_state(k8s, node)).startswith("gpu-")
    assert _node(k8s, node).metadata.annotations[contract.ANNOTATION_QUARANTINED_GPUS] == "3"
    assert [s["gpus"] for s in _record(k8s, node)["scopes"]] == [[3]]


def test_a_record_refused_because_someone_changed_what_it_was_decided_from_waits_for_the_next_pass(
    k8s: client.ApiClient, cluster: Callable[[int], list[str]]
) -> None:
    (node,) = cluster(1)
    publish_health(k8s, node, replace(xid_fault(3, 48), action=Action.RESET_GPU))

    def person_cordons() -> None:
        client.CoreV1Api(k8s).patch_node(node, {"spec": {"unschedulable": True}})

    errors = _quarantine_pass(k8s, node, person_cordons)
    assert len(errors) == 1 and "409" in errors[0], errors
    assert contract.ANNOTATION_REMEDIATION_STATE not in (_node(k8s, node).metadata.annotations or {})


class CountingEvictor(Evictor):
    """The real Evictor, counting the evictions it is handed per pod."""

    def __init__(self, api: KubeApi) -> None:
        super().__init__(api, retry=NO_WAIT)
        self.asked: dict[str, int] = {}

    def evict_all(self, evictions: Any) -> Any:
        for ev in evictions:
            key = f"{ev.namespace}/{ev.pod}"
            self.asked[key] = self.asked.get(key, 0) + 1
        return super().evict_all(evictions)


def _foreign_pod_holding(k8s: client.ApiClient, namespace: str, node: str, name: str, gpus: tuple[int, ...]) -> None:
    """Another scheduler's pod on ``node``, and the node's GPUNode listing it (as the agent would) on ``gpus``."""
    created = foreign_pod(k8s, namespace, node, name, len(gpus))
    mark_pod_running(k8s, name, namespace)
    status = _gpunode(k8s, node)["status"]
    holder = {"namespace": namespace, "name": name, "uid": created.metadata.uid, "container": "main"}
    for gpu in status["gpus"]:
        held = gpu.setdefault(contract.GPUNODE_GPU_PODS, [])
        if gpu["index"] in gpus:
            held.append(holder)
    status[contract.GPUNODE_POD_RESOURCES] = {"ok": True}
    client.CustomObjectsApi(k8s).patch_cluster_custom_object_status(
        contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL, node, {"status": status}
    )


def test_a_pod_of_another_scheduler_on_two_draining_gpus_is_evicted_once(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]]
) -> None:
    (node,) = cluster(1)
    nodes = {node}
    publish_health(
        k8s,
        node,
        replace(xid_fault(2, 48), action=Action.RESET_GPU),
        replace(xid_fault(3, 48), action=Action.RESET_GPU),
    )
    _foreign_pod_holding(k8s, namespace, node, "theirs", (2, 3))
    _foreign_pod_holding(k8s, namespace, node, "bystander", (5,))
    clock = Clock()
    api = KubeApi(k8s, field_manager=contract.SCHEDULER_COMPONENT)
    evictor = CountingEvictor(api)
    for _ in range(3):  # quarantine, then drain
        new_cycle(k8s).run(view(k8s, nodes))
        current = view(k8s, nodes)
        controller = RemediationController(api, evictor, None, clock=clock)
        report = controller.run(current.nodes, current.gpunodes, list(current.pods.values()))
        assert report.errors == [], report.errors
        if evictor.asked:
            break
    assert evictor.asked == {f"{namespace}/theirs": 1}, "once, though both its GPUs drain; the bystander stays"
    stored = client.CoreV1Api(k8s).read_namespaced_pod("theirs", namespace)
    assert stored.metadata.deletion_timestamp is not None
    assert _node(k8s, node).spec.unschedulable is not True
