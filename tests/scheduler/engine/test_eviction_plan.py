"""The loop consolidate, reclaim and preempt share, with hand-made plans."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gpuwarden.contract import EvictionAction
from scheduler.engine import eviction_plan
from scheduler.engine.build import build_cluster
from scheduler.engine.caches import SessionCaches, VictimIndex
from scheduler.engine.eviction_plan import EvictionPlan, run_evictions
from scheduler.engine.model import Snapshot
from scheduler.engine.state import Cluster, JobState
from scheduler.engine.statement import Statement
from tests.scheduler.builders import job, node, pending, queue, running

NOTE = "could not make room"


def _cluster(*pending_jobs: str, cpus: tuple[int, ...] = ()) -> Cluster:
    """One 1-GPU node held by a preemptible job ``low``; 1-GPU pending jobs."""
    jobs = [job("low", "q", running("low-0", "n0", (0,)), preemptible=True)]
    for i, name in enumerate(pending_jobs):
        jobs.append(job(name, "q", pending(f"{name}-0", 1, cpu=cpus[i] if cpus else 1), priority=10))
    return build_cluster(Snapshot(nodes=(node("n0", 1),), queues=(queue("q", 1),), jobs=tuple(jobs)))


def _by_name(cluster: Cluster, name: str) -> JobState:
    return next(j for j in cluster.jobs if j.spec.name == name)


def _always(_victim: JobState, _tasks: object = None) -> bool:
    return True


def _never(_victim: JobState) -> bool:
    return False


def _plan(cluster: Cluster, **changes: Any) -> EvictionPlan:
    """A plan that may evict ``low`` for anyone, with ``changes`` applied."""
    low = _by_name(cluster, "low")
    plan = EvictionPlan(
        victims=lambda: [low],
        is_candidate=_always,
        admissible=_always,
        action=EvictionAction.PREEMPT,
        reason="test",
        failure_note=NOTE,
    )
    return replace(plan, **changes)


def test_a_plan_that_makes_room_is_committed_and_clears_the_jobs_reasons() -> None:
    cluster = _cluster("a")
    a = _by_name(cluster, "a")
    a.notes = ["tried before"]
    run_evictions(cluster, SessionCaches(), lambda _job, _index: _plan(cluster), EvictionAction.PREEMPT)
    low = _by_name(cluster, "low").tasks[0]
    assert a.tasks[0].node is cluster.nodes["n0"]
    assert low.node is None and low.eviction is not None
    assert low.eviction.action is EvictionAction.PREEMPT and low.eviction.beneficiary == a.key
    assert cluster.commit_version == 1
    assert a.reasons == [] and a.notes == []


def test_a_failed_finish_rolls_back_and_the_same_shape_is_not_tried_again() -> None:
    cluster = _cluster("a", "b")
    finished: list[int] = []

    def finish(_cluster: Cluster, _caches: SessionCaches, stmt: Statement) -> bool:
        finished.append(len(stmt.log))
        return False

    run_evictions(cluster, SessionCaches(), lambda _job, _index: _plan(cluster, finish=finish), EvictionAction.PREEMPT)
    # The plan made room (an eviction and a placement) before finish refused it.
    assert finished == [2]
    assert _by_name(cluster, "low").tasks[0].node is cluster.nodes["n0"]
    assert cluster.touched == [] and cluster.commit_version == 0
    for name in ("a", "b"):
        assert _by_name(cluster, name).tasks[0].node is None
        assert _by_name(cluster, name).notes == [NOTE]


def test_plans_per_action_are_capped_and_passed_over_jobs_do_not_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eviction_plan, "MAX_BENEFICIARIES", 2)
    # Distinct CPU requests: distinct shapes, so the failure memo never answers.
    cluster = _cluster("a", "b", "c", "d", cpus=(1, 2, 3, 4))
    tried: list[str] = []

    def plan_for(job: JobState, _index: VictimIndex) -> EvictionPlan | None:
        if job.spec.name == "a":
            return None

        def victims() -> list[JobState]:
            tried.append(job.spec.name)
            return [_by_name(cluster, "low")]

        return _plan(cluster, victims=victims, is_candidate=_never)

    run_evictions(cluster, SessionCaches(), plan_for, EvictionAction.PREEMPT)
    assert sorted(set(tried)) == ["b", "c"]
    assert _by_name(cluster, "a").notes == []
    assert _by_name(cluster, "d").notes == []
    assert _by_name(cluster, "b").notes == [NOTE]
