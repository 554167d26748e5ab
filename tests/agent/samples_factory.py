"""Healthy raw samples for rule tests, changed one field at a time."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from agent.samples import (
    EventSource,
    GpuEvent,
    GpuEventKind,
    GpuSample,
    IbCounters,
    IbPortSample,
    MountSample,
    NodeSample,
    NvlinkSample,
    PcieSample,
    RemappedRows,
)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def gpu(i: int, **changes: Any) -> GpuSample:
    base = GpuSample(
        index=i,
        uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000",
        pci_bus_id=f"00000000:{BUSES[i % 8].upper()}:00.0",
        name="NVIDIA H100 80GB HBM3",
        memory_total_bytes=80 * 1024**3,
        memory_used_bytes=1024**3,
        mig_enabled=False,
        utilization_gpu_pct=0,
        remapped_rows=RemappedRows(0, 0, False, False),
        nvlinks=tuple(
            NvlinkSample(link=n, active=True, replay_errors=0, recovery_errors=0, crc_flit_errors=0, crc_data_errors=0)
            for n in range(4)
        ),
        pcie=PcieSample(current_gen=5, max_gen=5, current_width=16, max_width=16, replay_counter=0),
    )
    return replace(base, **changes)


def link(n: int, active: bool = True, replay: int = 0) -> NvlinkSample:
    return NvlinkSample(
        link=n, active=active, replay_errors=replay, recovery_errors=0, crc_flit_errors=0, crc_data_errors=0
    )


def pcie(**changes: Any) -> PcieSample:
    return replace(PcieSample(5, 5, 16, 16, 0), **changes)


def port(device: str, n: int = 1, **changes: Any) -> IbPortSample:
    base = IbPortSample(
        device=device,
        port=n,
        state="ACTIVE",
        phys_state="LinkUp",
        rate_gbps=400.0,
        link_layer="InfiniBand",
        counters=IbCounters(0, 0, 0, 0),
        netdev=None,
    )
    return replace(base, **changes)


def xid(i: int, number: int, t: datetime = T0, source: EventSource = EventSource.NVML) -> GpuEvent:
    g = gpu(i)
    return GpuEvent(kind=GpuEventKind.XID, source=source, time=t, pci_bus_id=g.pci_bus_id, uuid=g.uuid, xid=number)


def node(
    t: datetime = T0,
    gpus: int | tuple[GpuSample, ...] = 2,
    ports: int | tuple[IbPortSample, ...] = 2,
    **changes: Any,
) -> NodeSample:
    """A healthy node: ``gpus``/``ports`` are counts of healthy ones or the samples themselves."""
    base = NodeSample(
        time=t,
        gpus=tuple(gpu(i) for i in range(gpus)) if isinstance(gpus, int) else gpus,
        ib_ports=tuple(port(f"mlx5_{i}") for i in range(ports)) if isinstance(ports, int) else ports,
        mounts=(MountSample("/mnt/shared", mounted=True, responsive=True, latency_s=0.001),),
    )
    return replace(base, **changes)
