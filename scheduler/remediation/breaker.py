"""The circuit breaker: how much of a node pool remediation may take out at once.

Why it exists: when many nodes "fail" at the same moment the cause is rarely
many broken GPUs. It is a bad driver rollout, a firmware push, a flapping
switch, a bug in the health rules. Quarantining everything that reports a
fault then turns one bad change into a pool-wide outage. So, per node pool:

- New quarantines stop while the pool already has its limit of nodes out:
  at most ``max(1, floor(max_out_fraction * pool size))`` nodes (default 10%),
  and at most ``max_out_nodes`` if that is set. One node of a small pool can
  always be taken out, or a five-node pool could never be remediated.
- Every node that is out counts, for whatever reason: cordoned by a person,
  not Ready, or with any remediation workflow (a single quarantined GPU
  included, since a mass GPU failure is the bad-rollout signal this guards
  against). A node already out may go further (another GPU, the whole node):
  that changes no count.
- Returning validated hardware is never stopped. A breaker that also stops
  uncordoning recovered nodes (as some do) keeps the pool short for as long
  as it stays tripped, which is exactly when capacity is scarcest.
- At most ``max_concurrent_drains`` nodes of a pool drain at once, so a burst
  of faults does not evict a whole pool's work in one go; the others wait,
  already quarantined, for a slot.

A held quarantine is not silent: the machine records the hold and raises an
Event, and the controller counts it as a breaker trip for the alert. The
faulty hardware still takes no new gpuwarden work (the engine's health judge
keeps it out of placement); it only is not drained and repaired until the
breaker lets it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


class BreakerSettingsError(ValueError):
    """A breaker setting that makes no sense, with the setting named."""


@dataclass(frozen=True, slots=True)
class BreakerSettings:
    max_out_fraction: float = 0.10
    max_out_nodes: int | None = None
    max_concurrent_drains: int = 10

    def __post_init__(self) -> None:
        if not 0 < self.max_out_fraction <= 1:
            raise BreakerSettingsError(f"breaker.max_out_fraction must be in (0, 1], got {self.max_out_fraction}")
        if self.max_out_nodes is not None and self.max_out_nodes < 1:
            raise BreakerSettingsError(f"breaker.max_out_nodes must be at least 1, got {self.max_out_nodes}")
        if self.max_concurrent_drains < 1:
            raise BreakerSettingsError(
                f"breaker.max_concurrent_drains must be at least 1, got {self.max_concurrent_drains}"
            )

    def limit(self, pool_size: int) -> int:
        """How many of a pool's nodes may be out at once."""
        by_share = max(1, math.floor(self.max_out_fraction * pool_size))
        return by_share if self.max_out_nodes is None else min(by_share, self.max_out_nodes)


@dataclass(frozen=True, slots=True)
class PoolStatus:
    """One node pool as the breaker sees it: its nodes, those out, those draining.

    The controller builds one per pool each cycle and, as it quarantines or
    starts draining nodes within the cycle, replaces it with
    :meth:`with_out` / :meth:`with_draining` so the next node is judged on
    the counts the previous one changed.
    """

    pool: str
    nodes: frozenset[str]
    out: frozenset[str] = frozenset()
    draining: frozenset[str] = frozenset()

    def with_out(self, node: str) -> PoolStatus:
        return replace(self, out=self.out | {node})

    def with_draining(self, node: str) -> PoolStatus:
        return replace(self, out=self.out | {node}, draining=self.draining | {node})


@dataclass(frozen=True, slots=True)
class BreakerVerdict:
    """What the breaker allows for one node this cycle; ``reason`` says why not."""

    quarantine_allowed: bool = True
    drain_allowed: bool = True
    reason: str = ""


def is_out(*, unschedulable: bool, ready: bool, remediating: bool) -> bool:
    """Whether a node counts against its pool's limit (for any reason)."""
    return unschedulable or not ready or remediating


def verdict(settings: BreakerSettings, status: PoolStatus, node: str) -> BreakerVerdict:
    """The breaker's verdict for ``node`` of ``status``'s pool.

    Nothing here concerns returning hardware: there is no verdict that
    could stop one.
    """
    reasons = []
    quarantine = True
    if node not in status.out:
        others = len(status.out - {node})
        limit = settings.limit(len(status.nodes | {node}))
        if others + 1 > limit:
            quarantine = False
            reasons.append(
                f"pool {status.pool} has {others} of {len(status.nodes | {node})} nodes out, "
                f"the most it may have out is {limit}"
            )
    drain = node in status.draining or len(status.draining) < settings.max_concurrent_drains
    if not drain:
        reasons.append(
            f"pool {status.pool} already drains {len(status.draining)} nodes "
            f"(at most {settings.max_concurrent_drains} at once)"
        )
    return BreakerVerdict(quarantine, drain, "; ".join(reasons))
