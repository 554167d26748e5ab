"""The loop's collector: young garbage found between cycles, survivors frozen, old garbage found by the sweep.

Counted in objects and collections, not time (the pauses are
``benchmarks/scheduler_churn.py``'s figures).
"""

from __future__ import annotations

import gc
import math
import weakref
from collections.abc import Iterator

import pytest

from scheduler.collector import LoopCollector


class _Cell:
    """An object that can refer to itself (a reference cycle on its own)."""

    def __init__(self) -> None:
        self.me: _Cell | None = None


def _garbage_cycle() -> weakref.ref[_Cell]:
    """A cycle that nothing else refers to: only the cyclic collector frees it."""
    cell = _Cell()
    cell.me = cell
    return weakref.ref(cell)


@pytest.fixture(autouse=True)
def _collection_as_found() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.enable()
    try:
        yield
    finally:
        gc.unfreeze()
        if not enabled:
            gc.disable()


def test_between_cycles_the_young_generation_is_collected_once_full_and_what_survives_is_frozen() -> None:
    collector = LoopCollector(young_limit=500, sweep_every_s=math.inf)
    collector.start()
    try:
        assert not gc.isenabled()  # nothing collects on its own, on any thread
        frozen = gc.get_freeze_count()
        gone = _garbage_cycle()
        collector.between_cycles()
        assert gone() is not None and collector.collections == 0  # not full yet: left for later
        kept = [[i] for i in range(600)]
        collector.between_cycles()
        assert collector.collections == 1
        assert gone() is None
        assert gc.get_objects(1) == [] and gc.get_objects(2) == []  # survivors are not looked at again
        assert gc.get_freeze_count() >= frozen + len(kept)
    finally:
        collector.stop()
    assert gc.isenabled()


def test_new_objects_that_replace_frozen_ones_fill_the_young_generation_though_the_count_stays_low() -> None:
    """What the watch does to the cache: each new version of a pod frees the frozen one it replaces."""
    seen = [[i] for i in range(2000)]
    collector = LoopCollector(young_limit=500, sweep_every_s=math.inf)
    collector.start()  # the cache synced: frozen
    try:
        for i in range(len(seen)):
            seen[i] = [i]  # seen again: a new object, the frozen one freed
        assert gc.get_count()[0] < 500 <= len(gc.get_objects(generation=0))
        collector.between_cycles()
        assert collector.collections == 1
        assert not any(o is seen[0] for o in gc.get_objects(generation=0))  # frozen after its look
    finally:
        collector.stop()


def test_a_sweep_asked_for_runs_at_the_next_turn_and_the_period_starts_again() -> None:
    now = [0.0]
    collector = LoopCollector(young_limit=10**9, sweep_every_s=60.0, clock=lambda: now[0])
    collector.start()
    try:
        collector.sweep_soon()  # the runner dropped its cache and kept state
        now[0] = 1.0
        collector.between_cycles()
        assert collector.sweeps == 1
        now[0] = 60.0
        collector.between_cycles()
        assert collector.sweeps == 1
        now[0] = 61.0
        collector.between_cycles()
        assert collector.sweeps == 2
    finally:
        collector.stop()


def test_starting_again_turns_collection_off_whoever_turned_it_on() -> None:
    collector = LoopCollector()
    collector.start()
    try:
        gc.enable()  # a session's pause that ended on another thread
        collector.start()
        assert not gc.isenabled()
    finally:
        collector.stop()
    assert gc.isenabled()


def test_a_bulk_of_new_state_is_frozen_without_a_look_and_its_garbage_left_to_the_sweep() -> None:
    now = [0.0]
    collector = LoopCollector(young_limit=500, bulk_limit=5000, sweep_every_s=60.0, clock=lambda: now[0])
    collector.start()
    try:
        gone = _garbage_cycle()
        built = [[i] for i in range(6000)]  # the first cycle's kept state, say
        collector.between_cycles()
        assert (collector.bulks, collector.collections) == (1, 0)
        assert gone() is not None  # not looked at
        generations = gc.get_objects(0) + gc.get_objects(1) + gc.get_objects(2)
        assert not any(o is built for o in generations)  # frozen: in no generation a collection looks at
        del generations
        now[0] = 60.0
        collector.between_cycles()
        assert gone() is None and collector.sweeps == 1
        assert len(built) == 6000
    finally:
        collector.stop()


def test_a_cycle_that_became_garbage_after_it_was_frozen_is_found_by_the_sweep() -> None:
    now = [0.0]
    cell = _Cell()
    cell.me = cell
    old = weakref.ref(cell)
    collector = LoopCollector(young_limit=10**9, sweep_every_s=60.0, clock=lambda: now[0])
    collector.start()  # freezes the cell, alive
    try:
        del cell
        now[0] = 59.0
        collector.between_cycles()
        assert old() is not None and collector.sweeps == 0
        now[0] = 60.0
        collector.between_cycles()
        assert old() is None and collector.sweeps == 1
        assert gc.get_objects(2) == []  # frozen again after the sweep
    finally:
        collector.stop()


def test_collection_stays_off_until_the_last_loop_of_the_process_stops() -> None:
    first, second = LoopCollector(), LoopCollector()
    first.start()
    second.start()
    try:
        first.stop()
        first.stop()  # a second stop gives nothing back twice
        assert not gc.isenabled()
    finally:
        first.stop()
        second.stop()
    assert gc.isenabled()


def test_a_process_that_had_collection_off_keeps_it_off() -> None:
    gc.disable()
    collector = LoopCollector()
    collector.start()
    try:
        assert not gc.isenabled()
    finally:
        collector.stop()
    assert not gc.isenabled()


def test_a_stopped_collector_collects_nothing() -> None:
    collector = LoopCollector(young_limit=0)
    collector.between_cycles()
    assert collector.collections == 0
