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
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuwarden import contract
from gpuwarden.kube import JSON, ApiError, KubeApi
from gpuwarden.logconfig import get_logger
from scheduler.cluster.evict import EvictOutcome, EvictResult
from scheduler.engine.health import judge
from scheduler.engine.holders import misplaced_gpus
from scheduler.engine.model import Reservation, Snapshot

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
    return (
        f"the kubelet's device manager started it on {named} of node {ev.node}, which is out of service "
        f"({item.why}); gpuwarden had assigned GPU {', '.join(map(str, item.assigned))}. The device plugin still "
        f"offered that GPU, so the kubelet could choose it. {verb}{room}"
    )


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
