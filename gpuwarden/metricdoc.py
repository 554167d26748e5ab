"""What each process exports, written down once: name, type, help and labels of a metric family.

Both processes keep a table of these beside their collector; the collector
builds its families from the table, and a test keeps each README's metrics
table equal to it, so what is exported, what is documented and what alert
rules are written against cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MetricFamilyDoc:
    """Name, type and help of one exported family (the README documents these)."""

    name: str
    kind: str
    help: str
    labels: tuple[str, ...]


def family(prefix: str, name: str, kind: str, help: str, labels: Sequence[str]) -> MetricFamilyDoc:
    """The family ``prefix_name``; ``prefix`` is the process's (``gpuwarden``, ``gpuwarden_scheduler``)."""
    return MetricFamilyDoc(f"{prefix}_{name}", kind, help, tuple(labels))
