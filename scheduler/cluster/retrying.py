"""One API call retried with backoff, the way every executor retries.

Only transient failures (no response, 408, 429, 5xx: see
:attr:`gpuwarden.kube.ApiError.transient`) are retried, a bounded number of
times, so one pod whose requests keep failing costs its worker a few seconds
and then is reported, instead of holding up the pods behind it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from gpuwarden.kube import ApiError, Backoff

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a failing request is tried again.

    ``attempts`` counts the first try. ``backoff`` makes a fresh
    :class:`Backoff` per request, so one pod's failures do not lengthen the
    next pod's waits; ``sleep`` is replaceable so tests do not wait.
    """

    attempts: int = 3
    backoff: Callable[[], Backoff] = field(default=lambda: Backoff(base_s=0.1, cap_s=2.0))
    sleep: Callable[[float], None] = time.sleep
    # Statuses not retried although transient in general (an Eviction's 429 is a
    # PodDisruptionBudget saying no, which a retry a moment later will not change).
    never_retry: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")


def call_with_retries(policy: RetryPolicy, request: Callable[[], T]) -> tuple[T | ApiError, int]:
    """``request()``'s answer, or the last ApiError; with the number of tries made."""
    # Made at the first failure: a Backoff seeds its own random generator,
    # which cost a bind's hot path more than building the request did.
    backoff: Backoff | None = None
    tries = 0
    while True:
        tries += 1
        try:
            return request(), tries
        except ApiError as err:
            retry = err.transient and err.status not in policy.never_retry and tries < policy.attempts
            if not retry:
                return err, tries
        if backoff is None:
            backoff = policy.backoff()
        policy.sleep(backoff.next_delay())
