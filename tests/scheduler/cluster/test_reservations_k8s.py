"""Reclaim, consolidation and health eviction end to end, with the room they free held across cycles.

Each test runs several cycles against the real API server, the way the
leader runs them: evictions go through the Eviction API and leave pods
terminating (there is no kubelet; the test finishes a deletion when it wants
the pod gone), and the next cycles must neither evict again for the same
job nor hand its room to someone else. Later cycles use a fresh
:class:`SchedulingCycle`, a leader that has just taken over: what it knows
of the reservations it reads from the PodGroups.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client
from structlog.testing import capture_logs

from gpuwarden import contract
from gpuwarden.contract import Action, EvictionAction
from gpuwarden.kube import KubeApi
from gpuwarden.localcluster import ControlPlane
from scheduler.cluster.assignment import decode_assignment
from scheduler.cluster.assumed import AssumedEvictions
from scheduler.cluster.cycle import SchedulingCycle
from scheduler.cluster.evict import Evictor, TokenBucket
from scheduler.engine.model import Reservation
from tests.agent.publish.reports import xid_fault
from tests.harness import complete_pod_deletion, mark_pod_running
from tests.scheduler.cluster.kube_objects import node_of, pod, podgroup, publish_health, refusing_pdb
from tests.scheduler.cluster.test_cycle_k8s import groups_by_pod, new_cycle, podgroup_status, view

pytestmark = pytest.mark.k8s


def _run_all(k8s: client.ApiClient, namespace: str, names: list[str], nodes: set[str]) -> dict[str, tuple[int, ...]]:
    """One cycle places ``names``; mark them running; their GPUs by pod."""
    new_cycle(k8s).run(view(k8s, nodes))
    held: dict[str, tuple[int, ...]] = {}
    core = client.CoreV1Api(k8s)
    for name in names:
        stored = core.read_namespaced_pod(name, namespace)
        assert stored.spec.node_name in nodes, f"{name} was not placed"
        mark_pod_running(k8s, name, namespace)
        held[name] = decode_assignment(stored.metadata.annotations[contract.ANNOTATION_GPU_ASSIGNMENT]) or ()
    return held


def _terminating(k8s: client.ApiClient, namespace: str, names: list[str]) -> list[str]:
    core = client.CoreV1Api(k8s)
    return [n for n in names if core.read_namespaced_pod(n, namespace).metadata.deletion_timestamp is not None]


def _gpus(k8s: client.ApiClient, namespace: str, name: str) -> tuple[int, ...]:
    stored = client.CoreV1Api(k8s).read_namespaced_pod(name, namespace)
    return decode_assignment(stored.metadata.annotations[contract.ANNOTATION_GPU_ASSIGNMENT]) or ()


def _queue_status(k8s: client.ApiClient, name: str) -> dict[str, Any]:
    obj = client.CustomObjectsApi(k8s).get_cluster_custom_object(
        contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION, contract.QUEUE_PLURAL, name
    )
    status: dict[str, Any] = obj.get("status") or {}
    return status


def _lent_out(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> tuple[set[str], str, str, list[str], dict[str, tuple[int, ...]]]:
    """One 8-GPU node and two queues of 4: the lender borrows all 8 GPUs (one pod each) while the other has no work."""
    nodes = set(cluster(1))
    lender, owed = queue(4), queue(4)
    borrowed = [f"lend-{i}" for i in range(8)]
    for name in borrowed:
        podgroup(k8s, namespace, name, lender, 1)
        pod(k8s, namespace, name, group=name)
    return nodes, lender, owed, borrowed, _run_all(k8s, namespace, borrowed, nodes)


def test_reclaim_brings_two_queues_to_their_fair_shares_and_holds_the_room_until_it_is_used(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    nodes, lender, owed, borrowed, held = _lent_out(k8s, namespace, cluster, queue)

    # The owed queue comes back for its quota: four single-GPU jobs.
    wanted = [f"owed-{i}" for i in range(4)]
    for name in wanted:
        podgroup(k8s, namespace, name, owed, 1)
        pod(k8s, namespace, name, group=name)
    first = new_cycle(k8s).run(view(k8s, nodes))
    victims = _terminating(k8s, namespace, borrowed)
    assert len(victims) == 4 and {e.eviction.action for e in first.evictions} == {EvictionAction.RECLAIM}
    assert all(node_of(k8s, namespace, n) is None for n in wanted), "binds wait for the victims to leave"
    reserved = {n: podgroup_status(k8s, namespace, n).get("reservations") for n in wanted}
    assert all(reserved.values()), reserved
    room = sorted(g for n in wanted for entry in reserved[n] for g in entry["gpus"])
    assert room == sorted(g for v in victims for g in held[v])

    # A new leader, victims still terminating: nothing more is evicted.
    again = new_cycle(k8s).run(view(k8s, nodes))
    assert again.evictions == ()
    assert sorted(_terminating(k8s, namespace, borrowed)) == sorted(victims)

    # The victims leave; the lender submits more work at once, which would
    # take the freed GPUs if they were not held.
    for v in victims:
        complete_pod_deletion(k8s, v, namespace)
    podgroup(k8s, namespace, "lend-late", lender, 1)
    pod(k8s, namespace, "lend-late", group="lend-late")
    new_cycle(k8s).run(view(k8s, nodes))
    assert sorted(g for n in wanted for g in _gpus(k8s, namespace, n)) == room
    assert node_of(k8s, namespace, "lend-late") is None
    assert all(not podgroup_status(k8s, namespace, n).get("reservations") for n in wanted), "used room is released"
    for q in (lender, owed):
        status = _queue_status(k8s, q)
        assert status["allocated"]["gpu"] == status["fairShare"]["gpu"] == 4, status


def test_victims_the_eviction_rate_holds_back_go_together_and_no_room_is_held_for_them_meanwhile(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    """Two victims of two jobs for one beneficiary, one token: neither goes, and nothing is reserved."""
    nodes, _, owed, borrowed, _ = _lent_out(k8s, namespace, cluster, queue)
    podgroup(k8s, namespace, "owed", owed, 1)
    pod(k8s, namespace, "owed", group="owed", gpus=2)
    api = KubeApi(k8s, field_manager=contract.SCHEDULER_COMPONENT)
    clock = [0.0]
    bucket = TokenBucket(rate=1.0, burst=3, clock=lambda: clock[0], sleep=lambda _: None)
    bucket.take(2)  # one token left
    cycle = SchedulingCycle(api, evictor=Evictor(api, bucket=bucket))

    first = cycle.run(view(k8s, nodes))
    assert [r.outcome for r in first.evictions] == [], "deferred evictions are not the cycle's evictions"
    assert _terminating(k8s, namespace, borrowed) == []
    assert first.reservations == () and not podgroup_status(k8s, namespace, "owed").get("reservations")

    clock[0] += 2.0  # two tokens: both victims go at once, and the room is held
    second = cycle.run(view(k8s, nodes))
    assert len(second.evictions) == 2 and all(r.ok for r in second.evictions)
    assert len(_terminating(k8s, namespace, borrowed)) == 2
    (entry,) = podgroup_status(k8s, namespace, "owed")["reservations"]
    assert len(entry["gpus"]) == 2


def _fragmented(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> tuple[set[str], str]:
    """Two full 8-GPU nodes of 1-GPU pods, then one pod finishes on each: one GPU free on each, two on neither."""
    nodes = set(cluster(2))
    q = queue(16)
    small = [f"small-{i}" for i in range(16)]
    for name in small:
        podgroup(k8s, namespace, name, q, 1)
        pod(k8s, namespace, name, group=name)
    _run_all(k8s, namespace, small, nodes)
    placed = {n: node_of(k8s, namespace, n) for n in small}
    for each in nodes:
        complete_pod_deletion(k8s, next(n for n in small if placed[n] == each), namespace)
    return nodes, q


def _big_behind_fragments(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> set[str]:
    """:func:`_fragmented`, and a 2-GPU job "big" that only a consolidation can place."""
    nodes, q = _fragmented(k8s, namespace, cluster, queue)
    podgroup(k8s, namespace, "big", q, 1)
    pod(k8s, namespace, "big", group="big", gpus=2)
    return nodes


def _urgent_arrives(k8s: client.ApiClient, namespace: str, queue: Callable[..., str]) -> None:
    """A two-GPU job of an idle queue (first in allocate's order: offered free room first)."""
    podgroup(k8s, namespace, "urgent", queue(16), 1)
    pod(k8s, namespace, "urgent", group="urgent", gpus=2)


def _assert_big_got_its_room(k8s: client.ApiClient, namespace: str, target: str, entry: dict[str, Any]) -> None:
    assert node_of(k8s, namespace, "big") == target
    assert sorted(_gpus(k8s, namespace, "big")) == sorted(entry["gpus"])
    assert node_of(k8s, namespace, "urgent") is None or not set(_gpus(k8s, namespace, "urgent")) & set(entry["gpus"])


def test_a_consolidations_reservation_is_honoured_on_the_next_cycle(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    nodes = _big_behind_fragments(k8s, namespace, cluster, queue)

    first = new_cycle(k8s).run(view(k8s, nodes))
    (moved,) = first.evictions
    assert moved.eviction.action is EvictionAction.CONSOLIDATE
    target = moved.eviction.node
    (entry,) = podgroup_status(k8s, namespace, "big")["reservations"]
    assert entry["node"] == target and len(entry["gpus"]) == 2

    # While the moved pod terminates nothing else moves. Once it is gone, a
    # two-GPU job of an idle queue (first in allocate's order, so it would
    # be offered the freed room first) arrives; the room stays big's.
    assert new_cycle(k8s).run(view(k8s, nodes)).evictions == ()
    complete_pod_deletion(k8s, moved.eviction.pod, namespace)
    _urgent_arrives(k8s, namespace, queue)
    new_cycle(k8s).run(view(k8s, nodes))
    _assert_big_got_its_room(k8s, namespace, target, entry)
    assert not podgroup_status(k8s, namespace, "big").get("reservations")


def test_room_reserved_a_cycle_ago_is_held_before_the_watch_shows_the_reservation(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    """The next cycle often starts before the PodGroup's echo: the room must not go to another job meanwhile."""
    nodes = _big_behind_fragments(k8s, namespace, cluster, queue)
    cycle = new_cycle(k8s)
    before = view(k8s, nodes)
    (moved,) = cycle.run(before).evictions
    target = moved.eviction.node
    (entry,) = podgroup_status(k8s, namespace, "big")["reservations"]
    complete_pod_deletion(k8s, moved.eviction.pod, namespace)
    _urgent_arrives(k8s, namespace, queue)
    # Everything current but big's PodGroup, whose watched entry is still the
    # one the reservation was written over.
    now = view(k8s, nodes)
    key = (namespace, "big")
    lagging = replace(now, podgroups={**now.podgroups, key: before.podgroups[key]})
    assert not (before.podgroups[key].get("status") or {}).get("reservations")
    cycle.run(lagging)
    _assert_big_got_its_room(k8s, namespace, target, entry)


def test_room_freed_a_cycle_ago_is_held_before_the_watch_shows_the_victim_leave(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    """Seen running by a view that predates its eviction, the victim must not make the reservation lapse."""
    nodes = _big_behind_fragments(k8s, namespace, cluster, queue)
    cycle = new_cycle(k8s)
    evicting = AssumedEvictions()
    before = view(k8s, nodes)
    first = cycle.run(before)
    evicting.record(first)
    (moved,) = first.evictions
    (entry,) = podgroup_status(k8s, namespace, "big")["reservations"]
    # The watch has shown the reservation, not yet the eviction: the victim still runs there.
    now = view(k8s, nodes)
    victim = moved.eviction.uid
    lagging = replace(now, pods={**now.pods, victim: before.pods[victim]})
    assert not before.pods[victim]["metadata"].get("deletionTimestamp")
    with capture_logs() as logs:
        second = cycle.run(evicting.overlay(lagging))
    assert not [e for e in logs if e["event"] == "reservation_lapsed" and e["job"] == f"{namespace}/big"]
    assert second.evictions == (), "nothing more is evicted for big"
    assert podgroup_status(k8s, namespace, "big")["reservations"] == [entry]


def test_a_faulted_gpu_loses_its_gang_through_evictions_a_budget_holds_back_and_only_it_stops(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    (node,) = cluster(1)
    q = queue(8)
    podgroup(k8s, namespace, "gang", q, 2)
    gang = ["gang-0", "gang-1"]
    for name in gang:
        pod(k8s, namespace, name, group="gang")
    podgroup(k8s, namespace, "solo", q, 1)
    pod(k8s, namespace, "solo", group="solo")
    held = _run_all(k8s, namespace, [*gang, "solo"], {node})
    # A budget guards the gang member that is not on the sick GPU.
    sick = held["gang-0"][0]
    client.CoreV1Api(k8s).patch_namespaced_pod("gang-1", namespace, {"metadata": {"labels": {"guard": "me"}}})
    refusing_pdb(k8s, namespace, "guard", {"guard": "me"})

    publish_health(k8s, node, replace(xid_fault(sick, 48), action=Action.RESET_GPU))
    result = new_cycle(k8s).run(view(k8s, {node}))
    outcomes = {e.eviction.pod: e.outcome.value for e in result.evictions}
    assert outcomes == {"gang-0": "Evicted", "gang-1": "Refused"}, outcomes
    assert _terminating(k8s, namespace, [*gang, "solo"]) == ["gang-0"]
    conditions = {c["type"]: c for c in podgroup_status(k8s, namespace, "gang").get("conditions") or []}
    blocked = conditions["EvictionBlocked"]
    assert blocked["status"] == "True" and "gang-1" in blocked["message"], conditions
    assert "disruption budget" in blocked["message"]
    assert "guard" in blocked["message"], "the refusal names the budget"
    events = client.CoreV1Api(k8s).list_namespaced_event(namespace).items
    assert any(e.reason == "DisruptionBudget" and "gang-1" in e.message for e in events)
    # The queue is told what the fault cost it: gang-0's GPU for as long as it had run.
    assert result.lost_gpu_seconds.get(q, 0) > 0
    lost = _queue_status(k8s, q).get(contract.QUEUE_STATUS_GPU_SECONDS_LOST)
    assert lost is not None and lost == pytest.approx(result.lost_gpu_seconds[q], abs=0.01)

    # The budget lifts while gang-0 still terminates: the gang's last pod
    # goes at the next cycle; solo stays, and new work lands on the node's
    # healthy GPUs only.
    client.PolicyV1Api(k8s).delete_namespaced_pod_disruption_budget("guard", namespace)
    podgroup(k8s, namespace, "fresh", q, 1)
    pod(k8s, namespace, "fresh", group="fresh", gpus=6)
    result = new_cycle(k8s).run(view(k8s, {node}))
    assert [(e.eviction.pod, e.outcome.value) for e in result.evictions] == [("gang-1", "Evicted")]
    conditions = [c["type"] for c in podgroup_status(k8s, namespace, "gang").get("conditions") or []]
    assert "EvictionBlocked" not in conditions
    complete_pod_deletion(k8s, "gang-0", namespace)
    complete_pod_deletion(k8s, "gang-1", namespace)
    new_cycle(k8s).run(view(k8s, {node}))
    assert node_of(k8s, namespace, "solo") == node
    assert node_of(k8s, namespace, "fresh") == node
    assert sick not in _gpus(k8s, namespace, "fresh")


def test_room_reserved_for_a_derived_group_in_its_first_cycle_is_kept_on_its_new_podgroup(
    k8s: client.ApiClient, namespace: str, cluster: Callable[[int], list[str]], queue: Callable[..., str]
) -> None:
    """A bare pod's PodGroup does not exist yet when the cycle that first sees it reserves room for it."""
    nodes, q = _fragmented(k8s, namespace, cluster, queue)
    pod(k8s, namespace, "big", queue=q, gpus=2)  # no PodGroup: one is derived

    first = new_cycle(k8s).run(view(k8s, nodes))
    (moved,) = first.evictions
    assert moved.eviction.action is EvictionAction.CONSOLIDATE
    group = groups_by_pod(k8s, namespace)["big"]["metadata"]["name"]
    (entry,) = podgroup_status(k8s, namespace, group)["reservations"]
    assert entry["node"] == moved.eviction.node and len(entry["gpus"]) == 2


def test_a_reservation_that_lapses_while_the_api_server_is_down_is_cleared_by_the_same_leader(
    k8s: client.ApiClient,
    control_plane: ControlPlane,
    namespace: str,
    cluster: Callable[[int], list[str]],
    queue: Callable[..., str],
) -> None:
    """The watch is cut off by the outage, a write behind; the leader must not take its stale view for the truth.

    The room is written for a group; the API server goes away before the
    watch shows the write, and the job it was for goes too, so the next
    cycle (on the view the watch last delivered) holds nothing for it and
    its clearing write fails. Once the API server is back, the same cycle
    object, on a fresh view, clears the room, and later cycles find nothing
    lapsed.
    """
    nodes = set(cluster(1))
    q = queue(8)
    podgroup(k8s, namespace, "gone", q, 1)
    cycle = new_cycle(k8s)
    before = view(k8s, nodes)
    room = Reservation(
        f"{namespace}/gone", next(iter(nodes)), (0, 1), cpu_milli=1000, memory_mib=1024, expires=time.time() + 300
    )
    # What the cycle that freed the room wrote (a reclaim's: its victims are terminating).
    cycle.reservations.write([room], before.podgroups)
    assert podgroup_status(k8s, namespace, "gone")["reservations"]

    control_plane.stop_apiserver()
    try:
        cycle.run(before)  # the watch's last view: the write not in it, and the group has no pods
    finally:
        control_plane.start_apiserver()
    assert podgroup_status(k8s, namespace, "gone")["reservations"], "nothing could be written meanwhile"

    def lapsed(logs: list[dict[str, Any]]) -> list[str]:
        return [e["why"] for e in logs if e["event"] == "reservation_lapsed" and e["job"] == room.job]

    with capture_logs() as logs:
        cycle.run(view(k8s, nodes))
    assert lapsed(logs) == ["the job is gone"]
    assert not podgroup_status(k8s, namespace, "gone").get("reservations"), "the lapsed room is still held"
    with capture_logs() as logs:
        cycle.run(view(k8s, nodes))
    assert lapsed(logs) == []
