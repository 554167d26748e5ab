"""The pods bound to nodes, indexed by label for Kubernetes' pod affinity and topology spread.

Lives below :mod:`scheduler.engine.state` (which keeps it up to date on
every placement and eviction) and :mod:`scheduler.engine.rules` (which
reads it): a term's matching pods come from the entry of its most
selective label, never from a scan of every pod.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from scheduler.engine.model import LabelSelector, Node, Task


@dataclass(slots=True, eq=False)
class Placed:
    """A pod bound to a node, as the index holds it."""

    spec: Task
    node: Node


@dataclass(slots=True, eq=False)
class PodIndex:
    """Every pod bound to a node, by label and by required anti-affinity; ``version`` counts changes.

    Keys are ``id()`` of the session's task (or of a bystander's spec),
    which live as long as the session.
    """

    placed: dict[int, Placed] = field(default_factory=dict)
    by_label: dict[tuple[str, str], dict[int, Placed]] = field(default_factory=dict)
    by_key: dict[str, dict[int, Placed]] = field(default_factory=dict)
    anti: dict[int, Placed] = field(default_factory=dict)
    version: int = 0
    anti_version: int = 0

    def add(self, key: int, spec: Task, node: Node) -> None:
        entry = Placed(spec, node)
        self.placed[key] = entry
        for item in spec.labels.items():
            self.by_label.setdefault(item, {})[key] = entry
            self.by_key.setdefault(item[0], {})[key] = entry
        if spec.placement is not None and spec.placement.anti_affinity:
            self.anti[key] = entry
            self.anti_version += 1
        self.version += 1

    def remove(self, key: int) -> None:
        entry = self.placed.pop(key, None)
        if entry is None:
            return
        for item in entry.spec.labels.items():
            self.by_label[item].pop(key, None)
            self.by_key[item[0]].pop(key, None)
        if self.anti.pop(key, None) is not None:
            self.anti_version += 1
        self.version += 1

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
                found = self.by_key.get(req.key)
            elif req.operator == "In" and len(req.values) == 1:
                found = self.by_label.get((req.key, req.values[0]))
            else:
                continue
            if not found:
                return ()
            if best is None or len(found) < len(best):
                best = found
        return (best if best is not None else self.placed).values()
