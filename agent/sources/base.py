"""The hardware interface the agent reads a node through.

Two implementations stand behind it: the real node (the other modules of
:mod:`agent.sources`: NVML through ``pynvml``, ``/dev/kmsg``, sysfs, netlink,
``statvfs``) and the sim (:mod:`agent.sim`: a scripted node from a scenario
file, with faults injected on demand). Keeping the seam
here, at the hardware, means every probe, rule and publisher above it runs the
same code in the demo, the benchmarks, the tests and production.

A node is four sources, and optionally a fifth, bundled in :class:`NodeHardware`:

* :class:`GpuBackend`: GPU samples and asynchronous GPU events (NVML).
* :class:`KmsgSource`: raw kernel-log records (the kmsg probe parses them).
* :class:`IbSource`: InfiniBand/RoCE port samples (sysfs plus netlink).
* :class:`MountSource`: shared-storage responsiveness.
* :class:`PodResourcesSource`: which container holds which device, as the
  kubelet's device manager assigned them (the PodResources API); absent
  where no socket is configured.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from agent.samples import GpuEvent, GpuSample, HeldDevices, IbPortSample, MountSample, PodResourcesFailure


class BackendUnavailableError(Exception):
    """The GPU library cannot be used right now (not installed, driver not
    loaded, not initialised). The GPU probe reports it and retries with
    backoff; the rest of the agent keeps running."""


class GpuResetError(Exception):
    """A GPU reset was refused or failed; the message says why, for the
    answer remediation reads (it escalates to a reboot)."""


class GpuBackend(ABC):
    """GPUs as NVML shows them.

    ``open`` must succeed before ``sample`` or ``wait_event``; after a
    :class:`BackendUnavailableError` from either, the caller closes and reopens.
    ``sample`` is called from the poll loop, ``wait_event`` from one event
    thread; implementations must allow those two to run concurrently.
    ``running_processes`` and ``reset`` serve remediation (its own thread):
    the caller holds the poll loop off while ``reset`` runs
    (:meth:`agent.monitor.Monitor.hold`), since a GPU being reset answers
    errors that are no fault.
    """

    name: str = "gpu"

    @abstractmethod
    def open(self) -> None:
        """Initialise the library and subscribe to events.

        Raises :class:`BackendUnavailableError` with a readable reason on failure.
        """

    @abstractmethod
    def close(self) -> None:
        """Release the library; safe to call when not open."""

    @abstractmethod
    def sample(self) -> tuple[GpuSample, ...]:
        """One sample per enumerated GPU, lost GPUs flagged, in index order."""

    @abstractmethod
    def wait_event(self, timeout_s: float) -> GpuEvent | None:
        """Block up to ``timeout_s`` for the next XID/ECC/retirement event.

        Returns ``None`` when nothing happened in time.
        """

    @abstractmethod
    def running_processes(self, index: int) -> tuple[int, ...]:
        """PIDs of the compute and graphics processes on GPU ``index`` (sorted, no duplicates).

        Raises :class:`BackendUnavailableError` when the GPU library cannot be
        used, :class:`GpuResetError` when the GPU cannot be asked (a reset is
        then no answer either).
        """

    @abstractmethod
    def reset(self, index: int) -> str:
        """Reset GPU ``index``; returns what was done, for the answer's message.

        Raises :class:`GpuResetError` with the reason when the reset fails.
        Called only when :meth:`running_processes` found none.
        """


class KmsgSource(ABC):
    """Raw kernel-log records, from the start of the ring buffer onwards.

    ``live_stamps`` is True when records are stamped with the running
    kernel's clock as they are logged (``/dev/kmsg``, the sim), so a record
    read as it appears tells that clock's current value; False for a capture
    replayed from a file. ``boot_id`` names the boot the records belong to.
    """

    live_stamps: bool = False
    # The boot id of the kernel whose log this is ("" for a replayed capture):
    # a record's sequence number means something only within one boot.
    boot_id: str = ""

    @abstractmethod
    def read(self, timeout_s: float) -> list[str]:
        """Records available now, waiting up to ``timeout_s`` when there are
        none. Each record is one ``/dev/kmsg`` record text
        (``"6,1234,5678901,-;NVRM: Xid ..."``)."""

    @abstractmethod
    def close(self) -> None:
        """Release the source; a blocked ``read`` returns soon after."""


class IbSource(ABC):
    """InfiniBand and RoCE ports of the node's HCAs."""

    @abstractmethod
    def read_ports(self) -> tuple[IbPortSample, ...]:
        """One sample per port; raises ``OSError`` when the source is unreadable."""

    def close(self) -> None:
        """Release netlink sockets and the like."""
        return None


class MountSource(ABC):
    """Responsiveness of the configured shared-storage mounts."""

    @abstractmethod
    def check(self) -> tuple[MountSample, ...]:
        """The latest result per mount; must return promptly even when a
        filesystem hangs (checks run elsewhere, under a timeout)."""

    def close(self) -> None:
        """Stop background checkers."""
        return None


class PodResourcesError(Exception):
    """A call to the kubelet's PodResources API failed; ``failure`` says how, the message what."""

    def __init__(self, failure: PodResourcesFailure, message: str) -> None:
        super().__init__(message)
        self.failure = failure


class PodResourcesSource(ABC):
    """The kubelet's PodResources API: devices held by containers, and devices offered.

    Each call returns within the source's timeout, answered or not, and
    raises :class:`PodResourcesError` on any failure (no socket, refused,
    no answer in time, an answer that is not the service's); the poll loop
    calls it once per poll and must never be held longer than that.
    """

    @abstractmethod
    def list(self) -> tuple[HeldDevices, ...]:
        """Every device of every container the kubelet lists (``List``)."""

    @abstractmethod
    def allocatable(self) -> frozenset[str]:
        """Device IDs the device plugins offer (``GetAllocatableResources``)."""

    def close(self) -> None:
        """Close the connection."""
        return None


@dataclass(slots=True)
class NodeHardware:
    """The sources of one node, opened by :func:`agent.hardware.build_hardware`."""

    gpu: GpuBackend
    kmsg: KmsgSource | None
    ib: IbSource
    mounts: MountSource
    pod_resources: PodResourcesSource | None = None

    def close(self) -> None:
        self.gpu.close()
        if self.kmsg is not None:
            self.kmsg.close()
        self.ib.close()
        self.mounts.close()
        if self.pod_resources is not None:
            self.pod_resources.close()
