"""Whole-GPU pods the kubelet's device manager put on a GPU out of service: said and counted.

On a device-plugin node the kubelet picks a container's GPUs among those the
device plugin offers, and the plugin does not know gpuwarden's quarantine (it
checks XIDs only): a GPU fenced for an NVLink, PCIe or row-remap fault can be
handed to the next whole-GPU pod. The engine's health eviction evicts such a
pod at once, through the Eviction API like any other, and holds room for it
elsewhere (:mod:`scheduler.engine.actions.health_evict`). This module finds
those evictions in a cycle's results (:func:`misplaced_evictions`, pure:
the snapshot's kubelet mapping against the pod's assignment, the rule of
:mod:`scheduler.engine.holders`) and writes one Warning Event per pod naming
the GPU, why it is out of service, what gpuwarden had assigned and where room
is held (:class:`MisplacedEvents`); the metrics count them by outcome.

The device manager may choose the same GPU again for the recreated pod,
and evicting it each time would restart the job in a loop as fast as the
agent reports. So the job is kept off that node for a while
(:class:`MisplacedBackoff`): one minute after the first misplacement there,
doubling with each repeat up to half an hour, the count forgotten after
an hour without one. Its pods wait where no other node fits, and their
pending reason says why (:attr:`scheduler.engine.model.Placement.avoid`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from gpuwarden import contract
from gpuwarden.kube import JSON, ApiError, KubeApi
from gpuwarden.logconfig import get_logger
from scheduler.cluster.evict import EvictOutcome, EvictResult
from scheduler.engine.health import judge
from scheduler.engine.holders import misplaced_gpus
from scheduler.engine.model import Job, Placement, Reservation, Snapshot, TaskStatus

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Misplaced:
    """One eviction of a pod the device manager started on GPUs out of service."""

    result: EvictResult
    gpus: tuple[int, ...]  # the GPUs out of service it was on
    uuids: tuple[str, ...]
    why: str  # why those GPUs are out of service
    assigned: tuple[int, ...]  # what gpuwarden had assigned it
    room: str  # the node room is held on for its job, "" if none
    avoided_s: float = 0.0  # how long its job is now kept off the node (MisplacedBackoff)

    @property
    def outcome(self) -> EvictOutcome:
        return self.result.outcome


def misplaced_evictions(
    results: Iterable[EvictResult], snapshot: Snapshot, reservations: Sequence[Reservation] = ()
) -> list[Misplaced]:
    """The health evictions of this cycle whose pod the kubelet reports on GPUs out of service it was not assigned."""
    wanted = [r for r in results if r.eviction.action is contract.EvictionAction.HEALTH_EVICTION]
    if not wanted:
        return []
    nodes = {n.name: n for n in snapshot.nodes if n.kubelet_holders}
    if not nodes:
        return []
    tasks = {t.uid: t for job in snapshot.jobs for t in job.tasks if t.uid and t.node in nodes}
    rooms = {r.job: r.node for r in reservations}
    out: list[Misplaced] = []
    for result in wanted:
        ev = result.eviction
        node = nodes.get(ev.node)
        task = tasks.get(ev.uid)
        if node is None or task is None:
            continue
        gpus = misplaced_gpus(node, task)
        if not gpus:
            continue
        bad = judge(node).bad_gpus
        uuid = {g.index: g.uuid for g in node.gpus}
        out.append(
            Misplaced(
                result=result,
                gpus=gpus,
                uuids=tuple(uuid.get(i, "") for i in gpus),
                why="; ".join(dict.fromkeys(bad.get(i, "out of service") for i in gpus)),
                assigned=task.gpu_indices,
                room=rooms.get(ev.job, ""),
            )
        )
    return out


def event_message(item: Misplaced) -> str:
    ev = item.result.eviction
    named = ", ".join(f"GPU {i} ({u})" if u else f"GPU {i}" for i, u in zip(item.gpus, item.uuids, strict=True))
    room = f"; room is held for it on node {item.room}" if item.room else ""
    verb = "evicted" if item.result.ok else f"eviction {item.outcome.value.lower()}"
    avoided = f"; its job is kept off node {ev.node} for {item.avoided_s:.0f}s" if item.avoided_s else ""
    return (
        f"the kubelet's device manager started it on {named} of node {ev.node}, which is out of service "
        f"({item.why}); gpuwarden had assigned GPU {', '.join(map(str, item.assigned))}. The device plugin still "
        f"offered that GPU, so the kubelet could choose it. {verb}{room}{avoided}"
    )


@dataclass(slots=True)
class _Strikes:
    """One job's misplacements on one node."""

    count: int
    last: float  # when the latest was seen
    until: float  # the job is kept off the node until then


class MisplacedBackoff:
    """Keeps a job off a node whose device manager put one of its pods on a GPU out of service, for a while.

    Process state, like the Events' dedup: a restarted scheduler starts
    with no backoff and at worst evicts once more before it backs off again.
    :meth:`apply` is pure over the snapshot and keeps the jobs it changes
    the same objects while their avoided nodes stay the same, so the
    kept-state engine does not rebuild them every cycle.
    """

    def __init__(self, first_s: float = 60.0, max_s: float = 1800.0, forget_s: float = 3600.0) -> None:
        self.first_s = first_s
        self.max_s = max_s
        self.forget_s = forget_s
        self._strikes: dict[tuple[str, str], _Strikes] = {}
        # Per job: the snapshot's job, the nodes it avoids, what apply made of it.
        self._made: dict[str, tuple[Job, tuple[str, ...], Job]] = {}

    def record(self, items: Sequence[Misplaced], now: float) -> list[Misplaced]:
        """Count this cycle's misplacements; ``items`` with how long each job is now kept off its node."""
        out: list[Misplaced] = []
        counted: dict[tuple[str, str], float] = {}
        for item in items:
            ev = item.result.eviction
            key = (ev.job, ev.node)
            if not item.result.ok:
                # Still there (a disruption budget, an API error): asked again
                # next cycle, which is no new misplacement.
                strikes = self._strikes.get(key)
                out.append(replace(item, avoided_s=max(0.0, strikes.until - now) if strikes else 0.0))
                continue
            if key not in counted:  # a gang's pods on one node are one strike
                strikes = self._strikes.get(key)
                count = 1 if strikes is None or now - strikes.last > self.forget_s else strikes.count + 1
                # The exponent stops where any window is past the cap: a float
                # power of two beyond 2**1023 overflows, after ~1,000 strikes.
                window = min(self.max_s, self.first_s * 2.0 ** min(count - 1, 64))
                self._strikes[key] = _Strikes(count, now, now + window)
                counted[key] = window
            out.append(replace(item, avoided_s=counted[key]))
        return out

    def avoided(self, now: float) -> dict[str, tuple[str, ...]]:
        """Per job, the nodes it is kept off now (sorted); forgets strikes older than ``forget_s``."""
        stale = [k for k, s in self._strikes.items() if now - s.last > self.forget_s and now >= s.until]
        for key in stale:
            del self._strikes[key]
        out: dict[str, list[str]] = {}
        for (job, node), strikes in self._strikes.items():
            if now < strikes.until:
                out.setdefault(job, []).append(node)
        return {job: tuple(sorted(nodes)) for job, nodes in out.items()}

    def apply(self, snapshot: Snapshot, now: float) -> Snapshot:
        """``snapshot`` with each backed-off job's pending pods kept off the nodes it avoids."""
        avoided = self.avoided(now)
        if not avoided and not self._made:
            return snapshot
        made: dict[str, tuple[Job, tuple[str, ...], Job]] = {}
        jobs: list[Job] | None = None
        for i, job in enumerate(snapshot.jobs):
            nodes = avoided.get(job.key)
            if nodes is None:
                continue
            before = self._made.get(job.key)
            if before is not None and before[0] is job and before[1] == nodes:
                changed = before[2]
            else:
                changed = _kept_off(job, nodes)
            made[job.key] = (job, nodes, changed)
            if changed is not job:
                if jobs is None:
                    jobs = list(snapshot.jobs)
                jobs[i] = changed
        self._made = made
        return snapshot if jobs is None else replace(snapshot, jobs=tuple(jobs))


def _kept_off(job: Job, nodes: tuple[str, ...]) -> Job:
    """``job`` with its pending pods' placement avoiding ``nodes``."""
    tasks = []
    changed = False
    for task in job.tasks:
        placement = task.placement or Placement()
        if task.status is TaskStatus.PENDING and placement.avoid != nodes:
            tasks.append(replace(task, placement=replace(placement, avoid=nodes)))
            changed = True
        else:
            tasks.append(task)
    return replace(job, tasks=tuple(tasks)) if changed else job


class MisplacedEvents:
    """One Warning Event per misplaced pod, on the pod, named after its UID and GPUs (a retry is a 409)."""

    def __init__(self, api: KubeApi) -> None:
        self._api = api

    def write(self, items: Iterable[Misplaced]) -> int:
        written = 0
        for item in items:
            ev = item.result.eviction
            key = f"{ev.uid or ev.namespace + '/' + ev.pod}/{','.join(map(str, item.gpus))}/{item.outcome.value}"
            digest = hashlib.sha256(key.encode()).hexdigest()[:12]
            involved: JSON = {"apiVersion": "v1", "kind": "Pod", "name": ev.pod, "namespace": ev.namespace}
            if ev.uid:
                involved["uid"] = ev.uid
            message = event_message(item)
            body: JSON = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": f"{ev.pod[:200]}.{digest}", "namespace": ev.namespace},
                "involvedObject": involved,
                "reason": contract.EVENT_POD_ON_QUARANTINED_GPU,
                "message": message[:1024],
                "type": "Warning",
                "source": {"component": contract.SCHEDULER_COMPONENT},
                "reportingComponent": contract.SCHEDULER_COMPONENT,
                "count": 1,
            }
            log.warning(
                "pod_on_quarantined_gpu",
                namespace=ev.namespace,
                pod=ev.pod,
                node=ev.node,
                gpus=list(item.gpus),
                assigned=list(item.assigned),
                outcome=item.outcome.value,
                room=item.room or None,
            )
            try:
                self._api.create_event(ev.namespace, body)
                written += 1
            except ApiError as err:
                if err.status != 409:
                    log.warning("pod_on_quarantined_gpu_event_failed", pod=f"{ev.namespace}/{ev.pod}", error=str(err))
        return written
