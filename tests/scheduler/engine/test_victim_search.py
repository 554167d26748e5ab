"""The victim search finds the plan that exists: one scenario per fault it used to have.

Each scenario has a plan that satisfies gpuwarden's own rules; the old
search missed it and found it only when the pods' ages or the nodes' order
changed.
"""

from __future__ import annotations

from scheduler.engine.model import Snapshot
from scheduler.engine.session import run_session
from tests.scheduler.builders import binds_by_job, evicted, fraction, job, node, pending, pending_codes, queue, running


def _messages(snap: Snapshot, name: str) -> list[str]:
    d = run_session(snap)
    return [r.message for p in d.pending if p.job.endswith(f"/{name}") for r in p.reasons]


# --------------------------------------------------------------------------
# Backtracking over victims
# --------------------------------------------------------------------------


def test_reclaim_skips_an_early_victim_that_would_make_the_sufficient_one_inadmissible() -> None:
    # greedy holds all 4 GPUs (fair share 2): "small" (youngest, 1 GPU),
    # "big" (2 GPUs) and a non-preemptible pod. owed (share 2) needs 2 on
    # one node. Evicting small first leaves big inadmissible (greedy would
    # drop to 1 < 2); big alone is admissible and frees enough.
    snap = Snapshot(
        nodes=(node("n1", 4),),
        queues=(queue("greedy", 1), queue("owed", 1)),
        jobs=(
            job("np", "greedy", running("np-0", "n1", (3,)), preemptible=False, created=0),
            job("big", "greedy", running("big-0", "n1", (1, 2)), created=1),
            job("small", "greedy", running("small-0", "n1", (0,)), created=2),
            job("mine", "owed", pending("mine-0", 2), created=3),
        ),
    )
    d = run_session(snap)
    assert evicted(d) == {"big-0": ("Reclaim", "mine")}
    assert binds_by_job(d)["mine"] == [("mine-0", "n1", (1, 2))]


def test_consolidation_tries_another_victim_when_the_moved_pod_cannot_be_placed_again() -> None:
    # big needs 2 GPUs on one node; the pool has 2 free (n1 GPU 3, n2 GPU 1).
    # Moving x (the youngest, 2 GPUs) makes room on n1, but x then fits
    # nowhere; moving u (1 GPU) makes room too, and u fits on n2.
    snap = Snapshot(
        nodes=(node("n1", 4), node("n2", 2)),
        queues=(queue("q", 6),),
        jobs=(
            job("np", "q", running("np-0", "n2", (0,)), preemptible=False, created=0),
            job("u", "q", running("u-0", "n1", (2,)), created=1),
            job("x", "q", running("x-0", "n1", (0, 1)), created=2),
            job("big", "q", pending("big-0", 2), created=3),
        ),
    )
    d = run_session(snap)
    assert evicted(d) == {"u-0": ("Consolidate", "big")}
    assert binds_by_job(d)["big"] == [("big-0", "n1", (2, 3))]
    assert "room kept for it on node n2" in d.evictions[0].reason


def test_consolidation_tries_another_node_when_the_moved_pods_cannot_be_placed_again() -> None:
    # n1 is found first (through its youngest pod x, 2 GPUs) but x could not
    # be placed again; n2's pod y (1 GPU) can move to n1's free GPU.
    snap = Snapshot(
        nodes=(node("n1", 4), node("n2", 3)),
        queues=(queue("q", 6),),
        jobs=(
            job("np1", "q", running("np1-0", "n1", (2,)), preemptible=False, created=0),
            job("np2", "q", running("np2-0", "n2", (2,)), preemptible=False, created=0),
            job("y", "q", running("y-0", "n2", (0,)), created=1),
            job("x", "q", running("x-0", "n1", (0, 1)), created=2),
            job("big", "q", pending("big-0", 2), created=3),
        ),
    )
    d = run_session(snap)
    # Free: n1 GPU 3, n2 GPU 1; big needs 2 on one node.
    assert evicted(d) == {"y-0": ("Consolidate", "big")}
    assert binds_by_job(d)["big"] == [("big-0", "n2", (0, 1))]


def test_a_failed_consolidation_is_explained() -> None:
    snap = Snapshot(
        nodes=(node("n1", 4), node("n2", 4)),
        queues=(queue("q", 8),),
        jobs=(
            job("s1", "q", running("s1-0", "n1", (0, 1, 2))),
            job("s2", "q", running("s2-0", "n2", (0, 1, 2))),
            job("big", "q", pending("big-0", 2)),
        ),
    )
    notes = " ".join(_messages(snap, "big"))
    assert "cannot consolidate: pool default has the room in total" in notes


# --------------------------------------------------------------------------
# Slices packed, elastic victims shrunk
# --------------------------------------------------------------------------


def test_consolidation_packs_two_half_gpu_slices_to_free_a_whole_gpu() -> None:
    snap = Snapshot(
        nodes=(node("n1", 2),),
        queues=(queue("q", 2),),
        jobs=(
            job("h0", "q", running("h0-0", "n1", (0,), annotations=fraction("x", 0.5).annotations), created=0),
            job("h1", "q", running("h1-0", "n1", (1,), annotations=fraction("x", 0.5).annotations), created=1),
            job("whole", "q", pending("whole-0", 1), created=2),
        ),
    )
    d = run_session(snap)
    assert evicted(d) == {"h1-0": ("Consolidate", "whole")}  # the youngest moves
    assert binds_by_job(d)["whole"] == [("whole-0", "n1", (1,))]
    (moved,) = (r for r in d.reservations if r.job == "default/h1")
    assert moved.gpu_indices == (0,) and moved.gpu_memory_mib == (40960,)


def test_an_elastic_victim_loses_only_its_pods_beyond_min_member() -> None:
    # "e" runs 3 pods with minMember 1; the high-priority job needs 2 GPUs.
    # Two of e's pods going is enough: e keeps running with one.
    snap = Snapshot(
        nodes=(node("n1", 4),),
        queues=(queue("q", 4),),
        jobs=(
            job("o", "q", running("o-0", "n1", (3,)), created=0),
            job(
                "e",
                "q",
                running("e-0", "n1", (0,)),
                running("e-1", "n1", (1,)),
                running("e-2", "n1", (2,)),
                min_member=1,
                created=1,
            ),
            job("hi", "q", pending("hi-0", 2), priority=50, created=2),
        ),
    )
    d = run_session(snap)
    assert evicted(d) == {"e-1": ("Preempt", "hi"), "e-2": ("Preempt", "hi")}
    assert binds_by_job(d)["hi"] == [("hi-0", "n1", (1, 2))]


def test_an_elastic_victim_goes_whole_when_shrinking_is_not_enough() -> None:
    snap = Snapshot(
        nodes=(node("n1", 3),),
        queues=(queue("q", 3),),
        jobs=(
            job("e", "q", *(running(f"e-{i}", "n1", (i,)) for i in range(3)), min_member=2, created=1),
            job("hi", "q", pending("hi-0", 3), priority=50, created=2),
        ),
    )
    d = run_session(snap)
    assert set(evicted(d)) == {"e-0", "e-1", "e-2"}


# --------------------------------------------------------------------------
# Quota is guaranteed
# --------------------------------------------------------------------------


def test_a_queue_below_its_quota_reclaims_from_one_holding_twice_its_own() -> None:
    # 32 GPUs, two queues with quota 10. A's gang of 2 x 10 GPUs runs on
    # two nodes; B's 10-GPU pod fits nowhere. Evicting A's gang takes A
    # below its fair share (20) but B is owed its quota: the gang goes.
    snap = Snapshot(
        nodes=(node("n1", 16), node("n2", 16)),
        queues=(queue("a", 10), queue("b", 10)),
        jobs=(
            job(
                "gang",
                "a",
                running("g-0", "n1", tuple(range(10))),
                running("g-1", "n2", tuple(range(10))),
                min_member=2,
                created=0,
            ),
            job("want", "b", pending("want-0", 10), created=1),
        ),
    )
    d = run_session(snap)
    assert evicted(d) == {"g-0": ("Reclaim", "want"), "g-1": ("Reclaim", "want")}
    assert "reclaims its guaranteed quota" in d.evictions[0].reason
    ((pod, _node, gpus),) = binds_by_job(d)["want"]
    assert pod == "want-0" and len(gpus) == 10


def test_the_victim_of_a_quota_reclaim_does_not_reclaim_back() -> None:
    # The session after: A's gang is pending again, B holds its quota.
    # A may not take B below its guarantee, so nothing moves.
    snap = Snapshot(
        nodes=(node("n1", 16), node("n2", 16)),
        queues=(queue("a", 10), queue("b", 10)),
        jobs=(
            job("gang", "a", pending("g-0", 10), pending("g-1", 10), min_member=2, created=0),
            job("want", "b", running("want-0", "n1", tuple(range(10))), created=1),
        ),
    )
    d = run_session(snap)
    assert not d.evictions
    assert pending_codes(d)["gang"] == "InsufficientResources"


def test_beyond_its_quota_a_queue_reclaims_only_down_to_the_victims_fair_share() -> None:
    # owed (quota 1, share 2) wants 2: past its quota, so the fair-share
    # rule applies, and greedy's only job (4 GPUs, share 2) cannot go.
    snap = Snapshot(
        nodes=(node("n1", 4),),
        queues=(queue("greedy", 1), queue("owed", 1)),
        jobs=(
            job("all", "greedy", running("all-0", "n1", (0, 1, 2, 3)), created=0),
            job("mine", "owed", pending("mine-0", 2), created=1),
        ),
    )
    d = run_session(snap)
    assert not d.evictions
    assert any("below its fair share" in m for p in d.pending for r in p.reasons for m in [r.message])


# --------------------------------------------------------------------------
# Allocation order and explanations
# --------------------------------------------------------------------------


def test_allocation_does_not_pass_a_share_on_a_name_tie_while_another_queue_fits() -> None:
    # Both queues hold nothing and deserve 2 of 4 GPUs. a's next job (3 GPUs)
    # would take it over its share; b's (2 GPUs) keeps b within. b goes
    # first, so nothing is placed only to be reclaimed in the same session.
    snap = Snapshot(
        nodes=(node("n1", 4),),
        queues=(queue("a", 2), queue("b", 2)),
        jobs=(
            job("a-big", "a", pending("a-big-0", 3), created=0),
            job("b-fits", "b", pending("b-fits-0", 2), created=1),
        ),
    )
    d = run_session(snap)
    assert not d.evictions
    assert "b-fits" in binds_by_job(d) and "a-big" not in binds_by_job(d)


def test_a_parent_holding_the_reclaimer_and_every_victim_is_not_blamed() -> None:
    # dept is over its fair share, but the only victims are in a2, under
    # dept too: taking from a2 would not change what dept holds, so the
    # reason must not name dept. (a2's pod is on a node where evicting it
    # would not make room, so the reclaim fails.)
    snap = Snapshot(
        nodes=(node("n1", 2), node("n2", 2)),
        queues=(
            queue("dept", 2),
            queue("other", 2),
            queue("a1", 2, parent="dept"),
            queue("a2", 0, parent="dept"),
        ),
        jobs=(
            job("np", "a2", running("np-0", "n1", (0, 1)), preemptible=False, created=0),
            job("p", "a2", running("p-0", "n2", (0,)), created=1),
            job("onp", "other", running("onp-0", "n2", (1,)), preemptible=False, created=0),
            job("want", "a1", pending("want-0", 2), created=2),
        ),
    )
    notes = " ".join(_messages(snap, "want"))
    assert "cannot reclaim" in notes
    assert "parent queue dept" not in notes


def test_the_queue_status_says_how_much_of_an_over_subscribed_quota_is_guaranteed() -> None:
    # Quotas of 6 + 6 on 8 GPUs: each queue is guaranteed 4, and says why.
    snap = Snapshot(
        nodes=(node("n1", 8),),
        queues=(queue("a", 6), queue("b", 6)),
        jobs=(
            job("a-all", "a", *(pending(f"a-{i}", 1) for i in range(8)), created=0),
            job("b-all", "b", *(pending(f"b-{i}", 1) for i in range(8)), created=1),
        ),
    )
    shares = {s.queue: s for s in run_session(snap).queue_shares}
    assert shares["b"].guaranteed.gpu == 4000
    assert shares["b"].guarantee_note == (
        "only 4 GPUs of its gpu quota of 6 GPUs is guaranteed (reclaim wins back no more): the quotas at this "
        "queue's level add up to 12 GPUs and the pool's healthy capacity is 8 GPUs"
    )


def test_a_quota_the_pool_backs_is_guaranteed_whole() -> None:
    snap = Snapshot(
        nodes=(node("n1", 8),),
        queues=(queue("a", 3), queue("b", 5)),
        jobs=(job("b-all", "b", *(pending(f"b-{i}", 1) for i in range(8)), created=1),),
    )
    shares = {s.queue: s for s in run_session(snap).queue_shares}
    assert shares["b"].guaranteed.gpu == 5000 and shares["b"].guarantee_note == ""
    # a asks for nothing: its quota promises nothing now, and nothing is said.
    assert shares["a"].guaranteed.gpu == 0 and shares["a"].guarantee_note == ""
