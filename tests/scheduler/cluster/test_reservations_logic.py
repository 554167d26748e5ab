"""The PodGroup's ``status.reservations``: written and read back exactly, bad entries named and skipped."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwarden.kube import ApiError
from scheduler.cluster.reservations import STATUS_FIELD, ReservationWriter, decode_entry, encode, reservations_from
from scheduler.engine.model import Reservation

NOW = 1_764_600_000.0


@st.composite
def reservations(draw: st.DrawFn) -> Reservation:
    gpus = tuple(draw(st.lists(st.integers(0, 63), max_size=8, unique=True)))
    sliced = draw(st.booleans()) and bool(gpus)
    return Reservation(
        job="team-a/train",
        node=draw(st.from_regex(r"[a-z][a-z0-9-]{0,30}", fullmatch=True)),
        gpu_indices=gpus,
        gpu_memory_mib=tuple(draw(st.integers(1, 200_000)) for _ in gpus) if sliced else None,
        cpu_milli=draw(st.integers(0, 10**7)),
        memory_mib=draw(st.integers(0, 10**8)),
        expires=float(draw(st.integers(int(NOW), int(NOW) + 10**7))),
    )


@given(reservations())
def test_a_reservation_reads_back_as_written(res: Reservation) -> None:
    (entry,) = encode([res])
    assert decode_entry(res.job, entry) == res


def test_a_fractional_expiry_is_written_rounded_up() -> None:
    (entry,) = encode([Reservation(job="a/b", node="n", gpu_indices=(1,), expires=NOW + 0.2)])
    assert decode_entry("a/b", entry).expires == NOW + 1


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("n1", "an entry must be an object"),
        ({"gpus": [0], "expires": "2026-12-01T00:00:00Z"}, "node must be a node name"),
        ({"node": "n1", "gpus": [0, 0], "expires": "2026-12-01T00:00:00Z"}, "gpus lists a GPU twice"),
        ({"node": "n1", "gpus": [-1], "expires": "2026-12-01T00:00:00Z"}, "gpus must be at least 0"),
        ({"node": "n1", "gpus": [True], "expires": "2026-12-01T00:00:00Z"}, "gpus must be a list of integers"),
        ({"node": "n1", "gpus": [0], "gpuMemoryMiB": [1, 2], "expires": "2026-12-01T00:00:00Z"}, "one size per GPU"),
        ({"node": "n1", "gpus": [0], "cpu": -1, "expires": "2026-12-01T00:00:00Z"}, "cpu must be a non-negative"),
        ({"node": "n1", "gpus": [0]}, "expires must be an RFC 3339 time"),
        ({"node": "n1", "gpus": [0], "expires": "tomorrow"}, "is not an RFC 3339 time"),
        ({"node": "n1", "gpus": [0], "expires": "2026-12-01T00:00:00"}, "must carry a time zone"),
    ],
)
def test_a_bad_entry_is_named(entry: Any, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        decode_entry("a/b", entry)


def test_bad_entries_are_left_out_and_the_rest_kept() -> None:
    good = encode([Reservation(job="ns/ok", node="n1", gpu_indices=(2, 3), expires=NOW)])
    groups = {
        ("ns", "ok"): {"status": {"reservations": [*good, {"node": 5}]}},
        ("ns", "junk"): {"status": {"reservations": "n1:0"}},
        ("ns", "none"): {"status": {}},
        ("ns", "odd"): {"status": "Pending"},
    }
    assert reservations_from(groups) == (Reservation(job="ns/ok", node="n1", gpu_indices=(2, 3), expires=NOW),)


_VALUES = st.one_of(st.none(), st.integers(), st.text(max_size=5), st.lists(st.integers()))


@given(st.dictionaries(st.sampled_from(["node", "gpus", "gpuMemoryMiB", "cpu", "memoryMiB", "expires", "x"]), _VALUES))
def test_any_entry_reads_as_one_reservation_or_none_without_raising(entry: dict[str, Any]) -> None:
    found = reservations_from({("ns", "g"): {"status": {"reservations": [entry]}}})
    assert len(found) <= 1
    assert all(r.job == "ns/g" and r.node == entry["node"] for r in found)


class _Api:
    """Records status patches; ``down`` makes them fail as an unreachable API server does."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, Any]] = []
        self.down = False

    def patch_podgroup_status(self, namespace: str, name: str, patch: Any) -> Any:
        if self.down:
            raise ApiError("patch_podgroup_status", None, "ConnectionRefusedError")
        self.patches.append((name, patch["status"][STATUS_FIELD]))
        return {}


def _group(reservations: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {"metadata": {"name": "g", "namespace": "ns"}, "status": {STATUS_FIELD: reservations}}


def test_a_watch_that_lags_never_makes_the_writer_keep_a_lapsed_reservation() -> None:
    api = _Api()
    writer = ReservationWriter(api)  # type: ignore[arg-type]
    room = Reservation("ns/g", "n1", (0,), cpu_milli=1000, memory_mib=1024, expires=2_000_000_000)
    before = _group(None)
    # Written; the watch has not shown it (and, with the API down, will not for a while).
    assert writer.write([room], {("ns", "g"): before}) == 1
    assert writer.write([room], {("ns", "g"): before}) == 0, "sent already: not sent again"
    # The room lapses while the view still holds the entry from before the write:
    # the server holds the room, so the clear is sent, and sent again until it goes through.
    api.down = True
    assert writer.write([], {("ns", "g"): before}) == 0
    api.down = False
    shown = _group(encode([room]))  # the watch catches up with the first write
    assert writer.write([], {("ns", "g"): shown}) == 1
    assert api.patches[-1] == ("g", None)
    # A newer entry that shows it cleared: nothing more to send.
    assert writer.write([], {("ns", "g"): _group(None)}) == 0


def test_the_next_cycle_reads_the_writers_own_writes_before_the_watch_shows_them() -> None:
    """Room just reserved must not look free (nor room just released look held) until the echo comes."""
    api = _Api()
    writer = ReservationWriter(api)  # type: ignore[arg-type]
    room = Reservation("ns/g", "n1", (0,), cpu_milli=1000, memory_mib=1024, expires=2_000_000_000)
    other = Reservation("ns/h", "n2", (1,), expires=2_000_000_000)
    before = {("ns", "g"): _group(None), ("ns", "h"): _group(encode([other]))}
    shown = {("ns", "h"): (other,)}
    assert writer.overlay(shown, before) == (other,)
    assert writer.write([room, other], before) == 1
    # The view has not changed: the written room is held all the same.
    assert writer.overlay(shown, before) == (room, other)
    # The room is taken (a bind) and the clear is written; the view still shows the write before it.
    echoed = {**before, ("ns", "g"): _group(encode([room]))}
    assert writer.write([other], echoed) == 1
    assert writer.overlay({**shown, ("ns", "g"): (room,)}, echoed) == (other,)
    # A newer entry than the one the clear was sent over: the view's word stands.
    again = {**before, ("ns", "g"): _group(encode([room]))}
    assert writer.overlay({**shown, ("ns", "g"): (room,)}, again) == (room, other)


class _VersionedApi(_Api):
    """Answers each patch with the PodGroup as written, at the next resourceVersion."""

    def __init__(self, version: int) -> None:
        super().__init__()
        self.version = version

    def patch_podgroup_status(self, namespace: str, name: str, patch: Any) -> Any:
        super().patch_podgroup_status(namespace, name, patch)
        self.version += 1
        return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": str(self.version)}}


def _at(version: int, reservations: list[dict[str, Any]] | None) -> dict[str, Any]:
    group = _group(reservations)
    group["metadata"]["resourceVersion"] = str(version)
    return group


def test_an_echo_older_than_the_write_does_not_hide_it() -> None:
    """Another writer's status patch, echoed after the reservation went out, predates it: the room stays held."""
    api = _VersionedApi(100)
    writer = ReservationWriter(api)  # type: ignore[arg-type]
    room = Reservation("ns/g", "n1", (0,), cpu_milli=1000, memory_mib=1024, expires=2_000_000_000)
    key = ("ns", "g")
    assert writer.write([room], {key: _at(100, None)}) == 1  # written at version 101
    # Another entry than the one written over, but from before the write: a status patch echoed late.
    older = {key: {**_at(100, None), "status": {"phase": "Pending"}}}
    assert writer.overlay({}, older) == (room,)
    assert writer.write([room], older) == 0, "the server holds it: not sent again"
    # The echo of the write itself, or anything after it: the view's word.
    assert writer.overlay({}, {key: _at(101, None)}) == ()
    assert writer.overlay({}, {}) == (), "a PodGroup gone holds nothing"
