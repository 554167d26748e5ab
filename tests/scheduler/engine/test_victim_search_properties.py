"""On small random clusters, the victim search finds a plan whenever one exists, and no costlier one.

Each case is a pool of 2-4 nodes with 2-4 GPUs each, preemptible jobs of two
queues running on them (whole GPUs; some elastic, some gangs across two
nodes) and one pending single-pod job that does not fit as things stand. An
exhaustive search here tries every set of evictions that gpuwarden's rules
allow, written out independently of the engine:

- victims are preemptible, and go whole or, for a job running more pods than
  its minMember, lose some of its pods beyond minMember (a *shrink*);
- reclaim takes only from the other queue, and each victim's pods, evicted
  smallest first, must pass when they go: the victim's queue stays at or
  above its fair share afterwards, or, when the reclaimer stays within its
  guaranteed quota (``min(quota, fair share)``), the victim's queue holds
  more than its own guarantee before they go; the reclaimer must stay within
  its fair share or its guarantee;
- preemption takes only strictly lower-priority work of the pending job's
  own queue.

A set is feasible when the pod fits on some node once the set is gone. Its
cost is ``(highest victim priority, milli-GPUs evicted, pods evicted)``,
compared as a tuple. The engine (allocate, then only the action under test)
must find a plan whenever the exhaustive search finds one, of no greater
cost, and never evict when none exists.

A plan only ever needs victims on the node the pod goes to (a victim
elsewhere adds cost and frees nothing there, and never makes another
victim admissible), so the search is exhaustive per node.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from scheduler.engine.actions import allocate, preempt, reclaim
from scheduler.engine.build import build_cluster
from scheduler.engine.caches import SessionCaches
from scheduler.engine.model import UNLIMITED, Job, Snapshot, Task
from scheduler.engine.state import Cluster, JobState, QueueState
from tests.scheduler.builders import job, node, pending, queue, running

CASES = 200
Cost = tuple[int, int, int]
Action = Callable[[Cluster, SessionCaches], None]


def _snapshot(rng: random.Random) -> Snapshot:
    nodes = [node(f"n{i}", rng.randint(2, 4)) for i in range(rng.randint(2, 4))]
    free = {n.name: list(range(len(n.gpus))) for n in nodes}
    jobs: list[Job] = []
    for j in range(rng.randint(2, 7)):
        size = rng.choice((1, 1, 2))
        pods = rng.choice((1, 1, 1, 2, 3))
        tasks: list[Task] = []
        for p in range(pods):
            places = [n for n, gpus in free.items() if len(gpus) >= size]
            if not places:
                break
            where = rng.choice(places)
            held = tuple(free[where][:size])
            del free[where][:size]
            tasks.append(running(f"j{j}-{p}", where, held))
        if not tasks:
            break
        jobs.append(
            job(
                f"j{j}",
                rng.choice(("a", "b")),
                *tasks,
                priority=rng.choice((0, 10, 20)),
                min_member=rng.randint(1, len(tasks)),
                created=float(rng.randint(0, 50)),
            )
        )
    most = max(len(n.gpus) for n in nodes)
    want = pending("want-0", rng.randint(1, most))
    jobs.append(job("want", "b", want, priority=rng.choice((0, 10, 20, 30)), created=100.0))
    return Snapshot(
        nodes=tuple(nodes),
        queues=(queue("a", rng.randint(0, 6)), queue("b", rng.randint(0, 6))),
        jobs=tuple(jobs),
    )


@dataclass(frozen=True)
class _Pod:
    job: str
    node: str
    gpus: int


@dataclass(frozen=True)
class _Victim:
    name: str
    queue: str
    priority: int
    surplus: int
    pods: tuple[_Pod, ...]


def _victims(cluster: Cluster) -> list[_Victim]:
    out = []
    for j in cluster.jobs:
        if not j.preemptible or j.queue is None or j.has_pending:
            continue
        pods = tuple(_Pod(j.spec.name, t.node.name, len(t.gpu_pos)) for t in j.tasks if t.node is not None)
        out.append(_Victim(j.spec.name, j.queue.name, j.spec.priority, max(0, len(pods) - j.spec.min_member), pods))
    return out


def _guarantee(q: QueueState) -> int:
    return q.share[0] if q.quota[0] == UNLIMITED else min(q.quota[0], q.share[0])


def _reclaim_rule(cluster: Cluster, want: JobState, need: int) -> Callable[[list[list[_Pod]]], bool] | None:
    mine = cluster.queues["b"]
    theirs = cluster.queues["a"]
    owed = mine.alloc[0] + need <= _guarantee(mine)
    if not owed and mine.alloc[0] + need > mine.share[0]:
        return None

    def admissible(units: list[list[_Pod]]) -> bool:
        alloc = theirs.alloc[0]
        for unit in sorted(units, key=lambda u: sum(p.gpus for p in u)):
            held = sum(p.gpus for p in unit) * 1000
            if not (alloc - held >= theirs.share[0] or (owed and held > 0 and alloc > _guarantee(theirs))):
                return False
            alloc -= held
        return True

    return admissible


def _cheapest(cluster: Cluster, action: Action, want: JobState) -> Cost | None:
    """The exhaustive search: the cheapest feasible, admissible set under ``action``'s rules."""
    need = want.tasks[0].gpu.whole
    victims = _victims(cluster)
    if action is reclaim.run:
        rule = _reclaim_rule(cluster, want, need * 1000)
        if rule is None:
            return None
        admissible = rule
        victims = [v for v in victims if v.queue == "a"]
    else:

        def admissible(_units: list[list[_Pod]]) -> bool:
            return True

        victims = [v for v in victims if v.queue == "b" and v.priority < want.spec.priority]
    best: Cost | None = None
    for n in cluster.nodes.values():
        held_here = {p: 0 for p in range(len(n.gpu_ok))}
        for t in n.tasks:
            for p in t.gpu_pos:
                held_here[p] += 1
        local = [v for v in victims if any(p.node == n.name for p in v.pods)]
        options: list[list[tuple[_Victim, list[_Pod]] | None]] = []
        for v in local:
            here = [p for p in v.pods if p.node == n.name]
            choice: list[tuple[_Victim, list[_Pod]] | None] = [None, (v, list(v.pods))]
            for k in range(1, min(v.surplus, len(here)) + 1):
                choice.append((v, here[:k]))
            options.append(choice)
        for combo in itertools.product(*options):
            chosen = [c for c in combo if c is not None]
            if not chosen:
                continue
            freed = sum(p.gpus for _, pods in chosen for p in pods if p.node == n.name)
            if n.free_whole + freed < need:
                continue
            if not admissible([pods for _, pods in chosen]):
                continue
            cost = (
                max(v.priority for v, _ in chosen),
                sum(p.gpus for _, pods in chosen for p in pods) * 1000,
                sum(len(pods) for _, pods in chosen),
            )
            if best is None or cost < best:
                best = cost
    return best


def _engine(cluster: Cluster, action: Action, want: JobState) -> Cost | None:
    action(cluster, SessionCaches())
    gone = [t for t in cluster.touched if t.was_running and t.eviction is not None]
    if not gone:
        return None
    assert want.tasks[0].node is not None, "evicted without placing the beneficiary"
    return (
        max(t.job.spec.priority for t in gone),
        sum(t.milli for t in gone),
        len(gone),
    )


def _after_allocate(snap: Snapshot) -> tuple[Cluster, JobState] | None:
    cluster = build_cluster(snap)
    allocate.run(cluster, SessionCaches())
    want = next(j for j in cluster.jobs if j.spec.name == "want")
    if want.tasks[0].node is not None:
        return None  # it fits without evicting anything
    cluster.touched = []
    return cluster, want


@pytest.mark.parametrize("action", [reclaim.run, preempt.run], ids=["reclaim", "preempt"])
def test_the_engine_finds_a_plan_whenever_one_exists_and_no_costlier(action: Action) -> None:
    rng = random.Random(20261202)
    checked = found = 0
    while checked < CASES:
        snap = _snapshot(rng)
        ready = _after_allocate(snap)
        if ready is None:
            continue
        checked += 1
        cluster, want = ready
        cheapest = _cheapest(cluster, action, want)
        engine_cluster, engine_want = _after_allocate(snap) or ready
        got = _engine(engine_cluster, action, engine_want)
        if cheapest is None:
            assert got is None, f"evicted {got} where no plan is allowed: {snap}"
            continue
        found += 1
        assert got is not None, f"no plan found, the cheapest costs {cheapest}: {snap}"
        assert got <= cheapest, f"plan costs {got}, the cheapest {cheapest}: {snap}"
    # The generator must exercise the search, not only the cases without a plan.
    assert found >= CASES // 10
