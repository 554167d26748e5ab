"""The per-pool circuit breaker."""

from __future__ import annotations

import pytest

from scheduler.remediation.breaker import BreakerSettings, BreakerSettingsError, PoolStatus, is_out, verdict


def pool(size: int, out: int = 0, draining: int = 0) -> PoolStatus:
    nodes = frozenset(f"n{i}" for i in range(size))
    return PoolStatus(
        "default",
        nodes,
        frozenset(f"n{i}" for i in range(out)),
        frozenset(f"n{i}" for i in range(draining)),
    )


def test_the_limit_is_the_share_of_the_pool_at_least_one_node_and_at_most_the_absolute_number() -> None:
    assert [BreakerSettings().limit(n) for n in (1, 5, 19, 20, 100, 1000)] == [1, 1, 1, 2, 10, 100]
    assert BreakerSettings(max_out_nodes=25).limit(1000) == 25
    assert BreakerSettings(max_out_fraction=0.5, max_out_nodes=25).limit(10) == 5


def test_new_quarantines_stop_once_the_pool_has_its_limit_out() -> None:
    settings = BreakerSettings()
    assert verdict(settings, pool(100, out=9), "n50").quarantine_allowed
    held = verdict(settings, pool(100, out=10), "n50")
    assert not held.quarantine_allowed and "10 of 100 nodes out" in held.reason


def test_a_node_already_out_may_go_further_whatever_the_count() -> None:
    assert verdict(BreakerSettings(), pool(100, out=30), "n3").quarantine_allowed


def test_thirty_percent_failing_at_once_stops_at_the_breaker() -> None:
    status = pool(100)
    admitted = []
    for i in range(30):
        name = f"n{i}"
        if verdict(BreakerSettings(), status, name).quarantine_allowed:
            admitted.append(name)
            status = status.with_out(name)
    assert len(admitted) == 10


def test_nodes_out_for_any_reason_count() -> None:
    assert is_out(unschedulable=True, ready=True, remediating=False)
    assert is_out(unschedulable=False, ready=False, remediating=False)
    assert is_out(unschedulable=False, ready=True, remediating=True)
    assert not is_out(unschedulable=False, ready=True, remediating=False)


def test_concurrent_drains_are_limited_but_a_node_draining_keeps_its_slot() -> None:
    settings = BreakerSettings(max_concurrent_drains=2)
    status = pool(100, out=2, draining=2)
    assert not verdict(settings, status, "n50").drain_allowed
    assert verdict(settings, status, "n1").drain_allowed
    assert verdict(settings, pool(100, out=1, draining=1), "n50").drain_allowed
    assert pool(3).with_draining("n1").out == {"n1"}


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"max_out_fraction": 0}, "max_out_fraction"),
        ({"max_out_fraction": 1.5}, "max_out_fraction"),
        ({"max_out_nodes": 0}, "max_out_nodes"),
        ({"max_concurrent_drains": 0}, "max_concurrent_drains"),
    ],
)
def test_settings_that_make_no_sense_are_refused(kwargs: dict[str, float], says: str) -> None:
    with pytest.raises(BreakerSettingsError, match=says):
        BreakerSettings(**kwargs)  # type: ignore[arg-type]
