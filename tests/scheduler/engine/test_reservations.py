"""Reservations: room an action freed for a job stays the job's until it binds or expires."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwarden.contract import Action, ConditionType, xid_reason
from scheduler.engine.build import build_cluster
from scheduler.engine.model import (
    Job,
    NodeCondition,
    Reservation,
    SchedulerConfig,
    Snapshot,
    TaskStatus,
)
from scheduler.engine.session import run_session
from tests.scheduler.builders import binds_by_job, evicted, job, node, pending, queue, running
from tests.scheduler.engine.test_properties import snapshots, with_running_work

NOW = 1_000.0


def _reclaim(victims_releasing: bool | None) -> Snapshot:
    """greedy holds all 8 GPUs of n1 (fair share 4); owed's job ``mine`` wants 2.

    ``victims_releasing``: None, the first session (nothing evicted yet);
    True, the youngest victim is terminating; False, it is gone.
    """
    jobs = [job(f"v{i}", "greedy", running(f"v{i}-0", "n1", (2 * i, 2 * i + 1)), created=i) for i in range(3)]
    if victims_releasing is None:
        jobs.append(job("v3", "greedy", running("v3-0", "n1", (6, 7)), created=3))
    elif victims_releasing:
        jobs.append(job("v3", "greedy", replace(running("v3-0", "n1", (6, 7)), status=TaskStatus.RELEASING)))
    jobs.append(job("mine", "owed", pending("mine-0", 2), created=10))
    return Snapshot(
        nodes=(node("n1", 8),),
        queues=(queue("greedy", 4), queue("owed", 4)),
        jobs=tuple(jobs),
        now=NOW,
    )


def _reservation(expires: float = NOW + 100, gpus: tuple[int, ...] = (6, 7)) -> Reservation:
    return Reservation(
        job="default/mine", node="n1", gpu_indices=gpus, cpu_milli=1000, memory_mib=1024, expires=expires
    )


def _intruder() -> Job:
    # Higher priority in the same queue: allocate offers it before mine.
    return job("intruder", "owed", pending("intruder-0", 2), priority=50, created=0)


def test_a_reclaim_reserves_the_room_its_pipelined_bind_waits_for() -> None:
    d = run_session(_reclaim(None))
    assert evicted(d) == {"v3-0": ("Reclaim", "mine")}
    assert d.binds[0].pipelined
    ttl = SchedulerConfig().reservation_ttl_s
    assert d.reservations == (_reservation(expires=NOW + ttl),)


def test_while_the_victim_terminates_the_job_waits_and_nothing_more_is_evicted() -> None:
    snap = replace(_reclaim(True), reservations=(_reservation(),))
    d = run_session(snap)
    assert not d.evictions, "a job awaiting its room must not evict again"
    assert not d.binds
    assert d.reservations == (_reservation(),)
    assert d.pending and d.pending[0].job == "default/mine"
    notes = [r.message for p in d.pending for r in p.reasons]
    assert any("waiting for room reserved on node n1" in n for n in notes)


def test_without_a_reservation_the_next_session_evicts_again() -> None:
    # What the reservation prevents: the same job, the victim still
    # terminating, and reclaim takes a second victim for it.
    d = run_session(_reclaim(True))
    assert evicted(d), "the baseline for the test above"


def test_free_reserved_room_goes_to_its_job_not_to_the_first_in_line() -> None:
    base = _reclaim(False)
    snap = replace(base, jobs=(*base.jobs, _intruder()))
    # Without the reservation the intruder takes the room and mine has a
    # second pod evicted for it: two evictions for one pod's worth of room.
    free_for_all = run_session(snap)
    assert binds_by_job(free_for_all)["intruder"] == [("intruder-0", "n1", (6, 7))]
    assert evicted(free_for_all) and all(e.beneficiary == "default/mine" for e in free_for_all.evictions)

    d = run_session(replace(snap, reservations=(_reservation(),)))
    assert binds_by_job(d)["mine"] == [("mine-0", "n1", (6, 7))]
    assert all(e.beneficiary != "default/mine" for e in d.evictions)
    assert not any(set(gpus) & {6, 7} for _, _, gpus in binds_by_job(d).get("intruder", []))
    # The used reservation is not kept (a new one may follow if the bind is
    # pipelined behind an eviction on the node).
    assert _reservation() not in d.reservations
    assert all(not e.pod.startswith("reservation/") for e in d.evictions), "placeholders are never victims"


def test_an_expired_reservation_lapses() -> None:
    base = _reclaim(False)
    snap = replace(base, jobs=(*base.jobs, _intruder()), reservations=(_reservation(expires=NOW),))
    d = run_session(snap)
    assert binds_by_job(d)["intruder"] == [("intruder-0", "n1", (6, 7))]
    assert all(r.expires > NOW for r in d.reservations), "the expired one is not kept"


def test_a_reservation_on_a_gpu_that_faulted_lapses() -> None:
    base = _reclaim(False)
    fault = NodeCondition(ConditionType.GPU_XID_ERROR.value, True, xid_reason(79), "", Action.RESET_GPU, (7,))
    nodes = (replace(base.nodes[0], conditions=(fault,)),)
    d = run_session(replace(base, nodes=nodes, reservations=(_reservation(),)))
    assert _reservation() not in d.reservations
    # owed is below its guaranteed quota, so it may reclaim room anew, but
    # never on the faulted GPU.
    assert all(7 not in r.gpu_indices for r in d.reservations)
    assert all(7 not in b.gpu_indices for b in d.binds)


def test_room_held_by_other_work_lapses_instead_of_being_shared() -> None:
    base = _reclaim(False)
    squatter = job("other", "greedy", running("other-0", "n1", (6, 7)), created=5)
    d = run_session(replace(base, jobs=(*base.jobs, squatter), reservations=(_reservation(),)))
    assert _reservation() not in d.reservations
    # mine is an ordinary pending job again: it may reclaim anew, but
    # nothing is bound beside the squatter on its GPUs this session.
    assert all(not (set(b.gpu_indices) & {6, 7}) or b.pipelined for b in d.binds)


def test_a_job_that_still_cannot_fit_keeps_its_room() -> None:
    # mine now wants 4 GPUs on one node: its 2 reserved are not enough, it
    # stays pending, and the room stays reserved (not handed to intruder).
    base = _reclaim(False)
    jobs = [j for j in base.jobs if j.name != "mine"]
    mine = job("mine", "owed", pending("mine-0", 2), pending("mine-1", 2), min_member=2, created=10)
    d = run_session(replace(base, jobs=(*jobs, mine, _intruder()), reservations=(_reservation(),)))
    assert not any(set(gpus) & {6, 7} for _, _, gpus in binds_by_job(d).get("intruder", []))
    assert _reservation() in d.reservations


def test_consolidation_reserves_the_new_place_of_a_moved_pod_for_its_job() -> None:
    snap = Snapshot(
        nodes=(node("n1", 2), node("n2", 2)),
        queues=(queue("q", 4),),
        jobs=(
            job("a", "q", running("a-0", "n1", (0,)), created=1),
            job("b", "q", running("b-0", "n2", (0,)), created=2),
            job("big", "q", pending("big-0", 2), created=3),
        ),
        now=NOW,
    )
    d = run_session(snap)
    assert d.evictions and d.evictions[0].action.value == "Consolidate"
    moved = d.evictions[0]
    held = {(r.job, r.node) for r in d.reservations}
    assert (moved.job, "n2" if moved.node == "n1" else "n1") in held  # the moved pod's new place
    assert ("default/big", moved.node) in held  # the beneficiary's pipelined bind


# --------------------------------------------------------------------------
# Property: a seated reservation's GPUs go to its job or to nobody.
# --------------------------------------------------------------------------


def _after_evictions(second: Snapshot) -> tuple[Snapshot, set[tuple[str, int, str]]]:
    """Run ``second``, let its evicted pods finish leaving, keep its binds undone.

    Returns the next snapshot (with the reservations) and the whole GPUs
    that are reserved and free in it: (node, GPU index, job).
    """
    decisions = run_session(second)
    gone = {(e.job, e.pod) for e in decisions.evictions}
    jobs = tuple(replace(j, tasks=tuple(t for t in j.tasks if (j.key, t.name) not in gone)) for j in second.jobs)
    third = replace(second, jobs=jobs, reservations=decisions.reservations)
    cluster = build_cluster(third)
    reserved: set[tuple[str, int, str]] = set()
    for state in cluster.jobs:
        for held in state.reserved:
            if held.placeholder is not None and held.placeholder.node is not None and not held.placeholder.slices:
                for index in held.reservation.gpu_indices:
                    reserved.add((held.reservation.node, index, state.key))
    return third, reserved


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots(), st.integers(min_value=0, max_value=3))
def test_reserved_gpus_go_to_their_job_or_to_nobody(snapshot: Snapshot, extra: int) -> None:
    second = with_running_work(snapshot)
    third, reserved = _after_evictions(second)
    # Newcomers in every queue compete for the room.
    queues = sorted({j.queue for j in third.jobs}) or sorted(q.name for q in third.queues)
    if not queues:
        extra = 0
    newcomers = tuple(
        job(f"new-{i}", queues[i % len(queues)], pending(f"new-{i}-0", 1), priority=1000, created=-1.0)
        for i in range(extra)
    )
    decisions = run_session(replace(third, jobs=(*third.jobs, *newcomers)))
    owner = {(n, g): j for n, g, j in reserved}
    for b in decisions.binds:
        for index in b.gpu_indices:
            holder = owner.get((b.node, index))
            assert holder is None or holder == b.job, f"{b.job} took GPU {index} of {b.node} reserved for {holder}"
    # Placeholders are neither evicted nor bound.
    assert all(not e.pod.startswith("reservation/") for e in decisions.evictions)
    assert all(not b.pod.startswith("reservation/") for b in decisions.binds)


def test_a_gang_a_fault_evicts_gets_room_on_healthy_gpus_at_once() -> None:
    fault = NodeCondition(ConditionType.GPU_XID_ERROR.value, True, xid_reason(48), "", Action.RESET_GPU, (0,))
    gang = job("gang", "q", running("gang-0", "n1", (0,)), running("gang-1", "n1", (1,)), min_member=2)
    snap = Snapshot(
        nodes=(node("n1", 2, conditions=(fault,)), node("n2", 2)),
        queues=(queue("q", 4),),
        jobs=(gang, job("late", "q", pending("late-0", 1), created=5)),
        now=NOW,
    )
    d = run_session(snap)
    assert evicted(d) == {"gang-0": ("HealthEviction", None), "gang-1": ("HealthEviction", None)}
    held = sorted((r.node, r.gpu_indices) for r in d.reservations if r.job == "default/gang")
    assert len(held) == 2 and ("n1", (0,)) not in held, "two healthy GPUs, never the faulted one"
    late = [(n, g) for _, n, g in binds_by_job(d).get("late", [])]
    assert not set(late) & set(held), "the gang's room is not given away"
    # Next session: the gang's pods are recreated (pending) and land in that room.
    again = Snapshot(
        nodes=snap.nodes,
        queues=snap.queues,
        jobs=(job("gang", "q", pending("gang-a", 1), pending("gang-b", 1), min_member=2), snap.jobs[1]),
        now=NOW + 30,
        reservations=d.reservations,
    )
    placed = run_session(again)
    assert sorted((n, g) for _, n, g in binds_by_job(placed)["gang"]) == held
