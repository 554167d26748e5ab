"""Quiet changes: stored and logged for the next cycle, but they do not wake the loop, and the engine cannot tell.

The safety of leaving a change for the next cycle rests on one property: a
change judged quiet converts to the same engine input as the entry before
it. It is checked here over random edits of a slimmed pod, with the
converter the cycle uses. A quiet change is never hidden from a cycle: any
cycle that runs reads the stores as they are, quiet changes included.
"""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden import contract
from scheduler import engine
from scheduler.cluster.assumed import AssumedBind, shown_bound
from scheduler.cluster.cache import DEVICETAINTRULES, PODGROUPS, PODS, QUEUES, ClusterCache, default_resources
from scheduler.cluster.convert import task_from_pod
from scheduler.cluster.groups import MANAGED_BY
from scheduler.cluster.slim import slim_pod
from scheduler.cluster.wakes import pod_frees_room, quiet_pod_change, quiet_podgroup_change, quiet_status_change
from scheduler.cluster.watch import EventType, WatchEvent
from tests.waiting import wait_for


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


def _engine_reads() -> str:
    """The engine's source, all of it: what it could read of a task's annotations."""
    return "".join(path.read_text() for path in sorted(Path(engine.__file__).parent.glob("*.py")))


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


def _bind_echo(old: dict[str, Any], node: str = "node-2", **annotations: str) -> dict[str, Any]:
    """``old`` as the watch shows it after a bind: node, the Binding's annotations, PodScheduled."""
    new = _edit(_edit(old, ("spec", "nodeName"), node), ("metadata", "resourceVersion"), "11")
    if annotations:
        new = _edit(new, ("metadata", "annotations"), {**(old["metadata"].get("annotations") or {}), **annotations})
    return _edit(new, ("status", "conditions"), [{"type": "PodScheduled", "status": "True"}])


_ASSIGNMENT = '{"node":"node-2","gpus":[{"index":0,"uuid":"GPU-0","memoryMiB":81920}]}'
_OURS = {contract.ANNOTATION_LEASE_HOLDER: "gpuwarden-0", contract.ANNOTATION_GPU_ASSIGNMENT: _ASSIGNMENT}


def test_the_echo_of_gpuwardens_own_bind_is_quiet() -> None:
    pending = _pod("Pending", node=None)
    assert quiet_pod_change(pending, _bind_echo(pending, **_OURS))
    assert quiet_pod_change(pending, _bind_echo(pending, **{contract.ANNOTATION_LEASE_HOLDER: "gpuwarden-0"}))
    # Another scheduler's bind carries none of gpuwarden's annotations: it wakes.
    assert not quiet_pod_change(pending, _bind_echo(pending))
    # Bound and changed otherwise in the same event: wakes.
    echo = _bind_echo(pending, **_OURS)
    assert not quiet_pod_change(pending, _edit(echo, ("metadata", "labels"), {contract.LABEL_QUEUE: "b"}))
    assert not quiet_pod_change(pending, _edit(echo, ("metadata", "deletionTimestamp"), "2026-12-01T00:01:00Z"))
    assert not quiet_pod_change(pending, _edit(echo, ("status", "phase"), "Succeeded"))
    assert not quiet_pod_change(pending, _edit(echo, ("spec", "priority"), 5))
    disrupted = [{"type": "PodScheduled", "status": "True"}, {"type": "DisruptionTarget", "status": "True"}]
    assert not quiet_pod_change(pending, _edit(echo, ("status", "conditions"), disrupted))
    # A pod moved from one node to another is no bind echo.
    bound = _pod("Pending", node="node-1")
    assert not quiet_pod_change(bound, _bind_echo(bound, **_OURS))


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
_ANNOTATIONS = st.dictionaries(
    st.sampled_from(
        [contract.ANNOTATION_GPU_FRACTION, "y", contract.ANNOTATION_LEASE_HOLDER, contract.ANNOTATION_GPU_ASSIGNMENT]
    ),
    st.sampled_from(["0.5", "1", _ASSIGNMENT]),
)
_CONDITIONS = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["PodScheduled", "DisruptionTarget"]), "status": st.sampled_from(["True", "False"])}
    ),
    max_size=2,
)
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
        (("status", "conditions"), _CONDITIONS),
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
    if not quiet_pod_change(old, new):
        return
    if not old["spec"].get("nodeName") and new["spec"].get("nodeName"):
        # A bind echo: the cycles after the bind already saw the pod as the
        # scheduler assumed it bound (.assumed), and that is what the echo shows.
        notes = new["metadata"].get("annotations") or {}
        assumed = AssumedBind(new["spec"]["nodeName"], notes.get(contract.ANNOTATION_GPU_ASSIGNMENT))
        old = shown_bound(old, old["spec"], assumed)
    # The start time alone decides nothing: it is read against the
    # kubelet's GPU holders, which come with a GPUNode update, and
    # those wake (the cycle then reads the start time with them).
    assert replace(task_from_pod(new), started=None) == replace(task_from_pod(old), started=None)


@settings(max_examples=300, deadline=None)
@given(
    ours=st.sampled_from([_OURS, {contract.ANNOTATION_LEASE_HOLDER: "gpuwarden-0"}, {}]),
    edits=st.lists(_EDITS.flatmap(lambda e: st.tuples(st.just(e[0]), e[1])), max_size=3),
)
def test_a_quiet_bind_echo_converts_to_the_task_the_scheduler_assumed(
    ours: dict[str, str], edits: list[tuple[tuple[str, ...], Any]]
) -> None:
    """Binds, with or without gpuwarden's annotations, and with random edits in the same event."""
    old = _pod("Pending", node=None)
    new = _bind_echo(old, **ours)
    for path, value in edits:
        new = _edit(new, path, value)
    if quiet_pod_change(old, new):
        notes = new["metadata"].get("annotations") or {}
        assumed = AssumedBind(new["spec"]["nodeName"], notes.get(contract.ANNOTATION_GPU_ASSIGNMENT))
        echoed, shown = task_from_pod(new), task_from_pod(shown_bound(old, old["spec"], assumed))
        # The lease holder is for the fence's admission policy; nothing in the engine reads it.
        assert "LEASE_HOLDER" not in _engine_reads() and "lease-holder" not in _engine_reads()
        holderless = {k: v for k, v in echoed.annotations.items() if k != contract.ANNOTATION_LEASE_HOLDER}
        assert replace(echoed, annotations=holderless) == shown


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


def test_a_settling_waiter_folds_quiet_changes_in_once_it_waited_settle_s() -> None:
    """The idle leader's wait (the runner's quiet_settle_s): quiet changes end it, but not at once."""
    cache = ClusterCache(resources=default_resources())
    group = _podgroup()
    cache.apply(PODGROUPS, WatchEvent(EventType.ADDED, "team/g", group))
    since = cache.generation
    # Nothing changed: the wait lasts its timeout, settle or not.
    began = time.monotonic()
    assert cache.wait_for_change(since, timeout=0.05, settle_s=0.001) == since
    assert time.monotonic() - began >= 0.05
    cache.apply(PODGROUPS, WatchEvent(EventType.MODIFIED, "team/g", _edit(group, ("status", "phase"), "Running")))
    # Without settle_s the quiet change leaves the waiter waiting out its timeout ...
    began = time.monotonic()
    assert cache.wait_for_change(since, timeout=0.05) == since + 1
    assert time.monotonic() - began >= 0.05
    # ... with it, the wait ends long before the timeout, but only once the
    # waiter itself waited settle_s: a change that came during the last cycle
    # does not start the next one at once.
    began = time.monotonic()
    assert cache.wait_for_change(since, timeout=30, settle_s=0.05) == since + 1
    assert 0.05 <= time.monotonic() - began < 20


def test_the_first_quiet_change_starts_the_clock_and_the_burst_after_it_is_folded_in_with_it() -> None:
    cache = ClusterCache(resources=default_resources())
    group = _podgroup()
    cache.apply(PODGROUPS, WatchEvent(EventType.ADDED, "team/g", group))
    since = cache.generation
    returned: list[tuple[int, float]] = []

    def wait() -> None:
        generation = cache.wait_for_change(since, 30, settle_s=0.2)
        returned.append((generation, time.monotonic()))

    waiter = threading.Thread(target=wait)
    waiter.start()
    try:
        wait_for(lambda: cache._settling == 1, 10, description="the waiter waits for a first quiet change")
        first = time.monotonic()
        for phase in ("Running", "Unknown"):
            cache.apply(PODGROUPS, WatchEvent(EventType.MODIFIED, "team/g", _edit(group, ("status", "phase"), phase)))
        waiter.join(10)
        assert not waiter.is_alive(), "quiet changes ended a settling wait, settle_s after the first"
        ((generation, at),) = returned
        assert generation == since + 2, "the burst is folded into one cycle"
        assert at - first >= 0.2
        assert cache.woken == since  # quiet all the same: a waiter without settle_s slept on
        assert cache._settling == 0
    finally:
        cache.apply(QUEUES, WatchEvent(EventType.ADDED, "a", {"metadata": {"name": "a"}, "spec": {}}))
        waiter.join(10)


def test_changes_no_cycle_reads_start_no_settle_clock() -> None:
    cache = ClusterCache(resources=default_resources())
    since = cache.generation
    taint_rule = {"metadata": {"name": "r", "resourceVersion": "1"}, "spec": {}}
    cache.apply(DEVICETAINTRULES, WatchEvent(EventType.ADDED, "r", taint_rule))
    began = time.monotonic()
    assert cache.wait_for_change(since, timeout=0.1, settle_s=0.001) == since + 1
    assert time.monotonic() - began >= 0.1, "remediation's DRA objects ended a settling wait"


def test_a_waking_change_ends_a_settling_wait_at_once_and_a_lost_log_counts_as_old() -> None:
    cache = ClusterCache(resources=default_resources(), change_log=1)
    group = _podgroup()
    cache.apply(PODGROUPS, WatchEvent(EventType.ADDED, "team/g", group))
    since = cache.generation
    cache.apply(QUEUES, WatchEvent(EventType.ADDED, "a", {"metadata": {"name": "a"}, "spec": {}}))
    began = time.monotonic()
    assert cache.wait_for_change(since, timeout=30, settle_s=30) == since + 1
    assert time.monotonic() - began < 20, "a waking change waited for settle_s"
    for phase in ("Running", "Unknown"):  # two quiet changes: a log of one has lost the first
        cache.apply(PODGROUPS, WatchEvent(EventType.MODIFIED, "team/g", _edit(group, ("status", "phase"), phase)))
    began = time.monotonic()
    assert cache.wait_for_change(since + 1, timeout=30, settle_s=0.05) == since + 3
    assert 0.05 <= time.monotonic() - began < 20, "it waited for changes the log no longer dates"


def test_a_bound_pod_that_ends_frees_room_and_nothing_else() -> None:
    running = _pod("Running")
    succeeded = _edit(_edit(running, ("status", "phase"), "Succeeded"), ("metadata", "resourceVersion"), "12")
    assert pod_frees_room(running, succeeded)
    assert pod_frees_room(_pod("Pending"), _edit(_pod("Pending"), ("status", "phase"), "Failed"))
    assert not pod_frees_room(None, succeeded)
    assert not pod_frees_room(succeeded, _edit(succeeded, ("status", "phase"), "Failed"))  # held nothing already
    unbound = _pod("Pending", node=None)
    assert not pod_frees_room(unbound, _edit(unbound, ("status", "phase"), "Failed"))  # held nothing
    assert not pod_frees_room(running, _edit(succeeded, ("metadata", "labels"), {contract.LABEL_QUEUE: "b"}))
    disrupted = [{"type": "DisruptionTarget", "status": "True"}]
    assert not pod_frees_room(running, _edit(succeeded, ("status", "conditions"), disrupted))


def test_the_end_of_a_pod_wakes_only_while_the_loop_wants_room() -> None:
    cache = ClusterCache(resources=default_resources())
    running = _pod("Running")
    cache.apply(PODS, WatchEvent(EventType.ADDED, "team/p", running))
    ended = _edit(running, ("status", "phase"), "Succeeded")
    cache.room_wanted = False
    woken = cache.woken
    cache.apply(PODS, WatchEvent(EventType.MODIFIED, "team/p", ended))
    assert cache.woken == woken and cache.get(PODS, "team/p") == ended  # stored, not woken
    cache.apply(PODS, WatchEvent(EventType.ADDED, "team/q", _edit(running, ("metadata", "name"), "q")))
    cache.room_wanted = True
    woken = cache.woken
    cache.apply(PODS, WatchEvent(EventType.MODIFIED, "team/q", _edit(ended, ("metadata", "name"), "q")))
    assert cache.woken > woken
