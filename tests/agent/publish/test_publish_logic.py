"""Publisher logic that needs no API server: GPUNode content, capacity, conditions, Events."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import cast

import pytest

from agent.model import Entity, Fault
from agent.publish.capacity import capacity_from_node, desired_gpu_memory_mib, published_from_node
from agent.publish.events import EventsPublisher, aggregation_key, event_name
from agent.publish.gpunode import GpuNodePublisher, faults_from_gpunode, gpunode_status
from gpuwarden.contract import Action, ConditionType, Reason
from gpuwarden.kube import JSON, ApiError, KubeApi
from tests.agent.publish.reports import GPU_MIB, T0, app_xid_event, ib_fault, remap_fault, report, xid_fault


def test_gpunode_status_summarises_gpus_ports_and_node_faults() -> None:
    mount = Fault(
        ConditionType.STORAGE_DEGRADED,
        Reason.MOUNT_HUNG,
        "mount /mnt/shared: statvfs did not answer in 5 s",
        Action.REBOOT,
        Entity.mount_point("/mnt/shared"),
        T0,
    )
    status = gpunode_status(report(xid_fault(1), ib_fault("mlx5_0", 1), mount))
    assert (status["gpuCount"], status["healthyGpuCount"]) == (8, 7)
    assert (status["gpuMemoryMiB"], status["healthyGpuMemoryMiB"]) == (8 * GPU_MIB, 7 * GPU_MIB)
    assert status["action"] == "REPLACE"
    assert status["nodeFaults"] == [
        {
            "condition": "StorageDegraded",
            "reason": "MountHung",
            "message": "mount /mnt/shared: statvfs did not answer in 5 s",
            "action": "REBOOT",
            "since": "2026-11-29T10:00:00Z",
            "latched": False,
            "mount": "/mnt/shared",
        }
    ]
    # Memory in use is not part of it: it changes every poll.
    assert "memoryUsedMiB" not in status["gpus"][0]


def test_gpunode_keeps_inventory_while_its_probe_fails() -> None:
    before = gpunode_status(report(xid_fault(1)))
    during = gpunode_status(report(errors=("gpu: NVML failed to initialise",), with_inventory=False), before)
    assert during["gpus"] == before["gpus"]
    assert during["ibPorts"] == []  # the IB probe did not fail: no ports is the truth
    assert during["probeErrors"] == ["gpu: NVML failed to initialise"]


def test_capacity_keeps_its_value_while_the_gpu_probe_fails() -> None:
    assert desired_gpu_memory_mib(report(xid_fault(0)), None) == 7 * GPU_MIB
    failed = report(errors=("gpu: NVML failed to initialise",), with_inventory=False)
    assert desired_gpu_memory_mib(failed, 7 * GPU_MIB) == 7 * GPU_MIB
    assert capacity_from_node({"status": {"capacity": {"gpuwarden.io/gpu-memory": "652472"}}}) == 652472
    assert capacity_from_node({"status": {"capacity": {"gpuwarden.io/gpu-memory": "lots"}}}) is None
    # The API server's canonical spellings of what the agent wrote.
    for text, mib in (("1k", 1000), ("2M", 2_000_000), ("653k", 653_000), ("1Ki", 1024), ("1e3", 1000)):
        assert capacity_from_node({"status": {"capacity": {"gpuwarden.io/gpu-memory": text}}}) == mib
    # An extended resource is a whole number: a fraction is malformed, not rounded.
    assert capacity_from_node({"status": {"capacity": {"gpuwarden.io/gpu-memory": "1500m"}}}) is None
    assert capacity_from_node({}) is None


def test_capacity_counts_as_published_only_while_allocatable_agrees() -> None:
    key = "gpuwarden.io/gpu-memory"
    assert published_from_node({"status": {"capacity": {key: "652472"}, "allocatable": {key: "652472"}}}) == 652472
    # Allocatable rewritten (or missing) alone: the agent's value is not on the Node.
    assert published_from_node({"status": {"capacity": {key: "652472"}, "allocatable": {key: "0"}}}) is None
    assert published_from_node({"status": {"capacity": {key: "652472"}}}) is None
    assert published_from_node({}) is None


def test_malformed_gpunode_entries_are_skipped_not_fatal() -> None:
    good = gpunode_status(report(xid_fault(2), remap_fault(3)))
    good["gpus"].append({"index": "nine"})
    good["gpus"][2]["faults"].append({"condition": "NotACondition", "reason": "x", "since": "2026-11-29T10:00:00Z"})
    good["nodeFaults"].append({"condition": "GpuMissing", "reason": "GpuCountMismatch", "since": "yesterday"})
    faults = faults_from_gpunode({"metadata": {"name": "n"}, "status": good})
    assert sorted(f.reason for f in faults) == ["RowRemapPending", "Xid79"]


def test_queued_events_coalesce_and_names_are_stable() -> None:
    pub = EventsPublisher(api=None, node_name="gpu-a")  # type: ignore[arg-type]  # no request is made here
    event = app_xid_event(0, 13)
    pub.enqueue([event, event, replace(event, time=T0 + timedelta(seconds=5))])
    pub.enqueue([app_xid_event(1, 13)])
    assert pub.pending() == 2
    key = aggregation_key(event)
    assert event_name("gpu-a", key) == event_name("gpu-a", aggregation_key(replace(event, time=T0)))
    assert event_name("gpu-a", key) != event_name("gpu-a", aggregation_key(app_xid_event(1, 13)))
    assert len(event_name("n" * 253, key)) <= 253


def test_one_xid_worded_by_either_source_is_one_event() -> None:
    """NVML's event text and the kernel log's line differ; the occurrence is one."""
    pub = EventsPublisher(api=None, node_name="gpu-a")  # type: ignore[arg-type]  # no request is made here
    from_nvml = app_xid_event(0, 13)
    from_kmsg = replace(from_nvml, message=from_nvml.message + " (pid=4242, name=python, Ch 00000008)")
    pub.enqueue([from_nvml, from_kmsg])
    assert pub.pending() == 1
    assert aggregation_key(from_nvml) == aggregation_key(from_kmsg)
    assert aggregation_key(from_nvml) != aggregation_key(app_xid_event(0, 31))


class _NoGpuNodeCrd:
    """The API server without the GPUNode CRD: its paths answer a plain-text 404."""

    def __init__(self, existing: JSON | None = None) -> None:
        self.existing = existing

    def get_gpunode(self, name: str) -> JSON | None:
        return None  # KubeApi reads any 404 as "absent"

    def create_gpunode(self, body: JSON) -> JSON:
        raise ApiError("create_gpunode", 404, "404 page not found")

    def patch_gpunode_status(self, name: str, patch: JSON) -> JSON:
        raise ApiError("patch_gpunode_status", 404, "404 page not found")


def _crd_missing_error(pub: GpuNodePublisher) -> ApiError:
    with pytest.raises(ApiError) as caught:
        pub.publish(report(xid_fault(1)))
    return caught.value


def test_a_missing_gpunode_crd_is_named_with_how_to_install_it() -> None:
    pub = GpuNodePublisher(cast(KubeApi, _NoGpuNodeCrd()), "n")
    error = _crd_missing_error(pub)
    assert error.status == 404
    assert "GPUNode CRD" in str(error) and "kubectl apply -k manifests/" in str(error)
    # Deleted while the agent ran: the status patch of a known object says so too.
    pub.restore({"metadata": {"name": "n"}, "status": {}})
    error = _crd_missing_error(pub)
    assert "GPUNode CRD" in str(error) and "kubectl apply -k manifests/" in str(error)
