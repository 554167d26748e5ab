"""Build ``/sys/class/infiniband`` fixture trees, laid out as the kernel does."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

_STATES = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4}
_PHYS = {"Sleep": 1, "Polling": 2, "Disabled": 3, "LinkUp": 5, "LinkErrorRecovery": 6}
_RATES = {
    400.0: "400 Gb/sec (4X NDR)",
    200.0: "200 Gb/sec (4X HDR)",
    100.0: "100 Gb/sec (4X EDR)",
    25.0: "25 Gb/sec (1X EDR)",
}


@dataclass
class PortSpec:
    device: str
    port: int = 1
    state: str = "ACTIVE"
    phys_state: str = "LinkUp"
    rate_gbps: float = 400.0
    link_layer: str = "InfiniBand"
    netdev: str | None = None
    counters: dict[str, int] = field(
        default_factory=lambda: {"link_downed": 0, "symbol_error": 0, "link_error_recovery": 0, "port_rcv_errors": 0}
    )


def write_port(root: Path, spec: PortSpec) -> None:
    dev = root / "class" / "infiniband" / spec.device
    pdir = dev / "ports" / str(spec.port)
    (pdir / "counters").mkdir(parents=True, exist_ok=True)
    (pdir / "state").write_text(f"{_STATES[spec.state]}: {spec.state}\n")
    (pdir / "phys_state").write_text(f"{_PHYS[spec.phys_state]}: {spec.phys_state}\n")
    (pdir / "rate").write_text(_RATES.get(spec.rate_gbps, f"{spec.rate_gbps:g} Gb/sec (4X)") + "\n")
    (pdir / "link_layer").write_text(spec.link_layer + "\n")
    for name, value in spec.counters.items():
        (pdir / "counters" / name).write_text(f"{value}\n")
    if spec.netdev:
        net = dev / "device" / "net" / spec.netdev
        net.mkdir(parents=True, exist_ok=True)
        (net / "dev_port").write_text(f"{spec.port - 1}\n")


def two_hcas(root: Path) -> list[PortSpec]:
    """mlx5_0: one healthy NDR port. mlx5_1: port 1 trained at HDR with the
    link flapping (link_downed 3), port 2 down and polling."""
    specs = [
        PortSpec("mlx5_0", 1, netdev="ib0"),
        PortSpec(
            "mlx5_1",
            1,
            rate_gbps=200.0,
            netdev="ib1",
            counters={"link_downed": 3, "symbol_error": 12, "link_error_recovery": 1, "port_rcv_errors": 4},
        ),
        PortSpec("mlx5_1", 2, state="DOWN", phys_state="Polling", rate_gbps=25.0, netdev="ib2"),
    ]
    for s in specs:
        write_port(root, s)
    return specs
