"""The simulated node's state: its GPUs, ports, mounts, event queue and kernel log.

Plain mutable state that the fault handlers (:mod:`agent.sim.faults`) change
and that reads turn into the samples the real sources would return. It takes
no lock itself: :class:`~agent.sim.node.SimNode` holds one around every fault
and every read.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from agent.samples import (
    XID_RECOVERY_ACTION,
    EventSource,
    GpuEvent,
    GpuEventKind,
    GpuSample,
    IbCounters,
    IbPortSample,
    MountSample,
    NvlinkSample,
    PcieSample,
    RemappedRows,
    RetiredPages,
    parse_recovery_action,
)


@dataclass(slots=True)
class SimLink:
    """One NVLink: whether it is active, and its data-link error counters (cumulative, as NVML's)."""

    active: bool = True
    replay: int = 0
    recovery: int = 0
    crc_flit: int = 0
    crc_data: int = 0


# The XIDs NVIDIA's device plugin does not take as a sign of a sick GPU
# (application errors; k8s-device-plugin's health check skips them by default).
DEVICE_PLUGIN_SKIPPED_XIDS = frozenset({13, 31, 43, 45, 68, 109})


@dataclass(slots=True)
class SimGpu:
    index: int
    uuid: str
    bus: str  # as NVML spells it, 00000000:18:00.0
    kernel_bus: str  # as the driver's kernel-log lines spell it, 0000:18:00
    name: str
    memory_total: int
    memory_used: int
    mig: bool
    util: int
    row_remapping: bool
    remap_corr: int = 0
    remap_unc: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    retired_sbe: int = 0
    retired_dbe: int = 0
    retired_pending: bool = False
    links: list[SimLink] = field(default_factory=list)
    gen: int = 5
    max_gen: int = 5
    width: int = 16
    max_width: int = 16
    replays: int = 0
    lost: bool = False
    # Processes using the GPU (compute or graphics): a reset waits for none.
    processes: int = 0
    # The NVIDIA device plugin saw a critical XID on it and lists it Unhealthy
    # (until a reset: a plugin restarted after repair lists it again).
    plugin_unhealthy: bool = False
    # The last such XID: NVIDIA's DRA driver taints the device with it (agent/sim/dra.py).
    last_xid: int = 0

    def pids(self) -> tuple[int, ...]:
        """The PIDs NVML would list for the GPU's processes (made up, stable per GPU)."""
        return tuple(range(10_000 + 100 * self.index, 10_000 + 100 * self.index + self.processes))

    def sample(self) -> GpuSample:
        """What NVML would report for this GPU now."""
        if self.lost:
            return GpuSample(
                index=self.index,
                uuid=self.uuid,
                pci_bus_id=self.bus,
                name=self.name,
                memory_total_bytes=self.memory_total,
                lost=True,
            )
        return GpuSample(
            index=self.index,
            uuid=self.uuid,
            pci_bus_id=self.bus,
            name=self.name,
            memory_total_bytes=self.memory_total,
            memory_used_bytes=self.memory_used,
            mig_enabled=self.mig,
            utilization_gpu_pct=self.util,
            remapped_rows=RemappedRows(self.remap_corr, self.remap_unc, self.remap_pending, self.remap_failure)
            if self.row_remapping
            else None,
            retired_pages=None
            if self.row_remapping
            else RetiredPages(self.retired_sbe, self.retired_dbe, self.retired_pending),
            nvlinks=tuple(
                [
                    NvlinkSample(
                        link=i,
                        active=v.active,
                        replay_errors=v.replay,
                        recovery_errors=v.recovery,
                        crc_flit_errors=v.crc_flit,
                        crc_data_errors=v.crc_data,
                    )
                    for i, v in enumerate(self.links)
                ]
            ),
            pcie=PcieSample(self.gen, self.max_gen, self.width, self.max_width, self.replays),
        )


@dataclass(slots=True)
class SimPort:
    device: str
    port: int
    state: str
    phys_state: str
    rate: float
    link_layer: str
    netdev: str | None
    link_downed: int = 0
    symbol_error: int = 0
    link_error_recovery: int = 0
    port_rcv_errors: int = 0

    def sample(self) -> IbPortSample:
        """What sysfs and netlink would report for this port now."""
        return IbPortSample(
            device=self.device,
            port=self.port,
            state=self.state,
            phys_state=self.phys_state,
            rate_gbps=self.rate,
            link_layer=self.link_layer,
            counters=IbCounters(self.link_downed, self.symbol_error, self.link_error_recovery, self.port_rcv_errors),
            netdev=self.netdev,
            netdev_oper_state=None if self.netdev is None else ("UP" if self.state == "ACTIVE" else "LOWERLAYERDOWN"),
            netdev_speed_mbps=None if self.netdev is None or self.state != "ACTIVE" else int(self.rate * 1000),
            netdev_admin_up=None if self.netdev is None else True,
        )


def mount_sample(path: str, state: str) -> MountSample:
    """What a mount check reports for a mount in ``state`` (ok, hung or missing)."""
    if state == "missing":
        return MountSample(path, mounted=False, responsive=False, error="not a mount point")
    if state == "hung":
        return MountSample(path, mounted=True, responsive=False, error="statvfs has not answered")
    return MountSample(path, mounted=True, responsive=True, latency_s=0.0005)


class SimNodeState:
    """Everything one simulated node is, and the lookups faults name parts of it by."""

    def __init__(self, gpus: list[SimGpu], ports: list[SimPort], mounts: list[str]) -> None:
        self.gpus = gpus
        self.ports = ports
        self.mounts: dict[str, str] = dict.fromkeys(mounts, "ok")
        self.events: deque[GpuEvent] = deque()
        self.kmsg: list[str] = []
        self._seq = 0

    # ------------------------------------------------------------- lookups

    def gpu(self, params: dict[str, Any]) -> SimGpu:
        i = int(params["gpu"])
        if not 0 <= i < len(self.gpus):
            raise ValueError(f"sim node has no GPU {i} (it has {len(self.gpus)})")
        return self.gpus[i]

    def port(self, params: dict[str, Any]) -> SimPort:
        for p in self.ports:
            if p.device == params["device"] and p.port == int(params["port"]):
                return p
        raise ValueError(f"sim node has no IB port {params['device']}/{params['port']}")

    def mount(self, params: dict[str, Any]) -> str:
        path = str(params["path"])
        if path not in self.mounts:
            raise ValueError(f"sim node has no mount {path} (it has {', '.join(self.mounts) or 'none'})")
        return path

    def link(self, params: dict[str, Any]) -> SimLink:
        g = self.gpu(params)
        n = int(params["link"])
        if not 0 <= n < len(g.links):
            raise ValueError(f"sim GPU {g.index} has no NVLink {n} (it has {len(g.links)})")
        return g.links[n]

    # ------------------------------------------------------ what it reports

    def kmsg_line(self, level: int, text: str) -> None:
        """Log ``text`` to the kernel log, stamped like ``/dev/kmsg`` records are."""
        usec = int(time.monotonic() * 1_000_000)
        self.kmsg.append(f"{level},{self._seq},{usec},-;{text}")
        self._seq += 1

    def event(self, g: SimGpu, kind: GpuEventKind, xid: int | None = None, recovery_action: int | None = None) -> None:
        """Queue an NVML event about ``g``."""
        self.events.append(
            GpuEvent(
                kind=kind,
                source=EventSource.NVML,
                time=datetime.now(UTC),
                pci_bus_id=g.bus,
                uuid=g.uuid,
                xid=xid,
                recovery_action=recovery_action,
            )
        )

    def xid(self, g: SimGpu, xid: int, message: str) -> None:
        """An XID as the driver reports it: an NVML event and a kernel-log line.

        The device plugin watches the same events: any XID but the ones it
        skips as application errors makes it list the GPU Unhealthy.
        """
        if xid not in DEVICE_PLUGIN_SKIPPED_XIDS:
            g.plugin_unhealthy = True
            g.last_xid = xid
        # As the NVML backend reads XID 154's recovery action from NVML, the
        # simulated NVML knows the one the injected driver text names.
        self.event(g, GpuEventKind.XID, xid, parse_recovery_action(message) if xid == XID_RECOVERY_ACTION else None)
        self.kmsg_line(4, f"NVRM: Xid (PCI:{g.kernel_bus}): {xid}, pid='<unknown>', name=<unknown>, {message}")

    def sample_gpus(self) -> tuple[GpuSample, ...]:
        return tuple([g.sample() for g in self.gpus])

    def sample_ports(self) -> tuple[IbPortSample, ...]:
        return tuple([p.sample() for p in self.ports])

    def sample_mounts(self) -> tuple[MountSample, ...]:
        return tuple([mount_sample(path, state) for path, state in self.mounts.items()])
