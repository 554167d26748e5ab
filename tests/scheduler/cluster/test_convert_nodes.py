"""Node + GPUNode to engine Node, against what the agent itself publishes."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.contract import TAINT_QUARANTINE, Action, ConditionType
from scheduler.cluster.convert import node_from_objects
from scheduler.engine.health import judge
from scheduler.engine.model import Taint, TaintEffect
from tests.scheduler.cluster.objects import (
    GPU_MIB,
    gpunode_json,
    kmsg_xid_fault,
    node_json,
    report,
    xid_fault,
)


def _condition(node: Any, ctype: ConditionType) -> Any:
    (found,) = [c for c in node.conditions if c.type == ctype.value]
    return found


def test_a_healthy_agent_node_gives_every_gpu_with_its_identity() -> None:
    rep = report("n1")
    node = node_from_objects(node_json("n1", rep, pool="h100", cpu="127500m", memory="1031000Mi"), gpunode_json(rep))
    assert node.name == "n1"
    assert node.pool == "h100"
    assert node.cpu_milli == 127500
    assert node.memory_mib == 1031000
    assert [g.index for g in node.gpus] == list(range(8))
    assert all(g.healthy and not g.mig_enabled and g.memory_mib == GPU_MIB for g in node.gpus)
    assert node.gpus[3].uuid == "GPU-n1-0003"
    assert node.schedulable
    assert {c.type for c in node.conditions} == {t.value for t in ConditionType}
    assert not any(c.status for c in node.conditions)
    verdict = judge(node)
    assert verdict.node_fatal is None and verdict.bad_gpus == {} and verdict.degraded == ()


def test_a_gpu_the_agent_marks_unhealthy_is_unhealthy_in_the_engine() -> None:
    rep = report("n1", xid_fault("n1", 2, xid=48, action=Action.RESET_GPU))
    node = node_from_objects(node_json("n1", rep), gpunode_json(rep))
    assert [g.index for g in node.gpus if not g.healthy] == [2]
    cond = _condition(node, ConditionType.GPU_XID_ERROR)
    assert cond.status and cond.reason == "Xid48"
    assert cond.action is Action.RESET_GPU
    assert cond.gpu_indices == (2,)
    verdict = judge(node)
    assert verdict.node_fatal is None
    assert set(verdict.bad_gpus) == {2}


def test_a_fatal_xid_naming_gpu_2_with_reboot_takes_the_node() -> None:
    rep = report("n1", xid_fault("n1", 2, xid=79, action=Action.REBOOT))
    node = node_from_objects(node_json("n1", rep), gpunode_json(rep))
    cond = _condition(node, ConditionType.GPU_XID_ERROR)
    assert cond.gpu_indices == (2,)
    assert cond.action is Action.REBOOT
    assert judge(node).node_fatal is not None


def test_mixed_actions_on_several_gpus_give_the_worst_and_every_index() -> None:
    rep = report("n1", xid_fault("n1", 1, 48, Action.RESET_GPU), xid_fault("n1", 6, 79, Action.REBOOT))
    node = node_from_objects(node_json("n1", rep), gpunode_json(rep))
    cond = _condition(node, ConditionType.GPU_XID_ERROR)
    assert "[RESET_GPU]" in cond.message
    assert cond.action is Action.REBOOT
    assert cond.gpu_indices == (1, 6)


def test_a_message_that_lists_only_some_gpus_is_completed_from_the_gpunode() -> None:
    faults = [xid_fault("n1", i, 48, Action.RESET_GPU) for i in (0, 2, 3, 5, 7)]
    rep = report("n1", *faults)
    node_obj = node_json("n1", rep)
    assert "and 1 more" in _condition(node_from_objects(node_obj, None), ConditionType.GPU_XID_ERROR).message
    with_gpunode = node_from_objects(node_obj, gpunode_json(rep))
    assert _condition(with_gpunode, ConditionType.GPU_XID_ERROR).gpu_indices == (0, 2, 3, 5, 7)
    # Without the GPUNode the unnamed GPU is unknown: the whole node is out.
    alone = node_from_objects(node_obj, None)
    assert _condition(alone, ConditionType.GPU_XID_ERROR).gpu_indices == ()
    assert judge(alone).node_fatal is not None


def test_a_gpu_known_only_by_bus_id_is_found_through_the_gpunode() -> None:
    rep = report("n1", kmsg_xid_fault("0000:1a:00.0"))
    node = node_from_objects(node_json("n1", rep), gpunode_json(report("n1")))
    assert _condition(node, ConditionType.GPU_XID_ERROR).gpu_indices == (2,)
    unknown = node_from_objects(node_json("n1", report("n1", kmsg_xid_fault("0000:99:00.0"))), gpunode_json(rep))
    assert _condition(unknown, ConditionType.GPU_XID_ERROR).gpu_indices == ()


def test_without_a_gpunode_gpus_come_from_the_device_plugin() -> None:
    node = node_from_objects(node_json("n1", gpus=4), None)
    assert [(g.index, g.memory_mib, g.healthy) for g in node.gpus] == [(i, 81920, True) for i in range(4)]
    labelled = node_from_objects(node_json("n1", gpus=2, labels={"nvidia.com/gpu.memory": "40960"}), None)
    assert [g.memory_mib for g in labelled.gpus] == [40960, 40960]
    cpu_only = node_from_objects(node_json("c1", gpus=0), None)
    assert cpu_only.gpus == ()


def test_mig_gpus_are_marked_and_unknown_mig_mode_is_not_mig() -> None:
    mig = report("n1", mig=True)
    assert all(g.mig_enabled for g in node_from_objects(node_json("n1", mig), gpunode_json(mig)).gpus)
    unknown = report("n1", mig=None)
    assert not any(g.mig_enabled for g in node_from_objects(node_json("n1", unknown), gpunode_json(unknown)).gpus)


def test_cordoned_not_ready_and_tainted_nodes() -> None:
    assert not node_from_objects(node_json("n1", unschedulable=True), None).schedulable
    assert not node_from_objects(node_json("n1", ready="False"), None).schedulable
    assert not node_from_objects(node_json("n1", ready="Unknown"), None).schedulable
    assert not node_from_objects(node_json("n1", ready=None), None).schedulable
    taints = [
        {"key": TAINT_QUARANTINE, "value": "gpu", "effect": "NoSchedule"},
        {"key": "soft", "effect": "PreferNoSchedule"},
        {"key": "odd", "effect": "Sometimes"},
    ]
    node = node_from_objects(node_json("n1", taints=taints), None)
    assert node.schedulable
    assert node.taints == (
        Taint(TAINT_QUARANTINE, "gpu", TaintEffect.NO_SCHEDULE),
        Taint("soft", "", TaintEffect.PREFER_NO_SCHEDULE),
        Taint("odd", "", TaintEffect.NO_SCHEDULE),
    )


def test_malformed_fields_are_read_conservatively() -> None:
    rep = report("n1")
    gpunode = gpunode_json(rep)
    gpus = gpunode["status"]["gpus"]
    gpus[0]["healthy"] = "yes"
    gpus[1]["memoryMiB"] = "lots"
    gpus[2]["migMode"] = "Sideways"
    gpus[3]["index"] = "three"
    gpus.append(dict(gpus[4]))
    obj = node_json("n1", rep, cpu="many")
    obj["status"]["conditions"].append({"type": "GpuNvlinkDegraded", "status": "Maybe", "message": "?"})
    node = node_from_objects(obj, gpunode)
    assert node.cpu_milli == 0
    by_index = {g.index: g for g in node.gpus}
    assert sorted(by_index) == [0, 1, 2, 4, 5, 6, 7]
    assert not by_index[0].healthy
    assert not by_index[1].healthy
    assert by_index[2].mig_enabled
    odd = [c for c in node.conditions if c.type == "GpuNvlinkDegraded" and c.status]
    assert odd and odd[0].action is Action.NONE


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
_keys = ["metadata", "spec", "status", "labels", "name", "allocatable", "conditions", "taints", "gpus", "cpu"]


def _mangle(obj: Any, data: st.DataObject) -> Any:
    """Replace random fields of a real object with random JSON."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if data.draw(st.integers(0, 9)) == 0:
                continue
            out[k] = data.draw(_json) if data.draw(st.integers(0, 6)) == 0 else _mangle(v, data)
        return out
    if isinstance(obj, list):
        return [_mangle(v, data) for v in obj]
    return obj


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_any_mangled_node_and_gpunode_convert_without_raising(data: st.DataObject) -> None:
    rep = report("n1", xid_fault("n1", 2, 48, Action.RESET_GPU))
    node = node_from_objects(_mangle(node_json("n1", rep), data), _mangle(gpunode_json(rep), data))
    judge(node)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(_keys), _json, max_size=5), st.one_of(st.none(), _json))
def test_random_json_converts_without_raising(node: dict[str, Any], gpunode: Any) -> None:
    node_from_objects(node, gpunode if isinstance(gpunode, dict) else None)
