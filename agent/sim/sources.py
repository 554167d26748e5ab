"""The sim's implementations of the source interfaces (:mod:`agent.sources.base`).

Each is a thin view of one :class:`~agent.sim.node.SimNode`, which does the
locking, the timeline and the waiting; they depend only on the reads listed in
:class:`SimReads`, so the node and its views stay two separate modules.
"""

from __future__ import annotations

from typing import Protocol

from agent.samples import GpuEvent, GpuSample, IbPortSample, MountSample
from agent.sources.base import BackendUnavailableError, GpuBackend, IbSource, KmsgSource, MountSource


class SimReads(Protocol):
    """What the sim sources read from their node."""

    boot_id: str

    def sample_gpus(self) -> tuple[GpuSample, ...]: ...

    def wait_event(self, timeout_s: float) -> GpuEvent | None: ...

    def read_kmsg(self, cursor: int, timeout_s: float) -> tuple[list[str], int]: ...

    def ib_ports(self) -> tuple[IbPortSample, ...]: ...

    def mounts(self) -> tuple[MountSample, ...]: ...

    def notify(self) -> None: ...

    def running_processes(self, index: int) -> tuple[int, ...]: ...

    def reset_gpu(self, index: int) -> str: ...


class SimGpuBackend(GpuBackend):
    name = "sim"

    def __init__(self, node: SimReads) -> None:
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

    def running_processes(self, index: int) -> tuple[int, ...]:
        if not self._open:
            raise BackendUnavailableError("sim GPU backend is not open")
        return self.node.running_processes(index)

    def reset(self, index: int) -> str:
        if not self._open:
            raise BackendUnavailableError("sim GPU backend is not open")
        return self.node.reset_gpu(index)


class SimKmsgSource(KmsgSource):
    live_stamps = True  # stamped with CLOCK_MONOTONIC as they are logged, like a VM's kernel

    def __init__(self, node: SimReads) -> None:
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
    def __init__(self, node: SimReads) -> None:
        self.node = node

    def read_ports(self) -> tuple[IbPortSample, ...]:
        return self.node.ib_ports()


class SimMountSource(MountSource):
    def __init__(self, node: SimReads) -> None:
        self.node = node

    def check(self) -> tuple[MountSample, ...]:
        return self.node.mounts()
