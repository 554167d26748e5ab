"""Where a pod may go (predicates), where it should go (scoring), and gangs.

Predicates are split the way kube-scheduler's filter plugins are, by cost:

- *static* ones depend only on the node and the pod's shape (node accepts
  work at all, node selector, taints, MIG for slices); their verdict is
  computed once per pool and distinct shape (``eligibility``) and reused for
  every pod of that shape;
- *dynamic* ones (free CPU, memory, whole GPUs, per-GPU memory bins) are
  checked against the working state as it changes.

Scoring is the pool's strategy, applied at node level and at GPU level:
bin-pack (default) visits nodes with the fewest free whole GPUs that still
fit, and for slices the GPU with the least free memory that fits; spread
does the opposite. Healthy nodes always come before degraded ones. The
buckets kept by :mod:`scheduler.engine.state` make "the fewest free GPUs that
fit" a walk over a handful of buckets, not a scan of the pool.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from gpuwarden.contract import UnschedulableReason
from scheduler.engine.model import UNLIMITED, PendingReason, PlacementStrategy, TaintEffect
from scheduler.engine.resources import RESOURCE_NAMES, RESOURCES, format_amount
from scheduler.engine.state import TIERS, Cluster, JobState, NodeState, PoolState, QueueState, TaskState
from scheduler.engine.statement import Statement

_BLOCKING_EFFECTS = frozenset({TaintEffect.NO_SCHEDULE, TaintEffect.NO_EXECUTE})


def static_exclusion(node: NodeState, task: TaskState) -> str | None:
    """Why ``node`` can never take ``task`` this session, or None."""
    if not node.accepts:
        return node.excluded
    spec = task.spec
    if spec.node_selector:
        labels = node.spec.labels
        for key, value in spec.node_selector.items():
            if labels.get(key) != value:
                return f"node selector {key}={value} does not match"
    for taint in node.spec.taints:
        if taint.effect in _BLOCKING_EFFECTS and not any(t.tolerates(taint) for t in spec.tolerations):
            return f"taint {taint.key} not tolerated"
    if task.gpu.is_slice and node.mig:
        return "MIG enabled (takes no GPU slices)"
    return None


# A shape eligible on at most this share of its pool is placed by looking at
# its eligible nodes directly instead of walking the pool's buckets.
FEW_NODES_SHARE = 8


@dataclass(slots=True)
class Eligibility:
    """Static verdict per node of a pool (by ``pidx``) for one pod shape.

    ``few`` lists the eligible nodes when they are a small part of the pool
    (a node selector naming one rack, one host): placement then scores just
    those instead of skipping past every other node of the pool.
    """

    ok: list[bool]
    few: list[NodeState] | None


def _label_matches(pool: PoolState, selector: tuple[tuple[str, str], ...]) -> set[int]:
    """Nodes (``pidx``) carrying every label of ``selector``, from a per-pool label index."""
    index = pool.label_index
    if index is None:
        index = {}
        for node in pool.nodes:
            for item in node.spec.labels.items():
                index.setdefault(item, []).append(node.pidx)
        pool.label_index = index
    matches: set[int] | None = None
    for item in selector:
        found = set(index.get(item, ()))
        matches = found if matches is None else matches & found
    return matches if matches is not None else set(range(len(pool.nodes)))


def eligibility(pool: PoolState, task: TaskState) -> Eligibility:
    """Static verdict for ``task``'s shape on every node of the pool, cached per shape."""
    spec = task.spec
    selector = tuple(sorted(spec.node_selector.items())) if spec.node_selector else ()
    key: tuple[object, ...] = (selector, spec.tolerations, task.gpu.is_slice)
    cached = pool.eligibility.get(key)
    if cached is None:
        nodes = pool.nodes
        if selector:
            ok = [False] * len(nodes)
            for pidx in _label_matches(pool, selector):
                ok[pidx] = static_exclusion(nodes[pidx], task) is None
        else:
            ok = [static_exclusion(node, task) is None for node in nodes]
        count = sum(ok)
        few = [n for n in nodes if ok[n.pidx]] if count * FEW_NODES_SHARE <= len(nodes) else None
        cached = Eligibility(ok, few)
        pool.eligibility[key] = cached
    return cached


def _slice_positions(
    node: NodeState, task: TaskState, strategy: PlacementStrategy
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    gpu = task.gpu
    fits: list[tuple[int, int, int]] = []
    for p in range(len(node.gpu_ok)):
        if not node.gpu_ok[p] or node.gpu_whole[p]:
            continue
        need = gpu.slice_on(node.gpu_mem[p])
        if node.gpu_free[p] >= need:
            fits.append((node.gpu_free[p], p, need))
    if len(fits) < gpu.devices:
        return None
    if strategy is PlacementStrategy.SPREAD:
        fits.sort(key=lambda f: (-f[0], f[1]))
    else:
        fits.sort()
    chosen = sorted(fits[: gpu.devices], key=lambda f: f[1])
    return tuple(f[1] for f in chosen), tuple(f[2] for f in chosen)


def _whole_positions(node: NodeState, count: int) -> tuple[int, ...]:
    found: list[int] = []
    for p in range(len(node.gpu_ok)):
        if node.gpu_ok[p] and not node.gpu_whole[p] and not node.gpu_slices[p]:
            found.append(p)
            if len(found) == count:
                break
    return tuple(found)


def _candidates(pool: PoolState, task: TaskState) -> Iterator[NodeState]:
    """Nodes in scoring order; a node may appear twice (cheap to reject)."""
    spread = pool.strategy is PlacementStrategy.SPREAD
    gpu = task.gpu
    if gpu.is_slice:
        need = gpu.slice_on(pool.min_gpu_mem or 1)
        first = need // pool.granule
        for tier in TIERS:
            whole = pool.whole_buckets[tier]
            shared = pool.shared_buckets[tier]
            whole_keys = sorted((c for c in whole if c >= 1 and whole[c]), reverse=spread)
            shared_keys = sorted((k for k in shared if k >= first and shared[k]), reverse=spread)
            groups = [whole, shared] if spread else [shared, whole]
            keysets = [whole_keys, shared_keys] if spread else [shared_keys, whole_keys]
            for buckets, keys in zip(groups, keysets, strict=True):
                for k in keys:
                    yield from buckets[k].values()
        return
    k = gpu.whole
    for tier in TIERS:
        buckets = pool.whole_buckets[tier]
        keys = sorted((c for c in buckets if c >= k and buckets[c]), reverse=spread)
        for c in keys:
            yield from buckets[c].values()


def shape_of(task: TaskState) -> tuple[object, ...]:
    """What makes two pods interchangeable for placement (same predicates, same request)."""
    spec = task.spec
    gpu = task.gpu
    return (
        tuple(sorted(spec.node_selector.items())) if spec.node_selector else (),
        spec.tolerations,
        task.cpu,
        task.mem,
        gpu.whole,
        gpu.fraction,
        gpu.memory_mib,
        gpu.devices,
    )


def fit_on_node(node: NodeState, task: TaskState) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """GPU positions (and slices) for ``task`` on ``node`` now, or None (dynamic checks only)."""
    if node.free_cpu < task.cpu or node.free_mem < task.mem:
        return None
    if task.gpu.is_slice:
        return _slice_positions(node, task, node.pool.strategy)
    if node.free_whole < task.gpu.whole:
        return None
    return _whole_positions(node, task.gpu.whole), ()


def find_place(cluster: Cluster, task: TaskState) -> tuple[NodeState, tuple[int, ...], tuple[int, ...]] | None:
    """The best node and GPU positions for ``task`` now, or None."""
    pool = task.job.pool
    if pool is None:
        return None
    cache = pool.fail_cache
    if not task.shape:
        task.shape = shape_of(task)
    if cache.get(task.shape) == cluster.release_version:
        return None
    elig = eligibility(pool, task)
    if elig.few is not None:
        best = _best_of(elig.few, task)
        if best is None:
            cache[task.shape] = cluster.release_version
        return best
    ok = elig.ok
    cpu, mem = task.cpu, task.mem
    gpu = task.gpu
    strategy = pool.strategy
    for node in _candidates(pool, task):
        if not ok[node.pidx] or node.free_cpu < cpu or node.free_mem < mem:
            continue
        if gpu.is_slice:
            found = _slice_positions(node, task, strategy)
            if found is not None:
                return node, found[0], found[1]
        else:
            return node, _whole_positions(node, gpu.whole), ()
    cache[task.shape] = cluster.release_version
    return None


def _best_of(nodes: list[NodeState], task: TaskState) -> tuple[NodeState, tuple[int, ...], tuple[int, ...]] | None:
    """Score a short list of nodes the way the buckets order a pool."""
    spread = task.job.pool is not None and task.job.pool.strategy is PlacementStrategy.SPREAD
    best: tuple[tuple[int, int, int], NodeState, tuple[int, ...], tuple[int, ...]] | None = None
    for node in nodes:
        found = fit_on_node(node, task)
        if found is None:
            continue
        score = (node.tier, -node.free_whole if spread else node.free_whole, node.pidx)
        if best is None or score < best[0]:
            best = (score, node, found[0], found[1])
    return None if best is None else (best[1], best[2], best[3])


# --------------------------------------------------------------------------
# Queue limits and quotas
# --------------------------------------------------------------------------


def limit_problem(queue: QueueState, request: list[int], preemptible: bool) -> PendingReason | None:
    """Refuse work that would take a queue (or an ancestor) over its limit,
    or non-preemptible work beyond quota."""
    for q in queue.path:
        for r in RESOURCES:
            limit = q.limit[r]
            if request[r] and limit != UNLIMITED and q.alloc[r] + request[r] > limit:
                over = q.alloc[r] + request[r] - limit
                return PendingReason(
                    UnschedulableReason.OVER_LIMIT,
                    f"queue {q.name} has a {RESOURCE_NAMES[r]} limit of {format_amount(r, limit)}; "
                    f"it holds {format_amount(r, q.alloc[r])} and this needs {format_amount(r, request[r])} "
                    f"({format_amount(r, over)} over)",
                )
    if not preemptible:
        for q in queue.path:
            for r in RESOURCES:
                quota = q.quota[r]
                if request[r] and quota != UNLIMITED and q.np_alloc[r] + request[r] > quota:
                    left = max(0, quota - q.np_alloc[r])
                    return PendingReason(
                        UnschedulableReason.NON_PREEMPTIBLE_OVER_QUOTA,
                        f"non-preemptible work must fit in quota: queue {q.name} has a {RESOURCE_NAMES[r]} "
                        f"quota of {format_amount(r, quota)} with {format_amount(r, left)} left for "
                        f"non-preemptible work, and this needs {format_amount(r, request[r])}",
                    )
    return None


# --------------------------------------------------------------------------
# Gangs
# --------------------------------------------------------------------------


def _quick_reject(pool: PoolState, tasks: list[TaskState]) -> bool:
    """True when the pool cannot possibly hold ``tasks`` (ignores predicates)."""
    need_whole = 0
    shapes: dict[int, int] = {}
    for t in tasks:
        w = t.gpu.whole
        if w:
            need_whole += w
            shapes[w] = shapes.get(w, 0) + 1
    if need_whole == 0:
        return False
    if need_whole > pool.free_whole_total:
        return True
    # Each k-GPU pod needs a node with k free GPUs: count the slots.
    for k, count in shapes.items():
        slots = 0
        for tier in TIERS:
            for c, nodes in pool.whole_buckets[tier].items():
                if c >= k:
                    slots += len(nodes) * (c // k)
        if slots < count:
            return True
    return False


def place_job(cluster: Cluster, stmt: Statement, job: JobState, *, beyond_gang: bool = True) -> PendingReason | None:
    """Place the job's pending tasks: at least enough for its gang, or none.

    Tasks beyond ``min_member`` are placed while they fit (when
    ``beyond_gang``). Returns None on success, else the reason it failed;
    on failure every placement made here is rolled back.
    """
    if job.error is not None:
        return job.error
    queue = job.queue
    assert queue is not None
    pool = job.pool
    assert pool is not None
    pending = job.pending_tasks()
    if not pending:
        return None
    required = max(0, job.spec.min_member - job.held)
    if required > len(pending):
        return PendingReason(
            UnschedulableReason.GANG_INCOMPLETE,
            f"gang needs {job.spec.min_member} pods but only {job.held + len(pending)} exist",
        )
    gang = pending[:required]
    if gang:
        problem = limit_problem(queue, cluster.job_request(gang), job.preemptible)
        if problem is not None:
            return problem
        if _quick_reject(pool, gang):
            job.unplaced = gang[0]
            return _no_room()
    mark = stmt.mark()
    for i, task in enumerate(pending):
        in_gang = i < required
        if not in_gang and not beyond_gang:
            break
        problem = limit_problem(queue, [task.milli, task.cpu, task.mem], job.preemptible)
        if problem is None:
            found = find_place(cluster, task)
            if found is None:
                job.unplaced = task
                problem = _no_room()
            else:
                stmt.allocate(task, *found)
                continue
        if in_gang:
            stmt.rollback(mark)
            return problem
        break
    job.unplaced = None
    return None


def _no_room() -> PendingReason:
    """The short reason recorded when no node has room.

    The full account (which nodes were excluded and why, what each lacked)
    is worked out by :mod:`scheduler.engine.explain` once the session's
    actions are done, against the final state.
    """
    return PendingReason(UnschedulableReason.INSUFFICIENT_RESOURCES, "no node has room")
