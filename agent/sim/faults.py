"""The faults a sim node can be given: one table from kind to its parameters and handler.

:data:`FAULTS` is the only place a kind is defined: a scenario's ``faults``
entries are checked against it when loaded, :meth:`agent.sim.node.SimNode.inject`
checks a call against it, and its handler changes the node's state
(:class:`~agent.sim.state.SimNodeState`). A fault takes effect at the next read
of the affected source; XIDs and lost GPUs also queue an NVML event and a
kernel-log line, exactly like a real driver. The kinds, with their required
and [optional] parameters::

    xid              gpu, xid[, message]   NVML event + kernel-log line
    gpu_lost         gpu                   GPU_IS_LOST from NVML, XID 79 and "fallen off the bus"
    gpu_reset        gpu                   what a successful GPU reset does: remap pending applied,
                                           links up, PCIe back at maximum
    remap_pending    gpu[, count]          a row remap waiting for a reset
    remap_failure    gpu                   no spare rows left
    nvlink_down      gpu, link
    nvlink_up        gpu, link
    nvlink_errors    gpu, link, count      add to the replay counter of a link
    pcie_width       gpu, width            current link width
    pcie_gen         gpu, gen              current link generation
    pcie_replays     gpu, count            add to the PCIe replay counter
    utilization      gpu, pct
    processes        gpu, count            that many processes use the GPU (0: none); a reset waits
    ib_rate          device, port, rate_gbps
    ib_down          device, port          port DOWN/Polling, netdev LOWERLAYERDOWN
    ib_up            device, port
    ib_link_downed   device, port[, count] link_downed counter increments
    mount_hung       path                  statvfs stops answering
    mount_missing    path                  no longer a mount point
    mount_ok         path

A parameter that names something the node does not have (GPU 9 of 8, an
unknown port) raises ``ValueError`` from the handler.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.samples import GpuEventKind
from agent.sim.state import SimNodeState

Params = dict[str, Any]


@dataclass(frozen=True, slots=True)
class FaultKind:
    """What a fault kind needs (``params``, all required) and what it does (``apply``)."""

    params: tuple[str, ...]
    apply: Callable[[SimNodeState, Params], None]


def missing_params(kind: str, params: Params) -> list[str]:
    """The required parameters of ``kind`` that ``params`` lacks (``kind`` must be known)."""
    return [p for p in FAULTS[kind].params if p not in params]


def _xid(node: SimNodeState, p: Params) -> None:
    node.xid(node.gpu(p), int(p["xid"]), str(p.get("message") or "injected by the gpuwarden sim"))


def _gpu_lost(node: SimNodeState, p: Params) -> None:
    g = node.gpu(p)
    node.xid(g, 79, "GPU has fallen off the bus.")
    node.kmsg_line(3, f"NVRM: GPU {g.kernel_bus}.0: GPU has fallen off the bus.")
    g.lost = True


def _gpu_reset(node: SimNodeState, p: Params) -> None:
    g = node.gpu(p)
    g.plugin_unhealthy = False
    g.last_xid = 0
    g.remap_pending = False
    g.retired_pending = False
    for link in g.links:
        link.active = True
    g.gen, g.width = g.max_gen, g.max_width


def _remap_pending(node: SimNodeState, p: Params) -> None:
    g = node.gpu(p)
    n = int(p.get("count") or 1)
    if g.row_remapping:
        g.remap_unc += n
        g.remap_pending = True
    else:
        g.retired_dbe += n
        g.retired_pending = True
    node.event(g, GpuEventKind.RETIREMENT)


def _remap_failure(node: SimNodeState, p: Params) -> None:
    g = node.gpu(p)
    g.remap_failure = True
    node.event(g, GpuEventKind.RETIREMENT_FAILURE)


def _nvlink_down(node: SimNodeState, p: Params) -> None:
    node.link(p).active = False


def _nvlink_up(node: SimNodeState, p: Params) -> None:
    node.link(p).active = True


def _nvlink_errors(node: SimNodeState, p: Params) -> None:
    node.link(p).replay += int(p["count"])


def _pcie_width(node: SimNodeState, p: Params) -> None:
    node.gpu(p).width = int(p["width"])


def _pcie_gen(node: SimNodeState, p: Params) -> None:
    node.gpu(p).gen = int(p["gen"])


def _pcie_replays(node: SimNodeState, p: Params) -> None:
    node.gpu(p).replays += int(p["count"])


def _utilization(node: SimNodeState, p: Params) -> None:
    node.gpu(p).util = int(p["pct"])


def _processes(node: SimNodeState, p: Params) -> None:
    count = int(p["count"])
    if count < 0:
        raise ValueError(f"sim GPU process count must not be negative, got {count}")
    node.gpu(p).processes = count


def _ib_rate(node: SimNodeState, p: Params) -> None:
    node.port(p).rate = float(p["rate_gbps"])


def _ib_down(node: SimNodeState, p: Params) -> None:
    port = node.port(p)
    port.state, port.phys_state = "DOWN", "Polling"
    port.link_downed += 1


def _ib_up(node: SimNodeState, p: Params) -> None:
    port = node.port(p)
    port.state, port.phys_state = "ACTIVE", "LinkUp"


def _ib_link_downed(node: SimNodeState, p: Params) -> None:
    node.port(p).link_downed += int(p.get("count") or 1)


def _mount_state(state: str) -> Callable[[SimNodeState, Params], None]:
    def apply(node: SimNodeState, p: Params) -> None:
        node.mounts[node.mount(p)] = state

    return apply


FAULTS: dict[str, FaultKind] = {
    "xid": FaultKind(("gpu", "xid"), _xid),
    "gpu_lost": FaultKind(("gpu",), _gpu_lost),
    "gpu_reset": FaultKind(("gpu",), _gpu_reset),
    "remap_pending": FaultKind(("gpu",), _remap_pending),
    "remap_failure": FaultKind(("gpu",), _remap_failure),
    "nvlink_down": FaultKind(("gpu", "link"), _nvlink_down),
    "nvlink_up": FaultKind(("gpu", "link"), _nvlink_up),
    "nvlink_errors": FaultKind(("gpu", "link", "count"), _nvlink_errors),
    "pcie_width": FaultKind(("gpu", "width"), _pcie_width),
    "pcie_gen": FaultKind(("gpu", "gen"), _pcie_gen),
    "pcie_replays": FaultKind(("gpu", "count"), _pcie_replays),
    "utilization": FaultKind(("gpu", "pct"), _utilization),
    "processes": FaultKind(("gpu", "count"), _processes),
    "ib_rate": FaultKind(("device", "port", "rate_gbps"), _ib_rate),
    "ib_down": FaultKind(("device", "port"), _ib_down),
    "ib_up": FaultKind(("device", "port"), _ib_up),
    "ib_link_downed": FaultKind(("device", "port"), _ib_link_downed),
    "mount_hung": FaultKind(("path",), _mount_state("hung")),
    "mount_missing": FaultKind(("path",), _mount_state("missing")),
    "mount_ok": FaultKind(("path",), _mount_state("ok")),
}
