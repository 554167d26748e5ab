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
import stat
import threading
import time

from agent.bootstate import current_boot_id
from agent.sources.base import KmsgSource
from gpuwarden.logconfig import get_logger

log = get_logger(__name__)


class DevKmsgSource(KmsgSource):
    """``/dev/kmsg`` (or a captured log in a file or a pipe) opened non-blocking.

    Only a character device is read record by record: ``/dev/kmsg`` returns
    one record per ``read``, and opening it starts at the oldest record still
    in the ring buffer. ``EPIPE`` means records were overwritten before we
    read them: we log it and carry on with the next. Anything else (a regular
    file replaying a capture, a FIFO something writes a log into) returns
    whatever was written, many lines or part of one per ``read``, so it is
    split into lines, and then followed for more lines like ``tail -f``.

    End of file is not an error and must not be read in a loop: a FIFO whose
    writer left, and a regular file, report it at once and forever (and
    ``select`` calls them readable all along), so a reader at end of file
    waits its timeout before it looks again. A line without its newline at
    end of file is the last line once nobody can still be writing it: at
    once for a FIFO whose writer closed, and for a regular file once it has
    not changed for ``settle_s`` (a capture written earlier, or a writer that
    finished). Before that it may be half written, and half of
    ``Xid (...): 79`` reads as XID 7.

    :meth:`close` may come from another thread while the reader waits in
    ``select`` or reads. Closing the descriptor under it would be a bug worse
    than a crash: the number is free at once, the next ``open`` anywhere in
    the agent reuses it, and the reader would read that file. So ``select``
    also watches a self-pipe that ``close`` writes to; ``close`` then waits
    (up to ``close_wait_s``) for every reader to leave :meth:`read`, and the
    descriptors are closed by whichever of them finishes last, never while a
    reader is inside.
    """

    def __init__(self, path: str, close_wait_s: float = 5.0, settle_s: float = 1.0) -> None:
        self.path = path
        self._fd: int | None = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            mode = os.fstat(self._fd).st_mode
        except OSError:
            os.close(self._fd)
            raise
        self._is_char = stat.S_ISCHR(mode)
        self._is_file = stat.S_ISREG(mode)
        # /dev/kmsg stamps records with this kernel's clock; a capture replayed
        # from a file or a pipe has another boot's stamps (and sequence numbers).
        self.live_stamps = self._is_char
        self.boot_id = current_boot_id() if self._is_char else ""
        self._settle_s = settle_s
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

    def _read_now(self, fd: int) -> tuple[list[str], bool]:
        """What can be read without waiting, and whether the source is at end of file."""
        return self._read_char(fd) if self._is_char else self._read_lines(fd)

    def _read(self, fd: int, timeout_s: float) -> list[str]:
        out, eof = self._read_now(fd)
        if out or timeout_s <= 0:
            return out
        deadline = time.monotonic() + timeout_s
        if not self._is_file:
            # A device or a pipe with a writer wakes ``select`` when data comes.
            while not eof:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                try:
                    ready, _, _ = select.select([fd, self._wake_r], [], [], remaining)
                except (OSError, ValueError):
                    return []
                if fd not in ready or self._closed.is_set():
                    return []
                out, eof = self._read_now(fd)
                if out:
                    return out
        # At end of file nothing wakes a reader when more is written (and
        # ``select`` would return at once): look again after the wait.
        remaining = deadline - time.monotonic()
        if remaining > 0:
            self._closed.wait(remaining)
        if self._closed.is_set():
            return []
        return self._read_now(fd)[0]

    def _read_char(self, fd: int) -> tuple[list[str], bool]:
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
                return out, True
            out.append(chunk.decode("utf-8", "replace"))
        return out, False

    def _read_lines(self, fd: int) -> tuple[list[str], bool]:
        try:
            data = os.read(fd, 1 << 20)
        except BlockingIOError:  # a pipe's writer has nothing more yet
            return [], False
        except OSError:  # nothing to read: wait, as at end of file
            return [], True
        if data:
            *lines, self._partial = (self._partial + data).split(b"\n")
        else:
            lines = []
            if self._partial and self._last_line_done(fd):
                lines, self._partial = [self._partial], b""
        out = [ln.rstrip(b"\r").decode("utf-8", "replace") for ln in lines]
        # Lines starting with a space are a record's dictionary (" SUBSYSTEM=pci").
        return [ln for ln in out if ln and not ln.startswith(" ")], not data

    def _last_line_done(self, fd: int) -> bool:
        """At end of file, whether the line without its newline is finished (see the class docstring)."""
        if not self._is_file:
            return True  # a pipe's writer closed it
        try:
            mtime = os.fstat(fd).st_mtime
        except OSError:
            return False
        return time.time() - mtime >= self._settle_s

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
