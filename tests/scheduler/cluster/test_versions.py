"""Versions of a changing dict: each stays what the dict was when it was made, and copies only the changes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cluster.versions import Frozen, Versioned

# (key, value): value None removes the key; a batch of them, then a version.
Change = tuple[int, int | None]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 40), st.none() | st.integers(0, 5)), max_size=30), max_size=25))
def test_every_version_stays_what_the_dict_was_when_it_was_made(batches: list[list[Change]]) -> None:
    live: dict[int, int] = {k: -k for k in range(0, 40, 3)}
    versions = Versioned(live)
    made: list[tuple[Frozen[int, int], dict[int, int]]] = [(versions.freeze(), dict(live))]
    for batch in batches:
        for key, value in batch:
            if value is None:
                live.pop(key, None)
            else:
                live[key] = value
        versions.changed(key for key, _ in batch)
        made.append((versions.freeze(), dict(live)))
    for version, then in made:
        assert dict(version) == then
        assert len(version) == len(then) and sorted(version) == sorted(then)
        for key in range(-1, 42):
            assert (key in version) == (key in then)
            assert version.get(key) == then.get(key)
            assert version.get(key, "absent") == then.get(key, "absent")


def test_a_version_copies_the_changes_not_the_dict() -> None:
    live = {k: k for k in range(10_000)}
    versions = Versioned(live)
    live[5] = -5
    del live[6]
    versions.changed([5, 6])
    version = versions.freeze()
    assert version._over == {5: -5, 6: version._over[6]} and 6 not in version
    assert version._base is versions.freeze()._base  # the base is shared until the changes outgrow it
    for k in range(10_000, 10_300):  # more changes than about twice the square root of the size: folded
        live[k] = k
    versions.changed(range(10_000, 10_300))
    folded = versions.freeze()
    assert folded._over == {} and folded._base is not version._base
    assert dict(version) == {k: k for k in range(10_000) if k != 6} | {5: -5}
