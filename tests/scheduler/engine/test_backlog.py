"""The backlog memo skips only attempts that would fail, and skips them.

A session with a :class:`~scheduler.engine.backlog.BacklogMemo` must decide
exactly what one without decides (binds, evictions, pending reasons, shares,
reservations), over any sequence of sessions with the cluster changing in
between: binds come back as running pods, jobs come and go, nodes change
health, queues change, and sometimes nothing changes at all. The counting
tests then show what the memo is for: a second session over an unchanged
backlog searches for none of it, and a change of capacity makes it search
again. They count attempts, never time.
"""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwarden.contract import ANNOTATION_GPU_FRACTION
from scheduler.engine.backlog import BacklogMemo
from scheduler.engine.incremental import Engine
from scheduler.engine.model import (
    Gpu,
    Job,
    Node,
    Queue,
    QueueResource,
    Snapshot,
    Task,
    TaskStatus,
)
from scheduler.engine.session import run_session
from tests.scheduler.engine.test_incremental import _next
from tests.scheduler.engine.test_properties import snapshots, with_running_work


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(snapshots(), st.data())
def test_a_memo_never_changes_a_decision(first: Snapshot, data: st.DataObject) -> None:
    kept = Engine(memo=BacklogMemo())
    fresh_memo = BacklogMemo()
    snapshot = with_running_work(first) if data.draw(st.booleans(), label="running work") else first
    for step in range(8):
        without = run_session(snapshot)
        assert kept.run(snapshot) == without, f"step {step}: the kept state with a memo decided differently"
        assert run_session(snapshot, memo=fresh_memo) == without, f"step {step}: a memo changed a decision"
        if data.draw(st.sampled_from([False] * 3 + [True]), label="nothing changes"):
            # The executor did nothing (or the watch showed nothing yet): the same input, later.
            snapshot = replace(snapshot, now=snapshot.now + 10.0)
        else:
            snapshot = _next(snapshot, without, data, step)


def _seeded_backlog(seed: int, count: int) -> Snapshot:
    """Alike 8-GPU nodes nearly full (whole-GPU pods and half-GPU slices), and pending work that mostly fits nowhere.

    Where ties in placement's order show: with many alike nodes, an attempt
    that evicted or placed and then rolled back moves a node within its
    bucket, and a later pod lands elsewhere; a skipped attempt must be one
    that would have moved nothing. Drawn from a seeded generator (as
    ``benchmarks/scheduler_backlog.py`` draws its cluster): hypothesis picks
    the seed and the size.
    """
    rng = random.Random(seed)
    queues = ("a", "b", "c")
    nodes = tuple(_node(f"n{i}") for i in range(count))
    jobs: list[Job] = []
    for i in range(count):
        used = 8 - rng.choice([0, 0, 1, 2])
        g = 0
        while g < used:
            queue = rng.choice(queues)
            priority = rng.choice([10, 50])
            if rng.random() < 0.2:
                jobs.append(_half(f"r{i}-{g}", f"n{i}", g, priority=priority, queue=queue))
                g += 1
                continue
            size = min(used - g, rng.choice([1, 2, 4]))
            jobs.append(_running(f"r{i}-{g}", f"n{i}", tuple(range(g, g + size)), priority=priority, queue=queue))
            g += size
    for i in range(count * 4):
        queue = rng.choice(queues)
        priority = rng.choice([10, 50, 80])
        roll = rng.random()
        if roll < 0.6:
            pods = rng.choice([2, 3, 4])
            jobs.append(_gang(f"p{i}", pods=pods, gpus=8, queue=queue, priority=priority, created=10.0 + i))
        elif roll < 0.8:
            jobs.append(_gang(f"p{i}", pods=1, gpus=4, queue=queue, priority=priority, created=10.0 + i))
        else:
            task = Task(f"p{i}-0", uid=f"p{i}-0", gpus=2, cpu_milli=60_000, memory_mib=1024)
            jobs.append(Job(f"p{i}", queue, uid=f"p{i}", priority=priority, created=10.0 + i, tasks=(task,)))
    tree = tuple(Queue(name, priority=k % 2, gpu=QueueResource(quota=1_000_000)) for k, name in enumerate(queues))
    return Snapshot(nodes, tree, tuple(jobs), now=100.0)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.integers(0, 1 << 16), st.integers(3, 16), st.data())
def test_a_memo_never_changes_a_decision_over_a_backlog(seed: int, count: int, data: st.DataObject) -> None:
    kept = Engine(memo=BacklogMemo())
    fresh_memo = BacklogMemo()
    snapshot = _seeded_backlog(seed, count)
    for step in range(6):
        without = run_session(snapshot)
        assert kept.run(snapshot) == without, f"step {step}: the kept state with a memo decided differently"
        assert run_session(snapshot, memo=fresh_memo) == without, f"step {step}: a memo changed a decision"
        if data.draw(st.sampled_from([False, True]), label="nothing changes"):
            snapshot = replace(snapshot, now=snapshot.now + 10.0)
        else:
            snapshot = _next(snapshot, without, data, step)


# -- counting ----------------------------------------------------------------------


def _node(name: str, gpus: int = 8) -> Node:
    return Node(name, cpu_milli=64000, memory_mib=512 * 1024, gpus=tuple(Gpu(g) for g in range(gpus)))


def _running(job: str, node: str, gpus: tuple[int, ...], *, priority: int = 50, queue: str = "a") -> Job:
    task = Task(
        f"{job}-0",
        uid=f"{job}-0",
        gpus=len(gpus),
        cpu_milli=1000,
        memory_mib=1024,
        status=TaskStatus.RUNNING,
        node=node,
        gpu_indices=gpus,
    )
    return Job(job, queue, uid=job, priority=priority, created=1.0, tasks=(task,))


def _half(job: str, node: str, gpu: int, *, priority: int, queue: str) -> Job:
    task = Task(
        f"{job}-0",
        uid=f"{job}-0",
        cpu_milli=1000,
        memory_mib=1024,
        annotations={ANNOTATION_GPU_FRACTION: "0.5"},
        status=TaskStatus.RUNNING,
        node=node,
        gpu_indices=(gpu,),
    )
    return Job(job, queue, uid=job, priority=priority, created=1.0, tasks=(task,))


def _gang(name: str, pods: int, gpus: int, *, queue: str = "b", priority: int = 50, created: float = 10.0) -> Job:
    tasks = tuple(
        Task(f"{name}-{k}", uid=f"{name}-{k}", gpus=gpus, cpu_milli=1000, memory_mib=1024) for k in range(pods)
    )
    return Job(name, queue, uid=name, priority=priority, min_member=pods, created=created, tasks=tasks)


def _backlog(jobs: int = 40, *, high: bool = False) -> Snapshot:
    """Four 8-GPU nodes each with 6 GPUs busy, and a backlog of gangs of 4-GPU pods and 2 x 8-GPU pods.

    Queue a holds the running work within its quota; queue b's jobs cannot
    fit, cannot reclaim (a is within its quota) and cannot consolidate (a
    moved 6-GPU pod would find no node, which the search sees on paper).
    With ``high``, a's own gang of five 8-GPU pods outranks its running
    work, and preemption evicts and rolls back before it finds it cannot
    make enough room.
    """
    nodes = tuple(_node(f"n{i}") for i in range(4))
    running = [_running(f"r{i}", f"n{i}", tuple(range(6))) for i in range(4)]
    pending = [_gang(f"g{i}", pods=2 if i % 2 else 1, gpus=8 if i % 2 else 4, created=10.0 + i) for i in range(jobs)]
    if high:
        pending.append(_gang("hi", pods=5, gpus=8, queue="a", priority=90))
    queues = (
        Queue("a", gpu=QueueResource(quota=24_000)),
        Queue("b", gpu=QueueResource(quota=8_000)),
    )
    return Snapshot(nodes, queues, tuple(running + pending), now=100.0)


def test_an_unchanged_backlog_is_not_searched_again() -> None:
    snapshot = _backlog()
    memo = BacklogMemo()
    engine = Engine(memo=memo)
    first = engine.run(snapshot)
    assert first == run_session(snapshot)
    assert not first.binds and not first.evictions
    assert len(first.pending) == 40
    # Identical pods are judged once: two shapes of gang, each searched for once.
    assert (memo.counts.placements_tried, memo.counts.placements_skipped) == (2, 38)
    assert memo.counts.plans_tried == 1  # consolidation, refused on paper
    again = replace(snapshot, now=110.0)
    second = engine.run(again)
    assert second == run_session(again)
    assert (memo.counts.placements_tried, memo.counts.placements_skipped) == (0, 40)
    assert (memo.counts.plans_tried, memo.counts.plans_skipped) == (0, 1)
    # Reclaim had no plan for b's jobs (a is within its quota): not asked again either.
    assert memo.counts.no_plans_skipped > 0


def test_a_plan_that_evicted_before_it_failed_is_searched_again() -> None:
    """Undoing its evictions moved pods within placement's order: skipping it would not, so it is not skipped."""
    snapshot = _backlog(high=True)
    memo = BacklogMemo()
    engine = Engine(memo=memo)
    engine.run(snapshot)
    assert memo.counts.plans_tried == 2
    again = replace(snapshot, now=110.0)
    assert engine.run(again) == run_session(again)
    assert (memo.counts.plans_tried, memo.counts.plans_skipped) == (1, 1)
    assert memo.counts.placements_tried == 0


def test_a_finished_pod_makes_the_backlog_searched_again() -> None:
    snapshot = _backlog()
    memo = BacklogMemo()
    engine = Engine(memo=memo)
    engine.run(snapshot)
    # r0 finishes: n0 has 8 free GPUs, so every shape could fit a pod there.
    later = replace(snapshot, jobs=snapshot.jobs[1:], now=110.0)
    decided = engine.run(later)
    assert decided == run_session(later)
    assert decided.binds
    assert memo.counts.placements_tried >= 2
    assert memo.counts.plans_skipped == 0


def test_room_that_no_pod_of_a_shape_can_use_keeps_its_verdict() -> None:
    """A pod leaving one GPU free on a node with six busy: 4- and 8-GPU pods still fit nowhere."""
    snapshot = _backlog()
    memo = BacklogMemo()
    engine = Engine(memo=memo)
    engine.run(snapshot)
    smaller = _running("r0", "n0", tuple(range(5)))
    later = replace(snapshot, jobs=(smaller, *snapshot.jobs[1:]), now=110.0)
    decided = engine.run(later)
    assert decided == run_session(later)
    assert memo.counts.placements_tried == 0
    assert memo.counts.plans_tried == 1  # the input changed: the victim search runs again


def test_a_new_node_makes_the_backlog_searched_again() -> None:
    snapshot = _backlog()
    memo = BacklogMemo()
    run_session(snapshot, memo=memo)
    grown = replace(snapshot, nodes=(*snapshot.nodes, _node("n4")), now=110.0)
    decided = run_session(grown, memo=memo)
    assert decided == run_session(grown)
    assert decided.binds
    assert memo.counts.placements_tried >= 2


def test_a_quota_change_is_judged_live() -> None:
    """Limits are checked before the memo is read: a new limit gives its own reason at once."""
    snapshot = _backlog()
    memo = BacklogMemo()
    run_session(snapshot, memo=memo)
    limited = (snapshot.queues[0], Queue("b", gpu=QueueResource(quota=8_000, limit=2_000)))
    later = replace(snapshot, queues=limited, now=110.0)
    decided = run_session(later, memo=memo)
    assert decided == run_session(later)
    reasons = {status.job: status.reasons[0].code for status in decided.pending}
    assert reasons["default/g0"].value == "OverLimit"


def test_a_failed_session_forgets_what_the_memo_knew() -> None:
    memo = BacklogMemo()
    run_session(_backlog(), memo=memo)
    memo.abandon()
    run_session(replace(_backlog(), now=110.0), memo=memo)
    assert memo.counts.placements_tried == 2
