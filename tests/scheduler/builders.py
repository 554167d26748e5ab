"""Small constructors for hand-written clusters in scheduler tests."""

from __future__ import annotations

from typing import Any

from gpuwarden.contract import ANNOTATION_GPU_FRACTION, ANNOTATION_GPU_FRACTION_NUM_DEVICES, ANNOTATION_GPU_MEMORY
from scheduler.engine.model import (
    UNLIMITED,
    Decisions,
    Gpu,
    Job,
    Node,
    Queue,
    QueueResource,
    Task,
    TaskStatus,
)

GIB = 1024


def node(
    name: str,
    gpus: int = 8,
    *,
    gpu_mem: int = 81920,
    cpu: int = 128,
    mem_gib: int = 1024,
    gpu_list: tuple[Gpu, ...] | None = None,
    **kw: Any,
) -> Node:
    return Node(
        name=name,
        cpu_milli=cpu * 1000,
        memory_mib=mem_gib * GIB,
        gpus=gpu_list if gpu_list is not None else tuple(Gpu(i, memory_mib=gpu_mem) for i in range(gpus)),
        **kw,
    )


def queue(
    name: str,
    gpu_quota: float = 0,
    *,
    parent: str | None = None,
    gpu_limit: float = UNLIMITED,
    weight: float = 1.0,
    priority: int = 0,
    pool: str = "default",
) -> Queue:
    """A queue with a GPU quota (in GPUs); CPU and memory unlimited."""
    limit = UNLIMITED if gpu_limit == UNLIMITED else int(gpu_limit * 1000)
    return Queue(
        name=name,
        parent=parent,
        priority=priority,
        node_pool=pool,
        gpu=QueueResource(int(gpu_quota * 1000), limit, weight),
        cpu=QueueResource(UNLIMITED, UNLIMITED, 1.0),
        memory=QueueResource(UNLIMITED, UNLIMITED, 1.0),
    )


def pending(name: str, gpus: int = 0, *, cpu: int = 1, mem_gib: int = 1, **kw: Any) -> Task:
    return Task(name=name, uid=f"uid-{name}", cpu_milli=cpu * 1000, memory_mib=mem_gib * GIB, gpus=gpus, **kw)


def fraction(name: str, value: float, devices: int = 1, **kw: Any) -> Task:
    ann = {ANNOTATION_GPU_FRACTION: str(value)}
    if devices != 1:
        ann[ANNOTATION_GPU_FRACTION_NUM_DEVICES] = str(devices)
    return pending(name, annotations=ann, **kw)


def gpu_mib(name: str, mib: int, devices: int = 1, **kw: Any) -> Task:
    ann = {ANNOTATION_GPU_MEMORY: str(mib)}
    if devices != 1:
        ann[ANNOTATION_GPU_FRACTION_NUM_DEVICES] = str(devices)
    return pending(name, annotations=ann, **kw)


def running(
    name: str, node_name: str, gpu_indices: tuple[int, ...], *, cpu: int = 1, mem_gib: int = 1, **kw: Any
) -> Task:
    """A running pod holding ``gpu_indices`` whole (or as a slice, given slice annotations)."""
    gpus: int = kw.pop("gpus", len(gpu_indices) if "annotations" not in kw else 0)
    return Task(
        name=name,
        uid=f"uid-{name}",
        status=TaskStatus.RUNNING,
        cpu_milli=cpu * 1000,
        memory_mib=mem_gib * GIB,
        gpus=gpus,
        node=node_name,
        gpu_indices=gpu_indices,
        **kw,
    )


def job(name: str, queue_name: str, *tasks: Task, **kw: Any) -> Job:
    return Job(name=name, queue=queue_name, uid=f"uid-{name}", tasks=tasks, **kw)


def binds_by_job(decisions: Decisions) -> dict[str, list[tuple[str, str, tuple[int, ...]]]]:
    out: dict[str, list[tuple[str, str, tuple[int, ...]]]] = {}
    for b in decisions.binds:
        out.setdefault(b.job.split("/", 1)[1], []).append((b.pod, b.node, b.gpu_indices))
    return out


def evicted(decisions: Decisions) -> dict[str, tuple[str, str | None]]:
    """pod -> (action, beneficiary job name)."""
    return {
        e.pod: (e.action.value, e.beneficiary.split("/", 1)[1] if e.beneficiary else None) for e in decisions.evictions
    }


def pending_codes(decisions: Decisions) -> dict[str, str]:
    """job name -> the code of its first (main) pending reason."""
    return {p.job.split("/", 1)[1]: p.reasons[0].code.value for p in decisions.pending}
