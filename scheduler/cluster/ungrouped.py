"""Pending pods that name a PodGroup the scheduler cannot use: told why on the pod itself.

A pod that names its group (annotation ``scheduling.gpuwarden.io/pod-group``)
waits until that PodGroup exists and reads: the group's spec says its queue
and gang size, and nothing may be guessed. With no PodGroup there is no
object whose status could explain the wait, so the explanation goes where
``kubectl describe pod`` and ``kubectl gpuwarden why`` look: the pod's
``PodScheduled`` condition (False, reason ``Unschedulable``, as
kube-scheduler writes it for a pod it cannot place) and a Warning Event on
the pod. Both are written when what they say changes, never merely because
a cycle ran.

When the PodGroup appears (or is fixed), the pod is grouped again and the
condition written here is removed before the cycle binds, so a pod that
still waits carries no stale reason (its group's status explains it from
then on) and a pod that binds gets the ``PodScheduled=True`` the binding
writes.
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from gpuwarden import contract
from gpuwarden.kube import JSON, ApiError, KubeApi
from gpuwarden.logconfig import get_logger
from scheduler.cluster.status import MAX_MESSAGE, format_time, now_utc

log = get_logger(__name__)

CONDITION_POD_SCHEDULED = "PodScheduled"
REASON_UNSCHEDULABLE = "Unschedulable"  # kube-scheduler's reason for a pod it cannot place
# Event reasons: the named PodGroup does not exist, or does not parse.
REASON_POD_GROUP_NOT_FOUND = "PodGroupNotFound"
REASON_POD_GROUP_INVALID = "PodGroupInvalid"


@dataclass(frozen=True, slots=True)
class UngroupedPod:
    """A pending pod of ours whose named PodGroup cannot be used, and why (reason, message)."""

    namespace: str
    name: str
    uid: str
    reason: str
    message: str


def missing_message(namespace: str, group: str) -> str:
    return (
        f"pod group {group} (annotation {contract.ANNOTATION_POD_GROUP}) does not exist in namespace "
        f"{namespace}; the pod waits until it is created (or remove the annotation to have a group "
        "derived from the pod's owners)"
    )


def invalid_message(problem: str) -> str:
    return f"the pod waits until its PodGroup is fixed: {problem}"


def event_name(pod: str, uid: str) -> str:
    """The pod's one Event for this news: stable across cycles and leaders, distinct per pod object."""
    digest = hashlib.sha256(f"{uid}\x1fungrouped".encode()).hexdigest()[:10]
    return f"{pod[:200]}.{digest}"


def _clip(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 1] + "…"


class UngroupedPodNotifier:
    """Writes the PodScheduled condition and Event of ungrouped pods, each only when it changed.

    One per scheduler; what it last told each pod (by UID) is its memory, so
    a new leader tells every ungrouped pod once.
    """

    def __init__(self, api: KubeApi, *, clock: Callable[[], datetime] = now_utc, instance: str | None = None) -> None:
        self._api = api
        self._clock = clock
        self._instance = instance or socket.gethostname()
        self._told: dict[str, tuple[UngroupedPod, bool]] = {}  # uid -> what it was told, whether its Event exists

    @property
    def told(self) -> int:
        """How many pods carry what this notifier wrote (0: a cycle with no ungrouped pod has nothing to do)."""
        return len(self._told)

    def write(self, pods: Iterable[UngroupedPod], still_pending: Callable[[str], bool]) -> int:
        """Tell ``pods`` why they wait; clear what was told to pods now grouped that still wait.

        ``still_pending(uid)`` says whether a pod told before is still a
        pending pod of the view (one that is gone or bound keeps whatever
        the API server wrote). Returns the API writes sent.
        """
        sent = 0
        now = {p.uid: p for p in pods}
        for uid in [u for u in self._told if u not in now]:
            told, _ = self._told[uid]
            if not still_pending(uid):
                del self._told[uid]
                continue
            cleared = self._clear(told)
            if cleared is not None:  # else tried again next cycle
                del self._told[uid]
                sent += cleared
        for uid, pod in sorted(now.items()):
            before = self._told.get(uid)
            if before is not None and before[0] == pod:
                continue
            sent += self._tell(pod, event_exists=before is not None and before[1])
        return sent

    def _tell(self, pod: UngroupedPod, *, event_exists: bool) -> int:
        stamp = format_time(self._clock())
        message = _clip(pod.message)
        condition = {
            "type": CONDITION_POD_SCHEDULED,
            "status": "False",
            "reason": REASON_UNSCHEDULABLE,
            "message": message,
            "lastTransitionTime": stamp,
        }
        try:
            self._api.patch_pod_status(pod.namespace, pod.name, {"status": {"conditions": [condition]}})
        except ApiError as err:
            if err.status != 404:  # 404: gone meanwhile; nothing to tell
                log.warning("ungrouped_pod_status_failed", pod=f"{pod.namespace}/{pod.name}", status=err.status)
            return 0
        sent = 1
        exists = event_exists
        try:
            if exists:
                self._api.patch_event(
                    pod.namespace,
                    event_name(pod.name, pod.uid),
                    {"reason": pod.reason, "message": message, "lastTimestamp": stamp},
                )
            else:
                try:
                    self._api.create_event(pod.namespace, self._event_body(pod, message, stamp))
                except ApiError as err:
                    if err.status != 409:
                        raise
                    # Written by an earlier leader: continue it.
                    self._api.patch_event(
                        pod.namespace,
                        event_name(pod.name, pod.uid),
                        {"reason": pod.reason, "message": message, "lastTimestamp": stamp},
                    )
            exists = True
            sent += 1
        except ApiError as err:
            # The condition holds the explanation; the Event is tried again when it changes.
            log.warning("ungrouped_pod_event_failed", pod=f"{pod.namespace}/{pod.name}", status=err.status)
            exists = False
        self._told[pod.uid] = (pod, exists)
        log.info("pod_waits_for_its_group", pod=f"{pod.namespace}/{pod.name}", reason=pod.reason)
        return sent

    def _clear(self, pod: UngroupedPod) -> int | None:
        """Remove the PodScheduled condition written here (the pod is grouped now); None if that failed."""
        patch = {"status": {"conditions": [{"type": CONDITION_POD_SCHEDULED, "$patch": "delete"}]}}
        try:
            self._api.patch_pod_status(pod.namespace, pod.name, patch)
        except ApiError as err:
            if err.status == 404:
                return 0
            log.warning("ungrouped_pod_clear_failed", pod=f"{pod.namespace}/{pod.name}", status=err.status)
            return None
        return 1

    def _event_body(self, pod: UngroupedPod, message: str, stamp: str) -> JSON:
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": event_name(pod.name, pod.uid), "namespace": pod.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod.name,
                "namespace": pod.namespace,
                "uid": pod.uid,
            },
            "type": "Warning",
            "reason": pod.reason,
            "message": message,
            "source": {"component": contract.SCHEDULER_COMPONENT},
            "reportingComponent": contract.SCHEDULER_COMPONENT,
            "reportingInstance": self._instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
