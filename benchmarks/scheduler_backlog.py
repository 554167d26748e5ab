"""A session over a deep backlog, with and without the backlog memo, side by side.

The cluster: N nodes x 8 GPUs (500 by default), nearly full of running
work (whole-GPU pods and half-GPU slices, 0-2 GPUs left free per node) but
for E idle nodes (2), four queues over-subscribing it, and a backlog of B
pending jobs (3,000 by default) none of which fits: gangs of 3-4 pods x 8
GPUs (wider than the idle nodes: their first pods are placed and undone),
and 2- and 4-GPU pods asking for more cores than a node has. Each round
runs the same snapshot through two kept-state engines (``Engine``, as the
scheduler runs it), one without and one with a
:class:`~scheduler.engine.backlog.BacklogMemo`, alternating which goes
first, and checks that they decide the same. Two sequences are timed:

- ``unchanged``: the same input again (the executor had nothing to do);
- ``churn``: between rounds a few running pods finish and leave one GPU
  free on a node, a few backlog jobs and a few single-GPU pods arrive, and
  the binds of the last round come back as running pods.

Printed per sequence: the session's wall time without and with the memo,
min and median over the rounds, and the attempts the memo let the last
session skip. No target: the figure is how the cost follows the backlog.

Run: ``python benchmarks/scheduler_backlog.py [--nodes N] [--backlog B] [--empty E] [--rounds R] [--seed S]``
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import replace

from gpuwarden.contract import ANNOTATION_GPU_FRACTION
from scheduler.engine.backlog import BacklogMemo
from scheduler.engine.incremental import Engine
from scheduler.engine.model import (
    UNLIMITED,
    Decisions,
    Gpu,
    Job,
    Node,
    Queue,
    QueueResource,
    Snapshot,
    Task,
    TaskStatus,
)

GPU_MEM = 81920
NODE_CPU = 128_000
NODE_MEM = 1024 * 1024
QUEUES = ("research", "training", "inference", "batch")


def _queues() -> tuple[Queue, ...]:
    return tuple(
        Queue(
            name,
            priority=i % 2,
            gpu=QueueResource(1000 * 1000, UNLIMITED, 1.0),
        )
        for i, name in enumerate(QUEUES)
    )


def _task(name: str, *, gpus: int = 0, cpu: int = 2000, ann: dict[str, str] | None = None) -> Task:
    return Task(name, uid=name, gpus=gpus, cpu_milli=cpu, memory_mib=8192, annotations=ann or {})


def _running(task: Task, node: str, indices: tuple[int, ...]) -> Task:
    return replace(task, status=TaskStatus.RUNNING, node=node, gpu_indices=indices)


def _cluster(rng: random.Random, count: int, empty: int) -> tuple[list[Node], list[Job]]:
    """Nodes nearly full: each keeps 0-2 GPUs free, a few GPUs half used by slices; ``empty`` nodes idle."""
    gpus = tuple(Gpu(i, uuid=f"GPU-{i}", memory_mib=GPU_MEM) for i in range(8))
    nodes: list[Node] = []
    jobs: list[Job] = []
    for n in range(count):
        name = f"node-{n:05d}"
        nodes.append(Node(name, cpu_milli=NODE_CPU, memory_mib=NODE_MEM, gpus=gpus))
        free = 8 if n < empty else rng.choice([0, 0, 1, 2])
        used = 8 - free
        g = 0
        while g < used:
            queue = rng.choice(QUEUES)
            key = f"run-{n}-{g}"
            if rng.random() < 0.2:
                ann = {ANNOTATION_GPU_FRACTION: "0.5"}
                task = _running(_task(f"{key}-0", ann=ann, cpu=4000), name, (g,))
                g += 1
            else:
                size = min(used - g, rng.choice([1, 2, 4]))
                task = _running(_task(f"{key}-0", gpus=size, cpu=4000 * size), name, tuple(range(g, g + size)))
                g += size
            jobs.append(Job(key, queue, uid=key, priority=rng.choice([10, 50]), created=1.0, tasks=(task,)))
    return nodes, jobs


def _backlog_job(rng: random.Random, index: int, created: float) -> Job:
    """A pending job that fits no node of the cluster above."""
    name = f"wait-{index}"
    queue = rng.choice(QUEUES)
    priority = rng.choice([10, 50, 80])
    roll = rng.random()
    if roll < 0.6:
        # Wider than the idle nodes: its first pods are placed, then undone.
        size = rng.choice([3, 4])
        tasks = tuple(_task(f"{name}-{k}", gpus=8, cpu=32_000) for k in range(size))
        return Job(name, queue, uid=name, priority=priority, min_member=size, created=created, tasks=tasks)
    # GPUs are free on some nodes, but never with more cores than a node has.
    task = _task(f"{name}-0", gpus=4 if roll < 0.8 else 2, cpu=NODE_CPU + 2000)
    return Job(name, queue, uid=name, priority=priority, created=created, tasks=(task,))


def first_snapshot(seed: int, nodes: int, backlog: int, empty: int = 2) -> Snapshot:
    rng = random.Random(seed)
    node_list, running = _cluster(rng, nodes, empty)
    pending = [_backlog_job(rng, i, 100.0 + i) for i in range(backlog)]
    return Snapshot(tuple(node_list), _queues(), tuple(running + pending), now=10_000.0)


def _churned(snapshot: Snapshot, decided: Decisions, rng: random.Random, step: int) -> Snapshot:
    """Binds come back running, a few running pods finish, a few jobs arrive."""
    binds = {(b.job, b.pod): b for b in decided.binds}
    evicted = {(e.job, e.pod) for e in decided.evictions}
    finishing = 3
    jobs: list[Job] = []
    for job in snapshot.jobs:
        touched = [t for t in job.tasks if (job.key, t.name) in binds or (job.key, t.name) in evicted]
        if not touched:
            if finishing and job.tasks[0].status is TaskStatus.RUNNING and rng.random() < 0.01:
                finishing -= 1  # finished: its room is free
                continue
            jobs.append(job)
            continue
        tasks: list[Task] = []
        for task in job.tasks:
            bind = binds.get((job.key, task.name))
            if (job.key, task.name) in evicted:
                continue
            tasks.append(task if bind is None else _running(task, bind.node, bind.gpu_indices))
        if tasks:
            jobs.append(replace(job, tasks=tuple(tasks), min_member=min(job.min_member, len(tasks))))
    created = snapshot.now + step
    for k in range(3):
        jobs.append(_backlog_job(rng, 1_000_000 + step * 10 + k, created))
    for k in range(3):
        name = f"small-{step}-{k}"
        jobs.append(Job(name, rng.choice(QUEUES), uid=name, created=created, tasks=(_task(f"{name}-0", gpus=1),)))
    return replace(snapshot, jobs=tuple(jobs), now=snapshot.now + 1.0, reservations=decided.reservations)


def _timed(engine: Engine, snapshot: Snapshot) -> tuple[float, Decisions]:
    gc.collect()
    start = time.perf_counter()
    decided = engine.run(snapshot)
    return time.perf_counter() - start, decided


def run_sequence(name: str, first: Snapshot, rounds: int, step: Callable[[Snapshot, Decisions, int], Snapshot]) -> None:
    plain = Engine()
    memo = BacklogMemo()
    kept = Engine(memo=memo)
    # The first session of each engine builds its state and teaches the memo: not timed.
    decided = plain.run(first)
    if kept.run(first) != decided:
        raise SystemExit(f"{name}: the memo changed a decision")
    without: list[float] = []
    with_memo: list[float] = []
    snapshot = step(first, decided, 0)
    for r in range(rounds):
        order = [(plain, without), (kept, with_memo)]
        if r % 2:
            order.reverse()
        results: list[Decisions] = []
        for engine, times in order:
            seconds, result = _timed(engine, snapshot)
            times.append(seconds)
            results.append(result)
        if results[0] != results[1]:
            raise SystemExit(f"{name}: round {r}: the memo changed a decision")
        snapshot = step(snapshot, results[0], r + 1)
    pending = len(results[0].pending)
    c = memo.counts
    print(
        f"{name:>9}: {pending} jobs pending; session without memo min {min(without) * 1000:7.1f} ms "
        f"median {statistics.median(without) * 1000:7.1f} ms | with memo min {min(with_memo) * 1000:7.1f} ms "
        f"median {statistics.median(with_memo) * 1000:7.1f} ms  (last session: gang searches "
        f"{c.placements_tried} tried, {c.placements_skipped} skipped; victim plans {c.plans_tried} tried, "
        f"{c.plans_skipped} skipped, {c.no_plans_skipped} jobs' lack of a plan replayed)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--backlog", type=int, default=3000)
    parser.add_argument("--empty", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    first = first_snapshot(args.seed, args.nodes, args.backlog, args.empty)
    print(
        f"{args.nodes} nodes x 8 GPUs ({args.empty} idle), {args.backlog} pending jobs that fit nowhere, "
        f"{args.rounds} rounds"
    )
    run_sequence("unchanged", first, args.rounds, lambda s, _d, i: replace(s, now=s.now + 1.0))
    rng = random.Random(args.seed + 1)
    run_sequence("churn", first, args.rounds, lambda s, d, i: _churned(s, d, rng, i))


if __name__ == "__main__":
    main()
