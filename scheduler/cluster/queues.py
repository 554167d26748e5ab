"""Queue and PodGroup custom objects to the engine's plain data.

Pure functions over the JSON the API server returns (dicts, lists, numbers,
strings), so they are tested without a cluster and the watch cache can call
them on every event. A problem comes back as a sentence naming the object
and the field (``queue vision: spec.resources.gpu.quota: must not be
negative, got -1``) rather than as an exception: one bad object is reported
on its own status and the rest of the tree is still scheduled.

The CRDs' schemas refuse most bad objects already; these checks stay because
objects also come from other places (a stored object written before a schema
tightened, a hand-made snapshot) and because a value the schema cannot bound
(a quantity string's size) still has to be.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from gpuwarden.contract import (
    DEFAULT_NODE_POOL,
    PODGROUP_SPEC_MIN_MEMBER,
    PODGROUP_SPEC_PREEMPTIBILITY,
    PODGROUP_SPEC_PRIORITY_CLASS_NAME,
    PODGROUP_SPEC_QUEUE,
    QUEUE_RESOURCE_CPU,
    QUEUE_RESOURCE_GPU,
    QUEUE_RESOURCE_LIMIT,
    QUEUE_RESOURCE_MEMORY,
    QUEUE_RESOURCE_OVER_QUOTA_WEIGHT,
    QUEUE_RESOURCE_QUOTA,
    QUEUE_SPEC_NODE_POOL,
    QUEUE_SPEC_PARENT,
    QUEUE_SPEC_PRIORITY,
    QUEUE_SPEC_RESOURCES,
    Preemptibility,
)
from scheduler.cluster.quantity import mebibytes, milli_gpus, millicores
from scheduler.engine.model import UNGOVERNED, UNLIMITED, Queue, QueueResource

# The CRDs' bounds (manifests/scheduler/crds/crd-*.yaml).
MAX_PRIORITY = 1_000_000
MAX_WEIGHT = 1_000_000
MAX_MIN_MEMBER = 1_000_000

_AMOUNT: dict[str, Callable[[object], int | str]] = {
    QUEUE_RESOURCE_GPU: milli_gpus,
    QUEUE_RESOURCE_CPU: millicores,
    QUEUE_RESOURCE_MEMORY: mebibytes,
}
_RESOURCE_KEYS = frozenset({QUEUE_RESOURCE_QUOTA, QUEUE_RESOURCE_LIMIT, QUEUE_RESOURCE_OVER_QUOTA_WEIGHT})


class PodGroupSpec(NamedTuple):
    """A PodGroup's spec in engine terms; ``preemptible`` None follows the priority."""

    min_member: int
    queue: str
    priority_class_name: str | None
    preemptible: bool | None


class _InvalidError(Exception):
    """A field that does not parse; caught in this module, never raised out of it."""


def _name(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if not isinstance(name, str) or not name:
        raise _InvalidError("metadata.name: missing")
    return name


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise _InvalidError("spec: missing" if spec is None else f"spec: expected an object, got {spec!r}")
    return spec


def _string(data: Mapping[str, Any], key: str, where: str) -> str | None:
    value = data.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise _InvalidError(f"{where}.{key}: expected a string, got {value!r}")
    return value


def _integer(data: Mapping[str, Any], key: str, where: str, default: int, *, low: int, high: int) -> int:
    value = data.get(key, default)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _InvalidError(f"{where}.{key}: expected a whole number, got {value!r}")
    if not low <= value <= high:
        raise _InvalidError(f"{where}.{key}: must be between {low} and {high}, got {value}")
    return value


def _resource(kind: str, setting: object, where: str) -> QueueResource:
    if not isinstance(setting, Mapping):
        raise _InvalidError(f"{where}: expected an object, got {setting!r}")
    unknown = sorted(set(setting) - _RESOURCE_KEYS)
    if unknown:
        raise _InvalidError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(_RESOURCE_KEYS))})")
    amount = _AMOUNT[kind]

    def bound(key: str, default: int) -> int:
        if setting.get(key) is None:
            return default
        parsed = amount(setting[key])
        if isinstance(parsed, str):
            raise _InvalidError(f"{where}.{key}: {parsed}")
        return parsed

    quota = bound(QUEUE_RESOURCE_QUOTA, 0)
    limit = bound(QUEUE_RESOURCE_LIMIT, UNLIMITED)
    if limit != UNLIMITED and limit < quota:
        raise _InvalidError(
            f"{where}: limit {setting[QUEUE_RESOURCE_LIMIT]!r} is below quota {setting[QUEUE_RESOURCE_QUOTA]!r}"
        )
    weight = setting.get(QUEUE_RESOURCE_OVER_QUOTA_WEIGHT, 1.0)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight):
        raise _InvalidError(f"{where}.{QUEUE_RESOURCE_OVER_QUOTA_WEIGHT}: expected a finite number, got {weight!r}")
    if not 0 <= weight <= MAX_WEIGHT:
        raise _InvalidError(
            f"{where}.{QUEUE_RESOURCE_OVER_QUOTA_WEIGHT}: must be between 0 and {MAX_WEIGHT}, got {weight!r}"
        )
    return QueueResource(quota, limit, float(weight))


def queue_from_object(obj: Mapping[str, Any]) -> Queue | str:
    """The engine's Queue for a Queue custom object, or what is wrong with it.

    A resource the object does not name under ``spec.resources`` is not
    governed (:data:`~scheduler.engine.model.UNGOVERNED`); a named one
    without ``quota`` has a quota of 0, without ``limit`` no limit.
    """
    try:
        name = _name(obj)
    except _InvalidError as problem:
        return f"queue object: {problem}"
    try:
        spec = _spec(obj)
        priority = _integer(spec, QUEUE_SPEC_PRIORITY, "spec", 0, low=-MAX_PRIORITY, high=MAX_PRIORITY)
        parent = _string(spec, QUEUE_SPEC_PARENT, "spec")
        pool = _string(spec, QUEUE_SPEC_NODE_POOL, "spec") or DEFAULT_NODE_POOL
        resources = spec.get(QUEUE_SPEC_RESOURCES) or {}
        where = f"spec.{QUEUE_SPEC_RESOURCES}"
        if not isinstance(resources, Mapping):
            raise _InvalidError(f"{where}: expected an object, got {resources!r}")
        unknown = sorted(set(resources) - set(_AMOUNT))
        if unknown:
            raise _InvalidError(f"{where}: unknown resource {unknown[0]!r} (known: gpu, cpu, memory)")
        parsed = {
            kind: UNGOVERNED if resources.get(kind) is None else _resource(kind, resources[kind], f"{where}.{kind}")
            for kind in _AMOUNT
        }
    except _InvalidError as problem:
        return f"queue {name}: {problem}"
    return Queue(
        name=name,
        parent=parent,
        priority=priority,
        node_pool=pool,
        gpu=parsed[QUEUE_RESOURCE_GPU],
        cpu=parsed[QUEUE_RESOURCE_CPU],
        memory=parsed[QUEUE_RESOURCE_MEMORY],
    )


def podgroup_spec(obj: Mapping[str, Any]) -> PodGroupSpec | str:
    """A PodGroup's (min_member, queue, priority_class_name, preemptible), or what is wrong with it."""
    try:
        name = _name(obj)
    except _InvalidError as problem:
        return f"pod group object: {problem}"
    namespace = obj["metadata"].get("namespace")
    label = f"{namespace}/{name}" if isinstance(namespace, str) and namespace else name
    try:
        spec = _spec(obj)
        min_member = _integer(spec, PODGROUP_SPEC_MIN_MEMBER, "spec", 1, low=1, high=MAX_MIN_MEMBER)
        queue = _string(spec, PODGROUP_SPEC_QUEUE, "spec")
        if queue is None:
            raise _InvalidError(f"spec.{PODGROUP_SPEC_QUEUE}: missing")
        priority_class = _string(spec, PODGROUP_SPEC_PRIORITY_CLASS_NAME, "spec")
        raw = spec.get(PODGROUP_SPEC_PREEMPTIBILITY)
        if raw is None or raw == "":
            preemptible = None
        elif raw == Preemptibility.PREEMPTIBLE:
            preemptible = True
        elif raw == Preemptibility.NON_PREEMPTIBLE:
            preemptible = False
        else:
            choices = " or ".join(repr(p.value) for p in Preemptibility)
            raise _InvalidError(f"spec.{PODGROUP_SPEC_PREEMPTIBILITY}: must be {choices}, got {raw!r}")
    except _InvalidError as problem:
        return f"pod group {label}: {problem}"
    return PodGroupSpec(min_member, queue, priority_class, preemptible)
