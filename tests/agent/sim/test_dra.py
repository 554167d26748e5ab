"""The simulated NVIDIA DRA driver: its slice has the driver's shape, and its health taints follow XIDs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agent.sim.dra import TAINT_GPU_LOST, TAINT_XID, devices
from agent.sim.node import SimNode
from agent.sim.scenario import load_scenario
from scheduler.cluster.claims import ClaimStage, DraObjects
from scheduler.engine.model import Node, Queue, Snapshot
from tests.scheduler.remediation.dra_objects import DriverGpu, driver_slice, mig_devices


def _as_gpuwarden_reads(published: list[dict[str, Any]]) -> Node:
    """Node n1 as gpuwarden's claim stage makes it from a slice of ``published`` devices (and no GPUNode)."""
    body = {
        "metadata": {"name": "s"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "n1",
            "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
            "devices": published,
        },
    }
    snapshot = Snapshot(nodes=(Node("n1", cpu_milli=1000, memory_mib=1000),), queues=(Queue("q"),), jobs=())
    judged = ClaimStage().apply(snapshot, DraObjects(pods={}, claims={}, classes={}, slices={"s": body}, rules={}))
    (node,) = judged.nodes
    return node


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
    node = _as_gpuwarden_reads(devices(sim.dra_gpus()))
    assert [g.uuid for g in node.gpus] == [g.uuid for g in sim.dra_gpus()]


def test_a_gpu_in_mig_mode_is_published_as_its_instances_and_gpuwarden_offers_them() -> None:
    scenario = load_scenario("healthy")
    sim = SimNode(replace(scenario, gpus=replace(scenario.gpus, mig=True)), identity="n1")
    sim.inject("xid", gpu=1, xid=48)
    published = devices(sim.dra_gpus())
    gpu0 = sim.dra_gpus()[0]
    assert [d["name"] for d in published[:7]] == [f"gpu-0-mig-1g10gb-19-{i}" for i in range(7)]
    assert len(published) == 56
    first = published[0]
    # The shape of the driver's instance (tests/scheduler/remediation/dra_objects.py reads it from the driver).
    reference = mig_devices(DriverGpu(0, 0, gpu0.uuid, gpu0.bus), [("1g.5gb", 0)])[0]
    assert first["attributes"].keys() == reference["attributes"].keys()
    assert first["capacity"].keys() == reference["capacity"].keys()
    assert first["attributes"]["parentUUID"] == {"string": gpu0.uuid}
    assert len(first["attributes"]["uuid"]["string"]) == len(gpu0.uuid)
    assert all(d["attributes"]["uuid"] for d in published)
    assert len({d["attributes"]["uuid"]["string"] for d in published}) == 56
    # The GPU's XID taints its instances.
    assert all("taints" in d for d in published[7:14]) and not any("taints" in d for d in published[:7])
    node = _as_gpuwarden_reads(published)
    parents = [g for g in node.gpus if g.mig_enabled]
    assert [g.uuid for g in parents] == [g.uuid for g in sim.dra_gpus()]
    assert sum(1 for g in node.gpus if g.parent is not None) == 56
