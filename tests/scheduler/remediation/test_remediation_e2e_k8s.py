"""Remediation end to end: a real agent on the sim backend, the scheduler process's runner, a stand-in kubelet.

Nothing here writes what the agent or the scheduler would write: the agent
raises the condition from its sim's XID and answers the reset and validation
requests itself; the runner (watch cache, leader election, cycles, the
remediation controller) quarantines, drains, asks and returns. The test only
submits work, plays the kubelet (bound pods Running, evicted pods gone) and
reads back what happened.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kubernetes import client

from gpuwarden import contract
from scheduler.runner import SchedulerRunner
from tests.harness import wait_for
from tests.scheduler.cluster.kube_objects import pod, podgroup, refusing_pdb
from tests.scheduler.remediation.e2e import Kubelet, SimGpuNode, until

pytestmark = pytest.mark.k8s


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
