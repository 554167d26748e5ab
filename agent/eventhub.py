"""Where GPU events from the NVML and kernel-log threads meet before the poll loop reads them.

One XID is usually reported by both sources; the hub pairs the two reports,
keeps the fuller one, counts XIDs per GPU for the metrics, and wakes the poll
loop (:mod:`agent.monitor`) so an event is judged at once rather than at the
next poll.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import NamedTuple

from agent.samples import EventSource, GpuEvent, GpuEventKind, GpuSample, XidCount
from gpuwarden.logconfig import get_logger

log = get_logger(__name__)


class SightingKey(NamedTuple):
    """What makes two reports twins: the same GPU (bus id, else UUID), kind and XID."""

    gpu: str
    kind: str
    xid: int


class CountKey(NamedTuple):
    """One ``gpuwarden_xid_events_total`` series: a GPU (bus id, else UUID) and an XID."""

    gpu: str
    xid: int


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
        self._unmatched: dict[SightingKey, dict[EventSource, deque[GpuEvent]]] = {}
        self._counts: dict[CountKey, int] = {}
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
        for ck in [ck for ck in self._counts if ck.gpu == uuid]:
            n = self._counts.pop(ck)
            moved = ck._replace(gpu=bus)
            self._counts[moved] = self._counts.get(moved, 0) + n
        for key in [key for key in self._unmatched if key.gpu == uuid]:
            target = self._unmatched.setdefault(key._replace(gpu=bus), {})
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
            key = SightingKey(gpu_key, event.kind.value, event.xid or 0)
            twin = self._match_twin(key, event)
            if twin is None:
                if len(self._unmatched) > self._PRUNE_AT:
                    self._prune(event.time)
                if event.kind is GpuEventKind.XID and event.xid is not None:
                    ck = CountKey(gpu_key, event.xid)
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

    def _match_twin(self, key: SightingKey, event: GpuEvent) -> GpuEvent | None:
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
