"""Finding, saying and counting the evictions of pods the device manager put on a GPU out of service."""

from __future__ import annotations

from gpuwarden.contract import EvictionAction
from gpuwarden.kube import RequestStats
from scheduler.cluster.cycle import CycleResult
from scheduler.cluster.evict import EvictOutcome, EvictResult
from scheduler.cluster.metrics import SchedulerMetrics
from scheduler.cluster.misplaced import Misplaced, MisplacedBackoff, event_message, misplaced_evictions
from scheduler.cluster.placement import with_volume_terms
from scheduler.engine.model import (
    Decisions,
    Eviction,
    Gpu,
    Node,
    NodeTerm,
    Placement,
    Reservation,
    Snapshot,
    Task,
    TaskStatus,
)
from scheduler.engine.session import run_session
from tests.scheduler.builders import job, node, queue, running


def _snapshot() -> Snapshot:
    gpus = (Gpu(0, uuid="GPU-0", healthy=False, offered=True), *(Gpu(i, uuid=f"GPU-{i}") for i in range(1, 8)))
    n1 = node("n1", gpu_list=gpus, kubelet_holders={"uid-a": (0,), "uid-b": (2,)})
    jobs = (job("a", "q", running("a", "n1", (1,))), job("b", "q", running("b", "n1", (2,))))
    return Snapshot(nodes=(n1,), queues=(queue("q", 8),), jobs=jobs)


def _result(pod: str, outcome: EvictOutcome = EvictOutcome.EVICTED) -> EvictResult:
    ev = Eviction(f"default/{pod}", "default", pod, f"uid-{pod}", "n1", EvictionAction.HEALTH_EVICTION, "why")
    return EvictResult(ev, outcome)


def test_only_a_pod_on_a_gpu_out_of_service_it_was_not_assigned_is_misplaced() -> None:
    rooms = (Reservation("default/a", "n2", (0,)),)
    found = misplaced_evictions([_result("a"), _result("b")], _snapshot(), rooms)
    assert [(m.result.eviction.pod, m.gpus, m.assigned, m.room) for m in found] == [("a", (0,), (1,), "n2")]
    message = event_message(found[0])
    assert "GPU 0 (GPU-0) of node n1" in message
    assert "GPU reported unhealthy" in message
    assert "assigned GPU 1" in message
    assert "room is held for it on node n2" in message


def test_the_metric_counts_them_by_outcome() -> None:
    found = misplaced_evictions([_result("a", EvictOutcome.REFUSED)], _snapshot())
    metrics = SchedulerMetrics(RequestStats())
    metrics.observe(CycleResult(_snapshot(), Decisions(), (), (), 0.01, misplaced=tuple(found)))
    value = metrics.registry.get_sample_value(
        "gpuwarden_scheduler_pods_on_quarantined_gpu_total", {"outcome": "Refused"}
    )
    assert value == 1
    assert (
        metrics.registry.get_sample_value("gpuwarden_scheduler_pods_on_quarantined_gpu_total", {"outcome": "Evicted"})
        == 0
    )


def _strike(backoff: MisplacedBackoff, now: float, job: str = "default/a", node: str = "n1") -> float:
    ev = Eviction(job, "default", job.split("/")[1], "", node, EvictionAction.HEALTH_EVICTION, "why")
    item = Misplaced(EvictResult(ev, EvictOutcome.EVICTED), (0,), ("GPU-0",), "why", (1,), "")
    (done,) = backoff.record([item], now)
    return done.avoided_s


def test_the_backoff_doubles_with_each_repeat_up_to_its_cap_and_forgets_after_a_quiet_hour() -> None:
    backoff = MisplacedBackoff(first_s=60, max_s=600, forget_s=3600)
    windows = [_strike(backoff, 1000.0 + 10 * i) for i in range(6)]
    assert windows == [60, 120, 240, 480, 600, 600]
    assert backoff.avoided(1100.0) == {"default/a": ("n1",)}
    assert backoff.avoided(1050.0 + 600) == {}, "the window passed: the node may be tried again"
    assert _strike(backoff, 2000.0) == 600, "a repeat within the hour keeps doubling"
    assert backoff.avoided(2000.0 + 3601) == {}
    assert _strike(backoff, 2000.0 + 3700) == 60, "an hour without one: counted from the start"


def test_a_job_misplaced_on_one_node_for_weeks_stays_at_the_cap() -> None:
    # A strike every half hour never lets the count be forgotten: after ~1,000
    # strikes a power of two no longer fits a float, and the window must not care.
    backoff = MisplacedBackoff(first_s=60.0, max_s=1800.0, forget_s=3600.0)
    windows = {_strike(backoff, 1800.0 * i) for i in range(1, 1100)}
    assert max(windows) == 1800


def test_a_gangs_pods_misplaced_on_one_node_in_one_cycle_are_one_strike() -> None:
    backoff = MisplacedBackoff(first_s=60)
    ev = [Eviction("default/g", "default", f"g{i}", "", "n1", EvictionAction.HEALTH_EVICTION, "why") for i in range(3)]
    items = [Misplaced(EvictResult(e, EvictOutcome.EVICTED), (i,), ("",), "why", (7,), "") for i, e in enumerate(ev)]
    done = backoff.record(items, 0.0)
    assert [m.avoided_s for m in done] == [60, 60, 60]
    assert "kept off node n1 for 60s" in event_message(done[0])


def test_an_eviction_refused_is_no_new_strike() -> None:
    backoff = MisplacedBackoff(first_s=60)
    assert _strike(backoff, 0.0) == 60
    ev = Eviction("default/a", "default", "a", "", "n1", EvictionAction.HEALTH_EVICTION, "why")
    refused = Misplaced(EvictResult(ev, EvictOutcome.REFUSED), (0,), ("",), "why", (1,), "")
    for t in (10.0, 20.0, 30.0):
        (done,) = backoff.record([refused], t)
        assert done.avoided_s == 60 - t
    assert _strike(backoff, 40.0) == 120


def _waiting_snapshot(*nodes: Node) -> Snapshot:
    pending = Task(name="a-1", uid="uid-a-1", status=TaskStatus.PENDING, gpus=1)
    other = job("b", "q", Task(name="b-0", uid="uid-b-0", status=TaskStatus.PENDING, gpus=1))
    return Snapshot(nodes=nodes, queues=(queue("q", 16),), jobs=(job("a", "q", pending), other))


def test_a_backed_off_job_waits_while_only_the_avoided_node_fits_and_goes_elsewhere_when_one_does() -> None:
    backoff = MisplacedBackoff(first_s=60)
    _strike(backoff, 100.0)
    alone = backoff.apply(_waiting_snapshot(node("n1")), 110.0)
    decisions = run_session(alone)
    assert [b.pod for b in decisions.binds] == ["b-0"], "another job still uses the node"
    (waiting,) = [p for p in decisions.pending if p.job == "default/a"]
    assert "avoided for now" in " ".join(r.message for r in waiting.reasons)
    both = backoff.apply(_waiting_snapshot(node("n1"), node("n2")), 110.0)
    assert {b.pod: b.node for b in run_session(both).binds}["a-1"] == "n2"
    later = _waiting_snapshot(node("n1"))
    assert backoff.apply(later, 161.0) is later, "the window passed"
    assert {b.pod for b in run_session(later).binds} >= {"a-1"}


def test_the_backoff_keeps_a_changed_job_the_same_object_while_nothing_changes() -> None:
    backoff = MisplacedBackoff(first_s=60)
    _strike(backoff, 100.0)
    snap = _waiting_snapshot(node("n1"))
    first = backoff.apply(snap, 110.0)
    second = backoff.apply(snap, 120.0)
    assert first.jobs[0] is not snap.jobs[0] and second.jobs[0] is first.jobs[0]
    assert second.jobs[1] is snap.jobs[1], "a job without a strike is left alone"


def test_room_for_a_misplaced_pod_is_never_held_on_the_node_that_misplaced_it() -> None:
    gpus = (Gpu(0, healthy=False, offered=True), *(Gpu(i, offered=True) for i in range(1, 8)))
    n1 = node("n1", gpu_list=gpus, kubelet_holders={"uid-a": (0,)})
    snap = Snapshot(nodes=(n1,), queues=(queue("q", 16),), jobs=(job("a", "q", running("a", "n1", (1,))),))
    decisions = run_session(snap)
    assert [e.pod for e in decisions.evictions] == ["a"]
    assert decisions.reservations == (), "the only node is the one whose device manager chose the bad GPU"


def test_a_volumes_node_affinity_keeps_the_nodes_a_job_is_kept_off() -> None:
    term = (NodeTerm(),)
    got = with_volume_terms(Placement(avoid=("n1",)), (term,))
    assert got is not None and got.avoid == ("n1",) and got.volume_terms == (term,)
