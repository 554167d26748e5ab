"""Assumed binds and evictions: what an earlier cycle did counts as done until the watch shows it."""

from __future__ import annotations

from dataclasses import replace

from gpuwarden.contract import ANNOTATION_GPU_ASSIGNMENT, EvictionAction
from scheduler.cluster.assignment import decode_assignment
from scheduler.cluster.assumed import AssumedBinds, AssumedEvictions
from scheduler.cluster.bind import BindOutcome, BindResult
from scheduler.cluster.convert import task_from_pod
from scheduler.cluster.cycle import ClusterView, CycleResult, ViewChanges
from scheduler.cluster.evict import EvictOutcome, EvictResult
from scheduler.engine.model import Bind, Decisions, Eviction, Snapshot, TaskStatus
from tests.scheduler.builders import node
from tests.scheduler.cluster.objects import pod_json


def _result(*outcomes: tuple[Bind, BindOutcome]) -> CycleResult:
    return CycleResult(
        snapshot=Snapshot(nodes=(node("n1"), node("n2"))),
        decisions=Decisions(binds=tuple(b for b, _ in outcomes)),
        binds=tuple(BindResult(b, o) for b, o in outcomes),
        evictions=(),
        seconds=0.0,
    )


def _bind(pod: str, node_name: str, gpus: tuple[int, ...]) -> Bind:
    return Bind(
        job=f"team-a/{pod}", namespace="team-a", pod=pod, uid=f"uid-team-a-{pod}", node=node_name, gpu_indices=gpus
    )


def _view(*pods: dict[str, object]) -> ClusterView:
    return ClusterView(pods={str(p["metadata"]["uid"]): p for p in pods})  # type: ignore[index]


def test_a_bound_pod_the_watch_has_not_shown_is_seen_bound_with_its_gpus() -> None:
    assumed = AssumedBinds()
    assumed.record(_result((_bind("a", "n1", (2,)), BindOutcome.BOUND)))
    pending = pod_json("a", gpus=1)

    shown = assumed.overlay(_view(pending)).pods["uid-team-a-a"]

    task = task_from_pod(shown)
    assert (task.status, task.node, task.gpu_indices) == (TaskStatus.RUNNING, "n1", (2,))
    assert decode_assignment(shown["metadata"]["annotations"][ANNOTATION_GPU_ASSIGNMENT], node="n1") == (2,)
    assert "nodeName" not in pending["spec"], "the cache's own object is left as it is"


def test_a_bind_sent_in_the_background_is_assumed_until_its_answer_says_it_failed() -> None:
    """Sent and unanswered: shown bound; answered as failed: shown pending again, and named changed."""
    assumed = AssumedBinds()
    sent, other = _bind("a", "n1", (3,)), _bind("b", "n2", (0,))
    result = _result()
    assumed.record(replace(result, sent=(sent, other)))
    pending_a, pending_b = pod_json("a", gpus=1), pod_json("b", gpus=1)
    unchanged = ViewChanges(since=7)
    view = ClusterView(pods={"uid-team-a-a": pending_a, "uid-team-a-b": pending_b}, changed=unchanged)

    shown = assumed.overlay(view)
    assert task_from_pod(shown.pods["uid-team-a-a"]).node == "n1"
    assert task_from_pod(shown.pods["uid-team-a-b"]).node == "n2"
    assert shown.changed is not None and shown.changed.pods == {"uid-team-a-a", "uid-team-a-b"}

    # The next cycle takes the answers: a's bind failed, b's went through.
    assumed.record(replace(result, binds=(BindResult(sent, BindOutcome.FAILED, "refused"),)))
    assumed.record(replace(result, binds=(BindResult(other, BindOutcome.BOUND),)))
    again = assumed.overlay(view)
    assert again.pods["uid-team-a-a"] is pending_a, "shown as the cache has it"
    assert task_from_pod(again.pods["uid-team-a-b"]).node == "n2"
    # The cache did not change a, but a cycle reading only what changed must read it again, once.
    assert again.changed is not None and again.changed.pods == {"uid-team-a-a", "uid-team-a-b"}
    assert len(assumed) == 1
    later = assumed.overlay(view)
    assert later.changed is not None and later.changed.pods == {"uid-team-a-b"}


def test_failed_and_conflicting_binds_are_not_assumed() -> None:
    assumed = AssumedBinds()
    assumed.record(
        _result((_bind("a", "n1", (0,)), BindOutcome.FAILED), (_bind("b", "n1", (1,)), BindOutcome.CONFLICT))
    )
    view = _view(pod_json("a", gpus=1), pod_json("b", gpus=1))

    assert len(assumed) == 0
    assert assumed.overlay(view) is view


def test_the_assumption_ends_when_the_watch_shows_the_pod_bound_or_gone() -> None:
    assumed = AssumedBinds()
    assumed.record(_result((_bind("a", "n1", (0,)), BindOutcome.BOUND), (_bind("b", "n2", (0,)), BindOutcome.BOUND)))
    # The watch has the pod on another node than assumed: the API server's word wins.
    seen = pod_json("a", gpus=1, node="n2")

    view = assumed.overlay(_view(seen))

    assert view.pods["uid-team-a-a"] is seen
    # Pod b was not in that view (deleted): forgotten too.
    assert len(assumed) == 0
    later = pod_json("b", gpus=1)
    assert assumed.overlay(_view(later)).pods["uid-team-a-b"] is later


def test_a_pod_without_gpus_is_shown_bound_without_an_assignment() -> None:
    assumed = AssumedBinds()
    assumed.record(_result((_bind("cpu", "n2", ()), BindOutcome.BOUND)))

    shown = assumed.overlay(_view(pod_json("cpu"))).pods["uid-team-a-cpu"]

    assert shown["spec"]["nodeName"] == "n2"
    assert ANNOTATION_GPU_ASSIGNMENT not in shown["metadata"]["annotations"]


def _evicted(*outcomes: tuple[str, EvictOutcome]) -> CycleResult:
    return CycleResult(
        snapshot=Snapshot(nodes=(node("n1"),)),
        decisions=Decisions(),
        binds=(),
        evictions=tuple(
            EvictResult(
                Eviction(
                    job=f"team-a/{name}",
                    namespace="team-a",
                    pod=name,
                    uid=f"uid-team-a-{name}",
                    node="n1",
                    action=EvictionAction.RECLAIM,
                    reason="r",
                ),
                outcome,
            )
            for name, outcome in outcomes
        ),
        seconds=0.0,
    )


def test_an_evicted_pod_the_watch_still_shows_running_is_seen_terminating_until_the_watch_catches_up() -> None:
    """The room it holds is freeing, not held: a reservation made for it must not lapse as 'held by other work'."""
    evicting = AssumedEvictions()
    evicting.record(_evicted(("a", EvictOutcome.EVICTED), ("b", EvictOutcome.REFUSED), ("c", EvictOutcome.GONE)))
    running = pod_json("a", gpus=1, node="n1")
    refused = pod_json("b", gpus=1, node="n1")

    view = evicting.overlay(_view(running, refused))

    assert task_from_pod(view.pods["uid-team-a-a"]).status is TaskStatus.RELEASING
    assert view.pods["uid-team-a-b"] is refused, "a refused eviction changed nothing"
    assert "deletionTimestamp" not in running["metadata"], "the cache's own object is left as it is"
    assert len(evicting) == 1, "c is in no view: forgotten"
    # The watch shows the deletion: its object from then on.
    deleting = pod_json("a", gpus=1, node="n1")
    deleting["metadata"]["deletionTimestamp"] = "2026-12-06T00:00:00Z"
    assert evicting.overlay(_view(deleting)).pods["uid-team-a-a"] is deleting
    assert len(evicting) == 0
