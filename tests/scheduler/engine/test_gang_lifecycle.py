"""Gangs whose members finish: succeeded members count toward minMember, failed ones for nothing.

The scenario behind most of these is a batch Job with parallelism 4 and
completions 6 (minMember 4, one GPU a pod): its first pods complete while
its last ones run, or are still to be placed.
"""

from __future__ import annotations

from gpuwarden.contract import UnschedulableReason
from scheduler.engine.model import SchedulerConfig, Snapshot, Task
from scheduler.engine.session import run_session
from tests.scheduler.builders import binds_by_job, evicted, job, node, pending, pending_codes, queue, running

NOW = 1000.0
LONG_AGO = NOW - 600.0  # far past the grace below
GRACE = SchedulerConfig(stale_gang_grace_s=60)


def _batch(*tasks: Task, succeeded: int, failed: int = 0, since: float | None = None, nodes: int = 1) -> Snapshot:
    return Snapshot(
        nodes=tuple(node(f"n{i}", 8) for i in range(nodes)),
        queues=(queue("q", 8),),
        jobs=(
            job(
                "batch",
                "q",
                *tasks,
                min_member=4,
                succeeded=succeeded,
                failed=failed,
                below_min_member_since=since,
            ),
        ),
        now=NOW,
        config=GRACE,
    )


def test_the_last_pods_of_a_job_whose_first_ones_succeeded_are_placed() -> None:
    # Pods 0-3 succeeded; 4 and 5 are all that is left to run, fewer than minMember.
    d = run_session(_batch(pending("batch-4", 1), pending("batch-5", 1), succeeded=4))
    assert sorted(pod for pod, _, _ in binds_by_job(d)["batch"]) == ["batch-4", "batch-5"]
    assert d.pending == ()


def test_a_gang_whose_members_ran_and_succeeded_is_not_stale() -> None:
    # Even if the cluster side dated it, 2 running and 4 succeeded make the gang of 4.
    d = run_session(_batch(running("batch-4", "n0", (0,)), running("batch-5", "n0", (1,)), succeeded=4, since=LONG_AGO))
    assert d.evictions == ()


def test_a_gang_short_even_counting_its_successes_is_evicted_past_its_grace() -> None:
    # One succeeded and one running of four, the other two lost: the gang cannot complete.
    d = run_session(_batch(running("batch-1", "n0", (0,)), succeeded=1, failed=2, since=LONG_AGO))
    assert evicted(d) == {"batch-1": ("StaleGang", None)}
    assert "gang has 1 of 4 required pods running and 1 succeeded" in d.evictions[0].reason


def test_only_the_members_missing_from_the_gang_are_placed_as_a_gang() -> None:
    # Two succeeded, one runs, one replacement waits: it completes the gang alone.
    d = run_session(_batch(running("batch-2", "n0", (0,)), pending("batch-3", 1), succeeded=2))
    assert [pod for pod, _, _ in binds_by_job(d)["batch"]] == ["batch-3"]


def test_failed_members_do_not_count_toward_the_gang() -> None:
    d = run_session(_batch(pending("batch-4", 1), pending("batch-5", 1), succeeded=0, failed=4))
    assert pending_codes(d) == {"batch": UnschedulableReason.GANG_INCOMPLETE.value}
    assert d.pending[0].reasons[0].message == "gang needs 4 pods but only 2 exist"
    assert d.binds == ()


def test_a_gang_short_of_pods_says_how_many_succeeded() -> None:
    d = run_session(_batch(pending("batch-5", 1), succeeded=2))
    assert d.pending[0].reasons[0].message == "gang needs 4 pods but only 3 exist or succeeded"


def test_remaining_pods_that_wait_for_room_say_the_gang_is_met_by_its_successes() -> None:
    # The node is full with another queue's work: the remaining pods wait, the gang is not short.
    snap = Snapshot(
        nodes=(node("n0", 2),),
        queues=(queue("q", 1), queue("other", 1)),
        jobs=(
            job("busy", "other", running("busy-0", "n0", (0, 1)), priority=100),
            job("batch", "q", pending("batch-4", 1), pending("batch-5", 1), min_member=4, succeeded=4),
        ),
        now=NOW,
        config=GRACE,
    )
    d = run_session(snap)
    (status,) = [p for p in d.pending if p.job == "default/batch"]
    assert status.reasons[0].message.startswith("gang of 4 is met (0 running, 4 succeeded); 2 more pods wait for room")


# --------------------------------------------------------------------------
# What a pending gang is told
# --------------------------------------------------------------------------


def test_a_gang_larger_than_its_whole_pool_is_told_it_will_never_fit() -> None:
    # 9 pods of 8 GPUs: 72 GPUs, in a pool of 8 nodes of 8 (64); 2 GPUs are busy elsewhere.
    snap = Snapshot(
        nodes=tuple(node(f"n{i}", 8) for i in range(8)),
        queues=(queue("q", 16), queue("other", 48)),
        jobs=(
            job("small", "other", running("small-0", "n0", (0, 1)), priority=100),
            job("huge", "q", *(pending(f"huge-{i}", 8) for i in range(9)), min_member=9),
        ),
    )
    d = run_session(snap)
    (status,) = [p for p in d.pending if p.job == "default/huge"]
    assert [r.message for r in status.reasons] == [
        "the gang needs 72 GPUs for 9 pods but pool default has 64 GPUs in all: it will never fit; "
        "lower its minMember or add nodes to the pool"
    ]
    assert status.reasons[0].code is UnschedulableReason.INSUFFICIENT_RESOURCES


def test_a_gang_that_could_fit_some_day_is_told_how_far_it_is_from_fitting() -> None:
    snap = Snapshot(
        nodes=tuple(node(f"n{i}", 8) for i in range(2)),
        queues=(queue("q", 16), queue("other", 16)),
        jobs=(
            job("busy", "other", running("busy-0", "n0", (0, 1, 2, 3, 4, 5, 6, 7)), priority=100),
            job("wide", "q", *(pending(f"wide-{i}", 8) for i in range(2)), min_member=2),
        ),
    )
    d = run_session(snap)
    (status,) = [p for p in d.pending if p.job == "default/wide"]
    message = status.reasons[0].message
    # A count of nodes, then what they lack: never "1 fewer than 8 free GPUs".
    assert "1 of 2 eligible nodes of pool default have room (1 node with fewer than 8 free GPUs)" in message
    assert "the gang needs 16 GPUs for 2 pods, eligible nodes have 8 free (short by 8)" in message
    assert "never fit" not in message
