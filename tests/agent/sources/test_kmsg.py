"""The kernel-log reader: /dev/kmsg record by record, files and pipes line by line, close() waking blocked reads."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.probes.kmsg import KmsgProbe
from agent.samples import GpuEvent, normalize_bus_id
from agent.sources.kmsg import DevKmsgSource, open_kmsg
from tests.agent.kernel_log import fixed_clock
from tests.waiting import wait_for


@pytest.fixture
def blocking_kmsg(tmp_path: Path) -> Iterator[str]:
    """A character-device-like kernel log that has nothing to read: a FIFO
    with a writer attached, so ``select`` on it blocks until data comes."""
    path = tmp_path / "kmsg"
    os.mkfifo(path)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # lets the writer open
    writer = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        yield str(path)
    finally:
        os.close(writer)
        os.close(reader)


def test_close_wakes_a_reader_blocked_in_select_and_it_exits(blocking_kmsg: str) -> None:
    source = DevKmsgSource(blocking_kmsg)
    results: list[list[str]] = []
    reader = threading.Thread(target=lambda: results.append(source.read(3600)), daemon=True)
    reader.start()
    assert wait_for(lambda: source._readers == 1, timeout=30.0, interval=0.005)
    source.close()  # returns once the reader has left read(): an hour's select did not hold it
    reader.join(30)
    assert not reader.is_alive() and results == [[]] and source.released
    assert source.read(3600) == []  # a read after close returns at once


def test_descriptors_are_never_closed_under_a_reader(blocking_kmsg: str) -> None:
    """close() that gives up waiting leaves the closing to the last reader out:
    a reader inside read() keeps a valid descriptor, never one reused by
    another open()."""
    inside, release = threading.Event(), threading.Event()
    seen_open: list[bool] = []

    class StuckReader(DevKmsgSource):
        def _read_lines(self, fd: int) -> tuple[list[str], bool]:
            if not inside.is_set():
                inside.set()
                release.wait(30)  # a reader held up inside os.read
                try:
                    os.fstat(fd)
                    seen_open.append(True)
                except OSError:
                    seen_open.append(False)
            return super()._read_lines(fd)

    source = StuckReader(blocking_kmsg, close_wait_s=0)
    reader = threading.Thread(target=lambda: source.read(3600), daemon=True)
    reader.start()
    assert inside.wait(30)
    source.close()  # cannot wait (close_wait_s=0): must not close under the reader
    assert not source.released
    release.set()
    reader.join(30)
    assert not reader.is_alive() and seen_open == [True] and source.released


def test_probe_stop_ends_its_thread_while_it_waits_on_the_kernel_log(blocking_kmsg: str) -> None:
    probe = KmsgProbe(DevKmsgSource(blocking_kmsg), lambda ev: None, clock=fixed_clock())
    probe.start()
    thread = probe._thread
    assert thread is not None and thread.is_alive()
    probe.stop()
    assert not thread.is_alive()


def test_missing_kmsg_is_logged_not_fatal(tmp_path: Path) -> None:
    assert open_kmsg(str(tmp_path / "no-such-kmsg")) is None


def test_a_directory_is_not_a_kernel_log(tmp_path: Path) -> None:
    assert open_kmsg(str(tmp_path)) is None


def test_dev_kmsg_reads_the_real_ring_buffer() -> None:
    source = open_kmsg("/dev/kmsg")
    if source is None:
        # Without CAP_SYSLOG the agent must carry on without it.
        assert os.geteuid() != 0 or not os.path.exists("/dev/kmsg")
        return
    try:
        records = source.read(0.5)
    finally:
        source.close()
    assert records and all(";" in r for r in records)


# ------------------------------------------------------------ files and pipes

XID_LINES = [
    "4,120,123456789,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=2345, GPU has fallen off the bus.",
    "4,130,223456789,-;NVRM: Xid (PCI:0000:86:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception",
    "4,150,423456789,-;NVRM: Xid (0000:03:00): 31, 0003 00000000 0000a1c0",
]


def _drain(source: DevKmsgSource, rounds: int = 50) -> list[str]:
    """Everything the source hands out until it has nothing more."""
    out: list[str] = []
    for _ in range(rounds):
        got = source.read(0)
        if not got:
            break
        out += got
    return out


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A FIFO and a non-blocking writer on it (the test closes the writer when it wants EOF)."""
    path = tmp_path / "kmsg.fifo"
    os.mkfifo(path)
    keep = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # lets the writer open
    writer = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        yield str(path), writer
    finally:
        with contextlib.suppress(OSError):
            os.close(writer)
        os.close(keep)


def test_a_fifo_is_read_line_by_line_not_as_one_record(fifo: tuple[str, int]) -> None:
    """Only /dev/kmsg hands out one record per read; a pipe hands out
    whatever was written, many lines at once."""
    path, writer = fifo
    source = DevKmsgSource(path)
    try:
        os.write(writer, "".join(f"{line}\n" for line in XID_LINES).encode())
        assert _drain(source) == XID_LINES
    finally:
        source.close()


def test_the_last_line_of_a_fifo_without_its_newline_is_read_when_the_writer_closes(fifo: tuple[str, int]) -> None:
    path, writer = fifo
    source = DevKmsgSource(path)
    try:
        os.write(writer, "\n".join(XID_LINES).encode())
        assert _drain(source) == XID_LINES[:2]  # the writer may still finish the last line
        os.close(writer)
        assert _drain(source) == XID_LINES[2:]
    finally:
        source.close()


def test_the_last_line_of_a_capture_without_a_trailing_newline_is_read(tmp_path: Path) -> None:
    capture = tmp_path / "kmsg.txt"
    capture.write_text("\n".join(XID_LINES))
    old = time.time() - 3600  # written an hour ago: nobody is still writing it
    os.utime(capture, (old, old))
    source = DevKmsgSource(str(capture))
    try:
        assert _drain(source) == XID_LINES
    finally:
        source.close()


def test_a_line_being_written_is_not_taken_for_a_whole_one(tmp_path: Path) -> None:
    """A writer caught halfway through "Xid ...: 79" must not make it XID 7:
    the line without its newline counts once the file has stopped changing."""
    capture = tmp_path / "kmsg.txt"
    capture.write_text(f"{XID_LINES[0]}\n{XID_LINES[1][:60]}")
    source = DevKmsgSource(str(capture), settle_s=3600)
    try:
        assert _drain(source) == XID_LINES[:1]
        with open(capture, "a") as f:
            f.write(XID_LINES[1][60:] + "\n")
        assert _drain(source) == XID_LINES[1:2]
    finally:
        source.close()


def _cpu_used_while_reading(source: DevKmsgSource, window_s: float = 1.0) -> float:
    """CPU seconds the process used while a probe thread followed ``source``
    for ``window_s`` with nothing new to read."""
    probe = KmsgProbe(source, lambda ev: None, clock=fixed_clock())
    probe.start()
    try:
        time.sleep(0.2)  # past the first reads
        before = time.process_time()
        time.sleep(window_s)
        return time.process_time() - before
    finally:
        probe.stop()


def test_a_fifo_whose_writer_closed_is_not_read_in_a_busy_loop(fifo: tuple[str, int]) -> None:
    """A FIFO whose writer is gone is at end of file for good: a reader that
    goes back to it at once spins a core. Generous bound: a spinning reader uses all of it."""
    path, writer = fifo
    source = DevKmsgSource(path)
    os.write(writer, f"{XID_LINES[0]}\n".encode())
    os.close(writer)
    assert _cpu_used_while_reading(source) < 0.5


def test_a_character_device_at_end_of_file_is_not_read_in_a_busy_loop() -> None:
    """/dev/null is a character device that is always "readable" and always at end of file."""
    assert _cpu_used_while_reading(DevKmsgSource("/dev/null")) < 0.5


def test_a_fifo_is_followed_after_its_writer_closed(fifo: tuple[str, int]) -> None:
    """Like ``tail -f``: a new writer's lines are read after the old one left."""
    path, writer = fifo
    source = DevKmsgSource(path)
    try:
        os.write(writer, f"{XID_LINES[0]}\n".encode())
        os.close(writer)
        assert source.read(0.05) == XID_LINES[:1]
        assert source.read(0.05) == []
        again = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(again, f"{XID_LINES[1]}\n".encode())
            assert source.read(0.05) == XID_LINES[1:2]
        finally:
            os.close(again)
    finally:
        source.close()


# --------------------------------------- any driver's lines, any way they come

_BUS = st.builds(
    lambda d, b, s: f"{d:04x}:{b:02x}:{s:02x}", st.integers(0, 0xFFFF), st.integers(0, 0xFF), st.integers(0, 0x1F)
)
_XID = st.integers(1, 999)
_TEXT = st.sampled_from(["GPU has fallen off the bus.", "Graphics Exception: ESR 0x404490=0x80000001", "MMU Fault"])


@st.composite
def _gpu_line(draw: st.DrawFn) -> tuple[str, tuple[str, str, int | None] | None]:
    """One kernel-log text as some driver generation prints it, and the event it is (None: not one)."""
    bus, xid, text = draw(_BUS), draw(_XID), draw(_TEXT)
    forms: list[tuple[str, tuple[str, str, int | None] | None]] = [
        (f"NVRM: Xid (PCI:{bus}): {xid}, {text}", ("xid", bus, xid)),  # r418-r460
        (f"NVRM: Xid (PCI:{bus}): {xid}, pid=1234, {text}", ("xid", bus, xid)),  # r470
        (f"NVRM: Xid (PCI:{bus}): {xid}, pid='<unknown>', name=<unknown>, {text}", ("xid", bus, xid)),  # r525+
        (f"NVRM: Xid (PCI:{bus}): {xid}, pid=3321, name=nvidia-smi, {text}", ("xid", bus, xid)),  # r550+
        (f"NVRM: Xid ({bus}): {xid}, 0003 00000000 0000a1c0", ("xid", bus, xid)),  # pre-r400
        (f"NVRM: Xid (PCI:{bus}): {xid}", ("xid", bus, xid)),
        (f"NVRM: GPU {bus}.0: GPU has fallen off the bus.", ("fallen_off_bus", bus, None)),
        (f"NVRM: GPU at PCI:{bus}: GPU has fallen off the bus.", ("fallen_off_bus", bus, None)),
        (
            f"NVRM: The NVIDIA GPU {bus}.0 (PCI ID: 10de:20b0) installed in this system has fallen off the bus "
            "and is not responding to commands.",
            ("fallen_off_bus", bus, None),
        ),
        (f"NVRM: GPU at PCI:{bus}: GPU-9f8a2e1c-0000-0000-0000-000000000000", None),
        ("NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15", None),
        ("usb 1-1: new high-speed USB device number 3", None),
    ]
    return draw(st.sampled_from(forms))


@st.composite
def _capture(draw: st.DrawFn) -> tuple[list[str], list[tuple[str, str, int | None]]]:
    """Lines of a kernel log in one of the formats it is captured in, and the GPU events among them."""
    wrap = draw(st.sampled_from(["kmsg", "dmesg", "journal"]))
    lines: list[str] = []
    expected: list[tuple[str, str, int | None]] = []
    for seq, (text, event) in enumerate(draw(st.lists(_gpu_line(), max_size=12)), start=1):
        if wrap == "kmsg":
            lines.append(f"4,{seq},{seq * 1000},-;{text}")
            if draw(st.booleans()):
                lines.append(" SUBSYSTEM=pci")  # a record's dictionary: not a record of its own
        elif wrap == "dmesg":
            lines.append(f"[{seq:5d}.000001] {text}")
        else:
            lines.append(f"Nov 29 10:00:{seq % 60:02d} gpu-7 kernel: {text}")
        if event is not None:
            kind, bus, xid = event
            expected.append((kind, normalize_bus_id(bus), xid))
    return lines, expected


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    capture=_capture(),
    transport=st.sampled_from(["fifo", "file", "file without a trailing newline"]),
    cuts=st.lists(st.integers(1, 400), max_size=8),
)
def test_any_capture_in_any_chunks_yields_exactly_its_gpu_events_once(
    tmp_path_factory: pytest.TempPathFactory,
    capture: tuple[list[str], list[tuple[str, str, int | None]]],
    transport: str,
    cuts: list[int],
) -> None:
    """Written through a FIFO or into a file, in chunks that cut lines
    anywhere, read between the chunks: every GPU event once, none made up."""
    lines, expected = capture
    data = "".join(f"{line}\n" for line in lines).encode()
    if transport == "file without a trailing newline":
        data = data.removesuffix(b"\n")
    chunks, at = [], 0
    for cut in cuts:
        chunks.append(data[at : at + cut])
        at += cut
    chunks.append(data[at:])
    where = tmp_path_factory.mktemp("capture") / "kmsg"
    keep = writer = -1
    if transport == "fifo":
        os.mkfifo(where)
        keep = os.open(where, os.O_RDONLY | os.O_NONBLOCK)
        writer = os.open(where, os.O_WRONLY | os.O_NONBLOCK)
    else:
        where.write_bytes(b"")
    source = DevKmsgSource(str(where), settle_s=3600)  # a writer is at work until the end
    got: list[GpuEvent] = []
    probe = KmsgProbe(source, got.append, clock=fixed_clock())
    try:
        for chunk in chunks:
            if writer >= 0:
                os.write(writer, chunk)
            else:
                with open(where, "ab") as f:
                    f.write(chunk)
            probe.drain()
        # The writer is done: it closes the FIFO, or the file stops changing.
        if writer >= 0:
            os.close(writer)
        else:
            old = time.time() - 7200
            os.utime(where, (old, old))
        probe.drain()
    finally:
        source.close()
        if keep >= 0:
            os.close(keep)
    assert [(e.kind.value, e.pci_bus_id, e.xid) for e in got] == expected
