"""Kernel-log probe: XIDs and "fallen off the bus" from ``/dev/kmsg``.

The NVIDIA driver prints every XID to the kernel log, including the ones NVML
never delivers to a process that was not running yet. Reading ``/dev/kmsg``
from the start of the ring buffer lets a restarted agent still see the XIDs
since boot (their record time is kept, so a fault's since-time is the real
one; :class:`KernelLogClock` says how a record's stamp becomes wall time).
Lines are parsed into :class:`~agent.samples.GpuEvent` with the GPU's
normalised PCI bus id; the monitor de-duplicates them against NVML's events.

Wording differs across driver generations; every form below is recognised::

    NVRM: Xid (0000:03:00): 13, 0003 00000000 0000a1c0 ...             (pre-r400)
    NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.        (r418-r460)
    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off ...   (r470)
    NVRM: Xid (PCI:0000:86:00): 13, pid='<unknown>', name=<unknown>, Graphics ...  (r525+)
    NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.
    NVRM: The NVIDIA GPU 0000:3b:00.0 (PCI ID: 10de:20b0) installed in this system has fallen off the bus ...

Records are accepted as ``/dev/kmsg`` records (``pri,seq,usec,flags;text``),
``dmesg`` lines (``[  12.345678] text``) or journal/syslog lines
(``... kernel: text``), so a captured log from any of them replays in tests.

Within one process a record is handed on once: one whose sequence number is
not above the highest already handed on was read before (a source that
started over) and is dropped. Lines without one (``dmesg``, journal) cannot
be told apart from a second occurrence and are all handed on.

A restarted agent reads the whole ring buffer again. With a cursor file
(``kmsg_state_file``) it remembers the sequence number of the last GPU record
it read in this boot, and the records up to it come back marked ``history``:
they still raise latched faults, but they are not announced or counted a
second time. The cursor moves when a record is read, not when its Event is
written, so an agent killed in between loses that Event, as it would lose
any Event still queued in memory.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from agent.bootstate import BootState
from agent.samples import EventSource, GpuEvent, GpuEventKind, normalize_bus_id, parse_recovery_action
from agent.sources.base import KmsgSource
from gpuwarden.logconfig import get_logger

log = get_logger(__name__)

_BUS = r"(?:PCI:)?(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)"
# Numbers are ASCII digits only: ``\d`` would take any script's digits
# ("٧٩" would be XID 79), which the driver never prints.
_XID_RE = re.compile(r"NVRM: Xid \(" + _BUS + r"\): (?P<xid>[0-9]+)(?:,\s*(?P<rest>.*))?", re.ASCII)
_FALLEN_RE = re.compile(
    r"NVRM: (?:The NVIDIA GPU |GPU at |GPU )" + _BUS + r"\b.*fallen off the bus",
    re.IGNORECASE | re.ASCII,
)
_DMESG_TS_RE = re.compile(r"^\[\s*(?P<sec>[0-9]+)\.(?P<frac>[0-9]+)\]\s?", re.ASCII)
# Detail fields newer drivers put before the text; dropped from the message.
_DETAIL_RE = re.compile(r"^(?:pid=[^,]*,\s*|name=[^,]*,\s*|channel=[^,]*,\s*)+")


def reference_clock_s() -> float:
    """``CLOCK_MONOTONIC`` in seconds: the clock the kernel log's stamps are read against."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


@dataclass(frozen=True, slots=True)
class ClockAnchor:
    """Wall time and the kernel log's clock, read at one moment.

    A record stamped ``stamp_s`` seconds on the kernel log's clock happened
    ``kernel_s - stamp_s`` seconds before ``wall_s``. Dating a record by its
    age from now, rather than as boot time plus its stamp, keeps it right
    however far the kernel log's clock has drifted from wall time since boot.
    """

    wall_s: float
    kernel_s: float

    def wall_time(self, stamp_s: float | None) -> datetime:
        """When a record stamped ``stamp_s`` happened; ``wall_s`` for a record
        without a stamp. Never later than ``wall_s``: nothing is logged in the
        future, so a stamp ahead of the clock (its drift not yet learned) is
        dated now."""
        if stamp_s is None:
            return datetime.fromtimestamp(self.wall_s, tz=UTC)
        return datetime.fromtimestamp(self.wall_s - max(0.0, self.kernel_s - stamp_s), tz=UTC)


class KernelLogClock:
    """Tells the kernel log's clock now, to date its records by (:meth:`anchor`).

    printk stamps each record with ``local_clock()``, the scheduler clock, in
    seconds since boot like ``CLOCK_MONOTONIC`` but not the same clock. It is
    not NTP-disciplined, so "boot time + stamp" drifts from wall time by tens
    of seconds over months of uptime, and NVML's and the kernel log's reports
    of one XID stop falling within the de-duplication window.

    The current value of the kernel log's clock is read as ``CLOCK_MONOTONIC``
    plus a learned skew. Where the scheduler clock is not stable (many VMs)
    the kernel holds it within a tick of ``CLOCK_MONOTONIC``: on a test VM the
    two agreed within a millisecond after 12 minutes of uptime while
    ``CLOCK_MONOTONIC_RAW`` was already 0.11 s off, so the skew is 0. With a
    stable TSC (bare metal) the scheduler clock runs at the raw hardware rate
    and parts from ``CLOCK_MONOTONIC`` by the NTP correction, which is the
    skew: :meth:`observe_live` learns it from a record read as it is logged,
    whose stamp is the kernel log's clock at that moment. Until a record has
    been seen live, the age of a record is off by that drift at most, and
    :meth:`ClockAnchor.wall_time` never dates one in the future.

    The offset between wall time and the kernel log's clock is kept until it
    moves by more than ``tolerance_s``, which wall-clock steps and the drift
    corrected here both exceed: one record read twice in a process (an agent
    restarted in-process, the backlog re-read) then gets one time, so a
    since-time does not move by the microseconds between two clock readings.
    """

    def __init__(
        self,
        wall: Callable[[], float] = time.time,
        reference: Callable[[], float] = reference_clock_s,
        tolerance_s: float = 0.05,
    ) -> None:
        self._wall = wall
        self._reference = reference
        self._tolerance = tolerance_s
        self._lock = threading.Lock()
        self._skew = 0.0  # kernel log's clock minus the reference clock
        self._offset: float | None = None  # wall time minus the kernel log's clock

    def anchor(self) -> ClockAnchor:
        """Wall time and the kernel log's clock, now."""
        with self._lock:
            wall = self._wall()
            offset = wall - (self._reference() + self._skew)
            if self._offset is None or abs(offset - self._offset) > self._tolerance:
                self._offset = offset
            return ClockAnchor(wall_s=wall, kernel_s=wall - self._offset)

    def observe_live(self, stamp_s: float) -> None:
        """A record stamped ``stamp_s`` was read the moment it was logged:
        the kernel log's clock reads ``stamp_s`` now (less the wake-up
        latency, microseconds against the drift being corrected)."""
        with self._lock:
            self._skew = stamp_s - self._reference()


# One kernel per process: every probe dates records against the same clock.
KERNEL_LOG_CLOCK = KernelLogClock()


def _is_number(text: str) -> bool:
    """ASCII digits only (``str.isdigit`` takes any script's, and ``int`` reads them)."""
    return text.isascii() and text.isdigit()


def record_stamp(record: str) -> tuple[float | None, str]:
    """A record's kernel-clock stamp in seconds (``None`` for a journal line,
    which has none) and its text."""
    text = record.split("\n", 1)[0]
    head, sep, body = text.partition(";")
    if sep and head.count(",") >= 2 and _is_number(head.split(",", 1)[0]):
        fields = head.split(",")
        return (int(fields[2]) / 1e6 if _is_number(fields[2]) else None), body
    m = _DMESG_TS_RE.match(text)
    if m:
        usec = int(m.group("sec")) * 1_000_000 + int(m.group("frac").ljust(6, "0")[:6])
        return usec / 1e6, text[m.end() :]
    return None, text


def record_seq(record: str) -> int | None:
    """A ``/dev/kmsg`` record's sequence number (``None`` for other formats)."""
    head, sep, _ = record.partition(";")
    if not sep:
        return None
    fields = head.split(",")
    if len(fields) < 3 or not _is_number(fields[0]) or not _is_number(fields[1]):
        return None
    return int(fields[1])


def parse_record(record: str, anchor: ClockAnchor) -> GpuEvent | None:
    """Parse one kernel-log record; ``None`` when it is not a GPU event.

    ``anchor`` dates the record by its stamp (see :class:`KernelLogClock`).
    """
    if "NVRM" not in record:  # cheap reject: nearly every record
        return None
    stamp, text = record_stamp(record)
    if "NVRM" not in text:
        return None
    when = anchor.wall_time(stamp)

    m = _XID_RE.search(text)
    if m:
        rest = _DETAIL_RE.sub("", (m.group("rest") or "").strip())
        return GpuEvent(
            kind=GpuEventKind.XID,
            source=EventSource.KMSG,
            time=when,
            pci_bus_id=normalize_bus_id(m.group("bus")),
            xid=int(m.group("xid")),
            message=rest,
            recovery_action=parse_recovery_action(rest),
        )
    m = _FALLEN_RE.search(text)
    if m:
        return GpuEvent(
            kind=GpuEventKind.FALLEN_OFF_BUS,
            source=EventSource.KMSG,
            time=when,
            pci_bus_id=normalize_bus_id(m.group("bus")),
            message="GPU has fallen off the bus",
        )
    return None


class KmsgProbe:
    """Reads a :class:`KmsgSource` in a background thread and hands GPU
    events to ``sink`` as they arrive, so an XID in the kernel log reaches
    the rules within a second rather than at the next poll."""

    def __init__(
        self,
        source: KmsgSource,
        sink: Callable[[GpuEvent], None],
        clock: KernelLogClock | None = None,
        cursor_file: str | None = None,
    ) -> None:
        self._source = source
        self._sink = sink
        self._clock = KERNEL_LOG_CLOCK if clock is None else clock
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.records_read = 0
        # Records whose sequence number is at or below the highest one handed
        # on are records read before (a source that started over): handed on
        # again they would be announced and counted twice. Sequence numbers
        # rise within one boot, and a probe reads one boot's log.
        self._highest_seq = -1
        self.duplicates = 0
        # Sequence numbers only mean something within one boot of one kernel:
        # no cursor for a capture replayed from a file or a pipe.
        self._cursor = BootState(cursor_file, source.boot_id) if cursor_file and source.boot_id else None
        if cursor_file and self._cursor is None:
            log.warning(
                "kmsg_state_file_ignored",
                kmsg_state_file=cursor_file,
                path=getattr(source, "path", None),
                why="the kernel log is no boot's /dev/kmsg (a capture in a file or a pipe), "
                "so its sequence numbers say nothing about what an earlier run read",
            )
        seq = self._cursor.load().get("seq") if self._cursor is not None else None
        # Records up to this one were read by the previous run (history).
        self._read_before = seq if isinstance(seq, int) else -1
        self._saved = self._read_before
        self.history = 0

    def drain(self) -> int:
        """Read everything available now (the backlog since boot) synchronously."""
        n = 0
        while True:
            try:
                records = self._source.read(0)
            except OSError as exc:
                log.error("kmsg_read_failed", error=exc.strerror or str(exc))
                return n
            if not records:
                return n
            n += self._handle(records, live=False)

    def _handle(self, records: list[str], live: bool) -> int:
        """Parse and hand on ``records``; ``live`` when they were read as they
        were logged (after the backlog, from a source whose stamps are this
        kernel's clock), so the newest one's stamp is the clock's value now."""
        self.records_read += len(records)
        fresh = self._not_seen_before(records)
        if live and fresh:
            stamp, _ = record_stamp(fresh[-1][0])
            if stamp is not None:
                self._clock.observe_live(stamp)
        anchor = self._clock.anchor()
        found = 0
        newest = self._saved
        for rec, seq in fresh:
            try:
                ev = parse_record(rec, anchor)
            except ValueError as exc:
                log.warning("kmsg_record_unparsable", record=rec[:200], error=str(exc))
                continue
            if ev is None:
                continue
            found += 1
            if seq is not None and self._cursor is not None:
                if seq <= self._read_before:
                    ev = replace(ev, history=True)
                    self.history += 1
                newest = max(newest, seq)
            self._sink(ev)
        if self._cursor is not None and newest > self._saved and self._cursor.save({"seq": newest}):
            self._saved = newest
        return found

    def _not_seen_before(self, records: list[str]) -> list[tuple[str, int | None]]:
        """``records`` less those handed on before, each with its sequence
        number (``None`` for a line without one, which is never a duplicate:
        two alike dmesg lines are two occurrences)."""
        fresh: list[tuple[str, int | None]] = []
        dropped = 0
        for rec in records:
            seq = record_seq(rec)
            if seq is not None:
                if seq <= self._highest_seq:
                    dropped += 1
                    continue
                self._highest_seq = seq
            fresh.append((rec, seq))
        if dropped:
            self.duplicates += dropped
            log.info("kmsg_records_read_again_dropped", count=dropped, highest_seq=self._highest_seq)
        return fresh

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="gpuwarden-kmsg", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                records = self._source.read(0.2)
                if records:
                    self._handle(records, live=self._source.live_stamps)
            except OSError as exc:
                log.error("kmsg_read_failed", error=exc.strerror or str(exc))
                self._stop.wait(5.0)
            except Exception:
                # Keep reading the kernel log whatever one record did to us.
                log.exception("kmsg_read_failed")
                self._stop.wait(1.0)

    def request_stop(self) -> None:
        """Ask the thread to finish without waiting for it."""
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        self._source.close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
