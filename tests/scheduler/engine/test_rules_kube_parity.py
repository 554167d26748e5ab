"""Placement rules where gpuwarden disagreed with kube-scheduler, each found by the oracle test.

tests/scheduler/cluster/test_placement_oracle_k8s.py runs gpuwarden's rules
against the upstream kube-scheduler on random clusters; each case it found
is kept here as a small hand-written cluster, with kube-scheduler's answer
(read off its source, pkg/scheduler/framework/plugins) as the expected one.
"""

from __future__ import annotations

from scheduler.engine.model import LabelSelector, Node, Placement, PodTerm, Requirement, Snapshot, SpreadConstraint
from scheduler.engine.rules import requirement_holds
from scheduler.engine.session import run_session
from tests.scheduler.builders import binds_by_job, job, node, pending, queue, running

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"


def _zones(a_gpus: int = 8, b_gpus: int = 8) -> tuple[Node, ...]:
    return (
        node("n-a", a_gpus, labels={ZONE: "a", "kubernetes.io/hostname": "n-a"}),
        node("n-b", b_gpus, labels={ZONE: "b", "kubernetes.io/hostname": "n-b"}),
    )


def test_a_spread_constraint_with_an_empty_selector_counts_no_pod() -> None:
    """kube-scheduler's countPodsMatchSelector returns 0 for an empty selector: the skew is always 1.

    Read as "every pod" instead, zone a (three pods) was 3 over zone b and
    the pod, which only zone a can hold (it needs a GPU), waited forever.
    """
    spread = SpreadConstraint(max_skew=1, topology_key=ZONE, hard=True, selector=LabelSelector())
    snap = Snapshot(
        nodes=_zones(b_gpus=0),
        queues=(queue("q", 8),),
        jobs=(
            job("old", "q", *(running(f"old-{i}", "n-a", (i,), labels={"app": "web"}) for i in range(3))),
            job(
                "new", "q", pending("new-0", 1, labels={"app": "db"}, placement=Placement(spread=(spread,))), created=1
            ),
        ),
    )
    assert binds_by_job(run_session(snap))["new"] == [("new-0", "n-a", (3,))]


def _app(*values: str) -> LabelSelector:
    return LabelSelector(match_labels=tuple(("app", v) for v in values))


def test_required_pod_affinity_needs_one_pod_that_matches_every_term() -> None:
    """kube-scheduler counts only bound pods that match all of a pod's affinity terms.

    "A db pod in my zone" and "a web pod on my node" were each satisfied
    by a different pod on n-a, so gpuwarden bound there; kube-scheduler
    finds no pod matching both and refuses every node (the pod does not
    match its own terms either). Once one pod matches both, n-a is right.
    """
    terms = (PodTerm(ZONE, _app("db")), PodTerm(HOST, LabelSelector(match_labels=(("tier", "front"),))))
    placement = Placement(affinity=terms)

    def session(*bound: dict[str, str]) -> dict[str, list[tuple[str, str, tuple[int, ...]]]]:
        snap = Snapshot(
            nodes=_zones(),
            queues=(queue("q", 16),),
            jobs=(
                job("old", "q", *(running(f"old-{i}", "n-a", (i,), labels=b) for i, b in enumerate(bound))),
                job("new", "q", pending("new-0", 1, labels={"app": "cache"}, placement=placement), created=1),
            ),
        )
        return binds_by_job(run_session(snap))

    assert "new" not in session({"app": "db"}, {"app": "web", "tier": "front"})
    assert session({"app": "db", "tier": "front"})["new"] == [("new-0", "n-a", (1,))]


def test_evicting_for_a_pod_still_honours_its_anti_affinity() -> None:
    """The victim search (preempt, reclaim, consolidate) checks the pod's placement rules, not only room.

    n-a is full: a db pod nobody may evict and a low-priority filler. The
    new pod keeps away from db pods on its node, so evicting the filler
    would make room it may not use; it must stay pending and nothing be
    evicted for it.
    """
    away = Placement(anti_affinity=(PodTerm(HOST, _app("db")),))
    snap = Snapshot(
        nodes=_zones()[:1],
        queues=(queue("q", 8),),
        jobs=(
            job("db", "q", running("db-0", "n-a", (0,), labels={"app": "db"}), priority=200, preemptible=False),
            job("filler", "q", running("filler-0", "n-a", tuple(range(1, 8)), labels={"app": "batch"})),
            job("new", "q", pending("new-0", 2, labels={"app": "web"}, placement=away), priority=50, created=1),
        ),
    )
    decisions = run_session(snap)
    assert "new" not in binds_by_job(decisions)
    assert decisions.evictions == ()


def test_a_resource_the_pod_does_not_request_is_not_checked() -> None:
    """kube-scheduler's NodeResourcesFit skips a resource the pod requests none of.

    Pods of other schedulers (bound by hand, by nodeName) may over-commit a
    node's memory; a pod that asks for CPU only still fits there.
    """
    snap = Snapshot(
        nodes=(node("n-a", 0, cpu=8, mem_gib=8),),
        queues=(queue("q"),),
        jobs=(
            job("big", "q", running("big-0", "n-a", (), cpu=1, mem_gib=12)),
            job("cpu", "q", pending("cpu-0", cpu=1, mem_gib=0), created=1),
            job("mem", "q", pending("mem-0", cpu=1, mem_gib=1), created=2),
        ),
    )
    decisions = run_session(snap)
    assert binds_by_job(decisions) == {"cpu": [("cpu-0", "n-a", ())]}
    assert decisions.evictions == ()


def test_spread_counts_only_nodes_with_every_hard_topology_key() -> None:
    """kube-scheduler's PodTopologySpread counts a node only if it has the keys of all hard constraints.

    The pod spreads over zones (skew 1) and racks. n-2 has no rack label,
    so its five web pods do not count in zone a: zone a holds 0 and zone b
    3, and only n-1 keeps the skew. Counting them made zone a 5 and sent
    the pod to zone b, 4 over zone a in kube-scheduler's count.
    """
    rack = "example.com/rack"
    web = LabelSelector(match_labels=(("app", "web"),))
    spread = (
        SpreadConstraint(max_skew=1, topology_key=ZONE, hard=True, selector=web),
        SpreadConstraint(max_skew=10, topology_key=rack, hard=True, selector=web),
    )
    nodes = (
        node("n-1", labels={ZONE: "a", rack: "r1"}),
        node("n-2", labels={ZONE: "a"}),
        node("n-3", labels={ZONE: "b", rack: "r2"}),
    )
    on = {"n-2": 5, "n-3": 3}
    old = [running(f"old-{n}-{i}", n, (), labels={"app": "web"}) for n, count in on.items() for i in range(count)]
    snap = Snapshot(
        nodes=nodes,
        queues=(queue("q"),),
        jobs=(
            job("old", "q", *old),
            job("new", "q", pending("new-0", labels={"app": "web"}, placement=Placement(spread=spread)), created=1),
        ),
    )
    assert binds_by_job(run_session(snap))["new"] == [("new-0", "n-1", ())]


def test_gt_and_lt_read_label_values_as_kubernetes_parses_them() -> None:
    """Kubernetes compares Gt/Lt with strconv.ParseInt (base 10, int64); anything else fails the requirement."""
    gt = Requirement("gen", "Gt", ("5",))
    assert requirement_holds(gt, {"gen": "10"})
    assert requirement_holds(gt, {"gen": "+06"})
    assert not requirement_holds(gt, {"gen": "1_0"})
    assert not requirement_holds(gt, {"gen": "\u0661\u0660"})  # Arabic-Indic "10"
    assert not requirement_holds(gt, {"gen": str(2**63)})
    assert requirement_holds(Requirement("gen", "Lt", ("-3",)), {"gen": str(-(2**63))})
    assert not requirement_holds(Requirement("gen", "Lt", ("1_0",)), {"gen": "3"})
