"""Watched objects to Snapshot, and on through a real session."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpuwarden.contract import Action
from scheduler.cluster.assignment import decode_assignment, encode_assignment
from scheduler.cluster.convert import GroupInfo, external_queue_name, is_external_queue, snapshot_from
from scheduler.engine.model import UNLIMITED, Queue, QueueResource, SchedulerConfig, Snapshot, TaskStatus
from scheduler.engine.session import run_session
from tests.scheduler.cluster.objects import gpunode_json, node_json, pod_json, report, xid_fault

NOW = 1_800_000_000.0
CONFIG = SchedulerConfig()


def team(name: str = "team-a", gpus: int = 0) -> Queue:
    free = QueueResource(UNLIMITED, UNLIMITED, 1.0)
    return Queue(name=name, gpu=QueueResource(gpus * 1000, UNLIMITED, 1.0), cpu=free, memory=free)


def build(
    nodes: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    groups: dict[tuple[str, str], GroupInfo],
    gpunodes: list[dict[str, Any]] = (),  # type: ignore[assignment]
    queues: tuple[Queue, ...] = (team(),),
    **kw: Any,
) -> Snapshot:
    return snapshot_from(
        {n["metadata"]["name"]: n for n in nodes},
        {g["metadata"]["name"]: g for g in gpunodes},
        pods,
        queues,
        groups,
        NOW,
        CONFIG,
        **kw,
    )


def test_one_job_per_group_with_its_pods_priority_and_earliest_creation() -> None:
    pods = [
        pod_json("w-1", group="g", gpus=1, created="2026-11-29T09:00:05Z"),
        pod_json("w-0", group="g", gpus=1, node="n1", created="2026-11-29T09:00:01Z"),
        pod_json("solo", group="h"),
    ]
    info = GroupInfo(queue="team-a", min_member=2, priority=50, uid="pg-uid", below_min_member_since=NOW - 5)
    snap = build([node_json("n1")], pods, {("team-a", "g"): info, ("team-a", "h"): GroupInfo("team-a")})
    jobs = {j.name: j for j in snap.jobs}
    assert set(jobs) == {"g", "h"}
    g = jobs["g"]
    assert (g.queue, g.min_member, g.priority, g.uid, g.below_min_member_since) == ("team-a", 2, 50, "pg-uid", NOW - 5)
    assert sorted(t.name for t in g.tasks) == ["w-0", "w-1"]
    assert g.created == datetime(2026, 11, 29, 9, 0, 1, tzinfo=UTC).timestamp()
    assert [q.name for q in snap.queues] == ["team-a"]


def test_pods_find_their_group_by_annotation_then_by_the_pod_grouper() -> None:
    pods = [pod_json("a", group="g"), pod_json("b")]
    snap = build([node_json("n1")], pods, {("team-a", "g"): GroupInfo("team-a")}, pod_groups={"uid-team-a-b": "g"})
    (job,) = snap.jobs
    assert sorted(t.name for t in job.tasks) == ["a", "b"]


def test_finished_gated_deleted_pending_and_ungrouped_pending_pods_are_left_out() -> None:
    gated = pod_json("gated", group="g")
    gated["spec"]["schedulingGates"] = [{"name": "wait"}]
    pods = [
        pod_json("done", group="g", node="n1", phase="Succeeded"),
        pod_json("failed", group="g", node="n1", phase="Failed"),
        gated,
        pod_json("going", group="g", deleting=True),
        pod_json("nogroup"),
        pod_json("stranger", group="unknown"),
        pod_json("kept", group="g"),
    ]
    snap = build([node_json("n1")], pods, {("team-a", "g"): GroupInfo("team-a")})
    assert [t.name for j in snap.jobs for t in j.tasks] == ["kept"]
    # Finished pods hold nothing, but their group counts them.
    (job,) = snap.jobs
    assert (job.succeeded, job.failed) == (1, 1)


def test_a_group_whose_pods_all_finished_is_a_job_without_tasks() -> None:
    pods = [
        pod_json("done-0", group="g", node="n1", phase="Succeeded"),
        pod_json("done-1", group="g", node="n1", phase="Succeeded"),
        pod_json("done-2", group="g", node="n1", phase="Failed"),
        pod_json("lost", group="nobody-knows", node="n1", phase="Succeeded"),
    ]
    snap = build([node_json("n1")], pods, {("team-a", "g"): GroupInfo("team-a", min_member=2)})
    (job,) = snap.jobs
    assert (job.name, job.tasks, job.succeeded, job.failed, job.min_member) == ("g", (), 2, 1, 2)


def test_other_schedulers_pods_hold_capacity_in_a_reserved_queue() -> None:
    mine = encode_assignment_for("n1", (0, 1))
    pods = [
        pod_json("ours", group="g", gpus=2, node="n1", assignment=mine),
        pod_json("theirs", scheduler="default-scheduler", gpus=3, node="n1", cpu="2"),
        pod_json("daemon", scheduler="default-scheduler", node="n1", cpu="500m", namespace="kube-system"),
        pod_json("theirs-pending", scheduler="default-scheduler", gpus=1),
        pod_json("theirs-done", scheduler="default-scheduler", gpus=1, node="n1", phase="Succeeded"),
        pod_json("theirs-cordoned", scheduler="default-scheduler", gpus=1, node="n2"),
        pod_json("ours-ungrouped", gpus=1, node="n1", assignment=encode_assignment_for("n1", (7,))),
    ]
    nodes = [node_json("n1", pool="p"), node_json("n2", pool="p", unschedulable=True)]
    snap = build(nodes, pods, {("team-a", "g"): GroupInfo("team-a")})
    external = [j for j in snap.jobs if is_external_queue(j.queue)]
    assert len(external) == 1
    (job,) = external
    assert job.queue == external_queue_name("p") and job.preemptible is False
    by_name = {t.name: t for t in job.tasks}
    assert set(by_name) == {"theirs", "daemon", "ours-ungrouped"}
    assert all(t.status is TaskStatus.RELEASING for t in job.tasks)
    # Their GPUs are named among those our pods do not hold, pod by pod in name
    # order: ours-ungrouped (one GPU) comes before theirs (three).
    assert by_name["ours-ungrouped"].gpu_indices == (2,)
    assert by_name["theirs"].gpu_indices == (3, 4, 5)
    queue = next(q for q in snap.queues if q.name == external_queue_name("p"))
    assert queue.node_pool == "p" and queue.gpu.quota == UNLIMITED and queue.gpu.over_quota_weight == 0


def encode_assignment_for(node: str, indices: tuple[int, ...]) -> str:
    from scheduler.engine.model import Bind, Gpu, Node

    return encode_assignment(Bind("j", "team-a", "x", "u", node, gpu_indices=indices),
                             Node(node, gpus=tuple(Gpu(i) for i in range(8))))  # fmt: skip


def test_held_capacity_is_kept_out_of_fair_share_and_never_evicted() -> None:
    pods = [pod_json(f"theirs-{i}", scheduler="volcano", gpus=1, node="n1") for i in range(6)]
    pods += [pod_json(f"a-{i:02d}", group=f"a-{i:02d}", gpus=1) for i in range(16)]
    pods += [pod_json(f"b-{i:02d}", group=f"b-{i:02d}", gpus=1, namespace="team-b") for i in range(16)]
    queues = (team("team-a", gpus=8), team("team-b", gpus=8))
    groups = {("team-a", f"a-{i:02d}"): GroupInfo("team-a") for i in range(16)}
    groups |= {("team-b", f"b-{i:02d}"): GroupInfo("team-b") for i in range(16)}
    snap = build([node_json("n1"), node_json("n2")], pods, groups, queues=queues)
    decisions = run_session(snap)
    shares = {s.queue: s for s in decisions.queue_shares}
    assert shares[external_queue_name("default")].fair_share.gpu == 6000
    assert shares["team-a"].fair_share.gpu + shares["team-b"].fair_share.gpu == 10_000
    assert decisions.evictions == ()
    # Two queues with equal quotas, ten GPUs left between them.
    assert shares["team-a"].fair_share.gpu == shares["team-b"].fair_share.gpu == 5000
    assert len(decisions.binds) == 10
    assert all(not (b.node == "n1" and set(b.gpu_indices) & set(range(6))) for b in decisions.binds)


def test_end_to_end_binds_respect_gpu_health_and_round_trip_through_the_annotation() -> None:
    # n1: GPU 2 hit by an XID the agent says needs a GPU reset; n2: healthy,
    # but another scheduler's pod holds four GPUs.
    sick = report("n1", xid_fault("n1", 2, xid=48, action=Action.RESET_GPU))
    healthy = report("n2")
    nodes = [node_json("n1", sick), node_json("n2", healthy)]
    gpunodes = [gpunode_json(sick), gpunode_json(healthy)]
    pods = [pod_json("theirs", scheduler="default-scheduler", gpus=4, node="n2")]
    pods += [pod_json(f"w-{i:02d}", group="gang", gpus=1) for i in range(11)]
    groups = {("team-a", "gang"): GroupInfo("team-a", min_member=11)}
    snap = build(nodes, pods, groups, gpunodes)
    decisions = run_session(snap)
    assert len(decisions.binds) == 11
    used = {(b.node, i) for b in decisions.binds for i in b.gpu_indices}
    assert len(used) == 11
    assert ("n1", 2) not in used
    assert not used & {("n2", i) for i in range(4)}

    # The binder writes the assignment; the next cycle reads the pods back
    # as running and has no GPU left for a newcomer.
    engine_nodes = {n.name: n for n in snap.nodes}
    bound = {b.pod: b for b in decisions.binds}
    running = []
    for pod in pods[1:]:
        b = bound[pod["metadata"]["name"]]
        text = encode_assignment(b, engine_nodes[b.node])
        assert decode_assignment(text, node=b.node) == b.gpu_indices
        running.append(pod_json(pod["metadata"]["name"], group="gang", gpus=1, node=b.node, assignment=text))
    newcomer = pod_json("late", group="late", gpus=1)
    groups[("team-a", "late")] = GroupInfo("team-a")
    again = run_session(build(nodes, [pods[0], *running, newcomer], groups, gpunodes))
    assert again.binds == ()
    assert again.evictions == ()
