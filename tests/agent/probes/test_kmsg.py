"""The kernel-log probe: parsing real-format lines, dating records, the cursor across restarts."""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from agent.probes.kmsg import (
    ClockAnchor,
    KernelLogClock,
    KmsgProbe,
    parse_record,
    record_seq,
    record_stamp,
    reference_clock_s,
)
from agent.samples import EventSource, GpuEvent, GpuEventKind, normalize_bus_id
from agent.sources.base import KmsgSource
from agent.sources.kmsg import DevKmsgSource
from tests.agent.kernel_log import ANCHOR, BOOT, FIXTURE, UPTIME, fixed_clock


@pytest.mark.parametrize(
    ("record", "bus", "xid", "message"),
    [
        # r418-r460: no pid
        (
            "4,1,5000000,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
            "00000000:3B:00.0",
            79,
            "GPU has fallen off the bus.",
        ),
        # r470: pid=
        (
            "4,1,5000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
            "00000000:3B:00.0",
            79,
            "GPU has fallen off the bus.",
        ),
        # r525+: pid='<unknown>', name=<unknown>
        (
            "4,9,5000000,-;NVRM: Xid (PCI:0000:86:00): 13, pid='<unknown>', name=<unknown>, "
            "Graphics Exception: ESR 0x1",
            "00000000:86:00.0",
            13,
            "Graphics Exception: ESR 0x1",
        ),
        # r550 GSP
        (
            "4,9,5000000,-;NVRM: Xid (PCI:0000:DB:00): 119, pid=3321, name=nvidia-smi, Timeout after 6s of waiting",
            "00000000:DB:00.0",
            119,
            "Timeout after 6s of waiting",
        ),
        # pre-r400: no PCI: prefix, hex words
        (
            "4,9,5000000,-;NVRM: Xid (0000:03:00): 13, 0003 00000000 0000a1c0",
            "00000000:03:00.0",
            13,
            "0003 00000000 0000a1c0",
        ),
        # dmesg output and journal lines
        (
            "[ 5.000000] NVRM: Xid (PCI:0000:18:00): 48, pid=7, name=x, An uncorrectable double bit error",
            "00000000:18:00.0",
            48,
            "An uncorrectable double bit error",
        ),
        (
            "Nov 29 10:00:00 gpu-7 kernel: NVRM: Xid (PCI:0000:18:00): 94, pid=7, name=x, Contained: CE User Channel",
            "00000000:18:00.0",
            94,
            "Contained: CE User Channel",
        ),
        # no text after the number
        ("4,9,5000000,-;NVRM: Xid (PCI:0000:18:00): 45", "00000000:18:00.0", 45, ""),
    ],
)
def test_xid_lines(record: str, bus: str, xid: int, message: str) -> None:
    ev = parse_record(record, ANCHOR)
    assert ev is not None
    assert (ev.kind, ev.source, ev.pci_bus_id, ev.xid, ev.message) == (
        GpuEventKind.XID,
        EventSource.KMSG,
        bus,
        xid,
        message,
    )


@pytest.mark.parametrize(
    ("record", "action"),
    [
        (
            "4,161,523466789,-;NVRM: Xid (PCI:0000:db:00): 154, GPU recovery action changed from 0x0 (None) "
            "to 0x1 (GPU Reset Required)",
            1,
        ),
        (
            "4,162,523466789,-;NVRM: Xid (PCI:0000:3b:00): 154, pid='<unknown>', name=<unknown>, "
            "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
            2,
        ),
        (
            "4,163,523466789,-;NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) "
            "to 0x3 (Drain P2P)",
            3,
        ),
        (
            "[ 8812.004411] NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x3 (Drain P2P) "
            "to 0x4 (Drain and Reset)",
            4,
        ),
        (
            "Nov 29 10:00:00 gpu-7 kernel: NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed "
            "from 0x1 (GPU Reset Required) to 0x0 (None)",
            0,
        ),
        ("4,164,523466789,-;NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed", None),
        ("4,165,523466789,-;NVRM: Xid (PCI:0000:18:00): 154", None),
        # Only ASCII digits name an action: an Arabic-Indic three is text, not RECOVERY 3.
        ("4,166,523466789,-;NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0 to \u0663", None),
    ],
)
def test_xid_154_lines_carry_the_recovery_action(record: str, action: int | None) -> None:
    ev = parse_record(record, ANCHOR)
    assert ev is not None and ev.xid == 154 and ev.recovery_action == action


def test_record_time_is_its_age_before_the_anchor() -> None:
    ev = parse_record("4,1,5000000,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", ANCHOR)
    assert ev is not None and ev.time == datetime.fromtimestamp(BOOT + 5, tz=UTC)
    ev = parse_record("[   12.500000] NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=a, MMU Fault", ANCHOR)
    assert ev is not None and ev.time == datetime.fromtimestamp(BOOT + 12.5, tz=UTC)


def test_a_record_is_dated_by_its_age_before_the_anchor() -> None:
    """Five months up, with wall time 40 s ahead of boot time plus the kernel
    log's clock: a record stamped 30 s before the anchor is dated 30 s ago."""
    uptime = 150 * 86400.0
    wall = BOOT + uptime + 40  # wall time ran 40 s ahead of the printk clock since boot
    record = f"4,1,{int((uptime - 30) * 1e6)},-;NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=a, DBE"
    ev = parse_record(record, fixed_clock(wall=wall, reference=uptime).anchor())
    assert ev is not None and ev.time == datetime.fromtimestamp(wall - 30, tz=UTC)
    # A journal line has no stamp: it is dated when read.
    ev = parse_record(
        "Nov 29 10:00:00 gpu-7 kernel: NVRM: Xid (PCI:0000:18:00): 94, x", fixed_clock(wall=wall).anchor()
    )
    assert ev is not None and ev.time == datetime.fromtimestamp(wall, tz=UTC)


def test_the_clock_follows_a_wall_clock_step_but_not_reading_jitter() -> None:
    now = {"wall": BOOT + UPTIME, "ref": UPTIME}
    clock = KernelLogClock(wall=lambda: now["wall"], reference=lambda: now["ref"], tolerance_s=0.05)
    record = "4,1,90000000000,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."
    first = parse_record(record, clock.anchor())
    now["wall"] += 10.00001  # ten seconds on, the two clocks read a few microseconds apart
    now["ref"] += 10.0
    again = parse_record(record, clock.anchor())
    assert first is not None and again is not None and again.time == first.time
    now["wall"] += 3600  # NTP stepped the wall clock
    stepped = parse_record(record, clock.anchor())
    assert stepped is not None and (stepped.time - first.time).total_seconds() == pytest.approx(3600, abs=1e-3)


def test_a_stamp_ahead_of_the_clock_is_dated_now_never_in_the_future() -> None:
    anchor = ClockAnchor(wall_s=BOOT + UPTIME, kernel_s=UPTIME)
    assert anchor.wall_time(UPTIME + 40) == datetime.fromtimestamp(BOOT + UPTIME, tz=UTC)


class ScriptedKmsg(KmsgSource):
    """Hands out scripted batches of records, then nothing."""

    def __init__(self, batches: list[list[str]], live_stamps: bool) -> None:
        self.batches = batches
        self.live_stamps = live_stamps
        self.closed = threading.Event()

    def read(self, timeout_s: float) -> list[str]:
        if timeout_s > 0 and self.batches:
            return self.batches.pop(0)
        self.closed.wait(timeout_s)
        return []

    def close(self) -> None:
        self.closed.set()


@pytest.mark.parametrize("live", [True, False])
def test_records_read_as_they_are_logged_teach_the_clock_its_skew(live: bool) -> None:
    """A stable-TSC host: the printk clock runs 40 s ahead of CLOCK_MONOTONIC.
    The newest record of a batch read live was stamped just now, so an XID
    logged 30 s before it is dated 30 s ago. A replayed capture teaches nothing."""
    wall, reference = BOOT + UPTIME, UPTIME
    kernel_now = reference + 40
    batch = [
        f"4,10,{int((kernel_now - 30) * 1e6)},-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
        f"6,11,{int(kernel_now * 1e6)},-;usb 1-1: new high-speed USB device number 3",
    ]
    got = threading.Event()
    events: list[GpuEvent] = []

    def sink(ev: GpuEvent) -> None:
        events.append(ev)
        got.set()

    probe = KmsgProbe(ScriptedKmsg([batch], live_stamps=live), sink, clock=fixed_clock(wall, reference))
    probe.start()
    try:
        assert got.wait(10)
    finally:
        probe.stop()
    (ev,) = events
    # Without the skew the XID's stamp is 10 s ahead of CLOCK_MONOTONIC: dated now.
    assert ev.time == datetime.fromtimestamp(wall - 30 if live else wall, tz=UTC)


def test_the_reference_clock_is_clock_monotonic() -> None:
    """The clock printk's stamps track where the scheduler clock is unstable;
    the sim's kernel log is stamped with it too."""
    before = time.clock_gettime(time.CLOCK_MONOTONIC)
    assert before <= reference_clock_s() <= time.clock_gettime(time.CLOCK_MONOTONIC)


@pytest.mark.parametrize(
    ("record", "bus"),
    [
        ("3,1,1,-;NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.", "00000000:3B:00.0"),
        (
            "3,1,1,-;NVRM: The NVIDIA GPU 0000:9a:00.0 (PCI ID: 10de:20b0) installed in this system has fallen off "
            "the bus and is not responding to commands.",
            "00000000:9A:00.0",
        ),
        ("3,1,1,-;NVRM: GPU at PCI:0000:5d:00: GPU has fallen off the bus.", "00000000:5D:00.0"),
    ],
)
def test_fallen_off_the_bus_lines(record: str, bus: str) -> None:
    ev = parse_record(record, ANCHOR)
    assert ev is not None and ev.kind is GpuEventKind.FALLEN_OFF_BUS and ev.pci_bus_id == bus


@pytest.mark.parametrize(
    "record",
    [
        "6,3,9234567,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
        "6,181,7,c;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress",
        "6,2,812345,-;pci 0000:3b:00.0: [10de:2330] type 00 class 0x030200",
        "4,1,1,-;NVRM: GPU at PCI:0000:5d:00: GPU-9f8a2e1c-0000-0000-0000-000000000000",
        "",
        "garbage without structure",
    ],
)
def test_other_records_are_not_events(record: str) -> None:
    assert parse_record(record, ANCHOR) is None


def test_a_captured_log_replays_through_the_reader(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text(FIXTURE.read_text())
    source = DevKmsgSource(str(log))
    events: list[GpuEvent] = []
    probe = KmsgProbe(source, events.append, clock=fixed_clock())
    try:
        assert probe.drain() == 11
    finally:
        source.close()
    kinds = [(e.kind.value, e.pci_bus_id, e.xid) for e in events]
    assert kinds == [
        ("xid", "00000000:3B:00.0", 79),
        ("fallen_off_bus", "00000000:3B:00.0", None),
        ("xid", "00000000:86:00.0", 13),
        ("xid", "00000000:86:00.0", 13),
        ("xid", "00000000:18:00.0", 48),
        ("xid", "00000000:18:00.0", 63),
        ("xid", "00000000:03:00.0", 13),
        ("xid", "00000000:DB:00.0", 119),
        ("xid", "00000000:DB:00.0", 154),
        ("fallen_off_bus", "00000000:9A:00.0", None),
        ("xid", "00000000:AB:00.0", 999),
    ]
    assert [e.recovery_action for e in events if e.xid == 154] == [1]  # "... to 0x1 (GPU Reset Required)"
    # Dictionary continuation lines (" SUBSYSTEM=pci") are not records.
    assert probe.records_read == 15


def test_reader_thread_sees_lines_appended_later(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text("6,1,1,-;boot\n")
    got = threading.Event()
    events: list[GpuEvent] = []

    def sink(ev: GpuEvent) -> None:
        events.append(ev)
        got.set()

    probe = KmsgProbe(DevKmsgSource(str(log)), sink, clock=fixed_clock())
    try:
        probe.drain()
        probe.start()
        with open(log, "a") as f:
            f.write("4,2,2000000,-;NVRM: Xid (PCI:0000:18:00): 74, pid=1, name=a, NVLink: fatal error detected\n")
        assert got.wait(5.0)
    finally:
        probe.stop()
    assert events[0].xid == 74


def test_read_errors_during_drain_are_logged_not_raised(tmp_path: Path) -> None:
    class BrokenSource(DevKmsgSource):
        def read(self, timeout_s: float) -> list[str]:
            raise OSError(5, "Input/output error")

    path = tmp_path / "kmsg"
    path.write_text("")
    probe = KmsgProbe(BrokenSource(str(path)), lambda ev: None, clock=fixed_clock())
    assert probe.drain() == 0


class RingBuffer(KmsgSource):
    """One boot's kernel log, as each new opener of /dev/kmsg sees it: from the start."""

    live_stamps = False

    def __init__(self, records: list[str], boot_id: str = "boot-1") -> None:
        self.records = records
        self.boot_id = boot_id
        self._done = False

    def read(self, timeout_s: float) -> list[str]:
        if self._done:
            return []
        self._done = True
        return list(self.records)

    def close(self) -> None:
        self._done = True


XID_79 = "3,{seq},90000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
XID_13 = "4,{seq},95000000,-;NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception: ESR 0x404490=0x80000001"


def _read(source: KmsgSource, cursor: Path) -> list[GpuEvent]:
    got: list[GpuEvent] = []
    KmsgProbe(source, got.append, clock=fixed_clock(), cursor_file=str(cursor)).drain()
    return got


def test_a_restart_in_the_same_boot_marks_what_the_previous_run_read_as_history(tmp_path: Path) -> None:
    cursor = tmp_path / "run" / "kmsg-cursor.json"
    log = ["6,1,0,-;Linux version 6.1.0", XID_79.format(seq=7), "6,8,91000000,-;usb 1-1: new device"]
    first = _read(RingBuffer(log), cursor)
    assert [(e.xid, e.history) for e in first] == [(79, False)]
    # The next run reads the ring buffer again, with one new XID after it.
    second = _read(RingBuffer([*log, XID_13.format(seq=9)]), cursor)
    assert [(e.xid, e.history) for e in second] == [(79, True), (13, False)]
    assert second[0].time == first[0].time  # a since-time does not move on restart
    # And the one after that has read both before.
    third = _read(RingBuffer([*log, XID_13.format(seq=9)]), cursor)
    assert [e.history for e in third] == [True, True]


def test_another_boot_or_a_capture_has_no_history(tmp_path: Path) -> None:
    cursor = tmp_path / "kmsg-cursor.json"
    _read(RingBuffer([XID_79.format(seq=7)]), cursor)
    # After a reboot sequence numbers start again: nothing is history.
    rebooted = _read(RingBuffer([XID_13.format(seq=3)], boot_id="boot-2"), cursor)
    assert [e.history for e in rebooted] == [False]
    # A capture replayed from a file has no boot id, so no cursor at all.
    capture = _read(RingBuffer([XID_13.format(seq=3)], boot_id=""), tmp_path / "other.json")
    assert [e.history for e in capture] == [False] and not (tmp_path / "other.json").exists()


def test_an_unreadable_or_unwritable_cursor_costs_history_not_events(tmp_path: Path) -> None:
    cursor = tmp_path / "kmsg-cursor.json"
    cursor.write_text("{not json")
    assert [e.history for e in _read(RingBuffer([XID_79.format(seq=7)]), cursor)] == [False]
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    got = _read(RingBuffer([XID_79.format(seq=7)]), blocked / "kmsg-cursor.json")
    assert [e.history for e in got] == [False]


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=300))
def test_any_record_parses_or_is_ignored(text: str) -> None:
    for record in (text, f"4,1,1,-;NVRM: {text}", f"4,1,1,-;NVRM: Xid (PCI:0000:3b:00): {text}"):
        ev = parse_record(record, ANCHOR)
        assert ev is None or ev.pci_bus_id is not None


@given(domain=st.integers(0, 0xFFFF), bus=st.integers(0, 0xFF), device=st.integers(0, 0x1F))
def test_nvml_and_kernel_spellings_of_a_bus_id_agree(domain: int, bus: int, device: int) -> None:
    """The kernel log's spelling maps onto NVML's, which is kept as is: it is
    what ``nvidia-smi -i`` takes and what ``nvidia-smi`` and dcgm-exporter show."""
    nvml = f"{domain:08X}:{bus:02X}:{device:02X}.0"
    kernel = f"{domain:04x}:{bus:02x}:{device:02x}"
    assert normalize_bus_id(nvml) == normalize_bus_id(kernel) == normalize_bus_id(f"PCI:{kernel}") == nvml
    assert normalize_bus_id(normalize_bus_id(nvml)) == nvml
    assert normalize_bus_id(f"{kernel}.{device % 8}") == f"{domain:08X}:{bus:02X}:{device:02X}.{device % 8}"


def test_text_that_is_not_a_bus_id_is_returned_as_is() -> None:
    assert normalize_bus_id(" not-a-bus ") == "not-a-bus"
    assert normalize_bus_id("zz:yy:xx") == "zz:yy:xx"


ARABIC_INDIC_79 = "\u0667\u0669"  # "٧٩": digits to Unicode, not to the kernel


@pytest.mark.parametrize(
    "record",
    [
        f"4,1,5000000,-;NVRM: Xid (PCI:0000:3b:00): {ARABIC_INDIC_79}, GPU has fallen off the bus.",
        f"[ 5.000000] NVRM: Xid (PCI:0000:3b:00): {ARABIC_INDIC_79}, pid=1, name=a, MMU Fault",
        f"Nov 29 10:00:00 gpu-7 kernel: NVRM: Xid (PCI:0000:3b:00): {ARABIC_INDIC_79}",
    ],
)
def test_only_ascii_digits_are_an_xid_number(record: str) -> None:
    assert parse_record(record, ANCHOR) is None


def test_only_ascii_digits_are_a_stamp_or_a_sequence_number() -> None:
    text = "NVRM: Xid (PCI:0000:3b:00): 13, MMU Fault"
    assert record_seq(f"4,{ARABIC_INDIC_79},5000000,-;{text}") is None
    assert record_stamp(f"4,1,{ARABIC_INDIC_79},-;{text}") == (None, text)
    assert record_stamp(f"[ {ARABIC_INDIC_79}.000000] {text}")[0] is None


def test_records_read_twice_are_handed_on_once() -> None:
    """The same sequence numbers again (a source that starts over) are the
    same records: handed on again, they would be announced and counted twice."""
    records = ["6,1,0,-;Linux version 6.1.0", XID_79.format(seq=7), XID_13.format(seq=9)]
    events: list[GpuEvent] = []
    probe = KmsgProbe(ScriptedKmsg([records, records[1:], [XID_13.format(seq=12)]], live_stamps=False), events.append)
    for _ in range(3):
        probe._handle(probe._source.read(1), live=False)
    assert [e.xid for e in events] == [79, 13, 13]
    assert probe.duplicates == 2


def test_records_without_sequence_numbers_are_not_deduplicated() -> None:
    """A dmesg or journal line has no sequence number: two alike are two occurrences."""
    line = "[ 5.000000] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=a, MMU Fault"
    events: list[GpuEvent] = []
    probe = KmsgProbe(ScriptedKmsg([[line], [line]], live_stamps=False), events.append)
    for _ in range(2):
        probe._handle(probe._source.read(1), live=False)
    assert [e.xid for e in events] == [13, 13]


@pytest.mark.parametrize("kind", ["file", "fifo"])
def test_a_cursor_file_for_a_kernel_log_without_a_boot_is_said_to_be_ignored(tmp_path: Path, kind: str) -> None:
    """A replayed capture's sequence numbers are another boot's: the cursor
    cannot apply, and the operator who set it is told once, at start."""
    path = tmp_path / "kmsg"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.write_text(FIXTURE.read_text())
    source = DevKmsgSource(str(path))
    cursor = tmp_path / "kmsg-cursor.json"
    try:
        with capture_logs() as logs:
            probe = KmsgProbe(source, lambda ev: None, clock=fixed_clock(), cursor_file=str(cursor))
            probe.drain()
            probe.drain()
    finally:
        source.close()
    ignored = [e for e in logs if e["event"] == "kmsg_state_file_ignored"]
    assert len(ignored) == 1 and ignored[0]["kmsg_state_file"] == str(cursor) and ignored[0]["path"] == str(path)
    assert not cursor.exists()
