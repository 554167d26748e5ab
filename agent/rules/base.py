"""What every health rule shares: findings, the poll context, counter rates.

A rule reads one :class:`~agent.samples.NodeSample` and says what it sees
right now as :class:`Finding` objects. It does not decide how long a fault
lives: latching, debouncing and since-times belong to the engine
(:mod:`agent.rules.engine`), in one place, so every condition flaps (or
rather, does not) the same way.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from agent.config import AgentConfig
from agent.contract import Action, ConditionType
from agent.model import Entity, HealthEvent
from agent.samples import GpuSample, NodeSample


@dataclass(frozen=True, slots=True)
class Finding:
    """A fault signal present in this poll.

    ``latched`` findings stay raised once raised, until cleared explicitly.
    ``since`` is when the signal began when the rule knows better than "now"
    (an XID's kernel time). ``immediate`` skips the raise debounce (events
    such as XIDs happen once; there is nothing to debounce).
    """

    condition: ConditionType
    reason: str
    message: str
    action: Action
    entity: Entity
    latched: bool = False
    since: datetime | None = None
    immediate: bool = False

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.condition.value, self.reason, self.entity.key)


@dataclass(slots=True)
class RuleContext:
    """What a rule may consult besides the sample.

    ``gpus_by_bus`` / ``gpus_by_uuid`` include GPUs seen in earlier polls, so
    an event about a GPU that has since fallen off the bus still names it.
    ``active`` holds the keys of faults raised now (including ones restored
    after a restart): rules use it for hysteresis on rates and to keep
    watching an entity whose fault is up. ``cleared_at`` holds when repair
    last cleared an entity, so a kernel-log XID from before the repair,
    replayed by a restarted agent, does not raise the fault again.
    """

    config: AgentConfig
    now: datetime
    gpus_by_bus: dict[str, GpuSample]
    gpus_by_uuid: dict[str, GpuSample]
    active: set[tuple[str, str, str]]
    # entity key -> when repair last cleared it: older events are history.
    cleared_at: dict[str, datetime] = field(default_factory=dict)
    events: list[HealthEvent] = field(default_factory=list)

    def gpu_entity(self, gpu: GpuSample) -> Entity:
        return Entity.gpu(gpu.index, gpu.uuid or None, gpu.pci_bus_id or None)

    def is_active(self, condition: ConditionType, reason: str, entity: Entity) -> bool:
        return (condition.value, reason, entity.key) in self.active


class Rule(Protocol):
    """One health rule: sample in, findings out (events via the context).

    ``conditions`` are the condition types it judges: when the rule or its
    source fails in a poll, the engine holds those faults as they were.
    """

    conditions: frozenset[ConditionType]

    def evaluate(self, sample: NodeSample, ctx: RuleContext) -> Iterable[Finding]: ...


class RateWindow:
    """Growth rate of one cumulative counter over a sliding time window.

    Keeps (time, value) points spanning the window. Points closer together
    than a 32nd of the window are merged (the newest replaces the last), so
    memory stays bounded whatever the poll rate: event-driven polls during an
    ECC storm, or a clock that stalls, must not grow the history. A counter
    that goes down (driver reload, GPU reset) or a clock that steps back
    restarts the history instead of producing a negative rate.
    """

    __slots__ = ("_points", "_spacing", "window_s")

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._spacing = window_s / 32
        self._points: deque[tuple[float, int]] = deque()

    def add(self, t: float, value: int) -> float | None:
        """Record ``value`` at ``t`` (seconds); the rate per minute, if known.

        The rate is over the window's oldest and newest points; ``None``
        until two points at different times exist.
        """
        pts = self._points
        if pts and (value < pts[-1][1] or t < pts[-1][0]):
            pts.clear()
        if len(pts) >= 2 and t - pts[-2][0] < self._spacing:
            pts[-1] = (t, value)
        else:
            pts.append((t, value))
        while len(pts) > 2 and t - pts[1][0] >= self.window_s:
            pts.popleft()
        t0, v0 = pts[0]
        if t <= t0:
            return None
        return (value - v0) * 60.0 / (t - t0)

    def __len__(self) -> int:
        return len(self._points)


def over_threshold(rate: float | None, threshold: float, active: bool, clear_ratio: float) -> bool:
    """Two thresholds so a rate hovering at the limit does not flap: raise
    above ``threshold``, and once raised stay until below
    ``threshold * clear_ratio``."""
    if rate is None:
        return active
    return rate > (threshold * clear_ratio if active else threshold)
