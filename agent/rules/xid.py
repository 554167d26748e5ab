"""XID rule: GPU events from NVML and the kernel log, judged by the catalogue.

Hardware XIDs raise ``GpuXidError`` (reason ``Xid<N>``), latched; every XID
occurrence also becomes an Event, so application XIDs are visible without
touching the node's conditions; a report people were already told about (a
twin completing an earlier one, or a kernel-log record the agent's previous
run read) makes no second Event. An XID missing from the catalogue gives an
Event (and the metric the publisher derives from the sample's XID counts)
unless the config says unknown XIDs raise a condition. A "fallen off the bus"
line with no XID number marks the GPU lost (``GpuMissing``/``GpuLost``).

XID 154 ("GPU recovery action changed") carries its own action: the driver
names the recovery it wants (none, GPU reset, node reboot, drain
peer-to-peer traffic, ...), and that is the recommended action; a change to
"none" is an Event, not a fault. The catalogue's action stands in only when
the report does not say which.
"""

from __future__ import annotations

from collections.abc import Iterable

from agent.config import AgentConfig
from agent.model import Entity, EntityKind, EventType, HealthEvent
from agent.rules.base import Finding, RuleContext
from agent.samples import XID_RECOVERY_ACTION, GpuEvent, GpuEventKind, NodeSample
from gpuwarden.contract import Action, ConditionType, Reason, xid_reason
from gpuwarden.xid_catalogue import XidInfo, XidKind, lookup, recovery_action


class XidRule:
    conditions = frozenset({ConditionType.GPU_XID_ERROR, ConditionType.GPU_MISSING})

    def __init__(self, config: AgentConfig) -> None:
        self._overrides = {
            xid: XidInfo(xid, XidKind(ov.kind), Action(ov.action), ov.meaning or f"XID {xid} (operator override)")
            for xid, ov in config.xid.overrides.items()
        }
        self._unknown_condition = config.xid.unknown == "condition"
        self._unknown_action = Action(config.xid.unknown_action)

    def _entity(self, ev: GpuEvent, ctx: RuleContext) -> Entity:
        gpu = None
        if ev.uuid:
            gpu = ctx.gpus_by_uuid.get(ev.uuid)
        if gpu is None and ev.pci_bus_id:
            gpu = ctx.gpus_by_bus.get(ev.pci_bus_id)
        if gpu is not None:
            return ctx.gpu_entity(gpu)
        # A GPU NVML never showed us (NVML down, or lost before we started).
        return Entity(kind=EntityKind.GPU, uuid=ev.uuid, pci_bus_id=ev.pci_bus_id)

    def evaluate(self, sample: NodeSample, ctx: RuleContext) -> Iterable[Finding]:
        for ev in sample.events:
            entity = self._entity(ev, ctx)
            cleared = ctx.cleared_at.get(entity.key)
            if cleared is not None and ev.time <= cleared:
                continue  # from before the last repair (a replayed kernel log)
            if ev.kind is GpuEventKind.FALLEN_OFF_BUS:
                yield Finding(
                    ConditionType.GPU_MISSING,
                    Reason.GPU_LOST,
                    f"{entity.describe()} has fallen off the bus (kernel log); recommended action {Action.REBOOT}",
                    Action.REBOOT,
                    entity,
                    latched=True,
                    since=ev.time,
                    immediate=True,
                    history=ev.history,
                )
                continue
            if ev.kind is not GpuEventKind.XID or ev.xid is None:
                continue
            info = lookup(ev.xid, self._overrides)
            if info is not None and info.kind is XidKind.IGNORE:
                continue
            reason = xid_reason(ev.xid)
            detail = f": {ev.message}" if ev.message else ""
            if info is None:
                text = f"{entity.describe()}: XID {ev.xid}, not in the catalogue{detail} (seen via {ev.source})"
                if not ev.announced:
                    ctx.events.append(HealthEvent(EventType.WARNING, reason, text, entity, ev.time))
                if self._unknown_condition:
                    yield Finding(
                        ConditionType.GPU_XID_ERROR,
                        reason,
                        f"{text}; recommended action {self._unknown_action}",
                        self._unknown_action,
                        entity,
                        latched=True,
                        since=ev.time,
                        immediate=True,
                        history=ev.history,
                    )
                continue
            action: Action | None = info.action
            if ev.xid == XID_RECOVERY_ACTION and ev.xid not in self._overrides:
                # The driver says which recovery it wants; the catalogue's
                # action only stands in when the report does not say.
                action, said = recovery_action(ev.recovery_action, info.action)
                detail = f"{detail}; {said}"
            what = f"{entity.describe()}: XID {ev.xid} ({info.kind}), {info.meaning}{detail}"
            # No recovery to do (XID 154 back to "none", or an informational
            # XID such as 45 or 63): news, not a warning that sends people
            # looking for a problem.
            if action is None or action is Action.NONE:
                if not ev.announced:
                    ctx.events.append(
                        HealthEvent(EventType.NORMAL, reason, f"{what}; no recovery needed", entity, ev.time)
                    )
                continue
            text = f"{what}; recommended action {action}"
            if not ev.announced:  # the first report of this occurrence made the Event
                ctx.events.append(HealthEvent(EventType.WARNING, reason, text, entity, ev.time))
            if info.kind is XidKind.HARDWARE:
                yield Finding(
                    ConditionType.GPU_XID_ERROR,
                    reason,
                    text,
                    action,
                    entity,
                    latched=True,
                    since=ev.time,
                    immediate=True,
                    history=ev.history,
                )
