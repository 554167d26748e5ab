"""Allocate and placement: hand-written clusters with the expected binds."""

from __future__ import annotations

from gpuwarden.contract import LABEL_NODE_POOL, UnschedulableReason
from scheduler.engine.model import (
    Decisions,
    Gpu,
    Job,
    PlacementStrategy,
    Queue,
    QueueResource,
    SchedulerConfig,
    Snapshot,
    Taint,
    Toleration,
)
from scheduler.engine.session import run_session
from tests.scheduler.builders import (
    binds_by_job,
    fraction,
    gpu_mib,
    job,
    node,
    pending,
    pending_codes,
    queue,
    running,
)


def test_binpack_fills_the_fullest_node_that_fits() -> None:
    snap = Snapshot(
        nodes=(node("n1"), node("n2")),
        queues=(queue("q", 16),),
        jobs=(
            job("warm", "q", running("warm-0", "n2", (0, 1, 2, 3))),
            job("a", "q", pending("a-0", 2), created=1),
            job("b", "q", pending("b-0", 2), created=2),
        ),
    )
    binds = binds_by_job(run_session(snap))
    assert binds["a"] == [("a-0", "n2", (4, 5))]
    assert binds["b"] == [("b-0", "n2", (6, 7))]


def test_pod_without_gpus_holds_no_gpu_and_leaves_the_node_to_gpu_pods() -> None:
    snap = Snapshot(
        nodes=(node("n1"),),
        queues=(queue("q", 8),),
        jobs=(
            job("cpu", "q", pending("cpu-0"), created=1),
            *(job(f"g{i}", "q", pending(f"g{i}-0", 1), created=2 + i) for i in range(8)),
        ),
    )
    binds = binds_by_job(run_session(snap))
    assert binds["cpu"] == [("cpu-0", "n1", ())]
    assert sorted(b[0][2] for name, b in binds.items() if name != "cpu") == [(i,) for i in range(8)]


def test_spread_prefers_the_emptiest_node() -> None:
    snap = Snapshot(
        nodes=(node("n1"), node("n2")),
        queues=(queue("q", 16),),
        jobs=(
            job("warm", "q", running("warm-0", "n2", (0, 1, 2, 3))),
            job("a", "q", pending("a-0", 2), created=1),
            job("b", "q", pending("b-0", 2), created=2),
            job("c", "q", pending("c-0", 2), created=3),
        ),
        config=SchedulerConfig(default_strategy=PlacementStrategy.SPREAD),
    )
    binds = binds_by_job(run_session(snap))
    assert binds["a"][0][1] == "n1"
    assert binds["b"][0][1] == "n1"  # n1 6 free vs n2 4 free
    assert binds["c"][0][1] in {"n1", "n2"}


def test_gang_is_placed_whole_or_not_at_all() -> None:
    snap = Snapshot(
        nodes=(node("n1", 4), node("n2", 4)),
        queues=(queue("q", 8),),
        jobs=(
            job("big", "q", *[pending(f"big-{i}", 2) for i in range(5)], min_member=5, created=1),
            job("small", "q", *[pending(f"small-{i}", 2) for i in range(2)], min_member=2, created=2),
        ),
    )
    d = run_session(snap)
    binds = binds_by_job(d)
    assert "big" not in binds
    assert sorted(n for _, n, _ in binds["small"]) == ["n1", "n1"]
    reason = next(p for p in d.pending if p.job == "default/big").reasons[0]
    assert reason.code is UnschedulableReason.INSUFFICIENT_RESOURCES
    assert "the gang needs 10 GPUs for 5 pods" in reason.message


def test_a_cpu_only_pod_in_a_gang_holds_no_gpu_and_leaves_them_to_its_gang() -> None:
    # A RayJob's submitter (or a launcher) asks for no GPU; placed between
    # the head and the workers, it must not take the node's free GPUs from
    # the rest of its gang, nor name any.
    gang = [pending("ray-head", 2), pending("ray-submitter", 0), *[pending(f"ray-worker-{i}", 2) for i in range(3)]]
    snap = Snapshot(nodes=(node("n1", 8),), queues=(queue("q", 8),), jobs=(job("ray", "q", *gang, min_member=5),))
    binds = {pod: gpus for pod, _, gpus in binds_by_job(run_session(snap))["ray"]}
    assert set(binds) == {t.name for t in gang}
    assert binds["ray-submitter"] == ()
    assert sorted(g for gpus in binds.values() for g in gpus) == list(range(8))


def test_pending_reason_says_how_far_from_fitting() -> None:
    snap = Snapshot(
        nodes=(node("n1", 8), node("n2", 8)),
        queues=(queue("q", 16),),
        jobs=(
            job("warm", "q", running("warm-0", "n1", (0, 1, 2, 3)), priority=100),
            job("hot", "q", running("hot-0", "n2", (0, 1, 2)), priority=100),
            job("wide", "q", pending("wide-0", 6)),
        ),
    )
    message = next(p for p in run_session(snap).pending if p.job == "default/wide").reasons[0].message
    assert message.startswith("each pod needs 6 GPUs, 1 core, 1 GiB on one node; 0 of 2 eligible nodes")
    assert "(2 nodes with fewer than 6 free GPUs)" in message
    assert "the most free GPUs on one eligible node is 5" in message


def test_elastic_job_gets_gang_then_extras_while_they_fit() -> None:
    snap = Snapshot(
        nodes=(node("n1", 4),),
        queues=(queue("q", 8),),
        jobs=(job("el", "q", *[pending(f"el-{i}", 1) for i in range(6)], min_member=2),),
    )
    d = run_session(snap)
    assert len(binds_by_job(d)["el"]) == 4
    assert pending_codes(d)["el"] == "InsufficientResources"


def test_over_limit_names_queue_and_amount() -> None:
    snap = Snapshot(
        nodes=(node("n1"),),
        queues=(queue("dept", 8, gpu_limit=3), queue("team", 8, parent="dept")),
        jobs=(job("j", "team", pending("j-0", 4)),),
    )
    d = run_session(snap)
    assert not d.binds
    reason = d.pending[0].reasons[0]
    assert reason.code is UnschedulableReason.OVER_LIMIT
    assert "queue dept" in reason.message and "1 GPU over" in reason.message


def test_non_preemptible_work_stays_within_quota() -> None:
    snap = Snapshot(
        nodes=(node("n1"),),
        queues=(queue("q", 2),),
        jobs=(
            job("np1", "q", pending("np1-0", 2), priority=100, created=1),
            job("np2", "q", pending("np2-0", 1), priority=100, created=2),
            job("pre", "q", pending("pre-0", 4), priority=50, created=3),
        ),
    )
    d = run_session(snap)
    binds = binds_by_job(d)
    assert set(binds) == {"np1", "pre"}  # preemptible work may go over quota
    assert pending_codes(d)["np2"] == "NonPreemptibleOverQuota"


def test_explicit_preemptible_flag_beats_priority() -> None:
    snap = Snapshot(
        nodes=(node("n1"),),
        queues=(queue("q", 1),),
        jobs=(job("j", "q", pending("j-0", 4), priority=200, preemptible=True),),
    )
    assert binds_by_job(run_session(snap))["j"][0][1] == "n1"


def test_fractions_and_mib_slices_share_a_gpu_without_overcommit() -> None:
    snap = Snapshot(
        nodes=(node("n1", 1, gpu_mem=40000),),
        queues=(queue("q", 4),),
        jobs=(
            job("half", "q", fraction("half-0", 0.5), created=1),
            job("mib", "q", gpu_mib("mib-0", 15000), created=2),
            job("toomuch", "q", gpu_mib("toomuch-0", 6000), created=3),
            job("whole", "q", pending("whole-0", 1), created=4),
        ),
    )
    d = run_session(snap)
    binds = {b.pod: b for b in d.binds}
    assert binds["half-0"].gpu_indices == (0,) and binds["half-0"].gpu_memory_mib == (20000,)
    assert binds["mib-0"].gpu_indices == (0,) and binds["mib-0"].gpu_memory_mib == (15000,)
    codes = pending_codes(d)
    assert codes["toomuch"] == "InsufficientResources"  # 5000 MiB left, 6000 asked
    assert codes["whole"] == "InsufficientResources"  # whole GPUs take only empty GPUs


def test_multi_device_slice_takes_same_slice_on_n_gpus_of_one_node() -> None:
    snap = Snapshot(
        nodes=(node("n1", 2, gpu_mem=80000), node("n2", 4, gpu_mem=80000)),
        queues=(queue("q", 8),),
        jobs=(job("md", "q", fraction("md-0", 0.25, devices=3)),),
    )
    d = run_session(snap)
    (bind,) = d.binds
    assert bind.node == "n2"
    assert len(bind.gpu_indices) == 3 and bind.gpu_memory_mib == (20000, 20000, 20000)


def test_binpack_slices_fill_a_shared_gpu_first() -> None:
    snap = Snapshot(
        nodes=(node("n1", 2), node("n2", 2)),
        queues=(queue("q", 4),),
        jobs=(
            job("s1", "q", fraction("s1-0", 0.25), created=1),
            job("s2", "q", fraction("s2-0", 0.25), created=2),
            job("s3", "q", fraction("s3-0", 0.5), created=3),
        ),
    )
    d = run_session(snap)
    places = {(b.node, b.gpu_indices) for b in d.binds}
    assert places == {(d.binds[0].node, d.binds[0].gpu_indices)}


def test_mig_node_takes_no_slices_but_takes_whole_gpus() -> None:
    mig_gpus = tuple(Gpu(i, mig_enabled=(i == 0)) for i in range(2))
    snap = Snapshot(
        nodes=(node("mig", gpu_list=mig_gpus),),
        queues=(queue("q", 4),),
        jobs=(job("slice", "q", fraction("slice-0", 0.5)), job("whole", "q", pending("whole-0", 1))),
    )
    d = run_session(snap)
    # GPU 0 is in MIG mode: the whole-GPU pod gets GPU 1, never the MIG one.
    assert binds_by_job(d)["whole"] == [("whole-0", "mig", (1,))]
    reason = next(p for p in d.pending if p.job == "default/slice").reasons[0]
    assert reason.code is UnschedulableReason.NO_ELIGIBLE_NODES
    assert "MIG" in reason.message


def test_gpus_in_mig_mode_are_neither_placed_on_nor_counted_nor_evicted_from() -> None:
    all_mig = tuple(Gpu(i, mig_enabled=True) for i in range(2))
    snap = Snapshot(
        nodes=(node("mig", gpu_list=all_mig), node("plain", 1)),
        queues=(queue("q", 4),),
        jobs=(
            job("on-mig", "q", running("on-mig-0", "mig", (0,))),
            job("two", "q", pending("two-0", 2)),
        ),
    )
    d = run_session(snap)
    assert not d.binds and not d.evictions
    share = next(s for s in d.queue_shares if s.queue == "q")
    assert share.fair_share.gpu == 1000  # only the plain node's GPU
    assert "1 node with fewer than 2 free GPUs not in MIG mode" in d.pending[0].reasons[0].message


def test_never_on_unhealthy_gpu_cordoned_or_tainted_node() -> None:
    sick = tuple(Gpu(i, healthy=(i != 0)) for i in range(2))
    snap = Snapshot(
        nodes=(
            node("sick", gpu_list=sick),
            node("cordoned", 2, schedulable=False),
            node("tainted", 2, taints=(Taint("dedicated", "infer"),)),
        ),
        queues=(queue("q", 8),),
        jobs=(
            job("a", "q", pending("a-0", 1), created=1),
            job("b", "q", pending("b-0", 1), created=2),
            job("tol", "q", pending("tol-0", 2, tolerations=(Toleration("dedicated", "Equal", "infer"),)), created=3),
        ),
    )
    d = run_session(snap)
    binds = binds_by_job(d)
    assert binds["a"] == [("a-0", "sick", (1,))]
    assert binds["tol"] == [("tol-0", "tainted", (0, 1))]
    reason = next(p for p in d.pending if p.job == "default/b").reasons[0]
    assert "1 cordoned" in reason.message and "taint dedicated not tolerated" in reason.message


def test_node_selector_and_pools() -> None:
    gpu_pool = node("g1", 2, labels={LABEL_NODE_POOL: "gpu"}, pool="gpu")
    snap = Snapshot(
        nodes=(node("d1", 2, labels={"zone": "a"}), node("d2", 2, labels={"zone": "b"}), gpu_pool),
        queues=(queue("q", 8), queue("g", 8, pool="gpu")),
        jobs=(
            job("zb", "q", pending("zb-0", 1, node_selector={"zone": "b"})),
            job("gp", "g", pending("gp-0", 2)),
            job("nowhere", "q", pending("nowhere-0", 1, node_selector={"zone": "c"})),
        ),
    )
    d = run_session(snap)
    binds = binds_by_job(d)
    assert binds["zb"][0][1] == "d2"
    assert binds["gp"][0][1] == "g1"
    assert pending_codes(d)["nowhere"] == "NoEligibleNodes"


def test_queue_below_fair_share_goes_first() -> None:
    snap = Snapshot(
        nodes=(node("n1", 4),),
        queues=(queue("a", 2), queue("b", 2)),
        jobs=(
            job("a-run", "a", running("a-run-0", "n1", (0, 1))),
            job("a-new", "a", pending("a-new-0", 2), created=1),
            job("b-new", "b", pending("b-new-0", 2), created=2),
        ),
    )
    binds = binds_by_job(run_session(snap))
    assert set(binds) == {"b-new"}


def test_jobs_by_priority_then_age() -> None:
    snap = Snapshot(
        nodes=(node("n1", 2),),
        queues=(queue("q", 2),),
        jobs=(
            job("old-low", "q", pending("old-low-0", 2), priority=10, created=1),
            job("new-high", "q", pending("new-high-0", 2), priority=20, created=5),
        ),
    )
    assert set(binds_by_job(run_session(snap))) == {"new-high"}


def test_bad_input_is_reported_and_the_rest_scheduled() -> None:
    snap = Snapshot(
        nodes=(node("n1", 2),),
        queues=(queue("dept", 2), queue("team", 2, parent="dept")),
        jobs=(
            job("unknown", "ghost", pending("u-0", 1)),
            job("inner", "dept", pending("i-0", 1)),
            job("bad", "team", pending("bad-0", annotations={"gpu-fraction": "half"})),
            job("both", "team", fraction("both-0", 0.5, gpus=1)),
            job("stray", "team", running("stray-0", "no-such-node", (0,))),
            job("good", "team", pending("good-0", 1)),
        ),
    )
    d = run_session(snap)
    codes = pending_codes(d)
    assert codes["unknown"] == "UnknownQueue"
    assert codes["inner"] == "NotLeafQueue"
    assert codes["bad"] == "InvalidRequest"
    assert codes["both"] == "InvalidRequest"
    assert binds_by_job(d)["good"][0][1] == "n1"


def test_same_snapshot_same_decisions() -> None:
    jobs = tuple(job(f"j{i}", "q", pending(f"j{i}-0", 1 + i % 3), created=i % 4) for i in range(20))
    snap = Snapshot(nodes=tuple(node(f"n{i}", 4) for i in range(5)), queues=(queue("q", 8),), jobs=jobs)
    reordered = Snapshot(nodes=tuple(reversed(snap.nodes)), queues=snap.queues, jobs=tuple(reversed(jobs)))
    assert run_session(snap) == run_session(reordered)


def test_queue_resources_in_cpu_and_memory_are_limited_too() -> None:
    q = Queue("q", gpu=QueueResource(-1), cpu=QueueResource(0, 4000), memory=QueueResource(-1))
    snap = Snapshot(
        nodes=(node("n1", 0),),
        queues=(q,),
        jobs=(Job("cpu", "q", tasks=(pending("cpu-0", cpu=3), pending("cpu-1", cpu=3)), min_member=2),),
    )
    d = run_session(snap)
    assert pending_codes(d)["cpu"] == "OverLimit"
    assert "cpu limit of 4 cores" in d.pending[0].reasons[0].message


def test_selective_node_selector_scores_its_few_nodes() -> None:
    rack = {"rack": "r1"}
    nodes = [node(f"n{i:02d}", 4) for i in range(14)]
    nodes += [node("r1-a", 4, labels=rack), node("r1-b", 4, labels=rack)]
    snap = Snapshot(
        nodes=tuple(nodes),
        queues=(queue("q", 16),),
        jobs=(
            job("warm", "q", running("warm-0", "r1-b", (0, 1))),
            job("a", "q", pending("a-0", 1, node_selector=rack), created=1),
            job("big", "q", pending("big-0", 4, node_selector=rack), created=2),
            job("none", "q", pending("none-0", 1, node_selector={"rack": "r9"}), created=3),
        ),
    )
    d = run_session(snap)
    binds = binds_by_job(d)
    assert binds["a"] == [("a-0", "r1-b", (2,))]  # bin-pack: the fuller rack node
    assert binds["big"] == [("big-0", "r1-a", (0, 1, 2, 3))]
    assert pending_codes(d)["none"] == "NoEligibleNodes"
    reason = next(p for p in d.pending if p.job == "default/none").reasons[0]
    assert "16 node selector rack=r9 does not match" in reason.message


def test_queue_with_no_fair_share_is_not_below_it() -> None:
    snap = Snapshot(
        nodes=(node("n1", 2),),
        queues=(queue("a-zero", 0, weight=0), queue("b-owed", 2)),
        jobs=(
            job("z", "a-zero", pending("z-0", 2), created=1),
            job("o", "b-owed", pending("o-0", 2), created=2),
        ),
    )
    d = run_session(snap)
    assert set(binds_by_job(d)) == {"o"}


def _allocated_gpus(d: Decisions) -> dict[str, float]:
    return {s.queue: s.allocated.gpu / 1000 for s in d.queue_shares}


def test_extras_beyond_min_member_wait_for_queues_below_their_share() -> None:
    # 8 GPUs: a deserves 3, b 5. a's job could use all 8 but needs only 1.
    snap = Snapshot(
        nodes=(node("n1", 8),),
        queues=(queue("a", 3), queue("b", 5)),
        jobs=(
            job("elastic", "a", *[pending(f"elastic-{i}", 1) for i in range(8)], min_member=1, created=1),
            *(job(f"b{i}", "b", pending(f"b{i}-0", 1), created=2 + i) for i in range(5)),
        ),
    )
    d = run_session(snap)
    assert {s.queue: s.fair_share.gpu / 1000 for s in d.queue_shares} == {"a": 3, "b": 5}
    assert _allocated_gpus(d) == {"a": 3, "b": 5}
    assert not d.evictions


def test_extras_take_what_nobody_below_its_share_can_use() -> None:
    # b's pods fit nowhere, so its share stays unused: a's extras take it.
    snap = Snapshot(
        nodes=(node("n1", 8),),
        queues=(queue("a", 3), queue("b", 5)),
        jobs=(
            job("elastic", "a", *[pending(f"elastic-{i}", 1) for i in range(8)], min_member=1, created=1),
            *(
                job(f"b{i}", "b", pending(f"b{i}-0", 1, node_selector={"rack": "none"}), created=2 + i)
                for i in range(5)
            ),
        ),
    )
    d = run_session(snap)
    assert _allocated_gpus(d) == {"a": 8, "b": 0}
    assert pending_codes(d)["b0"] == "NoEligibleNodes"


def test_extras_above_share_are_shared_between_queues() -> None:
    # c deserves 4 but its pods fit nowhere; a and b are past their share of
    # 2 each, and the 4 GPUs c leaves unused go 2 and 2.
    snap = Snapshot(
        nodes=(node("n1", 8),),
        queues=(queue("a", 2), queue("b", 2), queue("c", 4, weight=0)),
        jobs=(
            job("ea", "a", *[pending(f"ea-{i}", 1) for i in range(8)], min_member=1, created=1),
            job("eb", "b", *[pending(f"eb-{i}", 1) for i in range(8)], min_member=1, created=2),
            *(
                job(f"c{i}", "c", pending(f"c{i}-0", 1, node_selector={"rack": "none"}), created=3 + i)
                for i in range(4)
            ),
        ),
    )
    d = run_session(snap)
    assert {s.queue: s.fair_share.gpu / 1000 for s in d.queue_shares} == {"a": 2, "b": 2, "c": 4}
    assert _allocated_gpus(d) == {"a": 4, "b": 4, "c": 0}


def test_a_queue_that_never_borrows_stays_within_quota_on_an_idle_cluster() -> None:
    # overQuotaWeight 0: no GPU beyond quota, however idle the cluster.
    snap = Snapshot(
        nodes=(node("n1", 8),),
        queues=(queue("none", 0, weight=0), queue("two", 2, weight=0)),
        jobs=(
            job("z", "none", pending("z-0", 1), created=1),
            job("t", "two", *[pending(f"t-{i}", 1) for i in range(4)], min_member=1, created=2),
            job("t2", "two", pending("t2-0", 1), created=3),
        ),
    )
    d = run_session(snap)
    assert _allocated_gpus(d) == {"none": 0, "two": 2}
    assert pending_codes(d) == {"z": "OverLimit", "t": "OverLimit", "t2": "OverLimit"}
    extras = next(p for p in d.pending if p.job == "default/t").reasons[0].message
    assert extras.startswith("gang of 1 is running; 2 more pods wait: queue two never borrows gpu")
    reason = next(p for p in d.pending if p.job == "default/z").reasons[0]
    assert "queue none never borrows gpu (overQuotaWeight 0)" in reason.message
    assert "quota of 0 GPUs is its limit" in reason.message


def test_a_parent_that_never_borrows_bounds_its_children() -> None:
    # The children borrow from each other, never beyond what the parent may hold.
    snap = Snapshot(
        nodes=(node("n1", 8),),
        queues=(queue("dept", 3, weight=0), queue("a", 1, parent="dept"), queue("b", 1, parent="dept")),
        jobs=(job("ea", "a", *[pending(f"ea-{i}", 1) for i in range(8)], min_member=1, created=1),),
    )
    d = run_session(snap)
    assert _allocated_gpus(d) == {"dept": 3, "a": 3, "b": 0}
    assert "queue dept never borrows gpu" in next(p for p in d.pending if p.job == "default/ea").reasons[0].message
