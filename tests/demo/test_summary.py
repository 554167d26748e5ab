"""The demo summary's account of the device-plugin gap: pods started on a quarantined GPU, and how fast they left."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from demo.kubelet import Landing
from demo.summary import landing_line


def test_nothing_landed_says_so() -> None:
    assert landing_line([]) == "device manager: no pod started on a quarantined GPU"


def test_evicted_pods_are_timed_and_the_others_counted_apart() -> None:
    landed = [
        Landing("n3", "ns/a", (6,), at=10.0, left_at=11.5, evicted=True),
        Landing("n3", "ns/b", (6,), at=20.0, left_at=24.0, evicted=True),
        Landing("n3", "ns/c", (6,), at=30.0, left_at=30.5, evicted=False),  # its work ended first
        Landing("n3", "ns/d", (6,), at=40.0),
    ]
    assert landing_line(landed) == (
        "device manager: 4 pods started on a quarantined GPU (the device plugin still offered it); "
        "2 evicted off it in 2.8 s (median), 4.0 s at worst; 1 finished there first; 1 still there"
    )


def test_none_evicted_yet() -> None:
    line = landing_line([Landing("n3", "ns/a", (6,), at=1.0)])
    assert line.startswith("device manager: 1 pod started on a quarantined GPU"), line
    assert line.endswith("none evicted off it yet; 1 still there"), line


@given(
    st.lists(
        st.tuples(
            st.floats(0, 1000, allow_nan=False),
            st.one_of(st.none(), st.floats(0, 100, allow_nan=False)),
            st.booleans(),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_the_counts_add_up_and_the_times_are_the_evicted_ones(raw: list[tuple[float, float | None, bool]]) -> None:
    landed = [
        Landing(
            "n", f"ns/p{i}", (0,), at=at, left_at=None if stay is None else at + stay, evicted=stay is not None and ev
        )
        for i, (at, stay, ev) in enumerate(raw)
    ]
    line = landing_line(landed)
    total = int(re.search(r"(\d+) pods? started", line).group(1))  # type: ignore[union-attr]
    evicted = re.search(r"; (\d+) evicted off it in ([0-9.]+) s \(median\), ([0-9.]+) s at worst", line)
    finished = re.search(r"; (\d+) finished there first", line)
    still = re.search(r"; (\d+) still there", line)
    counts = [int(m.group(1)) if m else 0 for m in (evicted, finished, still)]
    assert total == len(landed) == sum(counts)
    stays = sorted(x.left_at - x.at for x in landed if x.left_at is not None and x.evicted)
    assert counts[0] == len(stays)
    if stays:
        assert evicted is not None
        median, worst = float(evicted.group(2)), float(evicted.group(3))
        assert stays[0] - 0.05 <= median <= worst + 0.05
        assert abs(worst - stays[-1]) <= 0.05
