"""A cycle that reads only what changed schedules from the same snapshot as one that reads everything.

The watch cache logs the keys each event touched; a view taken ``since`` an
earlier one names them, the cluster views re-key only those, and the cycle
groups and assembles only those. Random event sequences (pods, PodGroups,
Nodes, GPUNodes, Queues; added, replaced, deleted) are fed to a real
:class:`ClusterCache` with a small change log, so that some views overflow
it and must be read in full; after every batch the incremental cycle's
engine input must equal the full rebuild's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client

from gpuwarden import contract
from gpuwarden.kube import KubeApi
from scheduler.cluster.assemble import SnapshotAssembler, canonical
from scheduler.cluster.cache import GPUNODES, NODES, PODGROUPS, PODS, QUEUES, ClusterCache, WatchedResource
from scheduler.cluster.cycle import SchedulingCycle
from scheduler.cluster.grouping import derive_group
from scheduler.cluster.owners import OwnerResolver
from scheduler.cluster.short_gangs import ShortGangs
from scheduler.cluster.slim import slim_node, slim_pod, without_managed_fields
from scheduler.cluster.watch import EventType, WatchEvent, object_key
from scheduler.runner import ClusterViews, cluster_view
from tests.scheduler.cluster.objects import gpunode_json, node_json, pod_json, report, xid_fault

NOW = 1_800_000_000.0
NODE_NAMES = ("n0", "n1", "n2")
POD_NAMES = tuple(f"p{i}" for i in range(8))
GROUPS = ("g", "h")
JSON = dict[str, Any]


def _cache(change_log: int) -> ClusterCache:
    slims = {NODES: slim_node, PODS: slim_pod}
    return ClusterCache(
        resources=[
            WatchedResource(name, lambda api: None, slims.get(name, without_managed_fields))
            for name in (NODES, GPUNODES, PODS, QUEUES, PODGROUPS)
        ],
        change_log=change_log,
    )


def _podgroup(name: str, *, min_member: int = 1, queue: str = "team-a") -> JSON:
    return {
        "apiVersion": f"{contract.SCHEDULING_API_GROUP}/{contract.SCHEDULING_API_VERSION}",
        "kind": contract.PODGROUP_KIND,
        "metadata": {"name": name, "namespace": "team-a", "uid": f"pg-{name}"},
        "spec": {"minMember": min_member, "queue": queue},
    }


def _queue(name: str, quota: int) -> JSON:
    return {
        "apiVersion": f"{contract.SCHEDULING_API_GROUP}/{contract.SCHEDULING_API_VERSION}",
        "kind": contract.QUEUE_KIND,
        "metadata": {"name": name, "uid": f"queue-{name}"},
        "spec": {"resources": {"gpu": {"quota": quota}}},
    }


def _derived_groups() -> list[JSON]:
    """The PodGroups pods without a group annotation get (one per pod): present, so none is created."""
    return [_podgroup(derive_group(pod_json(name), []).name) for name in POD_NAMES]


@st.composite
def pod_objects(draw: st.DrawFn, name: str) -> JSON:
    node = draw(st.sampled_from([None, *NODE_NAMES]))
    return pod_json(
        name,
        gpus=draw(st.integers(0, 2)),
        node=node,
        group=draw(st.sampled_from([None, *GROUPS, "unknown"])),
        scheduler=draw(st.sampled_from([contract.SCHEDULER_NAME, contract.SCHEDULER_NAME, "default-scheduler"])),
        created=draw(st.sampled_from(["2026-11-29T09:00:00Z", "2026-11-29T08:00:00Z"])),
        phase=draw(st.sampled_from([None, None, "Succeeded", "Failed"])),
        labels={"step": str(draw(st.integers(0, 3)))},
    )


@st.composite
def events(draw: st.DrawFn) -> tuple[str, WatchEvent]:
    store = draw(st.sampled_from([PODS, PODS, PODS, PODGROUPS, NODES, GPUNODES, QUEUES]))
    obj: JSON
    if store == PODS:
        obj = draw(pod_objects(draw(st.sampled_from(POD_NAMES))))
    elif store == PODGROUPS:
        obj = _podgroup(draw(st.sampled_from(GROUPS)), min_member=draw(st.integers(1, 3)))
    elif store == NODES:
        obj = node_json(draw(st.sampled_from(NODE_NAMES)), gpus=draw(st.sampled_from([0, 8])))
    elif store == GPUNODES:
        name = draw(st.sampled_from(NODE_NAMES))
        faults = [xid_fault(name, i) for i in draw(st.sets(st.integers(0, 7), max_size=2))]
        obj = gpunode_json(report(name, *faults))
    else:
        obj = _queue("team-a", draw(st.sampled_from([800, 8000])))
    kind = EventType.DELETED if draw(st.integers(0, 3)) == 0 else EventType.MODIFIED
    return store, WatchEvent(kind, object_key(obj), obj)


def _fill(cache: ClusterCache) -> None:
    for store, obj in [(QUEUES, _queue("team-a", 8000)), *((PODGROUPS, g) for g in _derived_groups())]:
        cache.apply(store, WatchEvent(EventType.ADDED, object_key(obj), obj))


@settings(max_examples=120, deadline=None)
@given(
    st.integers(2, 40),
    st.lists(st.tuples(st.lists(events(), max_size=8), st.booleans()), min_size=1, max_size=10),
)
def test_a_cycle_told_what_changed_prepares_what_a_full_rebuild_prepares(
    change_log: int, batches: list[tuple[list[tuple[str, WatchEvent]], bool]]
) -> None:
    cache = _cache(change_log)
    _fill(cache)
    api = KubeApi(client.ApiClient(), field_manager=contract.SCHEDULER_COMPONENT)  # no call is made
    incremental, full = SchedulingCycle(api), SchedulingCycle(api, incremental=False)
    views = ClusterViews()
    before: dict[str, Any] | None = None
    met_before: tuple[object, set[str]] | None = None
    handed_out: list[tuple[Mapping[Any, Any], dict[Any, Any]]] = []
    for step, (batch, forget) in enumerate(batches):
        for store, event in batch:
            cache.apply(store, event)
        # Now and then a view taken without ``since``: the cycle must notice it cannot tell what changed.
        # As the runner takes it: pods and PodGroups only as they changed, when the log reaches back.
        view = views.next(cache.view() if forget else views.take(cache))
        # Each view's PodGroups stay as they were (the status writer reads them behind the cycles).
        assert dict(view.podgroups) == cluster_view(cache.view()).podgroups
        handed_out.append((view.podgroups, dict(view.podgroups)))
        now = NOW + step
        told = incremental.prepare(view, now)
        rebuilt = full.prepare(cluster_view(cache.view()), now)
        assert canonical(told) == canonical(rebuilt)
        # The facts the status writer gets, kept from the assembler's changes, are the ones read afresh.
        met, met_changed, ended, named = incremental._job_facts(told)
        met_full, _, ended_full, _ = full._job_facts(rebuilt)
        assert set(met) == set(met_full) and ended == ended_full
        handed_out.append((ended, dict(ended)))  # read behind the cycles too: it must stay as it was
        handed_out.append((met, dict(met)))
        # Every group that started or stopped running at its minMember since the version handed out
        # before is named, on that version (the status writer looks at no other running group).
        if met_changed is not None:
            assert met_before is not None and met_changed.since is met_before[0]
            assert set(met) ^ met_before[1] <= met_changed.names
        met_before = (met, set(met))
        # Every group whose end changed since the last mapping is named (the status writer looks at no other).
        if named is not None:
            assert before is not None
            assert {g for g in ended.keys() | before.keys() if ended.get(g) != before.get(g)} <= named
        before = dict(ended)
    assert all(dict(version) == then for version, then in handed_out)


def test_a_cycle_with_nothing_new_hands_out_the_same_nodes_and_facts_as_the_last() -> None:
    """Objects handed on unchanged are the same objects: nothing rebuilds the nodes' tuple or copies the facts."""
    cache = _cache(100)
    _fill(cache)
    for name in NODE_NAMES:
        cache.apply(NODES, WatchEvent(EventType.ADDED, name, node_json(name)))
    for i, name in enumerate(POD_NAMES):
        pod = pod_json(name, gpus=1, node=NODE_NAMES[0], phase="Succeeded" if i % 2 else "Running")
        cache.apply(PODS, WatchEvent(EventType.ADDED, object_key(pod), pod))
    api = KubeApi(client.ApiClient(), field_manager=contract.SCHEDULER_COMPONENT)  # no call is made
    cycle, views = SchedulingCycle(api), ClusterViews()
    cycle._job_facts(cycle.prepare(views.next(views.take(cache)), NOW))  # built from scratch
    first = cycle.prepare(views.next(views.take(cache)), NOW)
    met, _, ended, _ = cycle._job_facts(first)
    assert met and ended
    second = cycle.prepare(views.next(views.take(cache)), NOW + 1)
    assert second.nodes is first.nodes
    again = cycle._job_facts(second)
    assert again[0] is met and again[2] is ended and again[3] == frozenset()
    assert again[1] is not None and again[1].since is met and not again[1].names
    # A node that changes: a new tuple with the new node in its place, and the facts as they were.
    changed = node_json(NODE_NAMES[1], gpus=0)
    cache.apply(NODES, WatchEvent(EventType.MODIFIED, NODE_NAMES[1], changed))
    third = cycle.prepare(views.next(views.take(cache)), NOW + 2)
    assert third.nodes is not first.nodes
    assert [n.name for n in third.nodes] == [n.name for n in first.nodes]
    facts = cycle._job_facts(third)
    assert (facts[0], facts[2]) == (met, ended)


def test_a_view_names_the_keys_changed_since_an_earlier_one() -> None:
    cache = _cache(100)
    first = cache.view()
    assert first.changed is None  # no earlier view: everything is new
    for name in ("p0", "p1"):
        obj = pod_json(name)
        cache.apply(PODS, WatchEvent(EventType.ADDED, object_key(obj), obj))
    node = node_json("n0")
    cache.apply(NODES, WatchEvent(EventType.ADDED, "n0", node))
    middle = cache.view(since=first.generation)
    assert middle.changed == {PODS: frozenset({"team-a/p0", "team-a/p1"}), NODES: frozenset({"n0"})}
    cache.apply(PODS, WatchEvent(EventType.DELETED, "team-a/p0", pod_json("p0")))
    last = cache.view(since=middle.generation)
    assert last.changed == {PODS: frozenset({"team-a/p0"})}
    assert "team-a/p0" not in last.pods
    assert cache.view(since=last.generation).changed == {}


def test_views_share_the_copy_of_a_collection_until_it_changes_and_a_copy_never_changes() -> None:
    """A collection is copied once per change, not once per view: the copy is shared, and stays as it was."""
    cache = _cache(100)
    cache.apply(NODES, WatchEvent(EventType.ADDED, "n0", node_json("n0")))
    cache.apply(QUEUES, WatchEvent(EventType.ADDED, "team-a", _queue("team-a", 8)))
    first = cache.view()
    obj = pod_json("p0")
    cache.apply(PODS, WatchEvent(EventType.ADDED, object_key(obj), obj))
    second = cache.view(since=first.generation)
    assert second.nodes is first.nodes and second.queues is first.queues  # neither changed: not copied again
    assert second.pods is not first.pods and set(second.pods) == {"team-a/p0"} and not first.pods
    cache.apply(NODES, WatchEvent(EventType.ADDED, "n1", node_json("n1")))
    cache.apply(QUEUES, WatchEvent(EventType.DELETED, "team-a", _queue("team-a", 8)))
    third = cache.view(since=second.generation)
    assert set(third.nodes) == {"n0", "n1"} and not third.queues
    # What the earlier views hold is as it was when they were taken.
    assert set(first.nodes) == {"n0"} and set(second.nodes) == {"n0"} and set(second.queues) == {"team-a"}
    assert cache.view().nodes is third.nodes


def test_a_partial_view_holds_only_what_changed_and_continues_only_the_view_before_it() -> None:
    cache = _cache(100)
    for name in ("p0", "p1", "p2"):
        obj = pod_json(name)
        cache.apply(PODS, WatchEvent(EventType.ADDED, object_key(obj), obj))
    views = ClusterViews()
    first = views.take(cache)
    assert first.partial == frozenset() and len(first.pods) == 3  # nothing to continue: everything
    assert len(views.next(first).pods) == 3
    moved = pod_json("p1", node="n0")
    cache.apply(PODS, WatchEvent(EventType.MODIFIED, object_key(moved), moved))
    cache.apply(PODS, WatchEvent(EventType.DELETED, "team-a/p2", pod_json("p2")))
    second = views.take(cache)
    assert second.partial == {PODS, PODGROUPS}
    assert list(second.pods) == ["team-a/p1"]  # p2 is named changed and absent: gone
    assert second.pods["team-a/p1"]["spec"]["nodeName"] == "n0"
    shown = views.next(second)
    assert {p["metadata"]["name"] for p in shown.pods.values()} == {"p0", "p1"}
    assert shown.changed is not None and len(shown.changed.pods) == 2
    # A partial view of changes since a view this did not continue cannot be used.
    stale = cache.view(since=first.generation, partial=(PODS,))
    with pytest.raises(ValueError, match="continues no view"):
        views.next(stale)
    # And a cache whose log no longer reaches back gives every pod.
    assert cache.view(since=-5, partial=(PODS,)).partial == frozenset()


def test_a_view_past_the_change_log_says_it_cannot_tell() -> None:
    cache = _cache(3)
    start = cache.view().generation
    for i in range(4):
        obj = pod_json(f"p{i}")
        cache.apply(PODS, WatchEvent(EventType.ADDED, object_key(obj), obj))
    assert cache.view(since=start).changed is None  # the first change was dropped from the log
    assert cache.view(since=start + 1).changed == {PODS: frozenset({"team-a/p1", "team-a/p2", "team-a/p3"})}


def test_a_cycle_over_an_unchanged_backlog_searches_for_none_of_it() -> None:
    """The scheduler's cycle keeps a backlog memo: the same view twice, and the second session searches for nothing.

    Counted through the cycle's own engine (attempts, never time): the
    snapshot the assembler hands over for an unchanged view is the same
    objects, which is what lets the memo's verdicts stand.
    """
    cache = _cache(64)
    _fill(cache)
    for name in NODE_NAMES:
        obj = node_json(name)
        cache.apply(NODES, WatchEvent(EventType.ADDED, object_key(obj), obj))
        obj = gpunode_json(report(name))
        cache.apply(GPUNODES, WatchEvent(EventType.ADDED, object_key(obj), obj))
    for name in POD_NAMES:  # each wants more cores than a node has
        obj = pod_json(name, gpus=1, cpu="200", labels={contract.LABEL_QUEUE: "team-a"})
        cache.apply(PODS, WatchEvent(EventType.ADDED, object_key(obj), obj))
    api = KubeApi(client.ApiClient(), field_manager=contract.SCHEDULER_COMPONENT)  # no call is made
    cycle = SchedulingCycle(api)
    views = ClusterViews()
    engine = cycle._engine
    assert engine is not None and engine.memo is not None
    first = cycle.decide(cycle.prepare(views.next(cache.view(since=None)), NOW))
    assert len(first.pending) == len(POD_NAMES) and not first.binds
    assert engine.memo.counts.placements_tried == 1  # eight pods alike: judged once
    second = cycle.decide(cycle.prepare(views.next(cache.view(since=views.generation)), NOW + 1))
    assert second.pending == first.pending
    assert engine.memo.counts.placements_tried == 0
    assert engine.memo.counts.placements_skipped == len(POD_NAMES)


class _Owners(OwnerResolver):
    """Every pod with an owner reference belongs to one Job (a gang's pods share their owner); calls counted."""

    def __init__(self) -> None:
        super().__init__(KubeApi(client.ApiClient(), field_manager=contract.SCHEDULER_COMPONENT))
        self.calls = 0
        self.job: JSON = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "train", "namespace": "team-a", "uid": "job-train"},
            "spec": {"parallelism": 4, "completions": 4},
        }

    def chain(self, pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        self.calls += 1
        return [self.job] if (pod.get("metadata") or {}).get("ownerReferences") else []


def test_a_cycle_with_nothing_new_reads_no_job_and_no_pod_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same view twice: the second prepare converts nothing, counts no gang, reads no job's facts.

    Counted, not timed: pods with no owner are never checked for a changed
    owner, the four pods of one Job cost one owner lookup together, and the
    finished pods (left in place, as Jobs leave them) cost nothing at all.
    """
    cache = _cache(64)
    _fill(cache)
    for name in NODE_NAMES:
        for store, obj in ((NODES, node_json(name)), (GPUNODES, gpunode_json(report(name)))):
            cache.apply(store, WatchEvent(EventType.ADDED, object_key(obj), obj))
    ref = {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "job-train", "controller": True}
    pods = [pod_json(f"w{i}", gpus=1, node="n0", owners=[ref]) for i in range(4)]
    pods += [pod_json(f"bare{i}", gpus=1, node="n1") for i in range(4)]
    pods += [pod_json(f"done{i}", gpus=1, node="n2", phase="Succeeded") for i in range(8)]
    pods += [pod_json("waiting", gpus=1, cpu="200")]
    for obj in pods:
        cache.apply(PODS, WatchEvent(EventType.ADDED, object_key(obj), obj))
    owners = _Owners()
    api = KubeApi(client.ApiClient(), field_manager=contract.SCHEDULER_COMPONENT)  # no call is made
    cycle = SchedulingCycle(api, owners=owners)
    views = ClusterViews()
    first = cycle.prepare(views.next(cache.view(since=None)), NOW)
    met, _, ended, _ = cycle._job_facts(first)
    assert len(ended) == 8 and all(job.tasks for job in first.jobs)  # the finished groups are apart
    assert not set(met) & set(ended)  # how a group ended is its status; it is not "running at minMember"

    counted: dict[str, int] = {"facts": 0, "gangs": 0, "jobs": 0}

    def counting(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            counted[name] += 1
            return original(*args, **kwargs)

        return call

    monkeypatch.setattr(SchedulingCycle, "_read_facts", counting("facts", SchedulingCycle._read_facts))
    monkeypatch.setattr(ShortGangs, "_lost_members", counting("gangs", ShortGangs._lost_members))
    monkeypatch.setattr(SnapshotAssembler, "_assemble_job", counting("jobs", SnapshotAssembler._assemble_job))
    owners.calls = 0
    second = cycle.prepare(views.next(cache.view(since=views.generation)), NOW + 1)
    again = cycle._job_facts(second)
    assert (again[0], again[2], again[3]) == (met, ended, frozenset())
    assert again[0] is met and again[2] is ended  # the same versions: the status writer knows nothing changed
    assert counted == {"facts": 0, "gangs": 0, "jobs": 0}
    assert owners.calls == 1
    assert all(a is b for a, b in zip(first.jobs, second.jobs, strict=True))

    # One worker finishes: its job alone is read again, and its facts.
    done = pod_json("w0", gpus=1, node="n0", owners=[ref], phase="Succeeded")
    cache.apply(PODS, WatchEvent(EventType.MODIFIED, object_key(done), done))
    third = cycle.prepare(views.next(cache.view(since=views.generation)), NOW + 2)
    cycle._job_facts(third)
    assert counted == {"facts": 1, "gangs": 1, "jobs": 1}
