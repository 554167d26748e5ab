"""Counts of Kubernetes API requests and errors, per operation."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass
class RequestStats:
    """Requests and errors per operation, since start; thread-safe.

    Read by the metrics publisher (``gpuwarden_api_requests_total``,
    ``gpuwarden_api_errors_total``) and by the latency benchmark (requests
    per minute in steady state).
    """

    requests: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    # Monotonic time the latest request finished (answered or failed): the
    # daemon's liveness tells a slow publisher from a stuck one by it. A
    # background request (a watch, a lease renewal) is counted but does not
    # move it: it finishes whether or not the work it watches is stuck.
    last_finished: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, operation: str, ok: bool, *, progress: bool = True) -> None:
        with self._lock:
            self.requests[operation] = self.requests.get(operation, 0) + 1
            if not ok:
                self.errors[operation] = self.errors.get(operation, 0) + 1
            if progress:
                self.last_finished = time.monotonic()

    def snapshot(self) -> tuple[dict[str, int], dict[str, int]]:
        with self._lock:
            return dict(self.requests), dict(self.errors)

    def total_requests(self) -> int:
        with self._lock:
            return sum(self.requests.values())
