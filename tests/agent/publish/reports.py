"""Hand-built HealthReports for the publisher tests.

The publishers' contract is the report, so most tests build one directly
rather than running the rules; the end-to-end tests drive the sim backend.
"""

from __future__ import annotations

from datetime import UTC, datetime

from agent.model import Entity, EventType, Fault, GpuStatus, HealthEvent, HealthReport, IbPortStatus
from gpuwarden.contract import Action, ConditionType, Reason, xid_reason

T0 = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)
GPU_MIB = 81559


def gpu_entity(index: int) -> Entity:
    return Entity.gpu(index, f"GPU-{index:04d}-aaaa", f"00000000:{0x18 + index:02X}:00.0")


def xid_fault(index: int, xid: int = 79, *, since: datetime = T0) -> Fault:
    return Fault(
        condition=ConditionType.GPU_XID_ERROR,
        reason=xid_reason(xid),
        message=f"Xid {xid}: GPU has fallen off the bus",
        action=Action.REBOOT,
        entity=gpu_entity(index),
        since=since,
        latched=True,
    )


def remap_fault(index: int, *, failure: bool = False) -> Fault:
    return Fault(
        condition=ConditionType.GPU_MEMORY_DEGRADED,
        reason=Reason.ROW_REMAP_FAILURE if failure else Reason.ROW_REMAP_PENDING,
        message="row remap failed" if failure else "row remap pending, takes effect after a GPU reset",
        action=Action.REPLACE if failure else Action.RESET_GPU,
        entity=gpu_entity(index),
        since=T0,
        latched=True,
    )


def ib_fault(device: str = "mlx5_0", port: int = 1) -> Fault:
    return Fault(
        condition=ConditionType.INFINIBAND_DEGRADED,
        reason=Reason.IB_PORT_DOWN,
        message="port state DOWN, physical state Disabled",
        action=Action.REPLACE,
        entity=Entity.ib(device, port),
        since=T0,
    )


def report(
    *faults: Fault,
    gpus: int = 8,
    node: str = "gpu-node",
    time: datetime = T0,
    events: tuple[HealthEvent, ...] = (),
    errors: tuple[str, ...] = (),
    ib_ports: int = 2,
    with_inventory: bool = True,
) -> HealthReport:
    """A report for a node with ``gpus`` GPUs; a GPU with a fault is unhealthy."""
    gpu_list: list[GpuStatus] = []
    if with_inventory:
        for i in range(gpus):
            entity = gpu_entity(i)
            mine = tuple(f for f in faults if f.entity == entity)
            gpu_list.append(
                GpuStatus(
                    index=i,
                    uuid=entity.uuid or "",
                    pci_bus_id=entity.pci_bus_id or "",
                    model="NVIDIA H100 80GB HBM3",
                    memory_total_mib=GPU_MIB,
                    memory_used_mib=1024 * i,
                    mig_enabled=False,
                    healthy=not mine,
                    faults=mine,
                )
            )
    ports: list[IbPortStatus] = []
    if with_inventory:
        for p in range(ib_ports):
            entity = Entity.ib(f"mlx5_{p}", 1)
            mine = tuple(f for f in faults if f.entity == entity)
            ports.append(
                IbPortStatus(
                    device=f"mlx5_{p}",
                    port=1,
                    state="DOWN" if mine else "ACTIVE",
                    phys_state="Disabled" if mine else "LinkUp",
                    rate_gbps=400.0,
                    link_layer="InfiniBand",
                    netdev=f"ib{p}",
                    healthy=not mine,
                    faults=mine,
                )
            )
    return HealthReport(
        node=node,
        time=time,
        gpus=tuple(gpu_list),
        ib_ports=tuple(ports),
        faults=tuple(faults),
        events=events,
        errors=errors,
    )


def app_xid_event(index: int = 0, xid: int = 13) -> HealthEvent:
    return HealthEvent(
        EventType.WARNING,
        xid_reason(xid),
        f"Xid {xid}: graphics engine exception; the application on this GPU likely crashed, restart it",
        gpu_entity(index),
        T0,
    )
