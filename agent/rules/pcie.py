"""PCIe rule: link trained below the device's maximum, replays growing.

Width below maximum is ``PcieWidthDegraded`` at once: GPUs do not narrow
their link to save power, so a x8 where x16 is possible is a seating or
signal problem. Generation is different: GPUs drop to a lower generation
when idle, so a lower generation counts only while the GPU is busy
(utilisation at least ``pcie.gen_load_pct``), or, when
``pcie.gen_sustained_s`` is set, when it has lasted that long whatever the
load. The replay counter's increase over ``pcie.window_s``, per minute, above
``pcie.replay_rate_per_min`` is ``PcieReplayRate``, with the two-threshold
hysteresis of every rate rule. Messages carry no live value (utilisation,
duration, rate): they become the condition's message, which must not change
every poll.
"""

from __future__ import annotations

from collections.abc import Iterable

from agent.config import AgentConfig
from agent.rules.base import Finding, RateWindow, RuleContext, over_threshold
from agent.samples import NodeSample
from gpuwarden.contract import Action, ConditionType, Reason


class PcieRule:
    conditions = frozenset({ConditionType.GPU_PCIE_DEGRADED})

    def __init__(self, config: AgentConfig) -> None:
        self._cfg = config.pcie
        self._clear_ratio = config.hysteresis.clear_ratio
        self._rates: dict[str, RateWindow] = {}
        self._gen_low_since: dict[str, float] = {}

    def evaluate(self, sample: NodeSample, ctx: RuleContext) -> Iterable[Finding]:
        cond = ConditionType.GPU_PCIE_DEGRADED
        t = sample.time.timestamp()
        for gpu in sample.gpus:
            pcie = gpu.pcie
            if gpu.lost or pcie is None:
                continue
            entity = ctx.gpu_entity(gpu)
            if pcie.current_width is not None and pcie.max_width is not None and pcie.current_width < pcie.max_width:
                yield Finding(
                    cond,
                    Reason.PCIE_WIDTH_DEGRADED,
                    f"{entity.describe()}: PCIe link x{pcie.current_width}, device maximum x{pcie.max_width}; "
                    f"recommended action {Action.REBOOT}",
                    Action.REBOOT,
                    entity,
                )
            if pcie.current_gen is not None and pcie.max_gen is not None and pcie.current_gen < pcie.max_gen:
                low_since = self._gen_low_since.setdefault(gpu.uuid, t)
                busy = gpu.utilization_gpu_pct is not None and gpu.utilization_gpu_pct >= self._cfg.gen_load_pct
                sustained = self._cfg.gen_sustained_s > 0 and t - low_since >= self._cfg.gen_sustained_s
                if busy or sustained:
                    # Fixed wording, sustained first (it stays true once true):
                    # a live utilisation or duration here would change the
                    # condition's message, and patch the Node, every poll.
                    why = (
                        f"for more than {self._cfg.gen_sustained_s:g}s"
                        if sustained
                        else f"under load (utilisation at least {self._cfg.gen_load_pct}%)"
                    )
                    yield Finding(
                        cond,
                        Reason.PCIE_GEN_DEGRADED,
                        f"{entity.describe()}: PCIe Gen{pcie.current_gen} {why}, device maximum "
                        f"Gen{pcie.max_gen}; recommended action {Action.REBOOT}",
                        Action.REBOOT,
                        entity,
                    )
            else:
                self._gen_low_since.pop(gpu.uuid, None)
            if pcie.replay_counter is not None:
                window = self._rates.get(gpu.uuid)
                if window is None:
                    window = self._rates[gpu.uuid] = RateWindow(self._cfg.window_s)
                rate = window.add(t, pcie.replay_counter)
                active = ctx.is_active(cond, Reason.PCIE_REPLAY_RATE, entity)
                if over_threshold(rate, self._cfg.replay_rate_per_min, active, self._clear_ratio, window.full):
                    yield Finding(
                        cond,
                        Reason.PCIE_REPLAY_RATE,
                        f"{entity.describe()}: PCIe replays growing faster than "
                        f"{self._cfg.replay_rate_per_min:g}/min; recommended action {Action.REBOOT}",
                        Action.REBOOT,
                        entity,
                    )
