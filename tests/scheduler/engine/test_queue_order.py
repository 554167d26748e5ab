"""Allocate's queue order: the fast path against the rule written out plainly.

Allocate keeps queues in a heap and works a queue's key out again only when
a turn changed the allocation of a queue on its path; the key itself is one
flat tuple. Both are there for speed alone, so a session must decide exactly
what picking, before every turn, the queue with the least per-level
``(over, dominant share, name)`` triples decides.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings

from scheduler.engine.actions import allocate
from scheduler.engine.model import Snapshot
from scheduler.engine.ordering import gang_need
from scheduler.engine.session import run_session
from scheduler.engine.state import Cluster, JobState, QueueState
from tests.scheduler.engine.test_properties import snapshots, with_running_work


def _levels(queue: QueueState, capacity: list[int], need: list[int]) -> list[tuple[int, float, str]]:
    """The documented rule, one triple per level of the queue's path."""
    out = []
    for q in queue.path:
        asks = any(need)
        if asks:
            over = any(q.alloc[r] + need[r] > q.share[r] and (need[r] > 0 or q.alloc[r] > 0) for r in range(3))
        else:
            over = q.share_ratio() >= 1.0
        drs = 0.0
        for r in range(3):
            if capacity[r] > 0:
                drs = max(drs, q.alloc[r] / capacity[r])
            elif q.alloc[r] > 0:
                drs = float("inf")
        out.append((int(over), drs, q.name))
    return out


def _plain_turns(
    cluster: Cluster,
    capacity: list[int],
    lines: dict[str, list[JobState]],
    turn: Callable[[QueueState, list[JobState]], None],
) -> None:
    while True:
        waiting = [name for name, jobs in lines.items() if jobs]
        if not waiting:
            return
        name = min(waiting, key=lambda n: _levels(cluster.queues[n], capacity, gang_need(lines[n][-1])))
        turn(cluster.queues[name], lines[name])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_allocate_decides_as_the_plain_queue_order_does(snapshot: Snapshot) -> None:
    for snap in (snapshot, with_running_work(snapshot)):
        fast = run_session(snap)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(allocate, "_take_turns", _plain_turns)
            plain = run_session(snap)
        assert fast == plain
