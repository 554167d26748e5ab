"""The simulated GPU reset: what it repairs, what it refuses, and the scenario option that fails it."""

from __future__ import annotations

import pytest

from agent.sim.node import SimNode
from agent.sim.scenario import Scenario, SimGpus, SimReset, scenario_from_dict
from agent.sources.base import GpuResetError


def node(**reset: object) -> SimNode:
    return SimNode(Scenario(gpus=SimGpus(count=4, nvlinks=4), reset=SimReset(**reset)))  # type: ignore[arg-type]


def test_a_reset_repairs_what_a_reset_repairs_and_keeps_a_remap_failure() -> None:
    sim = node()
    sim.inject("remap_pending", gpu=1)
    sim.inject("remap_failure", gpu=1)
    sim.inject("nvlink_down", gpu=1, link=2)
    sim.inject("pcie_width", gpu=1, width=8)
    backend = sim.hardware().gpu
    backend.open()
    assert "successfully reset" in backend.reset(1)
    g = sim.sample_gpus()[1]
    assert g.remapped_rows is not None and not g.remapped_rows.pending and g.remapped_rows.failure
    assert all(link.active for link in g.nvlinks)
    assert g.pcie is not None and g.pcie.current_width == 16
    assert sim.resets == [1]


def test_processes_are_listed_and_a_busy_gpu_is_not_reset() -> None:
    sim = node()
    sim.inject("processes", gpu=2, count=3)
    backend = sim.hardware().gpu
    backend.open()
    assert len(backend.running_processes(2)) == 3
    assert backend.running_processes(0) == ()
    with pytest.raises(GpuResetError, match="in use by 3 processes"):
        backend.reset(2)
    sim.inject("processes", gpu=2, count=0)
    backend.reset(2)


def test_the_scenario_can_make_a_gpus_reset_fail() -> None:
    sc = scenario_from_dict({"gpus": {"count": 2}, "reset": {"fail_gpus": [1], "error": "GPU needs a reboot"}})
    sim = SimNode(sc)
    backend = sim.hardware().gpu
    backend.open()
    backend.reset(0)
    with pytest.raises(GpuResetError, match="GPU needs a reboot"):
        backend.reset(1)


def test_a_lost_gpu_cannot_be_reset() -> None:
    sim = node()
    sim.inject("gpu_lost", gpu=3)
    backend = sim.hardware().gpu
    backend.open()
    with pytest.raises(GpuResetError, match="lost"):
        backend.reset(3)


def test_a_negative_process_count_is_refused() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        node().inject("processes", gpu=0, count=-1)
