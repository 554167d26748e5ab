"""The /dev/kmsg reader: opening, blocking reads that close() wakes, descriptors never closed under a reader."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.probes.kmsg import KmsgProbe
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
        def _read_char(self, fd: int) -> list[str]:
            if not inside.is_set():
                inside.set()
                release.wait(30)  # a reader held up inside os.read
                try:
                    os.fstat(fd)
                    seen_open.append(True)
                except OSError:
                    seen_open.append(False)
            return super()._read_char(fd)

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
