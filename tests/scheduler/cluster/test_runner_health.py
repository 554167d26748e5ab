"""/healthz of the connected scheduler: a hung loop fails it, a slow or API-less one does not."""

from __future__ import annotations

import time

from kubernetes import client

from scheduler.runner import RunnerSettings, SchedulerRunner


def _runner() -> SchedulerRunner:
    # Nothing is started, so the client never connects.
    return SchedulerRunner(client.ApiClient(), RunnerSettings(stall_s=10.0))


def test_starting_replica_is_alive() -> None:
    assert _runner().liveness()[0]


def test_loop_without_a_turn_for_too_long_fails() -> None:
    runner = _runner()
    runner._loop_started = runner._last_turn = time.monotonic() - 30
    ok, reason = runner.liveness()
    assert not ok and "stuck" in reason
    runner._last_turn = time.monotonic()
    assert runner.liveness()[0]


def test_long_cycle_is_alive_while_api_requests_finish() -> None:
    runner = _runner()
    runner._loop_started = runner._cycle_since = time.monotonic() - 30
    assert not runner.liveness()[0]
    runner.api.stats.record("bind_pod", ok=False)  # a failed request is progress too (API down)
    assert runner.liveness()[0]


def test_a_remediation_pass_hung_with_no_api_progress_fails_it() -> None:
    """The pass runs beside the loop, whose turns go on: its own start time is judged."""
    runner = _runner()
    runner._loop_started = runner._last_turn = time.monotonic()
    worker = runner.remediation_worker
    assert worker is not None
    worker.busy_since = time.monotonic() - 30
    ok, reason = runner.liveness()
    assert not ok and "remediation pass" in reason
    runner.api.stats.record("patch_node", ok=True)
    assert runner.liveness()[0]


def test_readiness_waits_for_the_cache() -> None:
    assert _runner().readiness() == (False, "cache not synced yet")
