"""NVLink rule: links that went down, and error counters growing too fast.

A link counts as expected up when it was seen active since the agent started,
or when the same link is active on another GPU of the same model (NVSwitch
systems wire every GPU alike; this also covers an agent restarted after the
link dropped). An expected link that is not active is ``NvlinkDown``.

The data-link error counters (replay, recovery, CRC flit, CRC data) summed
per link are turned into their increase over ``nvlink.window_s``, per
minute (see :class:`~agent.rules.base.RateWindow`); above
``nvlink.error_rate_per_min`` is ``NvlinkErrorRate``, cleared only below the
lower hysteresis threshold over a whole window.

Messages name links and thresholds, never a live value: a message is a
condition's message, and one that changed every poll would cost a Node patch
every poll.
"""

from __future__ import annotations

from collections.abc import Iterable

from agent.config import AgentConfig
from agent.rules.base import Finding, RateWindow, RuleContext, over_threshold
from agent.samples import NodeSample
from gpuwarden.contract import Action, ConditionType, Reason


class NvlinkRule:
    conditions = frozenset({ConditionType.GPU_NVLINK_DEGRADED})

    def __init__(self, config: AgentConfig) -> None:
        self._cfg = config.nvlink
        self._clear_ratio = config.hysteresis.clear_ratio
        self._seen_up: set[tuple[str, int]] = set()
        self._rates: dict[tuple[str, int], RateWindow] = {}

    def evaluate(self, sample: NodeSample, ctx: RuleContext) -> Iterable[Finding]:
        cond = ConditionType.GPU_NVLINK_DEGRADED
        t = sample.time.timestamp()
        active_by_model: dict[str, set[int]] = {}
        for gpu in sample.gpus:
            if gpu.lost:
                continue
            for link in gpu.nvlinks:
                if link.active:
                    self._seen_up.add((gpu.uuid, link.link))
                    active_by_model.setdefault(gpu.name, set()).add(link.link)
        for gpu in sample.gpus:
            if gpu.lost or not gpu.nvlinks:
                continue
            entity = ctx.gpu_entity(gpu)
            down = [
                link.link
                for link in gpu.nvlinks
                if not link.active
                and ((gpu.uuid, link.link) in self._seen_up or link.link in active_by_model.get(gpu.name, ()))
            ]
            if down:
                yield Finding(
                    cond,
                    Reason.NVLINK_DOWN,
                    f"{entity.describe()}: NVLink {', '.join(map(str, down))} down "
                    f"({len(gpu.nvlinks) - len(down)} of {len(gpu.nvlinks)} active); "
                    f"recommended action {Action.RESET_GPU}",
                    Action.RESET_GPU,
                    entity,
                )
            fast: list[int] = []
            held: list[int] = []  # a raised fault kept while a link's history is too short to judge
            active = ctx.is_active(cond, Reason.NVLINK_ERROR_RATE, entity)
            threshold = self._cfg.error_rate_per_min
            for link in gpu.nvlinks:
                key = (gpu.uuid, link.link)
                window = self._rates.get(key)
                if window is None:
                    window = self._rates[key] = RateWindow(self._cfg.window_s)
                rate = window.add(t, link.error_total)
                if not over_threshold(rate, threshold, active, self._clear_ratio, window.full):
                    continue
                if rate is not None and (window.full or rate > threshold):
                    fast.append(link.link)
                else:
                    held.append(link.link)
            # Name the links measured fast; only when none is (a restored fault
            # being re-measured) the links it is held on.
            fast = fast or held
            if fast:
                # The links, not their current rates: the message becomes the
                # condition's, and a number that moves every poll would patch
                # the Node every poll. The rates are in the metrics.
                yield Finding(
                    cond,
                    Reason.NVLINK_ERROR_RATE,
                    f"{entity.describe()}: NVLink errors growing faster than "
                    f"{self._cfg.error_rate_per_min:g}/min on link {', '.join(map(str, fast))}; "
                    f"recommended action {Action.RESET_GPU}",
                    Action.RESET_GPU,
                    entity,
                )
