"""The snapshot assembled from memoized conversions equals the one converted from scratch.

A random sequence of watch events (adds, updates and deletes of Nodes,
GPUNodes and Pods, and changes to the groups the cycle knows) is applied to
stores the way the cache applies them: an update replaces the entry. After
every event the assembler, which has seen every earlier state, must give
what :func:`snapshot_from` gives over the same objects (up to the order of
jobs and pods, which the engine does not read). So must an assembler told
only what changed, after batches of events, whatever else the change list
also names.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.contract import Action
from scheduler.cluster.assemble import Changes, SnapshotAssembler, canonical
from scheduler.cluster.convert import EXTERNAL_JOB_PREFIX, GroupInfo, snapshot_from
from scheduler.engine.build import JobBuilder
from scheduler.engine.incremental import Engine
from scheduler.engine.model import UNLIMITED, Job, Queue, QueueResource, SchedulerConfig, Snapshot
from scheduler.engine.state import JobState
from tests.scheduler.cluster.objects import gpunode_json, node_json, pod_json, report, xid_fault

NOW = 1_800_000_000.0
CONFIG = SchedulerConfig()
FREE = QueueResource(UNLIMITED, UNLIMITED, 1.0)
QUEUES = (Queue(name="team-a", gpu=FREE, cpu=FREE, memory=FREE),)
NODE_NAMES = ("n0", "n1", "n2")
POD_KEYS = tuple(f"p{i}" for i in range(8))
GROUP_NAMES = ("g", "h", "pg-derived")
JSON = dict[str, Any]


@st.composite
def node_objects(draw: st.DrawFn, name: str) -> JSON:
    faulty = draw(st.booleans())
    rep = report(name, xid_fault(name, 1, action=Action.RESET_GPU)) if faulty else None
    obj = node_json(
        name,
        rep,
        gpus=draw(st.sampled_from([0, 4, 8])),
        cpu=draw(st.sampled_from(["16", "64"])),
        pool=draw(st.sampled_from([None, "training"])),
        ready=draw(st.sampled_from(["True", "False"])),
        unschedulable=draw(st.booleans()),
    )
    if draw(st.integers(0, 9)) == 0:
        obj["metadata"]["name"] = f"{name}-renamed"  # a key that is not the name: converted under its key
    return obj


@st.composite
def gpunode_objects(draw: st.DrawFn, name: str) -> JSON:
    faults = [xid_fault(name, i) for i in draw(st.sets(st.integers(0, 7), max_size=2))]
    return gpunode_json(report(name, *faults))


@st.composite
def pod_objects(draw: st.DrawFn, key: str) -> Any:
    shape = draw(st.integers(0, 19))
    if shape == 0:
        return {"metadata": {"name": key}, "spec": "not a mapping", "status": None}
    node = draw(st.sampled_from([None, *NODE_NAMES, "gone"]))
    gpus = draw(st.integers(0, 2))
    assignment = None
    if node is not None and gpus and draw(st.booleans()):
        first = draw(st.integers(0, 6))
        assignment = json.dumps({"node": node, "gpus": [{"index": first + i, "memoryMiB": 81559} for i in range(gpus)]})
    pod = pod_json(
        key,
        gpus=gpus,
        node=node,
        group=draw(st.sampled_from([None, "g", "h"])),
        scheduler=draw(st.sampled_from(["gpuwarden", "gpuwarden", "default-scheduler"])),
        assignment=assignment,
        created=draw(st.sampled_from(["2026-11-29T09:00:00Z", "2026-11-29T08:00:00Z"])),
        phase=draw(st.sampled_from([None, None, "Succeeded", "Failed"])),
        deleting=draw(st.integers(0, 5)) == 0,
    )
    if draw(st.integers(0, 5)) == 0:
        pod["spec"]["schedulingGates"] = [{"name": "wait"}]
    if draw(st.integers(0, 5)) == 0:
        del pod["metadata"]["creationTimestamp"]
    return pod


group_infos = st.builds(
    GroupInfo,
    queue=st.sampled_from(["team-a", "missing"]),
    min_member=st.integers(0, 3),
    priority=st.sampled_from([0, 50, 100]),
    uid=st.sampled_from(["", "pg-uid"]),
)


@st.composite
def events(draw: st.DrawFn) -> tuple[str, str, Any]:
    """One change: ("nodes" | "gpunodes" | "pods" | "groups" | "pod_groups", key, new value or None)."""
    store = draw(st.sampled_from(["nodes", "gpunodes", "pods", "pods", "pods", "groups", "pod_groups"]))
    deleted = draw(st.integers(0, 3)) == 0
    if store == "nodes":
        name = draw(st.sampled_from(NODE_NAMES))
        return store, name, None if deleted else draw(node_objects(name))
    if store == "gpunodes":
        name = draw(st.sampled_from(NODE_NAMES))
        return store, name, None if deleted else draw(gpunode_objects(name))
    if store == "pods":
        key = draw(st.sampled_from(POD_KEYS))
        return store, key, None if deleted else draw(pod_objects(key))
    if store == "groups":
        return store, draw(st.sampled_from(GROUP_NAMES)), None if deleted else draw(group_infos)
    return store, f"uid-team-a-{draw(st.sampled_from(POD_KEYS))}", None if deleted else "pg-derived"


def _both(assembler: SnapshotAssembler, stores: dict[str, dict[Any, Any]], now: float) -> tuple[Snapshot, Snapshot]:
    groups = {("team-a", name): info for name, info in stores["groups"].items()}
    args = (QUEUES, groups, now, CONFIG)
    incremental = assembler.snapshot(
        stores["nodes"], stores["gpunodes"], stores["pods"], *args, pod_groups=stores["pod_groups"]
    )
    full = snapshot_from(
        stores["nodes"], stores["gpunodes"], stores["pods"].values(), *args, pod_groups=stores["pod_groups"]
    )
    return incremental, full


@settings(max_examples=150, deadline=None)
@given(st.lists(events(), min_size=1, max_size=40))
def test_after_any_sequence_of_events_the_assembled_snapshot_equals_a_full_conversion(
    sequence: list[tuple[str, str, Any]],
) -> None:
    assembler = SnapshotAssembler()
    stores: dict[str, dict[Any, Any]] = {name: {} for name in ("nodes", "gpunodes", "pods", "groups", "pod_groups")}
    for step, (store, key, value) in enumerate(sequence):
        if value is None:
            stores[store].pop(key, None)
        else:
            stores[store][key] = value
        incremental, full = _both(assembler, stores, NOW + step)
        assert canonical(incremental) == canonical(full)


def _changes(batch: list[tuple[str, str, Any]], extra: list[tuple[str, str, Any]]) -> Changes:
    """The change list the cycle would hand over for ``batch``; ``extra`` names keys that did not change."""
    named = [*batch, *extra]
    return Changes(
        nodes={key for store, key, _ in named if store in {"nodes", "gpunodes"}},
        pods={key for store, key, _ in named if store == "pods"},
        groups={("team-a", key) for store, key, _ in named if store == "groups"},
        pod_groups={key for store, key, _ in named if store == "pod_groups"},
    )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(events(), min_size=0, max_size=6), st.lists(events(), max_size=2)), min_size=1, max_size=12
    )
)
def test_told_only_what_changed_the_assembler_still_equals_a_full_conversion(
    batches: list[tuple[list[tuple[str, str, Any]], list[tuple[str, str, Any]]]],
) -> None:
    """And what it says it changed of the jobs, applied to the previous jobs, gives the current ones.

    It is asked with the finished jobs apart, as the cycle asks: those are
    left out of the snapshot's jobs and kept beside them, and its passes
    keep their per-job results from the changes alone (JobChanges).
    """
    assembler = SnapshotAssembler()
    stores: dict[str, dict[Any, Any]] = {name: {} for name in ("nodes", "gpunodes", "pods", "groups", "pod_groups")}
    kept: dict[str, Job] = {}
    for step, (batch, extra) in enumerate(batches):
        for store, key, value in batch:
            if value is None:
                stores[store].pop(key, None)
            else:
                stores[store][key] = value
        groups = {("team-a", name): info for name, info in stores["groups"].items()}
        args = (QUEUES, groups, NOW + step, CONFIG)
        told = assembler.snapshot(
            stores["nodes"],
            stores["gpunodes"],
            stores["pods"],
            *args,
            pod_groups=stores["pod_groups"],
            changes=_changes(batch, extra) if step else None,
            finished_apart=True,
        )
        full = snapshot_from(
            stores["nodes"], stores["gpunodes"], stores["pods"].values(), *args, pod_groups=stores["pod_groups"]
        )
        finished = tuple(assembler.finished_jobs.values())
        assert all(not job.tasks for job in finished)
        assert all(job.tasks for job in told.jobs)
        assert canonical(replace(told, jobs=told.jobs + finished)) == canonical(full)
        now = {job.key: job for job in (*told.jobs, *finished)}
        changes = assembler.job_changes
        assert changes.serial == step + 1
        if step == 0:
            assert changes.jobs is None
        else:
            assert changes.after(step) is changes.jobs and changes.after(step - 1) is None
            assert changes.jobs is not None
            for key, job in changes.jobs.items():
                if job is None:
                    kept.pop(key, None)
                else:
                    kept[key] = job
            assert kept.keys() == now.keys()
            assert all(kept[key] is job for key, job in now.items())
        kept = now


def test_objects_that_did_not_change_are_not_converted_again() -> None:
    nodes = {name: node_json(name) for name in NODE_NAMES}
    gpunodes = {"n0": gpunode_json(report("n0"))}
    pods = {f"p{i}": pod_json(f"p{i}", group="g" if i < 4 else "h", node="n0", gpus=1) for i in range(8)}
    groups = {("team-a", "g"): GroupInfo("team-a", min_member=4), ("team-a", "h"): GroupInfo("team-a")}
    assembler = SnapshotAssembler()
    first = assembler.snapshot(nodes, gpunodes, pods, QUEUES, groups, NOW, CONFIG)

    pods = {**pods, "p7": pod_json("p7", group="h", node="n1", gpus=1)}  # one pod moved
    gpunodes = {"n0": gpunode_json(report("n0", xid_fault("n0", 3)))}  # and one GPUNode changed
    second = assembler.snapshot(nodes, gpunodes, pods, QUEUES, groups, NOW + 1, CONFIG)

    assert canonical(second) == canonical(
        snapshot_from(nodes, gpunodes, pods.values(), QUEUES, groups, NOW + 1, CONFIG)
    )
    before = {j.name: j for j in first.jobs}
    after = {j.name: j for j in second.jobs}
    assert after["g"] is before["g"]  # its pods and its group are as they were: the same Job
    assert after["h"] is not before["h"]
    unchanged = [t for t in after["h"].tasks if t.name != "p7"]
    assert all(any(t is old for old in before["h"].tasks) for t in unchanged)
    nodes_before = {n.name: n for n in first.nodes}
    nodes_after = {n.name: n for n in second.nodes}
    assert nodes_after["n1"] is nodes_before["n1"]
    assert nodes_after["n0"] is not nodes_before["n0"]
    assert [g.healthy for g in nodes_after["n0"].gpus].count(False) == 1


def test_other_schedulers_pods_that_did_not_change_leave_every_job_as_it_was_for_the_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A DaemonSet's or another scheduler's pods on every node: a later cycle with nothing new rebuilds no job.

    Their synthetic per-node jobs used to be dated with each cycle's clock, so
    every such node's job was a new object every cycle and the kept-state
    engine removed and added it again (with its pods) each time.
    """
    nodes = {name: node_json(name) for name in NODE_NAMES}
    gpunodes = {name: gpunode_json(report(name)) for name in NODE_NAMES}
    pods = {
        **{f"ds-{n}": pod_json(f"ds-{n}", node=n, scheduler="default-scheduler") for n in NODE_NAMES},
        **{f"other-{n}": pod_json(f"other-{n}", node=n, gpus=2, scheduler="default-scheduler") for n in NODE_NAMES},
        "ours": pod_json("ours", group="g", gpus=1),
    }
    groups = {("team-a", "g"): GroupInfo("team-a")}
    assembler = SnapshotAssembler()
    first = assembler.snapshot(nodes, gpunodes, pods, QUEUES, groups, NOW, CONFIG)
    second = assembler.snapshot(nodes, gpunodes, pods, QUEUES, groups, NOW + 30, CONFIG, changes=Changes())
    externals = [j for j in first.jobs if j.name.startswith(EXTERNAL_JOB_PREFIX)]
    assert len(externals) == len(NODE_NAMES)
    assert all(a is b for a, b in zip(first.jobs, second.jobs, strict=True))
    assert second.queues is first.queues  # their pool's reserved queue too: nothing new to compare
    assert canonical(second) == canonical(
        snapshot_from(nodes, gpunodes, pods.values(), QUEUES, groups, NOW + 30, CONFIG)
    )
    # The last of them on a node goes: the pool keeps its reserved queue while another node has some.
    del pods[f"ds-{NODE_NAMES[0]}"], pods[f"other-{NODE_NAMES[0]}"]
    third = assembler.snapshot(
        nodes,
        gpunodes,
        pods,
        QUEUES,
        groups,
        NOW + 31,
        CONFIG,
        changes=Changes(pods={f"ds-{NODE_NAMES[0]}", f"other-{NODE_NAMES[0]}"}),
    )
    assert third.queues == first.queues
    assert canonical(third) == canonical(
        snapshot_from(nodes, gpunodes, pods.values(), QUEUES, groups, NOW + 31, CONFIG)
    )

    added: list[str] = []
    original = JobBuilder.add

    def counting(self: JobBuilder, key: str, spec: Job) -> JobState:
        added.append(key)
        return original(self, key, spec)

    engine = Engine()
    engine.run(first)
    monkeypatch.setattr(JobBuilder, "add", counting)
    engine.run(second)
    assert added == []


def test_a_pod_of_ours_binding_beside_other_schedulers_pods_leaves_their_job_as_it_was() -> None:
    """Our bind dirties the node; the external job of its other pods is the same object unless it changed."""
    nodes = {name: node_json(name) for name in NODE_NAMES}
    gpunodes = {name: gpunode_json(report(name)) for name in NODE_NAMES}
    pods = {
        "other": pod_json("other", node="n0", gpus=2, scheduler="default-scheduler"),
        "ours": pod_json("ours", group="g", gpus=1),
    }
    groups = {("team-a", "g"): GroupInfo("team-a")}
    assembler = SnapshotAssembler()
    first = assembler.snapshot(nodes, gpunodes, pods, QUEUES, groups, NOW, CONFIG)
    assignment = json.dumps({"node": "n0", "gpus": [{"index": 7, "memoryMiB": 81559}]})
    bound = {**pods, "ours": pod_json("ours", group="g", gpus=1, node="n0", assignment=assignment)}
    second = assembler.snapshot(
        nodes, gpunodes, bound, QUEUES, groups, NOW + 1, CONFIG, changes=Changes(pods=frozenset({"ours"}))
    )
    assert canonical(second) == canonical(
        snapshot_from(nodes, gpunodes, bound.values(), QUEUES, groups, NOW + 1, CONFIG)
    )

    def external(snapshot: Snapshot) -> Job:
        return next(j for j in snapshot.jobs if j.name == f"{EXTERNAL_JOB_PREFIX}n0")

    assert external(second) is external(first)
