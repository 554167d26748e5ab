"""One AdmissionReview of a pod: allowed as is, allowed with a patch, or denied with a reason.

Validation is the engine's: the pod is read by the same converter the
scheduler uses (:func:`~scheduler.cluster.convert.task_from_pod`) and its
GPU request by the same parser (:func:`~scheduler.engine.resources.parse_gpu_request`),
so whatever the webhook admits the engine reads the same way, and whatever
it refuses the engine would have left pending with the same message. On top
of that, what only a cluster-wide view can tell: a MiB slice larger than
the largest GPU there is can never be placed; and what would defeat the
slice: a container that sets the variables the slice's ConfigMap carries
(``env`` wins over ``envFrom``).

The mutation, for a slice pod only, is what :mod:`scheduler.cluster.sliceadmission`
says such a pod lacks (the scheduler refuses to place one that lacks any of
it, from the same definition): every container and init container gets
``envFrom`` the pod's slice ConfigMap (``optional: false``: the kubelet does
not start a container before the ConfigMap exists, that is, before the
scheduler placed it), and the pod gets the configured runtime class unless
it names one. The ConfigMap's name follows from the pod's, so a pod created
with ``generateName`` (a Job's) is given its final name here: the API server
generates names only after admission. Pods of other schedulers, and
gpuwarden pods without GPU-sharing annotations, pass untouched.
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuwarden import contract
from gpuwarden.kube import JSON
from scheduler.cluster.convert import task_from_pod
from scheduler.cluster.sliceadmission import (
    SHARING_ANNOTATIONS,
    escaping_container,
    has_sharing_annotation,
    missing_injection,
)
from scheduler.engine.resources import GpuRequest, parse_gpu_request

ALLOWED = (
    f"allowed: {contract.ANNOTATION_GPU_FRACTION} above 0 and at most 1 with at most "
    f"{contract.GPU_FRACTION_DECIMALS} decimal places, or {contract.ANNOTATION_GPU_MEMORY} in whole MiB up to "
    f"{contract.MAX_GPU_MEMORY_MIB} (one of the two, and no {contract.RESOURCE_NVIDIA_GPU} limit with it), "
    f"optionally {contract.ANNOTATION_GPU_FRACTION_NUM_DEVICES} from 1 to {contract.MAX_GPU_FRACTION_NUM_DEVICES} "
    "with either (KAI's gpu-fraction, gpu-memory and gpu-fraction-num-devices are read the same way)"
)
# What the API server's name generator draws from (no vowels: no words), and how much of generateName it keeps.
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_NAME_RANDOM = 5
_MAX_GENERATE_PREFIX = 58


@dataclass(frozen=True, slots=True)
class Verdict:
    """The answer for one pod: ``message`` says why it is denied; ``patch`` is RFC 6902, empty when unchanged."""

    allowed: bool
    message: str = ""
    patch: tuple[JSON, ...] = field(default_factory=tuple)


def _generated_name(prefix: str) -> str:
    return prefix[:_MAX_GENERATE_PREFIX] + "".join(secrets.choice(_NAME_ALPHABET) for _ in range(_NAME_RANDOM))


def _deny(problem: str) -> Verdict:
    return Verdict(False, f"gpuwarden: {problem}; {ALLOWED}")


def _check_slice(request: GpuRequest, largest_gpu_mib: int | None, pod: Mapping[str, Any]) -> str | None:
    if request.memory_mib is not None and largest_gpu_mib is not None and request.memory_mib > largest_gpu_mib:
        return (
            f"a GPU slice of {request.memory_mib} MiB is larger than the largest GPU in the cluster "
            f"({largest_gpu_mib} MiB), so it can never be placed; ask for at most {largest_gpu_mib} MiB"
        )
    return escaping_container(pod.get("spec") or {})


def _mutation(pod: Mapping[str, Any], runtime_class: str | None) -> list[JSON]:
    meta = pod.get("metadata") or {}
    ops: list[JSON] = []
    name = meta.get("name") or ""
    if not name:
        name = _generated_name(str(meta.get("generateName") or "pod-"))
        ops.append({"op": "add", "path": "/metadata/name", "value": name})
    ops.extend(gap.op for gap in missing_injection(pod, name, runtime_class))
    return ops


def review_pod(pod: Mapping[str, Any], *, largest_gpu_mib: int | None, runtime_class: str | None) -> Verdict:
    """The verdict on a pod being created (see the module docstring).

    ``largest_gpu_mib`` is None while the cluster's GPUs are not known (the
    watch not synced yet, or no GPU node at all): a MiB slice is then not
    bounded here, and the engine explains one that fits nowhere.
    """
    spec = pod.get("spec")
    if not isinstance(spec, dict) or spec.get("schedulerName") != contract.SCHEDULER_NAME:
        return Verdict(True)
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    if not has_sharing_annotation(annotations):
        return Verdict(True)
    task = task_from_pod(pod)
    request = parse_gpu_request(task.gpus, task.annotations)
    if isinstance(request, str):
        return _deny(request)
    if not request.is_slice:
        return Verdict(True)
    problem = _check_slice(request, largest_gpu_mib, pod)
    if problem is not None:
        return _deny(problem)
    return Verdict(True, patch=tuple(_mutation(pod, runtime_class)))


def review_response(review: Mapping[str, Any], verdict: Verdict) -> JSON:
    """The AdmissionReview (admission.k8s.io/v1) that answers ``review``."""
    request = review.get("request") or {}
    response: JSON = {"uid": request.get("uid", ""), "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {"code": 403, "reason": "Forbidden", "message": verdict.message}
    elif verdict.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(list(verdict.patch)).encode()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def answer(body: bytes, *, largest_gpu_mib: int | None, runtime_class: str | None) -> JSON:
    """The answer to one request body; a review that is not a pod CREATE is allowed unchanged.

    Raises ValueError when the body is not an AdmissionReview at all (the
    server answers 400).
    """
    review = json.loads(body)
    if not isinstance(review, dict) or not isinstance(review.get("request"), dict):
        raise ValueError("not an AdmissionReview with a request")
    request = review["request"]
    pod = request.get("object")
    kind = (request.get("kind") or {}).get("kind")
    if request.get("operation") != "CREATE" or kind != "Pod" or not isinstance(pod, dict):
        return review_response(review, Verdict(True))
    return review_response(review, review_pod(pod, largest_gpu_mib=largest_gpu_mib, runtime_class=runtime_class))


def sharing_annotations_expression(keys: Sequence[str] = SHARING_ANNOTATIONS) -> str:
    """The CEL matchCondition the webhook configuration uses: a gpuwarden pod with a GPU-sharing annotation."""
    listed = ", ".join(f"'{k}'" for k in keys)
    return (
        f"object.spec.schedulerName == '{contract.SCHEDULER_NAME}' && has(object.metadata.annotations) && "
        f"[{listed}].exists(k, k in object.metadata.annotations)"
    )
