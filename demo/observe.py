"""What the demo shows and sums up, read back from the API server as anyone's kubectl would.

:class:`Observer` lists Nodes, GPUNodes, Queues, PodGroups, the demo's pods
and Events once a second and turns them into a :class:`Snapshot` for the
live view. It also keeps the run's history for the summary: when each
fault's condition first showed, when each GPU and node was quarantined and
returned, the state changes remediation recorded on the Nodes, and the
GPU-seconds every queue held against its fair share. Everything comes from
the API, never from the demo's own bookkeeping, so the view shows what
gpuwarden did, not what the demo asked for.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from kubernetes import client

from demo.kube import items, meta
from demo.kubelet import LABEL_JOB, LABEL_PART_OF, PART_OF
from gpuwarden import contract
from gpuwarden.logconfig import get_logger
from scheduler.cluster.assignment import decode_assignment

log = get_logger(__name__)

JSON = dict[str, Any]
_TERMINAL = frozenset({"Succeeded", "Failed"})
_GPUWARDEN_CONDITIONS = frozenset(c.value for c in contract.ConditionType)


@dataclass(frozen=True, slots=True)
class GpuView:
    index: int
    healthy: bool
    quarantined: bool
    used: float  # GPUs' worth of pods on it: 1 for a whole-GPU pod, 0.25 for a quarter slice


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    pool: str
    state: str  # the remediation state label (healthy when absent)
    cordoned: bool
    quarantine_taint: bool
    repair_needed: bool
    conditions: tuple[tuple[str, str], ...]  # gpuwarden's conditions now True: (type, reason)
    gpus: tuple[GpuView, ...]
    ib_up: int
    ib_total: int


@dataclass(frozen=True, slots=True)
class QueueView:
    name: str
    parent: str
    quota: float | None
    limit: float | None
    fair_share: float
    allocated: float
    requested: float
    lost_gpu_seconds: float


@dataclass(frozen=True, slots=True)
class PendingView:
    group: str
    queue: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class EventView:
    age_s: float
    kind: str
    obj: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Snapshot:
    elapsed_s: float
    nodes: tuple[NodeView, ...] = ()
    queues: tuple[QueueView, ...] = ()
    pending: tuple[PendingView, ...] = ()
    events: tuple[EventView, ...] = ()
    running_pods: int = 0
    pending_pods: int = 0
    succeeded_pods: int = 0


@dataclass(slots=True)
class Span:
    """One stretch of time something was true, from ``start_s`` to ``end_s`` (None: still)."""

    start_s: float
    end_s: float | None = None


@dataclass(slots=True)
class History:
    """The run as the API showed it, for the summary."""

    first_condition: dict[tuple[str, str, str], float] = field(default_factory=dict)  # (node, type, reason)
    gpu_quarantine: dict[tuple[str, int], list[Span]] = field(default_factory=dict)
    node_quarantine: dict[str, list[Span]] = field(default_factory=dict)
    states: list[tuple[float, str, str, str]] = field(default_factory=list)  # (t, node, from, to)
    allocated_gpu_s: dict[str, float] = field(default_factory=dict)
    fair_gpu_s: dict[str, float] = field(default_factory=dict)
    # (job label, node) of every demo pod seen running, with when it was first seen there.
    placements: dict[tuple[str, str], float] = field(default_factory=dict)
    # Every Event on a Node (the agent's fault news, remediation's steps): (t, node, reason, message).
    node_events: list[tuple[float, str, str, str]] = field(default_factory=list)
    seen_events: set[tuple[str, int]] = field(default_factory=set)


def _number(value: object) -> float:
    if isinstance(value, bool):
        return 0.0
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return 0.0
    return 0.0


def _gpu(resources: object) -> float:
    return _number(resources.get("gpu")) if isinstance(resources, dict) else 0.0


def _open(spans: list[Span]) -> bool:
    return bool(spans) and spans[-1].end_s is None


def _mark(spans: dict[Any, list[Span]], key: Any, on: bool, now: float) -> None:
    timeline = spans.setdefault(key, [])
    if on and not _open(timeline):
        timeline.append(Span(now))
    elif not on and _open(timeline):
        timeline[-1].end_s = now
    if not timeline:
        del spans[key]


class Observer:
    """Reads the cluster once a second; :attr:`latest` is the newest :class:`Snapshot`."""

    def __init__(self, api: client.ApiClient, period_s: float = 1.0) -> None:
        self._api = api
        self._period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-observer", daemon=True)
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._last_tick: float | None = None
        self.latest = Snapshot(0.0)
        self.history = History()

    def start(self) -> None:
        self._started = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)

    def elapsed(self) -> float:
        return time.monotonic() - self._started

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self.observe()
            except client.ApiException as exc:
                log.warning("demo_observe_failed", status=exc.status, reason=exc.reason)
            except Exception:
                log.exception("demo_observe_failed")
            self._stop.wait(max(0.05, self._period_s - (time.monotonic() - began)))

    # ------------------------------------------------------------ reading

    def observe(self) -> Snapshot:
        """One read of the cluster: the new snapshot, and the history brought up to it."""
        core = client.CoreV1Api(self._api)
        custom = client.CustomObjectsApi(self._api)
        g, v = contract.API_GROUP, contract.API_VERSION
        sg, sv = contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION
        nodes = items(self._api, core.list_node())
        gpunode_list = cast(JSON, custom.list_cluster_custom_object(g, v, contract.GPUNODE_PLURAL))
        gpunodes = {str(meta(o).get("name")): o for o in gpunode_list.get("items") or []}
        queue_list = cast(JSON, custom.list_cluster_custom_object(sg, sv, contract.QUEUE_PLURAL))
        queues: list[JSON] = queue_list.get("items") or []
        group_list = cast(JSON, custom.list_cluster_custom_object(sg, sv, contract.PODGROUP_PLURAL))
        groups: list[JSON] = group_list.get("items") or []
        pods = items(self._api, core.list_pod_for_all_namespaces(label_selector=f"{LABEL_PART_OF}={PART_OF}"))
        events = items(self._api, core.list_event_for_all_namespaces(limit=500))
        now = self.elapsed()
        snapshot = Snapshot(
            elapsed_s=now,
            nodes=tuple(self._node(n, gpunodes.get(n["metadata"]["name"]), pods) for n in nodes),
            queues=tuple(self._queue(q) for q in queues),
            pending=tuple(p for p in (self._pending(pg) for pg in groups) if p is not None),
            events=self._events(events),
            running_pods=sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running"),
            pending_pods=sum(1 for p in pods if not (p.get("spec") or {}).get("nodeName")),
            succeeded_pods=sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Succeeded"),
        )
        with self._lock:
            self._record(snapshot, pods, now)
            self._record_events(events, now)
            self.latest = snapshot
        return snapshot

    def _node(self, node: JSON, gpunode: JSON | None, pods: list[JSON]) -> NodeView:
        meta = node["metadata"]
        name = meta["name"]
        labels: Mapping[str, str] = meta.get("labels") or {}
        annotations: Mapping[str, str] = meta.get("annotations") or {}
        spec = node.get("spec") or {}
        quarantined_text = annotations.get(contract.ANNOTATION_QUARANTINED_GPUS, "")
        quarantined = {int(x) for x in quarantined_text.split(",") if x.strip().isdigit()}
        used: dict[int, float] = {}
        for pod in pods:
            if (pod.get("spec") or {}).get("nodeName") != name or (pod.get("status") or {}).get("phase") in _TERMINAL:
                continue
            pod_annotations = (pod.get("metadata") or {}).get("annotations") or {}
            indices = decode_assignment(pod_annotations.get(contract.ANNOTATION_GPU_ASSIGNMENT, ""), node=name) or ()
            share = _number(pod_annotations.get(contract.ANNOTATION_GPU_FRACTION)) or 1.0
            for index in indices:
                used[index] = used.get(index, 0.0) + share
        status = (gpunode or {}).get("status") or {}
        gpus = tuple(
            GpuView(
                int(gpu.get("index", 0)),
                bool(gpu.get("healthy", True)),
                int(gpu.get("index", 0)) in quarantined,
                used.get(int(gpu.get("index", 0)), 0.0),
            )
            for gpu in status.get("gpus") or []
        )
        ports = status.get("ibPorts") or []
        conditions = tuple(
            (str(c.get("type")), str(c.get("reason") or ""))
            for c in (node.get("status") or {}).get("conditions") or []
            if c.get("type") in _GPUWARDEN_CONDITIONS and c.get("status") == "True"
        )
        return NodeView(
            name=name,
            pool=labels.get(contract.LABEL_NODE_POOL, ""),
            state=labels.get(contract.LABEL_REMEDIATION_STATE, contract.RemediationState.HEALTHY.value),
            cordoned=bool(spec.get("unschedulable")),
            quarantine_taint=any(t.get("key") == contract.TAINT_QUARANTINE for t in spec.get("taints") or []),
            repair_needed=contract.LABEL_REPAIR_NEEDED in labels,
            conditions=conditions,
            gpus=gpus,
            ib_up=sum(1 for p in ports if p.get("healthy", True)),
            ib_total=len(ports),
        )

    @staticmethod
    def _queue(queue: JSON) -> QueueView:
        spec = queue.get("spec") or {}
        status = queue.get("status") or {}
        gpu = (spec.get("resources") or {}).get("gpu") or {}
        return QueueView(
            name=queue["metadata"]["name"],
            parent=str(spec.get("parentQueue") or ""),
            quota=_number(gpu["quota"]) if "quota" in gpu else None,
            limit=_number(gpu["limit"]) if "limit" in gpu else None,
            fair_share=_gpu(status.get("fairShare")),
            allocated=_gpu(status.get("allocated")),
            requested=_gpu(status.get("requested")),
            lost_gpu_seconds=_number(status.get("gpuSecondsLostToFaults")),
        )

    @staticmethod
    def _pending(group: JSON) -> PendingView | None:
        status = group.get("status") or {}
        if status.get("phase") != contract.PodGroupPhase.PENDING.value:
            return None
        cond: JSON = next((c for c in status.get("conditions") or [] if c.get("status") == "True"), {})
        meta = group["metadata"]
        return PendingView(
            group=f"{meta.get('namespace')}/{meta['name']}",
            queue=str((group.get("spec") or {}).get("queue") or ""),
            reason=str(cond.get("reason") or "Pending"),
            message=str(cond.get("message") or ""),
        )

    def _events(self, events: list[JSON]) -> tuple[EventView, ...]:
        def when(ev: JSON) -> str:
            return str(
                ev.get("lastTimestamp")
                or ev.get("eventTime")
                or (ev.get("metadata") or {}).get("creationTimestamp")
                or ""
            )

        wall = time.time()
        shown = []
        for ev in sorted(events, key=when, reverse=True)[:12]:
            involved = ev.get("involvedObject") or {}
            try:
                age = wall - datetime.fromisoformat(when(ev).replace("Z", "+00:00")).timestamp()
            except ValueError:
                age = 0.0
            shown.append(
                EventView(
                    age_s=max(0.0, age),
                    kind=str(ev.get("type") or ""),
                    obj=f"{str(involved.get('kind') or '').lower()}/{involved.get('name', '')}",
                    reason=str(ev.get("reason") or ""),
                    message=str(ev.get("message") or ""),
                )
            )
        return tuple(shown)

    # ------------------------------------------------------------ history

    def _record(self, snap: Snapshot, pods: list[JSON], now: float) -> None:
        h = self.history
        dt = 0.0 if self._last_tick is None else now - self._last_tick
        self._last_tick = now
        previous = {n.name: n.state for n in self.latest.nodes}
        for node in snap.nodes:
            for ctype, reason in node.conditions:
                h.first_condition.setdefault((node.name, ctype, reason), now)
            for gpu in node.gpus:
                _mark(h.gpu_quarantine, (node.name, gpu.index), gpu.quarantined, now)
            _mark(h.node_quarantine, node.name, node.quarantine_taint, now)
            before = previous.get(node.name)
            if before is not None and before != node.state:
                h.states.append((now, node.name, before, node.state))
        for q in snap.queues:
            h.allocated_gpu_s[q.name] = h.allocated_gpu_s.get(q.name, 0.0) + q.allocated * dt
            h.fair_gpu_s[q.name] = h.fair_gpu_s.get(q.name, 0.0) + q.fair_share * dt
        for pod in pods:
            node_name = (pod.get("spec") or {}).get("nodeName")
            job = ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_JOB)
            if node_name and job and (pod.get("status") or {}).get("phase") == "Running":
                h.placements.setdefault((job, node_name), now)

    def _record_events(self, events: list[JSON], now: float) -> None:
        """Node Events, each once (by uid and count), at the run time they happened."""
        wall = time.time()
        h = self.history
        for ev in events:
            involved = ev.get("involvedObject") or {}
            if involved.get("kind") != "Node":
                continue
            key = (str(meta(ev).get("uid")), int(ev.get("count") or 1))
            if key in h.seen_events:
                continue
            h.seen_events.add(key)
            stamp = str(ev.get("lastTimestamp") or ev.get("eventTime") or "")
            try:
                age = max(0.0, wall - datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp())
            except ValueError:
                age = 0.0
            h.node_events.append(
                (now - age, str(involved.get("name")), str(ev.get("reason")), str(ev.get("message") or ""))
            )
        h.node_events.sort()

    def snapshot_history(self) -> History:
        with self._lock:
            return self.history
