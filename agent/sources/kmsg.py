"""The real kernel log: ``/dev/kmsg`` records, or a captured log replayed from a file.

This module only reads records; what they mean (XIDs, "fallen off the bus",
their time, the cursor across restarts) is the kmsg probe's business
(:mod:`agent.probes.kmsg`), which runs the same on the sim's kernel log.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import threading

from agent.bootstate import current_boot_id
from agent.sources.base import KmsgSource
from gpuwarden.logconfig import get_logger

log = get_logger(__name__)


class DevKmsgSource(KmsgSource):
    """``/dev/kmsg`` (or a captured log file) opened non-blocking.

    ``/dev/kmsg`` returns one record per ``read``; opening it starts at the
    oldest record still in the ring buffer. ``EPIPE`` means records were
    overwritten before we read them: we log it and carry on with the next.
    A regular file (tests, replaying a capture) is read line by line and then
    waits for more lines, like ``tail -f``.

    :meth:`close` may come from another thread while the reader waits in
    ``select`` or reads. Closing the descriptor under it would be a bug worse
    than a crash: the number is free at once, the next ``open`` anywhere in
    the agent reuses it, and the reader would read that file. So ``select``
    also watches a self-pipe that ``close`` writes to; ``close`` then waits
    (up to ``close_wait_s``) for every reader to leave :meth:`read`, and the
    descriptors are closed by whichever of them finishes last, never while a
    reader is inside.
    """

    def __init__(self, path: str, close_wait_s: float = 5.0) -> None:
        self.path = path
        self._fd: int | None = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self._is_char = not os.path.isfile(path)
        # /dev/kmsg stamps records with this kernel's clock; a capture replayed
        # from a file has another boot's stamps (and sequence numbers).
        self.live_stamps = self._is_char
        self.boot_id = current_boot_id() if self._is_char else ""
        self._partial = b""
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._close_wait_s = close_wait_s
        self._cond = threading.Condition()
        self._readers = 0
        self._closing = False
        self._closed = threading.Event()  # close() was called

    @property
    def released(self) -> bool:
        """True once the descriptors are closed (after the last reader left)."""
        with self._cond:
            return self._fd is None

    def read(self, timeout_s: float) -> list[str]:
        with self._cond:
            fd = None if self._closing else self._fd
            if fd is not None:
                self._readers += 1
        if fd is None:
            self._closed.wait(timeout_s)
            return []
        try:
            return self._read(fd, timeout_s)
        finally:
            with self._cond:
                self._readers -= 1
                if self._closing and self._readers == 0:
                    self._release()
                    self._cond.notify_all()

    def _read(self, fd: int, timeout_s: float) -> list[str]:
        out = self._read_char(fd) if self._is_char else self._read_file(fd)
        if out or timeout_s <= 0:
            return out
        if self._is_char:
            try:
                ready, _, _ = select.select([fd, self._wake_r], [], [], timeout_s)
            except (OSError, ValueError):
                return []
            return self._read_char(fd) if fd in ready and not self._closed.is_set() else []
        self._closed.wait(timeout_s)
        return [] if self._closed.is_set() else self._read_file(fd)

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
        """Wake any reader, wait for it to leave :meth:`read`, then close."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._closed.set()
            with contextlib.suppress(BlockingIOError):  # the pipe already holds a wake-up
                os.write(self._wake_w, b"\0")
            if self._readers == 0:
                self._release()
                return
            if not self._cond.wait_for(lambda: self._readers == 0, timeout=self._close_wait_s):
                # The last reader to leave closes them; never under it.
                log.warning("kmsg_close_deferred", path=self.path, readers=self._readers)

    def _release(self) -> None:
        """Close the descriptors. Caller holds the lock, and no reader is inside."""
        if self._fd is None:
            return
        for fd in (self._fd, self._wake_r, self._wake_w):
            os.close(fd)
        self._fd = None


def open_kmsg(path: str) -> KmsgSource | None:
    """Open the kernel log, or log clearly why not and return ``None``.

    Reading ``/dev/kmsg`` needs root (or CAP_SYSLOG); a missing or unreadable
    log costs the agent its XID history, not its other sources.
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
