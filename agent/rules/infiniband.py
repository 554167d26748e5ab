"""InfiniBand rule: ports down, missing, trained at a lower rate, or flapping.

On a GPU node every fabric port is there to carry traffic, so every port the
agent finds (InfiniBand or RoCE) must be ACTIVE/LinkUp, from the first read
on: a port already down when the agent starts is a fault, not an unused port.
Ports down on purpose (a management port) are listed in
``infiniband.ignore_ports`` and never judged at all. Ports listed in
``infiniband.expected_ports`` must be there even if the agent never saw them.

* not ``ACTIVE``/``LinkUp``, or its netdev not ``UP`` although it is
  administratively up: ``IbPortDown``. A netdev set down on purpose (an
  IPoIB interface left unconfigured because jobs use RDMA only) is no fault:
  flagging it would quarantine every such node;
* gone from sysfs after being seen, listed in ``expected_ports`` but absent,
  or absent while its fault is raised (restored after an agent restart):
  ``IbPortDown``, the message saying the port is missing. An HCA that falls
  off the bus or whose driver failed takes its ports with it, and a port that
  is not there carries no traffic either;
* rate below the expected rate: ``IbRateDegraded``. Expected is the
  configured ``expected_rate_gbps``, else the highest rate this same port has
  run at since the agent started. Never another port's rate: ports of one
  node may be cabled at different speeds on purpose, and one bad reading
  (sysfs once said ``inf Gb/sec``) would set every other port's expectation
  for the life of the process. Non-finite rates are ignored altogether. So
  without a configured rate, a port that trained low before the agent
  started is not flagged: configure the fabric's rate to catch that;
* ``link_downed`` incremented: ``IbLinkDowned``, held for
  ``infiniband.link_downed_hold_s`` because the flap itself is over by the
  time anyone looks. The hold outlives a restart: a restored ``IbLinkDowned``
  fault is held until its since-time plus ``link_downed_hold_s``, not
  cleared a few polls after the agent comes back.

While the InfiniBand source could not be read at all (``ib_source_error``)
the rule judges nothing: the engine holds what was raised.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from agent.config import AgentConfig
from agent.model import Entity, EntityKind, Fault
from agent.rules.base import Finding, RuleContext
from agent.samples import IbPortSample, NodeSample
from gpuwarden.contract import Action, ConditionType, Reason

_UP_STATES = {"UP", "UNKNOWN"}  # UNKNOWN: drivers that do not report operstate
_DOWN_TIMES = re.compile(r"link went down (\d+) time")


class _DownedHold(NamedTuple):
    """A port whose link went down: raised ``until`` (epoch seconds), ``times`` downs within the hold."""

    until: float
    times: int


def _port_of(entity_key: str) -> tuple[str, int] | None:
    """``"ib/mlx5_1/2"`` -> ``("mlx5_1", 2)``; ``None`` for any other key."""
    kind, _, rest = entity_key.partition("/")
    dev, sep, num = rest.rpartition("/")
    if kind != "ib" or not sep or not dev or not num.isdigit():
        return None
    return dev, int(num)


class InfinibandRule:
    conditions = frozenset({ConditionType.INFINIBAND_DEGRADED})

    def __init__(self, config: AgentConfig) -> None:
        self._cfg = config.infiniband
        self._expected = set(config.infiniband.expected_ports)
        self._ignored = set(config.infiniband.ignore_ports)
        # Every judged port present in any read since start: one that goes is missing.
        self._seen: set[str] = set()
        # Per port, the highest finite rate it has been ACTIVE at.
        self._max_rate: dict[str, float] = {}
        self._downed: dict[str, int] = {}
        self._downed_until: dict[str, _DownedHold] = {}

    def restore(self, faults: Iterable[Fault]) -> None:
        """Seed the link_downed hold of restored ``IbLinkDowned`` faults.

        The hold lives only in this rule; without it, a restarted agent would
        see an unchanged counter and clear the fault a few polls later
        instead of ``link_downed_hold_s`` after the flap (the fault's since).
        """
        for fault in faults:
            e = fault.entity
            if (
                fault.condition is not ConditionType.INFINIBAND_DEGRADED
                or fault.reason != Reason.IB_LINK_DOWNED
                or e.kind is not EntityKind.IB_PORT
                or e.ib_device is None
                or e.ib_port is None
            ):
                continue
            name = f"{e.ib_device}/{e.ib_port}"
            until = fault.since.timestamp() + self._cfg.link_downed_hold_s
            times = _DOWN_TIMES.search(fault.message)
            held = self._downed_until.get(name)
            if held is None or held.until < until:
                self._downed_until[name] = _DownedHold(until, int(times.group(1)) if times else 1)

    def evaluate(self, sample: NodeSample, ctx: RuleContext) -> Iterable[Finding]:
        if sample.ib_source_error is not None:
            return
        cond = ConditionType.INFINIBAND_DEGRADED
        present: dict[str, IbPortSample] = {}
        for p in sample.ib_ports:
            name = f"{p.device}/{p.port}"
            if name not in self._ignored:
                present[name] = p
        self._seen |= present.keys()
        for name, p in present.items():
            yield from self._judge(name, p, sample.time.timestamp(), cond)

        raised: set[str] = set()
        for k in ctx.active:
            port = _port_of(k.entity) if k.condition == cond.value else None
            if port is not None:
                raised.add(f"{port[0]}/{port[1]}")
        for name in sorted((self._seen | self._expected | raised) - present.keys() - self._ignored):
            dev, _, num = name.rpartition("/")
            entity = Entity.ib(dev, int(num))
            if name in self._seen:
                why = "present in an earlier read"
            elif name in self._expected:
                why = "listed in infiniband.expected_ports"
            else:
                why = "its fault was raised before the agent restarted"
            yield Finding(
                cond,
                Reason.IB_PORT_MISSING,
                f"{entity.describe()} is missing from sysfs ({why}); recommended action {Action.REPLACE}",
                Action.REPLACE,
                entity,
            )

    def _judge(self, name: str, p: IbPortSample, t: float, cond: ConditionType) -> Iterator[Finding]:
        entity = Entity.ib(p.device, p.port)
        rate = p.rate_gbps if p.rate_gbps is not None and math.isfinite(p.rate_gbps) else None
        if p.state == "ACTIVE" and rate is not None:
            self._max_rate[name] = max(self._max_rate.get(name, 0.0), rate)
        netdev_down = (
            p.netdev_oper_state is not None
            and p.netdev_oper_state.upper() not in _UP_STATES
            and p.netdev_admin_up is not False
        )
        port_down = p.state != "ACTIVE" or p.phys_state != "LinkUp"
        if port_down or netdev_down:
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
        expected = self._cfg.expected_rate_gbps or self._max_rate.get(name)
        if p.state == "ACTIVE" and rate is not None and expected and rate < expected:
            yield Finding(
                cond,
                Reason.IB_RATE_DEGRADED,
                f"{entity.describe()}: rate {rate:g} Gb/s, expected {expected:g} Gb/s; "
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
