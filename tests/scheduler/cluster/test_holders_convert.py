"""The kubelet's GPU holders, as the agent publishes them, read into the Snapshot.

The GPUNodes come from the agent's own publisher (``gpunode_status`` with a
PodResources read), so both sides of the contract are checked at once: what
the agent writes per GPU is what the scheduler trusts over its assignment.
"""

from __future__ import annotations

from collections.abc import Mapping

from agent.publish.gpunode import GpuHolders, gpunode_object, gpunode_status
from agent.publish.pods import PodIdentity
from agent.samples import HeldDevices, PodResourcesFailure, PodResourcesSample
from gpuwarden.contract import RESOURCE_NVIDIA_GPU, EvictionAction
from scheduler.cluster.convert import GroupInfo, node_from_objects, snapshot_from
from scheduler.cluster.evict import EvictOutcome, EvictResult
from scheduler.cluster.lost import gpu_seconds_lost
from scheduler.engine.model import Eviction, SchedulerConfig, Snapshot
from scheduler.remediation.controller import pods_on
from tests.scheduler.builders import queue
from tests.scheduler.cluster.objects import JSON, gpu_entity, node_json, pod_json, raw, report


def _uuid(node: str, index: int) -> str:
    return gpu_entity(node, index).uuid or ""


def _gpunode(
    node: str,
    held: Mapping[tuple[str, str], tuple[int, ...]],
    *,
    uids: Mapping[tuple[str, str], str] | None = None,
    offered: tuple[int, ...] | None = None,
    previous: JSON | None = None,
    failure: PodResourcesFailure | None = None,
) -> JSON:
    """The GPUNode the agent writes after a PodResources read naming ``held`` ((namespace, pod) -> GPU indices)."""
    sample = PodResourcesSample(
        held=tuple(
            HeldDevices(ns, pod, "main", RESOURCE_NVIDIA_GPU, tuple(_uuid(node, i) for i in gpus))
            for (ns, pod), gpus in held.items()
        ),
        listed=failure is None,
        allocatable=None if offered is None else frozenset(_uuid(node, i) for i in offered),
        failure=failure,
    )
    idents = {key: PodIdentity(uid, "other") for key, uid in (uids or {}).items()}
    obj = gpunode_object(node, f"uid-{node}")
    obj["status"] = gpunode_status(report(node), previous, GpuHolders(sample, idents))
    return raw(obj)


def test_the_agents_holders_become_the_nodes_kubelet_mapping_and_offers() -> None:
    gpunode = _gpunode(
        "n1",
        {("team-a", "a"): (5,), ("team-a", "b"): (1, 2)},
        uids={("team-a", "a"): "uid-a"},
        offered=(0, 1, 2, 3, 4, 5, 6),
    )
    n = node_from_objects(node_json("n1"), gpunode)
    assert n.kubelet_holders == {"uid-a": (5,), "team-a/b": (1, 2)}
    assert [g.offered for g in n.gpus] == [True] * 7 + [False]


def test_an_agent_without_podresources_publishes_no_mapping() -> None:
    obj = gpunode_object("n1", "uid-n1")
    obj["status"] = gpunode_status(report("n1"))
    n = node_from_objects(node_json("n1"), raw(obj))
    assert n.kubelet_holders is None
    assert all(g.offered is None for g in n.gpus)


def test_holders_kept_through_a_failed_read_still_count() -> None:
    first = _gpunode("n1", {("team-a", "a"): (5,)}, uids={("team-a", "a"): "uid-a"})
    failed = _gpunode("n1", {}, previous=first["status"], failure=PodResourcesFailure.TIMEOUT)
    assert node_from_objects(node_json("n1"), failed).kubelet_holders == {"uid-a": (5,)}


def test_holders_without_a_uid_are_dropped_while_reads_fail() -> None:
    # The agent could not read b's UID; then its PodResources reads failed. b
    # may have been recreated under its name since: the new pod must not
    # inherit the old one's GPUs.
    first = _gpunode("n1", {("team-a", "a"): (5,), ("team-a", "b"): (2,)}, uids={("team-a", "a"): "uid-a"})
    assert node_from_objects(node_json("n1"), first).kubelet_holders == {"uid-a": (5,), "team-a/b": (2,)}
    failed = _gpunode("n1", {}, previous=first["status"], failure=PodResourcesFailure.REFUSED)
    assert node_from_objects(node_json("n1"), failed).kubelet_holders == {"uid-a": (5,)}


def test_a_gpus_fault_is_dated_by_its_earliest_since_that_takes_it_out_of_service() -> None:
    gpunode = _gpunode("n1", {})
    gpus = gpunode["status"]["gpus"]
    gpus[3]["faults"] = [
        {
            "condition": "GpuNvlinkDegraded",
            "reason": "NvlinkDown",
            "action": "RESET_GPU",
            "since": "2026-12-01T10:05:00Z",
        },
        # Degraded since 10:00 but in service: a pod the kubelet gave it at 10:02 was not misplaced.
        {"condition": "GpuPcieDegraded", "reason": "PcieDowngraded", "action": "NONE", "since": "2026-12-01T10:00:00Z"},
        {"condition": "GpuXidError", "reason": "Xid79", "action": "RESET_GPU", "since": "not a time"},
        {"condition": "GpuXidError", "reason": "Xid48", "action": "NOT_AN_ACTION", "since": "2026-12-01T09:00:00Z"},
    ]
    n = node_from_objects(node_json("n1"), gpunode)
    # The XID with an unknown action is still fatal by its type: 09:00.
    assert n.gpus[3].faulted_since == 1_796_115_600.0
    gpus[3]["faults"].pop()
    n = node_from_objects(node_json("n1"), gpunode)
    assert n.gpus[3].faulted_since == 1_796_119_500.0  # 10:05, not the PCIe downgrade's 10:00
    assert [g.faulted_since for g in n.gpus if g.index != 3] == [None] * 7


def test_a_running_pod_carries_its_start_time() -> None:
    pod = pod_json("a", gpus=1, node="n1", group="g", assignment="n1:1")
    pod["status"] = {"phase": "Running", "startTime": "2026-12-01T10:00:00Z"}
    snap = _snapshot(_gpunode("n1", {}), raw(pod))
    (task,) = [t for j in snap.jobs for t in j.tasks if t.name == "a"]
    assert task.started == 1_796_119_200.0  # 2026-12-01T10:00:00Z


def _snapshot(gpunode: JSON, *pods: JSON) -> Snapshot:
    return snapshot_from(
        {"n1": node_json("n1")},
        {"n1": gpunode},
        list(pods),
        [queue("q", 8)],
        {("team-a", "g"): GroupInfo(queue="q")},
        1_800_000_000.0,
        SchedulerConfig(),
    )


def test_other_schedulers_pods_are_attributed_to_the_gpus_the_kubelet_reports() -> None:
    ext = [pod_json(f"x{i}", gpus=1, node="n1", scheduler="default-scheduler") for i in range(3)]
    held = {("team-a", "x0"): (6,), ("team-a", "x1"): (3,)}
    uids = {("team-a", "x0"): "uid-team-a-x0", ("team-a", "x1"): "uid-team-a-x1"}
    snap = _snapshot(_gpunode("n1", held, uids=uids), *ext)
    (external,) = [j for j in snap.jobs if j.name.startswith("external:")]
    gpus = {t.name: t.gpu_indices for t in external.tasks}
    assert gpus["x0"] == (6,)
    assert gpus["x1"] == (3,)
    assert gpus["x2"] not in ((6,), (3,)), "a guess keeps off the GPUs the kubelet reports held"


def test_a_drain_of_one_gpu_waits_for_the_pod_the_kubelet_reports_there() -> None:
    ours = [
        pod_json("a", gpus=1, node="n1", group="g", assignment='{"node":"n1","gpus":[{"index":2}]}'),
        pod_json("b", gpus=1, node="n1", group="g", assignment='{"node":"n1","gpus":[{"index":5}]}'),
    ]
    holders = node_from_objects(
        node_json("n1"), _gpunode("n1", {("team-a", "a"): (5,), ("team-a", "b"): (2,)})
    ).kubelet_holders
    assert [p["metadata"]["name"] for p in pods_on(ours, "n1", (5,), holders)] == ["a"]
    assert [p["metadata"]["name"] for p in pods_on(ours, "n1", (5,))] == ["b"], "no mapping: the assignment"


def test_work_lost_counts_the_gpus_the_kubelet_reports() -> None:
    pod = pod_json("a", gpus=1, node="n1", group="g", assignment='{"node":"n1","gpus":[{"index":2}]}')
    pod["status"]["startTime"] = "2027-01-15T08:00:00Z"
    # It asks for one GPU; the kubelet reports two (say, a second container's).
    snap = _snapshot(_gpunode("n1", {("team-a", "a"): (4, 5)}, uids={("team-a", "a"): "uid-team-a-a"}), pod)
    ev = Eviction("team-a/g", "team-a", "a", "uid-team-a-a", "n1", EvictionAction.HEALTH_EVICTION, "GPU 5")
    lost = gpu_seconds_lost([EvictResult(ev, EvictOutcome.EVICTED)], snap, {"uid-team-a-a": pod}, 1_800_000_100.0)
    assert lost == {"q": 200.0}, "two GPUs for the 100 s since its startTime"
