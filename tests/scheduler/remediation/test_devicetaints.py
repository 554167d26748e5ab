"""Which DeviceTaintRules the quarantined GPUs call for, on the driver's own shapes (remediation.devicetaints)."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from gpuwarden import contract
from gpuwarden.contract import Action
from gpuwarden.dra import Device, devices_by_node
from scheduler.remediation.devicetaints import DeviceTaintReport, rule_name, taint_value, wanted_rules
from scheduler.remediation.model import NodeRecord, Scope, ScopeRecord, State, encode_record
from tests.scheduler.remediation.builders import T0, xid
from tests.scheduler.remediation.dra_objects import GPUS, driver_slice, gpunode_status

NODE = "gpu-node-a"


def _node(fenced: str | None, record: NodeRecord | None = None) -> dict[str, Any]:
    annotations: dict[str, str] = {}
    if fenced is not None:
        annotations[contract.ANNOTATION_QUARANTINED_GPUS] = fenced
    if record is not None:
        annotations[contract.ANNOTATION_REMEDIATION_STATE] = encode_record(record)
    return {"metadata": {"name": NODE, "annotations": annotations}}


def _gpunode() -> dict[str, Any]:
    return {"metadata": {"name": NODE}, "status": {"gpus": gpunode_status(GPUS)}}


def _slices(*slices: dict[str, Any]) -> dict[str, list[Device]]:
    return devices_by_node(slices)


def _xid_record(gpu: int, number: int) -> NodeRecord:
    fault = xid(number, gpu, Action.RESET_GPU)
    scope = ScopeRecord(
        scope=Scope.gpu(gpu),
        state=State.DRAINING,
        need=Action.RESET_GPU,
        fault=fault,
        gpus=(gpu,),
        started_at=T0,
        by="gpuwarden",
        why="xid",
        fenced_gpus=(gpu,),
    )
    return NodeRecord(scopes=(scope,))


def test_a_quarantined_gpu_taints_its_own_device_found_by_uuid_not_by_index() -> None:
    # GPU index 1 is the device node with minor 0: the driver names it gpu-0.
    record = _xid_record(1, 79)
    wanted = wanted_rules({NODE: _node("1", record)}, {NODE: _gpunode()}, _slices(driver_slice(NODE, "uid", GPUS)))
    (rule,) = wanted.values()
    body = rule.body()
    assert body["spec"] == {
        "deviceSelector": {"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-0"},
        "taint": {"key": "gpuwarden.io/quarantined", "value": "xid-79", "effect": "NoSchedule"},
    }
    assert body["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gpuwarden-scheduler"}
    assert body["metadata"]["annotations"] == {contract.ANNOTATION_DEVICE_TAINT_GPU: f"{NODE}/1"}
    assert body["metadata"]["name"] == rule.name == f"gpuwarden-quarantine-{NODE}.gpu-0"


def test_without_a_uuid_the_pci_address_finds_the_device_in_either_domain_form() -> None:
    gpunode = _gpunode()
    for entry in gpunode["status"]["gpus"]:
        entry["uuid"] = ""
    wanted = wanted_rules({NODE: _node("0")}, {NODE: gpunode}, _slices(driver_slice(NODE, "uid", GPUS)))
    assert [r.device.name for r in wanted.values()] == ["gpu-1"]
    assert [r.value for r in wanted.values()] == ["quarantined"]  # no record: no reason to name


def test_a_gpu_that_matches_no_device_gets_no_rule_and_is_reported() -> None:
    gpunode = _gpunode()
    gpunode["status"]["gpus"][0].update(uuid="GPU-other", pciBusId="00000000:99:00.0")
    report = DeviceTaintReport()
    wanted = wanted_rules({NODE: _node("0,1")}, {NODE: gpunode}, _slices(driver_slice(NODE, "uid", GPUS)), report)
    assert [r.device.name for r in wanted.values()] == ["gpu-0"]  # GPU 1 only
    assert report.unmatched == [f"{NODE}/0"]


def test_no_quarantine_no_driver_or_a_stale_pool_generation_means_no_rule() -> None:
    slices = _slices(driver_slice(NODE, "uid", GPUS))
    assert wanted_rules({NODE: _node(None)}, {NODE: _gpunode()}, slices) == {}
    assert wanted_rules({NODE: _node("0")}, {NODE: _gpunode()}, {}) == {}
    other = driver_slice(NODE, "uid", GPUS)
    other["spec"]["driver"] = "example.com/other"
    assert devices_by_node([other]) == {}
    # A slice of an older generation of the pool is stale: only the newest counts.
    old = driver_slice(NODE, "uid", GPUS, generation=1)
    new = driver_slice(NODE, "uid", GPUS[:1], generation=2)
    assert [d.name for d in devices_by_node([old, new])[NODE]] == ["gpu-1"]


def test_a_malformed_annotation_taints_every_gpu_as_placement_fences_them_all() -> None:
    wanted = wanted_rules({NODE: _node("1,x")}, {NODE: _gpunode()}, _slices(driver_slice(NODE, "uid", GPUS)))
    assert sorted(r.device.name for r in wanted.values()) == ["gpu-0", "gpu-1"]


def test_mig_devices_carved_from_a_quarantined_gpu_are_tainted_with_it() -> None:
    raw = driver_slice(NODE, "uid", GPUS)
    mig = copy.deepcopy(raw["spec"]["devices"][1])  # carved from gpu-0, i.e. GPU index 1
    mig["name"] = "gpu-0-mig-1g10gb-19-0"
    mig["attributes"]["type"] = {"string": "mig"}
    mig["attributes"]["parentUUID"] = {"string": GPUS[1].uuid}
    mig["attributes"]["uuid"] = {"string": "MIG-5c8e0f4a-0000-0000-0000-000000000000"}
    raw["spec"]["devices"].append(mig)
    wanted = wanted_rules({NODE: _node("1")}, {NODE: _gpunode()}, _slices(raw))
    assert sorted(r.device.name for r in wanted.values()) == ["gpu-0", "gpu-0-mig-1g10gb-19-0"]


def test_names_and_values_always_fit_what_the_api_server_accepts() -> None:
    long = Device("gpu.nvidia.com", "n" * 250, "gpu-0", "u")
    name = rule_name(long)
    assert (
        len(name) <= 253 and name[-1].isalnum() and name != rule_name(Device("gpu.nvidia.com", "n" * 249, "gpu-0", "u"))
    )
    assert rule_name(Device("gpu.nvidia.com", "Node_A", "gpu-0", "u")) == "gpuwarden-quarantine-node-a.gpu-0"
    assert taint_value("GpuXidError") == "GpuXidError"
    assert taint_value("row remap: failure!") == "row-remap-failure"
    assert taint_value("x" * 100) == "x" * 63
    assert taint_value("::") == "quarantined"


def test_without_a_gpunode_the_records_uuid_finds_the_device() -> None:
    record = _xid_record(1, 48)
    scope = record.scopes[0]
    fault = replace(scope.fault, gpu_uuid=GPUS[1].uuid)
    record = NodeRecord(scopes=(replace(scope, fault=fault),))
    wanted = wanted_rules({NODE: _node("1", record)}, {}, _slices(driver_slice(NODE, "uid", GPUS)))
    assert [(r.device.name, r.value) for r in wanted.values()] == [("gpu-0", "xid-48")]
