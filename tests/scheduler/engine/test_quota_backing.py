"""How much of each queue's quota healthy hardware does not back."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.engine.decisions import split_shortfall
from scheduler.engine.model import Gpu, Job, Node, Queue, QueueShare, Resources, Snapshot
from scheduler.engine.session import run_session
from tests.scheduler.builders import node, queue, running

G = 1000


def _shares(snap: Snapshot) -> dict[str, QueueShare]:
    return {s.queue: s for s in run_session(snap).queue_shares}


def _faulty_pool(healthy: int, faulty: int) -> tuple[Node, ...]:
    bad = tuple(Gpu(i, healthy=False) for i in range(8))
    return (*(node(f"ok-{i}", 8) for i in range(healthy)), *(node(f"bad-{i}", gpu_list=bad) for i in range(faulty)))


def test_two_of_six_nodes_out_leave_quotas_short_in_proportion() -> None:
    snap = Snapshot(
        nodes=_faulty_pool(4, 2),
        queues=(queue("a", 24), queue("b", 16), queue("c", 8)),
    )
    shares = _shares(snap)
    # 48 GPUs of quota on 32 healthy ones: 16 short, 8 + 5.33 + 2.67 rounded to whole GPUs.
    assert {q: s.quota_shortfall.gpu for q, s in shares.items()} == {"a": 8 * G, "b": 5 * G, "c": 3 * G}
    assert shares["b"].backing.gpu == 32 * G
    assert shares["b"].level_quota.gpu == 48 * G
    assert shares["b"].quota.gpu == 16 * G
    assert all(s.quota_shortfall.cpu == 0 and s.quota_shortfall.memory == 0 for s in shares.values())


def test_a_healthy_pool_backs_every_quota() -> None:
    snap = Snapshot(nodes=_faulty_pool(6, 0), queues=(queue("a", 24), queue("b", 16), queue("c", 8)))
    assert all(s.quota_shortfall == Resources() for s in _shares(snap).values())


def test_quotas_over_subscribing_a_healthy_pool_on_purpose_are_no_fault() -> None:
    """48 GPUs of quota on 32 healthy GPUs is a choice while nothing is broken;
    one node out then makes 8 of it a fault."""
    queues = (queue("a", 24), queue("b", 16), queue("c", 8))
    assert all(
        s.quota_shortfall == Resources() for s in _shares(Snapshot(nodes=_faulty_pool(4, 0), queues=queues)).values()
    )
    short = _shares(Snapshot(nodes=_faulty_pool(3, 1), queues=queues))
    assert sum(s.quota_shortfall.gpu for s in short.values()) == 8 * G


def test_a_short_parent_passes_the_shortfall_to_its_children() -> None:
    snap = Snapshot(
        nodes=_faulty_pool(3, 1),
        queues=(
            queue("dept", 24),
            queue("other", 8),
            queue("t1", 12, parent="dept"),
            queue("t2", 12, parent="dept"),
        ),
    )
    shares = _shares(snap)
    # 32 of quota on 24 healthy GPUs: dept is 6 short, other 2; dept's children split its 6.
    assert shares["dept"].quota_shortfall.gpu == 6 * G
    assert shares["other"].quota_shortfall.gpu == 2 * G
    assert shares["t1"].quota_shortfall.gpu == 3 * G
    assert shares["t2"].quota_shortfall.gpu == 3 * G
    assert shares["t1"].parent == "dept"
    assert shares["t1"].backing.gpu == 18 * G


def test_children_over_a_healthy_parent_are_a_configuration_not_a_fault() -> None:
    snap = Snapshot(
        nodes=_faulty_pool(2, 0),
        queues=(queue("dept", 8), queue("t1", 8, parent="dept"), queue("t2", 8, parent="dept")),
    )
    assert all(s.quota_shortfall == Resources() for s in _shares(snap).values())


def test_non_preemptible_allocation_is_reported() -> None:
    snap = Snapshot(
        nodes=_faulty_pool(1, 0),
        queues=(queue("a", 8),),
        jobs=(
            Job("np", "a", uid="u-np", preemptible=False, tasks=(running("np-0", "ok-0", (0, 1)),)),
            Job("p", "a", uid="u-p", tasks=(running("p-0", "ok-0", (2,)),)),
        ),
    )
    share = _shares(snap)["a"]
    assert share.allocated.gpu == 3 * G
    assert share.allocated_non_preemptible.gpu == 2 * G


@settings(max_examples=300, deadline=None)
@given(
    quotas=st.lists(st.integers(0, 64 * G), min_size=1, max_size=8),
    capacity=st.integers(0, 64).map(lambda g: g * G),
    unit=st.sampled_from([G, 1024]),
)
def test_shortfalls_add_up_to_the_pool_shortfall_and_stay_within_quota(
    quotas: list[int], capacity: int, unit: int
) -> None:
    names = [f"q{i}" for i in range(len(quotas))]
    total = max(0, sum(quotas) - capacity)
    parts = split_shortfall(total, quotas, names, unit)
    assert sum(parts) == total
    assert all(0 <= p <= q for p, q in zip(parts, quotas, strict=True))


@settings(max_examples=100, deadline=None)
@given(
    gpu_quotas=st.lists(st.integers(0, 24), min_size=1, max_size=5),
    healthy=st.integers(0, 4),
    faulty=st.integers(0, 3),
)
def test_session_shortfalls_add_up_per_pool(gpu_quotas: list[int], healthy: int, faulty: int) -> None:
    queues: tuple[Queue, ...] = tuple(queue(f"q{i}", g) for i, g in enumerate(gpu_quotas))
    shares = _shares(Snapshot(nodes=_faulty_pool(healthy, faulty), queues=queues))
    # Only what the faulty nodes take away counts; quotas beyond the intact pool are a configuration.
    from_faults = max(0, sum(gpu_quotas) - 8 * healthy) - max(0, sum(gpu_quotas) - 8 * (healthy + faulty))
    assert sum(s.quota_shortfall.gpu for s in shares.values()) == from_faults * G
    assert all(s.quota_shortfall.gpu <= s.quota.gpu for s in shares.values())
    assert all(s.quota_shortfall.gpu % G == 0 for s in shares.values())
