"""GPU probe: samples from the GPU backend, with retry and backoff.

NVML that cannot initialise (driver not loaded yet after a reboot, library
missing in a misbuilt image) must not stop the agent: storage, InfiniBand and
the kernel log still have things to say. The probe reports the failure in the
sample (``gpu_source_error``), logs it once per attempt, and retries with
exponential backoff. When NVML comes up, an event thread blocks on the
backend's event set and hands XID/ECC events to ``sink`` immediately.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from agent.samples import GpuEvent, GpuSample
from agent.sources.base import BackendUnavailableError, GpuBackend
from gpuwarden.logconfig import get_logger

log = get_logger(__name__)


class GpuProbe:
    """Owns the GPU backend's life: open, retry, sample, event thread."""

    def __init__(
        self,
        backend: GpuBackend,
        sink: Callable[[GpuEvent], None],
        retry_initial_s: float = 1.0,
        retry_max_s: float = 300.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self._sink = sink
        self._retry_initial = retry_initial_s
        self._retry_max = retry_max_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._open = False
        self._next_try = 0.0
        self._delay = retry_initial_s
        self.last_error: str | None = None
        self.attempts = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._events_enabled = False

    @property
    def is_open(self) -> bool:
        return self._open

    def _try_open(self) -> bool:
        now = self._monotonic()
        if now < self._next_try:
            return False
        self.attempts += 1
        try:
            self.backend.open()
        except BackendUnavailableError as exc:
            self.last_error = str(exc)
            self._next_try = now + self._delay
            log.error(
                "gpu_backend_unavailable",
                backend=self.backend.name,
                error=self.last_error,
                attempt=self.attempts,
                retry_in_s=self._delay,
            )
            self._delay = min(self._delay * 2, self._retry_max)
            return False
        self._open = True
        self.last_error = None
        self._delay = self._retry_initial
        return True

    def _mark_broken(self, exc: BackendUnavailableError) -> None:
        self._open = False
        self.last_error = str(exc)
        self._next_try = self._monotonic() + self._delay
        log.error("gpu_backend_failed", backend=self.backend.name, error=self.last_error, retry_in_s=self._delay)
        self._delay = min(self._delay * 2, self._retry_max)
        self.backend.close()

    def sample(self) -> tuple[tuple[GpuSample, ...], str | None]:
        """GPU samples, or ``((), reason)`` while the backend is unavailable."""
        with self._lock:
            if not self._open and not self._try_open():
                return (), self.last_error or "GPU backend not open"
            try:
                return self.backend.sample(), None
            except BackendUnavailableError as exc:
                self._mark_broken(exc)
                return (), self.last_error

    # ---------------------------------------------------------------- events

    def start_events(self) -> None:
        """Start the thread that waits on the backend's event set."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="gpuwarden-gpu-events", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self._open:
                self._stop.wait(0.2)
                continue
            try:
                event = self.backend.wait_event(0.2)
                if event is not None:
                    self._sink(event)
            except BackendUnavailableError as exc:
                log.error("gpu_event_wait_failed", error=str(exc))
                self._stop.wait(1.0)
            except Exception:
                # The event thread must outlive a driver oddity or a bug in
                # the sink: nothing restarts it, and without it XIDs wait for
                # the kernel log. Polling still runs meanwhile.
                log.exception("gpu_event_wait_failed")
                self._stop.wait(1.0)

    def request_stop(self) -> None:
        """Ask the thread to finish without waiting for it."""
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        with self._lock:
            self.backend.close()
            self._open = False
