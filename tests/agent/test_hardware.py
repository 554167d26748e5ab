"""Which sources stand behind the interfaces: the backend is chosen once, from the flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import config_from_dict
from agent.hardware import build_hardware
from agent.sim.sources import SimGpuBackend, SimIbSource, SimKmsgSource, SimMountSource
from agent.sources.infiniband import SysfsIbSource
from agent.sources.nvml import NvmlBackend
from agent.sources.storage import StatvfsMountSource
from tests.agent.fake_pynvml import h100_node
from tests.agent.sysfs_tree import two_hcas


def test_sim_reads_nothing_from_the_host() -> None:
    hw = build_hardware("sim", config_from_dict(None), scenario="healthy")
    assert isinstance(hw.gpu, SimGpuBackend) and isinstance(hw.kmsg, SimKmsgSource)
    assert isinstance(hw.ib, SimIbSource) and isinstance(hw.mounts, SimMountSource)
    hw.gpu.open()
    try:
        assert len(hw.gpu.sample()) == 8
    finally:
        hw.close()


def test_nvml_reads_the_configured_kernel_log_sysfs_and_mounts(tmp_path: Path) -> None:
    two_hcas(tmp_path)
    kmsg = tmp_path / "kmsg.txt"
    kmsg.write_text("")
    cfg = config_from_dict({"kmsg_path": str(kmsg), "sysfs_root": str(tmp_path), "infiniband": {"netdev": False}})
    hw = build_hardware("nvml", cfg, nvml_module=h100_node())
    try:
        assert isinstance(hw.gpu, NvmlBackend) and isinstance(hw.ib, SysfsIbSource)
        assert isinstance(hw.mounts, StatvfsMountSource) and hw.kmsg is not None
        assert sorted((p.device, p.port) for p in hw.ib.read_ports()) == [("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_1", 2)]
    finally:
        hw.close()


def test_a_missing_kernel_log_leaves_that_source_out() -> None:
    cfg = config_from_dict({"kmsg_path": "/nonexistent/kmsg"})
    assert build_hardware("nvml", cfg, nvml_module=h100_node()).kmsg is None


def test_an_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown backend 'dcgm'"):
        build_hardware("dcgm", config_from_dict(None))
