"""The queue tree and its fair share, per node pool and per resource.

Fair share is computed top-down: a pool's healthy capacity is divided among
its top-level queues, each queue's share among its children, and so on to the
leaves. At every level the division is the same two-phase rule:

1. **Quota.** Each child gets its *deserved* amount: ``min(quota, request,
   limit)`` (a quota of -1 deserves all it requests, and so does a
   resource the queue does not govern: its siblings' quotas and its
   requests alone decide its share). If the parent's share
   cannot cover every deserved amount (capacity lost to faults), higher
   priority children are covered first and the last tier that only partly
   fits is divided in proportion to what each deserves.
2. **Over quota.** What is left goes to children that still want more, one
   priority tier at a time (highest first), in proportion to
   ``overQuotaWeight`` and capped at what each can take, repeating until the
   remainder is gone or nobody can take more. A weight of 0 means "never over
   quota".

Amounts are handed out in whole units (one GPU, one core, one GiB; see
``resources.WHOLE_UNIT``), one unit at a time, each to the child whose
``weight / (units it has + 1/2)`` is largest among those that can still
take more (ties to the higher weight, then to the queue name). A child
that is full drops out, so what it cannot take is shared by the others'
weights alone. This is proportional water-filling rounded to whole units,
and it keeps three promises that rounding each round's proportional share
down (and handing out the leftovers) cannot: children with the same weight
and demand end at most one unit apart, raising a child's weight never lowers
its share, and more to divide never leaves any child with less. Names only
decide who gets a unit the others tied for. A part of a unit (a cap or the
amount left that is not a whole unit) goes the same way: to the child next
in line, which, when nothing has been handed out yet, is the child with the
largest weight (ties by queue name). So the result is deterministic, and
when the children can absorb the parent's share they receive exactly all
of it.

"What a child can take" is its absorbable demand: for a leaf
``min(request, limit)``; for an inner queue ``min(limit, sum over children of
what each can take at this weight)``, where a child with weight 0 can take
only what it deserves. Counting it this way is what makes siblings' shares
sum to their parent's whenever there is demand for it.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from scheduler.engine.model import UNLIMITED, Queue, QueueResource
from scheduler.engine.resources import CPU, GPU, MEMORY, RESOURCES, WHOLE_UNIT

Vector = tuple[int, int, int]
ZERO: Vector = (0, 0, 0)


@dataclass(slots=True, eq=False)
class TreeQueue:
    """A queue placed in its tree: parent, children (sorted by name), depth."""

    spec: Queue
    parent: TreeQueue | None = None
    children: list[TreeQueue] = field(default_factory=list)
    depth: int = 0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def path(self) -> list[TreeQueue]:
        """Ancestors from the top-level queue down to this one (inclusive)."""
        chain: list[TreeQueue] = []
        node: TreeQueue | None = self
        while node is not None:
            chain.append(node)
            node = node.parent
        chain.reverse()
        return chain


@dataclass(slots=True)
class QueueTree:
    """Every valid queue, the top-level queues of each pool, and what was wrong.

    ``errors`` maps a queue name to why it cannot be used (unknown parent, a
    cycle, a parent in another pool); such a queue and its descendants are
    left out of the tree and jobs naming them stay pending with that reason.
    """

    queues: dict[str, TreeQueue]
    roots: dict[str, list[TreeQueue]]
    errors: dict[str, str]


def build_tree(queues: Sequence[Queue], invalid: Mapping[str, str] | None = None) -> QueueTree:
    """The tree of ``queues``; ``invalid`` names queues that exist but could not be read, and why.

    An invalid queue is no part of the tree and neither is anything below
    it: a child says its ancestor is unusable, not that its parent is missing.
    """
    specs: dict[str, Queue] = {}
    errors: dict[str, str] = dict(invalid or {})
    for q in queues:
        if q.name in specs:
            errors[q.name] = f"queue {q.name} is defined twice"
        specs[q.name] = q
    # Resolve each queue's chain of ancestors; anything that does not end at
    # a top-level queue of the same pool is unusable.
    for name in sorted(specs):
        if name in errors:
            continue
        seen = [name]
        cur = specs[name]
        while cur.parent is not None:
            if cur.parent in errors and cur.parent not in specs:
                errors[name] = f"queue {name}: ancestor {cur.parent} is unusable ({errors[cur.parent]})"
                break
            if cur.parent not in specs:
                errors[name] = f"queue {name}: parent queue {cur.parent} does not exist"
                break
            if cur.parent in seen:
                errors[name] = f"queue {name}: parent chain loops ({' -> '.join([*seen, cur.parent])})"
                break
            parent = specs[cur.parent]
            if parent.node_pool != cur.node_pool:
                errors[name] = (
                    f"queue {name}: queue {cur.name} is in node pool {cur.node_pool} "
                    f"but its parent {parent.name} is in {parent.node_pool}"
                )
                break
            if parent.name in errors:
                errors[name] = f"queue {name}: ancestor {parent.name} is unusable ({errors[parent.name]})"
                break
            seen.append(parent.name)
            cur = parent
    nodes = {name: TreeQueue(spec) for name, spec in specs.items() if name not in errors}
    roots: dict[str, list[TreeQueue]] = {}
    for name in sorted(nodes):
        node = nodes[name]
        if node.spec.parent is None:
            roots.setdefault(node.spec.node_pool, []).append(node)
        else:
            parent_node = nodes[node.spec.parent]
            node.parent = parent_node
            parent_node.children.append(node)

    for pool_roots in roots.values():
        for root in pool_roots:
            _set_depth(root, 0)
    return QueueTree(nodes, roots, errors)


def _set_depth(node: TreeQueue, depth: int) -> None:
    # Not a closure: a recursive inner function is a reference cycle of its own,
    # garbage only a full collection finds (see scheduler.collector).
    node.depth = depth
    for child in node.children:
        _set_depth(child, depth + 1)


@dataclass(frozen=True, slots=True)
class ShareRow:
    """One queue's line of the share table (engine units)."""

    queue: str
    pool: str
    depth: int
    quota: Vector
    limit: Vector
    weight: tuple[float, float, float]
    request: Vector
    fair_share: Vector


def _apportion(
    amount: int,
    *,
    members: list[int],
    weights: list[Fraction],
    caps: list[int],
    names: list[str],
    unit: int,
) -> list[int]:
    """Give up to ``amount`` to ``members`` by weight, capped, in whole units.

    Pieces of one unit (less where a cap, or what is left, leaves less) go
    out one at a time; a member's next piece ranks by ``weight / (pieces it
    has + 1/2)``, ties to the higher weight, then to the name. Handing out
    one piece at a time in that order is what keeps the division fair at
    the edges: a member that is full simply stops ranking, so its unused
    part is shared by weight alone; more to share never leaves anyone with
    less; more weight never leaves its owner with less; and members of equal
    weight and cap end at most one piece apart, names deciding only who gets
    the last one.
    """
    grants = [0] * len(caps)
    active = [i for i in members if caps[i] > 0 and weights[i] > 0]
    if amount <= 0 or not active:
        return grants
    if sum(caps[i] for i in active) <= amount:
        for i in active:
            grants[i] = caps[i]
        return grants
    pieces = _pieces_surely_given(amount, active, weights, caps, unit)
    remaining = amount
    for i in active:
        grants[i] = min(pieces[i] * unit, caps[i])
        remaining -= grants[i]
    line = [_rank(weights[i], pieces[i], names[i], i) for i in active if grants[i] < caps[i]]
    heapq.heapify(line)
    while remaining > 0 and line:
        i = heapq.heappop(line)[3]
        g = min(unit, caps[i] - grants[i], remaining)
        grants[i] += g
        remaining -= g
        pieces[i] += 1
        if grants[i] < caps[i]:
            heapq.heappush(line, _rank(weights[i], pieces[i], names[i], i))
    return grants


def _rank(weight: Fraction, pieces: int, name: str, i: int) -> tuple[Fraction, Fraction, str, int]:
    """Heap key of a member's next piece: ``weight / (pieces + 1/2)``, highest first."""
    return (Fraction(-2 * weight.numerator, weight.denominator * (2 * pieces + 1)), -weight, name, i)


def _pieces_surely_given(
    amount: int, active: list[int], weights: list[Fraction], caps: list[int], unit: int
) -> dict[int, int]:
    """How many pieces each member gets for certain, computed in one go.

    Handing out a large amount piece by piece would take as many steps as
    there are units. Instead, take every piece ranked above the level at
    which proportional water-filling would share ``amount`` less half a unit
    per member (and one to spare): those pieces come first in the ranking
    and together do not exceed ``amount``, so the piece-by-piece hand-out
    would give them all; only the last few (about one per member) are left
    to rank one by one. The level is found in floating point, which is fast
    and only has to be close; which pieces rank above it is counted exactly,
    and checked.
    """
    none = dict.fromkeys(active, 0)
    target = amount / unit - len(active) / 2 - 1
    if target <= 0:
        return none
    weight = {i: float(weights[i]) for i in active}
    total_weight = sum(weight.values())
    # Water-filling: members whose cap is reached below the level drop out.
    for i in sorted(active, key=lambda i: caps[i] / weight[i]):
        cap = caps[i] / unit
        if cap > target / total_weight * weight[i]:
            break
        target -= cap
        total_weight -= weight[i]
    if target <= 0 or total_weight <= 0:
        return none
    p, q = (target / total_weight).as_integer_ratio()
    pieces: dict[int, int] = {}
    given = 0
    for i in active:
        # Piece k ranks above the level p/q when k - 1/2 < (p/q) * (a/b).
        a, b = weights[i].numerator, weights[i].denominator
        count = max(0, min(-(-(2 * p * a + q * b) // (2 * q * b)) - 1, -(-caps[i] // unit)))
        pieces[i] = count
        given += min(count * unit, caps[i])
    return pieces if given <= amount else none


def _bounded(value: int, bound: int) -> int:
    return value if bound == UNLIMITED else min(value, bound)


def divide(
    total: int,
    children: Sequence[Queue],
    absorbable: Sequence[int],
    resource: int,
) -> list[int]:
    """Divide ``total`` of one resource among sibling queues (the two phases).

    ``absorbable[i]`` is what child ``i`` can take in all (its capped demand).
    """
    if len(children) == 1:
        return [_divide_alone(total, children[0].resources[resource], absorbable[0])]
    return _divide_among(total, children, absorbable, resource)


def _divide_alone(total: int, setting: QueueResource, absorbable: int) -> int:
    """:func:`divide` for a queue without siblings (a pool's only top-level queue, an only child).

    The two phases come down to a minimum each: one member takes every
    piece until its cap or the amount runs out. Worked out here without
    the pieces and their exact weights, which were most of a quiet cycle's
    fair-share pass (one queue per pool is the common tree).
    """
    deserved = absorbable if setting.quota == UNLIMITED else min(setting.quota, absorbable)
    if deserved > total:
        return max(0, total)
    room = absorbable - deserved
    left = total - deserved
    if left > 0 and room > 0 and setting.over_quota_weight > 0:
        return deserved + min(room, left)
    return deserved


def _divide_among(
    total: int,
    children: Sequence[Queue],
    absorbable: Sequence[int],
    resource: int,
) -> list[int]:
    """:func:`divide` for two siblings or more: quotas by tier, then over quota by weight."""
    n = len(children)
    names = [c.name for c in children]
    unit = WHOLE_UNIT[resource]
    settings = [c.resources[resource] for c in children]
    deserved = [
        absorbable[i] if settings[i].quota == UNLIMITED else min(settings[i].quota, absorbable[i]) for i in range(n)
    ]
    tiers = sorted({c.priority for c in children}, reverse=True)
    grants = [0] * n
    remaining = total
    # Phase 1: quotas, whole tiers while they fit, then a proportional cut.
    for tier in tiers:
        members = [i for i in range(n) if children[i].priority == tier]
        need = sum(deserved[i] for i in members)
        if need <= remaining:
            for i in members:
                grants[i] = deserved[i]
            remaining -= need
            continue
        part = _apportion(
            remaining, members=members, weights=[Fraction(d) for d in deserved], caps=deserved, names=names, unit=unit
        )
        for i in members:
            grants[i] = part[i]
        remaining = 0
        break
    # Phase 2: over quota, tier by tier, by weight.
    weights: list[Fraction] | None = None
    for tier in tiers:
        if remaining <= 0:
            break
        members = [i for i in range(n) if children[i].priority == tier]
        caps = [absorbable[i] - grants[i] for i in range(n)]
        if not any(caps[i] > 0 for i in members):
            continue  # every member has what it can take: nothing to weigh
        if weights is None:
            weights = [Fraction(s.over_quota_weight) for s in settings]
        extra = _apportion(remaining, members=members, weights=weights, caps=caps, names=names, unit=unit)
        for i in members:
            grants[i] += extra[i]
            remaining -= extra[i]
    return grants


def _absorbable(node: TreeQueue, demand: Mapping[str, Sequence[int]], out: dict[str, list[int]]) -> list[int]:
    """Fill ``out`` with each queue's absorbable demand, bottom-up."""
    limits = [node.spec.resources[r].limit for r in RESOURCES]
    if node.is_leaf:
        raw = demand.get(node.name, ZERO)
        value = [_bounded(raw[r], limits[r]) for r in RESOURCES]
    else:
        value = [0, 0, 0]
        for child in node.children:
            child_value = _absorbable(child, demand, out)
            for r in RESOURCES:
                setting = child.spec.resources[r]
                if setting.over_quota_weight > 0 or setting.quota == UNLIMITED:
                    value[r] += child_value[r]
                else:
                    value[r] += min(setting.quota, child_value[r])
        value = [_bounded(value[r], limits[r]) for r in RESOURCES]
    out[node.name] = value
    return value


def _request(node: TreeQueue, demand: Mapping[str, Sequence[int]], out: dict[str, Vector]) -> Vector:
    if node.is_leaf:
        raw = demand.get(node.name, ZERO)
        value: Vector = (raw[GPU], raw[CPU], raw[MEMORY])
    else:
        sums = [0, 0, 0]
        for child in node.children:
            child_value = _request(child, demand, out)
            for r in RESOURCES:
                sums[r] += child_value[r]
        value = (sums[GPU], sums[CPU], sums[MEMORY])
    out[node.name] = value
    return value


def fair_shares(
    tree: QueueTree,
    capacity: Mapping[str, Sequence[int]],
    demand: Mapping[str, Sequence[int]],
) -> dict[str, ShareRow]:
    """Every queue's share row; ``capacity`` per pool, ``demand`` per leaf queue."""
    rows: dict[str, ShareRow] = {}
    for pool in sorted(tree.roots):
        roots = tree.roots[pool]
        absorb: dict[str, list[int]] = {}
        requests: dict[str, Vector] = {}
        for root in roots:
            _absorbable(root, demand, absorb)
            _request(root, demand, requests)
        shares: dict[str, list[int]] = {}
        _descend(capacity.get(pool, ZERO), roots, absorb, shares)
        for root in roots:
            _emit(root, pool, shares, requests, rows)
    return rows


def _descend(
    total: Sequence[int], siblings: list[TreeQueue], absorb: dict[str, list[int]], shares: dict[str, list[int]]
) -> None:
    specs = [s.spec for s in siblings]
    per_resource = [divide(total[r], specs, [absorb[s.name][r] for s in siblings], r) for r in RESOURCES]
    for i, sibling in enumerate(siblings):
        shares[sibling.name] = [per_resource[r][i] for r in RESOURCES]
        if sibling.children:
            _descend(shares[sibling.name], sibling.children, absorb, shares)


def _emit(
    node: TreeQueue,
    pool: str,
    shares: dict[str, list[int]],
    requests: dict[str, Vector],
    rows: dict[str, ShareRow],
) -> None:
    spec = node.spec
    share = shares[node.name]
    rows[node.name] = ShareRow(
        queue=node.name,
        pool=pool,
        depth=node.depth,
        quota=(spec.gpu.quota, spec.cpu.quota, spec.memory.quota),
        limit=(spec.gpu.limit, spec.cpu.limit, spec.memory.limit),
        weight=(spec.gpu.over_quota_weight, spec.cpu.over_quota_weight, spec.memory.over_quota_weight),
        request=requests[node.name],
        fair_share=(share[GPU], share[CPU], share[MEMORY]),
    )
    for child in node.children:
        _emit(child, pool, shares, requests, rows)
