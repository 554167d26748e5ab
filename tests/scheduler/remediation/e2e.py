"""What the remediation tests run against: the scheduler's runner, sim GPU nodes, and a stand-in kubelet.

A :class:`SimGpuNode` is a Node as the kubelet and NVIDIA's device plugin
create it, a :class:`~agent.sim.node.SimNode` behind it, the stand-in
kubelet's device manager (:class:`gpuwarden.localcluster.devices.DeviceManager`)
serving PodResources on a unix socket, and a real agent on the sim backend
reading that socket, so that the GPUNode says which pod the device manager
put on which GPU, exactly as on a real node.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client

from agent.sim.node import SimNode
from agent.sim.scenario import load_scenario
from gpuwarden import contract
from gpuwarden.localcluster.devices import DeviceManager
from scheduler.cluster.leader import LeaderElectionConfig
from scheduler.engine.model import SchedulerConfig
from scheduler.remediation.breaker import BreakerSettings
from scheduler.remediation.policy import ControllerSettings, Settings
from scheduler.runner import RunnerSettings, SchedulerRunner
from tests.agent.publish.conftest import SimAgent
from tests.harness import (
    ControlPlane,
    complete_pod_deletion,
    create_gpu_node,
    mark_pod_finished,
    mark_pod_running,
    unique_name,
    wait_for,
)


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
    # The whole pool may be out at once: the control plane serves the whole
    # test session, and the nodes that earlier tests leave cordoned, not
    # Ready or faulty are in the default pool too. With the default breaker
    # (a tenth of the pool) they held the quarantine these tests wait for,
    # depending on which tests ran before. The breaker has its own tests.
    remediation = ControllerSettings(
        machine=Settings(breaker=BreakerSettings(max_out_fraction=1.0, max_concurrent_drains=1000))
    )
    settings = RunnerSettings(
        period_s=0.3, lease=lease, remediation=remediation, config=SchedulerConfig(stale_gang_grace_s=2.0)
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
    """Plays the kubelet for one namespace: bound pods run, evicted pods finish leaving.

    With ``devices`` (per node, the stand-in device manager the node's sim
    agent reads over PodResources) a bound pod is first given its GPUs as
    the kubelet's device manager gives them: among those the simulated
    device plugin lists Healthy, never from gpuwarden's assignment. A pod
    the device manager cannot serve fails, as UnexpectedAdmissionError
    fails it.
    """

    def __init__(
        self, k8s: client.ApiClient, namespace: str, devices: Mapping[str, DeviceManager] | None = None
    ) -> None:
        self.k8s = k8s
        self.namespace = namespace
        self.devices = dict(devices or {})
        self.running: set[str] = set()

    def step(self) -> None:
        for p in client.CoreV1Api(self.k8s).list_namespaced_pod(self.namespace).items:
            name = p.metadata.name
            manager = self.devices.get(p.spec.node_name or "")
            with contextlib.suppress(client.ApiException):
                if p.metadata.deletion_timestamp is not None:
                    complete_pod_deletion(self.k8s, name, self.namespace)
                    self.running.discard(name)
                    if manager is not None:
                        manager.release(self.namespace, name)
                elif p.spec.node_name and name not in self.running and p.status.phase == "Pending":
                    if manager is not None and manager.admit(self.k8s.sanitize_for_serialization(p)) is None:
                        mark_pod_finished(self.k8s, name, self.namespace, succeeded=False)
                        continue
                    mark_pod_running(self.k8s, name, self.namespace)
                    self.running.add(name)


def until(kubelet: Kubelet, check: Callable[[], Any], description: str, timeout: float = 60) -> Any:
    """Play the kubelet until ``check()`` holds, while the scheduler runs."""

    def stepped() -> Any:
        kubelet.step()
        return check()

    return wait_for(stepped, timeout, interval=0.2, description=description)


@dataclass
class SimGpuNode:
    """One simulated GPU node: Node, sim hardware, device manager on a socket, agent reading it."""

    name: str
    sim: SimNode
    devices: DeviceManager
    agent: SimAgent
    socket_dir: str

    @classmethod
    def start(
        cls, k8s: client.ApiClient, prefix: str = "e2e-gpu", gpus: int = 8, *, reversed_offers: bool = False
    ) -> SimGpuNode:
        """``reversed_offers``: the device plugin lists its GPUs last index first, so the
        device manager's choice differs from gpuwarden's (which takes the lowest free index)."""
        name = unique_name(prefix)
        create_gpu_node(k8s, name, gpus=gpus)
        sim = SimNode(load_scenario("healthy"), identity=name)
        # A unix socket's path is short (108 bytes): not under pytest's tmp_path.
        socket_dir = tempfile.mkdtemp(prefix="gw-pr-")
        path = f"{socket_dir}/kubelet.sock"

        def offered() -> tuple[str, ...]:
            listed = sim.device_plugin_devices()
            return tuple(reversed(listed)) if reversed_offers else listed

        devices = DeviceManager(offered, path, node=name).start()
        agent = SimAgent(k8s, name, sim, pod_resources_socket=path).start()
        return cls(name, sim, devices, agent, socket_dir)

    def index_of(self, uuid: str) -> int:
        return next(g.index for g in self.sim.sample_gpus() if g.uuid == uuid)

    def gpus_of(self, namespace: str, pod: str) -> tuple[int, ...]:
        """The GPUs the device manager gave the pod: where it really runs."""
        return tuple(sorted(self.index_of(d) for d in self.devices.devices_of(namespace, pod)))

    def holders(self, k8s: client.ApiClient) -> dict[int, list[str]]:
        """Per GPU index, the pods the node's GPUNode says hold it (what the agent published)."""
        obj = client.CustomObjectsApi(k8s).get_cluster_custom_object(
            contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL, self.name
        )
        return {
            g["index"]: [h[contract.HOLDER_NAME] for h in g.get(contract.GPUNODE_GPU_PODS) or []]
            for g in (obj.get("status") or {}).get("gpus") or []
        }

    def stop(self, k8s: client.ApiClient) -> None:
        self.agent.stop()
        self.devices.stop()
        shutil.rmtree(self.socket_dir, ignore_errors=True)
        with contextlib.suppress(client.ApiException):
            client.CoreV1Api(k8s).delete_node(self.name)


@pytest.fixture
def sim_gpu_nodes(k8s: client.ApiClient) -> Iterator[Callable[..., SimGpuNode]]:
    """Starts :class:`SimGpuNode` s for a test and stops every one afterwards."""
    started: list[SimGpuNode] = []

    def start(prefix: str = "e2e-gpu", gpus: int = 8, *, reversed_offers: bool = False) -> SimGpuNode:
        made = SimGpuNode.start(k8s, prefix, gpus, reversed_offers=reversed_offers)
        started.append(made)
        return made

    try:
        yield start
    finally:
        for made in reversed(started):
            made.stop(k8s)
