"""The incremental cycle under single-pod churn, beside another scheduler's pods: milliseconds per cycle.

What a cycle of ``gpuwarden scheduler`` costs when one pod arrives and
binds, one of its own ends and one of another scheduler's ends (the
contender soak's load, ``scheduler_soak.py --mode contender``), measured
without an API server: a real :class:`ClusterCache` fed the watch events,
the runner's :class:`ClusterViews`, and ``SchedulingCycle.prepare`` and
``decide`` (grouping, assembly, the claim and volume stages, the kept
engine state brought up to date, the session), with the process's
collector thresholds and its ``gc.freeze`` after the first cycles. The
executors are left out: no API call is made.

The cluster: ``--nodes`` nodes of 8 GPUs with their GPUNodes; ``--foreign``
running single-GPU pods of kube-scheduler's (``schedulerName:
default-scheduler``, no GPU assignment), ``--ours`` running pods of
gpuwarden's (with the assignment a bind writes) and ``--finished`` of its
pods Succeeded and left in place, all bare pods in one queue.

Baseline, in the same process and interleaved (``--runs``, alternating
which side goes first): the engine's diff of the snapshot's jobs by sets
(a dict of every job and two set differences, what it did before
``job_delta``), against the walk that costs what changed. Both sides must
bind the same pods to the same nodes and GPUs. Prints min and median.

Then the idle leader's catch-up (the runner's ``--quiet-settle``), also
interleaved: the time of an arrival's turn alone when the two pods that
ended were folded in by a turn of their own before it, against the turn
that folds them in itself, as every arrival's did before. Both sides must
bind alike too.

Then the status writer's call after each turn, with the facts the cycle
hands its bookkeeping (bare pods: no PodGroup is written for a lone pod's
group), interleaved: told which running groups changed (now) against a
pass over every running group (before). Both sides must patch alike.

Last, the cyclic collector over ``--gc-cycles`` cycles, interleaved: Python's
automatic collection at the process's thresholds (what the scheduler did
until its loop took collection over) against :class:`LoopCollector` called
after each cycle (``--young-limit``): collections per run, the longest
pause, all pauses per 1000 cycles, the cycles' own time; and what one full
collection of the whole process takes once thawed (what an old collection
looked at once every pod had been seen again, and what the collector's
hourly sweep costs).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import structlog
from kubernetes import client

from gpuwarden import contract
from gpuwarden.contract import LABEL_QUEUE
from gpuwarden.kube import KubeApi
from scheduler.cluster.assignment import encode_assignment
from scheduler.cluster.cache import GPUNODES, NODES, PODGROUPS, PODS, QUEUES, ClusterCache, WatchedResource
from scheduler.cluster.cycle import SchedulingCycle
from scheduler.cluster.grouping import derive_group
from scheduler.cluster.slim import slim_node, slim_pod, without_managed_fields
from scheduler.cluster.status import StatusWriter
from scheduler.cluster.watch import EventType, WatchEvent, object_key
from scheduler.collector import YOUNG_LIMIT, LoopCollector
from scheduler.engine import incremental
from scheduler.engine.model import Bind, Decisions, Gpu, Node, Snapshot
from scheduler.runner import GC_THRESHOLDS, ClusterViews
from tests.scheduler.cluster.objects import gpunode_json, node_json, pod_json, report

JSON = dict[str, Any]
QUEUE = "team-a"
GPUS = 8
NOW = 1_800_000_000.0
WARM_CYCLES = 30
T = TypeVar("T")
D = TypeVar("D")


class Churn:
    """One cache, views and cycle over the benchmark's cluster; ``cycle`` plays one step of churn."""

    def __init__(self, nodes: int, foreign: int, ours: int, finished: int) -> None:
        if foreign + ours > nodes * GPUS:
            raise SystemExit("--foreign plus --ours is more than the nodes' GPUs")
        slims = {NODES: slim_node, PODS: slim_pod}
        self.cache = ClusterCache(
            resources=[
                WatchedResource(name, lambda api: None, slims.get(name, without_managed_fields))
                for name in (NODES, GPUNODES, PODS, QUEUES, PODGROUPS)
            ],
            change_log=1_000_000,
        )
        self.names = [f"n{i}" for i in range(nodes)]
        self.engine_nodes = {n: Node(n, gpus=tuple(Gpu(i) for i in range(GPUS))) for n in self.names}
        self.next_gpu: dict[str, int] = {}
        self.seen: set[str] = set()
        self._add(QUEUES, _queue(QUEUE))
        for name in self.names:
            self._add(NODES, node_json(name, gpus=GPUS))
            self._add(GPUNODES, gpunode_json(report(name)))
        for i in range(foreign):
            node = self._free_node()
            self._add(PODS, pod_json(f"f{i}", gpus=1, node=node, scheduler="default-scheduler", phase="Running"))
        self.foreign = [(f"f{i}", "") for i in range(foreign)]
        self.ours: list[tuple[str, str, tuple[int, ...]]] = []
        for i in range(ours):
            node = self._free_node()
            self._ours(f"o{i}", node, (self.next_gpu[node] - 1,), "Running")
            self.ours.append((f"o{i}", node, (self.next_gpu[node] - 1,)))
        for i in range(finished):
            self._ours(f"d{i}", self.names[i % nodes], (0,), "Succeeded")
        api = KubeApi(client.ApiClient(), field_manager=contract.SCHEDULER_COMPONENT)  # no call is made
        self.scheduling = SchedulingCycle(api)
        self.views = ClusterViews()
        self.step = 0
        self.bound: list[tuple[str, str, tuple[int, ...]]] = []
        self.decided: tuple[Snapshot, Decisions] | None = None  # the last turn's snapshot and decisions

    def _add(self, store: str, obj: JSON, kind: EventType = EventType.ADDED) -> None:
        self.cache.apply(store, WatchEvent(kind, object_key(obj), obj))

    def _free_node(self) -> str:
        for name in self.names:
            if self.next_gpu.get(name, 0) < GPUS:
                self.next_gpu[name] = self.next_gpu.get(name, 0) + 1
                return name
        raise AssertionError("no free GPU")

    def _ours(self, name: str, node: str | None, gpus: tuple[int, ...], phase: str | None) -> JSON:
        assignment = None
        if node is not None:
            bind = Bind("j", "team-a", name, f"uid-team-a-{name}", node, gpu_indices=gpus)
            assignment = encode_assignment(bind, self.engine_nodes[node])
        pod = pod_json(name, gpus=1, node=node, phase=phase, assignment=assignment, labels={LABEL_QUEUE: QUEUE})
        if name in self.seen:
            self._add(PODS, pod, EventType.MODIFIED)
        else:
            # Its derived PodGroup exists from the start: the cycle has none to create.
            self.seen.add(name)
            self._add(PODGROUPS, _podgroup(derive_group(pod, []).name))
            self._add(PODS, pod)
        return pod

    def cycle(self, *, fold_first: bool = False) -> float:
        """One of ours and one foreign pod end, one pod arrives; prepare and decide; the bind lands.

        With ``fold_first`` a turn of their own folds the ends in before the
        arrival, as an idle leader does. Returns the seconds of the
        arrival's turn.
        """
        step = self.step
        self.step += 1
        if self.ours:
            name, node, gpus = self.ours.pop(0)
            self._ours(name, node, gpus, "Succeeded")
        if self.foreign:
            name, _ = self.foreign.pop(0)
            done = pod_json(name, gpus=1, node=self.names[0], scheduler="default-scheduler", phase="Succeeded")
            self._add(PODS, done, EventType.MODIFIED)
        if fold_first:
            self._turn(step)
        self._ours(f"p{step}", None, (), None)
        began = time.perf_counter()
        decisions = self._turn(step)
        took = time.perf_counter() - began
        for bind in decisions.binds:
            self._ours(bind.pod, bind.node, bind.gpu_indices, "Running")
            self.bound.append((bind.pod, bind.node, bind.gpu_indices))
            self.ours.append((bind.pod, bind.node, bind.gpu_indices))
        return took

    def _turn(self, step: int) -> Decisions:
        view = self.views.next(self.views.take(self.cache))
        snapshot = self.scheduling.prepare(view, NOW + step)
        self.decided = (snapshot, self.scheduling.decide(snapshot, {}))
        return self.decided[1]


def _queue(name: str) -> JSON:
    return {
        "apiVersion": f"{contract.SCHEDULING_API_GROUP}/{contract.SCHEDULING_API_VERSION}",
        "kind": contract.QUEUE_KIND,
        "metadata": {"name": name, "uid": f"queue-{name}"},
        "spec": {"resources": {"gpu": {"quota": 100_000}}},
    }


def _podgroup(name: str) -> JSON:
    return {
        "apiVersion": f"{contract.SCHEDULING_API_GROUP}/{contract.SCHEDULING_API_VERSION}",
        "kind": contract.PODGROUP_KIND,
        "metadata": {"name": name, "namespace": "team-a", "uid": f"pg-{name}"},
        "spec": {"minMember": 1, "queue": QUEUE},
    }


@contextmanager
def diff_by_sets() -> Iterator[None]:
    """The baseline: the engine diffs the jobs by sets, as before ``job_delta``."""
    walk = incremental.job_delta
    incremental.job_delta = lambda *_: None  # type: ignore[assignment]
    try:
        yield
    finally:
        incremental.job_delta = walk


Bound = list[tuple[str, str, tuple[int, ...]]]


@dataclass(frozen=True)
class RunResult:
    """One run: milliseconds per cycle, of an arrival's turn within one, and what was bound."""

    cycle_ms: float
    arrival_ms: float
    bound: Bound


def one_run(args: argparse.Namespace, *, baseline: bool = False, fold_first: bool = False) -> RunResult:
    """``--cycles`` cycles after the warm-up; ``fold_first``: the ends folded in by a turn before each arrival."""
    gc.unfreeze()
    gc.collect()
    churn = Churn(args.nodes, args.foreign, args.ours, args.finished)
    side: Callable[[], Any] = diff_by_sets if baseline else contextlib.nullcontext
    with side():
        for _ in range(WARM_CYCLES):
            churn.cycle(fold_first=fold_first)
        gc.freeze()  # as the process does after its first sync
        began = time.perf_counter()
        arrival = sum(churn.cycle(fold_first=fold_first) for _ in range(args.cycles))
        took = time.perf_counter() - began
    engine = churn.scheduling._engine
    assert engine is not None and engine.rebuilds == 1, "the kept state was rebuilt: these cycles were not incremental"
    return RunResult(1000 * took / args.cycles, 1000 * arrival / args.cycles, churn.bound)


@dataclass(frozen=True)
class Collected:
    """One run's cyclic collections: each pause (ms), the cycles' mean (ms), and a full collection's pause (ms)."""

    pauses: tuple[float, ...]
    cycle_ms: float
    full_ms: float


def collections_run(args: argparse.Namespace, *, by_loop: bool) -> tuple[Collected, Bound]:
    """``--gc-cycles`` cycles after the warm-up, every collection timed; ``by_loop``: the loop's collector.

    Before: automatic collection at the process's thresholds, with what the
    first cycles built frozen (as the runner did after its first cycle).
    Now: :class:`LoopCollector` (its sweep out of reach), called after each
    cycle as the runner calls it. Last, what a full collection of the whole
    process takes once it is thawed: what an old collection comes to look at
    once every pod was seen again, and what the collector's sweep costs (at
    a small size the process's own objects are most of it).
    """
    gc.unfreeze()
    gc.collect()
    churn = Churn(args.nodes, args.foreign, args.ours, args.finished)
    for _ in range(WARM_CYCLES):
        churn.cycle(fold_first=True)
    collector = LoopCollector(young_limit=args.young_limit, sweep_every_s=math.inf) if by_loop else None
    pauses: list[float] = []
    began_at: list[float] = []

    def timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began_at.append(time.perf_counter())
        else:
            pauses.append(1000 * (time.perf_counter() - began_at.pop()))

    gc.freeze()
    if collector is not None:
        collector.start()
    gc.callbacks.append(timed)
    try:
        began = time.perf_counter()
        for _ in range(args.gc_cycles):
            churn.cycle(fold_first=True)
            if collector is not None:
                collector.between_cycles()
        took = time.perf_counter() - began
    finally:
        gc.callbacks.remove(timed)
        if collector is not None:
            collector.stop()
    gc.unfreeze()
    began = time.perf_counter()
    gc.collect()
    full = time.perf_counter() - began
    return Collected(tuple(pauses), 1000 * took / args.gc_cycles, 1000 * full), churn.bound


class _Recorded:
    """The status writer's API calls, recorded: nothing goes out."""

    def __init__(self) -> None:
        self.patched: list[str] = []

    def patch_podgroup_status(self, namespace: str, name: str, body: JSON) -> JSON:
        self.patched.append(f"{namespace}/{name}")
        return {"metadata": {"uid": f"pg-{name}"}}

    def patch_queue_status(self, name: str, body: JSON) -> JSON:
        return body

    def create_event(self, namespace: str, body: JSON) -> JSON:
        return body

    def patch_event(self, namespace: str, name: str, patch: JSON) -> JSON:
        return patch


def writer_run(args: argparse.Namespace, *, told: bool) -> tuple[float, list[str]]:
    """The status writer's call after each turn, as the cycle's bookkeeping makes it: ms per call, what it patched.

    As the cycle hands it over: the groups running at their minMember and
    how finished ones ended, each with what changed since the last call,
    for bare pods (nothing is written for a lone pod's group without news);
    ``told`` False leaves out which running groups changed (what the
    writer did before it was told, a pass over every running group).
    """
    gc.unfreeze()
    gc.collect()
    churn = Churn(args.nodes, args.foreign, args.ours, args.finished)
    api = _Recorded()
    writer = StatusWriter(api, workers=1)  # type: ignore[arg-type]
    took: list[float] = []
    turn = churn._turn

    def turn_then_write(step: int) -> Decisions:
        decisions = turn(step)
        assert churn.decided is not None
        met, met_changed, ended, ended_changed = churn.scheduling._job_facts(churn.decided[0])
        began = time.perf_counter()
        writer.write(
            decisions,
            gang_met=met,
            gang_met_changed=met_changed if told else None,
            finished=ended,
            finished_changed=ended_changed,
            # Bare pods, as in the contender soak: the cycle makes no PodGroup for a lone pod without news.
            unmirrored=lambda group: True,
        )
        took.append(time.perf_counter() - began)
        return decisions

    churn._turn = turn_then_write  # type: ignore[method-assign]
    for _ in range(WARM_CYCLES):
        churn.cycle(fold_first=True)
    gc.freeze()
    took.clear()
    for _ in range(args.cycles):
        churn.cycle(fold_first=True)
    return 1000 * sum(took) / len(took), api.patched


def interleaved(args: argparse.Namespace, run: Callable[[bool], tuple[T, D]]) -> tuple[dict[bool, list[T]], D]:
    """``run(side)`` for both sides ``--runs`` times, alternating which goes first; both must do alike.

    What a run did (its binds, or its status patches) must be the same from
    run to run and on both sides: a faster side that decides differently
    is not the same work done faster.
    """
    times: dict[bool, list[T]] = {False: [], True: []}
    did: dict[bool, D] = {}
    for turn in range(args.runs):
        for side in (False, True) if turn % 2 == 0 else (True, False):
            ms, done = run(side)
            times[side].append(ms)
            if did.setdefault(side, done) != done:
                raise SystemExit("one side did differently from run to run")
    if did[False] != did[True]:
        raise SystemExit("the two sides did different work (binds or status patches)")
    return times, did[False]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=300)
    parser.add_argument("--foreign", type=int, default=1100, help="kube-scheduler's running pods")
    parser.add_argument("--ours", type=int, default=1100, help="gpuwarden's running pods")
    parser.add_argument("--finished", type=int, default=5000, help="gpuwarden's Succeeded pods left in place")
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--gc-cycles", type=int, default=3000, help="cycles of each collection run")
    parser.add_argument("--young-limit", type=int, default=YOUNG_LIMIT, help="the loop collector's young limit")
    args = parser.parse_args(argv)
    thresholds = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    logging.disable(logging.WARNING)  # the foreign pods' guessed GPUs are warned about once each
    # Below warning a line is dropped before it is made, as in the process at its level (info drops the
    # writer's per-call debug line); structlog's own default prints every line.
    logs = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    try:
        return _compare(args)
    finally:  # restored: the test runs this inside its own process
        structlog.configure(**logs)
        logging.disable(logging.NOTSET)
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def _compare(args: argparse.Namespace) -> int:
    print(
        f"{args.nodes} nodes x {GPUS} GPUs; running {args.foreign} foreign and {args.ours} of ours, "
        f"{args.finished} finished; per cycle one arrival, one of ours and one foreign pod ending",
        flush=True,
    )

    def by_sets(baseline: bool) -> tuple[float, Bound]:
        done = one_run(args, baseline=baseline)
        return done.cycle_ms, done.bound

    times, bound = interleaved(args, by_sets)
    for baseline, label in ((True, "jobs diffed by sets (before)"), (False, "job_delta (now)")):
        values = times[baseline]
        print(
            f"{label}: prepare and decide per cycle min {min(values):.3f} ms median {statistics.median(values):.3f} ms"
        )
    print(f"binds: {len(bound)} per run, the same on both sides")

    def folded(fold_first: bool) -> tuple[float, Bound]:
        done = one_run(args, fold_first=fold_first)
        return done.arrival_ms, done.bound

    arrival, _ = interleaved(args, folded)
    for fold_first, label in ((False, "folding the ends in itself (before)"), (True, "ends folded in first (now)")):
        values = arrival[fold_first]
        print(f"an arrival's turn, {label}: min {min(values):.3f} ms median {statistics.median(values):.3f} ms")

    writes, patched = interleaved(args, lambda told: writer_run(args, told=told))
    for told, label in ((False, "a pass over every running group (before)"), (True, "told what changed (now)")):
        values = writes[told]
        print(f"the status writer's call, {label}: min {min(values):.3f} ms median {statistics.median(values):.3f} ms")
    print(f"status patches: {len(patched)} per run (lone pods' groups have no PodGroup), the same on both sides")

    runs, _ = interleaved(args, lambda by_loop: collections_run(args, by_loop=by_loop))
    thresholds = "/".join(map(str, GC_THRESHOLDS))
    for by_loop, label in (
        (False, f"automatic at {thresholds}, first cycles frozen (before)"),
        (True, f"by the loop between cycles, young limit {args.young_limit}, survivors frozen (now)"),
    ):
        done = runs[by_loop]
        pauses = [p for run in done for p in run.pauses]
        longest = f"{max(pauses):.1f} ms" if pauses else "- (none ran)"
        print(
            f"collections {label}: {len(pauses) / len(done):.1f} per run of {args.gc_cycles} cycles, "
            f"longest pause {longest}, all pauses per 1000 cycles "
            f"{1000 * sum(pauses) / len(done) / args.gc_cycles:.2f} ms; per cycle min "
            f"{min(r.cycle_ms for r in done):.3f} ms median {statistics.median(r.cycle_ms for r in done):.3f} ms"
        )
    full = [r.full_ms for side in runs.values() for r in side]
    print(
        f"a full collection of the whole process, thawed: min {min(full):.1f} ms median "
        f"{statistics.median(full):.1f} ms (an old collection once every pod was seen again; the sweep)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
