"""NVIDIA's DRA driver's health taints as remediation faults (scheduler/remediation/driverhealth.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.contract import Action, ConditionType, Reason
from gpuwarden.dra import Device, Taint, devices_by_node
from gpuwarden.xid_catalogue import XID_CATALOGUE, XidKind
from scheduler.remediation.controller import observe
from scheduler.remediation.driverhealth import TAINT_GPU_LOST, TAINT_XID, DriverTaints, driver_faults
from scheduler.remediation.model import NodeRecord
from scheduler.remediation.observations import GpuIdentity
from tests.scheduler.remediation.dra_objects import GPUS, driver_slice, gpunode_status

UUID0, UUID1 = GPUS[0].uuid, GPUS[1].uuid
KNOWN = (GpuIdentity(0, UUID0), GpuIdentity(1, UUID1))
ADDED = "2026-12-01T10:00:00Z"


def _device(name: str, uuid: str, *taints: Taint, parent: str = "") -> Device:
    return Device(
        "gpu.nvidia.com", "node-a", name, uuid, kind="mig" if parent else "gpu", parent_uuid=parent, taints=taints
    )


def _xid(xid: int, effect: str = "NoSchedule") -> Taint:
    return Taint(TAINT_XID, str(xid), effect, time_added=ADDED)


def test_a_fatal_xid_taint_is_a_fault_of_the_gpu_with_that_uuid_and_the_catalogue_s_action() -> None:
    # GPU index 1 is the device gpu-0 (minor and index differ): the UUID decides.
    (fault,) = driver_faults([_device("gpu-0", UUID1, _xid(79))], KNOWN)
    assert (fault.condition, fault.reason, fault.action) == (ConditionType.GPU_XID_ERROR, "Xid79", Action.REBOOT)
    assert (fault.gpu_index, fault.gpu_uuid, fault.xid) == (1, UUID1, 79)
    assert fault.since == datetime(2026, 12, 1, 10, tzinfo=UTC).timestamp()
    assert "NVIDIA's DRA driver tainted device gpu-0" in fault.message and "fallen off the bus" in fault.message
    (reset,) = driver_faults([_device("gpu-1", UUID0, _xid(48))], KNOWN)
    assert (reset.gpu_index, reset.action) == (0, Action.RESET_GPU)


def test_an_xid_the_driver_took_out_but_the_catalogue_calls_an_application_s_is_a_reset() -> None:
    (fault,) = driver_faults([_device("gpu-1", UUID0, _xid(8))], KNOWN)
    assert fault.action is Action.RESET_GPU
    assert "application" in fault.message
    (unknown,) = driver_faults([_device("gpu-1", UUID0, _xid(4242))], KNOWN)
    assert unknown.action is Action.RESET_GPU and "not in the catalogue" in unknown.message


def test_taints_that_take_nothing_out_are_not_faults() -> None:
    devices = [
        _device("gpu-1", UUID0, _xid(13, "None")),  # the driver's skipped application XIDs
        _device("gpu-0", UUID1, Taint("gpu.nvidia.com/unmonitored", "", "None")),
        _device("gpu-0", UUID1, Taint(TAINT_XID, "not-a-number", "NoSchedule")),
        _device("gpu-0", UUID1, Taint("example.com/other", "x", "NoSchedule")),
        # A rule's taint (gpuwarden's own quarantine, someone's maintenance) is not the driver's health report.
        _device("gpu-0", UUID1, Taint(TAINT_XID, "79", "NoSchedule", rule="someone")),
    ]
    assert driver_faults(devices, KNOWN) == ()


def test_a_lost_gpu_is_gpu_missing_and_a_reboot() -> None:
    (fault,) = driver_faults(
        [_device("gpu-1", UUID0, Taint(TAINT_GPU_LOST, "", "NoSchedule", time_added=ADDED))], KNOWN
    )
    assert (fault.condition, fault.reason, fault.action, fault.gpu_index) == (
        ConditionType.GPU_MISSING,
        Reason.GPU_LOST,
        Action.REBOOT,
        0,
    )


def test_a_mig_device_s_taint_is_its_parent_gpu_s_fault_and_one_gpu_has_one_fault_per_kind() -> None:
    devices = [
        _device("gpu-1", UUID0, _xid(48)),
        _device("gpu-1-mig-1g10gb-0", "MIG-aaaa", _xid(48), parent=UUID0),
        _device("gpu-1-mig-1g10gb-1", "MIG-bbbb", _xid(79), parent=UUID0),
    ]
    faults = driver_faults(devices, KNOWN)
    assert sorted((f.gpu_index, f.reason) for f in faults) == [(0, "Xid48"), (0, "Xid79")]


def test_a_device_of_no_known_gpu_is_left_out_and_without_uuids_the_minor_is_the_index() -> None:
    assert driver_faults([_device("gpu-5", "GPU-unknown", _xid(48))], KNOWN) == ()
    # No GPUNode (a DRA-only node): the claim stage counts GPUs by minor, and so does this.
    (fault,) = driver_faults([_device("gpu-5", "GPU-unknown", _xid(48))], ())
    assert fault.gpu_index == 5
    assert driver_faults([_device("gpu-x", "GPU-unknown", _xid(48))], ()) == ()


def test_a_taint_without_its_time_is_an_old_one() -> None:
    (fault,) = driver_faults([_device("gpu-1", UUID0, Taint(TAINT_XID, "48", "NoSchedule"))], KNOWN)
    assert fault.since == 0.0


def _node(name: str = "node-a", conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": "uid-a", "resourceVersion": "1", "labels": {}},
        "spec": {},
        "status": {
            "capacity": {"nvidia.com/gpu": "2"},
            "allocatable": {"nvidia.com/gpu": "2"},
            "conditions": [{"type": "Ready", "status": "True"}, *(conditions or [])],
        },
    }


def _gpunode(name: str = "node-a") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": "1"}, "status": {"gpus": gpunode_status(GPUS)}}


def test_observe_adds_the_driver_s_faults_and_counts_one_the_agent_reports_too_once() -> None:
    condition = {
        "type": "GpuXidError",
        "status": "True",
        "reason": "Xid48",
        "message": "GPU 0: XID 48 (hardware), double-bit ECC error in GPU memory. Recommended action: RESET_GPU.",
    }
    tainted = [_device("gpu-1", UUID0, _xid(48)), _device("gpu-0", UUID1, _xid(79))]
    obs = observe(_node(conditions=[condition]), _gpunode(), [], NodeRecord(), blocked={}, driver=tainted)
    assert sorted((f.gpu_index, f.reason) for f in obs.faults) == [(0, "Xid48"), (1, "Xid79")]
    agent = next(f for f in obs.faults if f.gpu_index == 0)
    assert "DRA driver" not in agent.message  # the agent's own report is the one kept


def _slice(node: str, taints: dict[int, dict[str, Any]], version: str, generation: int = 1) -> dict[str, Any]:
    body = driver_slice(node, f"uid-{node}", GPUS, generation)
    body["metadata"].update({"name": f"{node}-slice-{generation}", "resourceVersion": version})
    for i, taint in taints.items():
        body["spec"]["devices"][i]["taints"] = [taint]
    return body


def test_driver_taints_follow_the_slices_and_parse_only_those_that_changed(monkeypatch: Any) -> None:
    parsed: list[int] = []
    real = devices_by_node

    def counting(slices: Any, *args: Any) -> Any:
        items = list(slices)
        parsed.append(len(items))
        return real(items, *args)

    monkeypatch.setattr("scheduler.remediation.driverhealth.devices_by_node", counting)
    xid = {"key": TAINT_XID, "value": "48", "effect": "NoSchedule", "timeAdded": ADDED}
    slices = {f"n{i}": _slice(f"n{i}", {}, "1") for i in range(50)}
    taints = DriverTaints()
    assert taints.update(slices) == {}
    assert parsed == [50]
    assert taints.update(slices) == {} and parsed == [50]  # nothing changed: nothing parsed

    slices["n7"] = _slice("n7", {1: xid}, "2")
    found = taints.update(slices)
    assert parsed == [50, 1]
    assert list(found) == ["n7"] and [d.name for d in found["n7"]] == ["gpu-0"]
    # A newer generation of the pool replaces the old one; the old slice lingers a moment.
    slices["n7-new"] = _slice("n7", {}, "3", generation=2)
    assert taints.update(slices) == {}
    del slices["n7-new"], slices["n7"]
    assert taints.update(slices) == {}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 1),
            st.sampled_from([TAINT_XID, TAINT_GPU_LOST, "gpu.nvidia.com/unmonitored"]),
            st.sampled_from([*sorted(XID_CATALOGUE), 4242]),
            st.sampled_from(["NoSchedule", "NoExecute", "None"]),
        ),
        max_size=6,
    )
)
def test_every_fault_is_of_a_known_gpu_repairs_it_and_comes_from_a_taint_that_takes_it_out(
    taints: list[tuple[int, str, int, str]],
) -> None:
    devices = [
        _device(f"gpu-{i}", uuid, *[Taint(k, str(x), e, time_added=ADDED) for j, k, x, e in taints if j == i])
        for i, uuid in enumerate((UUID0, UUID1))
    ]
    faults = driver_faults(devices, KNOWN)
    assert len({f.key for f in faults}) == len(faults)
    for fault in faults:
        assert fault.action in {Action.RESET_GPU, Action.REBOOT, Action.REPLACE}
        index = fault.gpu_index
        assert index in (0, 1)
        outs = [(k, x) for j, k, x, e in taints if j == index and e != "None"]
        if fault.xid is not None:
            assert (TAINT_XID, fault.xid) in outs
            info = XID_CATALOGUE.get(fault.xid)
            if info is not None and info.kind is XidKind.HARDWARE and info.action is not Action.RESTART_APP:
                assert fault.action is info.action
        else:
            assert any(k == TAINT_GPU_LOST for k, _ in outs)
