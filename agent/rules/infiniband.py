"""InfiniBand rule: ports down, trained at a lower rate, or flapping.

Which ports must be up: those listed in ``infiniband.expected_ports``, those
seen ACTIVE since the agent started, and those with a fault raised now (so a
port that was down when the agent restarted keeps its restored fault). A port
never up and never expected is an unused port, not a fault.

* not ``ACTIVE``/``LinkUp``, or its netdev not ``UP`` although it is
  administratively up: ``IbPortDown``. A netdev set down on purpose (an
  IPoIB interface left unconfigured because jobs use RDMA only) is no fault:
  flagging it would quarantine every such node;
* rate below the expected rate (configured, else the highest seen on any port
  of the same link layer): ``IbRateDegraded``;
* ``link_downed`` incremented: ``IbLinkDowned``, held for
  ``infiniband.link_downed_hold_s`` because the flap itself is over by the
  time anyone looks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from agent.config import AgentConfig
from agent.model import Entity
from agent.rules.base import Finding, RuleContext
from agent.samples import NodeSample
from gpuwarden.contract import Action, ConditionType, Reason

_UP_STATES = {"UP", "UNKNOWN"}  # UNKNOWN: drivers that do not report operstate


class _DownedHold(NamedTuple):
    """A port whose link went down: raised ``until`` (epoch seconds), ``times`` downs within the hold."""

    until: float
    times: int


class InfinibandRule:
    conditions = frozenset({ConditionType.INFINIBAND_DEGRADED})

    def __init__(self, config: AgentConfig) -> None:
        self._cfg = config.infiniband
        self._expected = set(config.infiniband.expected_ports)
        self._seen_up: set[str] = set()
        self._max_rate: dict[str, float] = {}
        self._downed: dict[str, int] = {}
        self._downed_until: dict[str, _DownedHold] = {}

    def evaluate(self, sample: NodeSample, ctx: RuleContext) -> Iterable[Finding]:
        cond = ConditionType.INFINIBAND_DEGRADED
        t = sample.time.timestamp()
        for p in sample.ib_ports:
            name = f"{p.device}/{p.port}"
            if p.state == "ACTIVE":
                self._seen_up.add(name)
                if p.rate_gbps is not None:
                    self._max_rate[p.link_layer] = max(self._max_rate.get(p.link_layer, 0.0), p.rate_gbps)
        for p in sample.ib_ports:
            name = f"{p.device}/{p.port}"
            entity = Entity.ib(p.device, p.port)
            watched = (
                name in self._seen_up
                or name in self._expected
                or any(k.entity == entity.key for k in ctx.active if k.condition == cond.value)
            )
            netdev_down = (
                p.netdev_oper_state is not None
                and p.netdev_oper_state.upper() not in _UP_STATES
                and p.netdev_admin_up is not False
            )
            port_down = p.state != "ACTIVE" or p.phys_state != "LinkUp"
            if watched and (port_down or netdev_down):
                what = [f"state {p.state}/{p.phys_state}"]
                if p.netdev:
                    what.append(f"netdev {p.netdev} {p.netdev_oper_state or 'unknown'}")
                yield Finding(
                    cond,
                    Reason.IB_PORT_DOWN,
                    f"{entity.describe()} is down ({', '.join(what)}); recommended action {Action.REPLACE}",
                    Action.REPLACE,
                    entity,
                )
            expected = self._cfg.expected_rate_gbps or self._max_rate.get(p.link_layer)
            if p.state == "ACTIVE" and p.rate_gbps is not None and expected and p.rate_gbps < expected:
                yield Finding(
                    cond,
                    Reason.IB_RATE_DEGRADED,
                    f"{entity.describe()}: rate {p.rate_gbps:g} Gb/s, expected {expected:g} Gb/s; "
                    f"recommended action {Action.REPLACE}",
                    Action.REPLACE,
                    entity,
                )
            downed = p.counters.link_downed
            if downed is not None:
                before = self._downed.get(name)
                self._downed[name] = downed
                if before is not None and downed > before:
                    held = self._downed_until.get(name, _DownedHold(0.0, 0)).times
                    self._downed_until[name] = _DownedHold(t + self._cfg.link_downed_hold_s, held + downed - before)
            until = self._downed_until.get(name)
            if until is not None:
                if t < until.until:
                    yield Finding(
                        cond,
                        Reason.IB_LINK_DOWNED,
                        f"{entity.describe()}: link went down {until.times} time(s) recently "
                        f"(link_downed {downed}); recommended action {Action.RESTART_APP}",
                        Action.RESTART_APP,
                        entity,
                    )
                else:
                    del self._downed_until[name]
