"""The API wrapper's retry logic, which needs no API server: backoff, outages, transient errors."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from gpuwarden.kube import ApiError, Backoff, OutageLog


@given(st.integers(min_value=0, max_value=10_000), st.integers(min_value=1, max_value=60))
def test_backoff_delays_are_positive_jittered_and_capped(seed: int, attempts: int) -> None:
    backoff = Backoff(base_s=0.2, cap_s=30.0, rng=random.Random(seed))
    delays = [backoff.next_delay() for _ in range(attempts)]
    assert all(0.1 <= d <= 30.0 for d in delays)
    # The window doubles until the cap, so the lower bound of each delay grows.
    for i, d in enumerate(delays):
        assert d >= min(30.0, 0.2 * 2**i) / 2
    backoff.reset()
    assert backoff.next_delay() <= 0.2


def test_outage_is_counted_once_however_many_retries_fail() -> None:
    now = [0.0]
    outage = OutageLog(clock=lambda: now[0])
    for _ in range(50):
        outage.failed(ApiError("patch_node_status", None, "connection refused"))
        now[0] += 1
    failing = outage.in_outage
    outage.recovered()
    outage.recovered()
    assert (failing, outage.in_outage, outage.outages) == (True, False, 1)
    outage.failed(ApiError("patch_node_status", 503, "etcd leader changed"))
    assert outage.outages == 2


def test_api_error_says_what_may_simply_succeed_later() -> None:
    assert ApiError("x", None, "refused").transient
    assert ApiError("x", 503, "unavailable").transient
    assert ApiError("x", 429, "slow down").transient
    assert not ApiError("x", 422, "invalid").transient
    assert not ApiError("x", 403, "forbidden").transient
