"""What the scheduler tells a pod that waits for its named PodGroup, and when it says nothing."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from gpuwarden.contract import ANNOTATION_POD_GROUP, SCHEDULER_NAME
from gpuwarden.kube import ApiError
from scheduler.cluster.cycle import ClusterView, SchedulingCycle
from scheduler.cluster.ungrouped import (
    REASON_POD_GROUP_INVALID,
    REASON_POD_GROUP_NOT_FOUND,
    UngroupedPod,
    UngroupedPodNotifier,
    invalid_message,
    missing_message,
)


class _Api:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.fail_status: int | None = None

    def patch_pod_status(self, namespace: str, name: str, patch: Any) -> Any:
        if self.fail_status is not None:
            raise ApiError("patch_pod_status", self.fail_status, "refused")
        self.calls.append(("status", name, patch))
        return {}

    def create_event(self, namespace: str, body: Any) -> Any:
        self.calls.append(("event", body["involvedObject"]["name"], body))
        return {}

    def patch_event(self, namespace: str, name: str, patch: Any) -> Any:
        self.calls.append(("event-patch", name, patch))
        return {}


def _notifier() -> tuple[_Api, UngroupedPodNotifier]:
    api = _Api()
    clock = datetime(2025, 1, 1, tzinfo=UTC)
    return api, UngroupedPodNotifier(api, clock=lambda: clock, instance="test")  # type: ignore[arg-type]


ORPHAN = UngroupedPod("ns", "p-0", "uid-0", REASON_POD_GROUP_NOT_FOUND, missing_message("ns", "later"))


def test_a_waiting_pod_is_told_once_and_again_only_when_the_reason_changes() -> None:
    api, notifier = _notifier()
    assert notifier.write([ORPHAN], lambda _uid: True) == 2
    (status, event) = api.calls
    condition = status[2]["status"]["conditions"][0]
    assert (condition["type"], condition["status"], condition["reason"]) == ("PodScheduled", "False", "Unschedulable")
    assert event[2]["reason"] == REASON_POD_GROUP_NOT_FOUND and event[2]["involvedObject"]["uid"] == "uid-0"
    assert notifier.write([ORPHAN], lambda _uid: True) == 0
    other = UngroupedPod("ns", "p-0", "uid-0", "PodGroupInvalid", "the pod waits until its PodGroup is fixed: x")
    assert notifier.write([other], lambda _uid: True) == 2
    assert api.calls[-1][0] == "event-patch"  # one Event per pod, continued


def test_a_grouped_pod_that_still_waits_is_cleared_and_a_bound_one_is_left_alone() -> None:
    api, notifier = _notifier()
    notifier.write([ORPHAN], lambda _uid: True)
    api.calls.clear()
    # Bound meanwhile: the binding's PodScheduled=True must stay.
    assert notifier.write([], lambda _uid: False) == 0 and api.calls == [] and notifier.told == 0
    notifier.write([ORPHAN], lambda _uid: True)
    api.calls.clear()
    api.fail_status = 500
    assert notifier.write([], lambda _uid: True) == 0 and notifier.told == 1  # tried again next cycle
    api.fail_status = None
    assert notifier.write([], lambda _uid: True) == 1
    assert api.calls == [("status", "p-0", {"status": {"conditions": [{"type": "PodScheduled", "$patch": "delete"}]}})]
    assert notifier.told == 0


def _pod(name: str, group: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "annotations": {ANNOTATION_POD_GROUP: group},
        },
        "spec": {"schedulerName": SCHEDULER_NAME, "containers": [{"name": "c"}]},
        "status": {"phase": "Pending"},
    }


@pytest.mark.parametrize("incremental", [True, False])
def test_a_pod_is_told_whether_its_group_is_missing_or_malformed(incremental: bool) -> None:
    # A PodGroup stored before its schema required a queue: it exists, and cannot be used.
    malformed = {"metadata": {"name": "old", "namespace": "ns", "uid": "g1"}, "spec": {"minMember": 1}}
    view = ClusterView(
        pods={"uid-a": _pod("a", "absent"), "uid-b": _pod("b", "old")}, podgroups={("ns", "old"): malformed}
    )
    cycle = SchedulingCycle(_Api(), incremental=incremental)  # type: ignore[arg-type]
    cycle.prepare(view, 0.0)
    told = {p.name: (p.reason, p.message) for p in cycle.grouper.ungrouped(view)}
    assert told == {
        "a": (REASON_POD_GROUP_NOT_FOUND, missing_message("ns", "absent")),
        "b": (REASON_POD_GROUP_INVALID, invalid_message("pod group ns/old: spec.queue: missing")),
    }
