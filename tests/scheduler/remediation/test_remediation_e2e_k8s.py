"""Remediation end to end: a real agent on the sim backend, the scheduler process's runner, a stand-in kubelet.

Nothing here writes what the agent or the scheduler would write: the agent
raises the condition from its sim's XID and answers the reset and validation
requests itself; the runner (watch cache, leader election, cycles, the
remediation controller) quarantines, drains, asks and returns. The test only
submits work, plays the kubelet (bound pods Running, evicted pods gone) and
reads back what happened.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from gpuwarden import contract
from scheduler.runner import SchedulerRunner
from tests.harness import wait_for
from tests.scheduler.cluster.kube_objects import pod, podgroup, refusing_pdb
from tests.scheduler.remediation.dra_objects import DriverGpu, driver_slice
from tests.scheduler.remediation.e2e import Kubelet, SimGpuNode, until

pytestmark = pytest.mark.k8s

DRA = ("resource.k8s.io", "v1")
JSON = dict[str, Any]


def test_an_xid_48_gpu_is_quarantined_drained_reset_validated_and_returned_by_agent_and_scheduler(
    k8s: client.ApiClient,
    namespace: str,
    queue: Callable[..., str],
    runner: SchedulerRunner,
    sim_gpu_nodes: Callable[..., SimGpuNode],
) -> None:
    gpu_node = sim_gpu_nodes()
    node, sim, agent = gpu_node.name, gpu_node.sim, gpu_node.agent
    core = client.CoreV1Api(k8s)
    kubelet = Kubelet(k8s, namespace, {node: gpu_node.devices})
    wait_for(lambda: agent.daemon.published_seq > 0, 30, description="the agent publishes")
    q = queue(8)
    # A gang of two and a single pod; a budget guards the gang member that
    # is not on the GPU about to fail.
    podgroup(k8s, namespace, "gang", q, 2)
    for name in ("gang-0", "gang-1"):
        pod(k8s, namespace, name, group="gang")
    podgroup(k8s, namespace, "solo", q, 1)
    pod(k8s, namespace, "solo", group="solo")

    def gpus_of(name: str) -> tuple[int, ...]:
        """The GPUs the kubelet's device manager gave the pod: where it really runs."""
        return gpu_node.gpus_of(namespace, name)

    until(kubelet, lambda: all(gpus_of(n) for n in ("gang-0", "gang-1", "solo")), "the work is placed")
    (sick,) = gpus_of("gang-0")
    core.patch_namespaced_pod("gang-1", namespace, {"metadata": {"labels": {"guard": "me"}}})
    refusing_pdb(k8s, namespace, "guard", {"guard": "me"})

    def label() -> str:
        labels = core.read_node(node).metadata.labels or {}
        return str(labels.get(contract.LABEL_REMEDIATION_STATE, ""))

    # The fault: the agent raises it, the scheduler fences that one GPU.
    sim.inject("xid", gpu=sick, xid=48)
    until(kubelet, lambda: label().startswith("gpu-"), "the GPU is quarantined")
    stored = core.read_node(node)
    assert stored.metadata.annotations[contract.ANNOTATION_QUARANTINED_GPUS] == str(sick)
    assert stored.spec.unschedulable is not True, "one GPU, not the node"

    # gang-0 (on the GPU) leaves; the budget holds gang-1 back, and says so.
    until(
        kubelet,
        lambda: "gang-0" not in {p.metadata.name for p in core.list_namespaced_pod(namespace).items},
        "the pod on the faulted GPU is drained",
    )
    groups = client.CustomObjectsApi(k8s)

    def blocked() -> bool:
        obj = groups.get_namespaced_custom_object(
            contract.SCHEDULING_API_GROUP,
            contract.SCHEDULING_API_VERSION,
            namespace,
            contract.PODGROUP_PLURAL,
            "gang",
        )
        return any(c.get("type") == "EvictionBlocked" for c in (obj.get("status") or {}).get("conditions") or [])

    until(kubelet, blocked, "the refused eviction is reported")
    assert core.read_namespaced_pod("solo", namespace).metadata.deletion_timestamp is None

    # The agent resets the GPU, validates it, and the scheduler returns it.
    until(kubelet, lambda: label() == "healthy", "the GPU returns to service", timeout=90)
    status = groups.get_cluster_custom_object(contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL, node)[
        "status"
    ]
    resets = status[contract.GPUNODE_REMEDIATION][contract.REMEDIATION_RESETS]
    assert [(r["gpu"], r["result"]) for r in resets] == [(sick, contract.RESET_SUCCEEDED)]
    # (The validation's answer leaves the status with its request; GpuReturned
    # below is the scheduler having read a pass newer than the reset.)
    assert contract.ANNOTATION_QUARANTINED_GPUS not in (core.read_node(node).metadata.annotations or {})
    reasons = {
        e.reason for e in core.list_namespaced_event("default", field_selector=f"involvedObject.name={node}").items
    }
    assert {"GpuQuarantined", "DrainStarted", "GpuResetRequested", "ValidationRequested", "GpuReturned"} <= reasons

    # The budget lifts: the gang's last member, alone below its minMember,
    # goes as a stale gang, and the returned GPU takes work again.
    client.PolicyV1Api(k8s).delete_namespaced_pod_disruption_budget("guard", namespace)
    until(
        kubelet,
        lambda: "gang-1" not in {p.metadata.name for p in core.list_namespaced_pod(namespace).items},
        "the rest of the gang leaves",
    )
    for i in range(7):
        podgroup(k8s, namespace, f"more-{i}", q, 1)
        pod(k8s, namespace, f"more-{i}", group=f"more-{i}")
    until(kubelet, lambda: all(gpus_of(f"more-{i}") for i in range(7)), "new work is placed")
    assert sick in {g for i in range(7) for g in gpus_of(f"more-{i}")}


def test_a_gpu_the_dra_driver_tainted_is_quarantined_repaired_and_returned_while_the_taint_stays(
    k8s: client.ApiClient,
    runner: SchedulerRunner,
    sim_gpu_nodes: Callable[..., SimGpuNode],
) -> None:
    """The driver's XID taint is a fault of that one GPU (scheduler/remediation/driverhealth.py).

    The agent sees nothing wrong: only NVIDIA's DRA driver reports the XID,
    by tainting the GPU's device in its ResourceSlice. Remediation takes
    that GPU out (and taints the device for every DRA allocator), the agent
    resets and validates it, and it returns; the driver's taint, which stays
    until the driver's plugin restarts, is the old fault then, not a new one.
    """
    gpu_node = sim_gpu_nodes(gpus=4)
    node, agent = gpu_node.name, gpu_node.agent
    core = client.CoreV1Api(k8s)
    custom = client.CustomObjectsApi(k8s)
    wait_for(lambda: agent.daemon.published_seq > 0, 30, description="the agent publishes")
    gpus = [DriverGpu(g.index, g.index, g.uuid, g.pci_bus_id) for g in gpu_node.sim.sample_gpus()]
    body = driver_slice(node, core.read_node(node).metadata.uid, gpus)
    sick = 2
    body["spec"]["devices"][sick]["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "48", "effect": "NoSchedule"}]
    made = custom.create_cluster_custom_object(*DRA, "resourceslices", body)
    kubelet = Kubelet(k8s, "default")
    try:
        (taint,) = made["spec"]["devices"][sick]["taints"]
        assert taint.get("timeAdded"), "the API server dates the driver's taint"

        def label() -> str:
            return str((core.read_node(node).metadata.labels or {}).get(contract.LABEL_REMEDIATION_STATE, ""))

        def rules() -> list[JSON]:
            return [
                r
                for r in custom.list_cluster_custom_object(*DRA, "devicetaintrules")["items"]
                if r["spec"]["deviceSelector"].get("pool") == node
            ]

        def events() -> dict[str, list[str]]:
            found: dict[str, list[str]] = {}
            for e in core.list_namespaced_event("default", field_selector=f"involvedObject.name={node}").items:
                found.setdefault(e.reason, []).append(e.message)
            return found

        # The sim agent resets and validates at once: the whole repair is read back from its Events.
        until(kubelet, lambda: "GpuReturned" in events(), "the GPU is quarantined, reset, validated and returned")
        seen = events()
        assert {"GpuQuarantined", "GpuResetRequested", "ValidationRequested", "GpuReturned"} <= seen.keys()
        (quarantined,) = seen["GpuQuarantined"]
        assert "GPU 2" in quarantined and "NVIDIA's DRA driver tainted device gpu-2" in quarantined, quarantined
        assert "NodeCordoned" not in seen, "one GPU, not the node"
        (returned,) = seen["GpuReturned"]
        assert f"NVIDIA's DRA driver still taints device gpu-2 of pool {node}" in returned, returned
        status = custom.get_cluster_custom_object(
            contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL, node
        )
        resets = status["status"][contract.GPUNODE_REMEDIATION][contract.REMEDIATION_RESETS]
        assert [(r["gpu"], r["result"]) for r in resets] == [(sick, contract.RESET_SUCCEEDED)]
        until(kubelet, lambda: label() == "healthy", "the node's remediation label says healthy")
        until(kubelet, lambda: rules() == [], "gpuwarden's device taint goes with the quarantine")
        # The driver's taint is still there; it is the fault that was repaired, not a new one.
        for _ in range(10):
            kubelet.step()
            assert label() == "healthy"
            assert contract.ANNOTATION_QUARANTINED_GPUS not in (core.read_node(node).metadata.annotations or {})
            time.sleep(0.3)
        assert len(events()["GpuQuarantined"]) == 1
        slice_now = custom.get_cluster_custom_object(*DRA, "resourceslices", made["metadata"]["name"])
        assert slice_now["spec"]["devices"][sick]["taints"][0]["key"] == "gpu.nvidia.com/xid"
    finally:
        with contextlib.suppress(client.ApiException):
            custom.delete_cluster_custom_object(*DRA, "resourceslices", made["metadata"]["name"])
