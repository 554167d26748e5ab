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
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from agent.sim.node import SimNode
from agent.sim.scenario import load_scenario
from gpuwarden import contract
from scheduler.cluster.assignment import decode_assignment
from scheduler.cluster.leader import LeaderElectionConfig
from scheduler.engine.model import SchedulerConfig
from scheduler.remediation.policy import ControllerSettings
from scheduler.runner import RunnerSettings, SchedulerRunner
from tests.agent.publish.conftest import SimAgent
from tests.harness import (
    ControlPlane,
    complete_pod_deletion,
    create_gpu_node,
    mark_pod_running,
    unique_name,
    wait_for,
)
from tests.scheduler.cluster.kube_objects import pod, podgroup, refusing_pdb

pytestmark = pytest.mark.k8s


@pytest.fixture
def runner(control_plane: ControlPlane, scheduler_crds: None, gpunode_crd: None) -> Iterator[SchedulerRunner]:
    """The scheduler as its Deployment runs it (one replica), with remediation, in threads."""
    lease = LeaderElectionConfig(
        namespace="default",
        name=unique_name("remediation-lease"),
        identity=unique_name("scheduler"),
        lease_duration_s=3.0,
        renew_deadline_s=2.0,
        retry_period_s=0.5,
    )
    # A short stale-gang grace: a gang left below minMember once its budget
    # lifts goes in seconds, not the default minute.
    settings = RunnerSettings(
        period_s=0.3, lease=lease, remediation=ControllerSettings(), config=SchedulerConfig(stale_gang_grace_s=2.0)
    )
    scheduler = SchedulerRunner(control_plane.api_client(), settings)
    stop = threading.Event()
    thread = threading.Thread(target=scheduler.run, args=(stop,), name="scheduler", daemon=True)
    thread.start()
    try:
        wait_for(scheduler.elector.is_leader, 30, description="the scheduler leads")
        yield scheduler
    finally:
        stop.set()
        thread.join(30)
        assert not thread.is_alive()


class Kubelet:
    """Plays the kubelet for one namespace: bound pods run, evicted pods finish leaving."""

    def __init__(self, k8s: client.ApiClient, namespace: str) -> None:
        self.k8s = k8s
        self.namespace = namespace
        self.running: set[str] = set()

    def step(self) -> None:
        for p in client.CoreV1Api(self.k8s).list_namespaced_pod(self.namespace).items:
            name = p.metadata.name
            with contextlib.suppress(client.ApiException):
                if p.metadata.deletion_timestamp is not None:
                    complete_pod_deletion(self.k8s, name, self.namespace)
                    self.running.discard(name)
                elif p.spec.node_name and name not in self.running:
                    mark_pod_running(self.k8s, name, self.namespace)
                    self.running.add(name)


def _until(kubelet: Kubelet, check: Callable[[], Any], description: str, timeout: float = 60) -> Any:
    def stepped() -> Any:
        kubelet.step()
        return check()

    return wait_for(stepped, timeout, interval=0.2, description=description)


def test_an_xid_48_gpu_is_quarantined_drained_reset_validated_and_returned_by_agent_and_scheduler(
    k8s: client.ApiClient,
    namespace: str,
    queue: Callable[..., str],
    runner: SchedulerRunner,
) -> None:
    node = unique_name("e2e-gpu")
    create_gpu_node(k8s, node, gpus=8)
    sim = SimNode(load_scenario("healthy"), identity=node)
    agent = SimAgent(k8s, node, sim).start()
    core = client.CoreV1Api(k8s)
    kubelet = Kubelet(k8s, namespace)
    try:
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
            stored = core.read_namespaced_pod(name, namespace)
            text = (stored.metadata.annotations or {}).get(contract.ANNOTATION_GPU_ASSIGNMENT)
            return decode_assignment(text) or () if text else ()

        _until(kubelet, lambda: all(gpus_of(n) for n in ("gang-0", "gang-1", "solo")), "the work is placed")
        (sick,) = gpus_of("gang-0")
        core.patch_namespaced_pod("gang-1", namespace, {"metadata": {"labels": {"guard": "me"}}})
        refusing_pdb(k8s, namespace, "guard", {"guard": "me"})

        def label() -> str:
            labels = core.read_node(node).metadata.labels or {}
            return str(labels.get(contract.LABEL_REMEDIATION_STATE, ""))

        # The fault: the agent raises it, the scheduler fences that one GPU.
        sim.inject("xid", gpu=sick, xid=48)
        _until(kubelet, lambda: label().startswith("gpu-"), "the GPU is quarantined")
        stored = core.read_node(node)
        assert stored.metadata.annotations[contract.ANNOTATION_QUARANTINED_GPUS] == str(sick)
        assert stored.spec.unschedulable is not True, "one GPU, not the node"

        # gang-0 (on the GPU) leaves; the budget holds gang-1 back, and says so.
        _until(
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

        _until(kubelet, blocked, "the refused eviction is reported")
        assert core.read_namespaced_pod("solo", namespace).metadata.deletion_timestamp is None

        # The agent resets the GPU, validates it, and the scheduler returns it.
        _until(kubelet, lambda: label() == "healthy", "the GPU returns to service", timeout=90)
        status = groups.get_cluster_custom_object(
            contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL, node
        )["status"]
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
        _until(
            kubelet,
            lambda: "gang-1" not in {p.metadata.name for p in core.list_namespaced_pod(namespace).items},
            "the rest of the gang leaves",
        )
        for i in range(7):
            podgroup(k8s, namespace, f"more-{i}", q, 1)
            pod(k8s, namespace, f"more-{i}", group=f"more-{i}")
        _until(kubelet, lambda: all(gpus_of(f"more-{i}") for i in range(7)), "new work is placed")
        assert sick in {g for i in range(7) for g in gpus_of(f"more-{i}")}
    finally:
        agent.stop()
        with contextlib.suppress(client.ApiException):
            core.delete_node(node)
