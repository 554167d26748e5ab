"""Evicting to make room keeps a whole-GPU pod off a trap node as placement does.

A trap node has a GPU out of service that the device plugin still offers:
the kubelet's device manager may give it to the next whole-GPU pod, whatever
gpuwarden assigned (:func:`scheduler.engine.scoring.trap_rank`). Reclaim and
preempt choose among plans of equal cost; these check that the trap ranks
them, and that it never buys a dearer plan.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.engine.model import Gpu, Job, Node, Snapshot
from scheduler.engine.session import run_session
from tests.scheduler.builders import binds_by_job, evicted, job, node, pending, queue, running


def _trap(name: str) -> Node:
    """8 GPUs; GPU 0 quarantined but still offered by the device plugin."""
    return node(name, gpu_list=(Gpu(0, healthy=False, offered=True), *(Gpu(i, offered=True) for i in range(1, 8))))


def _full(name: str, gpus: range, queue_name: str, created: dict[str, float], priority: int = 0) -> list[Job]:
    return [
        job(f"{name}-{i}", queue_name, running(f"{name}-{i}-0", name, (i,)), priority=priority, created=created[name])
        for i in gpus
    ]


def test_preempt_evicts_where_the_pod_stays_off_the_trap() -> None:
    # Every GPU is taken by equal low-priority one-GPU pods; those on the trap
    # node are the youngest, so the victim order reaches them first.
    created = {"a": 10.0, "b": 1.0}
    snap = Snapshot(
        nodes=(_trap("a"), node("b")),
        queues=(queue("q", 16),),
        jobs=(
            *_full("a", range(1, 8), "q", created),
            *_full("b", range(8), "q", created),
            job("urgent", "q", pending("urgent-0", 1), priority=100, created=20),
        ),
    )
    d = run_session(snap)
    ((victim, (action, _)),) = evicted(d).items()
    assert action == "Preempt" and victim.startswith("b-"), evicted(d)
    assert [n for _, n, _ in binds_by_job(d)["urgent"]] == ["b"]


def test_reclaim_evicts_where_the_pod_stays_off_the_trap() -> None:
    created = {"a": 10.0, "b": 1.0}
    snap = Snapshot(
        nodes=(_trap("a"), node("b")),
        queues=(queue("greedy", 4), queue("owed", 4)),
        jobs=(
            *_full("a", range(1, 8), "greedy", created),
            *_full("b", range(8), "greedy", created),
            job("mine", "owed", pending("mine-0", 1), created=20),
        ),
    )
    d = run_session(snap)
    ((victim, (action, _)),) = evicted(d).items()
    assert action == "Reclaim" and victim.startswith("b-"), evicted(d)
    assert [n for _, n, _ in binds_by_job(d)["mine"]] == ["b"]


def test_the_trap_never_buys_a_dearer_plan() -> None:
    # Off the trap the only victim has a higher priority: the trap node's cheaper victim goes.
    created = {"a": 10.0, "b": 1.0}
    snap = Snapshot(
        nodes=(_trap("a"), node("b")),
        queues=(queue("q", 16),),
        jobs=(
            *_full("a", range(1, 8), "q", created, priority=0),
            *_full("b", range(8), "q", created, priority=50),
            job("urgent", "q", pending("urgent-0", 1), priority=100, created=20),
        ),
    )
    d = run_session(snap)
    ((victim, _),) = evicted(d).items()
    assert victim.startswith("a-"), evicted(d)
    (bind,) = binds_by_job(d)["urgent"]
    assert 0 not in bind[2], "never the bad GPU itself"


@settings(max_examples=60, deadline=None)
@given(
    ages=st.lists(st.floats(0, 100, allow_nan=False), min_size=15, max_size=15),
    held_b=st.integers(1, 8),
)
def test_a_whole_gpu_pod_evicts_on_a_trap_only_when_the_plan_off_it_costs_more(ages: list[float], held_b: int) -> None:
    jobs = [job(f"a-{i}", "q", running(f"a-{i}-0", "a", (i,)), created=ages[i - 1]) for i in range(1, 8)] + [
        job(f"b-{i}", "q", running(f"b-{i}-0", "b", (i,)), created=ages[7 + i]) for i in range(held_b - 1)
    ]
    # b holds held_b - 1 pods and one non-preemptible one: always full or nearly so.
    jobs.append(job("b-np", "q", running("b-np-0", "b", (7,)), preemptible=False, created=0))
    jobs.append(job("urgent", "q", pending("urgent-0", 1), priority=100, created=200))
    snap = Snapshot(nodes=(_trap("a"), node("b")), queues=(queue("q", 16),), jobs=tuple(jobs))
    d = run_session(snap)
    (bind,) = binds_by_job(d)["urgent"]
    if held_b < 8:  # b has a free GPU: no eviction at all
        assert not d.evictions and bind[1] == "b"
        return
    assert bind[1] == "b", (evicted(d), bind)
    assert all(v.startswith("b-") for v in evicted(d))
