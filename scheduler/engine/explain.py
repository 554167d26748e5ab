"""Why a job is still pending, in words a person can act on.

Allocate and the limit checks record a specific reason when they refuse a
job (which queue, which limit, by how much). When the refusal was "no room",
the reason is worked out here, once, against the final state of the
session: which nodes of the pool were excluded and why (cordoned, faulty
hardware, taints, node selector and affinity, MIG), and of the rest what
each lacked (free GPUs, GPU memory for the slice, CPU, memory, or a rule
the pods around it set: anti-affinity, affinity, spread, host ports, other
resources), plus how far the pool as
a whole is from holding the gang. The analysis is cached per pod shape, so
a thousand identical pending pods cost one analysis.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from gpuwarden.contract import UnschedulableReason
from scheduler.engine.caches import NodeGroups, SessionCaches
from scheduler.engine.limits import limit_problem
from scheduler.engine.model import PendingReason
from scheduler.engine.predicates import eligibility, static_exclusion
from scheduler.engine.resources import CPU, GPU, MEMORY, format_amount, format_vector
from scheduler.engine.rules import needs_verdict, rules_key, term_selects, verdict_for
from scheduler.engine.scoring import fit_on_node
from scheduler.engine.state import Cluster, JobState, NodeState, PoolState, TaskState


def _summary(counts: Counter[str]) -> str:
    return ", ".join(f"{n} {why}" for why, n in _by_count(counts))


def _lacking(counts: Counter[str]) -> str:
    """What nodes lack, counted: "8 nodes with fewer than 8 free GPUs" (a count, then what they lack)."""
    return ", ".join(f"{n} node{'' if n == 1 else 's'} with {why}" for why, n in _by_count(counts))


def _by_count(counts: Counter[str]) -> list[tuple[str, int]]:
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def _shortfall(node: NodeState, task: TaskState) -> str:
    gpu = task.gpu
    if gpu.is_slice:
        need = gpu.slice_on(node.gpu_mem[0]) if node.gpu_mem else 0
        usable = sum(
            1
            for p in range(len(node.gpu_ok))
            if node.gpu_ok[p] and not node.gpu_whole[p] and node.gpu_free[p] >= gpu.slice_on(node.gpu_mem[p])
        )
        if usable < gpu.devices:
            return f"fewer than {gpu.devices} GPU(s) with {need} MiB free"
    elif node.free_whole < gpu.whole:
        if node.mig and any(g.parent is not None for g in node.spec.gpus):
            return f"fewer than {gpu.whole} free GPUs or MIG devices"
        if node.mig:
            return f"fewer than {gpu.whole} free GPUs not in MIG mode"
        return f"fewer than {gpu.whole} free GPUs"
    if task.cpu > 0 and node.free_cpu < task.cpu:
        return "too little free CPU"
    if task.mem > 0 and node.free_mem < task.mem:
        return "too little free memory"
    devices = task.spec.devices
    if gpu.whole and devices is not None:
        # Room enough for the count, so the GPUs free there are not ones the pod may be given.
        if node.name not in devices.plain and node.name not in devices.nodes:
            return "no device plugin serves nvidia.com/gpu there and its DRA devices match none of the pod's"
        if node.name in devices.choices:
            return (
                f"its {gpu.whole} GPUs cannot be found among the free ones there: each request of its resource "
                "claims needs its own, of those its selectors (and matchAttribute constraints) allow"
            )
        return f"fewer than {gpu.whole} free GPUs its resource claims' selectors allow"
    return "their room taken by other pods placed this cycle"


def _describe_pod(task: TaskState) -> str:
    gpu = task.gpu
    parts: list[str] = []
    if gpu.whole:
        parts.append(format_amount(GPU, gpu.whole * 1000))
    elif gpu.fraction is not None:
        parts.append(f"{gpu.fraction:g} of a GPU on {gpu.devices} device(s)")
    elif gpu.memory_mib is not None:
        parts.append(f"{gpu.memory_mib} MiB of GPU memory on {gpu.devices} device(s)")
    if task.cpu:
        parts.append(format_amount(CPU, task.cpu))
    if task.mem:
        parts.append(format_amount(MEMORY, task.mem))
    return ", ".join(parts) or "no resources"


def _signature(node: NodeState) -> tuple[object, ...]:
    return (node.free_cpu, node.free_mem, node.free_whole, tuple(node.gpu_free), tuple(node.gpu_whole), node.mig)


def _signatures(caches: SessionCaches, pool: PoolState) -> list[tuple[object, ...]]:
    """Each node's free resources as one comparable value (by ``pidx``), once per pool: explanations
    are made after the actions, when the state no longer changes."""
    found = caches.signatures.get(pool.name)
    if found is None:
        found = caches.signatures[pool.name] = [_signature(node) for node in pool.nodes]
    return found


def _groups(caches: SessionCaches, pool: PoolState, task: TaskState) -> NodeGroups:
    spec = task.spec
    key = (
        pool.name,
        tuple(sorted(spec.node_selector.items())) if spec.node_selector else (),
        spec.tolerations,
        task.gpu.is_slice,
        spec.placement.static if spec.placement is not None else None,
    )
    cached = caches.node_groups.get(key)
    if cached is not None:
        return cached
    # The static verdict is placement's own (cached per shape); only the
    # nodes it refuses are asked why, for the text.
    ok = eligibility(caches.pool(pool), pool, task).ok
    signatures = _signatures(caches, pool)
    excluded: Counter[str] = Counter()
    first: dict[tuple[object, ...], NodeState] = {}
    alike: Counter[tuple[object, ...]] = Counter()
    for node in pool.nodes:
        if not ok[node.pidx]:
            excluded[static_exclusion(node, task) or "excluded"] += 1
            continue
        sig = signatures[node.pidx]
        if sig not in first:
            first[sig] = node
        alike[sig] += 1
    result = NodeGroups(len(pool.nodes), excluded, [(first[sig], n) for sig, n in alike.items()])
    caches.node_groups[key] = result
    return result


def _with_whole_gpus(cluster: Cluster, pool: PoolState, whole: int) -> Iterable[NodeState]:
    """The pool's nodes that could have room for a pod of ``whole`` GPUs: through the placement
    index those with that many free (most of a busy pool has fewer), else every node."""
    if whole <= 0 or not cluster.indexed:
        return pool.nodes
    return [n for tier in pool.whole_buckets for c, nodes in tier.items() if c >= whole for n in nodes.values()]


def _analyse(
    caches: SessionCaches, pool: PoolState, task: TaskState, count: int, cluster: Cluster | None = None
) -> PendingReason:
    if not pool.nodes:
        return PendingReason(UnschedulableReason.NO_ELIGIBLE_NODES, f"node pool {pool.name} has no nodes")
    view = _groups(caches, pool, task)
    excluded = view.excluded
    short: Counter[str] = Counter()
    eligible = 0
    free_gpus = 0
    most_gpus = 0
    for node, alike in view.groups:
        eligible += alike
        free_gpus += node.free_whole * alike
        most_gpus = max(most_gpus, node.free_whole)
        if fit_on_node(node, task) is None:
            short[_shortfall(node, task)] += alike
    if cluster is not None and needs_verdict(cluster, task):
        # The pods around differ between nodes alike in free resources:
        # of the nodes with room, each is judged on its own.
        verdict = verdict_for(cluster, caches.rules, task)
        ok = eligibility(caches.pool(pool), pool, task).ok
        for node in _with_whole_gpus(cluster, pool, task.gpu.whole):
            if ok[node.pidx] and fit_on_node(node, task) is not None:
                problem = verdict.problem(node)
                if problem is not None:
                    short[problem] += 1
    pod = f"each pod needs {_describe_pod(task)} on one node"
    if eligible == 0:
        return PendingReason(
            UnschedulableReason.NO_ELIGIBLE_NODES,
            f"{pod}, but none of the {view.total} nodes of pool {pool.name} can take it: {_summary(excluded)}",
        )
    fitting = eligible - sum(short.values())
    text = f"{pod}; {fitting} of {eligible} eligible nodes of pool {pool.name} have room"
    if short:
        text += f" ({_lacking(short)})"
    if fitting == 0 and task.gpu.whole > most_gpus:
        text += f"; the most free GPUs on one eligible node is {most_gpus}"
    if excluded:
        text += f"; {sum(excluded.values())} nodes excluded ({_summary(excluded)})"
    placement = task.spec.placement
    if placement is not None and count > 1:
        for term in placement.anti_affinity:
            if term_selects(term, task.spec.namespace, task.spec):
                text += f"; its pods keep apart by {term.topology_key}: the gang needs {count} distinct domains"
    if task.gpu.whole and count > 1:
        need = task.gpu.whole * count
        text += f"; the gang needs {need} GPUs for {count} pods, eligible nodes have {free_gpus} free"
        if need > free_gpus:
            text += f" (short by {need - free_gpus})"
    return PendingReason(UnschedulableReason.INSUFFICIENT_RESOURCES, text)


def _gpus_in_all(caches: SessionCaches, pool: PoolState) -> int:
    found = caches.gpus_in_all.get(pool.name)
    if found is None:
        found = caches.gpus_in_all[pool.name] = sum(len(node.gpu_mem) for node in pool.nodes)
    return found


def _beyond_pool(
    caches: SessionCaches, pool: PoolState, job: JobState, task: TaskState, count: int
) -> PendingReason | None:
    """The reason of a gang that needs more GPUs than its pool has at all, None if it could fit.

    Such a gang waits for nothing that will ever come: not for idle
    capacity, not for a reclaim. Saying how far it is from the free GPUs
    (or that only idle capacity can serve it) would send its owner looking
    for the wrong cause, so it is told this alone. What the gang's members
    already hold counts, so the figure is the gang's, not only its
    pending part's.
    """
    whole = task.gpu.whole
    if not whole:
        return None
    held = [t for t in job.tasks if t.node is not None and not t.releasing]
    need = whole * count + sum(t.gpu.whole for t in held)
    in_all = _gpus_in_all(caches, pool)
    if need <= in_all:
        return None
    return PendingReason(
        UnschedulableReason.INSUFFICIENT_RESOURCES,
        f"the gang needs {need} GPUs for {count + len(held)} pods but pool {pool.name} has {in_all} GPUs "
        f"in all: it will never fit; lower its minMember or add nodes to the pool",
    )


def reasons(caches: SessionCaches, job: JobState, cluster: Cluster | None = None) -> list[PendingReason]:
    """Why ``job`` is still pending; with ``cluster``, nodes the placement rules refuse are counted by rule."""
    if job.error is not None:
        return [job.error]
    specific = [r for r in job.reasons if r.code is not UnschedulableReason.INSUFFICIENT_RESOURCES]
    if specific:
        return specific
    pending = job.pending_tasks()
    pool = job.pool
    if not pending or pool is None:
        return list(job.reasons)
    if job.gang_short == 0 and not job.reasons:
        gang = job.spec.min_member
        done = job.spec.succeeded
        whole = (
            f"gang of {gang} is running"
            if not done
            else f"gang of {gang} is met ({job.held} running, {done} succeeded)"
        )
        first = pending[0]
        # Extras a queue bound keeps out wait for that, not for room.
        bound = limit_problem(job.queue, [first.milli, first.cpu, first.mem], job.preemptible) if job.queue else None
        if bound is not None:
            return [PendingReason(bound.code, f"{whole}; {len(pending)} more pods wait: {bound.message}")]
        return [
            PendingReason(
                UnschedulableReason.INSUFFICIENT_RESOURCES,
                f"{whole}; {len(pending)} more pods wait for room "
                f"({format_vector([t.milli for t in pending[:1]] + [pending[0].cpu, pending[0].mem])} each)",
            )
        ]
    task = job.unplaced or pending[0]
    count = max(1, job.gang_short)
    never = _beyond_pool(caches, pool, job, task, count)
    if never is not None:
        return [never]
    cache = caches.reasons
    key: tuple[object, ...] = (pool.name, count)
    if cluster is not None and needs_verdict(cluster, task):
        verdict = verdict_for(cluster, caches.rules, task)
        found_key = rules_key(task, verdict)
        key = (*key, *(found_key if found_key is not None else (id(task),)))
    else:
        key = (*key, *task.shape)
    found = cache.get(key)
    if found is None:
        found = _analyse(caches, pool, task, count, cluster)
        cache[key] = found
    if found.code is not UnschedulableReason.INSUFFICIENT_RESOURCES:
        return [found]
    return [found, *(PendingReason(found.code, note) for note in job.notes)]
