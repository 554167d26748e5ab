"""Where a pod should go: the dynamic checks, scoring and the candidate walk.

Scoring is the pool's strategy, applied at node level and at GPU level:
bin-pack (default) visits nodes with the fewest free whole GPUs that still
fit, and for slices the GPU with the least free memory that fits; spread
does the opposite. Healthy nodes always come before degraded ones. The
buckets kept by :mod:`scheduler.engine.state` make "the fewest free GPUs that
fit" a walk over a handful of buckets, not a scan of the pool; the static
predicates (:mod:`scheduler.engine.predicates`) are consulted per node as a
precomputed verdict.
"""

from __future__ import annotations

from collections.abc import Iterator

from scheduler.engine.caches import SessionCaches
from scheduler.engine.model import PlacementStrategy
from scheduler.engine.predicates import eligibility, shape_of
from scheduler.engine.state import TIERS, Cluster, NodeState, PoolState, TaskState

# Fields of a GPU that can take a slice, as _slice_positions ranks them
# (plain tuples: sorting them is the hot path for slices).
_FREE = 0  # free MiB on the GPU
_POSITION = 1
_NEED = 2  # MiB the slice takes there


def _slice_positions(
    node: NodeState, task: TaskState, strategy: PlacementStrategy
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    gpu = task.gpu
    fits: list[tuple[int, int, int]] = []  # (_FREE, _POSITION, _NEED)
    for p in range(len(node.gpu_ok)):
        if not node.gpu_ok[p] or node.gpu_whole[p]:
            continue
        need = gpu.slice_on(node.gpu_mem[p])
        if node.gpu_free[p] >= need:
            fits.append((node.gpu_free[p], p, need))
    if len(fits) < gpu.devices:
        return None
    if strategy is PlacementStrategy.SPREAD:
        fits.sort(key=lambda f: (-f[_FREE], f[_POSITION]))
    else:
        fits.sort()
    chosen = sorted(fits[: gpu.devices], key=lambda f: f[_POSITION])
    return tuple(f[_POSITION] for f in chosen), tuple(f[_NEED] for f in chosen)


def _whole_positions(node: NodeState, count: int) -> tuple[int, ...]:
    """The first ``count`` free whole GPUs; none for a pod that asks for none (it must hold no GPU)."""
    if count <= 0:
        return ()
    found: list[int] = []
    for p in range(len(node.gpu_ok)):
        if len(found) >= count:
            break
        if node.gpu_ok[p] and not node.gpu_whole[p] and not node.gpu_slices[p]:
            found.append(p)
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


def fit_on_node(node: NodeState, task: TaskState) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """GPU positions (and slices) for ``task`` on ``node`` now, or None (dynamic checks only)."""
    if node.free_cpu < task.cpu or node.free_mem < task.mem:
        return None
    if task.gpu.is_slice:
        return _slice_positions(node, task, node.pool.strategy)
    if node.free_whole < task.gpu.whole:
        return None
    return _whole_positions(node, task.gpu.whole), ()


def find_place(
    cluster: Cluster, caches: SessionCaches, task: TaskState
) -> tuple[NodeState, tuple[int, ...], tuple[int, ...]] | None:
    """The best node and GPU positions for ``task`` now, or None."""
    pool = task.job.pool
    if pool is None:
        return None
    pool_caches = caches.pool(pool)
    cache = pool_caches.fail
    if not task.shape:
        task.shape = shape_of(task)
    if cache.get(task.shape) == cluster.release_version:
        return None
    elig = eligibility(pool_caches, pool, task)
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
                positions, slices = found
                return node, positions, slices
        else:
            return node, _whole_positions(node, gpu.whole), ()
    cache[task.shape] = cluster.release_version
    return None


def _best_of(nodes: list[NodeState], task: TaskState) -> tuple[NodeState, tuple[int, ...], tuple[int, ...]] | None:
    """Score a short list of nodes the way the buckets order a pool."""
    spread = task.job.pool is not None and task.job.pool.strategy is PlacementStrategy.SPREAD
    best: tuple[NodeState, tuple[int, ...], tuple[int, ...]] | None = None
    best_score: tuple[int, int, int] | None = None
    for node in nodes:
        found = fit_on_node(node, task)
        if found is None:
            continue
        score = (node.tier, -node.free_whole if spread else node.free_whole, node.pidx)
        if best_score is None or score < best_score:
            positions, slices = found
            best_score = score
            best = (node, positions, slices)
    return best
