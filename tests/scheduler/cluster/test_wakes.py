"""Quiet changes: stored and logged for the next cycle, but they do not wake the loop, and the engine cannot tell.

The safety of leaving a change for the next cycle rests on one property: a
change judged quiet converts to the same engine input as the entry before
it. It is checked here over random edits of a slimmed pod, with the
converter the cycle uses. A quiet change is never hidden from a cycle: any
cycle that runs reads the stores as they are, quiet changes included.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden import contract
from scheduler.cluster.cache import PODGROUPS, PODS, QUEUES, ClusterCache, default_resources
from scheduler.cluster.convert import task_from_pod
from scheduler.cluster.groups import MANAGED_BY
from scheduler.cluster.slim import slim_pod
from scheduler.cluster.wakes import quiet_pod_change, quiet_podgroup_change, quiet_status_change
from scheduler.cluster.watch import EventType, WatchEvent


def _pod(phase: str = "Pending", node: str | None = "node-1") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": contract.SCHEDULER_NAME,
        "containers": [{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
    }
    if node:
        spec["nodeName"] = node
    return slim_pod(
        {
            "metadata": {
                "name": "p",
                "namespace": "team",
                "uid": "u-1",
                "resourceVersion": "10",
                "creationTimestamp": "2026-12-01T00:00:00Z",
                "labels": {contract.LABEL_QUEUE: "a"},
            },
            "spec": spec,
            "status": {"phase": phase},
        }
    )


def _podgroup(*, ours: bool = False, phase: str = "Pending", min_member: int = 1) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "g", "namespace": "team", "uid": "g-1", "resourceVersion": "5", "generation": 1}
    if ours:
        meta["labels"] = {MANAGED_BY: contract.SCHEDULER_COMPONENT}
    return {"metadata": meta, "spec": {"minMember": min_member, "queue": "a"}, "status": {"phase": phase}}


def _edit(obj: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    target = out
    for key in path[:-1]:
        target = target.setdefault(key, {})
    target[path[-1]] = value
    return out


def test_a_bound_pod_that_starts_is_quiet() -> None:
    old = _pod("Pending")
    new = _edit(_edit(old, ("status", "phase"), "Running"), ("metadata", "resourceVersion"), "11")
    new = _edit(new, ("status", "startTime"), "2026-12-01T00:00:02Z")
    assert quiet_pod_change(old, new)


def test_pod_changes_that_matter_wake() -> None:
    old = _pod("Pending")
    assert not quiet_pod_change(None, old)  # a new pod
    assert not quiet_pod_change(old, _edit(old, ("status", "phase"), "Succeeded"))
    assert not quiet_pod_change(old, _edit(old, ("spec", "nodeName"), "node-2"))
    assert not quiet_pod_change(old, _edit(old, ("metadata", "deletionTimestamp"), "2026-12-01T00:01:00Z"))
    assert not quiet_pod_change(old, _edit(old, ("metadata", "labels"), {contract.LABEL_QUEUE: "b"}))
    assert not quiet_pod_change(old, _edit(old, ("metadata", "annotations"), {"x": "y"}))
    assert not quiet_pod_change(old, _edit(old, ("spec", "schedulingGates"), []))
    assert not quiet_pod_change(old, _edit(old, ("status", "conditions"), [{"type": "DisruptionTarget"}]))
    # Running before any node is named is no bind echo the engine assumed: it wakes.
    unbound = _pod("Pending", node=None)
    assert not quiet_pod_change(unbound, _edit(unbound, ("status", "phase"), "Running"))
    # A pod that starts and changes in the same event wakes.
    started = _edit(old, ("status", "phase"), "Running")
    assert not quiet_pod_change(old, _edit(started, ("status", "nominatedNodeName"), "node-3"))


def test_status_only_updates_of_podgroups_and_queues_are_quiet() -> None:
    group = _podgroup()
    written = _edit(_edit(group, ("status", "phase"), "Running"), ("metadata", "resourceVersion"), "6")
    assert quiet_podgroup_change(group, written)
    assert quiet_status_change(group, written)
    assert not quiet_podgroup_change(group, _edit(group, ("spec", "minMember"), 2))
    assert not quiet_status_change(group, _edit(group, ("metadata", "labels"), {"a": "b"}))
    assert not quiet_status_change(None, group)


def test_a_podgroup_the_scheduler_made_arrives_quietly_and_a_users_wakes() -> None:
    assert quiet_podgroup_change(None, _podgroup(ours=True))
    assert not quiet_podgroup_change(None, _podgroup(ours=False))


_LABELS = st.dictionaries(st.sampled_from([contract.LABEL_QUEUE, "x"]), st.sampled_from(["a", "b"]))
_ANNOTATIONS = st.dictionaries(st.sampled_from([contract.ANNOTATION_GPU_FRACTION, "y"]), st.sampled_from(["0.5", "1"]))
_EDITS = st.sampled_from(
    [
        (("metadata", "resourceVersion"), st.sampled_from(["11", "12"])),
        (("metadata", "labels"), _LABELS),
        (("metadata", "annotations"), _ANNOTATIONS),
        (("metadata", "deletionTimestamp"), st.just("2026-12-01T00:05:00Z")),
        (("spec", "nodeName"), st.sampled_from(["node-1", "node-2"])),
        (("spec", "priority"), st.integers(0, 3)),
        (("spec", "schedulingGates"), st.lists(st.fixed_dictionaries({"name": st.just("gate")}), max_size=1)),
        (("status", "phase"), st.sampled_from(["Pending", "Running", "Succeeded", "Failed"])),
        (("status", "startTime"), st.just("2026-12-01T00:00:02Z")),
        (("status", "nominatedNodeName"), st.sampled_from(["node-1", "node-3"])),
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    start=st.sampled_from(["Pending", "Running"]),
    bound=st.booleans(),
    edits=st.lists(_EDITS.flatmap(lambda e: st.tuples(st.just(e[0]), e[1])), min_size=1, max_size=4),
)
def test_a_quiet_pod_change_converts_to_the_same_task(
    start: str, bound: bool, edits: list[tuple[tuple[str, ...], Any]]
) -> None:
    old = _pod(start, node="node-1" if bound else None)
    new = old
    for path, value in edits:
        new = _edit(new, path, value)
    if quiet_pod_change(old, new):
        # The start time alone decides nothing: it is read against the
        # kubelet's GPU holders, which come with a GPUNode update, and
        # those wake (the cycle then reads the start time with them).
        assert replace(task_from_pod(new), started=None) == replace(task_from_pod(old), started=None)


def test_a_quiet_change_is_stored_and_logged_without_waking() -> None:
    cache = ClusterCache(resources=default_resources())
    group = _podgroup()
    cache.apply(PODGROUPS, WatchEvent(EventType.ADDED, "team/g", group))
    woken = cache.woken
    assert woken == cache.generation
    since = cache.generation
    written = _edit(group, ("status", "phase"), "Running")
    cache.apply(PODGROUPS, WatchEvent(EventType.MODIFIED, "team/g", written))
    assert cache.generation == since + 1
    assert cache.woken == woken  # not woken ...
    assert cache.wait_for_change(since, timeout=0) == since + 1  # ... a waiter goes on waiting
    view = cache.view(since=since)
    assert view.changed == {PODGROUPS: frozenset({"team/g"})}  # ... but the next view names it
    assert view.podgroups["team/g"]["status"]["phase"] == "Running"
    # Whatever wakes after it ends the wait, and the view still has both.
    cache.apply(QUEUES, WatchEvent(EventType.ADDED, "a", {"metadata": {"name": "a"}, "spec": {}}))
    assert cache.woken == cache.generation == since + 2
    assert cache.view(since=since).changed == {PODGROUPS: frozenset({"team/g"}), QUEUES: frozenset({"a"})}
    cache.apply(PODS, WatchEvent(EventType.DELETED, "team/gone", {}))
    assert cache.woken == cache.generation  # a deletion always wakes
