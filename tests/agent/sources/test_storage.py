"""Shared-storage probe: real mount points, and a statvfs that hangs."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.config import MountConfig
from agent.samples import MountSample
from agent.sources.storage import MountCheck, StatvfsMountSource, check_mount
from tests.waiting import wait_for


def settled(source: StatvfsMountSource, done: Callable[[tuple[MountSample, ...]], bool]) -> tuple[MountSample, ...]:
    """Poll the source until ``done`` holds (checks run in their own threads)."""
    last: list[tuple[MountSample, ...]] = []

    def check() -> bool:
        last[:] = [source.check()]
        return done(last[0])

    wait_for(check, timeout=10.0, interval=0.02, description="mount checks settled")
    return last[0]


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real mount point: tmpfs on a fresh directory, unmounted afterwards."""
    mnt = tmp_path / "shared"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "gwtest", str(mnt)], check=True, timeout=30)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, timeout=30)


def test_check_mount_classifies_paths(tmpfs: Path, tmp_path: Path) -> None:
    assert check_mount(str(tmpfs)).mounted and check_mount(str(tmpfs)).error is None
    plain = check_mount(str(tmp_path))
    assert not plain.mounted and plain.error == "not a mount point"
    gone = check_mount(str(tmp_path / "nope"))
    assert not gone.mounted and gone.error == "no such directory"


def test_source_reports_each_mount(tmpfs: Path, tmp_path: Path) -> None:
    mounts = [MountConfig(str(tmpfs)), MountConfig(str(tmp_path)), MountConfig(str(tmp_path / "nope"))]
    source = StatvfsMountSource(mounts, interval_s=0.05)
    try:
        samples = settled(source, lambda s: all(m.latency_s is not None for m in s))
    finally:
        source.close()
    assert [(m.path, m.mounted, m.responsive) for m in samples] == [
        (str(tmpfs), True, True),
        (str(tmp_path), False, False),
        (str(tmp_path / "nope"), False, False),
    ]


def test_a_hung_statvfs_is_reported_without_blocking_the_poll() -> None:
    release = threading.Event()
    hanging = threading.Event()

    def hung_nfs(path: str) -> MountCheck:
        if not release.is_set():
            hanging.set()
            release.wait(30)
        return MountCheck(mounted=True, error=None, latency_s=0.001)

    source = StatvfsMountSource([MountConfig("/mnt/shared", timeout_s=0.1)], interval_s=0.05, check=hung_nfs)
    try:
        assert hanging.wait(5)
        # Within the timeout: nothing known yet, nothing raised.
        hung = settled(source, lambda s: not s[0].responsive)
        assert hung[0].mounted and not hung[0].responsive
        assert hung[0].error is not None and "has not answered" in hung[0].error
        release.set()
        back = settled(source, lambda s: s[0].responsive)
        assert back[0].responsive and back[0].error is None
    finally:
        release.set()
        source.close()
