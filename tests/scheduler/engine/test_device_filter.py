"""Pods whose GPUs come from DRA claims take only the GPUs their claims' selectors allow (DeviceFilter)."""

from __future__ import annotations

from itertools import permutations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.engine.model import DeviceChoices, DeviceFilter, Snapshot, assign_devices
from scheduler.engine.session import run_session
from tests.scheduler.builders import binds_by_job, job, node, pending, pending_codes, queue, running


def _filter(key: str, **nodes: tuple[int, ...]) -> DeviceFilter:
    return DeviceFilter(key, {name: frozenset(indices) for name, indices in nodes.items()})


def test_only_allowed_gpus_are_taken_even_where_others_are_free() -> None:
    devices = _filter("h100", n1=(2, 3))
    snap = Snapshot(
        nodes=(node("n1", 4), node("n2", 4)),
        queues=(queue("q", 16),),
        jobs=(job("a", "q", pending("a-0", 2, devices=devices)),),
    )
    assert binds_by_job(run_session(snap)) == {"a": [("a-0", "n1", (2, 3))]}


def test_a_pod_waits_when_its_allowed_gpus_are_held_and_says_why() -> None:
    devices = _filter("h100", n1=(2, 3))
    snap = Snapshot(
        nodes=(node("n1", 4),),
        queues=(queue("q", 16),),
        jobs=(
            job("warm", "q", running("warm-0", "n1", (3,)), preemptible=False),
            job("a", "q", pending("a-0", 2, devices=devices)),
        ),
    )
    decisions = run_session(snap)
    assert binds_by_job(decisions) == {}
    assert pending_codes(decisions) == {"a": "InsufficientResources"}
    message = decisions.pending[0].reasons[0].message
    assert "selectors allow" in message, message


def test_a_gang_of_claim_pods_is_placed_whole_or_not_at_all() -> None:
    devices = _filter("h100", n1=(0, 1), n2=(0,))
    three = job("g", "q", *(pending(f"g-{i}", 1, devices=devices) for i in range(3)), min_member=3)
    four = job("h", "q", *(pending(f"h-{i}", 1, devices=devices) for i in range(4)), min_member=4)
    placed = run_session(Snapshot(nodes=(node("n1", 4), node("n2", 4)), queues=(queue("q", 16),), jobs=(three,)))
    binds = binds_by_job(placed)["g"]
    assert sorted((n, g) for _, n, g in binds) == [("n1", (0,)), ("n1", (1,)), ("n2", (0,))]
    refused = run_session(Snapshot(nodes=(node("n1", 4), node("n2", 4)), queues=(queue("q", 16),), jobs=(four,)))
    assert binds_by_job(refused) == {}


@settings(max_examples=200, deadline=None)
@given(
    allowed=st.dictionaries(
        st.sampled_from(["n1", "n2", "n3"]), st.frozensets(st.integers(0, 3), min_size=0, max_size=4), max_size=3
    ),
    held=st.lists(st.tuples(st.sampled_from(["n1", "n2", "n3"]), st.integers(0, 3)), max_size=6, unique=True),
    asks=st.lists(st.integers(1, 3), min_size=1, max_size=4),
)
def test_every_gpu_given_is_allowed_free_and_given_once(
    allowed: dict[str, frozenset[int]], held: list[tuple[str, int]], asks: list[int]
) -> None:
    devices = DeviceFilter("k", allowed)
    warm = [job(f"w{i}", "q", running(f"w{i}-0", n, (g,)), preemptible=False) for i, (n, g) in enumerate(held)]
    jobs = [job(f"j{i}", "q", pending(f"j{i}-0", k, devices=devices), created=i) for i, k in enumerate(asks)]
    snap = Snapshot(nodes=tuple(node(n, 4) for n in ("n1", "n2", "n3")), queues=(queue("q", 100),), jobs=(*warm, *jobs))
    decisions = run_session(snap)
    taken = set(held)
    for bind in decisions.binds:
        assert len(bind.gpu_indices) == asks[int(bind.job.split("/")[1][1:])]
        for index in bind.gpu_indices:
            assert index in allowed.get(bind.node, frozenset())
            assert (bind.node, index) not in taken
            taken.add((bind.node, index))
    for e in decisions.evictions:
        raise AssertionError(f"nothing here may be moved: {e}")


def _brute(alternatives: DeviceChoices, free: list[int]) -> bool:
    """Whether some alternative can give every request its count of distinct GPUs of ``free`` (by trying all)."""
    for requests in alternatives:
        slots = [allowed for count, allowed in requests for _ in range(count)]
        if len(slots) > len(free):
            continue
        if any(all(g in a for g, a in zip(pick, slots, strict=True)) for pick in permutations(free, len(slots))):
            return True
    return False


_REQUEST = st.tuples(st.integers(1, 3), st.frozensets(st.integers(0, 5), max_size=6))


@settings(max_examples=400, deadline=None)
@given(
    alternatives=st.lists(st.lists(_REQUEST, min_size=1, max_size=3).map(tuple), min_size=1, max_size=3).map(tuple),
    free=st.lists(st.integers(0, 5), unique=True, max_size=6),
)
def test_devices_are_assigned_exactly_when_some_assignment_exists(alternatives: DeviceChoices, free: list[int]) -> None:
    """The matching finds an assignment whenever one exists (a brute force says), and every one it gives holds."""
    assigned = assign_devices(alternatives, free)
    assert (assigned is not None) == _brute(alternatives, free)
    if assigned is None:
        return
    used = [g for group in assigned for g in group]
    assert len(used) == len(set(used)) and set(used) <= set(free)
    assert any(
        len(requests) == len(assigned)
        and all(len(g) == c and set(g) <= a for (c, a), g in zip(requests, assigned, strict=True))
        for requests in alternatives
    )


def test_requests_with_different_selectors_share_a_node_when_each_gets_its_own_gpus() -> None:
    """Request A may take GPUs 0-1, request B only GPU 0: A must leave GPU 0 to B (one set would find none)."""
    devices = DeviceFilter(
        "two-requests",
        {"n1": frozenset({0, 1})},
        choices={"n1": (((1, frozenset({0, 1})), (1, frozenset({0}))),)},
    )
    snap = Snapshot(
        nodes=(node("n1", 4),), queues=(queue("q", 16),), jobs=(job("a", "q", pending("a-0", 2, devices=devices)),)
    )
    assert binds_by_job(run_session(snap)) == {"a": [("a-0", "n1", (0, 1))]}
    # GPU 0 held: B cannot have its GPU, whatever A takes.
    held = job("warm", "q", running("warm-0", "n1", (0,)), preemptible=False)
    snap = Snapshot(nodes=(node("n1", 4),), queues=(queue("q", 16),), jobs=(held, snap.jobs[0]))
    decisions = run_session(snap)
    assert binds_by_job(decisions) == {}
    message = decisions.pending[0].reasons[0].message
    assert "each request of its resource claims needs its own" in message, message


def test_a_match_attribute_group_that_is_full_leaves_the_pod_to_another_group() -> None:
    """Two groups sharing an attribute; the larger one's GPUs are held, the smaller one is free: the pod fits there."""
    big, small = frozenset({0, 1, 2}), frozenset({3, 4})
    devices = DeviceFilter(
        "constrained",
        {"n1": big | small},
        choices={"n1": (((2, big),), ((2, small),))},
    )
    held = job("warm", "q", running("warm-0", "n1", (0, 1)), preemptible=False)
    snap = Snapshot(
        nodes=(node("n1", 8),),
        queues=(queue("q", 16),),
        jobs=(held, job("a", "q", pending("a-0", 2, devices=devices))),
    )
    assert binds_by_job(run_session(snap)) == {"a": [("a-0", "n1", (3, 4))]}
