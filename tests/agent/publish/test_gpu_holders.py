"""The GPUNode's per-GPU holders: PodResources joined with the pods' identity, as pure status."""

from __future__ import annotations

from typing import Any

from agent.publish.gpunode import GpuHolders, gpunode_status
from agent.publish.pods import PodIdentity
from agent.samples import HeldDevices, PodResourcesFailure, PodResourcesSample
from gpuwarden import contract
from tests.agent.publish.reports import gpu_entity, report, xid_fault

UUID0 = gpu_entity(0).uuid or ""
UUID1 = gpu_entity(1).uuid or ""


def _read(*held: HeldDevices, allocatable: frozenset[str] | None = None) -> PodResourcesSample:
    return PodResourcesSample(held=held, listed=True, allocatable=allocatable)


def _gpu(status: dict[str, Any], index: int) -> dict[str, Any]:
    return next(g for g in status["gpus"] if g["index"] == index)


def test_without_a_socket_the_status_is_as_before() -> None:
    status = gpunode_status(report(gpus=2))
    assert contract.GPUNODE_POD_RESOURCES not in status
    assert all(contract.GPUNODE_GPU_PODS not in g for g in status["gpus"])


def test_each_gpu_lists_its_holders_with_uid_and_scheduler() -> None:
    sample = _read(
        HeldDevices("ml", "trainer-0", "trainer", "nvidia.com/gpu", (UUID0, UUID1)),
        HeldDevices("ml", "trainer-0", "trainer", "rdma/ib", ("mlx5_0",)),
        allocatable=frozenset({UUID0}),
    )
    pods = {("ml", "trainer-0"): PodIdentity("uid-1", "gpuwarden")}
    status = gpunode_status(report(gpus=3), holders=GpuHolders(sample, pods))
    holder = {
        "namespace": "ml",
        "name": "trainer-0",
        "container": "trainer",
        "resource": "nvidia.com/gpu",
        "uid": "uid-1",
        "schedulerName": "gpuwarden",
    }
    assert _gpu(status, 0)[contract.GPUNODE_GPU_PODS] == [holder]
    assert _gpu(status, 1)[contract.GPUNODE_GPU_PODS] == [holder]
    assert _gpu(status, 2)[contract.GPUNODE_GPU_PODS] == []
    assert [_gpu(status, i)[contract.GPUNODE_GPU_ALLOCATABLE] for i in range(3)] == [True, False, False]
    assert status[contract.GPUNODE_POD_RESOURCES] == {"ok": True}


def test_a_holder_the_api_server_did_not_name_has_no_uid() -> None:
    sample = _read(HeldDevices("ml", "p", "c", "nvidia.com/gpu", (UUID0,)))
    status = gpunode_status(report(gpus=1), holders=GpuHolders(sample, {}))
    assert _gpu(status, 0)[contract.GPUNODE_GPU_PODS] == [
        {"namespace": "ml", "name": "p", "container": "c", "resource": "nvidia.com/gpu"}
    ]
    # GetAllocatableResources said nothing: nothing is claimed about offering.
    assert contract.GPUNODE_GPU_ALLOCATABLE not in _gpu(status, 0)


def test_a_failed_read_keeps_the_holders_as_last_read_and_says_why() -> None:
    sample = _read(HeldDevices("ml", "p", "c", "nvidia.com/gpu", (UUID0,)), allocatable=frozenset({UUID0}))
    first = gpunode_status(report(gpus=2), holders=GpuHolders(sample, {}))
    failed = PodResourcesSample(failure=PodResourcesFailure.TIMEOUT, error="List: DEADLINE_EXCEEDED " + "x" * 5000)
    # The GPU's health changes meanwhile; its holders stay.
    second = gpunode_status(report(xid_fault(0), gpus=2), first, GpuHolders(failed))
    assert _gpu(second, 0)[contract.GPUNODE_GPU_PODS] == _gpu(first, 0)[contract.GPUNODE_GPU_PODS]
    assert _gpu(second, 0)[contract.GPUNODE_GPU_ALLOCATABLE] is True
    assert _gpu(second, 0)["healthy"] is False
    pr = second[contract.GPUNODE_POD_RESOURCES]
    assert pr["ok"] is False and pr["reason"] == "timeout" and len(pr["message"]) == 1024


def test_holders_stay_on_gpus_kept_while_nvml_is_down() -> None:
    sample = _read(HeldDevices("ml", "p", "c", "nvidia.com/gpu", (UUID1,)))
    first = gpunode_status(report(gpus=2), holders=GpuHolders(sample, {}))
    down = report(gpus=2, with_inventory=False, errors=("gpu: NVML failed to initialise",))
    second = gpunode_status(down, first, GpuHolders(sample, {}))
    assert second["gpuCount"] == 2
    assert _gpu(second, 1)[contract.GPUNODE_GPU_PODS][0]["name"] == "p"


def test_offered_stays_as_last_said_while_get_allocatable_fails() -> None:
    listed = (HeldDevices("ml", "p", "c", "nvidia.com/gpu", (UUID0,)),)
    first = gpunode_status(
        report(gpus=1), holders=GpuHolders(PodResourcesSample(held=listed, listed=True, allocatable=frozenset()))
    )
    assert _gpu(first, 0)[contract.GPUNODE_GPU_ALLOCATABLE] is False
    failing = PodResourcesSample(held=listed, listed=True, failure=PodResourcesFailure.TIMEOUT, error="timeout")
    second = gpunode_status(report(gpus=1), first, GpuHolders(failing))
    assert _gpu(second, 0)[contract.GPUNODE_GPU_ALLOCATABLE] is False
    # A kubelet that does not serve the call (no failure this read) never said it: nothing is claimed.
    unsaid = gpunode_status(report(gpus=1), holders=GpuHolders(PodResourcesSample(held=listed, listed=True)))
    assert contract.GPUNODE_GPU_ALLOCATABLE not in _gpu(unsaid, 0)
