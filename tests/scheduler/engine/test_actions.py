"""Health eviction, consolidate, reclaim, preempt and stale gangs, by scenario."""

from __future__ import annotations

from gpuwarden.contract import Action, ConditionType, EvictionAction, Reason, xid_reason
from scheduler.engine.model import NodeCondition, SchedulerConfig, Snapshot
from scheduler.engine.session import run_session
from tests.scheduler.builders import binds_by_job, evicted, job, node, pending, pending_codes, queue, running


def xid(gpus: tuple[int, ...], action: Action = Action.RESET_GPU) -> NodeCondition:
    return NodeCondition(ConditionType.GPU_XID_ERROR.value, True, xid_reason(79), "", action, gpus)


# --------------------------------------------------------------------------
# Health eviction
# --------------------------------------------------------------------------


def test_pod_on_faulty_gpu_is_evicted_and_its_gpu_leaves_capacity() -> None:
    snap = Snapshot(
        nodes=(node("n1", 2, conditions=(xid((1,)),)),),
        queues=(queue("q", 2),),
        jobs=(
            job("ok", "q", running("ok-0", "n1", (0,))),
            job("hit", "q", running("hit-0", "n1", (1,))),
            job("new", "q", pending("new-0", 1)),
        ),
    )
    d = run_session(snap)
    assert evicted(d) == {"hit-0": ("HealthEviction", None)}
    assert "GPU 1 on node n1: GpuXidError/Xid79" in d.evictions[0].reason
    assert "new" not in binds_by_job(d)
    share = next(q for q in d.queue_shares if q.queue == "q")
    assert share.fair_share.gpu == 1000  # one healthy GPU left


def test_gang_loses_all_its_pods_not_half() -> None:
    snap = Snapshot(
        nodes=(node("n1", 2, conditions=(xid((0,)),)), node("n2", 2)),
        queues=(queue("q", 4),),
        jobs=(
            job("gang", "q", running("g-0", "n1", (0,)), running("g-1", "n2", (0,)), min_member=2),
            job("solo", "q", running("s-0", "n2", (1,))),
        ),
    )
    d = run_session(snap)
    ev = evicted(d)
    assert set(ev) == {"g-0", "g-1"}
    assert "gang member lost" in next(e.reason for e in d.evictions if e.pod == "g-1")


def test_fatal_policy_node_wide_and_degraded() -> None:
    reboot = xid((3,), Action.REBOOT)
    remap = NodeCondition(
        ConditionType.GPU_MEMORY_DEGRADED.value, True, Reason.ROW_REMAP_FAILURE.value, "", Action.NONE, (0,)
    )
    nvlink = NodeCondition(
        ConditionType.GPU_NVLINK_DEGRADED.value, True, Reason.NVLINK_DOWN.value, "", Action.NONE, (0,)
    )
    snap = Snapshot(
        nodes=(
            node("reboot", 2, conditions=(reboot,)),
            node("remap", 2, conditions=(remap,)),
            node("slow", 2, conditions=(nvlink,)),
            node("drain", 2, draining=True),
        ),
        queues=(queue("q", 8),),
        jobs=(
            job("a", "q", running("a-0", "reboot", (0,))),
            job("b", "q", running("b-0", "remap", (1,))),
            job("c", "q", running("c-0", "slow", (0,))),
            job("d", "q", running("d-0", "drain", ())),
        ),
    )
    ev = evicted(run_session(snap))
    # REBOOT takes the whole node; RowRemapFailure only GPU 0; NVLink is degraded only.
    assert set(ev) == {"a-0", "d-0"}


def test_degraded_nodes_are_used_last() -> None:
    nvlink = NodeCondition(ConditionType.GPU_NVLINK_DEGRADED.value, True, Reason.NVLINK_DOWN.value)
    snap = Snapshot(
        nodes=(node("a-slow", 2, conditions=(nvlink,)), node("b-fine", 2)),
        queues=(queue("q", 4),),
        jobs=(job("j", "q", pending("j-0", 2), created=1), job("k", "q", pending("k-0", 2), created=2)),
    )
    binds = binds_by_job(run_session(snap))
    assert binds["j"][0][1] == "b-fine"
    assert binds["k"][0][1] == "a-slow"


# --------------------------------------------------------------------------
# Consolidate
# --------------------------------------------------------------------------


def test_consolidate_moves_small_pods_to_fit_a_big_one() -> None:
    snap = Snapshot(
        nodes=(node("n1", 4), node("n2", 4)),
        queues=(queue("q", 8),),
        jobs=(
            job("s1", "q", running("s1-0", "n1", (0, 1))),
            job("s2", "q", running("s2-0", "n2", (0, 1))),
            job("big", "q", pending("big-0", 4), priority=50),
        ),
    )
    d = run_session(snap)
    ev = evicted(d)
    assert len(ev) == 1
    ((pod, (action, beneficiary)),) = ev.items()
    assert action == "Consolidate" and beneficiary == "big"
    bind = binds_by_job(d)["big"][0]
    assert bind[2] == (0, 1, 2, 3) and bind[1] == ("n1" if pod == "s1-0" else "n2")
    assert "room kept for it on node" in d.evictions[0].reason
    assert d.binds[0].pipelined


def test_consolidate_commits_only_if_every_moved_pod_fits_again() -> None:
    snap = Snapshot(
        nodes=(node("n1", 4), node("n2", 4)),
        queues=(queue("q", 8),),
        jobs=(
            job("s1", "q", running("s1-0", "n1", (0, 1, 2))),
            job("s2", "q", running("s2-0", "n2", (0, 1, 2))),
            job("big", "q", pending("big-0", 2)),
        ),
    )
    d = run_session(snap)
    assert not d.evictions and not d.binds
    assert pending_codes(d)["big"] == "InsufficientResources"


def test_consolidate_never_moves_non_preemptible_work() -> None:
    snap = Snapshot(
        nodes=(node("n1", 4), node("n2", 4)),
        queues=(queue("q", 8),),
        jobs=(
            job("s1", "q", running("s1-0", "n1", (0, 1)), priority=100),
            job("s2", "q", running("s2-0", "n2", (0, 1)), priority=100),
            job("big", "q", pending("big-0", 4)),
        ),
    )
    assert not run_session(snap).evictions


def test_consolidate_moves_only_the_preemptible_job_of_a_mixed_node() -> None:
    # Two free GPUs in the pool, on n2 and n3; "big" needs two on one node.
    # n1 is the node found first (through its youngest preemptible pod), but
    # clearing it would move the non-preemptible pod too: it is passed over,
    # and one of the other nodes is cleared instead.
    snap = Snapshot(
        nodes=(node("n1", 2), node("n2", 2), node("n3", 2)),
        queues=(queue("q", 6),),
        jobs=(
            job("p2", "q", running("p2-0", "n2", (0,)), created=1),
            job("p3", "q", running("p3-0", "n3", (0,)), created=2),
            job("p1", "q", running("p1-0", "n1", (1,)), created=3),
            job("np", "q", running("np-0", "n1", (0,)), preemptible=False, created=4),
            job("big", "q", pending("big-0", 2), created=5),
        ),
    )
    d = run_session(snap)
    ((pod, why),) = evicted(d).items()
    assert pod in {"p2-0", "p3-0"} and why == ("Consolidate", "big")
    (bind,) = binds_by_job(d)["big"]
    assert bind[1] in {"n2", "n3"}


# --------------------------------------------------------------------------
# Reclaim
# --------------------------------------------------------------------------


def _reclaim_snapshot(victim_sizes: tuple[int, ...], want: int, owed_quota: int = 4) -> Snapshot:
    gpus = 0
    tasks = []
    for i, size in enumerate(victim_sizes):
        tasks.append(job(f"v{i}", "greedy", running(f"v{i}-0", "n1", tuple(range(gpus, gpus + size))), created=i))
        gpus += size
    return Snapshot(
        nodes=(node("n1", 8),),
        queues=(queue("greedy", 4), queue("owed", owed_quota)),
        jobs=(*tasks, job("mine", "owed", pending("mine-0", want))),
    )


def test_reclaim_takes_back_from_queue_above_fair_share() -> None:
    d = run_session(_reclaim_snapshot((2, 2, 2, 2), want=2))
    # greedy holds 8, fair share 4 (owed wants 2: share 2 + greedy 6).
    assert evicted(d) == {"v3-0": ("Reclaim", "mine")}  # youngest victim first
    assert binds_by_job(d)["mine"][0][1] == "n1"
    assert binds_by_job(d)["mine"][0][2] == (6, 7)
    assert d.binds[0].pipelined


def test_reclaim_places_a_whole_gang_within_the_fair_share() -> None:
    snap = _reclaim_snapshot((2, 2, 2, 2), want=2)
    gang = job("mine", "owed", pending("mine-0", 2), pending("mine-1", 2), min_member=2)
    d = run_session(Snapshot(snap.nodes, snap.queues, (*snap.jobs[:-1], gang)))
    # owed's fair share is 4 and the gang needs 4: both of its pods must
    # count against it once, not the first pod twice.
    assert evicted(d) == {"v3-0": ("Reclaim", "mine"), "v2-0": ("Reclaim", "mine")}
    assert sorted(b[2] for b in binds_by_job(d)["mine"]) == [(4, 5), (6, 7)]
    greedy = next(s for s in d.queue_shares if s.queue == "greedy")
    assert greedy.allocated.gpu == greedy.fair_share.gpu == 4000


def test_reclaim_beyond_quota_never_pushes_victim_below_its_fair_share() -> None:
    # owed (quota 2) wants 3: within its fair share of 3 but beyond its
    # quota, so the fair-share rule applies. greedy's share is 5 and its only
    # job holds 8: evicting it leaves greedy at 0 < 5, so nothing happens.
    d = run_session(_reclaim_snapshot((8,), want=3, owed_quota=2))
    assert not d.evictions
    assert pending_codes(d)["mine"] == "InsufficientResources"
    notes = [r.message for r in d.pending[0].reasons[1:]]
    assert any("without pushing its queue below its fair share" in n for n in notes)


def test_reclaimer_must_stay_within_its_fair_share() -> None:
    # owed's fair share is 4; a 6-GPU job would take it over.
    d = run_session(_reclaim_snapshot((2, 2, 2, 2), want=6))
    assert not d.evictions
    messages = [r.message for r in d.pending[0].reasons]
    assert "cannot reclaim: queue owed holds 0 GPUs of a 4 GPUs fair share and this needs 6 GPUs more" in " ".join(
        messages
    )


def test_reclaim_spares_non_preemptible_work() -> None:
    snap = Snapshot(
        nodes=(node("n1", 4),),
        queues=(queue("greedy", 2), queue("owed", 2)),
        jobs=(
            job("np", "greedy", running("np-0", "n1", (0, 1, 2, 3)), priority=100),
            job("mine", "owed", pending("mine-0", 2)),
        ),
    )
    assert not run_session(snap).evictions


def test_reclaim_blocked_by_the_reclaimers_parent_says_so() -> None:
    # Capacity 8: dept-a's fair share is 3, dept-b's 5. Team a1 is under its
    # share (0 of 2) but dept-a already holds 2 through a2's non-preemptible
    # job, and 2 more would take dept-a over 3: b1's surplus may not be taken,
    # and the note names dept-a rather than blaming b1's fair share.
    snap = Snapshot(
        nodes=(node("n1", 8),),
        queues=(
            queue("dept-a", 2),
            queue("dept-b", 4),
            queue("a1", 2, parent="dept-a"),
            queue("a2", 0, parent="dept-a"),
            queue("b1", 4, parent="dept-b"),
        ),
        jobs=(
            job("np", "a2", running("np-0", "n1", (0, 1)), preemptible=False),
            *(job(f"b{i}", "b1", running(f"b{i}-0", "n1", (2 + i,)), created=i) for i in range(6)),
            job("want", "a1", pending("want-0", 2), created=10),
        ),
    )
    d = run_session(snap)
    assert not d.evictions
    notes = " ".join(r.message for r in d.pending[0].reasons)
    assert "parent queue dept-a would go over its own fair share" in notes


def test_reclaim_takes_only_the_preemptible_job_of_a_mixed_node() -> None:
    # greedy holds all four GPUs of n1 (fair share 2): one non-preemptible
    # pod on two GPUs and one preemptible pod on two. Only the latter goes.
    snap = Snapshot(
        nodes=(node("n1", 4),),
        queues=(queue("greedy", 2), queue("owed", 2)),
        jobs=(
            job("np", "greedy", running("np-0", "n1", (0, 1)), preemptible=False, created=2),
            job("p", "greedy", running("p-0", "n1", (2, 3)), created=1),
            job("mine", "owed", pending("mine-0", 2)),
        ),
    )
    d = run_session(snap)
    assert evicted(d) == {"p-0": ("Reclaim", "mine")}
    assert binds_by_job(d)["mine"][0][2] == (2, 3)


# --------------------------------------------------------------------------
# Preempt
# --------------------------------------------------------------------------


def test_preempt_evicts_strictly_lower_priority_in_same_queue() -> None:
    snap = Snapshot(
        nodes=(node("n1", 4),),
        queues=(queue("q", 4), queue("other", 0)),
        jobs=(
            job("low", "q", running("low-0", "n1", (0, 1)), priority=10),
            job("same", "q", running("same-0", "n1", (2,)), priority=50),
            job("foreign", "other", running("foreign-0", "n1", (3,)), priority=1),
            job("high", "q", pending("high-0", 2), priority=50),
        ),
    )
    d = run_session(snap)
    assert evicted(d) == {"low-0": ("Preempt", "high")}
    assert binds_by_job(d)["high"][0][2] == (0, 1)


def test_preempt_never_evicts_non_preemptible_lower_priority_work() -> None:
    # Both running jobs are lower priority, but only one may be preempted;
    # the two GPUs "high" needs are not there without the other.
    snap = Snapshot(
        nodes=(node("n1", 2),),
        queues=(queue("q", 2),),
        jobs=(
            job("low-p", "q", running("a", "n1", (0,)), priority=10, created=1),
            job("low-np", "q", running("b", "n1", (1,)), priority=10, preemptible=False, created=2),
            job("high", "q", pending("c", 2), priority=50, created=3),
        ),
    )
    d = run_session(snap)
    assert not d.evictions and not d.binds
    assert pending_codes(d)["high"] == "InsufficientResources"


def test_preempt_spares_victims_a_later_one_makes_unnecessary() -> None:
    snap = Snapshot(
        nodes=(node("n1", 4),),
        queues=(queue("q", 4),),
        jobs=(
            job("tiny", "q", running("tiny-0", "n1", (0,)), priority=5),
            job("wide", "q", running("wide-0", "n1", (1, 2, 3)), priority=10),
            job("high", "q", pending("high-0", 3), priority=50),
        ),
    )
    d = run_session(snap)
    assert evicted(d) == {"wide-0": ("Preempt", "high")}
    assert binds_by_job(d)["high"][0][2] == (1, 2, 3)


def test_preempt_makes_room_under_the_queue_limit() -> None:
    snap = Snapshot(
        nodes=(node("n1", 8),),
        queues=(queue("q", 2, gpu_limit=2),),
        jobs=(
            job("low", "q", running("low-0", "n1", (0, 1)), priority=10),
            job("high", "q", pending("high-0", 2), priority=50),
        ),
    )
    d = run_session(snap)
    assert evicted(d) == {"low-0": ("Preempt", "high")}
    assert len(binds_by_job(d)["high"]) == 1


def test_preempt_evicts_nothing_when_the_limit_cannot_be_met() -> None:
    snap = Snapshot(
        nodes=(node("n1", 8),),
        queues=(queue("q", 2, gpu_limit=2),),
        jobs=(
            job("low", "q", running("low-0", "n1", (0,)), priority=10),
            job("peer", "q", running("peer-0", "n1", (1,)), priority=50),
            job("high", "q", pending("high-0", 2), priority=50),
        ),
    )
    d = run_session(snap)
    assert not d.evictions
    assert pending_codes(d)["high"] == "OverLimit"


def test_preempt_leaves_equal_priority_alone() -> None:
    snap = Snapshot(
        nodes=(node("n1", 2),),
        queues=(queue("q", 2),),
        jobs=(
            job("first", "q", running("first-0", "n1", (0, 1)), priority=50),
            job("second", "q", pending("second-0", 2), priority=50),
        ),
    )
    assert not run_session(snap).evictions


def test_preempt_gang_victim_is_evicted_whole() -> None:
    snap = Snapshot(
        nodes=(node("n1", 2), node("n2", 2)),
        queues=(queue("q", 4),),
        jobs=(
            job("gang", "q", running("g-0", "n1", (0, 1)), running("g-1", "n2", (0, 1)), min_member=2, priority=10),
            job("vip", "q", pending("vip-0", 2), priority=60),
        ),
    )
    d = run_session(snap)
    assert set(evicted(d)) == {"g-0", "g-1"}
    assert all(e.action is EvictionAction.PREEMPT for e in d.evictions)
    assert len(d.binds) == 1


# --------------------------------------------------------------------------
# Stale gangs
# --------------------------------------------------------------------------


def _stale(since: float | None) -> Snapshot:
    return Snapshot(
        nodes=(node("n1", 2),),
        queues=(queue("q", 2),),
        jobs=(
            job(
                "gang",
                "q",
                running("g-0", "n1", (0, 1)),
                pending("g-1", 2),
                min_member=2,
                below_min_member_since=since,
            ),
        ),
        now=1000.0,
        config=SchedulerConfig(stale_gang_grace_s=60),
    )


def test_stale_gang_past_grace_is_evicted_whole() -> None:
    d = run_session(_stale(900.0))
    assert evicted(d) == {"g-0": ("StaleGang", None)}
    assert "1 of 2 required pods" in d.evictions[0].reason


def test_stale_gang_within_grace_is_kept() -> None:
    assert not run_session(_stale(980.0)).evictions
    assert not run_session(_stale(None)).evictions
