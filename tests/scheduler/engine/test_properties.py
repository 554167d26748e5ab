"""Invariants of a whole session over random clusters and queue trees."""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwarden.contract import (
    ANNOTATION_GPU_FRACTION,
    ANNOTATION_GPU_FRACTION_NUM_DEVICES,
    ANNOTATION_GPU_MEMORY,
    Action,
    ConditionType,
    EvictionAction,
)
from scheduler.engine.build import build_cluster
from scheduler.engine.caches import SessionCaches
from scheduler.engine.gangs import place_job
from scheduler.engine.model import (
    UNLIMITED,
    Decisions,
    Gpu,
    Job,
    Node,
    NodeCondition,
    PlacementStrategy,
    Queue,
    QueueResource,
    SchedulerConfig,
    Snapshot,
    Taint,
    TaintEffect,
    Task,
    TaskStatus,
    Toleration,
)
from scheduler.engine.session import run_session
from scheduler.engine.statement import Statement

GPU_MEM = 40000


# Taints the generated nodes may carry: one that blocks, one that evicts,
# one that only discourages (and so must not keep pods away).
TAINTS = (
    Taint("dedicated", "infer", TaintEffect.NO_SCHEDULE),
    Taint("maintenance", "", TaintEffect.NO_EXECUTE),
    Taint("spot", "", TaintEffect.PREFER_NO_SCHEDULE),
)
TOLERATIONS = (
    (Toleration("dedicated", "Equal", "infer"),),
    (Toleration("maintenance", "Exists"),),
    (Toleration(operator="Exists"),),
)


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    nodes = []
    for i in range(draw(st.integers(1, 6))):
        count = draw(st.integers(0, 4))
        mig = count > 1 and draw(st.integers(0, 7)) == 0
        gpus = tuple(
            Gpu(g, memory_mib=GPU_MEM, healthy=draw(st.booleans()) or draw(st.booleans()), mig_enabled=mig and g == 0)
            for g in range(count)
        )
        conditions: tuple[NodeCondition, ...] = ()
        if count and draw(st.integers(0, 5)) == 0:
            conditions = (NodeCondition(ConditionType.GPU_XID_ERROR.value, True, "Xid79", "", Action.RESET_GPU, (0,)),)
        nodes.append(
            Node(
                f"n{i}",
                cpu_milli=draw(st.sampled_from([4000, 16000, 64000])),
                memory_mib=65536,
                gpus=gpus,
                labels={"zone": draw(st.sampled_from(["a", "b"]))},
                taints=(draw(st.sampled_from(TAINTS)),) if draw(st.integers(0, 3)) == 0 else (),
                schedulable=draw(st.integers(0, 6)) > 0,
                conditions=conditions,
                draining=draw(st.integers(0, 10)) == 0,
            )
        )
    queues: list[Queue] = []
    for i in range(draw(st.integers(1, 5))):
        parent = draw(st.one_of(st.none(), st.sampled_from([q.name for q in queues]))) if queues else None
        gpu = QueueResource(
            draw(st.sampled_from([UNLIMITED, 0, 1000, 2000, 4000, 8000])),
            draw(st.sampled_from([UNLIMITED, UNLIMITED, 3000, 6000])),
            draw(st.sampled_from([0.0, 1.0, 2.0])),
        )
        # CPU and memory quotas too, often ungoverned (every pod asks for
        # CPU) and sometimes small, so that "non-preemptible work within
        # quota" is exercised on every resource and not on GPUs alone.
        cpu = QueueResource(
            draw(st.sampled_from([UNLIMITED, UNLIMITED, 0, 2000, 16000])), UNLIMITED, draw(st.sampled_from([0.0, 1.0]))
        )
        memory = QueueResource(draw(st.sampled_from([UNLIMITED, UNLIMITED, 0, 4096])), UNLIMITED, 1.0)
        queues.append(
            Queue(f"q{i}", parent=parent, priority=draw(st.sampled_from([0, 1])), gpu=gpu, cpu=cpu, memory=memory)
        )
    leaves = [q.name for q in queues if q.name not in {p.parent for p in queues}]
    jobs = []
    for j in range(draw(st.integers(0, 10))):
        size = draw(st.integers(1, 3))
        kind = draw(st.sampled_from(["whole", "fraction", "mib", "cpu"]))
        tolerations = draw(st.sampled_from(((), (), *TOLERATIONS)))
        selector = {"zone": "a"} if draw(st.integers(0, 4)) == 0 else {}
        tasks = []
        for t in range(size):
            annotations: dict[str, str] = {}
            whole = 0
            if kind == "whole":
                whole = draw(st.integers(1, 3))
            elif kind == "fraction":
                annotations[ANNOTATION_GPU_FRACTION] = draw(st.sampled_from(["0.25", "0.5", "0.7"]))
            elif kind == "mib":
                annotations[ANNOTATION_GPU_MEMORY] = draw(st.sampled_from(["5000", "15000", "30000"]))
            if annotations and draw(st.integers(0, 3)) == 0:
                annotations[ANNOTATION_GPU_FRACTION_NUM_DEVICES] = "2"
            tasks.append(
                Task(
                    f"j{j}-{t}",
                    cpu_milli=draw(st.sampled_from([500, 2000])),
                    memory_mib=1024,
                    gpus=whole,
                    annotations=annotations,
                    node_selector=selector,
                    tolerations=tolerations,
                )
            )
        jobs.append(
            Job(
                f"j{j}",
                draw(st.sampled_from(leaves)),
                priority=draw(st.sampled_from([10, 50, 50, 100])),
                preemptible=draw(st.sampled_from([None, None, True, False])),
                min_member=draw(st.integers(1, size)),
                created=float(j),
                tasks=tuple(tasks),
            )
        )
    strategy = draw(st.sampled_from(list(PlacementStrategy)))
    return Snapshot(tuple(nodes), tuple(queues), tuple(jobs), config=SchedulerConfig(default_strategy=strategy))


def _check_placement(snapshot: Snapshot, decisions: Decisions) -> None:
    """Every bind lands where the pod may go: usable node, healthy GPUs not
    in MIG mode, taints tolerated, selector matched, no slice on a MIG node."""
    nodes = {n.name: n for n in snapshot.nodes}
    pods = {(j.key, t.name): t for j in snapshot.jobs for t in j.tasks}
    for b in decisions.binds:
        n = nodes[b.node]
        task = pods[(b.job, b.pod)]
        assert n.schedulable and not n.draining
        for taint in n.taints:
            if taint.effect is not TaintEffect.PREFER_NO_SCHEDULE:
                assert any(t.tolerates(taint) for t in task.tolerations), "placed against a taint"
        assert all(n.labels.get(k) == v for k, v in task.node_selector.items())
        gpus = {g.index: g for g in n.gpus}
        for index in b.gpu_indices:
            assert not gpus[index].mig_enabled, "placed on a GPU in MIG mode"
        if b.gpu_memory_mib is not None:
            assert not any(g.mig_enabled for g in n.gpus), "a slice on a MIG node"


def _check(snapshot: Snapshot) -> None:
    decisions = run_session(snapshot)
    _check_placement(snapshot, decisions)
    nodes = {n.name: n for n in snapshot.nodes}
    cluster = build_cluster(snapshot)
    jobs = {j.key: j for j in snapshot.jobs}
    bound: dict[str, list[str]] = defaultdict(list)
    per_gpu: dict[tuple[str, int], list[int | None]] = defaultdict(list)
    for b in decisions.binds:
        bound[b.job].append(b.pod)
        n = nodes[b.node]
        assert n.schedulable and not n.draining
        state = cluster.nodes[b.node]
        for k, index in enumerate(b.gpu_indices):
            gpu = next(g for g in n.gpus if g.index == index)
            assert gpu.healthy, "placed on an unhealthy GPU"
            position = state.position(index)
            assert position is not None and state.gpu_ok[position], "placed on a faulted GPU"
            per_gpu[(b.node, index)].append(b.gpu_memory_mib[k] if b.gpu_memory_mib else None)
    # No GPU's memory over-committed; a whole GPU is never shared.
    for slices in per_gpu.values():
        if None in slices:
            assert slices == [None]
        else:
            assert sum(s for s in slices if s is not None) <= GPU_MEM
    # Gangs all or nothing.
    for key, pods in bound.items():
        assert len(pods) >= jobs[key].min_member
    # No queue over its limit; non-preemptible work within quota.
    spec = {q.name: q for q in snapshot.queues}
    for share in decisions.queue_shares:
        limit = spec[share.queue].gpu.limit
        if limit != UNLIMITED:
            assert share.allocated.gpu <= limit
    _check_non_preemptible_within_quota(snapshot, decisions)
    _check_never_borrowing_within_quota(snapshot, decisions)


def _check_never_borrowing_within_quota(snapshot: Snapshot, decisions: Decisions) -> None:
    """A queue with overQuotaWeight 0 for a resource ends no session over its
    quota of it (unless it already was when the session began), however idle
    the rest of the cluster."""
    spec = {q.name: q for q in snapshot.queues}
    start = {q.name: list(q.alloc) for q in build_cluster(snapshot).queues.values()}
    for share in decisions.queue_shares:
        if share.queue not in spec:
            continue
        held = (share.allocated.gpu, share.allocated.cpu, share.allocated.memory)
        for r, resource in enumerate(spec[share.queue].resources):
            if resource.over_quota_weight == 0 and resource.quota != UNLIMITED:
                assert held[r] <= max(resource.quota, start[share.queue][r]), f"{share.queue} borrowed"


def _non_preemptible_usage(snapshot: Snapshot, decisions: Decisions, *, after: bool) -> dict[str, list[int]]:
    """GPU (milli), CPU (milli) and memory (MiB) held by non-preemptible work,
    per queue and its ancestors: before the session, or after its decisions."""
    cluster = build_cluster(snapshot)
    evicted = {(e.job, e.pod) for e in decisions.evictions}
    bound = {(b.job, b.pod) for b in decisions.binds}
    usage: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for q in cluster.queues.values():
        for job in q.jobs:
            if job.preemptible:
                continue
            for t in job.tasks:
                key = (job.key, t.spec.name)
                holds = t.was_running and (not after or key not in evicted)
                if after and key in bound:
                    holds = True
                if holds:
                    for anc in q.path:
                        used = usage[anc.name]
                        used[0] += t.milli
                        used[1] += t.cpu
                        used[2] += t.mem
    return usage


def _check_non_preemptible_within_quota(snapshot: Snapshot, decisions: Decisions) -> None:
    """No queue's non-preemptible work goes beyond its quota on any resource
    (unless it already was when the session began)."""
    spec = {q.name: q for q in snapshot.queues}
    before = _non_preemptible_usage(snapshot, decisions, after=False)
    after = _non_preemptible_usage(snapshot, decisions, after=True)
    for name, used in after.items():
        for r, resource in enumerate(spec[name].resources):
            if resource.quota != UNLIMITED:
                assert used[r] <= max(resource.quota, before[name][r]), f"{name}: non-preemptible over quota"


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_session_invariants(snapshot: Snapshot) -> None:
    _check(snapshot)


def with_running_work(snapshot: Snapshot) -> Snapshot:
    """Run once and feed the binds back as running pods, plus one new job
    per job at a higher priority: the next session has work to evict,
    reclaim, preempt and consolidate.

    Every other new job goes to another leaf queue (so reclaim has a queue
    to take from) and every third asks for two GPUs on one node (so
    consolidation has fragmentation to undo)."""
    first = run_session(snapshot)
    placed = {(b.job, b.pod): b for b in first.binds}
    parents = {q.parent for q in snapshot.queues}
    leaves = sorted(q.name for q in snapshot.queues if q.name not in parents)
    jobs = []
    for number, job in enumerate(snapshot.jobs):
        tasks = []
        for task in job.tasks:
            b = placed.get((job.key, task.name))
            if b is None:
                tasks.append(task)
                continue
            tasks.append(
                Task(
                    task.name,
                    cpu_milli=task.cpu_milli,
                    memory_mib=task.memory_mib,
                    gpus=task.gpus,
                    annotations=task.annotations,
                    status=TaskStatus.RUNNING,
                    node=b.node,
                    gpu_indices=b.gpu_indices,
                )
            )
        jobs.append(
            Job(
                job.name,
                job.queue,
                priority=job.priority,
                preemptible=job.preemptible,
                min_member=job.min_member,
                created=job.created,
                tasks=tuple(tasks),
            )
        )
        more = Task(f"{job.name}-next-0", gpus=2 if number % 3 == 2 else 1, cpu_milli=500, memory_mib=1024)
        target = job.queue if number % 2 == 0 else leaves[(leaves.index(job.queue) + 1) % len(leaves)]
        jobs.append(
            Job(f"{job.name}-next", target, priority=job.priority + 5, created=job.created + 100, tasks=(more,))
        )
    # Remediation starts draining the first node: health eviction has work too.
    nodes = list(snapshot.nodes)
    nodes[0] = replace(nodes[0], draining=True)
    return Snapshot(tuple(nodes), snapshot.queues, tuple(jobs), config=snapshot.config)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_session_invariants_with_running_work(snapshot: Snapshot) -> None:
    second = with_running_work(snapshot)
    decisions = run_session(second)
    _check_placement(second, decisions)
    running_pods = {(j.key, t.name) for j in second.jobs for t in j.tasks if t.status is TaskStatus.RUNNING}
    evicted_jobs = {e.job for e in decisions.evictions}
    preemptible = {j.key: j.is_preemptible for j in second.jobs}
    for e in decisions.evictions:
        assert (e.job, e.pod) in running_pods
        assert e.reason
        if e.action in (EvictionAction.CONSOLIDATE, EvictionAction.RECLAIM, EvictionAction.PREEMPT):
            assert preemptible[e.job], f"{e.action} evicted non-preemptible {e.job}"
            assert e.beneficiary, "an eviction to make room names who it is for"
    _check_non_preemptible_within_quota(second, decisions)
    _check_never_borrowing_within_quota(second, decisions)
    # A gang is never left broken: it is evicted whole, or (an elastic job
    # shrunk) keeps at least minMember pods running.
    for key in evicted_jobs:
        job = next(j for j in second.jobs if j.key == key)
        if job.min_member > 1:
            gone = {e.pod for e in decisions.evictions if e.job == key}
            running = {t.name for t in job.tasks if t.status is TaskStatus.RUNNING}
            assert gone == running or len(running - gone) >= job.min_member
    # Where reclaim may take a victim queue below its fair share (the
    # reclaimer within its guaranteed quota, the victim above its own) is
    # checked exhaustively in test_victim_search_properties.py.
    queue_of = {j.key: j.queue for j in second.jobs}
    shares = {q.queue: q for q in decisions.queue_shares}
    # Whatever the session binds, no queue on the way up ends over its limit
    # (unless it already was when the session began).
    start = {q.name: q.alloc[0] for q in build_cluster(second).queues.values()}
    limits = {q.name: q for q in second.queues}
    for b in decisions.binds:
        level: str | None = queue_of[b.job]
        while level is not None:
            limit = limits[level].gpu.limit
            if limit != UNLIMITED:
                assert shares[level].allocated.gpu <= max(limit, start[level])
            level = limits[level].parent
    # Binds never land on a GPU still held by a pod that was not evicted.
    evicted_pods = {(e.job, e.pod) for e in decisions.evictions}
    held: dict[tuple[str, int], int] = defaultdict(int)
    for j in second.jobs:
        for t in j.tasks:
            if t.status is TaskStatus.RUNNING and (j.key, t.name) not in evicted_pods and t.gpus:
                for index in t.gpu_indices:
                    held[(t.node or "", index)] += 1
    for b in decisions.binds:
        if b.gpu_memory_mib is None:
            for index in b.gpu_indices:
                assert held[(b.node, index)] == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_rollback_leaves_state_untouched(snapshot: Snapshot) -> None:
    cluster = build_cluster(with_running_work(snapshot))

    def fingerprint() -> object:
        return (
            [
                (n.name, n.free_cpu, n.free_mem, list(n.gpu_free), list(n.gpu_whole), list(n.gpu_slices), n.free_whole)
                for n in cluster.nodes.values()
            ],
            [(q.name, list(q.alloc), list(q.np_alloc)) for q in cluster.queues.values()],
            [
                (p.name, p.free_whole_total, [{k: sorted(v) for k, v in b.items() if v} for b in p.whole_buckets])
                for p in cluster.pools.values()
            ],
        )

    before = fingerprint()
    caches = SessionCaches()
    stmt = Statement(cluster)
    for job in cluster.jobs:
        for task in job.tasks:
            if task.was_running and task.node is not None:
                stmt.evict(task, EvictionAction.PREEMPT, "test", None)
    for job in cluster.jobs:
        if job.queue is not None:
            place_job(cluster, caches, stmt, job)
    stmt.rollback()
    assert fingerprint() == before


def test_rollback_restores_a_known_plan() -> None:
    snapshot = Snapshot(
        nodes=(Node("n0", cpu_milli=8000, memory_mib=8192, gpus=tuple(Gpu(i, memory_mib=GPU_MEM) for i in range(2))),),
        queues=(Queue("q", gpu=QueueResource(2000)),),
        jobs=(
            Job("run", "q", tasks=(Task("run-0", gpus=1, status=TaskStatus.RUNNING, node="n0", gpu_indices=(0,)),)),
            Job("new", "q", tasks=(Task("new-0", annotations={ANNOTATION_GPU_FRACTION: "0.5"}),)),
        ),
    )
    cluster = build_cluster(snapshot)
    node = cluster.nodes["n0"]
    caches = SessionCaches()
    stmt = Statement(cluster)
    stmt.evict(cluster.jobs[1].tasks[0], EvictionAction.PREEMPT, "test", None)
    assert node.free_whole == 2
    assert place_job(cluster, caches, stmt, cluster.jobs[0]) is None
    assert node.gpu_slices == [1, 0] and node.free_whole == 1
    stmt.rollback()
    assert node.gpu_whole == [1, 0] and node.gpu_slices == [0, 0] and node.free_whole == 1
    assert cluster.queues["q"].alloc[0] == 1000


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots(), st.randoms(use_true_random=False))
def test_same_snapshot_in_any_order_gives_same_decisions(snapshot: Snapshot, rng: random.Random) -> None:
    second = with_running_work(snapshot)
    nodes = list(second.nodes)
    jobs = list(second.jobs)
    queues = list(second.queues)
    rng.shuffle(nodes)
    rng.shuffle(jobs)
    rng.shuffle(queues)
    shuffled = Snapshot(tuple(nodes), tuple(queues), tuple(jobs), second.now, second.config)
    assert run_session(second) == run_session(shuffled)
