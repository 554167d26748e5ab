"""Reading NVIDIA's DRA objects (gpuwarden.dra): devices, taints, rules and claims, malformed ones included."""

from __future__ import annotations

from typing import Any

from gpuwarden.dra import Taint, broad_rules, claim_holders, devices_by_node, pci_bus, rule_taints
from tests.scheduler.remediation.dra_objects import GPUS, driver_slice


def _rule(name: str, selector: dict[str, str], key: str = "k", effect: str = "NoSchedule") -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"deviceSelector": selector, "taint": {"key": key, "effect": effect}}}


def test_pci_addresses_in_nvml_and_kernel_form_compare_equal() -> None:
    assert pci_bus("00000000:2A:00.0") == pci_bus("0000:2a:00.0") == "0000:2a:00.0"
    assert pci_bus("2a:00.0") == "0000:2a:00.0"
    assert pci_bus("garbage") == "garbage"
    assert pci_bus("zz:2a:00.0") == "zz:2a:00.0"  # not hex: left as written, matching nothing else


def test_devices_with_the_drivers_taints_and_attributes_in_slice_order() -> None:
    raw = driver_slice("n", "uid", GPUS)
    raw["spec"]["devices"][1]["taints"] = [
        {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"},
        {"key": "no-effect"},  # unreadable: left out
    ]
    (first, second) = devices_by_node([raw])["n"]
    assert (first.name, first.kind, first.uuid, first.pci_bus) == ("gpu-1", "gpu", GPUS[0].uuid, "0000:18:00.0")
    assert first.taints == ()
    assert second.taints == (Taint("gpu.nvidia.com/xid", "79", "NoSchedule"),)
    assert second.taints[0].describe() == "gpu.nvidia.com/xid=79:NoSchedule"


def test_malformed_slices_and_devices_are_left_out_never_raise() -> None:
    good = driver_slice("n", "uid", GPUS[:1])
    broken: list[Any] = [
        {},
        {"spec": None},
        {"spec": {"driver": "gpu.nvidia.com", "nodeName": "n"}},  # no pool
        {"spec": {"driver": "gpu.nvidia.com", "nodeName": "m", "pool": {"name": "m"}, "devices": [None, {"name": 3}]}},
    ]
    assert {k: [d.name for d in v] for k, v in devices_by_node([*broken, good]).items()} == {"n": ["gpu-1"]}


def test_rules_naming_one_device_taint_it_and_broad_ones_are_named_apart() -> None:
    one = _rule("one", {"driver": "gpu.nvidia.com", "pool": "n", "device": "gpu-0"}, "gpuwarden.io/quarantined")
    pool = _rule("pool", {"driver": "gpu.nvidia.com", "pool": "n"})
    nothing: dict[str, Any] = {"metadata": {"name": "everything"}, "spec": {"taint": {"key": "k", "effect": "None"}}}
    taints = rule_taints([one, pool, nothing])
    assert taints == {("gpu.nvidia.com", "n", "gpu-0"): [Taint("gpuwarden.io/quarantined", "", "NoSchedule", "one")]}
    assert taints[("gpu.nvidia.com", "n", "gpu-0")][0].describe() == "gpuwarden.io/quarantined:NoSchedule (rule one)"
    assert broad_rules([one, pool, nothing]) == ["everything", "pool"]


def test_the_claims_holding_each_device_come_from_their_allocation() -> None:
    def claim(ns: str, name: str, *devices: str) -> dict[str, Any]:
        results = [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n", "device": d} for d in devices]
        return {
            "metadata": {"namespace": ns, "name": name},
            "status": {"allocation": {"devices": {"results": results}}},
        }

    pending = {"metadata": {"namespace": "a", "name": "pending"}, "status": {}}
    holders = claim_holders([claim("a", "x", "gpu-0"), claim("b", "y", "gpu-0", "gpu-1"), pending])
    assert holders == {("gpu.nvidia.com", "n", "gpu-0"): ["a/x", "b/y"], ("gpu.nvidia.com", "n", "gpu-1"): ["b/y"]}
