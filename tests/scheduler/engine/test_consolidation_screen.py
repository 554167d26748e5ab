"""Consolidation's paper check of the moved pods' whole GPUs refuses only plans that would fail anyway.

The check (``consolidate._whole_gpus_can_land``) skips a set of victims when
the whole-GPU pods it would move could not all find room afterwards, before
the search makes those evictions and undoes them. It must be a necessary
condition only: on random fragmented pools every session decides exactly
what it decides with the check switched off, and where the check is what
stops a doomed move, the plan found is the one that works.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from gpuwarden.contract import ANNOTATION_GPU_FRACTION
from scheduler.engine.actions import consolidate
from scheduler.engine.model import Decisions, Job, Snapshot, Task
from scheduler.engine.session import run_session
from scheduler.engine.state import Cluster, NodeState, TaskState
from tests.scheduler.builders import binds_by_job, evicted, job, node, pending, queue, running

CASES = 150


def _fragmented(rng: random.Random) -> Snapshot:
    """A pool of 3-6 nodes of 4 or 8 GPUs, mostly full of preemptible work of 1-8 GPUs, some of it
    gangs across nodes and GPU slices, and pending jobs larger than any node's free room."""
    nodes = [node(f"n{i}", rng.choice((4, 8))) for i in range(rng.randint(3, 6))]
    free = {n.name: list(range(len(n.gpus))) for n in nodes}
    jobs: list[Job] = []
    for j in range(rng.randint(3, 12)):
        size = rng.choice((1, 1, 2, 4, 8))
        pods = rng.choice((1, 1, 2, 3))
        tasks: list[Task] = []
        for p in range(pods):
            places = [n for n, gpus in free.items() if len(gpus) >= size]
            if not places:
                break
            where = rng.choice(places)
            held = tuple(free[where][:size])
            del free[where][:size]
            if size == 1 and rng.random() < 0.3:
                tasks.append(running(f"j{j}-{p}", where, held, annotations={ANNOTATION_GPU_FRACTION: "0.5"}))
            else:
                tasks.append(running(f"j{j}-{p}", where, held))
        if tasks:
            jobs.append(job(f"j{j}", rng.choice(("a", "b")), *tasks, min_member=len(tasks), created=float(j)))
    for w in range(rng.randint(1, 3)):
        size = rng.choice((2, 4, 8))
        pods = rng.choice((1, 1, 2))
        jobs.append(
            job(
                f"w{w}",
                rng.choice(("a", "b")),
                *(pending(f"w{w}-{p}", size) for p in range(pods)),
                min_member=pods,
                priority=rng.choice((0, 50)),
                created=100.0 + w,
            )
        )
    total = sum(len(n.gpus) for n in nodes)
    return Snapshot(nodes=tuple(nodes), queues=(queue("a", total / 2), queue("b", total / 2)), jobs=tuple(jobs))


def _decided(d: Decisions) -> tuple[object, ...]:
    return (
        sorted((b.namespace, b.pod, b.node, b.gpu_indices) for b in d.binds),
        sorted((e.namespace, e.pod, e.action.value, e.beneficiary) for e in d.evictions),
    )


@pytest.mark.parametrize("seed", range(CASES))
def test_the_check_changes_no_decision(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    snap = _fragmented(random.Random(seed))
    screened = _decided(run_session(snap))
    monkeypatch.setattr(consolidate, "_whole_gpus_can_land", lambda *_: True)
    assert _decided(run_session(snap)) == screened


def test_the_refusals_are_exercised(monkeypatch: pytest.MonkeyPatch) -> None:
    """The random pools above do reach the check with sets it refuses (else the property is empty)."""
    refusals = 0
    real = consolidate._whole_gpus_can_land

    def counting(cluster: Cluster, at: NodeState, task: TaskState, moved: Sequence[TaskState]) -> bool:
        nonlocal refusals
        verdict = real(cluster, at, task, moved)
        refusals += not verdict
        return verdict

    monkeypatch.setattr(consolidate, "_whole_gpus_can_land", counting)
    for seed in range(CASES):
        run_session(_fragmented(random.Random(seed)))
    assert refusals > 0


def test_a_gang_that_cannot_land_is_not_moved_and_the_small_victim_is() -> None:
    """n1 holds one pod of a two-node 4-GPU gang and a 1-GPU job; n2 the gang's other pod; n3 is
    half free. Making room for a 3-GPU pod on n1 by moving the gang needs two nodes with four free
    GPUs (there are none), so the 1-GPU job is moved to n3 instead."""
    snap = Snapshot(
        nodes=(node("n1", 8), node("n2", 4), node("n3", 4)),
        queues=(queue("q", 16),),
        jobs=(
            job(
                "gang",
                "q",
                running("gang-0", "n1", (0, 1, 2, 3)),
                running("gang-1", "n2", (0, 1, 2, 3)),
                min_member=2,
            ),
            job("small", "q", running("small-0", "n1", (4, 5)), created=5.0),
            job("other", "q", running("other-0", "n3", (0, 1)), created=1.0),
            job("big", "q", pending("big-0", 4), priority=50, created=10.0),
        ),
    )
    d = run_session(snap)
    assert evicted(d) == {"small-0": ("Consolidate", "big")}
    assert binds_by_job(d)["big"][0][1] == "n1"
