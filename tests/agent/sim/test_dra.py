"""The simulated NVIDIA DRA driver: its slice has the driver's shape, and its health taints follow XIDs."""

from __future__ import annotations

from agent.sim.dra import TAINT_GPU_LOST, TAINT_XID, devices
from agent.sim.node import SimNode
from agent.sim.scenario import load_scenario
from scheduler.cluster.claims import ClaimStage, DraObjects
from scheduler.engine.model import Node, Queue, Snapshot
from tests.scheduler.remediation.dra_objects import DriverGpu, driver_slice


def test_a_device_has_the_attributes_and_capacity_the_driver_publishes() -> None:
    sim = SimNode(load_scenario("healthy"), identity="n1")
    published = devices(sim.dra_gpus())
    assert [d["name"] for d in published] == [f"gpu-{i}" for i in range(8)]
    first = sim.dra_gpus()[0]
    reference = driver_slice("n1", "uid", [DriverGpu(0, 0, first.uuid, first.bus)])["spec"]["devices"][0]
    assert published[0]["attributes"].keys() == reference["attributes"].keys()
    for key in ("type", "uuid", "resource.kubernetes.io/pciBusID"):
        assert published[0]["attributes"][key] == reference["attributes"][key]
    assert published[0]["capacity"] == {"memory": {"value": f"{first.memory_mib}Mi"}}


def test_a_critical_xid_taints_the_device_until_the_gpu_is_reset_and_a_lost_gpu_is_tainted_lost() -> None:
    sim = SimNode(load_scenario("healthy"), identity="n1")
    sim.inject("xid", gpu=3, xid=48)
    sim.inject("xid", gpu=4, xid=13)  # an application error: the driver's health check skips it too
    sim.inject("gpu_lost", gpu=6)
    taints = {d["name"]: d.get("taints") for d in devices(sim.dra_gpus())}
    assert taints["gpu-3"] == [{"key": TAINT_XID, "value": "48", "effect": "NoSchedule"}]
    assert taints["gpu-4"] is None
    assert {t["key"] for t in taints["gpu-6"]} == {TAINT_XID, TAINT_GPU_LOST}
    sim.reset_gpu(3)
    assert "taints" not in devices(sim.dra_gpus())[3]


def test_gpuwarden_reads_the_simulated_slice_as_the_node_s_gpus() -> None:
    sim = SimNode(load_scenario("healthy"), identity="n1")
    sim.inject("xid", gpu=2, xid=79)
    body = {
        "metadata": {"name": "s"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "n1",
            "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
            "devices": devices(sim.dra_gpus()),
        },
    }
    stage = ClaimStage()
    snapshot = Snapshot(nodes=(Node("n1", cpu_milli=1000, memory_mib=1000),), queues=(Queue("q"),), jobs=())
    judged = stage.apply(snapshot, DraObjects(pods={}, claims={}, classes={}, slices={"s": body}, rules={}))
    (node,) = judged.nodes
    assert [g.uuid for g in node.gpus] == [g.uuid for g in sim.dra_gpus()]
