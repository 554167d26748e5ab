"""Where a pod should go: the dynamic checks, scoring and the candidate walk.

Scoring is the pool's strategy, applied at node level and at GPU level:
bin-pack (default) visits nodes with the fewest free whole GPUs that still
fit, and for slices the GPU with the least free memory that fits; spread
does the opposite. Healthy nodes always come before degraded ones. The
buckets kept by :mod:`scheduler.engine.state` make "the fewest free GPUs that
fit" a walk over a handful of buckets, not a scan of the pool; the static
predicates (:mod:`scheduler.engine.predicates`) are consulted per node as a
precomputed verdict, and the rules that read the pods around a node
(:mod:`scheduler.engine.rules`) as one verdict per pod and state.

A node with a GPU out of service that the device plugin still offers (a
quarantine the plugin does not know of) is a trap for whole-GPU pods: the
kubelet's device manager picks among offered GPUs, whatever gpuwarden
assigned, and once every healthy one is taken the bad one is all it can
give. So for a whole-GPU pod such nodes come after every node without one
(among the next ``TRAP_LOOKAHEAD`` candidates once one fits, so that the
walk stays short), and among them a placement that would leave the node no
free healthy GPU comes last: the node's whole-GPU load stays below its
healthy count while anything else fits (:func:`trap_rank`, which the victim
search of reclaim, preempt and consolidation ranks its plans by too, after
their cost). This lowers the odds, it cannot remove them: the device
manager may still choose the bad GPU while healthy ones are free (health
eviction then moves the pod, :mod:`scheduler.engine.actions.health_evict`);
only DRA, where the scheduler names the device, removes the gap.

A pod with preferred terms (node affinity, pod affinity or anti-affinity,
soft topology spread) is placed on the node those terms rank highest among
the first ``SCORED_CANDIDATES`` nodes that fit, in the strategy's order
(ties keep that order): the strategy still decides where to look, so
bin-packing holds, and the preferences decide among nodes that are close
to equally good for it. kube-scheduler likewise scores a sample of the
feasible nodes, not all of them, in a large cluster.
"""

from __future__ import annotations

from collections.abc import Iterator

from scheduler.engine.caches import SessionCaches
from scheduler.engine.model import DeviceFilter, PlacementStrategy
from scheduler.engine.predicates import eligibility, shape_of
from scheduler.engine.rules import Verdict, needs_verdict, preference_scores, rules_key, verdict_for
from scheduler.engine.state import TIERS, Cluster, NodeState, PoolState, TaskState

# How many fitting nodes a pod with preferences is scored over (module docstring).
SCORED_CANDIDATES = 32
# How many further candidates a whole-GPU pod looks at for a node without a trap once
# one with a trap fits: the preference must not turn placement into a scan of the pool.
TRAP_LOOKAHEAD = 64

Place = tuple[NodeState, tuple[int, ...], tuple[int, ...]]

# Fields of a GPU that can take a slice, as _slice_positions ranks them
# (plain tuples: sorting them is the hot path for slices).
_FREE = 0  # free MiB on the GPU
_POSITION = 1
_NEED = 2  # MiB the slice takes there


def trap_rank(trap: bool, whole: int, free_after: int) -> int:
    """How far a placement walks into a trap node (module docstring): 0 not at all, 1 onto one that
    keeps ``free_after`` >= 1 healthy GPUs free, 2 onto one left none, so the kubelet has only the bad GPU.

    ``whole`` is the pod's whole GPUs (0 for a slice, whose GPU gpuwarden names itself).
    """
    if not (whole and trap):
        return 0
    return 1 if free_after >= 1 else 2


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


def _whole_positions(node: NodeState, count: int, devices: DeviceFilter | None = None) -> tuple[int, ...] | None:
    """The first ``count`` free whole GPUs (of those ``devices`` allows there), or None when fewer are free.

    None for a pod that asks for none (it must hold no GPU).
    """
    if count <= 0:
        return ()
    if devices is not None and node.name in devices.choices:
        # Requests that differ, or constraints: which GPUs, not only how many (DeviceFilter.pick).
        idle = [
            node.gpu_index[p]
            for p in range(len(node.gpu_ok))
            if node.gpu_ok[p] and not node.gpu_whole[p] and not node.gpu_slices[p]
        ]
        picked = devices.pick(node.name, idle, count)
        if picked is None:
            return None
        taken = set(picked)
        return tuple(p for p in range(len(node.gpu_ok)) if node.gpu_index[p] in taken)
    allowed = None if devices is None or node.name in devices.plain else devices.nodes.get(node.name)
    if allowed is None and devices is not None and node.name not in devices.plain:
        return None
    # Any free GPU will do (the device plugin's nvidia.com/gpu): never a MIG device, which only
    # a claim that selects it takes.
    claim_only = node.spec.gpus if allowed is None and node.mig else None
    found: list[int] = []
    for p in range(len(node.gpu_ok)):
        if len(found) >= count:
            break
        free = node.gpu_ok[p] and not node.gpu_whole[p] and not node.gpu_slices[p]
        if (
            free
            and (allowed is None or node.gpu_index[p] in allowed)
            and (claim_only is None or claim_only[p].parent is None)
        ):
            found.append(p)
    return tuple(found) if len(found) >= count else None


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
    """GPU positions (and slices) for ``task`` on ``node`` now, or None (resources only).

    A resource the pod does not request is not checked, as kube-scheduler's
    NodeResourcesFit does not: a pod without a memory request fits a node
    whose memory other schedulers' pods have over-committed.
    """
    if short_of_room(node, task.cpu, task.mem) or _pods_full(node):
        return None
    if task.gpu.is_slice:
        return _slice_positions(node, task, node.pool.strategy)
    if node.free_whole < task.gpu.whole:
        return None
    positions = _whole_positions(node, task.gpu.whole, task.spec.devices)
    return None if positions is None else (positions, ())


def short_of_room(node: NodeState, cpu: int, mem: int) -> bool:
    """Too little free CPU or memory for a request (a zero request always fits, see :func:`fit_on_node`)."""
    return (cpu > 0 and node.free_cpu < cpu) or (mem > 0 and node.free_mem < mem)


def _pods_full(node: NodeState) -> bool:
    """The node's kubelet admits no more pods (its allocatable ``pods``)."""
    limit = node.spec.max_pods
    return bool(limit) and len(node.tasks) >= limit


def fits(
    cluster: Cluster, caches: SessionCaches, node: NodeState, task: TaskState
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """:func:`fit_on_node` and the rules that read the pods around ``node``, against the state now.

    For the victim search, which evicts and then asks again: the verdict is
    worked out afresh whenever a pod moved, so a pod whose affinity a victim
    satisfied is not placed beside the victim's empty seat.
    """
    if not rules_allow(cluster, caches, node, task):
        return None
    return fit_on_node(node, task)


def rules_allow(cluster: Cluster, caches: SessionCaches, node: NodeState, task: TaskState) -> bool:
    """Whether the rules that read the pods around ``node`` let ``task`` go there now."""
    return not needs_verdict(cluster, task) or verdict_for(cluster, caches.rules, task).problem(node) is None


def place_for(cluster: Cluster, caches: SessionCaches, task: TaskState, reserved: Place | None) -> Place | None:
    """The job's reserved room when the rules still allow it there, else the best place now.

    Room is reserved when an action made it; a pod placed nearby since (or
    a victim that was what an affinity matched) can have changed what the
    rules say about that node.
    """
    if reserved is not None and rules_allow(cluster, caches, reserved[0], task):
        return reserved
    return find_place(cluster, caches, task)


def _fail_key(task: TaskState, verdict: Verdict | None) -> tuple[object, ...] | None:
    """What a cached "nothing fits" is filed under, or None when it must not be cached (see :func:`rules_key`)."""
    if verdict is None:
        return task.shape
    return rules_key(task, verdict)


def find_place(
    cluster: Cluster, caches: SessionCaches, task: TaskState, avoid: NodeState | None = None
) -> Place | None:
    """The best node and GPU positions for ``task`` now, or None; never on ``avoid``.

    ``avoid`` is for a pod the kubelet's device manager put on a GPU out of
    service there: its room is found elsewhere, since that node's device
    manager may do it again (:mod:`scheduler.engine.actions.health_evict`).
    A failure with a node avoided is not cached: the node might have fit.
    """
    pool = task.job.pool
    if pool is None:
        return None
    pool_caches = caches.pool(pool)
    cache = pool_caches.fail
    if not task.shape:
        task.shape = shape_of(task)
    if needs_verdict(cluster, task):
        verdict: Verdict | None = verdict_for(cluster, caches.rules, task)
        fail_key = _fail_key(task, verdict)
    else:
        verdict, fail_key = None, task.shape
    if fail_key is not None and cache.get(fail_key) == cluster.release_version:
        return None
    elig = eligibility(pool_caches, pool, task)
    placement = task.spec.placement
    scored = placement is not None and placement.scored
    if avoid is not None:
        fail_key = None
    if elig.few is not None:
        nodes = elig.few if avoid is None else [n for n in elig.few if n is not avoid]
        best = _best_of(cluster, caches, nodes, task, verdict)
        if best is None and fail_key is not None:
            cache[fail_key] = cluster.release_version
        return best
    ok = elig.ok
    cpu, mem = task.cpu, task.mem
    gpu = task.gpu
    strategy = pool.strategy
    found: list[Place] = []
    # The first placement on a trap node that keeps a healthy GPU free, and the first that
    # would not (module docstring): tried after every other node, in that order.
    on_trap: Place | None = None
    last_resort: Place | None = None
    whole = 0 if gpu.is_slice else gpu.whole
    devices = task.spec.devices
    looked = 0
    for node in _candidates(pool, task):
        if last_resort is not None or on_trap is not None:
            looked += 1
            if looked > TRAP_LOOKAHEAD:
                break
        # short_of_room and _pods_full written out: this loop is the hottest of placement.
        if not ok[node.pidx] or (cpu > 0 and node.free_cpu < cpu) or (mem > 0 and node.free_mem < mem):
            continue
        if node is avoid:
            continue
        limit = node.spec.max_pods
        if limit and len(node.tasks) >= limit:
            continue
        if verdict is not None and verdict.problem(node) is not None:
            continue
        if gpu.is_slice:
            fit = _slice_positions(node, task, strategy)
            if fit is None:
                continue
            place: Place = (node, *fit)
        else:
            positions = _whole_positions(node, gpu.whole, devices)
            if positions is None:
                continue
            place = (node, positions, ())
            if whole and node.trap:  # trap_rank's first test, inline: this is the hot loop
                if trap_rank(True, whole, node.free_whole - whole) == 1:
                    on_trap = on_trap or place
                else:
                    last_resort = last_resort or place
                continue
        if not scored:
            return place
        if all(p[0] is not node for p in found):
            found.append(place)
        if len(found) >= SCORED_CANDIDATES:
            break
    if found:
        return _preferred(cluster, caches, task, found)
    if on_trap is not None or last_resort is not None:
        return on_trap or last_resort
    if fail_key is not None:
        cache[fail_key] = cluster.release_version
    return None


def _preferred(cluster: Cluster, caches: SessionCaches, task: TaskState, found: list[Place]) -> Place:
    """The candidate the pod's preferred terms rank highest; the earliest of equals."""
    if len(found) == 1:
        return found[0]
    scores = preference_scores(cluster, caches.rules, task, [p[0] for p in found])
    best = max(range(len(found)), key=lambda i: (scores[i], -i))
    return found[best]


def _best_of(
    cluster: Cluster, caches: SessionCaches, nodes: list[NodeState], task: TaskState, verdict: Verdict | None
) -> Place | None:
    """Score a short list of nodes the way the buckets order a pool (then by preference)."""
    spread = task.job.pool is not None and task.job.pool.strategy is PlacementStrategy.SPREAD
    whole = 0 if task.gpu.is_slice else task.gpu.whole
    ranked: list[tuple[tuple[int, int, int, int], Place]] = []
    for node in nodes:
        if verdict is not None and verdict.problem(node) is not None:
            continue
        fit = fit_on_node(node, task)
        if fit is None:
            continue
        # Trap nodes after the others, one left with no free healthy GPU last (module docstring).
        trap = trap_rank(node.trap, whole, node.free_whole - whole)
        score = (trap, node.tier, -node.free_whole if spread else node.free_whole, node.pidx)
        ranked.append((score, (node, *fit)))
    if not ranked:
        return None
    ranked.sort(key=lambda r: r[0])
    placement = task.spec.placement
    if placement is not None and placement.scored:
        return _preferred(cluster, caches, task, [p for _, p in ranked[:SCORED_CANDIDATES]])
    return ranked[0][1]
