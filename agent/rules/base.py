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
from agent.model import Entity, FaultKey, HealthEvent
from agent.samples import GpuSample, NodeSample
from gpuwarden.contract import Action, ConditionType


@dataclass(frozen=True, slots=True)
class Finding:
    """A fault signal present in this poll.

    ``latched`` findings stay raised once raised, until cleared explicitly.
    ``since`` is when the signal began when the rule knows better than "now"
    (an XID's kernel time). ``immediate`` skips the raise debounce (events
    such as XIDs happen once; there is nothing to debounce). ``history``
    findings come from kernel-log records a previous run of the agent already
    judged: they raise a fault the rules do not hold, but never rewrite one
    they hold (restored from the Node, it says what was published then).
    """

    condition: ConditionType
    reason: str
    message: str
    action: Action
    entity: Entity
    latched: bool = False
    since: datetime | None = None
    immediate: bool = False
    history: bool = False

    @property
    def key(self) -> FaultKey:
        return FaultKey(self.condition.value, self.reason, self.entity.key)


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
    active: set[FaultKey]
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
    """Growth rate of one cumulative counter: its increase over a sliding window.

    The rate is the increase over the last ``window_s`` seconds, per minute:
    ``(newest - oldest) * 60 / max(span, window_s)``. Dividing by the window,
    not by the time the history happens to span, is what keeps a burst from
    being extrapolated: 11 NVLink replays in the first 10 s after the agent
    started (or after the counter reset) are 11 errors in this window, 2.2/min
    for a 5-minute window, not 66/min. A threshold of N per minute therefore
    means "more than N * window_s / 60 errors within one window", as in
    Prometheus' ``increase()``; a sustained rate reads true once the window
    has filled. Until then the rate is a lower bound, which :attr:`full` says,
    so that a raised fault is not cleared on a history too short to show the
    errors have stopped (see :func:`over_threshold`).

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

        The rate is the increase from the window's oldest point to the newest,
        over the window's length or the span between them, whichever is
        longer; ``None`` until two points at different times exist.
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
        return (value - v0) * 60.0 / max(t - t0, self.window_s)

    @property
    def full(self) -> bool:
        """True once the history spans a whole window (the rate is then exact)."""
        pts = self._points
        return len(pts) >= 2 and pts[-1][0] - pts[0][0] >= self.window_s

    def __len__(self) -> int:
        return len(self._points)


def over_threshold(rate: float | None, threshold: float, active: bool, clear_ratio: float, full: bool = True) -> bool:
    """Two thresholds so a rate hovering at the limit does not flap: raise
    above ``threshold``, and once raised stay until below
    ``threshold * clear_ratio``.

    An unknown rate keeps the state as it is, and so does a history shorter
    than the window (``full`` False: right after the agent started or the
    counter reset) for a raised fault: errors seen over part of a window only
    bound the rate from below, so they can raise a fault but never clear one.
    """
    if rate is None:
        return active
    if active:
        return not full or rate > threshold * clear_ratio
    return rate > threshold
