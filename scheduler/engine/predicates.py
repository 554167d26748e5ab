"""Static predicates: where a pod may go, whatever the state.

Predicates are split the way kube-scheduler's filter plugins are, by cost.
The *static* ones here depend only on the node and the pod's shape (node
accepts work at all, node selector, required node affinity and a bound
volume's node affinity, taints with effect NoSchedule or NoExecute, MIG
for slices); their verdict is computed once per pool and distinct shape
(``eligibility``) and reused for every pod of that shape. The *dynamic*
ones (free CPU, memory, whole GPUs, per-GPU memory bins, and the rules of
:mod:`scheduler.engine.rules` that read the pods around a node) change with
the working state and live with the candidate walk in
:mod:`scheduler.engine.scoring`.
"""

from __future__ import annotations

from scheduler.engine.caches import Eligibility, PoolCaches, Shape
from scheduler.engine.model import NodeTerm, Placement, TaintEffect
from scheduler.engine.rules import node_affinity_problem, node_term_matches
from scheduler.engine.state import NodeState, PoolState, TaskState

_BLOCKING_EFFECTS = frozenset({TaintEffect.NO_SCHEDULE, TaintEffect.NO_EXECUTE})


def static_exclusion(node: NodeState, task: TaskState, *, labels_checked: bool = False) -> str | None:
    """Why ``node`` can never take ``task`` this session, or None.

    ``labels_checked``: the caller already knows the node satisfies the
    pod's node selector and node affinity (it found it through the label
    index).
    """
    if not node.accepts:
        return node.excluded
    spec = task.spec
    if not labels_checked:
        if spec.node_selector:
            labels = node.spec.labels
            for key, value in spec.node_selector.items():
                if labels.get(key) != value:
                    return f"node selector {key}={value} does not match"
        if spec.placement is not None:
            problem = node_affinity_problem(spec.placement, node.spec)
            if problem is not None:
                return problem
    for taint in node.spec.taints:
        if taint.effect in _BLOCKING_EFFECTS and not any(t.tolerates(taint) for t in spec.tolerations):
            return f"taint {taint.key} not tolerated"
    if task.gpu.is_slice and node.mig:
        return "MIG enabled (takes no GPU slices)"
    return None


# A shape eligible on at most this share of its pool is placed by looking at
# its eligible nodes directly instead of walking the pool's buckets.
FEW_NODES_SHARE = 8


def _label_index(cache: PoolCaches, pool: PoolState) -> dict[tuple[str, str], list[int]]:
    index = cache.static.label_index
    if index is None:
        index = {}
        for node in pool.nodes:
            for item in node.spec.labels.items():
                index.setdefault(item, []).append(node.pidx)
        cache.static.label_index = index
    return index


def _label_matches(cache: PoolCaches, pool: PoolState, selector: tuple[tuple[str, str], ...]) -> set[int]:
    """Nodes (``pidx``) carrying every label of ``selector``, from a per-pool label index."""
    index = _label_index(cache, pool)
    matches: set[int] | None = None
    for item in selector:
        found = set(index.get(item, ()))
        matches = found if matches is None else matches & found
    return matches if matches is not None else set(range(len(pool.nodes)))


def _term_matches(cache: PoolCaches, pool: PoolState, term: NodeTerm) -> set[int]:
    """Nodes matching one node selector term: narrowed by its ``In`` requirements through the label index."""
    index = _label_index(cache, pool)
    narrowed: set[int] | None = None
    for req in term.expressions:
        if req.operator == "In":
            found = set().union(*(index.get((req.key, value), ()) for value in req.values))
            narrowed = found if narrowed is None else narrowed & found
    if narrowed is not None and not term.fields and all(r.operator == "In" for r in term.expressions):
        return narrowed  # exact: every requirement was an In
    nodes = pool.nodes
    candidates = narrowed if narrowed is not None else range(len(nodes))
    return {pidx for pidx in candidates if node_term_matches(term, nodes[pidx].spec)}


def _affinity_matches(cache: PoolCaches, pool: PoolState, placement: Placement) -> set[int]:
    """Nodes satisfying the pod's required node affinity and its volumes', cached per distinct set of terms."""
    key = placement.static
    found = cache.static.affinity.get(key)
    if found is None:
        if placement.node_terms:
            found = set().union(*(_term_matches(cache, pool, t) for t in placement.node_terms))
        else:
            found = set(range(len(pool.nodes)))
        for terms in placement.volume_terms:
            found &= set().union(*(_term_matches(cache, pool, t) for t in terms))
        if placement.avoid:
            avoid = placement.avoid
            found -= {node.pidx for node in pool.nodes if node.name in avoid}
        cache.static.affinity[key] = found
    return found


def _open_nodes(cache: PoolCaches, pool: PoolState) -> list[bool]:
    """Which nodes every pod without a node selector or node affinity may use (see ``PoolCaches``).

    A session sees dozens of shapes that differ only in their tolerations or
    request; judging the taint-free, MIG-free accepting nodes once leaves
    each shape only the few nodes whose taints or MIG it could fail on.
    """
    found = cache.static.open_nodes
    if found is None:
        found = []
        for node in pool.nodes:
            plain = not node.mig and not any(t.effect in _BLOCKING_EFFECTS for t in node.spec.taints)
            found.append(node.accepts and plain)
            if node.accepts and not plain:
                cache.static.irregular.append(node.pidx)
        cache.static.open_nodes = found
    return found


def eligibility(cache: PoolCaches, pool: PoolState, task: TaskState) -> Eligibility:
    """Static verdict for ``task``'s shape on every node of the pool, cached per shape in ``cache``."""
    spec = task.spec
    selector = tuple(sorted(spec.node_selector.items())) if spec.node_selector else ()
    placement = spec.placement
    static = (
        placement.static
        if placement is not None and (placement.node_terms or placement.volume_terms or placement.avoid)
        else None
    )
    key: Shape = (selector, spec.tolerations, task.gpu.is_slice, static)
    cached = cache.static.eligibility.get(key)
    if cached is None:
        nodes = pool.nodes
        if selector or static is not None:
            matches = _label_matches(cache, pool, selector) if selector else None
            if static is not None:
                assert placement is not None
                affine = _affinity_matches(cache, pool, placement)
                matches = affine if matches is None else matches & affine
            assert matches is not None
            open_nodes = _open_nodes(cache, pool)
            ok = [False] * len(nodes)
            for pidx in matches:
                ok[pidx] = open_nodes[pidx] or (
                    nodes[pidx].accepts and static_exclusion(nodes[pidx], task, labels_checked=True) is None
                )
        else:
            ok = list(_open_nodes(cache, pool))
            for pidx in cache.static.irregular:
                ok[pidx] = static_exclusion(nodes[pidx], task) is None
        count = sum(ok)
        few = [n for n in nodes if ok[n.pidx]] if count * FEW_NODES_SHARE <= len(nodes) else None
        cached = Eligibility(ok, few)
        cache.static.eligibility[key] = cached
    return cached


def shape_of(task: TaskState) -> Shape:
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
        spec.placement,
        spec.extended,
        spec.devices.key if spec.devices is not None else None,
    )
