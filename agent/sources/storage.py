"""Shared-storage source: is each configured mount there, and does it answer?

Jobs write checkpoints to the cluster's shared storage; when that mount hangs
(an NFS server gone, a Lustre OST stuck) every such job hangs with it, with
healthy GPUs. So each configured mount point is checked with ``ismount`` and
``statvfs``.

Those calls can block forever in the kernel on a hung filesystem, and no
timeout can interrupt them. Each mount therefore has its own checker thread,
which never starts a second check while one is outstanding; the poll loop only
reads the latest result and, when a check has been outstanding longer than the
mount's timeout, reports the mount as hung. A hung mount costs one parked
thread, never the agent's poll.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from agent.config import MountConfig
from agent.samples import MountSample
from agent.sources.base import MountSource
from gpuwarden.logconfig import get_logger

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class MountCheck:
    """The outcome of one synchronous check of a mount point."""

    mounted: bool
    error: str | None
    latency_s: float


def check_mount(path: str) -> MountCheck:
    """One synchronous check of ``path`` (may block on a hung filesystem)."""
    start = time.monotonic()
    try:
        if not os.path.ismount(path):
            reason = "not a mount point" if os.path.isdir(path) else "no such directory"
            return MountCheck(False, reason, time.monotonic() - start)
        os.statvfs(path)
    except OSError as exc:
        return MountCheck(True, exc.strerror or str(exc), time.monotonic() - start)
    return MountCheck(True, None, time.monotonic() - start)


class _Checker:
    def __init__(self, mount: MountConfig, interval_s: float, check: Callable[[str], MountCheck]) -> None:
        self.mount = mount
        self._check = check
        self.interval_s = interval_s
        self.started_at: float | None = None  # monotonic start of the check in flight
        self.last: MountCheck | None = None
        self.wake = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name=f"gpuwarden-mount:{mount.path}", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.is_set():
            self.started_at = time.monotonic()
            result = self._check(self.mount.path)
            self.last = result
            self.started_at = None
            if result.error:
                log.debug("mount_check_failed", path=self.mount.path, error=result.error)
            self.wake.wait(self.interval_s)
            self.wake.clear()

    def sample(self, now: float) -> MountSample:
        started, last = self.started_at, self.last
        path, timeout = self.mount.path, self.mount.timeout_s
        if started is not None and now - started > timeout:
            return MountSample(
                path=path,
                mounted=last.mounted if last else True,
                responsive=False,
                latency_s=None,
                # No running duration in the text: it becomes the condition's
                # message, which must not change (and be re-sent) every poll.
                error=f"statvfs has not answered within {timeout:g}s",
            )
        if last is None:
            # First check still running and within its timeout: nothing known yet.
            return MountSample(path=path, mounted=True, responsive=True)
        return MountSample(
            path=path,
            mounted=last.mounted,
            responsive=last.mounted and last.error is None,
            latency_s=last.latency_s,
            error=last.error,
        )


class StatvfsMountSource(MountSource):
    """Checks every configured mount in its own thread, every ``interval_s``."""

    def __init__(
        self,
        mounts: list[MountConfig],
        interval_s: float,
        check: Callable[[str], MountCheck] = check_mount,
    ) -> None:
        """``check`` is the filesystem boundary (``ismount`` + ``statvfs``);
        tests hand in one that blocks the way a hung NFS server does."""
        self._checkers = [_Checker(m, interval_s, check) for m in mounts]

    def check(self) -> tuple[MountSample, ...]:
        now = time.monotonic()
        return tuple([c.sample(now) for c in self._checkers])

    def close(self) -> None:
        for c in self._checkers:
            c.stop.set()
            c.wake.set()
        for c in self._checkers:
            # A checker parked in a hung statvfs cannot be joined; it is a daemon.
            c.thread.join(timeout=0.5)
