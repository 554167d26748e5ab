"""Retrying a failing API server: jittered backoff and one log line per outage."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuwarden.kube.errors import ApiError
from gpuwarden.logconfig import get_logger

log = get_logger(__name__)


@dataclass
class Backoff:
    """Exponential backoff with jitter, for retrying a failing API server.

    Each delay is drawn from the upper half of the exponential window ("equal
    jitter"): never zero, so one agent does not spin, and spread, so a fleet
    of agents that lost the API server together does not come back in step.
    """

    base_s: float = 0.2
    cap_s: float = 30.0
    rng: random.Random = field(default_factory=random.Random)
    attempt: int = 0

    def next_delay(self) -> float:
        window = min(self.cap_s, self.base_s * float(1 << self.attempt))
        self.attempt = min(self.attempt + 1, 32)
        return window / 2 + self.rng.uniform(0, window / 2)

    def reset(self) -> None:
        self.attempt = 0


class OutageLog:
    """Logs an API outage once when it starts and once when it ends.

    Retrying every few seconds through a long outage must not write a line
    per retry across a whole fleet; the count of failures is in the metrics.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._since: float | None = None
        self._failures = 0
        # Outages logged since start (each is one warning line).
        self.outages = 0

    @property
    def in_outage(self) -> bool:
        return self._since is not None

    def failed(self, error: ApiError) -> None:
        self._failures += 1
        if self._since is None:
            self._since = self._clock()
            self.outages += 1
            log.warning(
                "kubernetes_api_failing",
                operation=error.operation,
                status=error.status,
                error=error.detail,
                transient=error.transient,
            )

    def recovered(self) -> None:
        if self._since is None:
            return
        log.info(
            "kubernetes_api_recovered",
            failures=self._failures,
            outage_s=round(self._clock() - self._since, 3),
        )
        self._since = None
        self._failures = 0
