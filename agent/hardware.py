"""Opening a node's hardware: which sources stand behind each interface.

The poll loop (:mod:`agent.monitor`) reads whatever :class:`NodeHardware` it
is handed and never chooses; the choice between the real node
(:mod:`agent.sources`) and a simulated one (:mod:`agent.sim`) is made here,
once, from the command line.
"""

from __future__ import annotations

from typing import Any

from agent.config import AgentConfig
from agent.sim.node import SimNode
from agent.sim.scenario import load_scenario
from agent.sources.base import NodeHardware, PodResourcesSource
from agent.sources.infiniband import SysfsIbSource
from agent.sources.kmsg import open_kmsg
from agent.sources.netdev import NetdevReader
from agent.sources.nvml import NvmlBackend
from agent.sources.podresources import KubeletPodResources
from agent.sources.storage import StatvfsMountSource


def build_hardware(
    backend: str,
    config: AgentConfig,
    scenario: str = "default",
    nvml_module: Any = None,
) -> NodeHardware:
    """Open the node's hardware sources for ``backend`` (``nvml`` or ``sim``).

    ``nvml`` reads the real node: NVML (``nvml_module`` defaults to the
    installed ``pynvml``), the kernel log at ``config.kmsg_path``, InfiniBand
    under ``config.sysfs_root`` with netlink for netdevs, and the configured
    mounts. ``sim`` simulates all of it from ``scenario`` (a shipped name or a
    file path); nothing is read from the host.

    Either backend reads the kubelet's PodResources API when
    ``config.pod_resources.socket`` names its socket: a simulated node's is
    served by the stand-in kubelet (:mod:`gpuwarden.podresources.fake`), so
    the sim runs the real reader.
    """
    pod_resources = _pod_resources(config)
    if backend == "sim":
        hardware = SimNode(load_scenario(scenario)).hardware()
        hardware.pod_resources = pod_resources
        return hardware
    if backend == "nvml":
        return NodeHardware(
            gpu=NvmlBackend(
                nvml_module,
                nvidia_smi=config.remediation.nvidia_smi,
                reset_timeout_s=config.remediation.reset_timeout_s,
            ),
            kmsg=open_kmsg(config.kmsg_path),
            ib=SysfsIbSource(config.sysfs_root, NetdevReader() if config.infiniband.netdev else None),
            mounts=StatvfsMountSource(config.storage.mounts, config.poll_interval_s),
            pod_resources=pod_resources,
        )
    raise ValueError(f"unknown backend {backend!r} (known: nvml, sim)")


def _pod_resources(config: AgentConfig) -> PodResourcesSource | None:
    socket = config.pod_resources.socket
    return KubeletPodResources(socket, config.pod_resources.timeout_s) if socket else None
