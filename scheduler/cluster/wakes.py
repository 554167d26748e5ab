"""Which watched changes wake the scheduling loop at once, and which wait for the next cycle.

Every change reaches the cache's stores and its change log; what this module
decides is only *when* the loop runs for it. The loop runs "every second, or
sooner after a change" (:meth:`~scheduler.cluster.cache.ClusterCache.wait_for_change`),
and most changes in a busy cluster cannot change a decision: they echo the
scheduler's own bookkeeping (a PodGroup's or a Queue's status patched, a
derived PodGroup created) or report what the scheduler already assumes (the
echo of its own bind, a bound pod going from Pending to Running, a
condition the kubelet writes). Under steady
arrivals of 20 pods a second these quiet changes were more than half of the
events, and each one ran a full cycle: four to five cycles per pod, their
CPU taken from the API server on the same cores and their GIL time from the
binds of the pods that did need a cycle.

A quiet change is still applied and logged; the next cycle reads it, woken
by any other change, by the period (one second by default), or, when the
leader is idle, by the quiet changes themselves once it waited
``--quiet-settle`` (20 ms) and the first of them is as old: one cycle
folds a burst of them in, so the next arrival's cycle pays only for
itself. So a change wrongly judged quiet is acted on that much later (a
period later with ``--quiet-settle 0``), never missed; the predicates
below are conservative for that reason: whatever they do not name wakes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpuwarden.contract import ANNOTATION_GPU_ASSIGNMENT, ANNOTATION_LEASE_HOLDER
from scheduler.cluster.groups import managed_by_scheduler

JSON = Mapping[str, Any]

# Given the entry a store held (None for a new object) and the new entry: True if the change is quiet.
QuietChange = Callable[[JSON | None, JSON], bool]

# Fields of metadata that change with every write and mean nothing to scheduling.
_VOLATILE_META = frozenset({"resourceVersion", "generation"})
# What the kubelet (or a stand-in) writes once a bound pod starts.
_POD_STARTED = frozenset({"phase", "startTime"})
# What gpuwarden's Binding carries (:mod:`.bind`); the API server copies it onto the pod.
_BIND_ANNOTATIONS = frozenset({ANNOTATION_GPU_ASSIGNMENT, ANNOTATION_LEASE_HOLDER})
# Phases of a pod that holds nothing any more.
_ENDED = frozenset({"Succeeded", "Failed"})
# The condition the API server sets when it accepts a binding.
_SCHEDULED = "PodScheduled"


def _same_except(old: JSON, new: JSON, ignored: frozenset[str]) -> bool:
    """Whether two mappings are equal on every key outside ``ignored``."""
    keys = (old.keys() | new.keys()) - ignored
    return all(old.get(key) == new.get(key) for key in keys)


def _same_object_but_status(old: JSON, new: JSON) -> bool:
    """Everything outside ``status`` unchanged, the write counters aside."""
    if not _same_except(old.get("metadata") or {}, new.get("metadata") or {}, _VOLATILE_META):
        return False
    return _same_except(old, new, frozenset({"metadata", "status"}))


def never_wakes(old: JSON | None, new: JSON) -> bool:
    """Any change of a collection no cycle reads (remediation's DRA objects): it waits for the next view."""
    return True


def quiet_status_change(old: JSON | None, new: JSON) -> bool:
    """A status-only update of an object whose status the scheduler writes (Queues, PodGroups)."""
    return old is not None and _same_object_but_status(old, new)


def quiet_podgroup_change(old: JSON | None, new: JSON) -> bool:
    """A PodGroup's status-only update, or the arrival of a PodGroup the scheduler made for a derived group.

    The scheduler creates a derived group's PodGroup after it grouped, and
    usually placed, its pods: its appearance changes no grouping. A PodGroup
    a user or an operator creates (pods may wait for it) always wakes.
    """
    if old is None:
        return managed_by_scheduler(new)
    return _same_object_but_status(old, new)


def quiet_pod_change(old: JSON | None, new: JSON) -> bool:
    """A bound pod that started, the echo of gpuwarden's own bind, or a status change the engine does not read.

    Spec, metadata (labels, annotations, owners, deletion) and the kept
    status fields must be unchanged, except the phase going from Pending
    to Running on a pod already bound (the start time with it): the engine
    counts a bound pod's resources from its bind on. A bind echo
    (:func:`_bind_echo`) is quiet too.
    """
    if old is None:
        return False
    if not _same_object_but_status(old, new):
        return _bind_echo(old, new)
    old_status, new_status = old.get("status") or {}, new.get("status") or {}
    if old_status.get("phase") != new_status.get("phase"):
        started = old_status.get("phase") == "Pending" and new_status.get("phase") == "Running"
        if not started or not (new.get("spec") or {}).get("nodeName"):
            return False
        return _same_except(old_status, new_status, _POD_STARTED)
    return _same_except(old_status, new_status, frozenset({"startTime"}))


def _bind_echo(old: JSON, new: JSON) -> bool:
    """A pending pod bound by a gpuwarden replica, and nothing else changed.

    The scheduler shows each pod it bound as bound from the moment the API
    server accepts the binding (:mod:`.assumed`), so the watch's echo of the
    bind tells the next cycle nothing it does not already assume; under
    steady arrivals it was a second full cycle for every pod. The echo is
    recognised by what only gpuwarden's Binding writes: its lease-holder or
    GPU-assignment annotation, newly there. A bind by another scheduler
    (none of them writes these) wakes. A bind by another gpuwarden replica
    (an old leader's, refused by the fence once the Lease moved) is read
    by the next cycle at most one period later; a bind of its own to the
    same pod meanwhile would get a conflict, which the binder handles.
    """
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    if old_spec.get("nodeName") or not new_spec.get("nodeName"):
        return False
    if not _same_except(old_spec, new_spec, frozenset({"nodeName"})):
        return False
    if not _same_except(old, new, frozenset({"metadata", "spec", "status"})):
        return False
    old_meta, new_meta = old.get("metadata") or {}, new.get("metadata") or {}
    if not _same_except(old_meta, new_meta, _VOLATILE_META | {"annotations"}):
        return False
    old_notes, new_notes = old_meta.get("annotations") or {}, new_meta.get("annotations") or {}
    if not any(key in new_notes and key not in old_notes for key in _BIND_ANNOTATIONS):
        return False
    if not _same_except(old_notes, new_notes, _BIND_ANNOTATIONS):
        return False
    old_status, new_status = old.get("status") or {}, new.get("status") or {}
    if not _same_except(old_status, new_status, frozenset({"conditions"})):
        return False
    return _unscheduled_conditions(old_status) == _unscheduled_conditions(new_status)


def _unscheduled_conditions(status: JSON) -> list[Any]:
    """The conditions other than PodScheduled (which the API server sets with the bind)."""
    return [c for c in status.get("conditions") or () if not (isinstance(c, dict) and c.get("type") == _SCHEDULED)]


def pod_frees_room(old: JSON | None, new: JSON) -> bool:
    """A bound pod that ended (Succeeded or Failed), and nothing else changed: it frees room and says nothing else.

    Room matters only to work that waits for it. The cache treats this
    change as quiet while the scheduling loop says that no cycle waits for
    room (:attr:`~scheduler.cluster.cache.ClusterCache.room_wanted`); what
    else reads the end of a pod (the group's final status, a drain's
    progress) is bookkeeping that the next cycle, at most one period later,
    does.
    """
    if old is None or not _same_object_but_status(old, new) or not (old.get("spec") or {}).get("nodeName"):
        return False
    old_status, new_status = old.get("status") or {}, new.get("status") or {}
    if old_status.get("phase") in _ENDED or new_status.get("phase") not in _ENDED:
        return False
    return _same_except(old_status, new_status, frozenset({"phase"}))
