"""Finding, saying and counting the evictions of pods the device manager put on a GPU out of service."""

from __future__ import annotations

from gpuwarden.contract import EvictionAction
from gpuwarden.kube import RequestStats
from scheduler.cluster.cycle import CycleResult
from scheduler.cluster.evict import EvictOutcome, EvictResult
from scheduler.cluster.metrics import SchedulerMetrics
from scheduler.cluster.misplaced import event_message, misplaced_evictions
from scheduler.engine.model import Decisions, Eviction, Gpu, Reservation, Snapshot
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
