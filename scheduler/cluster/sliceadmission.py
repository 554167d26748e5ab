"""What a GPU slice pod must carry to obey its slice: one definition for the webhook and the scheduler.

A slice is enforced on the node only through what the pod's spec carries:
the ``envFrom`` of its slice ConfigMap in every container (the GPUs it may
see and its memory limit, :mod:`scheduler.cluster.sliceconfig`) and the
runtime class that preloads HAMi-core. The admission webhook writes both
when the pod is created; nothing can add them later (a pod's containers and
runtime class are immutable). A pod the webhook never saw -- annotated as a
slice after creation (updates do not reach it), or created in a namespace
the webhook excludes -- would run on the whole GPU if it were bound as a
slice. So the webhook injects exactly :func:`missing_injection`, and the
scheduler refuses to place a slice pod for which it is not empty
(:func:`refusal`): the two cannot drift apart.

The same holds for a container that sets one of the slice's variables
itself (``env`` wins over ``envFrom``): the webhook denies such a pod, and
the scheduler, which may meet one the webhook never saw, refuses it.

A refused pod's group says why in its ``Unschedulable`` condition and Event
(reason ``SliceNotAdmitted``, like any pending group); the pod itself gets a
Warning Event with the same words (:class:`RefusalEvents`), where
``kubectl describe pod`` shows it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuwarden import contract
from gpuwarden.kube import JSON, ApiError, KubeApi
from gpuwarden.logconfig import get_logger
from scheduler.cluster.sliceconfig import config_map_name
from scheduler.engine.model import Task

log = get_logger(__name__)

# The runtime class that runs HAMi-core; the webhook's --runtime-class and the scheduler's agree by default.
DEFAULT_RUNTIME_CLASS = contract.SLICE_RUNTIME_CLASS

# The annotations that make a pod a GPU-sharing pod, ours and KAI's.
SHARING_ANNOTATIONS = (
    contract.ANNOTATION_GPU_FRACTION,
    contract.ANNOTATION_GPU_MEMORY,
    contract.ANNOTATION_GPU_FRACTION_NUM_DEVICES,
    contract.ANNOTATION_KAI_GPU_FRACTION,
    contract.ANNOTATION_KAI_GPU_MEMORY,
    contract.ANNOTATION_KAI_GPU_FRACTION_NUM_DEVICES,
)

# Variables of the slice ConfigMap: a container setting one itself would escape its slice.
RESERVED_ENV = (
    contract.ENV_NVIDIA_VISIBLE_DEVICES,
    contract.ENV_CUDA_DEVICE_MEMORY_LIMIT,
    contract.ENV_CUDA_DEVICE_SM_LIMIT,
)

# What to do about a slice pod that lacks what the webhook injects.
FIX = (
    "only the admission webhook gives a slice pod these, when the pod is created: delete the pod and create it "
    "again with its GPU-sharing annotation (annotations added or changed afterwards never reach the webhook), "
    "in a namespace the webhook serves (kube-system and gpuwarden are excluded and cannot run GPU slices)"
)


def has_sharing_annotation(annotations: object) -> bool:
    """Whether ``annotations`` (a pod's) name a GPU slice, in gpuwarden's or KAI's spelling."""
    return isinstance(annotations, Mapping) and any(k in annotations for k in SHARING_ANNOTATIONS)


def _cel_list(keys: Sequence[str]) -> str:
    return "[" + ", ".join(f"'{k}'" for k in keys) + "]"


def sharing_changed_expression(keys: Sequence[str] = SHARING_ANNOTATIONS) -> str:
    """The CEL list of sharing annotations an update sets, removes or changes: the shipped policy's rule.

    ``variables.old`` and ``variables.new`` are the pod's annotations before
    and after (an empty map when it has none); the update is allowed when
    the list is empty (manifests/scheduler/gpu-sharing-policy.yaml).
    """
    return (
        f"{_cel_list(keys)}.filter(k, (k in variables.new) != (k in variables.old) "
        "|| ((k in variables.new) && variables.new[k] != variables.old[k]))"
    )


_RESERVED_NAMES = frozenset(RESERVED_ENV)
_RESERVED_PREFIXES = tuple(f"{v}_" for v in RESERVED_ENV)


def reserved(name: object) -> bool:
    """Whether ``name`` is a variable the slice ConfigMap sets (its per-device forms included).

    Asked of every env entry of every pod the cache stores, so one set
    lookup and one prefix test.
    """
    return isinstance(name, str) and (name in _RESERVED_NAMES or name.startswith(_RESERVED_PREFIXES))


def containers(spec: Mapping[str, Any]) -> list[tuple[str, int, Mapping[str, Any]]]:
    """Every init container and container of a pod spec, with the key and index that locate it."""
    out: list[tuple[str, int, Mapping[str, Any]]] = []
    for key in ("initContainers", "containers"):
        items = spec.get(key)
        if isinstance(items, list):
            out.extend((key, i, c) for i, c in enumerate(items) if isinstance(c, dict))
    return out


def slice_env_source(pod_name: str) -> JSON:
    """The ``envFrom`` entry of the pod's slice ConfigMap, required: no container starts before it exists."""
    return {"configMapRef": {"name": config_map_name(pod_name), "optional": False}}


def _obeys(source: object, config_map: str) -> bool:
    """An ``envFrom`` entry that brings the slice's variables unrenamed and is not optional."""
    if not isinstance(source, dict) or source.get("prefix"):
        return False
    ref = source.get("configMapRef")
    return isinstance(ref, dict) and ref.get("name") == config_map and ref.get("optional") is not True


@dataclass(frozen=True, slots=True)
class Gap:
    """One thing a slice pod lacks: the JSON patch operation that supplies it, and what it is in words."""

    op: JSON
    what: str


def missing_injection(pod: Mapping[str, Any], name: str, runtime_class: str | None) -> list[Gap]:
    """What the webhook adds to the slice pod ``pod`` (named ``name``); empty when it carries it all.

    Every container and init container needs the ``envFrom`` of the pod's
    slice ConfigMap (added last, so that it wins over other sources with the
    same keys); the pod needs a runtime class when one is configured, and
    one it names itself is kept.
    """
    spec = pod.get("spec") or {}
    gaps: list[Gap] = []
    ref = slice_env_source(name)
    config_map = ref["configMapRef"]["name"]
    for key, index, container in containers(spec):
        sources = container.get("envFrom")
        what = f"container {container.get('name')!r} has no envFrom of its slice ConfigMap {config_map}"
        if not isinstance(sources, list):
            gaps.append(Gap({"op": "add", "path": f"/spec/{key}/{index}/envFrom", "value": [ref]}, what))
        elif not any(_obeys(s, config_map) for s in sources):
            gaps.append(Gap({"op": "add", "path": f"/spec/{key}/{index}/envFrom/-", "value": ref}, what))
    if runtime_class and not spec.get("runtimeClassName"):
        gaps.append(
            Gap(
                {"op": "add", "path": "/spec/runtimeClassName", "value": runtime_class},
                f"the pod has no runtimeClassName (the webhook sets {runtime_class}, the runtime that enforces it)",
            )
        )
    return gaps


def escaping_container(spec: Mapping[str, Any]) -> str | None:
    """Why a container would escape its slice by setting one of its variables in ``env``; None when none does."""
    for _key, _index, container in containers(spec):
        for var in container.get("env") or ():
            name = var.get("name") if isinstance(var, dict) else None
            if reserved(name):
                return (
                    f"container {container.get('name')!r} sets {name}, which the scheduler sets for a GPU slice "
                    "(its devices and memory limit); remove it from env"
                )
    return None


def kept_env(env: object) -> list[Any] | None:
    """Of a container's ``env``, the entries :func:`escaping_container` reads; None when there are none.

    The scheduler's cache keeps only these (:mod:`scheduler.cluster.slim`):
    the rest of a container's environment is no business of scheduling.
    """
    if not isinstance(env, list):
        return None
    kept = [v for v in env if isinstance(v, dict) and reserved(v.get("name"))]
    return kept or None


@dataclass(frozen=True, slots=True)
class SliceAdmission:
    """What the scheduler expects a slice pod to carry; ``runtime_class`` is the webhook's (None: it sets none)."""

    runtime_class: str | None = DEFAULT_RUNTIME_CLASS

    def refusal(self, pod: Mapping[str, Any]) -> str | None:
        """Why the slice pod ``pod`` must not be placed, with how to fix it; None when it may be."""
        spec = pod.get("spec") or {}
        meta = pod.get("metadata") or {}
        escape = escaping_container(spec)
        if escape is not None:
            return f"it would not obey its GPU slice: {escape}"
        gaps = missing_injection(pod, str(meta.get("name") or ""), self.runtime_class)
        if not gaps:
            return None
        return f"it would not obey its GPU slice and see whole GPUs: {_joined([g.what for g in gaps])}; {FIX}"


def _joined(parts: Sequence[str]) -> str:
    if len(parts) <= 3:
        return "; ".join(parts)
    return "; ".join([*parts[:3], f"and {len(parts) - 3} more"])


@dataclass(slots=True)
class RefusalEvents:
    """Warning Events on refused slice pods: one per pod and distinct reason, not one per cycle.

    What was explained is remembered for as long as the pod stays refused,
    so a steady cluster costs no requests; the Event's name follows from the
    pod's UID and the reason, so a restarted scheduler that explains again
    is answered 409 and writes nothing new.
    """

    api: KubeApi
    _explained: set[tuple[str, str]] = field(default_factory=set)

    def explain(self, tasks: Iterable[Task]) -> int:
        """Explain each refused pending task not explained yet; the number of Events written."""
        now: set[tuple[str, str]] = set()
        written = 0
        for task in tasks:
            if not task.refusal:
                continue
            key = (task.uid or f"{task.namespace}/{task.name}", task.refusal)
            now.add(key)
            if key in self._explained:
                continue
            if self._write(task, key):
                written += 1
                self._explained.add(key)
        self._explained &= now
        return written

    def _write(self, task: Task, key: tuple[str, str]) -> bool:
        digest = hashlib.sha256("/".join(key).encode()).hexdigest()[:12]
        body: JSON = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{task.name[:200]}.{digest}", "namespace": task.namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": task.name, "namespace": task.namespace},
            "reason": contract.UnschedulableReason.SLICE_NOT_ADMITTED.value,
            "message": f"not scheduled: {task.refusal}"[:1024],
            "type": "Warning",
            "source": {"component": contract.SCHEDULER_COMPONENT},
            "reportingComponent": contract.SCHEDULER_COMPONENT,
            "count": 1,
        }
        if task.uid:
            body["involvedObject"]["uid"] = task.uid
        try:
            self.api.create_event(task.namespace, body)
        except ApiError as err:
            if err.status != 409:  # 409: explained already (by this replica before a restart, or the other)
                log.warning("slice_refusal_event_failed", namespace=task.namespace, pod=task.name, error=str(err))
                return False
        log.warning("slice_pod_refused", namespace=task.namespace, pod=task.name, refusal=task.refusal)
        return True
