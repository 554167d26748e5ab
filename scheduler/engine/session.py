"""One scheduling cycle: Snapshot in, Decisions out.

A session builds the working state from the snapshot
(:mod:`scheduler.engine.build`), runs the actions in their fixed order over
it with one set of caches (:mod:`scheduler.engine.caches`), and turns what
they committed into decisions (:mod:`scheduler.engine.decisions`).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from scheduler.engine.actions import allocate, consolidate, health_evict, preempt, reclaim, stale_gangs
from scheduler.engine.backlog import BacklogMemo
from scheduler.engine.build import build_cluster
from scheduler.engine.caches import PoolStatics, SessionCaches
from scheduler.engine.decisions import decisions
from scheduler.engine.model import Decisions, Snapshot
from scheduler.engine.state import Cluster

# One step of the session over its working state and caches. Named apart
# from gpuwarden.contract.Action, which is a remediation for a node.
SessionAction = Callable[[Cluster, SessionCaches], None]

# The fixed order of a session. Health eviction goes first, so the capacity
# it frees and the pods it sends back to pending are seen by every later
# action; stale gangs go last, so a gang is only judged short after this
# session's allocation had its chance to complete it.
ACTIONS: tuple[tuple[str, SessionAction], ...] = (
    ("health_evict", health_evict.run),
    ("allocate", allocate.run),
    ("consolidate", consolidate.run),
    ("reclaim", reclaim.run),
    ("preempt", preempt.run),
    ("stale_gangs", stale_gangs.run),
)


def run_session(
    snapshot: Snapshot, timings: dict[str, float] | None = None, memo: BacklogMemo | None = None
) -> Decisions:
    """One cycle; ``timings``, when given, receives seconds per phase
    (``build``, each action, ``decisions``) for metrics and benchmarks.
    ``memo`` is what earlier sessions learned of the backlog
    (:mod:`scheduler.engine.backlog`); the decisions are the same without it.

    The cyclic garbage collector is paused while it runs: a session
    allocates hundreds of thousands of small objects that all live until it
    ends, and letting the collector rescan them over and over costs more
    than the session itself; they are collected after it returns.
    """
    with collector_paused():
        start = time.perf_counter()
        cluster = build_cluster(snapshot)
        return act(cluster, [("build", time.perf_counter() - start)], timings, snapshot, memo)


def act(
    cluster: Cluster,
    phases: list[tuple[str, float]],
    timings: dict[str, float] | None,
    snapshot: Snapshot | None = None,
    memo: BacklogMemo | None = None,
    *,
    statics: dict[str, PoolStatics] | None = None,
) -> Decisions:
    """The actions in their order over a built state (of ``snapshot``), then its decisions.

    An exception drops everything ``memo`` knew: the session that taught
    it may have been left half done. ``statics`` are the pools' static
    verdicts on this state's nodes, when the caller keeps them.
    """
    clock = time.perf_counter
    caches = SessionCaches(backlog=memo, statics=statics if statics is not None else {})
    if memo is not None:
        assert snapshot is not None, "a memo compares each session's snapshot with the last"
        memo.begin(snapshot)
    # The index of bound pods (scheduler.engine.rules) is the session's: a
    # state kept for the next session is changed outside take and release.
    cluster.pod_index = None
    try:
        for name, action in ACTIONS:
            start = clock()
            action(cluster, caches)
            phases.append((name, clock() - start))
        start = clock()
        result = decisions(cluster, caches)
        phases.append(("decisions", clock() - start))
    except BaseException:
        if memo is not None:
            memo.abandon()
        raise
    finally:
        cluster.pod_index = None
    if timings is not None:
        timings.update(phases)
    return result


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic collector off for the block (and back on after, if it was)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()
