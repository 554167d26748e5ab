"""What hardware faults cost each queue: GPU-seconds of running work they evicted.

For every pod the scheduler's health eviction removed (an eviction that
went through, or found the pod already gone), its GPUs times how long it
had run (from ``status.startTime``). A slice counts as its share of a GPU;
a whole-GPU pod that the node's kubelet reports holding GPUs counts those
(:mod:`scheduler.engine.holders`), not its request.
The cycle adds these to the Queue's ``status.gpuSecondsLostToFaults`` and
to ``gpuwarden_queue_gpu_seconds_lost_to_faults_total``, so a team can see
that a failing GPU, not the scheduler, took its hours.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from gpuwarden.contract import QUEUE_STATUS_GPU_SECONDS_LOST, EvictionAction
from scheduler.cluster.evict import EvictResult
from scheduler.engine.holders import kubelet_gpus
from scheduler.engine.model import Snapshot
from scheduler.engine.resources import MILLI, parse_gpu_request


def _started(pod: Mapping[str, Any] | None) -> float | None:
    status = pod.get("status") if pod is not None else None
    text = status.get("startTime") if isinstance(status, dict) else None
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def gpu_seconds_lost(
    results: Iterable[EvictResult], snapshot: Snapshot, pods: Mapping[str, Mapping[str, Any]], now: float
) -> dict[str, float]:
    """Per queue, GPU-seconds of the pods health eviction removed this cycle (``pods`` by UID)."""
    results = list(results)
    if not results:
        return {}  # the common cycle: no index of every job and node to build
    jobs = {job.key: job for job in snapshot.jobs}
    nodes = {n.name: n for n in snapshot.nodes}
    memory = {n.name: max((g.memory_mib for g in n.gpus), default=0) for n in snapshot.nodes}
    out: dict[str, float] = {}
    for result in results:
        ev = result.eviction
        if ev.action is not EvictionAction.HEALTH_EVICTION or not result.ok:
            continue
        job = jobs.get(ev.job)
        task = next((t for t in job.tasks if t.uid == ev.uid), None) if job is not None else None
        started = _started(pods.get(ev.uid))
        if job is None or task is None or started is None:
            continue
        request = parse_gpu_request(task.gpus, task.annotations)
        if isinstance(request, str):
            continue
        gpus = request.milli_gpus(memory.get(ev.node, 0)) / MILLI
        node = nodes.get(ev.node)
        real = kubelet_gpus(node, task) if node is not None and not request.is_slice else None
        if real is not None:
            gpus = float(len(real))
        if gpus > 0:
            out[job.queue] = out.get(job.queue, 0.0) + gpus * max(0.0, now - started)
    return out


def lost_totals(
    queues: Mapping[str, Mapping[str, Any]], lost: Mapping[str, float], written: Mapping[str, float] | None = None
) -> dict[str, float]:
    """Each queue's new ``status.gpuSecondsLostToFaults``: what it shows plus the cycles' new losses.

    ``written`` is what this process wrote last per queue. Status writes go
    out behind the cycles, so a view can be older than the last write; the
    larger of the two is the total so far, or a stale view would write an
    earlier total back over a later one and lose what was added in between.
    """
    written = written or {}
    out: dict[str, float] = {}
    for name, obj in queues.items():
        status = obj.get("status")
        shown = status.get(QUEUE_STATUS_GPU_SECONDS_LOST) if isinstance(status, dict) else None
        before = float(shown) if isinstance(shown, int | float) and not isinstance(shown, bool) and shown >= 0 else 0.0
        before = max(before, written.get(name, 0.0))
        if before or lost.get(name):
            out[name] = round(before + lost.get(name, 0.0), 3)
    return out
