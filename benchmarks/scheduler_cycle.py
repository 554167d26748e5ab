"""Time one full scheduling session on large random snapshots.

Scenarios (targets in brackets):

(a) 1,000 nodes x 8 GPUs, 10,000 pending pods of mixed shapes (single
    pods of 1-8 GPUs, gangs of 8-64 pods, GPU slices), 100 queues in three
    levels  [under 1 s];
(b) 5,000 nodes x 8 GPUs, 150,000 pods, mostly running (whole GPUs, slices
    and CPU-only pods), 10 % pending  [under 3 s];
(c) 5,000 nodes x 8 GPUs in 10 zones, half of every node's GPUs held by
    15,000 running pods, 10,000 pods pending of (a)'s shapes, with Kubernetes
    placement rules on the jobs of both: 20 % with required node affinity (a
    GPU product, or three zones), 10 % with required pod anti-affinity (a
    job's pods apart, by hostname), 5 % with a hard topology spread over
    zones  [one session under 2 s]; then the kept-state (incremental)
    session once those binds ran and 1,000 more pods arrived  [under 1 s].

For (a) and (b) the script prints the wall and CPU time of ``run_session``
(which includes turning the Snapshot into working state; building the random
Snapshot is not timed) with its time per phase, the peak memory the session
allocates (measured in a second, traced run, because tracing slows Python
down), and, measured side by side in the same process, a straightforward
baseline: the same session with every pod placed by scanning and scoring
every node of its pool (no buckets, no shape caches), so the difference is
the placement data layout alone. The baseline is stopped after a time budget;
its total is then extrapolated from the share of allocate's jobs it got
through, or given as a lower bound, as the output says.

For (c), beside each figure, its baseline is the same session over the same
snapshot with every placement rule taken out: what the rules cost.

Run: ``python benchmarks/scheduler_cycle.py [--scenario a|b|c|both|all] [--seed N]``
(``both`` is a and b).
"""

from __future__ import annotations

import argparse
import gc
import random
import time
import tracemalloc
from dataclasses import dataclass, replace
from typing import Any

from gpuwarden.contract import ANNOTATION_GPU_FRACTION, ANNOTATION_GPU_MEMORY
from scheduler.engine import gangs, scoring
from scheduler.engine.actions import allocate, consolidate
from scheduler.engine.build import build_cluster
from scheduler.engine.caches import SessionCaches
from scheduler.engine.incremental import Engine
from scheduler.engine.model import (
    UNLIMITED,
    Decisions,
    Gpu,
    Job,
    LabelSelector,
    Node,
    NodeTerm,
    Placement,
    PlacementStrategy,
    PodTerm,
    Queue,
    QueueResource,
    Requirement,
    Snapshot,
    SpreadConstraint,
    Task,
    TaskStatus,
)
from scheduler.engine.predicates import static_exclusion
from scheduler.engine.scoring import fit_on_node
from scheduler.engine.session import run_session
from scheduler.engine.state import Cluster, JobState, NodeState, TaskState
from scheduler.engine.statement import Statement

GPU_MEM = 81920
NODE_CPU = 128_000
NODE_MEM = 1024 * 1024
BASELINE_BUDGET_S = 60.0


def make_queues(rng: random.Random) -> tuple[list[Queue], list[str]]:
    """100 queues in three levels: 4 departments, 16 projects, 80 teams."""
    queues: list[Queue] = []
    leaves: list[str] = []

    def res(quota: int) -> QueueResource:
        return QueueResource(quota, UNLIMITED, rng.choice([1.0, 1.0, 2.0]))

    for d in range(4):
        dept = f"dept-{d}"
        queues.append(Queue(dept, gpu=res(1_000_000), cpu=res(UNLIMITED), memory=res(UNLIMITED)))
        for p in range(4):
            proj = f"{dept}-proj-{p}"
            queues.append(Queue(proj, parent=dept, gpu=res(200_000), cpu=res(UNLIMITED), memory=res(UNLIMITED)))
            for t in range(5):
                team = f"{proj}-team-{t}"
                queues.append(
                    Queue(
                        team,
                        parent=proj,
                        priority=rng.choice([0, 0, 1]),
                        gpu=res(rng.choice([8_000, 16_000, 32_000])),
                        cpu=res(UNLIMITED),
                        memory=res(UNLIMITED),
                    )
                )
                leaves.append(team)
    return queues, leaves


def make_nodes(count: int) -> list[Node]:
    gpus = tuple(Gpu(i, uuid=f"GPU-{i}", memory_mib=GPU_MEM) for i in range(8))
    return [Node(f"node-{i:05d}", cpu_milli=NODE_CPU, memory_mib=NODE_MEM, gpus=gpus) for i in range(count)]


def _pending_job(rng: random.Random, index: int, leaves: list[str], budget: int) -> Job:
    """One pending job of a random shape, at most ``budget`` pods."""
    queue = rng.choice(leaves)
    roll = rng.random()
    priority = rng.choice([10, 50, 50, 100])
    created = float(rng.randrange(1_000_000))
    name = f"p-{index}"
    if roll < 0.25 and budget >= 8:
        size = min(budget, rng.randrange(8, 65))
        gpus = rng.choice([1, 2, 4, 8])
        tasks = tuple(
            Task(f"{name}-{k}", uid=f"{name}-{k}", cpu_milli=4000 * gpus, memory_mib=32768 * gpus, gpus=gpus)
            for k in range(size)
        )
        return Job(name, queue, uid=name, priority=priority, min_member=size, created=created, tasks=tasks)
    if roll < 0.55:
        ann = (
            {ANNOTATION_GPU_FRACTION: rng.choice(["0.25", "0.5"])}
            if rng.random() < 0.6
            else {ANNOTATION_GPU_MEMORY: rng.choice(["10000", "20000", "40000"])}
        )
        task = Task(f"{name}-0", uid=f"{name}-0", cpu_milli=2000, memory_mib=16384, annotations=ann)
        return Job(name, queue, uid=name, priority=priority, created=created, tasks=(task,))
    gpus = rng.choice([1, 1, 1, 2, 4, 8])
    task = Task(f"{name}-0", uid=f"{name}-0", cpu_milli=4000 * gpus, memory_mib=32768 * gpus, gpus=gpus)
    return Job(name, queue, uid=name, priority=priority, created=created, tasks=(task,))


def scenario_a(seed: int) -> Snapshot:
    rng = random.Random(seed)
    queues, leaves = make_queues(rng)
    nodes = make_nodes(1000)
    jobs: list[Job] = []
    pods = 0
    while pods < 10_000:
        job = _pending_job(rng, len(jobs), leaves, 10_000 - pods)
        jobs.append(job)
        pods += len(job.tasks)
    return Snapshot(tuple(nodes), tuple(queues), tuple(jobs), now=2_000_000.0)


def scenario_b(seed: int) -> Snapshot:
    """150,000 pods: ~135,000 running packed onto 5,000 nodes, 15,000 pending."""
    rng = random.Random(seed)
    queues, leaves = make_queues(rng)
    nodes = make_nodes(5000)
    jobs: list[Job] = []
    running = 0
    # Fill each node: 2 GPUs whole (one 2-GPU pod), 4 GPUs sliced in quarters
    # (16 slice pods), 1 GPU whole, 1 GPU free on some nodes, and CPU-only pods.
    for n, node in enumerate(nodes):
        owner = leaves[n % len(leaves)]
        base = f"r-{n}"
        tasks_whole = Task(
            f"{base}-w",
            uid=f"{base}-w",
            status=TaskStatus.RUNNING,
            cpu_milli=8000,
            memory_mib=65536,
            gpus=2,
            node=node.name,
            gpu_indices=(0, 1),
        )
        jobs.append(Job(f"{base}-w", owner, uid=f"{base}-w", priority=50, created=float(n), tasks=(tasks_whole,)))
        running += 1
        for s in range(16):
            gpu = 2 + s // 4
            t = Task(
                f"{base}-s{s}",
                uid=f"{base}-s{s}",
                status=TaskStatus.RUNNING,
                cpu_milli=1000,
                memory_mib=8192,
                annotations={ANNOTATION_GPU_FRACTION: "0.25"},
                node=node.name,
                gpu_indices=(gpu,),
            )
            jobs.append(Job(f"{base}-s{s}", leaves[(n + s) % len(leaves)], uid=f"{base}-s{s}", priority=10, tasks=(t,)))
            running += 1
        single = Task(
            f"{base}-g",
            uid=f"{base}-g",
            status=TaskStatus.RUNNING,
            cpu_milli=4000,
            memory_mib=32768,
            gpus=1,
            node=node.name,
            gpu_indices=(6,),
        )
        jobs.append(Job(f"{base}-g", owner, uid=f"{base}-g", priority=50, tasks=(single,)))
        running += 1
        cpu_pods = 8 if n % 2 else 9
        cpu_tasks = tuple(
            Task(
                f"{base}-c{c}",
                uid=f"{base}-c{c}",
                status=TaskStatus.RUNNING,
                cpu_milli=2000,
                memory_mib=4096,
                node=node.name,
            )
            for c in range(cpu_pods)
        )
        jobs.append(Job(f"{base}-c", owner, uid=f"{base}-c", priority=10, tasks=cpu_tasks))
        running += cpu_pods
        if n % 3 == 0:
            held = Task(
                f"{base}-h",
                uid=f"{base}-h",
                status=TaskStatus.RUNNING,
                cpu_milli=4000,
                memory_mib=32768,
                gpus=1,
                node=node.name,
                gpu_indices=(7,),
            )
            jobs.append(Job(f"{base}-h", owner, uid=f"{base}-h", priority=100, tasks=(held,)))
            running += 1
    pods = running
    index = 0
    while pods < 150_000:
        job = _pending_job(rng, index, leaves, 150_000 - pods)
        jobs.append(job)
        pods += len(job.tasks)
        index += 1
    return Snapshot(tuple(nodes), tuple(queues), tuple(jobs), now=2_000_000.0)


# --------------------------------------------------------------------------
# Baseline: the same session, placing each pod by scanning every node
# --------------------------------------------------------------------------


_Place = tuple[NodeState, tuple[int, ...], tuple[int, ...]]


class _OutOfTimeError(Exception):
    """The baseline ran past its budget."""


def _naive_best(
    nodes: list[NodeState], task: TaskState, spread: bool
) -> tuple[NodeState, tuple[int, ...], tuple[int, ...]] | None:
    """Check every node and keep the best by the strategy's score."""
    best: tuple[tuple[int, int, int], NodeState, tuple[int, ...], tuple[int, ...]] | None = None
    for node in nodes:
        if static_exclusion(node, task) is not None:
            continue
        found = fit_on_node(node, task)
        if found is None:
            continue
        score = (node.tier, -node.free_whole if spread else node.free_whole, node.pidx)
        if best is None or score < best[0]:
            best = (score, node, found[0], found[1])
    return None if best is None else (best[1], best[2], best[3])


@dataclass
class _NaivePlacement:
    """Stands in for the engine's indexed ``find_place`` (no buckets, no caches)."""

    deadline: float
    jobs_seen: int = 0

    def find_place(
        self, cluster: Cluster, caches: SessionCaches, task: TaskState
    ) -> tuple[NodeState, tuple[int, ...], tuple[int, ...]] | None:
        if time.perf_counter() > self.deadline:
            raise _OutOfTimeError
        pool = task.job.pool
        if pool is None:
            return None
        return _naive_best(pool.nodes, task, pool.strategy is PlacementStrategy.SPREAD)

    def place_job(
        self,
        cluster: Cluster,
        caches: SessionCaches,
        stmt: Statement,
        job: JobState,
        *,
        beyond_gang: bool = True,
        memo: Any = None,
    ) -> Any:
        self.jobs_seen += 1
        return _ENGINE_PLACE_JOB(cluster, caches, stmt, job, beyond_gang=beyond_gang, memo=memo)


_ENGINE_PLACE_JOB = gangs.place_job
_ENGINE_FIND_PLACE = scoring.find_place


@dataclass
class BaselineResult:
    seconds: float
    jobs_done: int
    jobs_total: int
    binds: int | None  # None when stopped early

    @property
    def extrapolated(self) -> float:
        if self.binds is not None:
            return self.seconds
        if self.jobs_done == 0:
            return float("inf")
        return self.seconds * self.jobs_total / self.jobs_done


def baseline(snapshot: Snapshot, budget_s: float) -> BaselineResult:
    """Run the whole session with naive placement swapped in for the indexed one.

    Everything else (state build, fair share, ordering, limits, gangs, the
    six actions) is the engine's own, so the difference is the placement
    data layout alone. Past the budget the run is abandoned and its time
    extrapolated from the share of allocate's jobs it got through.
    """
    total = sum(1 for j in build_cluster(snapshot).pending_jobs if j.queue is not None and j.error is None)
    naive = _NaivePlacement(deadline=time.perf_counter() + budget_s)
    # Gangs call find_place (or place_for, which calls it), and so does the victim search.
    patched = [(scoring, "find_place"), (gangs, "find_place"), (consolidate, "find_place")]
    for module, name in patched:
        setattr(module, name, naive.find_place)
    setattr(allocate, "place_job", naive.place_job)  # noqa: B010 (swapping a module global)
    start = time.perf_counter()
    try:
        decisions = run_session(snapshot)
        return BaselineResult(time.perf_counter() - start, total, total, len(decisions.binds))
    except _OutOfTimeError:
        return BaselineResult(time.perf_counter() - start, naive.jobs_seen, total, None)
    finally:
        for module, name in patched:
            setattr(module, name, _ENGINE_FIND_PLACE)
        setattr(allocate, "place_job", _ENGINE_PLACE_JOB)  # noqa: B010


# --------------------------------------------------------------------------


def measure(name: str, snapshot: Snapshot) -> None:
    pods = sum(len(j.tasks) for j in snapshot.jobs)
    pending = sum(1 for j in snapshot.jobs for t in j.tasks if t.status is TaskStatus.PENDING)
    gpus = sum(len(n.gpus) for n in snapshot.nodes)
    print(
        f"scenario {name}: {len(snapshot.nodes)} nodes, {gpus} GPUs, {pods} pods "
        f"({pending} pending), {len(snapshot.jobs)} jobs, {len(snapshot.queues)} queues"
    )
    gc.collect()
    runs: list[tuple[float, float, dict[str, float]]] = []
    decisions = None
    for _ in range(3):
        phases: dict[str, float] = {}
        wall, cpu = time.perf_counter(), time.process_time()
        decisions = run_session(snapshot, phases)
        runs.append((time.perf_counter() - wall, time.process_time() - cpu, phases))
        del decisions
        gc.collect()
    decisions = run_session(snapshot)
    best = min(runs, key=lambda r: r[0])
    print(
        f"  engine session:   {best[0]:7.3f} s wall, {best[1]:.3f} s CPU (best of 3; wall "
        f"{', '.join(f'{r[0]:.3f}' for r in runs)}) -> {len(decisions.binds)} binds, "
        f"{len(decisions.evictions)} evictions, {len(decisions.pending)} pending jobs"
    )
    print("    phases: " + ", ".join(f"{name} {seconds:.3f}" for name, seconds in best[2].items()))
    # Two versions of the engine can fill the same GPUs with different pods
    # (more small ones, fewer large ones): the session's time follows the
    # placements it makes, so it is also given per bind.
    print(f"  per bind:         {best[0] / max(1, len(decisions.binds)) * 1000:7.4f} ms wall")
    del decisions
    gc.collect()
    tracemalloc.start()
    run_session(snapshot)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"  engine peak memory (traced run): {peak / 2**20:.1f} MiB")
    gc.collect()
    result = baseline(snapshot, BASELINE_BUDGET_S)
    label = "baseline (same session, every pod placed by scanning every node)"
    if result.binds is not None:
        print(f"  {label}: {result.seconds:7.3f} s -> {result.binds} binds")
    elif result.jobs_done >= result.jobs_total:
        print(
            f"  {label}: stopped after {result.seconds:.1f} s, past allocate but before the session "
            f"ended; at least {result.seconds:.1f} s"
        )
    else:
        print(
            f"  {label}: stopped after {result.seconds:.1f} s at {result.jobs_done}/{result.jobs_total} "
            f"of allocate's jobs; extrapolated {result.extrapolated:.1f} s"
        )
    at_least = "at least " if result.binds is None and result.jobs_done >= result.jobs_total else ""
    print(f"  speed-up over baseline: {at_least}{result.extrapolated / best[0]:.1f}x")


# --------------------------------------------------------------------------
# (c): placement rules
# --------------------------------------------------------------------------

ZONES = 10
ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"
PRODUCT = "nvidia.com/gpu.product"
PRODUCTS = ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H200")


def _zoned(nodes: tuple[Node, ...]) -> tuple[Node, ...]:
    return tuple(
        replace(n, labels={HOST: n.name, ZONE: f"zone-{i % ZONES}", PRODUCT: PRODUCTS[(i // ZONES) % 2]})
        for i, n in enumerate(nodes)
    )


def _with_rules(rng: random.Random, job: Job) -> Job:
    """``job`` with an ``app`` label on its pods and, by chance, one kind of rule on all of them.

    20 % required node affinity, 10 % required anti-affinity between the
    job's own pods by hostname, 5 % a hard spread of its pods over zones.
    """
    app = (("app", job.name),)
    roll = rng.random()
    placement: Placement | None = None
    if roll < 0.20:
        if rng.random() < 0.5:
            term = NodeTerm(expressions=(Requirement(PRODUCT, "In", (rng.choice(PRODUCTS),)),))
        else:
            zones = tuple(f"zone-{z}" for z in rng.sample(range(ZONES), 3))
            term = NodeTerm(expressions=(Requirement(ZONE, "In", zones),))
        placement = Placement(node_terms=(term,))
    elif roll < 0.30:
        placement = Placement(anti_affinity=(PodTerm(HOST, LabelSelector(match_labels=app)),))
    elif roll < 0.35:
        placement = Placement(spread=(SpreadConstraint(1, ZONE, True, LabelSelector(match_labels=app)),))
    tasks = tuple(replace(t, labels=dict(app), placement=placement) for t in job.tasks)
    return replace(job, tasks=tasks)


def _without_rules(snapshot: Snapshot) -> Snapshot:
    jobs = tuple(replace(j, tasks=tuple(replace(t, placement=None) for t in j.tasks)) for j in snapshot.jobs)
    return replace(snapshot, jobs=jobs)


def scenario_c(seed: int) -> Snapshot:
    """5,000 nodes in 10 zones, half of each node's GPUs held (15,000 running pods), 10,000 pods pending."""
    rng = random.Random(seed)
    queues, leaves = make_queues(rng)
    nodes = _zoned(tuple(make_nodes(5000)))
    jobs: list[Job] = []
    for n, node in enumerate(nodes):
        for k, (gpus, held) in enumerate(((2, (0, 1)), (1, (2,)), (1, (3,)))):
            name = f"r-{n}-{k}"
            task = Task(
                name,
                uid=name,
                status=TaskStatus.RUNNING,
                cpu_milli=4000 * gpus,
                memory_mib=32768 * gpus,
                gpus=gpus,
                node=node.name,
                gpu_indices=held,
            )
            owner = leaves[(n + k) % len(leaves)]
            jobs.append(Job(name, owner, uid=name, priority=50, created=float(n), tasks=(task,)))
    pods = 0
    while pods < 10_000:
        job = _pending_job(rng, len(jobs), leaves, 10_000 - pods)
        jobs.append(job)
        pods += len(job.tasks)
    rules = random.Random(seed + 1)
    return Snapshot(nodes, tuple(queues), tuple(_with_rules(rules, j) for j in jobs), now=2_000_000.0)


def _after(snapshot: Snapshot, decisions: Decisions, seed: int, arrivals: int) -> Snapshot:
    """``snapshot`` once ``decisions`` ran (binds running, evicted pods gone) and ``arrivals`` more pods came."""
    bound = {(b.namespace, b.pod): b for b in decisions.binds}
    gone = {(e.namespace, e.pod) for e in decisions.evictions}
    jobs: list[Job] = []
    for job in snapshot.jobs:
        tasks: list[Task] = []
        changed = False
        for task in job.tasks:
            ident = (task.namespace, task.name)
            if ident in gone:
                changed = True
                continue
            bind = bound.get(ident)
            if bind is not None:
                tasks.append(replace(task, status=TaskStatus.RUNNING, node=bind.node, gpu_indices=bind.gpu_indices))
                changed = True
            else:
                tasks.append(task)
        jobs.append(replace(job, tasks=tuple(tasks)) if changed else job)
    rng = random.Random(seed + 2)
    queues = [q.name for q in snapshot.queues if not any(o.parent == q.name for o in snapshot.queues)]
    pods = 0
    index = 0
    while pods < arrivals:
        job = _with_rules(rng, _pending_job(rng, 1_000_000 + index, queues, arrivals - pods))
        jobs.append(job)
        pods += len(job.tasks)
        index += 1
    return replace(snapshot, jobs=tuple(jobs), now=snapshot.now + 1.0)


def _best_session(snapshot: Snapshot, runs: int = 3) -> tuple[float, Decisions]:
    best = float("inf")
    decisions: Decisions | None = None
    for _ in range(runs):
        gc.collect()
        start = time.perf_counter()
        decisions = run_session(snapshot)
        best = min(best, time.perf_counter() - start)
    assert decisions is not None
    return best, decisions


def _best_incremental(first: Snapshot, second: Snapshot, runs: int = 3) -> float:
    """Seconds of the kept-state session over ``second`` after one over ``first`` (best of ``runs``)."""
    best = float("inf")
    for _ in range(runs):
        engine = Engine()
        engine.run(first)
        gc.collect()
        start = time.perf_counter()
        engine.run(second)
        best = min(best, time.perf_counter() - start)
        assert engine.updates == 1, "the second session rebuilt its state instead of updating it"
    return best


def measure_rules(seed: int) -> None:
    snapshot = scenario_c(seed)
    pods = sum(len(j.tasks) for j in snapshot.jobs)
    ruled = sum(1 for j in snapshot.jobs for t in j.tasks if t.placement is not None)
    print(
        f"scenario c: {len(snapshot.nodes)} nodes in {ZONES} zones, {pods} pods, {ruled} with placement rules "
        f"({len(snapshot.jobs)} jobs)"
    )
    plain = _without_rules(snapshot)
    seconds, decisions = _best_session(snapshot)
    plain_seconds, plain_decisions = _best_session(plain)
    print(
        f"  session: {seconds:.3f} s with rules -> {len(decisions.binds)} binds; "
        f"{plain_seconds:.3f} s without -> {len(plain_decisions.binds)} binds (best of 3)"
    )
    later = _after(snapshot, decisions, seed, 1000)
    plain_later = _after(plain, plain_decisions, seed, 1000)
    plain_later = _without_rules(plain_later)
    incremental = _best_incremental(snapshot, later)
    plain_incremental = _best_incremental(plain, plain_later)
    print(
        f"  incremental session after 1,000 arrivals: {incremental:.3f} s with rules; "
        f"{plain_incremental:.3f} s without (best of 3)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=["a", "b", "c", "both", "all"], default="both")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    if args.scenario in ("a", "both", "all"):
        measure("a", scenario_a(args.seed))
    if args.scenario in ("b", "both", "all"):
        measure("b", scenario_b(args.seed))
    if args.scenario in ("c", "all"):
        measure_rules(args.seed)


if __name__ == "__main__":
    main()
