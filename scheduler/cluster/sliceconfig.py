"""The GPU slice a pod's containers obey: a ConfigMap written before the bind, owned by the pod.

The engine keeps slices on per-GPU memory bins, so no GPU is over-committed
on paper; on the node nothing stops a process from taking the whole device
unless it is told its share. That is HAMi-core's job (a library preloaded
into the container, see the README): it caps device memory at
``CUDA_DEVICE_MEMORY_LIMIT`` and, when set, SM utilisation at
``CUDA_DEVICE_SM_LIMIT``. The NVIDIA container runtime exposes the devices
named in ``NVIDIA_VISIBLE_DEVICES``. So before a slice pod is bound the
scheduler writes those variables, and the fraction, into a ConfigMap in the
pod's namespace; the admission webhook gave every container an ``envFrom``
of that ConfigMap, not optional, so no container starts before it exists.

Why a ConfigMap and not the pod itself: a pod's environment cannot change
after it is created, and what it must contain (which GPU) is only known at
bind time. The ConfigMap's name is a function of the pod's name alone
(:func:`config_map_name`), so the webhook can name it at admission and the
binder can write it knowing only the bind. It is owned by the pod, so the
garbage collector removes it with the pod.

Values, as HAMi-core reads them: memory in MiB with an ``m`` suffix; for a
slice on one GPU ``CUDA_DEVICE_MEMORY_LIMIT``, for a slice on N GPUs one
``CUDA_DEVICE_MEMORY_LIMIT_<i>`` per device, ``i`` counting the devices as
the container sees them (the order of ``NVIDIA_VISIBLE_DEVICES``).
``CUDA_DEVICE_SM_LIMIT`` is a percentage, written only when the scheduler
runs with a compute share (``--slice-compute=proportional``: a quarter of
the memory, a quarter of the SMs). Whole-GPU pods get no ConfigMap: the
device plugin hands them their devices.

The write comes before the bind and a pod whose ConfigMap cannot be written
is not bound (:class:`SliceConfigWriter` returns why, and the binder reports
the bind failed; next cycle places it again). A ConfigMap left by an earlier
attempt for the same pod is rewritten: the retry may land on another GPU. One
of that name that the pod does not own is never touched: the bind fails and
says so, in the result and in an Event on the pod.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from gpuwarden import contract
from gpuwarden.kube import JSON, ApiError, KubeApi
from gpuwarden.logconfig import get_logger
from scheduler.engine.model import Bind, Node

log = get_logger(__name__)

# Object names are DNS subdomains: at most 253 characters.
_MAX_NAME = 253
_HASH_LENGTH = 10
_FAILURE_REASON = "SliceConfigFailed"


class SliceCompute(StrEnum):
    """Whether a slice also gets a share of the GPU's SMs (``CUDA_DEVICE_SM_LIMIT``)."""

    # Memory is capped, compute is time-sliced by the driver: what KAI does.
    NONE = "none"
    # The SM share follows the memory share (rounded up to a whole percent).
    PROPORTIONAL = "proportional"


def config_map_name(pod: str) -> str:
    """The ConfigMap of the pod named ``pod``: its name and a suffix, shortened with a hash past 253 characters."""
    name = pod + contract.SLICE_CONFIGMAP_SUFFIX
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(pod.encode()).hexdigest()[:_HASH_LENGTH]
    keep = _MAX_NAME - len(contract.SLICE_CONFIGMAP_SUFFIX) - _HASH_LENGTH - 1
    return f"{pod[:keep].rstrip('.-')}-{digest}{contract.SLICE_CONFIGMAP_SUFFIX}"


def _percent(share: float) -> int:
    return max(1, min(100, math.ceil(share * 100 - 1e-9)))


def slice_environment(bind: Bind, node: Node, compute: SliceCompute = SliceCompute.NONE) -> dict[str, str]:
    """The variables of a slice bind on ``node``; ValueError when the bind does not fit the node's GPUs.

    ``GPUWARDEN_GPU_FRACTION`` is the share of the device (of the largest
    share, for a slice on several GPUs of unequal size), for programs that
    size themselves, as a fraction's users expect, whichever way the slice was asked.
    """
    slices = bind.gpu_memory_mib
    if slices is None:
        raise ValueError("a whole-GPU bind has no slice")
    if len(slices) != len(bind.gpu_indices) or not slices:
        raise ValueError(f"{len(slices)} GPU memory slices for {len(bind.gpu_indices)} GPUs")
    by_index = {gpu.index: gpu for gpu in node.gpus}
    uuids: list[str] = []
    shares: list[float] = []
    for index, mib in zip(bind.gpu_indices, slices, strict=True):
        gpu = by_index.get(index)
        if gpu is None:
            raise ValueError(f"node {node.name!r} has no GPU {index}")
        if not gpu.uuid:
            raise ValueError(f"GPU {index} of node {node.name!r} has no UUID yet (no GPUNode published)")
        uuids.append(gpu.uuid)
        shares.append(mib / gpu.memory_mib if gpu.memory_mib > 0 else 1.0)
    env = {contract.ENV_NVIDIA_VISIBLE_DEVICES: ",".join(uuids)}
    if len(slices) == 1:
        env[contract.ENV_CUDA_DEVICE_MEMORY_LIMIT] = f"{slices[0]}m"
    else:
        for position, mib in enumerate(slices):
            env[f"{contract.ENV_CUDA_DEVICE_MEMORY_LIMIT}_{position}"] = f"{mib}m"
    share = max(shares)
    if compute is SliceCompute.PROPORTIONAL:
        env[contract.ENV_CUDA_DEVICE_SM_LIMIT] = str(_percent(share))
    env[contract.ENV_GPU_FRACTION] = f"{min(share, 1.0):.4g}"
    return env


def config_map_body(bind: Bind, env: Mapping[str, str], holder: str | None = None) -> JSON:
    """The ConfigMap, owned by the pod (its UID), so it goes when the pod goes.

    ``holder`` names the replica that wrote it, for the lease fence's
    admission policy (:mod:`.fence`).
    """
    metadata: JSON = {
        "name": config_map_name(bind.pod),
        "namespace": bind.namespace,
        "labels": {"app.kubernetes.io/managed-by": contract.SCHEDULER_COMPONENT},
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": bind.pod, "uid": bind.uid, "controller": True}],
    }
    if holder:
        metadata["annotations"] = {contract.ANNOTATION_LEASE_HOLDER: holder}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": dict(env)}


@dataclass(frozen=True, slots=True)
class SliceConfigWriter:
    """The binder's pre-bind step for slice pods: write the ConfigMap, or say why it could not be written."""

    api: KubeApi
    compute: SliceCompute = SliceCompute.NONE
    # The fence's token of the term writing it (see :mod:`.fence`), read at each write.
    holder: Callable[[], str | None] | None = None

    def prepare(self, bind: Bind, node: Node) -> str | None:
        """None when the pod may be bound (a whole-GPU bind needs nothing); else why not."""
        if bind.gpu_memory_mib is None:
            return None
        try:
            problem = self._write(bind, node)
        except ApiError as err:
            problem = f"cannot write its GPU slice ConfigMap {config_map_name(bind.pod)}: {err}"
        if problem is not None:
            self._explain(bind, problem)
        return problem

    def _write(self, bind: Bind, node: Node) -> str | None:
        if not bind.uid:
            return "its UID is unknown, and its GPU slice ConfigMap must be owned by it"
        try:
            env = slice_environment(bind, node, self.compute)
        except ValueError as err:
            return f"GPU slice: {err}"
        body = config_map_body(bind, env, self.holder() if self.holder is not None else None)
        name = body["metadata"]["name"]
        try:
            self.api.create_config_map(bind.namespace, body)
            return None
        except ApiError as err:
            if err.status != 409:
                raise
        # Left by an earlier attempt for this pod (its owner is this pod's UID):
        # rewritten whole. The test makes the write conditional on that owner.
        try:
            self.api.json_patch_config_map(
                bind.namespace,
                name,
                [
                    {"op": "test", "path": "/metadata/ownerReferences/0/uid", "value": bind.uid},
                    {"op": "replace", "path": "/data", "value": body["data"]},
                    # The ConfigMap is this pod's own: its annotations are only the fence's.
                    {"op": "add", "path": "/metadata/annotations", "value": body["metadata"].get("annotations", {})},
                ],
            )
        except ApiError as err:
            # 422: the test failed (another owner, or none); 404: deleted meanwhile, next cycle creates it.
            if err.status == 422:
                return f"ConfigMap {bind.namespace}/{name} exists and is not this pod's; remove or rename it"
            raise
        return None

    def _explain(self, bind: Bind, problem: str) -> None:
        """A Warning Event on the pod, where `kubectl describe pod` shows it; one per distinct problem."""
        digest = hashlib.sha256(f"{bind.uid}/{problem}".encode()).hexdigest()[:12]
        body: JSON = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{bind.pod[:200]}.{digest}", "namespace": bind.namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": bind.pod, "namespace": bind.namespace},
            "reason": _FAILURE_REASON,
            "message": f"not bound to {bind.node}: {problem}; placed again next cycle"[:1024],
            "type": "Warning",
            "source": {"component": contract.SCHEDULER_COMPONENT},
            "reportingComponent": contract.SCHEDULER_COMPONENT,
            "count": 1,
        }
        if bind.uid:
            body["involvedObject"]["uid"] = bind.uid
        try:
            self.api.create_event(bind.namespace, body)
        except ApiError as err:
            if err.status != 409:  # 409: this problem was explained already
                log.warning("slice_config_event_failed", namespace=bind.namespace, pod=bind.pod, error=str(err))
        log.warning("slice_config_failed", namespace=bind.namespace, pod=bind.pod, node=bind.node, problem=problem)
