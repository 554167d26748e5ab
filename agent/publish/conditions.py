"""NodeConditions: one per fault class, True while the problem is present.

The scheduler, ``kubectl describe node`` and every tool that already reads
node conditions (node-problem-detector's consumers, cluster autoscalers)
see GPU health here without knowing gpuwarden. The agent owns only the types
in :class:`gpuwarden.contract.ConditionType` and writes them with a strategic-
merge patch of ``nodes/status`` keyed by type, so the kubelet's conditions
and other tools' are never sent, let alone overwritten, even when they write
at the same moment.

Request budget: a condition is sent when its status, reason or message
changes; all of them are re-sent once per heartbeat period with a fresh
``lastHeartbeatTime`` (so a reader can tell a live agent from a dead one).
Nothing is sent on an unchanged poll. ``lastTransitionTime`` moves only when
the status flips, and is read back from the Node on start so a restarted
agent does not make conditions look new.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from agent.model import EntityKind, Fault, HealthReport
from gpuwarden.contract import HEALTHY_REASONS, ConditionType, Reason, worst_action
from gpuwarden.kube import JSON, KubeApi
from gpuwarden.logconfig import get_logger
from gpuwarden.timefmt import parse_time as shared_parse_time

log = get_logger(__name__)

# `kubectl describe node` prints a message on one line; past a few GPUs a
# list stops being read. List this many faults, then "and N more".
MAX_LISTED_FAULTS = 4
# Each fault's own text is cut to this many characters so that one verbose
# fault cannot push the others and the recommended action out of view.
MAX_FAULT_TEXT = 240
# The rules end a fault's message with its action; the condition message
# states the node's action once at the end instead.
_ACTION_TAIL = re.compile(r"[;,.]?\s*recommended action:?\s+[A-Z_]+\.?\s*$", re.IGNORECASE)

HEALTHY_MESSAGES: Mapping[ConditionType, str] = {
    ConditionType.GPU_XID_ERROR: "No fatal XID on any GPU",
    ConditionType.GPU_MEMORY_DEGRADED: "No pending or failed memory row remap and no retired-page limit on any GPU",
    ConditionType.GPU_NVLINK_DEGRADED: "All NVLinks active, error counters steady",
    ConditionType.GPU_PCIE_DEGRADED: "All GPU PCIe links at full width and generation, replay counters steady",
    ConditionType.INFINIBAND_DEGRADED: "All InfiniBand ports active at their expected rate",
    ConditionType.GPU_MISSING: "All expected GPUs visible",
    ConditionType.STORAGE_DEGRADED: "All configured shared-storage mounts present and answering",
}

# Which conditions a failed probe leaves unknown. A report's ``errors`` are
# "<source>: <detail>" (``gpu: NVML not loaded``); while a source fails, the
# conditions it feeds keep the status they had instead of turning healthy on
# missing data. An error from a source not listed here holds every
# condition: not knowing which signal is missing is no reason to call any of
# them healthy.
_GPU_CONDITIONS = frozenset(
    {
        ConditionType.GPU_XID_ERROR,
        ConditionType.GPU_MEMORY_DEGRADED,
        ConditionType.GPU_NVLINK_DEGRADED,
        ConditionType.GPU_PCIE_DEGRADED,
        ConditionType.GPU_MISSING,
    }
)
_ERROR_SOURCES: Mapping[str, frozenset[ConditionType]] = {
    "gpu": _GPU_CONDITIONS,
    "nvml": _GPU_CONDITIONS,
    "kmsg": frozenset({ConditionType.GPU_XID_ERROR}),
    "infiniband": frozenset({ConditionType.INFINIBAND_DEGRADED}),
    "netdev": frozenset({ConditionType.INFINIBAND_DEGRADED}),
    "storage": frozenset({ConditionType.STORAGE_DEGRADED}),
}


def conditions_held_by_errors(errors: Iterable[str]) -> frozenset[ConditionType]:
    """The condition types whose source probe failed, by each error's source prefix."""
    held: set[ConditionType] = set()
    for error in errors:
        source = error.split(":", 1)[0].strip().lower()
        conditions = _ERROR_SOURCES.get(source)
        if conditions is None:
            return frozenset(ConditionType)
        held |= conditions
    return frozenset(held)


def now_utc() -> datetime:
    """Wall-clock now, at the one-second precision Kubernetes stores."""
    return datetime.now(UTC).replace(microsecond=0)


def format_time(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: object) -> datetime | None:
    """An RFC 3339 time to the second, as Kubernetes keeps condition times (None when it is not one)."""
    parsed = shared_parse_time(text)
    return parsed.replace(microsecond=0) if parsed is not None else None


@dataclass(frozen=True, slots=True)
class ConditionState:
    """One of the agent's conditions as it is (or should be) on the Node."""

    type: ConditionType
    problem: bool
    reason: str
    message: str
    last_transition: datetime

    @property
    def status(self) -> str:
        return "True" if self.problem else "False"

    def same_content(self, other: ConditionState | None) -> bool:
        """Equal in what a reader sees; heartbeats differ only in time."""
        return (
            other is not None
            and self.problem == other.problem
            and self.reason == other.reason
            and self.message == other.message
            and self.last_transition == other.last_transition
        )

    def to_json(self, heartbeat: datetime) -> JSON:
        return {
            "type": self.type.value,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "lastTransitionTime": format_time(self.last_transition),
            "lastHeartbeatTime": format_time(heartbeat),
        }


def _fault_order(fault: Fault) -> tuple[int, int, str, int, str, str]:
    e = fault.entity
    kind_rank = {EntityKind.GPU: 0, EntityKind.IB_PORT: 1, EntityKind.MOUNT: 2, EntityKind.NODE: 3}[e.kind]
    return (
        kind_rank,
        e.gpu_index if e.gpu_index is not None else -1,
        e.ib_device or e.mount or "",
        e.ib_port if e.ib_port is not None else -1,
        fault.reason,
        fault.message,
    )


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def fault_text(fault: Fault, *, with_action: bool = False) -> str:
    """The fault as "GPU 3 (GPU-…, 0000:3b:00): <what the rule said>".

    The entity is not repeated when the rule's message already starts with
    it, and the rule's own "recommended action" tail is dropped; with
    ``with_action`` the fault's action comes back in brackets, for messages
    that list faults with different actions.
    """
    who = fault.entity.describe()
    what = _ACTION_TAIL.sub("", fault.message.strip()) or fault.reason
    if fault.entity.kind is not EntityKind.NODE and not what.startswith(who):
        what = f"{who}: {what}"
    tail = f" [{fault.action.value}]" if with_action else ""
    return _clip(what, MAX_FAULT_TEXT - len(tail)) + tail


def condition_reason(faults: Iterable[Fault]) -> str:
    reasons = {f.reason for f in faults}
    if len(reasons) == 1:
        return next(iter(reasons))
    return Reason.MULTIPLE_FAULTS.value


def condition_message(faults: Iterable[Fault]) -> str:
    """All faults of one condition in one readable, bounded line.

    Faults are ordered by GPU index (then port, mount) so the message does
    not reshuffle between polls and cause needless patches; identical texts
    (one fault seen through two signals) are listed once.
    """
    ordered = sorted(faults, key=_fault_order)
    mixed = len({f.action for f in ordered}) > 1
    texts: list[str] = []
    for fault in ordered:
        text = fault_text(fault, with_action=mixed)
        if text not in texts:
            texts.append(text)
    listed = texts[:MAX_LISTED_FAULTS]
    body = "; ".join(listed)
    if len(texts) > len(listed):
        body += f"; and {len(texts) - len(listed)} more"
    action = worst_action([f.action for f in ordered])
    return f"{body}. Recommended action: {action.value}."


def desired_conditions(
    report: HealthReport,
    previous: Mapping[ConditionType, ConditionState],
    now: datetime,
) -> dict[ConditionType, ConditionState]:
    """What every agent-owned condition should say, given the report.

    ``previous`` is what was last published (or read back from the Node):
    its ``lastTransitionTime`` is kept unless the status flips, and a
    condition whose probe failed this poll keeps its previous problem status
    rather than turning healthy.

    A flip is dated when it happened, not when it could be written: a
    problem from its earliest fault's ``since`` (the detection), a recovery
    from the report's time. Publishing can lag by a cold start or an API
    outage's backoff, and ``lastTransitionTime`` is what people and alerts
    read as "since when". ``now`` only bounds it, so a clock step can never
    date a transition in the future.
    """
    held = conditions_held_by_errors(report.errors) if report.errors else frozenset()
    out: dict[ConditionType, ConditionState] = {}
    for ctype in ConditionType:
        faults = report.faults_for(ctype)
        before = previous.get(ctype)
        if faults:
            detected = min([*(f.since for f in faults), now])
            state = ConditionState(ctype, True, condition_reason(faults), condition_message(faults), detected)
        elif ctype in held and before is not None and before.problem:
            out[ctype] = before
            continue
        else:
            cleared = min(report.time, now)
            state = ConditionState(ctype, False, HEALTHY_REASONS[ctype], HEALTHY_MESSAGES[ctype], cleared)
        if before is not None and before.problem == state.problem:
            state = replace(state, last_transition=before.last_transition)
        out[ctype] = state
    return out


def conditions_from_node(node: JSON) -> dict[ConditionType, ConditionState]:
    """The agent's conditions as found on a Node (what a previous run wrote).

    Conditions of other types are ignored; a malformed one of ours is logged
    and left out, so that the next publish rewrites it correctly.
    """
    found: dict[ConditionType, ConditionState] = {}
    status = node.get("status") or {}
    for raw in status.get("conditions") or []:
        if not isinstance(raw, dict):
            continue
        try:
            ctype = ConditionType(str(raw.get("type")))
        except ValueError:
            continue
        transition = parse_time(raw.get("lastTransitionTime"))
        if raw.get("status") not in ("True", "False") or transition is None:
            log.warning("condition_on_node_malformed", condition=ctype.value, raw=raw)
            continue
        found[ctype] = ConditionState(
            ctype,
            raw["status"] == "True",
            str(raw.get("reason") or ""),
            str(raw.get("message") or ""),
            transition,
        )
    return found


class ConditionsPublisher:
    """Keeps the agent's conditions on its Node equal to the latest report.

    Not thread-safe: the daemon calls it from its one publishing thread.
    ``on_node`` receives the Node each successful patch returns, which is how
    the daemon learns the node's taints and uid without extra requests.
    """

    def __init__(
        self,
        api: KubeApi,
        node_name: str,
        *,
        heartbeat_period_s: float = 60.0,
        on_node: Callable[[JSON], None] | None = None,
        clock: Callable[[], datetime] = now_utc,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._node = node_name
        self._period = heartbeat_period_s
        self._on_node = on_node
        self._clock = clock
        self._monotonic = monotonic
        # What the Node holds, as far as this process knows.
        self._published: dict[ConditionType, ConditionState] = {}
        # What the latest report asked for (kept across failed patches).
        self._desired: dict[ConditionType, ConditionState] = {}
        self._last_heartbeat: float | None = None

    @property
    def published(self) -> Mapping[ConditionType, ConditionState]:
        return dict(self._published)

    def restore(self, node: JSON) -> dict[ConditionType, ConditionState]:
        """Adopt the conditions a previous run left on the Node.

        Their transition times are kept and a True condition stays True
        until a report says otherwise. No heartbeat is assumed, so the first
        publish re-sends them all.
        """
        found = conditions_from_node(node)
        self._published = dict(found)
        self._desired = dict(found)
        self._last_heartbeat = None
        return found

    def invalidate(self) -> None:
        """Forget what the Node holds: the next publish sends every condition.

        Called after an API outage, when the Node may have been restored
        from an older etcd snapshot or edited while the agent could not see.
        """
        self._published = {}
        self._last_heartbeat = None

    def next_due(self) -> float | None:
        """Monotonic time of the next heartbeat (None: due now)."""
        if self._last_heartbeat is None:
            return None
        return self._last_heartbeat + self._period

    def publish(self, report: HealthReport) -> bool:
        """Patch what changed (or everything on a heartbeat); True if a request was sent.

        Raises :class:`gpuwarden.kube.ApiError` on failure; the desired
        state is kept, so a retry sends it again.
        """
        now = self._clock()
        self._desired = desired_conditions(report, self._desired or self._published, now)
        return self.flush(now)

    def flush(self, now: datetime | None = None) -> bool:
        """Send the desired state if it differs from the Node or a heartbeat is due."""
        now = now or self._clock()
        if not self._desired:
            return False
        heartbeat = self._last_heartbeat is None or self._monotonic() - self._last_heartbeat >= self._period
        if heartbeat:
            to_send = list(self._desired.values())
        else:
            to_send = [s for t, s in self._desired.items() if not s.same_content(self._published.get(t))]
        if not to_send:
            return False
        patch = {"status": {"conditions": [s.to_json(now) for s in to_send]}}
        node = self._api.patch_node_status(self._node, patch)
        for state in to_send:
            before = self._published.get(state.type)
            if before is None or before.problem != state.problem or before.reason != state.reason:
                log.info(
                    "condition_published",
                    node=self._node,
                    condition=state.type.value,
                    status=state.status,
                    reason=state.reason,
                    message=state.message,
                )
            self._published[state.type] = state
        if heartbeat:
            self._last_heartbeat = self._monotonic()
        if self._on_node is not None:
            self._on_node(node)
        return True
