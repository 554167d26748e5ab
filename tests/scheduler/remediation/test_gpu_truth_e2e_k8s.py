"""The GPU each pod really holds, end to end: the kubelet's word, published by the agent, acted on by the scheduler.

Each node is a :class:`~tests.scheduler.remediation.e2e.SimGpuNode`: the
stand-in kubelet's device manager gives containers their GPUs as a kubelet
does (never from gpuwarden's assignment) and serves PodResources to a real
sim agent, which publishes the holders in the GPUNode. The scheduler is the
process's runner. Nothing here writes what the agent or the scheduler would.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from gpuwarden import contract
from scheduler.cluster.assignment import decode_assignment
from scheduler.remediation.steps import EventReason
from scheduler.runner import SchedulerRunner
from tests.harness import wait_for
from tests.scheduler.cluster.kube_objects import foreign_pod, pod, podgroup
from tests.scheduler.remediation.e2e import Kubelet, SimGpuNode, until

pytestmark = pytest.mark.k8s


def _assigned(core: client.CoreV1Api, namespace: str, name: str) -> tuple[int, ...]:
    stored = core.read_namespaced_pod(name, namespace)
    text = (stored.metadata.annotations or {}).get(contract.ANNOTATION_GPU_ASSIGNMENT)
    return decode_assignment(text) or () if text else ()


def _names(core: client.CoreV1Api, namespace: str) -> set[str]:
    return {p.metadata.name for p in core.list_namespaced_pod(namespace).items if p.metadata.deletion_timestamp is None}


def _published(gpu_node: SimGpuNode, k8s: client.ApiClient, want: dict[int, str]) -> bool:
    """The GPUNode lists ``want`` (GPU index -> pod) among its holders."""
    with contextlib.suppress(client.ApiException):
        held = gpu_node.holders(k8s)
        return all(pod_name in held.get(index, []) for index, pod_name in want.items())
    return False


def _swapped(
    k8s: client.ApiClient, namespace: str, q: str, gpu_node: SimGpuNode
) -> tuple[Kubelet, list[str], str, str]:
    """Six one-GPU pods placed by gpuwarden before the kubelet admits any, on a node whose device
    plugin lists GPUs last first: gpuwarden assigns 0, 1, 2, ..., the device manager gives 7, 6, 5, ...

    Returns the kubelet, the pods, the pod really on GPU 5 and the pod gpuwarden meant for GPU 5.
    """
    core = client.CoreV1Api(k8s)
    kubelet = Kubelet(k8s, namespace, {gpu_node.name: gpu_node.devices})
    wait_for(lambda: gpu_node.agent.daemon.published_seq > 0, 30, description="the agent publishes")
    names = [f"p{i}" for i in range(6)]
    for name in names:
        podgroup(k8s, namespace, name, q, 1)
        pod(k8s, namespace, name, group=name)
    # All bound before the kubelet admits any: gpuwarden's guesses are made
    # before the kubelet has said anything (once it has, gpuwarden knows).
    wait_for(lambda: all(_assigned(core, namespace, n) for n in names), 30, description="all are placed")
    until(kubelet, lambda: all(gpu_node.gpus_of(namespace, n) for n in names), "all run")
    real = {n: gpu_node.gpus_of(namespace, n) for n in names}
    assigned = {n: _assigned(core, namespace, n) for n in names}
    (on_5,) = [n for n in names if real[n] == (5,)]
    (meant_for_5,) = [n for n in names if assigned[n] == (5,)]
    assert on_5 != meant_for_5, (real, assigned)
    assert assigned[on_5] == (2,), "the case of the issue: gpuwarden said GPU 2, the kubelet chose GPU 5"
    until(kubelet, lambda: _published(gpu_node, k8s, {5: on_5}), "the agent publishes who holds GPU 5")
    return kubelet, names, on_5, meant_for_5


def test_an_xid_on_gpu_5_evicts_the_pod_the_kubelet_reports_there_not_the_one_assigned_there(
    k8s: client.ApiClient,
    namespace: str,
    queue: Callable[..., str],
    runner: SchedulerRunner,
    sim_gpu_nodes: Callable[..., SimGpuNode],
) -> None:
    gpu_node = sim_gpu_nodes(reversed_offers=True)
    core = client.CoreV1Api(k8s)
    kubelet, names, on_5, meant_for_5 = _swapped(k8s, namespace, queue(8), gpu_node)

    gpu_node.sim.inject("xid", gpu=5, xid=48)
    until(kubelet, lambda: on_5 not in _names(core, namespace), "the pod really on GPU 5 is evicted")
    assert meant_for_5 in _names(core, namespace), "the pod gpuwarden meant for GPU 5 runs on"
    assert _names(core, namespace) == set(names) - {on_5}


def test_holders_last_read_still_decide_after_the_podresources_socket_vanishes(
    k8s: client.ApiClient,
    namespace: str,
    queue: Callable[..., str],
    runner: SchedulerRunner,
    sim_gpu_nodes: Callable[..., SimGpuNode],
) -> None:
    gpu_node = sim_gpu_nodes(reversed_offers=True)
    core = client.CoreV1Api(k8s)
    kubelet, _pods, on_5, meant_for_5 = _swapped(k8s, namespace, queue(8), gpu_node)
    custom = client.CustomObjectsApi(k8s)

    def read_failed() -> bool:
        status = custom.get_cluster_custom_object(
            contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL, gpu_node.name
        ).get("status", {})
        return (status.get(contract.GPUNODE_POD_RESOURCES) or {}).get("ok") is False

    # The kubelet restarts: its socket goes away. The agent says so and keeps the holders it read.
    gpu_node.devices.stop()
    until(kubelet, read_failed, "the agent reports the failed read")
    assert _published(gpu_node, k8s, {5: on_5})

    gpu_node.sim.inject("xid", gpu=5, xid=48)
    until(kubelet, lambda: on_5 not in _names(core, namespace), "the pod last reported on GPU 5 is evicted")
    assert meant_for_5 in _names(core, namespace)


def test_pods_of_another_scheduler_are_attributed_to_their_real_gpus(
    k8s: client.ApiClient,
    namespace: str,
    queue: Callable[..., str],
    runner: SchedulerRunner,
    sim_gpu_nodes: Callable[..., SimGpuNode],
) -> None:
    gpu_node = sim_gpu_nodes(reversed_offers=True)
    core = client.CoreV1Api(k8s)
    kubelet = Kubelet(k8s, namespace, {gpu_node.name: gpu_node.devices})
    wait_for(lambda: gpu_node.agent.daemon.published_seq > 0, 30, description="the agent publishes")
    # A pod kube-scheduler (or KAI) placed: bound at creation, one GPU.
    foreign_pod(k8s, namespace, gpu_node.name, "theirs")
    until(kubelet, lambda: gpu_node.gpus_of(namespace, "theirs") == (7,), "the device manager gives it GPU 7")
    until(kubelet, lambda: _published(gpu_node, k8s, {7: "theirs"}), "the agent publishes it on GPU 7")

    def seated() -> tuple[int, ...] | None:
        last = runner.last
        if last is None:
            return None
        for job in last.snapshot.jobs:
            for task in job.tasks:
                if task.name == "theirs" and task.namespace == namespace:
                    return task.gpu_indices
        return None

    # Without the kubelet's word the scheduler would guess GPU 0 (the first free).
    until(kubelet, lambda: seated() == (7,), "the scheduler seats it on GPU 7")
    q = queue(8)
    podgroup(k8s, namespace, "ours", q, 1)
    pod(k8s, namespace, "ours", group="ours", gpus=7)
    until(kubelet, lambda: bool(_assigned(core, namespace, "ours")), "ours is placed")
    assert _assigned(core, namespace, "ours") == (0, 1, 2, 3, 4, 5, 6), json.dumps(seated())


def test_a_whole_gpu_pod_the_device_manager_puts_on_a_quarantined_gpu_is_evicted_and_placed_again(
    k8s: client.ApiClient,
    namespace: str,
    queue: Callable[..., str],
    runner: SchedulerRunner,
    sim_gpu_nodes: Callable[..., SimGpuNode],
) -> None:
    # One node at first: with a healthy node about, placement would keep the pod off this one.
    sick = sim_gpu_nodes("e2e-sick")
    core = client.CoreV1Api(k8s)
    kubelet = Kubelet(k8s, namespace, {sick.name: sick.devices})
    wait_for(lambda: sick.agent.daemon.published_seq > 0, 30, description="the agent publishes")
    # A stray process keeps GPU 0's reset waiting, so it stays quarantined for the test;
    # a downed NVLink is a fault the device plugin does not check: it still offers GPU 0.
    sick.sim.inject("processes", gpu=0, count=1)
    sick.sim.inject("nvlink_down", gpu=0, link=0)

    def quarantined() -> str:
        return str((core.read_node(sick.name).metadata.annotations or {}).get(contract.ANNOTATION_QUARANTINED_GPUS))

    until(kubelet, lambda: quarantined() == "0", "GPU 0 is quarantined")
    assert sick.index_of(sick.sim.device_plugin_devices()[0]) == 0, "the device plugin still offers it"

    q = queue(16)
    podgroup(k8s, namespace, "solo", q, 1)
    pod(k8s, namespace, "solo", group="solo")
    # gpuwarden keeps it off GPU 0; the device manager (first free offered device) puts it there.
    until(kubelet, lambda: sick.gpus_of(namespace, "solo") == (0,), "the device manager starts it on GPU 0")
    assert _assigned(core, namespace, "solo") != (0,)

    until(kubelet, lambda: "solo" not in _names(core, namespace), "the pod on the quarantined GPU is evicted")

    def told() -> list[Any]:
        events = core.list_namespaced_event(namespace, field_selector="involvedObject.name=solo").items
        return [e for e in events if e.reason == contract.EVENT_POD_ON_QUARANTINED_GPU]

    # The Event is written right after the eviction; the stand-in kubelet may delete the pod first.
    until(kubelet, lambda: bool(told()), "the eviction is explained in an Event")
    (said,) = told()
    assert f"GPU 0 ({sick.sim.sample_gpus()[0].uuid}) of node {sick.name}" in said.message
    assert "GpuNvlinkDegraded/NvlinkDown" in said.message, said.message
    assert f"its job is kept off node {sick.name} for 60s" in said.message, said.message
    evicted = runner.metrics.registry.get_sample_value(
        "gpuwarden_scheduler_pods_on_quarantined_gpu_total", {"outcome": "Evicted"}
    )
    assert evicted is not None and evicted >= 1

    # A healthy node joins; the job's controller makes its pod again: it goes there, not
    # back to the node whose device manager may choose GPU 0 again.
    well = sim_gpu_nodes("e2e-well")
    kubelet.devices[well.name] = well.devices
    wait_for(lambda: well.agent.daemon.published_seq > 0, 30, description="the new node's agent publishes")
    pod(k8s, namespace, "solo-again", group="solo")
    until(kubelet, lambda: bool(well.gpus_of(namespace, "solo-again")), "it runs again, on the healthy node")
    assert core.read_namespaced_pod("solo-again", namespace).spec.node_name == well.name


def test_a_drain_of_one_gpu_evicts_the_pod_of_another_scheduler_the_kubelet_reports_there(
    k8s: client.ApiClient,
    namespace: str,
    queue: Callable[..., str],
    runner: SchedulerRunner,
    sim_gpu_nodes: Callable[..., SimGpuNode],
) -> None:
    gpu_node = sim_gpu_nodes(reversed_offers=True)
    core = client.CoreV1Api(k8s)
    kubelet = Kubelet(k8s, namespace, {gpu_node.name: gpu_node.devices})
    wait_for(lambda: gpu_node.agent.daemon.published_seq > 0, 30, description="the agent publishes")
    # Another scheduler's pod, bound at creation: it carries no assignment of gpuwarden's.
    foreign_pod(k8s, namespace, gpu_node.name, "theirs")
    until(kubelet, lambda: gpu_node.gpus_of(namespace, "theirs") == (7,), "the device manager gives it GPU 7")
    podgroup(k8s, namespace, "ours", queue(8), 1)
    pod(k8s, namespace, "ours", group="ours")
    until(kubelet, lambda: bool(gpu_node.gpus_of(namespace, "ours")), "ours runs")
    assert gpu_node.gpus_of(namespace, "ours") != (7,)
    until(kubelet, lambda: _published(gpu_node, k8s, {7: "theirs"}), "the agent publishes it on GPU 7")

    # A double-bit ECC error on GPU 7: a reset fault, so GPU 7 alone is quarantined and drained.
    gpu_node.sim.inject("xid", gpu=7, xid=48)
    until(kubelet, lambda: "theirs" not in _names(core, namespace), "the pod the kubelet reports on GPU 7 is evicted")
    assert "ours" in _names(core, namespace), "a pod on another GPU runs on"
    assert core.read_node(gpu_node.name).spec.unschedulable is not True, "one GPU's drain does not cordon the node"

    def reset_asked() -> bool:
        events = core.list_namespaced_event("default", field_selector=f"involvedObject.name={gpu_node.name}").items
        return any(e.reason == EventReason.RESET_REQUESTED for e in events)

    # With its only pod gone the drain finishes: the GPU goes on to its reset.
    until(kubelet, reset_asked, "the drain ends and the GPU's reset is asked for")
