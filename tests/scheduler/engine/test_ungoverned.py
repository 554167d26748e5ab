"""A resource a queue does not name is not governed for it.

Queue trees are usually written with GPU quotas alone; their pods still ask
for CPU and memory. Those must neither be refused as "over quota" nor lose
their share to a bound nobody wrote.
"""

from __future__ import annotations

from gpuwarden.contract import UnschedulableReason
from scheduler.engine.fairshare import build_tree, fair_shares
from scheduler.engine.model import UNGOVERNED, UNLIMITED, Job, Queue, QueueResource, Snapshot
from scheduler.engine.resources import CPU, GPU, MEMORY
from scheduler.engine.session import run_session
from scheduler.snapshot_io import parse_snapshot
from tests.scheduler.builders import binds_by_job, node, pending, pending_codes

G = 1000
GIB = 1024


def _gpu_only_tree() -> tuple[Queue, ...]:
    return (
        Queue("dept", gpu=QueueResource(8 * G)),
        Queue("team", parent="dept", gpu=QueueResource(4 * G)),
    )


def test_a_queue_that_names_only_gpus_governs_nothing_else() -> None:
    q = Queue("team", gpu=QueueResource(4 * G))
    assert q.gpu.governed
    assert not q.cpu.governed
    assert not q.memory.governed
    assert q.cpu == UNGOVERNED
    assert QueueResource(0).governed  # named with quota 0: governed, may only borrow


def test_a_gpu_only_tree_admits_non_preemptible_pods_that_ask_cpu_and_memory() -> None:
    snap = Snapshot(
        nodes=(node("n1", 8),),
        queues=_gpu_only_tree(),
        jobs=(
            Job(
                "train",
                "team",
                uid="uid-train",
                preemptible=False,
                min_member=2,
                tasks=(pending("train-0", 2, cpu=16, mem_gib=64), pending("train-1", 2, cpu=16, mem_gib=64)),
            ),
        ),
    )
    d = run_session(snap)
    assert not d.pending, d.pending
    assert len(binds_by_job(d)["train"]) == 2


def test_gpus_stay_governed_for_non_preemptible_work() -> None:
    snap = Snapshot(
        nodes=(node("n1", 8),),
        queues=_gpu_only_tree(),
        jobs=(Job("big", "team", uid="uid-big", preemptible=False, tasks=(pending("big-0", 5, cpu=4),)),),
    )
    d = run_session(snap)
    assert pending_codes(d)["big"] == UnschedulableReason.NON_PREEMPTIBLE_OVER_QUOTA
    assert "gpu quota" in d.pending[0].reasons[0].message


def test_an_ancestor_that_governs_cpu_still_bounds_a_child_that_does_not() -> None:
    snap = Snapshot(
        nodes=(node("n1", 8),),
        queues=(
            Queue("dept", gpu=QueueResource(8 * G), cpu=QueueResource(UNLIMITED, 8 * G)),
            Queue("team", parent="dept", gpu=QueueResource(4 * G)),
        ),
        jobs=(Job("wide", "team", uid="uid-wide", tasks=(pending("wide-0", 1, cpu=12),)),),
    )
    d = run_session(snap)
    assert pending_codes(d)["wide"] == UnschedulableReason.OVER_LIMIT
    assert "queue dept has a cpu limit of 8 cores" in d.pending[0].reasons[0].message


def test_an_ungoverned_resource_is_shared_by_request() -> None:
    tree = build_tree(
        [
            Queue("a", gpu=QueueResource(2 * G)),
            Queue("b", gpu=QueueResource(6 * G)),
        ]
    )
    rows = fair_shares(
        tree,
        {"default": (8 * G, 100 * G, 100 * GIB)},
        {"a": (2 * G, 60 * G, 10 * GIB), "b": (6 * G, 20 * G, 90 * GIB)},
    )
    # GPUs by quota; CPU and memory each get what they ask while it lasts.
    assert [rows[n].fair_share[GPU] for n in "ab"] == [2 * G, 6 * G]
    assert [rows[n].fair_share[CPU] for n in "ab"] == [60 * G, 20 * G]
    assert [rows[n].fair_share[MEMORY] for n in "ab"] == [10 * GIB, 90 * GIB]


def test_a_snapshot_queue_that_omits_cpu_and_memory_does_not_govern_them() -> None:
    snap = parse_snapshot(
        {
            "nodes": [{"name": "n1", "cpu": 64, "memory": "512Gi", "gpus": 8}],
            "queues": [
                {"name": "team", "gpu": {"quota": 4}},
                {"name": "named", "gpu": {"quota": 4}, "cpu": {}},
            ],
            "jobs": [
                {
                    "name": "serve",
                    "queue": "team",
                    "preemptible": False,
                    "tasks": [{"name": "serve-0", "gpus": 1, "cpu": 8, "memory": "32Gi"}],
                },
                {
                    "name": "other",
                    "queue": "named",
                    "preemptible": False,
                    "tasks": [{"name": "other-0", "gpus": 1, "cpu": 8}],
                },
            ],
        }
    )
    team, named = snap.queues
    assert team.cpu == UNGOVERNED
    assert team.memory == UNGOVERNED
    assert named.cpu == QueueResource(0, UNLIMITED, 1.0)
    d = run_session(snap)
    assert "serve" in binds_by_job(d)
    # Naming cpu without a quota gives a quota of 0: no room for non-preemptible work.
    assert pending_codes(d) == {"other": UnschedulableReason.NON_PREEMPTIBLE_OVER_QUOTA}
