"""Kubernetes placement rules in the engine: each rule, the session's own placements, kept state.

The differential test against the real kube-scheduler is
tests/scheduler/cluster/test_placement_oracle_k8s.py; these pin down one
rule each, on clusters small enough to read.
"""

from __future__ import annotations

from scheduler.engine.incremental import Engine
from scheduler.engine.model import (
    HostPort,
    Job,
    LabelSelector,
    Node,
    NodeTerm,
    Placement,
    PodTerm,
    Requirement,
    Snapshot,
    SpreadConstraint,
    Taint,
    TaintEffect,
    Task,
    TaskStatus,
)
from scheduler.engine.session import run_session
from tests.scheduler.builders import binds_by_job, job, node, pending, pending_codes, queue, running

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"
PRODUCT = "nvidia.com/gpu.product"


def _node(name: str, zone: str = "a", gpus: int = 8, **labels: str) -> Node:
    return node(name, gpus, labels={HOST: name, ZONE: zone, **labels})


def _where(decisions: object) -> dict[str, str]:
    """pod -> node of every bind."""
    return {pod: n for binds in binds_by_job(decisions).values() for pod, n, _ in binds}  # type: ignore[arg-type]


def _run(nodes: list[Node], *jobs: Job, **kw: object) -> object:
    return run_session(Snapshot(nodes=tuple(nodes), queues=(queue("q"),), jobs=tuple(jobs), **kw))  # type: ignore[arg-type]


def _app(value: str) -> LabelSelector:
    return LabelSelector(match_labels=(("app", value),))


def test_required_node_affinity_keeps_an_h100_pod_off_a100_nodes() -> None:
    """Bin-packing prefers the fuller A100 node; the pod's affinity names H100s only."""
    a100 = _node("a100", **{PRODUCT: "NVIDIA-A100-SXM4-80GB"})
    h100 = _node("h100", **{PRODUCT: "NVIDIA-H100-80GB-HBM3"})
    filler = job("filler", "q", running("f", "a100", tuple(range(6)), gpus=6))
    wants = Placement(node_terms=(NodeTerm(expressions=(Requirement(PRODUCT, "In", ("NVIDIA-H100-80GB-HBM3",)),)),))
    pod = job("train", "q", pending("p", 2, placement=wants))
    assert _where(_run([a100, h100], filler, pod)) == {"p": "h100"}


def test_node_affinity_operators_and_match_fields() -> None:
    nodes = [_node("n1", rank="3"), _node("n2", rank="10"), _node("n3")]
    gt = Placement(node_terms=(NodeTerm(expressions=(Requirement("rank", "Gt", ("5",)),)),))
    absent = Placement(node_terms=(NodeTerm(expressions=(Requirement("rank", "DoesNotExist"),)),))
    named = Placement(node_terms=(NodeTerm(fields=(Requirement("metadata.name", "In", ("n1",)),)),))
    # Terms are ORed: a term that matches nothing (empty) does not stop another from matching.
    either = Placement(node_terms=(NodeTerm(), NodeTerm(expressions=(Requirement("rank", "NotIn", ("3", "10")),))))
    decided = _where(
        _run(
            nodes,
            job("gt", "q", pending("gt", 1, placement=gt)),
            job("absent", "q", pending("absent", 1, placement=absent)),
            job("named", "q", pending("named", 1, placement=named)),
            job("either", "q", pending("either", 1, placement=either)),
        )
    )
    assert decided == {"gt": "n2", "absent": "n3", "named": "n1", "either": "n3"}


def test_a_gang_with_anti_affinity_to_itself_lands_on_distinct_nodes_or_not_at_all() -> None:
    apart = Placement(anti_affinity=(PodTerm(HOST, _app("ring")),))

    def gang(size: int) -> Job:
        tasks = [pending(f"w{i}", 1, labels={"app": "ring"}, placement=apart) for i in range(size)]
        return job("ring", "q", *tasks, min_member=size)

    three = _where(_run([_node("n1"), _node("n2"), _node("n3")], gang(3)))
    assert sorted(three.values()) == ["n1", "n2", "n3"]
    decisions = _run([_node("n1"), _node("n2")], gang(3))
    assert _where(decisions) == {}
    assert pending_codes(decisions)["ring"] == "InsufficientResources"
    (status,) = decisions.pending  # type: ignore[attr-defined]
    assert "keep apart by kubernetes.io/hostname: the gang needs 3 distinct domains" in status.reasons[0].message


def test_a_pending_reason_counts_the_nodes_each_rule_refuses() -> None:
    guard = running(
        "guard", "a1", (0,), labels={"app": "db"}, placement=Placement(anti_affinity=(PodTerm(ZONE, _app("web")),))
    )
    nodes = [_node("a1", "a"), _node("a2", "a"), _node("b1", "b")]
    full = job("full", "q", running("f", "b1", tuple(range(8)), gpus=8), preemptible=False)
    decisions = _run(
        nodes, job("db", "q", guard, preemptible=False), full, job("web", "q", pending("web", 1, labels={"app": "web"}))
    )
    (status,) = decisions.pending  # type: ignore[attr-defined]
    message = status.reasons[0].message
    assert "2 nodes with pod anti-affinity (topology.kubernetes.io/zone=a)" in message
    assert "1 node with fewer than 1 free GPUs" in message


def test_a_bound_pods_anti_affinity_keeps_matching_pods_out_of_its_zone() -> None:
    """The newcomer says nothing; the pod already running in zone a does (kube-scheduler's symmetry)."""
    guard = running(
        "guard", "a1", (0,), labels={"app": "db"}, placement=Placement(anti_affinity=(PodTerm(ZONE, _app("web")),))
    )
    nodes = [_node("a1", "a"), _node("a2", "a"), _node("b1", "b")]
    filler = job("filler", "q", running("f", "a2", tuple(range(7)), gpus=7))  # bin-packing would pick a2
    web = job("web", "q", pending("web", 1, labels={"app": "web"}))
    other = job("other", "q", pending("other", 1, labels={"app": "batch"}))
    assert _where(_run(nodes, job("db", "q", guard), filler, web, other)) == {"web": "b1", "other": "a2"}


def test_pod_affinity_follows_the_matching_pod_and_lets_the_first_of_a_group_start() -> None:
    nodes = [_node("a1", "a"), _node("b1", "b")]
    cache = job("cache", "q", running("cache", "b1", (0,), labels={"app": "cache"}))
    near = Placement(affinity=(PodTerm(ZONE, _app("cache")),))
    filler = job("filler", "q", running("f", "a1", tuple(range(6)), gpus=6))
    assert _where(_run(nodes, cache, filler, job("client", "q", pending("client", 1, placement=near)))) == {
        "client": "b1"
    }
    # No pod matches anywhere: a pod that matches its own term may go anywhere with the key.
    self_group = Placement(affinity=(PodTerm(ZONE, _app("group")),))
    first = job("first", "q", pending("first", 1, labels={"app": "group"}, placement=self_group))
    assert set(_where(_run(nodes, first)).values()) <= {"a1", "b1"}
    assert _where(_run(nodes, first))
    # One that does not match its own term waits.
    stranger = job("stranger", "q", pending("stranger", 1, labels={"app": "other"}, placement=self_group))
    assert _where(_run(nodes, stranger)) == {}


def test_pod_affinity_counts_pods_placed_earlier_in_the_same_session() -> None:
    """A gang's second member follows the first into its zone."""
    nodes = [_node("a1", "a"), _node("b1", "b"), _node("b2", "b")]
    filler = job("filler", "q", running("f", "b2", tuple(range(7)), gpus=7))
    together = Placement(affinity=(PodTerm(ZONE, _app("pair")),))
    tasks = [pending(f"m{i}", 4, labels={"app": "pair"}, placement=together) for i in range(2)]
    where = _where(_run(nodes, filler, job("pair", "q", *tasks, min_member=2)))
    zones = {"a1": "a", "b1": "b", "b2": "b"}
    assert len(where) == 2 and len({zones[n] for n in where.values()}) == 1


def test_hard_topology_spread_keeps_the_skew_and_counts_domains_below_min_domains_as_empty() -> None:
    nodes = [_node("a1", "a"), _node("a2", "a"), _node("b1", "b")]
    existing = job(
        "old", "q", running("o1", "a1", (0,), labels={"app": "s"}), running("o2", "a2", (0,), labels={"app": "s"})
    )
    spread = Placement(spread=(SpreadConstraint(1, ZONE, True, _app("s")),))
    new = job("new", "q", pending("n", 1, labels={"app": "s"}, placement=spread))
    assert _where(_run(nodes, existing, new)) == {"n": "b1"}
    # Three domains wanted, two exist: the minimum reads 0, so zone b (1 pod) takes one more only
    # while its count + 1 - 0 <= maxSkew.
    one_each = job(
        "old",
        "q",
        running("o1", "a1", (0,), labels={"app": "s"}),
        running("o3", "b1", (0,), labels={"app": "s"}),
        preemptible=False,  # nothing to move: this is about allocation alone
    )
    wide = Placement(spread=(SpreadConstraint(1, ZONE, True, _app("s"), min_domains=3),))
    decided = _run(nodes, one_each, job("new", "q", pending("n", 1, labels={"app": "s"}, placement=wide)))
    assert _where(decided) == {}


def test_spread_ignores_terminating_pods_and_nodes_without_the_key() -> None:
    nodes = [_node("a1", "a"), _node("b1", "b"), node("bare", 8, labels={HOST: "bare"})]
    leaving = Task(
        name="o1",
        status=TaskStatus.RELEASING,
        node="b1",
        gpus=1,
        gpu_indices=(0,),
        labels={"app": "s"},
        terminating=True,
    )
    staying = running("o2", "a1", (0,), labels={"app": "s"})
    spread = Placement(spread=(SpreadConstraint(1, ZONE, True, _app("s")),))
    decided = _run(
        nodes,
        job("old", "q", leaving, staying),
        job("new", "q", pending("n", 1, labels={"app": "s"}, placement=spread)),
    )
    assert _where(decided) == {"n": "b1"}


def test_host_ports_other_resources_and_the_pod_limit() -> None:
    port = Placement(ports=(HostPort(8080),))
    nodes = [
        Node(name="n1", cpu_milli=64000, memory_mib=65536, labels={HOST: "n1"}, extended={"example.com/foo": 2000}),
        Node(name="n2", cpu_milli=64000, memory_mib=65536, labels={HOST: "n2"}, max_pods=1),
    ]
    holder = job("holder", "q", running("h", "n1", (), placement=Placement(ports=(HostPort(8080, ip="10.0.0.1"),))))
    # 0.0.0.0 conflicts with every address on the port; n2 has room for one pod only.
    first = job("first", "q", pending("first", placement=port))
    second = job("second", "q", pending("second", placement=port))
    decided = _run(nodes, holder, first, second)
    assert _where(decided) == {"first": "n2"}
    # Another protocol on the same port does not conflict.
    udp = job("udp", "q", pending("udp", placement=Placement(ports=(HostPort(8080, "UDP"),))))
    assert _where(_run(nodes[:1], holder, udp)) == {"udp": "n1"}
    # Extended resources: 2 of example.com/foo on n1, asked 1.5 twice.
    foo = [job(f"foo{i}", "q", pending(f"foo{i}", extended=(("example.com/foo", 1500),))) for i in range(2)]
    assert _where(_run(nodes, *foo)) == {"foo0": "n1"}


def test_preferred_node_affinity_and_untolerated_prefer_no_schedule_rank_equal_nodes() -> None:
    plain = [_node(f"n{i}", "a") for i in range(4)]
    tainted = Node(
        name="t",
        cpu_milli=128000,
        memory_mib=1 << 20,
        gpus=plain[0].gpus,
        labels={HOST: "t", ZONE: "a", "fast": "yes"},
        taints=(Taint("spot", "", TaintEffect.PREFER_NO_SCHEDULE),),
    )
    fast = _node("fast", "a", fast="yes")
    likes = Placement(preferred_nodes=((50, NodeTerm(expressions=(Requirement("fast", "In", ("yes",)),))),))
    decided = _run([*plain, tainted, fast], job("p", "q", pending("p", 1, placement=likes)))
    assert _where(decided) == {"p": "fast"}


def test_preferred_pod_anti_affinity_spreads_replicas() -> None:
    nodes = [_node(f"n{i}", "a") for i in range(3)]
    away = Placement(preferred_anti_affinity=((100, PodTerm(HOST, _app("rep"))),))
    replicas = [job(f"r{i}", "q", pending(f"r{i}", 1, labels={"app": "rep"}, placement=away)) for i in range(3)]
    assert sorted(_where(_run(nodes, *replicas)).values()) == ["n0", "n1", "n2"]


def test_other_schedulers_pods_on_nodes_that_take_no_work_still_count() -> None:
    """A bystander on a cordoned node of zone a holds the zone for its anti-affinity."""
    cordoned = Node(name="a0", labels={HOST: "a0", ZONE: "a"}, schedulable=False)
    bystander = Task(
        name="guard",
        namespace="other",
        status=TaskStatus.RELEASING,
        node="a0",
        labels={"app": "db"},
        placement=Placement(anti_affinity=(PodTerm(ZONE, _app("web"), all_namespaces=True),)),
    )
    nodes = [cordoned, _node("a1", "a"), _node("b1", "b")]
    filler = job("filler", "q", running("f", "a1", tuple(range(7)), gpus=7))
    web = job("web", "q", pending("web", 1, labels={"app": "web"}))
    assert _where(_run(nodes, filler, web, bystanders=(bystander,))) == {"web": "b1"}


def test_unplaceable_rules_wait_with_their_reason() -> None:
    pod = job("p", "q", pending("p", 1, unplaceable="podAffinity: a namespaceSelector with labels"))
    decisions = _run([_node("n1")], pod)
    assert _where(decisions) == {}
    assert pending_codes(decisions)["p"] == "UnsupportedPlacement"


def test_rules_hold_across_sessions_of_kept_state() -> None:
    """The index of bound pods is the session's: a kept state must not remember the last one's."""
    apart = Placement(anti_affinity=(PodTerm(HOST, _app("x")),))
    nodes = (_node("n1"), _node("n2"))
    engine = Engine()
    first = job("a", "q", running("a", "n1", (0,), labels={"app": "x"}, placement=apart))
    snap = Snapshot(
        nodes=nodes, queues=(queue("q"),), jobs=(first, job("b", "q", pending("b", 1, labels={"app": "x"})))
    )
    assert _where(engine.run(snap)) == {"b": "n2"}
    # b now runs on n2: c, which keeps away from app=x pods, has no node left.
    bound = job("b", "q", running("b", "n2", (0,), labels={"app": "x"}))
    third = job("c", "q", pending("c", 1, labels={"app": "x"}, placement=apart))
    snap2 = Snapshot(nodes=nodes, queues=(queue("q"),), jobs=(first, bound, third))
    decided = engine.run(snap2)
    assert _where(decided) == {}
    assert engine.updates == 1


def test_the_victim_search_judges_rules_after_its_evictions() -> None:
    """Evicting the cheapest victim on n1 frees its GPUs, but a pod there that stays keeps p out."""
    keep_out = Placement(anti_affinity=(PodTerm(HOST, _app("x")),))
    guard = job("guard", "q", running("guard", "n1", (), labels={"app": "x"}), preemptible=False)
    cheap = job("cheap", "q", running("cheap", "n1", tuple(range(8)), gpus=8), priority=0)
    dear = job("dear", "q", running("dear", "n2", tuple(range(8)), gpus=8), priority=10)
    urgent = job("urgent", "q", pending("p", 8, placement=keep_out), priority=50)
    decisions = _run([_node("n1"), _node("n2")], guard, cheap, dear, urgent)
    assert {e.pod for e in decisions.evictions} == {"dear"}  # type: ignore[attr-defined]
