"""The agent's poll loop: probes, then rules, then a HealthReport.

:class:`Monitor` is what the publishers hook into::

    monitor = Monitor(config, build_hardware("sim", config), node_name)
    monitor.restore(faults_read_back_from_the_node)   # latched faults survive restarts
    monitor.run(stop_event, on_report)                # on_report(report, sample) per report

``run`` produces a report every ``poll_interval_s`` **and** as soon as a GPU
event arrives (an NVML event-set XID or a kernel-log XID line): the event
threads push into an :class:`~agent.eventhub.EventHub` which wakes the loop, so an XID reaches
``on_report`` well within a second instead of at the next poll. ``on_report``
runs on the loop's thread; an exception from it is logged and the loop goes
on (a publisher outage must not stop detection).

Other entry points, all thread-safe:

* :meth:`Monitor.poll` / :meth:`Monitor.step`: one poll now (``--once``, tests).
* :meth:`Monitor.restore`: seed faults read back after a restart.
* :meth:`Monitor.clear`: clear latched faults of one entity after repair and
  re-validation; the next report no longer has them (unless the signal is
  still there).
* :meth:`Monitor.clear_gpu`: the same for every fault on one GPU, by
  whatever key it was raised or restored under (after a GPU reset).
* :meth:`Monitor.hold`: no poll runs inside (a GPU reset: a GPU being reset
  answers errors that are no fault).
* :meth:`Monitor.wake`: ask ``run`` for a report now.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from datetime import UTC, datetime

from agent.config import AgentConfig
from agent.eventhub import EventHub
from agent.model import Entity, EntityKind, Fault, HealthReport
from agent.probes.gpu import GpuProbe
from agent.probes.kmsg import KmsgProbe
from agent.probes.podresources import PodResourcesProbe
from agent.rules.engine import HealthRules
from agent.samples import (
    GpuSample,
    IbPortSample,
    MountSample,
    NodeSample,
)
from agent.sources.base import NodeHardware
from gpuwarden.logconfig import get_logger

log = get_logger(__name__)

OnReport = Callable[[HealthReport, NodeSample], None]

# Event-driven polls closer together than this are merged (an ECC storm must
# not turn into a poll storm).
MIN_POLL_GAP_S = 0.05


def _utcnow() -> datetime:
    return datetime.now(UTC)


class Monitor:
    """Runs the probes and rules for one node; see the module docstring."""

    def __init__(
        self,
        config: AgentConfig,
        hardware: NodeHardware,
        node: str,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        self.config = config
        self.hardware = hardware
        self.node = node
        self._clock = clock
        self._wake = threading.Event()
        self.hub = EventHub(config.xid.dedup_window_s, self._wake.set)
        self.gpu_probe = GpuProbe(
            hardware.gpu,
            self.hub.push,
            retry_initial_s=config.gpu.nvml_retry_initial_s,
            retry_max_s=config.gpu.nvml_retry_max_s,
        )
        self.kmsg_probe = (
            KmsgProbe(hardware.kmsg, self.hub.push, cursor_file=config.kmsg_state_file)
            if hardware.kmsg is not None
            else None
        )
        self.pod_resources_probe = (
            PodResourcesProbe(hardware.pod_resources, config.pod_resources.socket or "")
            if hardware.pod_resources is not None
            else None
        )
        self.rules = HealthRules(config, node)
        self._lock = threading.RLock()
        self._started = False
        self._restore_epoch = 0
        self.polls = 0
        self.last_report: HealthReport | None = None
        self.last_sample: NodeSample | None = None

    # ---------------------------------------------------------------- life

    def start(self) -> None:
        """Read the kernel-log backlog and start the event threads (idempotent).

        The backlog is read synchronously so the first report already has the
        XIDs logged since boot.
        """
        with self._lock:
            if self._started:
                return
            self._started = True
            if self.kmsg_probe is not None:
                found = self.kmsg_probe.drain()
                log.info(
                    "kmsg_backlog_read",
                    gpu_events=found,
                    read_by_previous_run=self.kmsg_probe.history,
                    records=self.kmsg_probe.records_read,
                )
                self.kmsg_probe.start()
            self.gpu_probe.start_events()

    def close(self) -> None:
        """Stop event threads and release the hardware."""
        # Ask both threads first so their last waits overlap.
        if self.kmsg_probe is not None:
            self.kmsg_probe.request_stop()
        self.gpu_probe.request_stop()
        if self.kmsg_probe is not None:
            self.kmsg_probe.stop()
        self.gpu_probe.stop()
        self.hardware.close()

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- poll

    def _gather(self) -> NodeSample:
        """Run every probe; a probe that fails is reported, never fatal.

        Each probe is guarded on its own: a bug or an odd answer in one (a
        netlink error, a driver returning garbage) costs that source this
        poll, logged with its traceback, while the others still report.
        """
        now = self._clock()
        errors: list[str] = []
        gpus: tuple[GpuSample, ...] = ()
        gpu_error: str | None = None
        try:
            gpus, gpu_error = self.gpu_probe.sample()
        except Exception as exc:
            gpu_error = f"GPU probe failed: {exc!r}"
            log.exception("gpu_probe_failed")
        if gpu_error is not None:
            errors.append(f"gpu: {gpu_error}")
        self.hub.set_inventory(gpus)
        ib_ports: tuple[IbPortSample, ...] = ()
        ib_error: str | None = None
        try:
            ib_ports = self.hardware.ib.read_ports()
        except OSError as exc:
            ib_error = f"{exc.strerror or exc}"
            log.error("ib_probe_failed", error=ib_error)
        except Exception as exc:
            ib_error = f"InfiniBand probe failed: {exc!r}"
            log.exception("ib_probe_failed")
        if ib_error is not None:
            errors.append(f"infiniband: {ib_error}")
        mounts: tuple[MountSample, ...] = ()
        mounts_error: str | None = None
        try:
            mounts = self.hardware.mounts.check()
        except Exception as exc:
            mounts_error = f"storage probe failed: {exc!r}"
            errors.append(f"storage: {mounts_error}")
            log.exception("storage_probe_failed")
        # Read on every poll, so also at once after a GPU event: who held the
        # GPU when it failed. Its failures are no probe error (they hold no
        # condition); the probe logs and counts them itself.
        pod_resources = self.pod_resources_probe.read() if self.pod_resources_probe is not None else None
        return NodeSample(
            time=now,
            gpus=gpus,
            gpu_source_error=gpu_error,
            events=self.hub.drain(),
            xid_counts=self.hub.counts(),
            ib_ports=ib_ports,
            ib_source_error=ib_error,
            mounts=mounts,
            mounts_source_error=mounts_error,
            errors=tuple(errors),
            pod_resources=pod_resources,
        )

    def step(self, *, scheduled: bool = True) -> tuple[HealthReport, NodeSample]:
        """One poll: sample everything, judge, and return report and sample.

        ``scheduled`` False marks a poll woken early by a GPU event (see
        :attr:`NodeSample.scheduled`).
        """
        with self._lock:
            if not self._started:
                self.start()
            self._wake.clear()
            sample = replace(self._gather(), scheduled=scheduled)
            report = replace(self.rules.evaluate(sample), restore_epoch=self._restore_epoch)
            self.polls += 1
            self.last_report, self.last_sample = report, sample
            return report, sample

    def poll(self) -> HealthReport:
        """One poll; the report only."""
        return self.step()[0]

    def wake(self) -> None:
        """Make :meth:`run` produce a report now."""
        self._wake.set()

    def restore(self, faults: Iterable[Fault], cleared_at: Mapping[str, datetime] | None = None) -> int:
        """Seed faults read back from the Node after a restart, and when each
        entity was last repaired (see :meth:`HealthRules.restore`); returns
        how many faults were added. Every report judged from now on carries
        the new :attr:`restore_epoch`."""
        with self._lock:
            self._restore_epoch += 1
            return self.rules.restore(faults, cleared_at)

    @property
    def restore_epoch(self) -> int:
        """How many times :meth:`restore` has run; see :attr:`HealthReport.restore_epoch`."""
        with self._lock:
            return self._restore_epoch

    def clear(self, entity_key: str, when: datetime | None = None) -> tuple[Fault, ...]:
        """Clear every fault on ``entity_key`` (an :attr:`Entity.key`; a GPU's
        ``gpu/<uuid>`` or ``gpu/<pci bus id>`` alike) after repair and
        re-validation, and wake :meth:`run` to publish it. Kernel-log events
        up to ``when`` (default now) no longer raise faults."""
        with self._lock:
            gone = self.rules.clear(entity_key, when)
        self._wake.set()
        return gone

    def clear_gpu(self, index: int, uuid: str, pci_bus_id: str, when: datetime | None = None) -> tuple[Fault, ...]:
        """Clear every fault on one GPU after its reset, and wake :meth:`run`.

        A GPU's faults are keyed by UUID, by bus id when NVML could not name
        it, and -- restored from a condition message that named neither -- by
        index alone; all of them go, so the GPU comes back once the next polls
        are clean. Signals still present (a remap failure) raise their faults
        again at the next poll.
        """
        with self._lock:
            keys = {Entity.gpu(index, uuid or None, pci_bus_id or None).key}
            for fault in self.rules.active_faults:
                e = fault.entity
                if e.kind is EntityKind.GPU and (
                    e.gpu_index == index or (uuid and e.uuid == uuid) or (pci_bus_id and e.pci_bus_id == pci_bus_id)
                ):
                    keys.add(e.key)
            gone: list[Fault] = []
            for key in sorted(keys):
                gone += self.rules.clear(key, when)
        self._wake.set()
        return tuple(gone)

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """No poll runs while inside (the caller's thread may still poll).

        For a GPU reset: NVML is released for it and the GPU answers errors
        meanwhile, which a poll would judge as a lost GPU. The poll loop
        waits, and XIDs arriving meanwhile wait in the event hub.
        """
        with self._lock:
            yield

    def run(self, stop: threading.Event, on_report: OnReport) -> None:
        """Poll every interval and on every GPU event until ``stop`` is set."""
        self.start()
        interval = self.config.poll_interval_s
        next_due = time.monotonic()
        last_poll = 0.0
        while not stop.is_set():
            gap = time.monotonic() - last_poll
            if gap < MIN_POLL_GAP_S:
                stop.wait(MIN_POLL_GAP_S - gap)
            last_poll = time.monotonic()
            try:
                report, sample = self.step(scheduled=last_poll >= next_due)
            except Exception:
                # A bug in judgement must not end detection: log, try next poll.
                log.exception("poll_failed")
            else:
                try:
                    on_report(report, sample)
                except Exception:
                    log.exception("report_handler_failed")
            now = time.monotonic()
            if now >= next_due:
                # A scheduled poll: the next is one interval later. A poll
                # woken early by a GPU event must not push the schedule back,
                # or a burst of XIDs would delay every polled signal.
                next_due += interval
                if next_due <= now:
                    next_due = now + interval
            while not stop.is_set():
                remaining = next_due - time.monotonic()
                if remaining <= 0:
                    break
                if self._wake.wait(min(remaining, 0.2)):
                    break
