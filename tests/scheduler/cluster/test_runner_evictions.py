"""Remediation's drains and scheduling's evictions are limited apart: neither waits on the other's tokens."""

from __future__ import annotations

from kubernetes import client

from scheduler.cluster.evict import TokenBucket
from scheduler.runner import RunnerSettings, SchedulerRunner


def _buckets(settings: RunnerSettings) -> tuple[TokenBucket, TokenBucket]:
    # Nothing is started, so the client never connects.
    runner = SchedulerRunner(client.ApiClient(), settings)
    assert runner.remediation is not None
    return runner.cycle.evictor.bucket, runner.remediation._evictor.bucket


def test_a_drain_that_spends_its_budget_leaves_the_cycles_untouched() -> None:
    cycle, remediation = _buckets(RunnerSettings(evictions_per_s=5.0))
    assert cycle is not remediation
    assert (cycle.rate, remediation.rate) == (5.0, 5.0)
    remediation.take(remediation.burst * 3)  # a full node drained: its bucket is in debt
    assert cycle.take(1) == 0.0  # a reclaim goes at once


def test_remediation_has_its_own_rate_when_given_one() -> None:
    cycle, remediation = _buckets(RunnerSettings(evictions_per_s=5.0, remediation_evictions_per_s=2.0))
    assert (cycle.rate, remediation.rate) == (5.0, 2.0)
