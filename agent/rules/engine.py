"""The rules engine: runs every rule on a sample and keeps faults' lifetimes.

Rules say what they see now; this module decides what is raised:

* **Latching.** Fatal faults (hardware XIDs, row remap pending/failure,
  retired pages, a lost GPU) stay raised once raised, until :meth:`clear` is
  called for their entity by repair and re-validation. A counter that stops
  growing, or a kernel-log line that scrolled away, does not clear them.
* **Hysteresis.** Other faults are raised after ``hysteresis.raise_polls``
  consecutive polls with the signal and cleared after
  ``hysteresis.clear_polls`` consecutive scheduled polls without it (a poll
  a GPU event woke early does not count, so clearing takes that many poll
  intervals however many XIDs arrive meanwhile); rate rules add a
  lower clearing threshold on top. So a signal that comes and goes every poll
  raises once and stays raised instead of flapping.
* **Since-times** are kept from the first raise, across polls and, through
  :meth:`restore`, across agent restarts.

The engine is not thread-safe by itself; the monitor serialises calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from agent.config import AgentConfig
from agent.model import (
    Entity,
    EntityKind,
    EventType,
    Fault,
    FaultKey,
    GpuStatus,
    HealthEvent,
    HealthReport,
    IbPortStatus,
)
from agent.rules.base import Finding, Rule, RuleContext
from agent.rules.gpu_count import GpuCountRule
from agent.rules.infiniband import InfinibandRule
from agent.rules.memory import MemoryRule
from agent.rules.nvlink import NvlinkRule
from agent.rules.pcie import PcieRule
from agent.rules.storage import StorageRule
from agent.rules.xid import XidRule
from agent.samples import GpuSample, NodeSample, normalize_bus_id
from gpuwarden.contract import HEALTHY_REASONS, ConditionType, Reason
from gpuwarden.logconfig import get_logger

log = get_logger(__name__)

# Reasons that latch whatever the fault object restored from a Node says:
# a restarted agent reads conditions back without knowing how they were made.
LATCHED_REASONS: frozenset[str] = frozenset(
    {
        Reason.ROW_REMAP_PENDING,
        Reason.ROW_REMAP_FAILURE,
        Reason.RETIRED_PAGES_PENDING,
        Reason.RETIRED_PAGES_LIMIT,
        Reason.GPU_LOST,
    }
)


# What NVML's samples (not its events) judge: unknown while NVML is down.
GPU_SOURCE_CONDITIONS: frozenset[ConditionType] = frozenset(
    {
        ConditionType.GPU_MEMORY_DEGRADED,
        ConditionType.GPU_NVLINK_DEGRADED,
        ConditionType.GPU_PCIE_DEGRADED,
        ConditionType.GPU_MISSING,
    }
)


def _earliest(a: datetime | None, b: datetime | None) -> datetime | None:
    if a is None or b is None:
        return a or b
    return min(a, b)


def _latest(a: datetime | None, b: datetime | None) -> datetime | None:
    if a is None or b is None:
        return a or b
    return max(a, b)


def is_latched(fault: Fault) -> bool:
    return fault.latched or fault.condition is ConditionType.GPU_XID_ERROR or fault.reason in LATCHED_REASONS


@dataclass(slots=True)
class _Active:
    fault: Fault
    absent_polls: int = 0

    def absorb(self, other: Fault) -> None:
        """Take in another record of this fault (one read back from the Node,
        or one keyed by the GPU's bus id): it began at the earlier of the two
        times, and is latched if either is."""
        self.fault = replace(
            self.fault,
            since=min(self.fault.since, other.since),
            latched=self.fault.latched or other.latched,
        )


class HealthRules:
    """Every rule, plus the state that makes faults latch and not flap."""

    def __init__(self, config: AgentConfig, node: str, rules: tuple[Rule, ...] | None = None) -> None:
        """``rules`` defaults to every shipped rule built from ``config``."""
        self.config = config
        self.node = node
        self._raise_polls = config.hysteresis.raise_polls
        self._clear_polls = config.hysteresis.clear_polls
        self._rules: tuple[Rule, ...] = rules or (
            XidRule(config),
            MemoryRule(config),
            NvlinkRule(config),
            PcieRule(config),
            InfinibandRule(config),
            GpuCountRule(config),
            StorageRule(config),
        )
        self._active: dict[FaultKey, _Active] = {}
        self._pending: dict[FaultKey, int] = {}
        self._by_bus: dict[str, GpuSample] = {}
        self._by_uuid: dict[str, GpuSample] = {}
        self._pending_events: list[HealthEvent] = []
        self._cleared_at: dict[str, datetime] = {}

    # ------------------------------------------------------------ state API

    @property
    def active_faults(self) -> tuple[Fault, ...]:
        return tuple(a.fault for a in self._active.values())

    def restore(self, faults: Iterable[Fault], cleared_at: Mapping[str, datetime] | None = None) -> int:
        """Seed faults read back after a restart; returns how many were new.

        Latched ones (by flag, condition or reason) stay until :meth:`clear`;
        others are treated as raised and clear with the usual hysteresis if
        their signal is gone. A fault the rules already hold keeps the earlier
        of the two since-times. ``cleared_at`` (entity key -> time of its last
        repair, as persisted by the repair flow) keeps kernel-log events from
        before a repair from raising their faults again.
        """
        for key, when in (cleared_at or {}).items():
            if key not in self._cleared_at or self._cleared_at[key] < when:
                self._cleared_at[key] = when
        faults = list(faults)
        added = 0
        for fault in faults:
            held = self._active.get(fault.key)
            if held is not None:
                # Judged again before the Node could be read (the API server
                # was away at start): the fault began when the Node says.
                held.absorb(replace(fault, latched=is_latched(fault)))
                continue
            self._active[fault.key] = _Active(replace(fault, latched=is_latched(fault)))
            added += 1
        # Rules that keep their own per-fault state (the IB link_downed hold)
        # rebuild it from what was restored, or a restart would end it early.
        for rule in self._rules:
            restore = getattr(rule, "restore", None)
            if callable(restore):
                restore(faults)
        if added:
            log.info("faults_restored", count=added)
        return added

    def clear(self, entity_key: str, when: datetime | None = None) -> tuple[Fault, ...]:
        """Drop every fault on ``entity_key`` (repair and re-validation done).

        A signal that is still present raises the fault again at the next
        poll, which is what re-validation wants to see. GPU events up to
        ``when`` (default now) are history from then on. A GPU may be named
        by either of its keys, ``gpu/<uuid>`` or ``gpu/<pci bus id>`` (see
        :meth:`_rekey_by_bus`): both clear the same GPU.
        """
        keys = self._gpu_aliases(entity_key)
        cleared = when or datetime.now(UTC)
        for key in keys:
            self._cleared_at[key] = cleared
        gone = tuple([a.fault for k, a in self._active.items() if k.entity in keys])
        for fault in gone:
            del self._active[fault.key]
            self._pending_events.append(self._cleared_event(fault, datetime.now(UTC), why="cleared after repair"))
        for k in [k for k in self._pending if k.entity in keys]:
            del self._pending[k]
        if gone:
            log.info("faults_cleared", entity=entity_key, count=len(gone))
        return gone

    def _gpu_aliases(self, entity_key: str) -> set[str]:
        """``entity_key`` and, for a GPU, its other key: by UUID and by PCI bus
        id, as far as any poll since start has mapped the two."""
        keys = {entity_key}
        kind, sep, ident = entity_key.partition("/")
        if kind != EntityKind.GPU.value or not sep or not ident:
            return keys
        gpu = self._by_uuid.get(ident) or self._by_bus.get(normalize_bus_id(ident))
        if gpu is None:
            if not ident.startswith("GPU-"):  # a bus id in another spelling
                keys.add(Entity(EntityKind.GPU, pci_bus_id=normalize_bus_id(ident)).key)
            return keys
        if gpu.uuid:
            keys.add(Entity(EntityKind.GPU, uuid=gpu.uuid).key)
        if gpu.pci_bus_id:
            keys.add(Entity(EntityKind.GPU, pci_bus_id=gpu.pci_bus_id).key)
        return keys

    # ------------------------------------------------------------ evaluate

    def _remember_gpus(self, sample: NodeSample) -> None:
        for gpu in sample.gpus:
            if gpu.lost and gpu.uuid in self._by_uuid:
                continue
            if gpu.uuid:
                self._by_uuid[gpu.uuid] = gpu
            if gpu.pci_bus_id:
                self._by_bus[gpu.pci_bus_id] = gpu

    def _rekey_by_bus(self) -> None:
        """Move faults on a GPU known only by its PCI bus id onto its UUID.

        A kernel-log XID or "fallen off the bus" seen while NVML is down, or
        before the first poll named the GPUs, can only be keyed by bus id; the
        same GPU's later faults are keyed by UUID. Left split, the bus-keyed
        fault would never attach to the GPU's status (the GPU would show
        healthy and keep its memory in capacity) and a clear by UUID would
        miss it. Once the inventory maps the bus id, the fault moves (merged
        with the UUID-keyed one if there is one, keeping the earlier since);
        one from before the GPU's last repair is history and is dropped, which
        the XID rule could not tell while it knew the bus id only.
        """
        moves = {Entity(EntityKind.GPU, pci_bus_id=bus).key: g for bus, g in self._by_bus.items() if g.uuid}
        for key in [k for k in self._active if k.entity in moves]:
            old = self._active.pop(key).fault
            gpu = moves[key.entity]
            entity = Entity.gpu(gpu.index, gpu.uuid, gpu.pci_bus_id)
            fault = replace(old, entity=entity, message=old.message.replace(old.entity.describe(), entity.describe()))
            cleared = _latest(self._cleared_at.get(key.entity), self._cleared_at.get(entity.key))
            if cleared is not None and fault.since <= cleared:
                log.info("fault_dropped_as_history", reason=fault.reason, entity=entity.key, pci_bus_id=gpu.pci_bus_id)
                continue
            existing = self._active.get(fault.key)
            if existing is None:
                self._active[fault.key] = _Active(fault)
            else:
                existing.absorb(fault)
            log.info("fault_rekeyed", reason=fault.reason, old=key.entity, new=entity.key)
        for key in [k for k in self._pending if k.entity in moves]:
            count = self._pending.pop(key)
            new = key._replace(entity=Entity(EntityKind.GPU, uuid=moves[key.entity].uuid).key)
            self._pending[new] = max(count, self._pending.get(new, 0))

    @staticmethod
    def _cleared_event(fault: Fault, when: datetime, why: str) -> HealthEvent:
        return HealthEvent(
            EventType.NORMAL,
            HEALTHY_REASONS[fault.condition],
            f"{fault.reason} {why} on {fault.entity.describe()}",
            fault.entity,
            when,
        )

    def evaluate(self, sample: NodeSample) -> HealthReport:
        self._remember_gpus(sample)
        self._rekey_by_bus()
        ctx = RuleContext(
            config=self.config,
            now=sample.time,
            gpus_by_bus=self._by_bus,
            gpus_by_uuid=self._by_uuid,
            active=set(self._active),
            cleared_at=self._cleared_at,
        )
        findings: dict[FaultKey, Finding] = {}
        # Faults a kernel-log record read by the previous run reports: that run
        # announced them, so raising one again makes no Event, whatever other
        # rule reports it live in the same poll (NVML's lost GPU). The
        # daemon's restore would hold them already; the standalone agent has
        # only this to go by.
        announced: set[FaultKey] = set()
        # Conditions nobody could judge this poll: their faults are held as
        # they were, neither counted absent nor cleared.
        blind: set[ConditionType] = set()
        if sample.gpu_source_error is not None:
            blind |= GPU_SOURCE_CONDITIONS
        if sample.ib_source_error is not None:
            blind.add(ConditionType.INFINIBAND_DEGRADED)
        if sample.mounts_source_error is not None:
            blind.add(ConditionType.STORAGE_DEGRADED)
        for rule in self._rules:
            try:
                for finding in rule.evaluate(sample, ctx):
                    if finding.history:
                        announced.add(finding.key)
                    earlier = findings.get(finding.key)
                    # Two events of one fault in one poll (XID 154 changing its
                    # recovery action twice): the later says what is wanted
                    # now -- unless it is an old report -- the earlier when it began.
                    if earlier is None:
                        findings[finding.key] = finding
                    else:
                        newer = earlier if finding.history and not earlier.history else finding
                        findings[finding.key] = replace(newer, since=_earliest(earlier.since, finding.since))
            except Exception:
                # A rule tripping over odd input (or a bug in it) must not cost
                # the other rules, nor the report: an exception escaping here
                # would fail every poll and detection would stop altogether.
                log.exception("rule_failed", rule=type(rule).__name__)
                blind |= rule.conditions
        events = self._pending_events
        self._pending_events = []
        events.extend(ctx.events)

        for key, f in findings.items():
            active = self._active.get(key)
            if active is not None:
                active.absent_polls = 0
                if f.history:
                    continue  # an old report; what the fault says now stands
                active.fault = replace(
                    active.fault,
                    message=f.message,
                    action=f.action,
                    entity=f.entity,
                    latched=active.fault.latched or f.latched,
                )
                continue
            count = self._pending.get(key, 0) + 1
            if f.latched or f.immediate or count >= self._raise_polls:
                self._pending.pop(key, None)
                fault = Fault(
                    condition=f.condition,
                    reason=f.reason,
                    message=f.message,
                    action=f.action,
                    entity=f.entity,
                    since=f.since or sample.time,
                    latched=f.latched,
                )
                self._active[key] = _Active(fault)
                # The XID rule already made its Event; the previous run announced a history one.
                if f.condition is not ConditionType.GPU_XID_ERROR and key not in announced:
                    events.append(HealthEvent(EventType.WARNING, f.reason, f.message, f.entity, sample.time))
                log.warning("fault_raised", condition=str(f.condition), reason=f.reason, entity=f.entity.key)
            else:
                self._pending[key] = count
        for key in [k for k in self._pending if k not in findings]:
            del self._pending[key]
        for key in [k for k in self._active if k not in findings]:
            active = self._active[key]
            if active.fault.latched or active.fault.condition in blind or not sample.scheduled:
                continue
            active.absent_polls += 1
            if active.absent_polls >= self._clear_polls:
                del self._active[key]
                events.append(self._cleared_event(active.fault, sample.time, why="cleared"))
                log.info("fault_cleared", condition=str(active.fault.condition), reason=active.fault.reason)
        return self._report(sample, tuple(events), frozenset(blind))

    # -------------------------------------------------------------- report

    def _report(
        self, sample: NodeSample, events: tuple[HealthEvent, ...], unjudged: frozenset[ConditionType]
    ) -> HealthReport:
        faults = tuple(
            sorted(
                (a.fault for a in self._active.values()),
                key=lambda f: (f.condition.value, f.entity.key, f.reason),
            )
        )
        by_entity: dict[str, list[Fault]] = {}
        for fault in faults:
            by_entity.setdefault(fault.entity.key, []).append(fault)

        gpus: list[GpuStatus] = []
        listed: set[str] = set()
        for g in sample.gpus:
            key = Entity.gpu(g.index, g.uuid or None, g.pci_bus_id or None).key
            listed.add(g.uuid)
            mine = tuple(by_entity.get(key, ()))
            gpus.append(
                GpuStatus(
                    index=g.index,
                    uuid=g.uuid,
                    pci_bus_id=g.pci_bus_id,
                    model=g.name,
                    memory_total_mib=g.memory_total_mib,
                    memory_used_mib=g.memory_used_mib,
                    mig_enabled=g.mig_enabled,
                    healthy=not g.lost and not mine,
                    faults=mine,
                )
            )
        if sample.gpu_source_error is None:
            # GPUs seen before that NVML no longer enumerates at all.
            for uuid, g in self._by_uuid.items():
                if uuid in listed:
                    continue
                key = Entity.gpu(g.index, g.uuid or None, g.pci_bus_id or None).key
                gpus.append(
                    GpuStatus(
                        index=g.index,
                        uuid=g.uuid,
                        pci_bus_id=g.pci_bus_id,
                        model=g.name,
                        memory_total_mib=g.memory_total_mib,
                        memory_used_mib=None,
                        mig_enabled=g.mig_enabled,
                        healthy=False,
                        faults=tuple(by_entity.get(key, ())),
                    )
                )

        ports = []
        for p in sample.ib_ports:
            mine = tuple(by_entity.get(Entity.ib(p.device, p.port).key, ()))
            ports.append(
                IbPortStatus(
                    device=p.device,
                    port=p.port,
                    state=p.state,
                    phys_state=p.phys_state,
                    rate_gbps=p.rate_gbps,
                    link_layer=p.link_layer,
                    netdev=p.netdev,
                    healthy=not mine,
                    faults=mine,
                )
            )
        errors = list(sample.errors)
        return HealthReport(
            node=self.node,
            time=sample.time,
            gpus=tuple(gpus),
            ib_ports=tuple(ports),
            faults=faults,
            events=events,
            errors=tuple(errors),
            unjudged=unjudged,
        )
