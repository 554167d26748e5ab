"""The pods bound to nodes, indexed by label for Kubernetes' pod affinity and topology spread.

Lives below :mod:`scheduler.engine.state` (which keeps it up to date on
every placement and eviction) and :mod:`scheduler.engine.rules` (which
reads it): a term's matching pods come from the entry of its most
selective label, never from a scan of every pod.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from scheduler.engine.model import LabelSelector, Node, PodTerm, Task


@dataclass(slots=True, eq=False)
class Placed:
    """A pod bound to a node, as the index holds it."""

    spec: Task
    node: Node


# A required anti-affinity term of a bound pod, with the pod.
Guard = tuple[PodTerm, Placed]


def _guard_slot(term: PodTerm) -> tuple[str, str] | None:
    """A label every pod the term selects must carry, to file the term under; None if there is none."""
    selector = term.selector
    assert selector is not None
    if selector.match_labels:
        return selector.match_labels[0]
    for req in selector.expressions:
        if req.operator == "In" and len(req.values) == 1:
            return (req.key, req.values[0])
    return None


@dataclass(slots=True, eq=False)
class PodIndex:
    """Every pod bound to a node, by label, and the bound pods' required anti-affinity terms.

    ``version`` counts changes, ``guard_version`` those that added or removed
    an anti-affinity term (all a verdict of a pod without pod rules of its
    own reads). Keys are ``id()`` of the session's task (or
    of a bystander's spec), which live as long as the session. Anti-affinity
    terms are filed under a label every pod they select must carry
    (``guards``), so the terms that may select a newcomer are found from
    its own labels, not by testing every term in the cluster; the few
    without such a label are in ``open_guards``.
    """

    placed: dict[int, Placed] = field(default_factory=dict)
    by_label: dict[tuple[str, str], dict[int, Placed]] = field(default_factory=dict)
    # By label key alone (for ``Exists``), derived from by_label on first use.
    by_key: dict[str, dict[int, Placed]] | None = None
    guards: dict[tuple[str, str], dict[tuple[int, int], Guard]] = field(default_factory=dict)
    open_guards: dict[tuple[int, int], Guard] = field(default_factory=dict)
    version: int = 0
    guard_version: int = 0

    def add(self, key: int, spec: Task, node: Node) -> None:
        entry = Placed(spec, node)
        self.placed[key] = entry
        labels = spec.labels
        if labels:
            by_label = self.by_label
            by_key = self.by_key
            for item in labels.items():
                slot = by_label.get(item)
                if slot is None:
                    by_label[item] = {key: entry}
                else:
                    slot[key] = entry
                if by_key is not None:
                    by_key.setdefault(item[0], {})[key] = entry
        placement = spec.placement
        if placement is not None and placement.anti_affinity:
            for i, term in enumerate(placement.anti_affinity):
                if term.selector is None:
                    continue  # selects no pod
                slot_label = _guard_slot(term)
                filed = self.open_guards if slot_label is None else self.guards.setdefault(slot_label, {})
                filed[(key, i)] = (term, entry)
            self.guard_version += 1
        self.version += 1

    def remove(self, key: int) -> None:
        entry = self.placed.pop(key, None)
        if entry is None:
            return
        by_key = self.by_key
        for item in entry.spec.labels.items():
            self.by_label[item].pop(key, None)
            if by_key is not None:
                by_key[item[0]].pop(key, None)
        placement = entry.spec.placement
        if placement is not None and placement.anti_affinity:
            for i, term in enumerate(placement.anti_affinity):
                if term.selector is None:
                    continue
                slot_label = _guard_slot(term)
                filed = self.open_guards if slot_label is None else self.guards.get(slot_label, {})
                filed.pop((key, i), None)
            self.guard_version += 1
        self.version += 1

    def with_key(self, key: str) -> dict[int, Placed] | None:
        """Pods carrying label ``key`` (any value)."""
        by_key = self.by_key
        if by_key is None:
            by_key = {}
            for (name, _), pods in self.by_label.items():
                if pods:
                    by_key.setdefault(name, {}).update(pods)
            self.by_key = by_key
        return by_key.get(key)

    def guards_for(self, labels: Mapping[str, str]) -> Iterator[Guard]:
        """Every bound pod's anti-affinity term that may select a pod with ``labels`` (a superset)."""
        yield from self.open_guards.values()
        guards = self.guards
        if guards:
            for item in labels.items():
                filed = guards.get(item)
                if filed:
                    yield from filed.values()

    def candidates(self, selector: LabelSelector) -> Iterable[Placed]:
        """A superset of the pods ``selector`` matches, from its most selective index entry."""
        best: dict[int, Placed] | None = None
        for item in selector.match_labels:
            found = self.by_label.get(item)
            if not found:
                return ()
            if best is None or len(found) < len(best):
                best = found
        for req in selector.expressions:
            if req.operator == "Exists":
                found = self.with_key(req.key)
            elif req.operator == "In" and len(req.values) == 1:
                found = self.by_label.get((req.key, req.values[0]))
            else:
                continue
            if not found:
                return ()
            if best is None or len(found) < len(best):
                best = found
        return (best if best is not None else self.placed).values()
