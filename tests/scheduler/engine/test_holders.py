"""The kubelet's word on which GPU a pod holds wins over gpuwarden's assignment: the pure rules.

Health eviction, the accounting of other schedulers' pods and the drain of
one GPU read a pod's GPUs through :mod:`scheduler.engine.holders`; these
tests hold them to it on hand-written clusters and on generated ones.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.contract import Action, ConditionType, xid_reason
from scheduler.engine.holders import held_gpus, holder_key, kubelet_gpus, misplaced_on
from scheduler.engine.incremental import Engine
from scheduler.engine.model import Gpu, Job, Node, NodeCondition, Snapshot, Task, TaskStatus
from scheduler.engine.scoring import TRAP_LOOKAHEAD
from scheduler.engine.session import run_session
from tests.scheduler.builders import job, node, queue, running


def _xid(*gpus: int) -> NodeCondition:
    return NodeCondition(ConditionType.GPU_XID_ERROR.value, True, xid_reason(79), "", Action.RESET_GPU, gpus)


def test_a_listed_pod_holds_what_the_kubelet_says_and_an_unlisted_one_its_assignment() -> None:
    n = node("n1", kubelet_holders={"uid-a": (5,), holder_key("default", "b"): (1,)})
    a = running("a", "n1", (2,))
    b = replace(running("b", "n1", (3,)), uid="")
    c = running("c", "n1", (4,))
    assert kubelet_gpus(n, a) == (5,)
    assert held_gpus(n, a, whole=True) == (5,)
    assert held_gpus(n, b, whole=True) == (1,), "a holder without uid is matched by name"
    assert held_gpus(n, c, whole=True) == (4,), "not listed: the assignment stands"
    assert held_gpus(n, a, whole=False) == (2,), "a slice's device is gpuwarden's own"
    assert kubelet_gpus(node("n2"), a) is None, "no mapping published"


def test_a_holder_with_a_uid_is_never_matched_by_name() -> None:
    # A StatefulSet pod recreated under its old name: the kubelet lists the old UID.
    n = node("n1", kubelet_holders={"uid-old": (5,)})
    assert kubelet_gpus(n, running("a", "n1", (2,))) is None


def test_misplaced_names_only_gpus_out_of_service_that_were_not_assigned() -> None:
    n = node("n1", kubelet_holders={"uid-a": (5,), "uid-b": (3,)})
    usable = frozenset(range(8)) - {3, 5}
    assert misplaced_on(n, running("a", "n1", (2,)), usable) == (5,)
    assert misplaced_on(n, running("b", "n1", (3,)), usable) == (), "assigned there: it failed under the pod"
    assert misplaced_on(n, running("c", "n1", (1,)), usable) == (), "not listed"


def test_an_xid_on_gpu_5_evicts_the_pod_the_kubelet_reports_there_not_the_one_assigned_there() -> None:
    # gpuwarden assigned a to GPU 2 and b to GPU 5; the kubelet gave a GPU 5 and b GPU 2.
    n = node("n1", conditions=(_xid(5),), kubelet_holders={"uid-a": (5,), "uid-b": (2,)})
    snap = Snapshot(
        nodes=(n,),
        queues=(queue("q", 8),),
        jobs=(job("a", "q", running("a", "n1", (2,))), job("b", "q", running("b", "n1", (5,)))),
    )
    decisions = run_session(snap)
    assert [(e.pod, e.action.value) for e in decisions.evictions] == [("a", "HealthEviction")]
    assert "GPU 5" in decisions.evictions[0].reason


def test_without_a_mapping_health_eviction_reads_the_assignment_as_before() -> None:
    n = node("n1", conditions=(_xid(5),))
    snap = Snapshot(
        nodes=(n,),
        queues=(queue("q", 8),),
        jobs=(job("a", "q", running("a", "n1", (2,))), job("b", "q", running("b", "n1", (5,)))),
    )
    assert [e.pod for e in run_session(snap).evictions] == ["b"]


def test_the_gang_of_the_pod_the_kubelet_reports_on_the_faulty_gpu_leaves_whole() -> None:
    n = node("n1", conditions=(_xid(5),), kubelet_holders={"uid-g0": (5,), "uid-g1": (1,), "uid-s": (0,)})
    gang = job("g", "q", running("g0", "n1", (0,)), running("g1", "n1", (1,)), min_member=2)
    solo = job("s", "q", running("s", "n1", (5,)))
    decisions = run_session(Snapshot(nodes=(n,), queues=(queue("q", 8),), jobs=(gang, solo)))
    assert sorted(e.pod for e in decisions.evictions) == ["g0", "g1"]


@st.composite
def _clusters(draw: st.DrawFn) -> tuple[Snapshot, int, dict[str, tuple[int, ...]]]:
    """One 8-GPU node, one-GPU pods whose assignment and kubelet GPUs are independent permutations."""
    count = draw(st.integers(1, 8))
    assigned = draw(st.permutations(range(8)))[:count]
    real = draw(st.permutations(range(8)))[:count]
    listed = draw(st.lists(st.booleans(), min_size=count, max_size=count))
    holders = {f"uid-p{i}": (real[i],) for i in range(count) if listed[i]}
    bad = draw(st.integers(0, 7))
    n = node("n1", conditions=(_xid(bad),), kubelet_holders=holders or None)
    jobs = tuple(job(f"p{i}", "q", running(f"p{i}", "n1", (assigned[i],))) for i in range(count))
    # An unlisted pod holds its assignment unless the kubelet reports another
    # pod there: then where it is is a guess (empty here).
    reported = {real[i] for i in range(count) if listed[i]}
    truth = {
        f"p{i}": (real[i],) if listed[i] else () if assigned[i] in reported else (assigned[i],) for i in range(count)
    }
    return Snapshot(nodes=(n,), queues=(queue("q", 8),), jobs=jobs), bad, truth


@settings(max_examples=60, deadline=None)
@given(_clusters())
def test_health_eviction_takes_exactly_the_pods_whose_gpus_per_the_rule_include_the_faulty_one(
    case: tuple[Snapshot, int, dict[str, tuple[int, ...]]],
) -> None:
    snap, bad, truth = case
    expected = {p for p, gpus in truth.items() if bad in gpus}
    guessed = {p for p, gpus in truth.items() if not gpus}
    # Both the one-shot session and the kept-state engine read the rule; a
    # guessed pod goes to the faulty GPU only when no healthy one is left.
    for decisions in (run_session(snap), Engine().run(snap)):
        evicted = {e.pod for e in decisions.evictions}
        assert expected <= evicted <= expected | guessed


@settings(max_examples=40, deadline=None)
@given(_clusters())
def test_the_kept_state_engine_follows_a_mapping_that_arrives_later(
    case: tuple[Snapshot, int, dict[str, tuple[int, ...]]],
) -> None:
    """A pod bound before the kubelet reported it: first the assignment, then the kubelet's word."""
    snap, bad, truth = case
    engine = Engine()
    first = replace(snap, nodes=(replace(snap.nodes[0], kubelet_holders=None, conditions=()),))
    assert engine.run(first).evictions == ()
    expected = {p for p, gpus in truth.items() if bad in gpus}
    guessed = {p for p, gpus in truth.items() if not gpus}
    assert expected <= {e.pod for e in engine.run(snap).evictions} <= expected | guessed


def test_a_node_that_lists_a_gpu_the_plugin_offers_keeps_it_in_the_model() -> None:
    n = node("n1", gpu_list=(Gpu(0, offered=True), Gpu(1, offered=False), Gpu(2)))
    assert [g.offered for g in n.gpus] == [True, False, None]


def test_a_pending_pod_is_never_seated_by_the_mapping() -> None:
    n = node("n1", kubelet_holders={"uid-a": (5,)})
    pending = Task(name="a", uid="uid-a", status=TaskStatus.PENDING, gpus=1)
    snap = Snapshot(nodes=(n,), queues=(queue("q", 8),), jobs=(job("a", "q", pending),))
    (bind,) = run_session(snap).binds
    assert bind.node == "n1"


def test_a_pod_the_device_manager_put_on_a_quarantined_gpu_is_evicted_with_room_held_off_that_node() -> None:
    # GPU 0 of n1 is quarantined (unhealthy) but offered; gpuwarden assigned GPU 1, the kubelet chose GPU 0.
    gpus = (Gpu(0, healthy=False, offered=True), *(Gpu(i, offered=True) for i in range(1, 8)))
    n1 = node("n1", gpu_list=gpus, kubelet_holders={"uid-a": (0,)})
    n2 = node("n2")
    snap = Snapshot(nodes=(n1, n2), queues=(queue("q", 16),), jobs=(job("a", "q", running("a", "n1", (1,))),))
    decisions = run_session(snap)
    (ev,) = decisions.evictions
    assert ev.pod == "a"
    assert "GPU 0 on node n1" in ev.reason
    assert "device manager" in ev.reason and "assigned GPU 1" in ev.reason
    # Binpack would pick n1 again (fewer free GPUs); its device manager might choose GPU 0 again.
    assert [(r.job, r.node) for r in decisions.reservations] == [("default/a", "n2")]


def test_a_pod_whose_assigned_gpu_failed_under_it_gets_no_misplacement_note() -> None:
    gpus = (Gpu(0, healthy=False, offered=True), *(Gpu(i) for i in range(1, 8)))
    n1 = node("n1", gpu_list=gpus, kubelet_holders={"uid-a": (0,)})
    snap = Snapshot(nodes=(n1,), queues=(queue("q", 8),), jobs=(job("a", "q", running("a", "n1", (0,))),))
    (ev,) = run_session(snap).evictions
    assert "device manager" not in ev.reason
    assert run_session(snap).reservations == ()


def test_a_gpu_that_failed_after_the_kubelet_chose_it_is_not_a_misplacement() -> None:
    # The kubelet chose GPU 0 (healthy then) for a pod gpuwarden had assigned GPU 1; GPU 0 failed later.
    started = 1_796_119_200.0  # 2026-12-01T10:00:00Z
    later = Gpu(0, healthy=False, offered=True, faulted_since=1_796_119_200.0 + 600)
    n1 = node("n1", gpu_list=(later, *(Gpu(i, offered=True) for i in range(1, 8))), kubelet_holders={"uid-a": (0,)})
    pod = replace(running("a", "n1", (1,)), started=started)
    snap = Snapshot(nodes=(n1, node("n2")), queues=(queue("q", 16),), jobs=(job("a", "q", pod),))
    (ev,) = run_session(snap).evictions
    assert ev.pod == "a" and "GPU 0 on node n1" in ev.reason, "it is on the faulty GPU: it goes"
    assert "device manager" not in ev.reason, "the device manager chose a healthy GPU; it failed under the pod"
    assert run_session(snap).reservations == ()


@given(
    offset=st.floats(min_value=-86_400, max_value=86_400, allow_nan=False),
    dated=st.booleans(),
    started=st.booleans(),
)
def test_a_misplacement_is_a_fault_older_than_the_pod(offset: float, dated: bool, started: bool) -> None:
    start = 1_796_119_200.0  # 2026-12-01T10:00:00Z
    since = start + offset if dated else None
    gpus = (Gpu(0, healthy=False, offered=True, faulted_since=since), *(Gpu(i) for i in range(1, 8)))
    n = node("n1", gpu_list=gpus, kubelet_holders={"uid-a": (0,)})
    pod = replace(running("a", "n1", (1,)), started=start if started else None)
    usable = frozenset(range(1, 8))
    # Unknown either way, or a fault from before the pod (or within the second
    # the kubelet rounds its start to): the device manager chose a GPU out of service.
    expect = (0,) if not (dated and started) or offset < 1.0 else ()
    assert misplaced_on(n, pod, usable) == expect


def _trap_node(name: str, held: int, *, offered: bool | None = True) -> tuple[Node, tuple[Job, ...]]:
    """An 8-GPU node whose GPU 0 is quarantined (offered or not by the device plugin), ``held`` others in use."""
    gpus = (Gpu(0, healthy=False, offered=offered), *(Gpu(i, offered=offered) for i in range(1, 8)))
    jobs = tuple(job(f"{name}-r{i}", "q", running(f"{name}-r{i}", name, (i,))) for i in range(1, 1 + held))
    return node(name, gpu_list=gpus), jobs


def test_placement_keeps_a_free_healthy_gpu_on_a_node_whose_bad_gpu_is_still_offered() -> None:
    trap, trap_jobs = _trap_node("a", held=6)  # 1 healthy GPU left
    other = node("b")
    other_jobs = tuple(job(f"b-r{i}", "q", running(f"b-r{i}", "b", (i,))) for i in range(7))  # 1 left
    new = job("new", "q", Task(name="new", uid="uid-new", gpus=1, cpu_milli=1000, memory_mib=1024))
    snap = Snapshot(nodes=(trap, other), queues=(queue("q", 16),), jobs=(*trap_jobs, *other_jobs, new))
    (bind,) = run_session(snap).binds
    assert bind.node == "b", "filling a's last healthy GPU would leave the kubelet only the bad one"


def test_a_trap_node_still_takes_the_pod_when_nothing_else_fits() -> None:
    trap, trap_jobs = _trap_node("a", held=6)
    new = job("new", "q", Task(name="new", uid="uid-new", gpus=1, cpu_milli=1000, memory_mib=1024))
    (bind,) = run_session(Snapshot(nodes=(trap,), queues=(queue("q", 16),), jobs=(*trap_jobs, new))).binds
    assert (bind.node, bind.gpu_indices) == ("a", (7,))


def test_a_bad_gpu_the_plugin_does_not_offer_is_no_trap() -> None:
    trap, trap_jobs = _trap_node("a", held=6, offered=False)
    other = node("b")
    other_jobs = tuple(job(f"b-r{i}", "q", running(f"b-r{i}", "b", (i,))) for i in range(7))
    new = job("new", "q", Task(name="new", uid="uid-new", gpus=1, cpu_milli=1000, memory_mib=1024))
    snap = Snapshot(nodes=(trap, other), queues=(queue("q", 16),), jobs=(*trap_jobs, *other_jobs, new))
    (bind,) = run_session(snap).binds
    assert bind.node == "a", "bin-packing as before: node a comes first by name at equal free GPUs"


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 7), st.integers(0, 8), st.integers(1, 3))
def test_a_trap_node_takes_a_whole_gpu_pod_only_when_no_other_node_fits(held_a: int, held_b: int, want: int) -> None:
    trap, trap_jobs = _trap_node("a", held=min(held_a, 7))
    other = node("b")
    other_jobs = tuple(job(f"b-r{i}", "q", running(f"b-r{i}", "b", (i,))) for i in range(held_b))
    new = job("new", "q", Task(name="new", uid="uid-new", gpus=want, cpu_milli=1000, memory_mib=1024))
    snap = Snapshot(nodes=(trap, other), queues=(queue("q", 32),), jobs=(*trap_jobs, *other_jobs, new))
    binds = run_session(snap).binds
    free_a, free_b = 7 - min(held_a, 7), 8 - held_b
    if not binds:
        assert want > max(free_a, free_b)
        return
    (bind,) = binds
    if bind.node == "a":
        assert free_b < want, "the trap node took a pod that fitted elsewhere"
        assert 0 not in bind.gpu_indices


def test_among_trap_nodes_one_that_keeps_a_healthy_gpu_free_comes_first() -> None:
    a, a_jobs = _trap_node("a", held=6)  # would be left with no healthy GPU free
    b, b_jobs = _trap_node("b", held=3)
    new = job("new", "q", Task(name="new", uid="uid-new", gpus=1, cpu_milli=1000, memory_mib=1024))
    (bind,) = run_session(Snapshot(nodes=(a, b), queues=(queue("q", 16),), jobs=(*a_jobs, *b_jobs, new))).binds
    assert bind.node == "b", "bin-packing alone would fill a"


def test_the_trap_preference_looks_only_so_far_ahead() -> None:
    trap, _ = _trap_node("a", held=0)  # 7 free: bin-packing visits it first
    # Then nodes that cannot take the pod (no CPU left), then one that can.
    starved = tuple(node(f"s{i:03d}", cpu=0) for i in range(TRAP_LOOKAHEAD + 1))
    new = job("new", "q", Task(name="new", uid="uid-new", gpus=1, cpu_milli=1000, memory_mib=1024))
    far = Snapshot(nodes=(trap, *starved, node("z")), queues=(queue("q", 8),), jobs=(new,))
    (bind,) = run_session(far).binds
    assert bind.node == "a", "past the look-ahead the trap node is taken, not the pool scanned"
    near = replace(far, nodes=(trap, *starved[:3], node("z")))
    (bind,) = run_session(near).binds
    assert bind.node == "z"


def test_a_listed_pod_and_an_unlisted_one_that_swapped_gpus_are_not_seated_on_one() -> None:
    # gpuwarden assigned a GPU 5 and b GPU 2; the kubelet put a on GPU 2, and b
    # started after the agent's last read (not listed yet).
    n = node("n1", gpu_list=(Gpu(2), Gpu(5)), kubelet_holders={"uid-a": (2,)})
    pending = Task(name="c", uid="uid-c", status=TaskStatus.PENDING, gpus=1)
    snap = Snapshot(
        nodes=(n,),
        queues=(queue("q", 8),),
        jobs=(
            job("a", "q", running("a", "n1", (5,))),
            job("b", "q", running("b", "n1", (2,))),
            job("c", "q", pending),
        ),
    )
    for decisions in (run_session(snap), Engine().run(snap)):
        assert decisions.binds == (), "both GPUs are held: nothing is free for c"


@st.composite
def _swapped(draw: st.DrawFn) -> tuple[Snapshot, dict[str, tuple[int, ...]], set[str]]:
    """Consistent worlds: pods really on distinct GPUs, some listed by the kubelet, assignments independent."""
    count = draw(st.integers(1, 8))
    assigned = draw(st.permutations(range(8)))[:count]
    real = draw(st.permutations(range(8)))[:count]
    listed = draw(st.lists(st.booleans(), min_size=count, max_size=count))
    holders = {f"uid-p{i}": (real[i],) for i in range(count) if listed[i]}
    n = node("n1", kubelet_holders=holders or None)
    jobs = tuple(job(f"p{i}", "q", running(f"p{i}", "n1", (assigned[i],))) for i in range(count))
    pending = tuple(job(f"w{i}", "q", Task(name=f"w{i}", uid=f"uid-w{i}", gpus=1)) for i in range(8))
    known = {f"p{i}": (real[i],) for i in range(count) if listed[i]}
    return Snapshot(nodes=(n,), queues=(queue("q", 16),), jobs=jobs + pending), known, {f"p{i}" for i in range(count)}


@settings(max_examples=60, deadline=None)
@given(_swapped())
def test_every_running_pod_holds_a_gpu_of_its_own_and_no_listed_gpu_is_given_again(
    case: tuple[Snapshot, dict[str, tuple[int, ...]], set[str]],
) -> None:
    snap, known, running_pods = case
    for decisions in (run_session(snap), Engine().run(snap)):
        given_out = [g for b in decisions.binds for g in b.gpu_indices]
        assert len(decisions.binds) == 8 - len(running_pods), "each running pod counts one GPU, whatever the guess"
        assert len(set(given_out)) == len(given_out)
        assert not set(given_out) & {g for gpus in known.values() for g in gpus}, "a GPU the kubelet lists is held"


def test_a_holder_that_has_ended_does_not_push_the_pod_on_its_gpu_elsewhere() -> None:
    # Pod "gone" held GPU 1 at the agent's last read and has finished since;
    # gpuwarden bound b to GPU 1 and b started before the agent read again.
    # b is on GPU 1: a fault there takes it, in a fresh build and in the kept state.
    n = node("n1", 2, kubelet_holders={"uid-gone": (1,)})
    b = running("b", "n1", (1,))
    snap = Snapshot(nodes=(n,), queues=(queue("q", 8),), jobs=(job("jb", "q", b),))
    faulty = replace(snap, nodes=(replace(n, conditions=(_xid(1),)),))
    engine = Engine()
    engine.run(snap)
    for decisions in (run_session(faulty), engine.run(faulty)):
        assert [e.pod for e in decisions.evictions] == ["b"], decisions.evictions


def test_a_live_holder_still_pushes_an_unlisted_pod_off_its_gpu() -> None:
    # The pod reported on GPU 1 runs: b (unlisted) cannot be there too, so it is on GPU 0.
    n = node("n1", 2, kubelet_holders={"uid-a": (1,)})
    a, b = running("a", "n1", (0,)), running("b", "n1", (1,))
    snap = Snapshot(nodes=(n,), queues=(queue("q", 8),), jobs=(job("ja", "q", a), job("jb", "q", b)))
    faulty = replace(snap, nodes=(replace(n, conditions=(_xid(1),)),))
    for decisions in (run_session(faulty), Engine().run(faulty)):
        assert [e.pod for e in decisions.evictions] == ["a"], decisions.evictions
