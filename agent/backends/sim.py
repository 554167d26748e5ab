"""The ``sim`` backend: a scripted GPU node with faults injected on demand.

A scenario file describes the node (GPU model, count, memory, NVLinks, PCIe,
HCAs, shared mounts) and a timeline of faults at given seconds after start.
The simulated node then answers through the same interfaces as the real one
(:mod:`agent.sources.base`): GPU samples and NVML-style events, kernel-log
records in the real ``/dev/kmsg`` format (so the kmsg parser and the NVML/kmsg
de-duplication run exactly as on hardware), InfiniBand port samples and mount
checks. Nothing is read from the host: the sim node is the whole node.

Injecting faults at run time
----------------------------
:meth:`SimNode.inject` is thread-safe and takes effect at the next read of
the affected source; XIDs and lost GPUs also wake the agent's event path at
once, exactly like a real NVML event or kernel-log line. Kinds and their
parameters (the same names as a scenario's ``faults`` entries)::

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
    ib_rate          device, port, rate_gbps
    ib_down          device, port          port DOWN/Polling, netdev LOWERLAYERDOWN
    ib_up            device, port
    ib_link_downed   device, port[, count] link_downed counter increments
    mount_hung       path                  statvfs stops answering
    mount_missing    path                  no longer a mount point
    mount_ok         path

Example, from a test or benchmark thread while the agent runs::

    node = SimNode(load_scenario("default"))
    monitor = Monitor(config, node.hardware(), "node-a")
    ...
    node.inject("xid", gpu=2, xid=79)

Unknown kinds or missing parameters raise ``ValueError`` naming them.
"""

from __future__ import annotations

import threading
import time
import uuid as uuidlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

from agent.config import ConfigError, from_mapping
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
    normalize_bus_id,
    parse_recovery_action,
)
from agent.sources.base import BackendUnavailableError, GpuBackend, IbSource, KmsgSource, MountSource, NodeHardware
from gpuwarden.logconfig import get_logger
from gpuwarden.yamlfile import load_yaml, parse_yaml

log = get_logger(__name__)

# ---------------------------------------------------------------------------
# Scenario files
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SimGpus:
    count: int = 8
    model: str = "NVIDIA H100 80GB HBM3"
    memory_mib: int = 81559
    nvlinks: int = 18
    pcie_max_gen: int = 5
    pcie_max_width: int = 16
    # False: a pre-Ampere GPU with dynamic page retirement instead.
    row_remapping: bool = True
    utilization_pct: int = 0
    mig: bool = False


@dataclass(frozen=True, slots=True)
class SimInfiniband:
    hcas: int = 8
    ports_per_hca: int = 1
    rate_gbps: float = 400.0
    link_layer: str = "InfiniBand"
    netdevs: bool = True


@dataclass(frozen=True, slots=True)
class SimFault:
    at: float
    inject: str
    gpu: int | None = None
    xid: int | None = None
    message: str | None = None
    link: int | None = None
    count: int | None = None
    width: int | None = None
    gen: int | None = None
    pct: int | None = None
    device: str | None = None
    port: int | None = None
    rate_gbps: float | None = None
    path: str | None = None

    def params(self) -> dict[str, Any]:
        names = ("gpu", "xid", "message", "link", "count", "width", "gen", "pct", "device", "port", "rate_gbps", "path")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str = "sim"
    description: str = ""
    gpus: SimGpus = field(default_factory=SimGpus)
    infiniband: SimInfiniband = field(default_factory=SimInfiniband)
    mounts: list[str] = field(default_factory=list)
    faults: list[SimFault] = field(default_factory=list)


def scenario_from_dict(data: Any, source: str = "scenario") -> Scenario:
    try:
        sc: Scenario = from_mapping(Scenario, data, "")
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    for i, f in enumerate(sc.faults):
        if f.inject not in _INJECT_PARAMS:
            raise ConfigError(
                f"{source}: faults[{i}].inject: unknown kind {f.inject!r} (known: {', '.join(_INJECT_PARAMS)})"
            )
        missing = [p for p in _INJECT_PARAMS[f.inject] if p not in f.params()]
        if missing:
            raise ConfigError(f"{source}: faults[{i}]: {f.inject} needs {', '.join(missing)}")
    return sc


def list_scenarios() -> list[str]:
    """Names of the scenarios shipped in the package."""
    root = resources.files("agent.scenarios")
    return sorted(p.name.removesuffix(".yaml") for p in root.iterdir() if p.name.endswith(".yaml"))


def load_scenario(name_or_path: str) -> Scenario:
    """A shipped scenario by name (``default``) or a scenario file by path."""
    path = Path(name_or_path)
    if path.suffix in {".yaml", ".yml"} or "/" in name_or_path:
        return scenario_from_dict(load_yaml(path, "scenario file", ConfigError), str(path))
    res = resources.files("agent.scenarios").joinpath(f"{name_or_path}.yaml")
    if not res.is_file():
        raise ConfigError(f"no scenario named {name_or_path!r} (shipped: {', '.join(list_scenarios())})")
    source = f"scenario {name_or_path}"
    return scenario_from_dict(parse_yaml(res.read_text(), source, ConfigError), source)


# ---------------------------------------------------------------------------
# The simulated node
# ---------------------------------------------------------------------------

_BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")


@dataclass(slots=True)
class _Gpu:
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
    links: list[list[int]] = field(default_factory=list)  # [active, replay, recovery, crc_flit, crc_data]
    gen: int = 5
    max_gen: int = 5
    width: int = 16
    max_width: int = 16
    replays: int = 0
    lost: bool = False


@dataclass(slots=True)
class _Port:
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


_INJECT_PARAMS: dict[str, tuple[str, ...]] = {
    "xid": ("gpu", "xid"),
    "gpu_lost": ("gpu",),
    "gpu_reset": ("gpu",),
    "remap_pending": ("gpu",),
    "remap_failure": ("gpu",),
    "nvlink_down": ("gpu", "link"),
    "nvlink_up": ("gpu", "link"),
    "nvlink_errors": ("gpu", "link", "count"),
    "pcie_width": ("gpu", "width"),
    "pcie_gen": ("gpu", "gen"),
    "pcie_replays": ("gpu", "count"),
    "utilization": ("gpu", "pct"),
    "ib_rate": ("device", "port", "rate_gbps"),
    "ib_down": ("device", "port"),
    "ib_up": ("device", "port"),
    "ib_link_downed": ("device", "port"),
    "mount_hung": ("path",),
    "mount_missing": ("path",),
    "mount_ok": ("path",),
}


class SimNode:
    """A simulated GPU node; see the module docstring for the inject API."""

    def __init__(self, scenario: Scenario, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.scenario = scenario
        self._monotonic = monotonic
        self._start: float | None = None
        self._cond = threading.Condition()
        self._timeline = sorted(scenario.faults, key=lambda f: f.at)
        self._next_fault = 0
        self._events: deque[GpuEvent] = deque()
        self._kmsg: list[str] = []
        self._seq = 0
        # One SimNode is one boot of a node: its kernel log's sequence
        # numbers hold across agents started on it, as on a real node.
        self.boot_id = uuidlib.uuid4().hex
        self._gpus = [self._make_gpu(i) for i in range(scenario.gpus.count)]
        self._ports = self._make_ports()
        self._mounts: dict[str, str] = dict.fromkeys(scenario.mounts, "ok")
        self._kmsg_line(6, "Linux version 6.1.0-sim (gpuwarden sim node)")
        self._kmsg_line(6, "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15")
        self.injected = 0

    def _make_gpu(self, i: int) -> _Gpu:
        g = self.scenario.gpus
        kernel_bus = f"0000:{_BUSES[i] if i < len(_BUSES) else format(0x10 + i, '02x')}:00"
        mem = g.memory_mib * 1024 * 1024
        return _Gpu(
            index=i,
            uuid="GPU-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"{self.scenario.name}.{i}.gpuwarden.sim")),
            bus=normalize_bus_id(kernel_bus),
            kernel_bus=kernel_bus,
            name=g.model,
            memory_total=mem,
            memory_used=mem // 50,
            mig=g.mig,
            util=g.utilization_pct,
            row_remapping=g.row_remapping,
            links=[[1, 0, 0, 0, 0] for _ in range(g.nvlinks)],
            gen=g.pcie_max_gen,
            max_gen=g.pcie_max_gen,
            width=g.pcie_max_width,
            max_width=g.pcie_max_width,
        )

    def _make_ports(self) -> list[_Port]:
        ib = self.scenario.infiniband
        ports = []
        for h in range(ib.hcas):
            for p in range(1, ib.ports_per_hca + 1):
                netdev = None
                if ib.netdevs:
                    netdev = f"ib{h * ib.ports_per_hca + p - 1}" if ib.link_layer == "InfiniBand" else f"eth{h}p{p}"
                ports.append(_Port(f"mlx5_{h}", p, "ACTIVE", "LinkUp", ib.rate_gbps, ib.link_layer, netdev))
        return ports

    def hardware(self) -> NodeHardware:
        """The node's four sources, for :class:`~agent.monitor.Monitor`."""
        return NodeHardware(
            gpu=SimGpuBackend(self), kmsg=SimKmsgSource(self), ib=SimIbSource(self), mounts=SimMountSource(self)
        )

    # ---------------------------------------------------------------- time

    def _advance(self) -> None:
        """Apply timeline faults that are due (caller holds the lock)."""
        now = self._monotonic()
        if self._start is None:
            self._start = now
        elapsed = now - self._start
        while self._next_fault < len(self._timeline) and self._timeline[self._next_fault].at <= elapsed:
            f = self._timeline[self._next_fault]
            self._next_fault += 1
            try:
                self._apply(f.inject, f.params())
            except ValueError as exc:
                log.error("sim_scenario_fault_invalid", scenario=self.scenario.name, at=f.at, error=str(exc))

    # -------------------------------------------------------------- inject

    def inject(self, kind: str, **params: Any) -> None:
        """Inject a fault now (thread-safe); see the module docstring."""
        needed = _INJECT_PARAMS.get(kind)
        if needed is None:
            raise ValueError(f"unknown sim fault kind {kind!r} (known: {', '.join(_INJECT_PARAMS)})")
        missing = [p for p in needed if p not in params]
        if missing:
            raise ValueError(f"sim fault {kind} needs {', '.join(missing)}")
        with self._cond:
            self._advance()
            self._apply(kind, params)
            self._cond.notify_all()

    def _gpu(self, params: dict[str, Any]) -> _Gpu:
        i = int(params["gpu"])
        if not 0 <= i < len(self._gpus):
            raise ValueError(f"sim node has no GPU {i} (it has {len(self._gpus)})")
        return self._gpus[i]

    def _port(self, params: dict[str, Any]) -> _Port:
        for p in self._ports:
            if p.device == params["device"] and p.port == int(params["port"]):
                return p
        raise ValueError(f"sim node has no IB port {params['device']}/{params['port']}")

    def _mount(self, params: dict[str, Any]) -> str:
        path = str(params["path"])
        if path not in self._mounts:
            raise ValueError(f"sim node has no mount {path} (it has {', '.join(self._mounts) or 'none'})")
        return path

    def _apply(self, kind: str, p: dict[str, Any]) -> None:
        self.injected += 1
        log.info("sim_fault_injected", kind=kind, **{k: v for k, v in p.items() if k != "message"})
        if kind == "xid":
            g = self._gpu(p)
            self._xid(g, int(p["xid"]), str(p.get("message") or "injected by the gpuwarden sim"))
        elif kind == "gpu_lost":
            g = self._gpu(p)
            self._xid(g, 79, "GPU has fallen off the bus.")
            self._kmsg_line(3, f"NVRM: GPU {g.kernel_bus}.0: GPU has fallen off the bus.")
            g.lost = True
        elif kind == "gpu_reset":
            g = self._gpu(p)
            g.remap_pending = False
            g.retired_pending = False
            for link in g.links:
                link[0] = 1
            g.gen, g.width = g.max_gen, g.max_width
        elif kind == "remap_pending":
            g = self._gpu(p)
            n = int(p.get("count") or 1)
            if g.row_remapping:
                g.remap_unc += n
                g.remap_pending = True
            else:
                g.retired_dbe += n
                g.retired_pending = True
            self._event(g, GpuEventKind.RETIREMENT)
        elif kind == "remap_failure":
            g = self._gpu(p)
            g.remap_failure = True
            self._event(g, GpuEventKind.RETIREMENT_FAILURE)
        elif kind in {"nvlink_down", "nvlink_up", "nvlink_errors"}:
            g = self._gpu(p)
            n = int(p["link"])
            if not 0 <= n < len(g.links):
                raise ValueError(f"sim GPU {g.index} has no NVLink {n} (it has {len(g.links)})")
            if kind == "nvlink_errors":
                g.links[n][1] += int(p["count"])
            else:
                g.links[n][0] = 1 if kind == "nvlink_up" else 0
        elif kind == "pcie_width":
            self._gpu(p).width = int(p["width"])
        elif kind == "pcie_gen":
            self._gpu(p).gen = int(p["gen"])
        elif kind == "pcie_replays":
            self._gpu(p).replays += int(p["count"])
        elif kind == "utilization":
            self._gpu(p).util = int(p["pct"])
        elif kind == "ib_rate":
            self._port(p).rate = float(p["rate_gbps"])
        elif kind == "ib_down":
            port = self._port(p)
            port.state, port.phys_state = "DOWN", "Polling"
            port.link_downed += 1
        elif kind == "ib_up":
            port = self._port(p)
            port.state, port.phys_state = "ACTIVE", "LinkUp"
        elif kind == "ib_link_downed":
            self._port(p).link_downed += int(p.get("count") or 1)
        elif kind == "mount_hung":
            self._mounts[self._mount(p)] = "hung"
        elif kind == "mount_missing":
            self._mounts[self._mount(p)] = "missing"
        elif kind == "mount_ok":
            self._mounts[self._mount(p)] = "ok"

    def _kmsg_line(self, level: int, text: str) -> None:
        usec = int(time.monotonic() * 1_000_000)
        self._kmsg.append(f"{level},{self._seq},{usec},-;{text}")
        self._seq += 1

    def _event(self, g: _Gpu, kind: GpuEventKind, xid: int | None = None, recovery_action: int | None = None) -> None:
        self._events.append(
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

    def _xid(self, g: _Gpu, xid: int, message: str) -> None:
        # As the NVML backend reads XID 154's recovery action from NVML, the
        # simulated NVML knows the one the injected driver text names.
        self._event(g, GpuEventKind.XID, xid, parse_recovery_action(message) if xid == XID_RECOVERY_ACTION else None)
        self._kmsg_line(4, f"NVRM: Xid (PCI:{g.kernel_bus}): {xid}, pid='<unknown>', name=<unknown>, {message}")

    # ---------------------------------------------------------------- reads

    def sample_gpus(self) -> tuple[GpuSample, ...]:
        with self._cond:
            self._advance()
            return tuple([self._sample(g) for g in self._gpus])

    def _sample(self, g: _Gpu) -> GpuSample:
        if g.lost:
            return GpuSample(
                index=g.index, uuid=g.uuid, pci_bus_id=g.bus, name=g.name, memory_total_bytes=g.memory_total, lost=True
            )
        return GpuSample(
            index=g.index,
            uuid=g.uuid,
            pci_bus_id=g.bus,
            name=g.name,
            memory_total_bytes=g.memory_total,
            memory_used_bytes=g.memory_used,
            mig_enabled=g.mig,
            utilization_gpu_pct=g.util,
            remapped_rows=RemappedRows(g.remap_corr, g.remap_unc, g.remap_pending, g.remap_failure)
            if g.row_remapping
            else None,
            retired_pages=None if g.row_remapping else RetiredPages(g.retired_sbe, g.retired_dbe, g.retired_pending),
            nvlinks=tuple(
                [
                    NvlinkSample(
                        link=i,
                        active=bool(v[0]),
                        replay_errors=v[1],
                        recovery_errors=v[2],
                        crc_flit_errors=v[3],
                        crc_data_errors=v[4],
                    )
                    for i, v in enumerate(g.links)
                ]
            ),
            pcie=PcieSample(g.gen, g.max_gen, g.width, g.max_width, g.replays),
        )

    def wait_event(self, timeout_s: float) -> GpuEvent | None:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                self._advance()
                if self._events:
                    return self._events.popleft()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(min(remaining, 0.25))

    def read_kmsg(self, cursor: int, timeout_s: float) -> tuple[list[str], int]:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                self._advance()
                if cursor < len(self._kmsg):
                    return self._kmsg[cursor:], len(self._kmsg)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return [], cursor
                self._cond.wait(min(remaining, 0.25))

    def ib_ports(self) -> tuple[IbPortSample, ...]:
        with self._cond:
            self._advance()
            return tuple(
                [
                    IbPortSample(
                        device=p.device,
                        port=p.port,
                        state=p.state,
                        phys_state=p.phys_state,
                        rate_gbps=p.rate,
                        link_layer=p.link_layer,
                        counters=IbCounters(p.link_downed, p.symbol_error, p.link_error_recovery, p.port_rcv_errors),
                        netdev=p.netdev,
                        netdev_oper_state=None
                        if p.netdev is None
                        else ("UP" if p.state == "ACTIVE" else "LOWERLAYERDOWN"),
                        netdev_speed_mbps=None if p.netdev is None or p.state != "ACTIVE" else int(p.rate * 1000),
                        netdev_admin_up=None if p.netdev is None else True,
                    )
                    for p in self._ports
                ]
            )

    def mounts(self) -> tuple[MountSample, ...]:
        with self._cond:
            self._advance()
            out = []
            for path, state in self._mounts.items():
                if state == "missing":
                    out.append(MountSample(path, mounted=False, responsive=False, error="not a mount point"))
                elif state == "hung":
                    out.append(MountSample(path, mounted=True, responsive=False, error="statvfs has not answered"))
                else:
                    out.append(MountSample(path, mounted=True, responsive=True, latency_s=0.0005))
            return tuple(out)

    def notify(self) -> None:
        with self._cond:
            self._cond.notify_all()


class SimGpuBackend(GpuBackend):
    name = "sim"

    def __init__(self, node: SimNode) -> None:
        self.node = node
        self._open = False

    def open(self) -> None:
        self._open = True

    def close(self) -> None:
        self._open = False

    def sample(self) -> tuple[GpuSample, ...]:
        if not self._open:
            raise BackendUnavailableError("sim GPU backend is not open")
        return self.node.sample_gpus()

    def wait_event(self, timeout_s: float) -> GpuEvent | None:
        return self.node.wait_event(timeout_s)


class SimKmsgSource(KmsgSource):
    live_stamps = True  # stamped with CLOCK_MONOTONIC as they are logged, like a VM's kernel

    def __init__(self, node: SimNode) -> None:
        self.node = node
        self.boot_id = node.boot_id
        self._cursor = 0
        self._closed = False

    def read(self, timeout_s: float) -> list[str]:
        if self._closed:
            return []
        records, self._cursor = self.node.read_kmsg(self._cursor, timeout_s)
        return records

    def close(self) -> None:
        self._closed = True
        self.node.notify()


class SimIbSource(IbSource):
    def __init__(self, node: SimNode) -> None:
        self.node = node

    def read_ports(self) -> tuple[IbPortSample, ...]:
        return self.node.ib_ports()


class SimMountSource(MountSource):
    def __init__(self, node: SimNode) -> None:
        self.node = node

    def check(self) -> tuple[MountSample, ...]:
        return self.node.mounts()
