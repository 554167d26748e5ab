"""The cycle's bookkeeping writer: it never holds a cycle up, and merging loses nothing a write would say."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden import contract
from scheduler.cluster.grouping import GroupSpec
from scheduler.cluster.lost import lost_totals
from scheduler.cluster.writebehind import WriteBatch, WriteBehind
from scheduler.engine.model import Bind, Decisions, JobStatus
from tests.waiting import wait_for


def batch(
    cycle: int,
    *,
    lost: Mapping[str, float] | None = None,
    defer: bool = True,
    finished_changed: frozenset[str] | None = frozenset(),
) -> WriteBatch:
    """What cycle ``cycle`` hands over: one bind, one pending job, one missing PodGroup."""
    job = f"ns/job-{cycle}"
    spec = GroupSpec(f"pg-{cycle}", "ns", 1, "q")
    return WriteBatch(
        specs={("ns", spec.name): spec},
        drifted={},
        decisions=Decisions(
            binds=(Bind(job, "ns", f"pod-{cycle}", f"uid-{cycle}", "n1"),),
            pending=(JobStatus(f"ns/waiting-{cycle}", "q", ()),),
        ),
        gang_met=(job,),
        finished={},
        blocked={f"ns/blocked-{cycle}": "refused"} if cycle % 2 else {},
        shown_blocked=frozenset({f"ns/shown-{cycle}"}),
        lost=lost or {},
        queues={"q": {"status": {contract.QUEUE_STATUS_GPU_SECONDS_LOST: 100.0}}},
        queue_problems={},
        defer_placed=defer,
        finished_changed=finished_changed,
    )


def test_cycles_never_wait_while_a_write_is_slow_and_their_batches_merge_into_one() -> None:
    release, started = threading.Event(), threading.Event()
    written: list[WriteBatch] = []

    def write(b: WriteBatch) -> None:
        written.append(b)
        started.set()
        release.wait()  # the first write hangs until the cycles below are done

    writer = WriteBehind(write)
    try:
        writer.submit(batch(0))
        assert started.wait(timeout=30)

        def cycles() -> None:
            for i in range(1, 200):
                writer.submit(batch(i, lost={"q": 1.5}, defer=i != 50))

        # Were a submit to wait for the hung write, this thread would never end.
        submitting = threading.Thread(target=cycles, daemon=True)
        submitting.start()
        submitting.join(timeout=30)
        assert not submitting.is_alive(), "a cycle waited for the bookkeeping of earlier cycles"
        release.set()
        writer.flush()
    finally:
        release.set()
        writer.close()
    assert [b.cycles for b in written] == [1, 199]
    assert writer.merged == 198
    merged = written[1]
    # Every bind and every PodGroup to create of the merged cycles; the newest cycle's pending reasons.
    assert [b.pod for b in merged.decisions.binds] == [f"pod-{i}" for i in range(1, 200)]
    assert sorted(merged.specs) == sorted(("ns", f"pg-{i}") for i in range(1, 200))
    assert [p.job for p in merged.decisions.pending] == ["ns/waiting-199"]
    assert merged.shown_blocked == frozenset({"ns/shown-199"})
    assert set(merged.blocked) == {f"ns/blocked-{i}" for i in range(1, 200, 2)}
    # GPU-seconds lost in every merged cycle, on top of what the newest view shows.
    assert merged.lost == {"q": 199 * 1.5}
    assert lost_totals(merged.queues, merged.lost) == {"q": 100.0 + 199 * 1.5}
    # Cycle 50 asked for the deferred statuses: the merged batch writes them.
    assert merged.defer_placed is False


def test_a_batch_goes_out_once_the_binds_its_cycles_sent_are_answered() -> None:
    """Bookkeeping never comes between a bind sent in the background and the API server."""
    written: list[int] = []
    bind_a: Future[object] = Future()
    bind_b: Future[object] = Future()
    writer = WriteBehind(lambda b: written.append(b.cycles))
    try:
        writer.submit(replace(batch(0), after=(bind_a,)))
        time.sleep(0.2)
        assert written == [], "written while a bind of its cycle was unanswered"
        bind_a.set_result(None)
        wait_for(lambda: written == [1], description="the first batch written once its bind is answered")
        writer.submit(replace(batch(1), after=(bind_b,)))
        time.sleep(0.2)
        assert written == [1]
        bind_b.set_exception(RuntimeError("a failed bind is answered too"))
        writer.flush()
        assert written == [1, 1]
    finally:
        for bind in (bind_a, bind_b):
            if not bind.done():
                bind.set_result(None)  # so that close never waits on a test that failed
        writer.close()


def test_a_failed_write_does_not_stop_the_next_batch() -> None:
    seen: list[int] = []

    def write(b: WriteBatch) -> None:
        seen.append(b.cycles)
        if len(seen) == 1:
            raise RuntimeError("the API server went away")

    writer = WriteBehind(write)
    try:
        writer.submit(batch(0))
        writer.flush()
        writer.submit(batch(1))
        writer.flush()
    finally:
        writer.close()
    assert seen == [1, 1]


class _Exit(BaseException):
    """What an interpreter exit raises in a thread: not an error of the write."""


def test_a_write_ended_by_a_base_exception_leaves_the_writer_able_to_write_the_next() -> None:
    seen: list[int] = []

    def write(b: WriteBatch) -> None:
        seen.append(b.cycles)
        if len(seen) == 1:
            raise _Exit

    writer = WriteBehind(write)
    try:
        writer.submit(batch(0))
        with contextlib.suppress(_Exit):
            writer.flush()  # it raises here if it looked before the drain had ended
        writer.submit(batch(1))  # the next batch starts a new drain
        writer.flush()
    finally:
        writer.close()
    assert seen == [1, 1]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.booleans(),
            st.floats(0, 1e6, allow_nan=False),
            st.none() | st.frozensets(st.sampled_from(["ns/a", "ns/b", "ns/c"])),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_merging_in_any_grouping_gives_the_same_batch(parts: list[tuple[bool, float, frozenset[str] | None]]) -> None:
    batches = [
        batch(i, lost={"q": seconds} if seconds else {}, defer=defer, finished_changed=ended)
        for i, (defer, seconds, ended) in enumerate(parts)
    ]
    left = batches[0]
    for b in batches[1:]:
        left = left.then(b)
    right = batches[-1]
    for b in reversed(batches[:-1]):
        right = b.then(right)
    assert left.decisions == right.decisions
    assert left.specs == right.specs
    assert left.blocked == right.blocked
    assert left.defer_placed == right.defer_placed == all(d for d, _, _ in parts)
    # The groups whose end changed in any merged cycle, or unknown if unknown in one.
    named = [ended for _, _, ended in parts]
    union = None if None in named else frozenset().union(*(n for n in named if n is not None))
    assert left.finished_changed == right.finished_changed == union
    assert left.lost.keys() == right.lost.keys()
    for queue in left.lost:
        assert abs(left.lost[queue] - right.lost[queue]) <= 1e-6 * max(1.0, left.lost[queue])


def test_a_view_older_than_the_last_write_does_not_write_an_earlier_total_back() -> None:
    stale = {"q": {"status": {contract.QUEUE_STATUS_GPU_SECONDS_LOST: 100.0}}, "other": {}}
    # This process wrote 130 already; the view still shows 100.
    assert lost_totals(stale, {}, {"q": 130.0}) == {"q": 130.0}
    assert lost_totals(stale, {"q": 5.0, "other": 2.0}, {"q": 130.0}) == {"q": 135.0, "other": 2.0}
    # A view newer than the last write wins.
    assert lost_totals({"q": {"status": {contract.QUEUE_STATUS_GPU_SECONDS_LOST: 150.0}}}, {}, {"q": 130.0}) == {
        "q": 150.0
    }
