"""The agent's poll loop: probes, then rules, then a HealthReport.

:class:`Monitor` is what the publishers hook into::

    monitor = Monitor(config, build_hardware("sim", config), node_name)
    monitor.restore(faults_read_back_from_the_node)   # latched faults survive restarts
    monitor.run(stop_event, on_report)                # on_report(report, sample) per report

``run`` produces a report every ``poll_interval_s`` **and** as soon as a GPU
event arrives (an NVML event-set XID or a kernel-log XID line): the event
threads push into an :class:`EventHub` which wakes the loop, so an XID reaches
``on_report`` well within a second instead of at the next poll. ``on_report``
runs on the loop's thread; an exception from it is logged and the loop goes
on (a publisher outage must not stop detection).

Other entry points, all thread-safe:

* :meth:`Monitor.poll` / :meth:`Monitor.step`: one poll now (``--once``, tests).
* :meth:`Monitor.restore`: seed faults read back after a restart.
* :meth:`Monitor.clear`: clear latched faults of one entity after repair and
  re-validation; the next report no longer has them (unless the signal is
  still there).
* :meth:`Monitor.wake`: ask ``run`` for a report now.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime

from agent.config import AgentConfig
from agent.model import Fault, HealthReport
from agent.probes.gpu import GpuProbe
from agent.probes.kmsg import KmsgProbe
from agent.rules.engine import HealthRules
from agent.samples import (
    EventSource,
    GpuEvent,
    GpuEventKind,
    GpuSample,
    IbPortSample,
    MountSample,
    NodeSample,
    XidCount,
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


class EventHub:
    """Collects GPU events from the NVML and kernel-log threads.

    The same XID usually arrives twice, once per source. An event is the twin
    of an earlier one when the *other* source reported the same GPU, kind and
    XID within ``dedup_window_s`` and that report is still unmatched; each
    report matches at most one twin. Two reports from one source are two
    occurrences (a crash-looping job raises XID 13 every few seconds), so
    NVML, NVML, kmsg, kmsg counts two, not three. The hub also keeps per-GPU
    XID counts since start for the metrics publisher.

    A twin is dropped unless it says what the first report did not: XID 154's
    recovery action is in the kernel-log text, and NVML's event has no text.
    Then the first report, if still queued, is completed from the twin; if the
    rules already had it, the twin follows as a ``supplement`` (it updates
    the fault's action, makes no second Event and is not counted again).
    """

    # Unmatched sightings older than the window are dropped once the table
    # holds this many keys, so a long XID storm cannot grow it without bound.
    _PRUNE_AT = 4096

    def __init__(self, dedup_window_s: float, wake: Callable[[], None]) -> None:
        self._window = dedup_window_s
        self._wake = wake
        self._lock = threading.Lock()
        self._queue: list[GpuEvent] = []
        # Per GPU/kind/XID and source, the reports not yet matched by the
        # other source, oldest first.
        self._unmatched: dict[tuple[str, str, int], dict[EventSource, deque[GpuEvent]]] = {}
        self._counts: dict[tuple[str, int], int] = {}
        self._bus_by_uuid: dict[str, str] = {}
        self._gpu_by_bus: dict[str, GpuSample] = {}
        self.duplicates = 0

    def set_inventory(self, gpus: Iterable[GpuSample]) -> None:
        """Learn which UUID is which PCI bus id (every poll, from NVML)."""
        with self._lock:
            for g in gpus:
                if g.uuid and g.pci_bus_id:
                    if self._bus_by_uuid.get(g.uuid) != g.pci_bus_id:
                        self._bus_by_uuid[g.uuid] = g.pci_bus_id
                        self._rekey(g.uuid, g.pci_bus_id)
                    self._gpu_by_bus[g.pci_bus_id] = g

    def _rekey(self, uuid: str, bus: str) -> None:
        """Move what was keyed by ``uuid`` onto ``bus``, the key of every GPU
        the inventory names. An NVML event that arrived before the first poll
        had only its UUID to go by: left there, its count would be a second
        ``gpuwarden_xid_events_total`` series for one GPU, and its report could
        never match its kernel-log twin, which always has the bus id. Caller
        holds the lock."""
        for ck in [ck for ck in self._counts if ck[0] == uuid]:
            n = self._counts.pop(ck)
            moved = (bus, ck[1])
            self._counts[moved] = self._counts.get(moved, 0) + n
        for key in [key for key in self._unmatched if key[0] == uuid]:
            target = self._unmatched.setdefault((bus, key[1], key[2]), {})
            for source, reports in self._unmatched.pop(key).items():
                merged = sorted([*target.get(source, ()), *reports], key=lambda r: r.time)
                target[source] = deque(merged)

    def push(self, event: GpuEvent) -> None:
        if event.history:
            # Read by the previous run: no live twin to match, counted then.
            with self._lock:
                self._queue.append(event)
            self._wake()
            return
        with self._lock:
            bus = event.pci_bus_id or (self._bus_by_uuid.get(event.uuid) if event.uuid else None)
            gpu_key = bus or event.uuid or "?"
            key = (gpu_key, event.kind.value, event.xid or 0)
            twin = self._match_twin(key, event)
            if twin is None:
                if len(self._unmatched) > self._PRUNE_AT:
                    self._prune(event.time)
                if event.kind is GpuEventKind.XID and event.xid is not None:
                    ck = (gpu_key, event.xid)
                    self._counts[ck] = self._counts.get(ck, 0) + 1
                self._queue.append(event)
            else:
                self.duplicates += 1
                if not self._complete(twin, event):
                    return
        # Single-bit ECC events come in storms and are routine; the rest matter.
        emit = log.debug if event.kind is GpuEventKind.ECC_SINGLE_BIT else log.info
        emit(
            "gpu_event",
            kind=str(event.kind),
            source=str(event.source),
            xid=event.xid,
            pci_bus_id=bus,
            uuid=event.uuid,
        )
        self._wake()

    def _match_twin(self, key: tuple[str, str, int], event: GpuEvent) -> GpuEvent | None:
        """The unmatched report of ``key`` from the other source within the
        window that ``event`` is the twin of; that report is consumed. When
        there is none, ``event`` is recorded as unmatched and ``None``
        returned. Reports that fell out of the window are dropped from the
        front on the way, so a one-source storm (single-bit ECC from NVML
        only) costs constant time per event and keeps only a window's worth.
        Caller holds the lock."""
        by_source = self._unmatched.setdefault(key, {})
        for reports in by_source.values():
            while reports and abs((event.time - reports[0].time).total_seconds()) > self._window:
                reports.popleft()
        others = [r for source, r in by_source.items() if source is not event.source and r]
        twin: GpuEvent | None = None
        if others:
            twin = others[0].popleft()
        else:
            by_source.setdefault(event.source, deque()).append(event)
        if not any(by_source.values()):
            del self._unmatched[key]
        return twin

    def _complete(self, first: GpuEvent, twin: GpuEvent) -> bool:
        """Add what ``twin`` says and ``first`` did not (see the class
        docstring); True when that changed what the rules will see. Caller
        holds the lock."""
        completed = first.completed_by(twin)
        if completed is None:
            return False
        for i, queued in enumerate(self._queue):
            if queued is first:
                self._queue[i] = completed
                return True
        self._queue.append(completed.as_supplement())
        return True

    def _prune(self, now: datetime) -> None:
        """Forget reports too old to be matched any more, for GPUs and XIDs
        that have gone quiet. Caller holds the lock."""
        for key in list(self._unmatched):
            by_source = self._unmatched[key]
            for reports in by_source.values():
                while reports and abs((now - reports[0].time).total_seconds()) > self._window:
                    reports.popleft()
            if not any(by_source.values()):
                del self._unmatched[key]

    def drain(self) -> tuple[GpuEvent, ...]:
        with self._lock:
            out, self._queue = tuple(self._queue), []
            return out

    def counts(self) -> tuple[XidCount, ...]:
        with self._lock:
            out = []
            for (gpu_key, xid), n in sorted(self._counts.items()):
                g = self._gpu_by_bus.get(gpu_key)
                out.append(
                    XidCount(
                        pci_bus_id=g.pci_bus_id if g else (gpu_key if ":" in gpu_key else None),
                        uuid=g.uuid if g else (gpu_key if gpu_key.startswith("GPU-") else None),
                        gpu_index=g.index if g else None,
                        xid=xid,
                        count=n,
                    )
                )
            return tuple(out)


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
        )

    def step(self) -> tuple[HealthReport, NodeSample]:
        """One poll: sample everything, judge, and return report and sample."""
        with self._lock:
            if not self._started:
                self.start()
            self._wake.clear()
            sample = self._gather()
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
                report, sample = self.step()
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
