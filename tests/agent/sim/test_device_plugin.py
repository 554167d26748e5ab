"""What the simulated node's NVIDIA device plugin offers the kubelet: the gap gpuwarden's quarantine has."""

from __future__ import annotations

from agent.sim.node import SimNode
from agent.sim.scenario import load_scenario


def _offered(sim: SimNode) -> list[int]:
    index = {g.uuid: g.index for g in sim.sample_gpus()}
    return [index[u] for u in sim.device_plugin_devices()]


def test_a_critical_xid_takes_a_gpu_off_the_offer_until_a_reset() -> None:
    sim = SimNode(load_scenario("healthy"), identity="n1")
    assert _offered(sim) == list(range(8))
    sim.inject("xid", gpu=3, xid=48)
    sim.inject("xid", gpu=4, xid=13)  # an application error: the plugin skips it
    assert _offered(sim) == [0, 1, 2, 4, 5, 6, 7]
    sim.reset_gpu(3)
    assert _offered(sim) == list(range(8))


def test_faults_the_plugin_does_not_check_leave_the_gpu_offered() -> None:
    sim = SimNode(load_scenario("healthy"), identity="n1")
    sim.inject("nvlink_down", gpu=1, link=0)
    sim.inject("remap_failure", gpu=2)
    sim.inject("pcie_width", gpu=5, width=8)
    assert _offered(sim) == list(range(8))
    sim.inject("gpu_lost", gpu=6)
    assert 6 not in _offered(sim)
