"""Kernel-log probe: XIDs and "fallen off the bus" from ``/dev/kmsg``.

The NVIDIA driver prints every XID to the kernel log, including the ones NVML
never delivers to a process that was not running yet. Reading ``/dev/kmsg``
from the start of the ring buffer lets a restarted agent still see the XIDs
since boot (their record time is kept, so a fault's since-time is the real
one). Lines are parsed into :class:`~agent.samples.GpuEvent` with the GPU's
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
"""

from __future__ import annotations

import errno
import functools
import os
import re
import select
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from agent.backends.base import KmsgSource
from agent.logconfig import get_logger
from agent.samples import EventSource, GpuEvent, GpuEventKind, normalize_bus_id

log = get_logger(__name__)

_BUS = r"(?:PCI:)?(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)"
_XID_RE = re.compile(r"NVRM: Xid \(" + _BUS + r"\): (?P<xid>\d+)(?:,\s*(?P<rest>.*))?")
_FALLEN_RE = re.compile(
    r"NVRM: (?:The NVIDIA GPU |GPU at |GPU )" + _BUS + r"\b.*fallen off the bus",
    re.IGNORECASE,
)
_DMESG_TS_RE = re.compile(r"^\[\s*(?P<sec>\d+)\.(?P<frac>\d+)\]\s?")
# Detail fields newer drivers put before the text; dropped from the message.
_DETAIL_RE = re.compile(r"^(?:pid=[^,]*,\s*|name=[^,]*,\s*|channel=[^,]*,\s*)+")
# XID 154: "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)".
_RECOVERY_RE = re.compile(
    r"recovery action changed from\s+\S+(?:\s+\([^)]*\))?\s+to\s+(?:0x(?P<hex>[0-9a-f]+)|(?P<dec>\d+))\b",
    re.IGNORECASE,
)


def parse_recovery_action(text: str) -> int | None:
    """The recovery action an XID 154 line changed *to*, as NVML numbers it.

    ``None`` when the text does not say (a driver wording we do not know);
    the rules then fall back to the catalogue's action.
    """
    m = _RECOVERY_RE.search(text)
    if m is None:
        return None
    return int(m.group("hex"), 16) if m.group("hex") is not None else int(m.group("dec"))


@functools.cache
def boot_time() -> float:
    """Wall-clock epoch seconds at boot: kmsg timestamps are monotonic µs.

    Computed once per process so that the same record always converts to
    the same time (two readings of the two clocks differ by microseconds).
    """
    return time.time() - time.monotonic()


def parse_record(record: str, boot_epoch: float) -> GpuEvent | None:
    """Parse one kernel-log record; ``None`` when it is not a GPU event.

    ``boot_epoch`` converts the record's monotonic timestamp into wall time.
    """
    text = record.split("\n", 1)[0]
    if "NVRM" not in text:  # cheap reject: nearly every record
        return None
    usec: int | None = None
    head, sep, body = text.partition(";")
    if sep and head.count(",") >= 2 and head.split(",", 1)[0].isdigit():
        fields = head.split(",")
        if fields[2].isdigit():
            usec = int(fields[2])
        text = body
    else:
        m = _DMESG_TS_RE.match(text)
        if m:
            usec = int(m.group("sec")) * 1_000_000 + int(m.group("frac").ljust(6, "0")[:6])
            text = text[m.end() :]
    when = datetime.fromtimestamp(boot_epoch + usec / 1e6 if usec is not None else time.time(), tz=UTC)

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


class DevKmsgSource(KmsgSource):
    """``/dev/kmsg`` (or a captured log file) opened non-blocking.

    ``/dev/kmsg`` returns one record per ``read``; opening it starts at the
    oldest record still in the ring buffer. ``EPIPE`` means records were
    overwritten before we read them: we log it and carry on with the next.
    A regular file (tests, replaying a capture) is read line by line and then
    waits for more lines, like ``tail -f``.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self._is_char = not os.path.isfile(path)
        self._partial = b""
        self._closed = threading.Event()

    def read(self, timeout_s: float) -> list[str]:
        fd = self._fd
        if fd is None:
            self._closed.wait(timeout_s)
            return []
        out = self._read_char(fd) if self._is_char else self._read_file(fd)
        if out or timeout_s <= 0:
            return out
        if self._is_char:
            # Wake at least every 0.2 s so close() is noticed promptly.
            try:
                ready, _, _ = select.select([fd], [], [], min(timeout_s, 0.2))
            except (OSError, ValueError):
                return []
            return self._read_char(fd) if ready else []
        self._closed.wait(timeout_s)
        return self._read_file(fd) if self._fd is not None else []

    def _read_char(self, fd: int) -> list[str]:
        out: list[str] = []
        while len(out) < 4096:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    log.warning("kmsg_records_overwritten", path=self.path)
                    continue
                if exc.errno == errno.EBADF:
                    break
                raise
            if not chunk:
                break
            out.append(chunk.decode("utf-8", "replace"))
        return out

    def _read_file(self, fd: int) -> list[str]:
        try:
            data = os.read(fd, 1 << 20)
        except (BlockingIOError, OSError):
            return []
        if not data:
            return []
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        return [ln.decode("utf-8", "replace") for ln in lines if ln and not ln.startswith(b" ")]

    def close(self) -> None:
        fd, self._fd = self._fd, None
        self._closed.set()
        if fd is not None:
            os.close(fd)


def open_kmsg(path: str) -> KmsgSource | None:
    """Open the kernel log, or log clearly why not and return ``None``.

    Reading ``/dev/kmsg`` needs root (or CAP_SYSLOG); a missing or unreadable
    log costs the agent its XID history, not its other probes.
    """
    try:
        if os.path.isdir(path):
            raise IsADirectoryError(errno.EISDIR, "is a directory")
        return DevKmsgSource(path)
    except OSError as exc:
        log.warning(
            "kmsg_unavailable",
            path=path,
            error=exc.strerror or str(exc),
            effect="XIDs are seen through NVML events only",
        )
        return None


class KmsgProbe:
    """Reads a :class:`KmsgSource` in a background thread and hands GPU
    events to ``sink`` as they arrive, so an XID in the kernel log reaches
    the rules within a second rather than at the next poll."""

    def __init__(self, source: KmsgSource, sink: Callable[[GpuEvent], None], boot_epoch: float | None = None) -> None:
        self._source = source
        self._sink = sink
        self._boot = boot_time() if boot_epoch is None else boot_epoch
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.records_read = 0

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
            n += self._handle(records)

    def _handle(self, records: list[str]) -> int:
        found = 0
        for rec in records:
            self.records_read += 1
            try:
                ev = parse_record(rec, self._boot)
            except ValueError as exc:
                log.warning("kmsg_record_unparsable", record=rec[:200], error=str(exc))
                continue
            if ev is not None:
                found += 1
                self._sink(ev)
        return found

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
                    self._handle(records)
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
