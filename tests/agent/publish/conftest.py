"""Fixtures for the publisher tests: the shipped manifests applied, GPU nodes, agents.

``agent_manifests`` applies manifests/ with kubectl for real (the GPUNode CRD,
the agent's namespace, ServiceAccount and RBAC) once per test run; every test
that writes GPUNodes or acts as the agent's ServiceAccount depends on it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from agent.config import config_from_dict
from agent.daemon import AgentDaemon
from agent.monitor import Monitor
from agent.publish.settings import DEFAULT_EVENTS_NAMESPACE, DaemonSettings
from agent.sim.node import SimNode
from agent.sim.scenario import load_scenario
from agent.sources.podresources import KubeletPodResources
from gpuwarden import contract
from gpuwarden.serving import MetricsSecurity
from tests.harness import ControlPlane, create_gpu_node, unique_name

MANIFESTS = Path(__file__).resolve().parents[3] / "manifests"
AGENT_NAMESPACE = "gpuwarden"
AGENT_SERVICE_ACCOUNT = "gpuwarden-agent"
GPUNODE_CRD = f"{contract.GPUNODE_PLURAL}.{contract.API_GROUP}"
WEBHOOK_CONFIGURATION = contract.WEBHOOK_COMPONENT
GPU_SHARING_POLICY_BINDING = "gpuwarden-gpu-sharing-fixed"
# Fast enough that a test sees a polled fault within a second or two, slow
# enough that several agents do not load a 2-core machine.
TEST_POLL_INTERVAL_S = 0.5


@pytest.fixture(scope="session")
def agent_manifests(control_plane: ControlPlane) -> Iterator[None]:
    """The kustomize base applied as a user would, removed at the end of the test run."""
    control_plane.kubectl("apply", "-k", str(MANIFESTS))
    control_plane.kubectl("wait", "--for=condition=Established", f"crd/{GPUNODE_CRD}", "--timeout=60s")
    # No scheduler pod runs behind the webhook's Service here, and its
    # failurePolicy is Fail: left in place it would refuse every GPU slice pod
    # the rest of the session creates. Its tests point their own copy at 127.0.0.1.
    control_plane.kubectl("delete", "mutatingwebhookconfiguration", WEBHOOK_CONFIGURATION, "--ignore-not-found")
    # Likewise the binding of the policy that fixes a pod's GPU-sharing
    # annotations: the scheduler's tests annotate pods after creation to see
    # the scheduler refuse them. Its own tests bind the policy to their namespace.
    control_plane.kubectl(
        "delete", "validatingadmissionpolicybinding", GPU_SHARING_POLICY_BINDING, "--ignore-not-found"
    )
    try:
        yield
    finally:
        control_plane.kubectl("delete", "-k", str(MANIFESTS), "--ignore-not-found", "--wait=false", check=False)


def delete_node_and_leftovers(api: client.ApiClient, name: str) -> None:
    """Remove a test node, its GPUNode and its Events, whatever state the test left."""
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    with contextlib.suppress(client.ApiException):
        core.delete_node(name)
    with contextlib.suppress(client.ApiException):
        custom.delete_cluster_custom_object(contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL, name)
    with contextlib.suppress(client.ApiException):
        core.delete_collection_namespaced_event(DEFAULT_EVENTS_NAMESPACE, field_selector=f"involvedObject.name={name}")


@pytest.fixture
def gpu_node(k8s: client.ApiClient, agent_manifests: None) -> Iterator[str]:
    """A Ready 8-GPU node (kubelet-style status) that is deleted after the test."""
    name = unique_name("gpu-node")
    create_gpu_node(k8s, name, gpus=8)
    try:
        yield name
    finally:
        delete_node_and_leftovers(k8s, name)


class SimAgent:
    """A connected agent on the sim backend, as `gpuwarden agent --backend sim` runs it."""

    def __init__(
        self,
        api: client.ApiClient,
        node_name: str,
        sim: SimNode,
        kmsg_state_file: str | None = None,
        pod_resources_socket: str | None = None,
        **settings: float | int | MetricsSecurity | None,
    ) -> None:
        self.sim = sim
        config = config_from_dict(
            {
                "poll_interval_s": TEST_POLL_INTERVAL_S,
                "kmsg_state_file": kmsg_state_file,
                "pod_resources": {"socket": pod_resources_socket, "timeout_s": 0.5},
            }
        )
        hardware = sim.hardware()
        if pod_resources_socket is not None:
            hardware.pod_resources = KubeletPodResources(pod_resources_socket, config.pod_resources.timeout_s)
        self.monitor = Monitor(config, hardware, node_name)
        values: dict[str, float | int | MetricsSecurity | None] = {
            "metrics_port": None,
            "backoff_base_s": 0.1,
            "backoff_cap_s": 1.0,
            "api_timeout_s": 2.0,
        }
        values.update(settings)
        self.daemon = AgentDaemon(self.monitor, api, DaemonSettings(node_name=node_name, **values))  # type: ignore[arg-type]
        self._stopped = False

    def start(self) -> SimAgent:
        self.daemon.start()
        return self

    def stop(self) -> None:
        """Stop the agent (idempotent: tests stop agents to restart them)."""
        if self._stopped:
            return
        self._stopped = True
        try:
            self.daemon.stop()
        finally:
            self.monitor.close()


@pytest.fixture
def sim_agent(k8s: client.ApiClient) -> Iterator[Callable[..., SimAgent]]:
    """Starts sim agents for a test and stops every one of them afterwards."""
    started: list[SimAgent] = []

    def start(
        node_name: str, sim: SimNode | None = None, kmsg_state_file: str | None = None, **settings: float | int | None
    ) -> SimAgent:
        agent = SimAgent(k8s, node_name, sim or SimNode(load_scenario("healthy")), kmsg_state_file, **settings)
        started.append(agent)
        return agent.start()

    try:
        yield start
    finally:
        for agent in reversed(started):
            agent.stop()
