"""Which watched changes wake the scheduling loop at once, and which wait for the next cycle.

Every change reaches the cache's stores and its change log; what this module
decides is only *when* the loop runs for it. The loop runs "every second, or
sooner after a change" (:meth:`~scheduler.cluster.cache.ClusterCache.wait_for_change`),
and most changes in a busy cluster cannot change a decision: they echo the
scheduler's own bookkeeping (a PodGroup's or a Queue's status patched, a
derived PodGroup created) or report what the scheduler already assumes (a
bound pod going from Pending to Running, a condition the kubelet writes). Under steady
arrivals of 20 pods a second these quiet changes were more than half of the
events, and each one ran a full cycle: four to five cycles per pod, their
CPU taken from the API server on the same cores and their GIL time from the
binds of the pods that did need a cycle.

A quiet change is still applied and logged; the next cycle reads it, woken
by any other change or by the period (one second by default). So a change
wrongly judged quiet costs at most one period of latency, never a missed
decision; the predicates below are conservative for that reason: whatever
they do not name wakes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from scheduler.cluster.groups import managed_by_scheduler

JSON = Mapping[str, Any]

# Given the entry a store held (None for a new object) and the new entry: True if the change is quiet.
QuietChange = Callable[[JSON | None, JSON], bool]

# Fields of metadata that change with every write and mean nothing to scheduling.
_VOLATILE_META = frozenset({"resourceVersion", "generation"})
# What the kubelet (or a stand-in) writes once a bound pod starts.
_POD_STARTED = frozenset({"phase", "startTime"})


def _same_except(old: JSON, new: JSON, ignored: frozenset[str]) -> bool:
    """Whether two mappings are equal on every key outside ``ignored``."""
    keys = (old.keys() | new.keys()) - ignored
    return all(old.get(key) == new.get(key) for key in keys)


def _same_object_but_status(old: JSON, new: JSON) -> bool:
    """Everything outside ``status`` unchanged, the write counters aside."""
    if not _same_except(old.get("metadata") or {}, new.get("metadata") or {}, _VOLATILE_META):
        return False
    return _same_except(old, new, frozenset({"metadata", "status"}))


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
    """A bound pod that started, or a pod whose status changed in ways the engine does not read.

    Spec, metadata (labels, annotations, owners, deletion) and the kept
    status fields must be unchanged, except the phase going from Pending
    to Running on a pod already bound (the start time with it): the engine
    counts a bound pod's resources from its bind on.
    """
    if old is None or not _same_object_but_status(old, new):
        return False
    old_status, new_status = old.get("status") or {}, new.get("status") or {}
    if old_status.get("phase") != new_status.get("phase"):
        started = old_status.get("phase") == "Pending" and new_status.get("phase") == "Running"
        if not started or not (new.get("spec") or {}).get("nodeName"):
            return False
        return _same_except(old_status, new_status, _POD_STARTED)
    return _same_except(old_status, new_status, frozenset({"startTime"}))
