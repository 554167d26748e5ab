"""Each publisher against the real API server, driven with hand-built reports."""

from __future__ import annotations

import dataclasses
import json
import threading
from datetime import timedelta
from typing import Any

import pytest
from kubernetes import client

from agent.model import EventType, HealthEvent
from agent.publish.capacity import CapacityPublisher, capacity_from_node
from agent.publish.conditions import ConditionsPublisher, format_time
from agent.publish.events import EventsPublisher
from agent.publish.gpunode import GpuNodePublisher
from agent.publish.settings import DEFAULT_EVENTS_NAMESPACE
from gpuwarden import contract
from gpuwarden.contract import RESOURCE_GPU_MEMORY, ConditionType
from gpuwarden.kube import KubeApi
from tests.agent.publish.reports import GPU_MIB, T0, app_xid_event, gpu_entity, ib_fault, remap_fault, report, xid_fault
from tests.harness import ControlPlane, wait_for

pytestmark = pytest.mark.k8s


class Clocks:
    """Wall and monotonic clocks a test moves by hand (heartbeats, transitions)."""

    def __init__(self) -> None:
        self.wall = T0
        self.mono = 1000.0

    def advance(self, seconds: float) -> None:
        self.wall += timedelta(seconds=seconds)
        self.mono += seconds


def _node(api: client.ApiClient, name: str) -> dict[str, Any]:
    node = KubeApi(api, field_manager=contract.AGENT_COMPONENT).get_node(name)
    assert node is not None
    return node


def _conditions(node: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in node["status"]["conditions"]}


def _publisher(api: KubeApi, name: str, clocks: Clocks, period: float = 60.0) -> ConditionsPublisher:
    return ConditionsPublisher(
        api, name, heartbeat_period_s=period, clock=lambda: clocks.wall, monotonic=lambda: clocks.mono
    )


def test_conditions_merge_by_type_and_leave_the_kubelets_alone(
    k8s: client.ApiClient, gpu_node: str, control_plane: ControlPlane
) -> None:
    before = _conditions(_node(k8s, gpu_node))
    api = KubeApi(k8s, field_manager=contract.AGENT_COMPONENT)
    pub = _publisher(api, gpu_node, Clocks())
    pub.restore(_node(k8s, gpu_node))
    pub.publish(report(xid_fault(3), ib_fault("mlx5_1", 1)))

    after = _conditions(_node(k8s, gpu_node))
    for kubelet_type in ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure"):
        assert after[kubelet_type] == before[kubelet_type]
    assert {c.value for c in ConditionType} <= set(after)
    xid = after["GpuXidError"]
    assert (xid["status"], xid["reason"]) == ("True", "Xid79")
    entity = gpu_entity(3)
    for part in ("GPU 3", entity.uuid, entity.pci_bus_id, "Recommended action: REBOOT"):
        assert part in xid["message"]
    assert after["InfinibandDegraded"]["status"] == "True"
    assert "mlx5_1 port 1" in after["InfinibandDegraded"]["message"]
    assert after["GpuMissing"] == {
        "type": "GpuMissing",
        "status": "False",
        "reason": contract.HEALTHY_REASONS[ConditionType.GPU_MISSING],
        "message": "All expected GPUs visible",
        "lastHeartbeatTime": format_time(T0),
        "lastTransitionTime": format_time(T0),
    }
    jsonpath = '{.status.conditions[?(@.type=="GpuXidError")].status}'
    assert control_plane.kubectl("get", "node", gpu_node, "-o", f"jsonpath={jsonpath}").stdout == "True"


def test_unchanged_polls_send_nothing_and_heartbeats_refresh_only_the_heartbeat(
    k8s: client.ApiClient, gpu_node: str
) -> None:
    api = KubeApi(k8s, field_manager=contract.AGENT_COMPONENT)
    clocks = Clocks()
    pub = _publisher(api, gpu_node, clocks)
    pub.restore(_node(k8s, gpu_node))
    steady = report(remap_fault(2))
    assert pub.publish(steady)
    sent = api.stats.total_requests()
    for _ in range(10):
        clocks.advance(5)
        assert not pub.publish(steady)
    assert api.stats.total_requests() == sent
    first = _conditions(_node(k8s, gpu_node))["GpuMemoryDegraded"]

    clocks.advance(15)  # 65 s since the first publish: a heartbeat is due
    assert pub.publish(steady)
    assert api.stats.total_requests() == sent + 1
    second = _conditions(_node(k8s, gpu_node))["GpuMemoryDegraded"]
    assert second["lastHeartbeatTime"] == format_time(clocks.wall)
    assert second["lastHeartbeatTime"] != first["lastHeartbeatTime"]
    assert {k: v for k, v in second.items() if k != "lastHeartbeatTime"} == {
        k: v for k, v in first.items() if k != "lastHeartbeatTime"
    }


def test_transition_time_moves_only_when_the_status_flips(k8s: client.ApiClient, gpu_node: str) -> None:
    api = KubeApi(k8s, field_manager=contract.AGENT_COMPONENT)
    clocks = Clocks()
    pub = _publisher(api, gpu_node, clocks)
    pub.restore(_node(k8s, gpu_node))
    pub.publish(report(xid_fault(0)))
    raised = format_time(clocks.wall)
    clocks.advance(10)
    pub.publish(report(xid_fault(0), xid_fault(1, 48)))  # more GPUs: reason changes, status does not
    cond = _conditions(_node(k8s, gpu_node))["GpuXidError"]
    assert (cond["status"], cond["reason"], cond["lastTransitionTime"]) == ("True", "MultipleFaults", raised)
    assert "GPU 0" in cond["message"]
    assert "GPU 1" in cond["message"]
    clocks.advance(10)
    pub.publish(report(time=clocks.wall))  # the report that saw the XIDs cleared
    cond = _conditions(_node(k8s, gpu_node))["GpuXidError"]
    assert (cond["status"], cond["lastTransitionTime"]) == ("False", format_time(clocks.wall))


def test_concurrent_writers_never_lose_each_others_conditions(k8s: client.ApiClient, gpu_node: str) -> None:
    """The agent flips its conditions while another writer (a kubelet, NPD) writes its own."""
    api = KubeApi(k8s, field_manager=contract.AGENT_COMPONENT)
    clocks = Clocks()
    pub = _publisher(api, gpu_node, clocks)
    pub.restore(_node(k8s, gpu_node))
    core = client.CoreV1Api(k8s)
    errors: list[BaseException] = []

    def other_writer() -> None:
        try:
            for i in range(25):
                now = format_time(T0 + timedelta(seconds=i))
                core.patch_node_status(
                    gpu_node,
                    {
                        "status": {
                            "conditions": [
                                {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now},
                                {
                                    "type": "KernelDeadlock",
                                    "status": "False",
                                    "reason": f"KernelHasNoDeadlock{i}",
                                    "lastHeartbeatTime": now,
                                    "lastTransitionTime": now,
                                },
                            ]
                        }
                    },
                    _content_type="application/strategic-merge-patch+json",
                )
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    thread = threading.Thread(target=other_writer)
    thread.start()
    try:
        for i in range(25):
            clocks.advance(1)
            pub.publish(report(xid_fault(0)) if i % 2 == 0 else report())
    finally:
        thread.join(timeout=60)
    assert not errors
    conds = _conditions(_node(k8s, gpu_node))
    assert conds["KernelDeadlock"]["reason"] == "KernelHasNoDeadlock24"
    assert conds["Ready"]["status"] == "True"
    assert conds["GpuXidError"]["status"] == "True"  # i = 24 published the fault
    assert {c.value for c in ConditionType} <= set(conds)


def test_capacity_is_healthy_gpu_memory_and_follows_health(k8s: client.ApiClient, gpu_node: str) -> None:
    api = KubeApi(k8s, field_manager=contract.AGENT_COMPONENT)
    pub = CapacityPublisher(api, gpu_node)
    pub.restore(_node(k8s, gpu_node))
    others = {k: v for k, v in _node(k8s, gpu_node)["status"]["capacity"].items()}

    def capacity() -> tuple[str, str]:
        status = _node(k8s, gpu_node)["status"]
        return status["capacity"][RESOURCE_GPU_MEMORY], status["allocatable"][RESOURCE_GPU_MEMORY]

    pub.publish(report())
    assert capacity() == (str(8 * GPU_MIB), str(8 * GPU_MIB))
    pub.publish(report(xid_fault(3)))
    assert capacity() == (str(7 * GPU_MIB), str(7 * GPU_MIB))
    pub.publish(report(xid_fault(3), remap_fault(5)))
    assert capacity() == (str(6 * GPU_MIB), str(6 * GPU_MIB))
    pub.publish(report())  # repaired and re-validated
    assert capacity() == (str(8 * GPU_MIB), str(8 * GPU_MIB))
    # The kubelet's resources are untouched.
    status = _node(k8s, gpu_node)["status"]
    assert {k: v for k, v in status["capacity"].items() if k != RESOURCE_GPU_MEMORY} == others
    # An unchanged report sends nothing; a failed GPU probe keeps the value.
    sent = api.stats.total_requests()
    pub.publish(report())
    pub.publish(report(errors=("gpu: NVML failed to initialise",), with_inventory=False))
    assert api.stats.total_requests() == sent
    assert capacity() == (str(8 * GPU_MIB), str(8 * GPU_MIB))


def test_capacity_read_back_in_the_api_servers_canonical_form_is_the_value_sent(
    k8s: client.ApiClient, gpu_node: str
) -> None:
    """The API server stores 1000 as "1k": read back, that is 1000 MiB, not a malformed value sent again."""
    api = KubeApi(k8s, field_manager=contract.AGENT_COMPONENT)
    pub = CapacityPublisher(api, gpu_node)
    pub.restore(_node(k8s, gpu_node))
    base = report()
    small = dataclasses.replace(base, gpus=tuple(dataclasses.replace(g, memory_total_mib=125) for g in base.gpus))
    assert small.healthy_gpu_memory_mib == 1000
    assert pub.publish(small)
    node = _node(k8s, gpu_node)
    assert node["status"]["capacity"][RESOURCE_GPU_MEMORY] == "1k"  # the API server's spelling
    assert capacity_from_node(node) == 1000
    # The heartbeat hands the agent this Node: it already holds the value, so nothing is sent.
    pub.observe(node)
    sent = api.stats.total_requests()
    assert not pub.publish(small)
    assert api.stats.total_requests() == sent
    # A restarted agent takes it back as its own too.
    again = CapacityPublisher(api, gpu_node)
    assert again.restore(node) == 1000
    assert not again.publish(small)


def test_gpunode_is_owned_by_its_node_listed_and_collected_with_it(
    k8s: client.ApiClient, gpu_node: str, control_plane: ControlPlane
) -> None:
    api = KubeApi(k8s, field_manager=contract.AGENT_COMPONENT)
    node = _node(k8s, gpu_node)
    pub = GpuNodePublisher(api, gpu_node)
    pub.set_node_uid(node["metadata"]["uid"])
    pub.restore(api.get_gpunode(gpu_node))
    pub.publish(report(xid_fault(3), ib_fault("mlx5_1", 1)))

    obj = api.get_gpunode(gpu_node)
    assert obj is not None
    assert obj["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": gpu_node, "uid": node["metadata"]["uid"]}
    ]
    status = obj["status"]
    assert (status["gpuCount"], status["healthyGpuCount"]) == (8, 7)
    assert status["healthyGpuMemoryMiB"] == 7 * GPU_MIB
    assert status["action"] == "REPLACE"
    gpu3 = status["gpus"][3]
    assert (gpu3["index"], gpu3["uuid"], gpu3["pciBusId"]) == (3, gpu_entity(3).uuid, gpu_entity(3).pci_bus_id)
    assert (gpu3["healthy"], gpu3["migMode"], gpu3["memoryMiB"]) == (False, "Disabled", GPU_MIB)
    assert [(f["condition"], f["reason"], f["latched"]) for f in gpu3["faults"]] == [("GpuXidError", "Xid79", True)]
    port = status["ibPorts"][1]
    assert (port["device"], port["port"], port["state"], port["healthy"]) == ("mlx5_1", 1, "DOWN", False)
    assert port["rateGbps"] == 400.0

    table = control_plane.kubectl("get", "gpunodes", gpu_node).stdout.split("\n")
    assert table[0].split() == ["NAME", "GPUS", "HEALTHY", "MEMORY", "AGE"]
    assert table[1].split()[:4] == [gpu_node, "8", "7", str(7 * GPU_MIB)]

    # Unchanged: nothing sent. Only memory in use changed: nothing sent.
    sent = api.stats.total_requests()
    pub.publish(report(xid_fault(3), ib_fault("mlx5_1", 1)))
    assert api.stats.total_requests() == sent

    client.CoreV1Api(k8s).delete_node(gpu_node)
    # The garbage collector learns of a new resource (the GPUNode CRD, applied
    # by this test run) at its discovery sync, every 30 s in
    # kube-controller-manager; only then does it watch GPUNodes. A test that
    # runs right after the CRD is applied can wait that long first.
    wait_for(
        lambda: api.get_gpunode(gpu_node) is None,
        timeout=90,
        interval=0.2,
        description="garbage collector deletes the GPUNode of a deleted Node",
    )


def test_gpunode_faults_read_back_as_the_faults_published(k8s: client.ApiClient, gpu_node: str) -> None:
    api = KubeApi(k8s, field_manager=contract.AGENT_COMPONENT)
    pub = GpuNodePublisher(api, gpu_node)
    pub.set_node_uid(_node(k8s, gpu_node)["metadata"]["uid"])
    published = (xid_fault(3), remap_fault(4, failure=True), ib_fault("mlx5_0", 1))
    pub.publish(report(*published))
    again = GpuNodePublisher(api, gpu_node)
    restored = again.restore(api.get_gpunode(gpu_node))
    assert sorted(restored, key=lambda f: f.key) == sorted(published, key=lambda f: f.key)


def _events_for(k8s: client.ApiClient, node: str) -> list[dict[str, Any]]:
    core = client.CoreV1Api(k8s)
    raw: Any = core.list_namespaced_event(
        DEFAULT_EVENTS_NAMESPACE, field_selector=f"involvedObject.name={node}", _preload_content=False
    )
    items: list[dict[str, Any]] = json.loads(raw.data)["items"]
    return items


def test_events_are_written_per_transition_and_repeats_aggregate(k8s: client.ApiClient, gpu_node: str) -> None:
    api = KubeApi(k8s, field_manager=contract.AGENT_COMPONENT)
    pub = EventsPublisher(api, gpu_node)
    pub.set_node_uid(_node(k8s, gpu_node)["metadata"]["uid"])
    app = app_xid_event(2, 13)
    pub.enqueue([app])
    pub.flush()
    pub.enqueue([app, app])  # the job crash-loops: same XID, same GPU
    pub.flush()
    cleared = HealthEvent(EventType.NORMAL, "NoFatalXid", "Xid79 cleared after repair", gpu_entity(1), T0)
    pub.enqueue([cleared])
    pub.flush()

    events = {e["reason"]: e for e in _events_for(k8s, gpu_node)}
    assert set(events) == {"Xid13", "NoFatalXid"}
    xid = events["Xid13"]
    assert (xid["type"], xid["count"]) == ("Warning", 3)
    assert xid["involvedObject"]["kind"] == "Node"
    assert xid["source"]["component"] == contract.AGENT_COMPONENT
    assert "GPU 2" in xid["message"]
    assert "restart it" in xid["message"]
    assert events["NoFatalXid"]["type"] == "Normal"

    # A restarted agent continues the same Event rather than making another.
    restarted = EventsPublisher(api, gpu_node)
    restarted.enqueue([app])
    restarted.flush()
    counts = [e["count"] for e in _events_for(k8s, gpu_node) if e["reason"] == "Xid13"]
    assert counts == [4]


def test_an_event_the_api_server_rejects_is_logged_and_dropped_not_retried_forever(
    k8s: client.ApiClient, gpu_node: str, namespace: str
) -> None:
    """Core Events about a Node are accepted only in "default"; elsewhere each is invalid (422)."""
    api = KubeApi(k8s, field_manager=contract.AGENT_COMPONENT)
    misplaced = EventsPublisher(api, gpu_node, namespace=namespace)
    misplaced.enqueue([app_xid_event(0, 13), app_xid_event(1, 31)])
    assert misplaced.flush() == 2
    assert misplaced.pending() == 0
    assert api.stats.snapshot()[1] == {"create_event": 2}
    # The same events in the right place are written.
    right = EventsPublisher(api, gpu_node)
    right.enqueue([app_xid_event(0, 13)])
    right.flush()
    assert [e["reason"] for e in _events_for(k8s, gpu_node)] == ["Xid13"]


class _GatedApi(KubeApi):
    """The real API, with each Event creation held at a gate until the test opens it.

    Lets a test catch one flush in the middle of its request, which is where
    the daemon's shutdown flush can find the publisher thread.
    """

    def __init__(self, api_client: client.ApiClient) -> None:
        super().__init__(api_client, field_manager=contract.AGENT_COMPONENT)
        self.entered = threading.Event()
        self.gate = threading.Event()

    def create_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self.entered.set()
        self.gate.wait(timeout=30)
        return super().create_event(namespace, body)


def test_a_flush_from_a_second_thread_never_writes_the_same_event_again(k8s: client.ApiClient, gpu_node: str) -> None:
    api = _GatedApi(k8s)
    pub = EventsPublisher(api, gpu_node)
    pub.enqueue([app_xid_event(2, 13)])
    publisher = threading.Thread(target=pub.flush, name="publisher")
    publisher.start()
    assert api.entered.wait(timeout=10)
    # The shutdown flush while the publisher is inside its request: it waits
    # for that flush, and a bounded wait gives up without writing anything.
    assert pub.flush(wait_s=0.2) == 0
    shutdown = threading.Thread(target=pub.flush, name="shutdown")
    shutdown.start()
    api.gate.set()
    publisher.join(timeout=30)
    shutdown.join(timeout=30)
    assert not publisher.is_alive() and not shutdown.is_alive()
    assert pub.pending() == 0
    assert [(e["reason"], e["count"]) for e in _events_for(k8s, gpu_node)] == [("Xid13", 1)]
    assert api.stats.snapshot()[0] == {"create_event": 1}
