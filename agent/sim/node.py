"""One simulated node: its state, its fault timeline, and the reads its sources make.

:class:`SimNode` is built from a :class:`~agent.sim.scenario.Scenario`. It
owns everything about the node (state, lock, clock, boot id, timeline), so
any number of them can run in one process. Timeline faults are applied when
due, checked at every read; :meth:`SimNode.inject` applies one now, from any
thread, and wakes a source waiting for events or kernel-log records, so an
injected XID reaches the agent as fast as a real one. The fault kinds and
their parameters are those of :data:`agent.sim.faults.FAULTS`; unknown kinds
or missing parameters raise ``ValueError`` naming them.
"""

from __future__ import annotations

import threading
import time
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.samples import GpuEvent, GpuSample, IbPortSample, MountSample, normalize_bus_id
from agent.sim.faults import FAULTS, missing_params
from agent.sim.scenario import Scenario
from agent.sim.sources import SimGpuBackend, SimIbSource, SimKmsgSource, SimMountSource
from agent.sim.state import SimGpu, SimLink, SimNodeState, SimPort
from agent.sources.base import GpuResetError, NodeHardware
from gpuwarden.logconfig import get_logger

log = get_logger(__name__)

_BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")


def _make_gpu(scenario: Scenario, i: int, identity: str) -> SimGpu:
    g = scenario.gpus
    kernel_bus = f"0000:{_BUSES[i] if i < len(_BUSES) else format(0x10 + i, '02x')}:00"
    mem = g.memory_mib * 1024 * 1024
    return SimGpu(
        index=i,
        uuid="GPU-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"{identity}.{i}.gpuwarden.sim")),
        bus=normalize_bus_id(kernel_bus),
        kernel_bus=kernel_bus,
        name=g.model,
        memory_total=mem,
        memory_used=mem // 50,
        mig=g.mig,
        util=g.utilization_pct,
        row_remapping=g.row_remapping,
        links=[SimLink() for _ in range(g.nvlinks)],
        gen=g.pcie_max_gen,
        max_gen=g.pcie_max_gen,
        width=g.pcie_max_width,
        max_width=g.pcie_max_width,
    )


def _make_ports(scenario: Scenario) -> list[SimPort]:
    ib = scenario.infiniband
    ports = []
    for h in range(ib.hcas):
        for p in range(1, ib.ports_per_hca + 1):
            netdev = None
            if ib.netdevs:
                netdev = f"ib{h * ib.ports_per_hca + p - 1}" if ib.link_layer == "InfiniBand" else f"eth{h}p{p}"
            ports.append(SimPort(f"mlx5_{h}", p, "ACTIVE", "LinkUp", ib.rate_gbps, ib.link_layer, netdev))
    return ports


@dataclass(frozen=True, slots=True)
class DraGpuState:
    """A simulated GPU as the DRA driver sees it: identity, memory (MiB), and whether it is lost or saw an XID."""

    index: int
    uuid: str
    bus: str
    name: str
    memory_mib: int
    mig: bool
    lost: bool
    last_xid: int


class SimNode:
    """A simulated GPU node; see the module docstring."""

    def __init__(
        self,
        scenario: Scenario,
        monotonic: Callable[[], float] = time.monotonic,
        *,
        identity: str | None = None,
    ) -> None:
        """``identity`` (a node name) seeds the GPUs' UUIDs, which are stable per identity.

        Without it the scenario's name does, so one node simulated from a
        scenario always has the same GPUs; many nodes simulated from one
        scenario in one process pass their own names, or a cluster would see
        the same GPU UUID on every node.
        """
        self.scenario = scenario
        self._monotonic = monotonic
        self._start: float | None = None
        self._cond = threading.Condition()
        self._timeline = sorted(scenario.faults, key=lambda f: f.at)
        self._next_fault = 0
        # One SimNode is one boot of a node: its kernel log's sequence
        # numbers hold across agents started on it, as on a real node.
        self.boot_id = uuidlib.uuid4().hex
        self._state = SimNodeState(
            [_make_gpu(scenario, i, identity or scenario.name) for i in range(scenario.gpus.count)],
            _make_ports(scenario),
            scenario.mounts,
        )
        self._state.kmsg_line(6, "Linux version 6.1.0-sim (gpuwarden sim node)")
        self._state.kmsg_line(6, "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15")
        self.injected = 0
        # GPU resets asked of the node (tried, failed ones included), for tests.
        self.resets: list[int] = []

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
        """Inject a fault now (thread-safe); see :mod:`agent.sim.faults` for the kinds."""
        if kind not in FAULTS:
            raise ValueError(f"unknown sim fault kind {kind!r} (known: {', '.join(FAULTS)})")
        missing = missing_params(kind, params)
        if missing:
            raise ValueError(f"sim fault {kind} needs {', '.join(missing)}")
        with self._cond:
            self._advance()
            self._apply(kind, params)
            self._cond.notify_all()

    def _apply(self, kind: str, params: dict[str, Any]) -> None:
        self.injected += 1
        log.info("sim_fault_injected", kind=kind, **{k: v for k, v in params.items() if k != "message"})
        FAULTS[kind].apply(self._state, params)

    # ---------------------------------------------------------------- reads

    def sample_gpus(self) -> tuple[GpuSample, ...]:
        with self._cond:
            self._advance()
            return self._state.sample_gpus()

    def wait_event(self, timeout_s: float) -> GpuEvent | None:
        deadline = time.monotonic() + timeout_s
        events = self._state.events
        with self._cond:
            while True:
                self._advance()
                if events:
                    return events.popleft()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(min(remaining, 0.25))

    def read_kmsg(self, cursor: int, timeout_s: float) -> tuple[list[str], int]:
        deadline = time.monotonic() + timeout_s
        kmsg = self._state.kmsg
        with self._cond:
            while True:
                self._advance()
                if cursor < len(kmsg):
                    return kmsg[cursor:], len(kmsg)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return [], cursor
                self._cond.wait(min(remaining, 0.25))

    def ib_ports(self) -> tuple[IbPortSample, ...]:
        with self._cond:
            self._advance()
            return self._state.sample_ports()

    def mounts(self) -> tuple[MountSample, ...]:
        with self._cond:
            self._advance()
            return self._state.sample_mounts()

    def running_processes(self, index: int) -> tuple[int, ...]:
        with self._cond:
            self._advance()
            return self._state.gpu({"gpu": index}).pids()

    def dra_gpus(self) -> tuple[DraGpuState, ...]:
        """Each GPU as NVIDIA's DRA driver publishes it, with what its health taints read (agent/sim/dra.py)."""
        with self._cond:
            self._advance()
            return tuple(
                DraGpuState(g.index, g.uuid, g.bus, g.name, g.memory_total // 2**20, g.mig, g.lost, g.last_xid)
                for g in self._state.gpus
            )

    def device_plugin_devices(self) -> tuple[str, ...]:
        """The GPUs (UUIDs, in index order) NVIDIA's device plugin would list Healthy to the kubelet.

        It checks only XIDs (those it does not skip) and whether the GPU is
        there: a row-remap failure, a downed NVLink or a degraded PCIe link
        leave the GPU offered, which is the gap gpuwarden's quarantine has on
        device-plugin nodes. A GPU in MIG mode is offered as MIG devices,
        not whole.
        """
        with self._cond:
            self._advance()
            return tuple(g.uuid for g in self._state.gpus if not (g.lost or g.mig or g.plugin_unhealthy))

    def reset_gpu(self, index: int) -> str:
        """What ``nvidia-smi --gpu-reset`` does to the simulated GPU ``index``.

        A lost GPU cannot be reached, one in ``scenario.reset.fail_gpus``
        fails as the scenario says, and one still in use is refused, as the
        real command refuses; otherwise the GPU's injected faults that a reset
        repairs are gone (see the ``gpu_reset`` fault kind): a remap failure
        stays, since a reset finds no spare rows.
        """
        with self._cond:
            self._advance()
            g = self._state.gpu({"gpu": index})
            self.resets.append(index)
            if g.lost:
                raise GpuResetError(f"GPU {g.bus} is lost (fallen off the bus): it cannot be reset (simulated)")
            if index in self.scenario.reset.fail_gpus:
                raise GpuResetError(self.scenario.reset.error)
            if g.processes:
                raise GpuResetError(f"GPU {g.bus} is in use by {g.processes} processes (simulated)")
            FAULTS["gpu_reset"].apply(self._state, {"gpu": index})
            self._cond.notify_all()
        log.info("sim_gpu_reset", gpu=index)
        return f"GPU {g.bus} was successfully reset (simulated)"

    def notify(self) -> None:
        with self._cond:
            self._cond.notify_all()
