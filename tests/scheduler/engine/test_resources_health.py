"""GPU request parsing and the fatal/degraded health policy."""

from __future__ import annotations

import pytest

from gpuwarden.contract import (
    ANNOTATION_GPU_FRACTION,
    ANNOTATION_GPU_FRACTION_NUM_DEVICES,
    ANNOTATION_GPU_MEMORY,
    ANNOTATION_KAI_GPU_FRACTION,
    ANNOTATION_KAI_GPU_MEMORY,
    Action,
    ConditionType,
    Reason,
)
from scheduler.engine.health import judge
from scheduler.engine.model import Gpu, Node, NodeCondition
from scheduler.engine.resources import GpuRequest, format_amount, parse_gpu_request


@pytest.mark.parametrize(
    ("whole", "annotations", "expected"),
    [
        (0, {}, GpuRequest()),
        (2, {}, GpuRequest(whole=2)),
        (0, {ANNOTATION_GPU_FRACTION: "0.5"}, GpuRequest(fraction=0.5)),
        (0, {ANNOTATION_KAI_GPU_FRACTION: "0.25"}, GpuRequest(fraction=0.25)),
        (0, {ANNOTATION_KAI_GPU_MEMORY: "2000"}, GpuRequest(memory_mib=2000)),
        (
            0,
            {ANNOTATION_GPU_MEMORY: "1000", ANNOTATION_GPU_FRACTION_NUM_DEVICES: "4"},
            GpuRequest(memory_mib=1000, devices=4),
        ),
        # gpuwarden's spelling wins over KAI's.
        (0, {ANNOTATION_GPU_FRACTION: "0.5", ANNOTATION_KAI_GPU_FRACTION: "0.1"}, GpuRequest(fraction=0.5)),
        (1, {"unrelated": "x"}, GpuRequest(whole=1)),
        # The bounds themselves are allowed.
        (0, {ANNOTATION_GPU_FRACTION: "0.001"}, GpuRequest(fraction=0.001)),
        (0, {ANNOTATION_GPU_FRACTION: " .5 "}, GpuRequest(fraction=0.5)),
        (0, {ANNOTATION_GPU_FRACTION: "1.000"}, GpuRequest(fraction=1.0)),
        (
            0,
            {ANNOTATION_GPU_MEMORY: "1048576", ANNOTATION_GPU_FRACTION_NUM_DEVICES: "64"},
            GpuRequest(memory_mib=1048576, devices=64),
        ),
    ],
)
def test_valid_requests(whole: int, annotations: dict[str, str], expected: GpuRequest) -> None:
    assert parse_gpu_request(whole, annotations) == expected


@pytest.mark.parametrize(
    ("whole", "annotations", "fragment"),
    [
        (0, {ANNOTATION_GPU_FRACTION: "abc"}, "is not a number"),
        (0, {ANNOTATION_GPU_FRACTION: "0"}, "must be above 0"),
        (0, {ANNOTATION_GPU_FRACTION: "1.5"}, "at most 1"),
        (0, {ANNOTATION_GPU_MEMORY: "-5"}, "at least 1 MiB"),
        (0, {ANNOTATION_GPU_MEMORY: "lots"}, "not a whole number of MiB"),
        (0, {ANNOTATION_GPU_FRACTION: "0.5", ANNOTATION_GPU_MEMORY: "10"}, "both set"),
        (1, {ANNOTATION_GPU_FRACTION: "0.5"}, "at once"),
        (0, {ANNOTATION_GPU_FRACTION_NUM_DEVICES: "2"}, "needs a GPU fraction"),
        (0, {ANNOTATION_GPU_FRACTION: "0.5", ANNOTATION_GPU_FRACTION_NUM_DEVICES: "0"}, "at least 1"),
        (0, {ANNOTATION_GPU_FRACTION: "0.5", ANNOTATION_GPU_FRACTION_NUM_DEVICES: "two"}, "not a whole number"),
        (-1, {}, "negative"),
        # Bounded in spelling and size: what a float or an int would take but no GPU means.
        (0, {ANNOTATION_GPU_FRACTION: "1e-300"}, "must be a plain decimal such as 0.25"),
        (0, {ANNOTATION_GPU_FRACTION: "0." + "0" * 4997 + "1"}, "(5000 characters) must be a plain decimal"),
        (0, {ANNOTATION_GPU_FRACTION: "0.0005"}, "more than 3 decimal places; the smallest slice is 0.001"),
        (0, {ANNOTATION_GPU_FRACTION: "nan"}, "is not a number"),
        (0, {ANNOTATION_GPU_FRACTION: "0.2_5"}, "must be a plain decimal"),
        (0, {ANNOTATION_GPU_MEMORY: "99999999999"}, "is more than any GPU holds (at most 1048576 MiB)"),
        (0, {ANNOTATION_GPU_MEMORY: "9" * 5000}, "(5000 characters) is more than any GPU holds"),
        (0, {ANNOTATION_GPU_MEMORY: "5_000"}, "not a whole number of MiB"),
        (0, {ANNOTATION_GPU_MEMORY: "1e3"}, "not a whole number of MiB"),
        (0, {ANNOTATION_GPU_MEMORY: "1024", ANNOTATION_GPU_FRACTION_NUM_DEVICES: "65"}, "at most 64"),
        (0, {ANNOTATION_GPU_MEMORY: "1024", ANNOTATION_GPU_FRACTION_NUM_DEVICES: "9" * 5000}, "at most 64"),
    ],
)
def test_invalid_requests_say_why(whole: int, annotations: dict[str, str], fragment: str) -> None:
    problem = parse_gpu_request(whole, annotations)
    assert isinstance(problem, str)
    assert fragment in problem


def test_slices_and_charges() -> None:
    half = GpuRequest(fraction=0.5, devices=2)
    assert half.slice_on(81920) == 40960
    assert half.milli_gpus(81920) == 1000
    assert GpuRequest(fraction=0.3).slice_on(10) == 3  # rounds down, never over-commits
    assert GpuRequest(memory_mib=20480).milli_gpus(81920) == 250
    assert GpuRequest(memory_mib=200000).milli_gpus(81920) == 1000  # at most one GPU per device
    assert GpuRequest(whole=3).milli_gpus(0) == 3000
    assert format_amount(0, 2500) == "2.5 GPUs" and format_amount(1, 1000) == "1 core"
    assert format_amount(2, 2048) == "2 GiB"


def _node(*conditions: NodeCondition, gpus: tuple[Gpu, ...] = (Gpu(0), Gpu(1)), draining: bool = False) -> Node:
    return Node("n", gpus=gpus, conditions=conditions, draining=draining)


def cond(
    kind: ConditionType, reason: str = "", action: Action = Action.NONE, gpus: tuple[int, ...] = ()
) -> NodeCondition:
    return NodeCondition(kind.value, True, reason, "", action, gpus)


def test_fatal_for_named_gpus_only() -> None:
    verdict = judge(_node(cond(ConditionType.GPU_XID_ERROR, "Xid48", Action.RESET_GPU, (1,))))
    assert verdict.node_fatal is None
    assert verdict.bad_gpus == {1: "GpuXidError/Xid48"}


def test_fatal_for_the_node() -> None:
    assert judge(_node(cond(ConditionType.GPU_XID_ERROR, "Xid79"))).node_fatal == "GpuXidError/Xid79"
    assert judge(_node(cond(ConditionType.GPU_MISSING, Reason.GPU_LOST.value, gpus=(1,)))).node_fatal
    assert judge(_node(cond(ConditionType.INFINIBAND_DEGRADED, "IbPortDown", Action.REPLACE))).node_fatal
    assert judge(_node(draining=True)).node_fatal == "being drained by remediation"


def test_degraded_is_not_fatal() -> None:
    verdict = judge(
        _node(
            cond(ConditionType.GPU_MEMORY_DEGRADED, Reason.ROW_REMAP_PENDING.value, gpus=(0,)),
            cond(ConditionType.GPU_PCIE_DEGRADED, Reason.PCIE_WIDTH_DEGRADED.value),
            NodeCondition(ConditionType.GPU_XID_ERROR.value, False, "NoFatalXid"),
        )
    )
    assert verdict.node_fatal is None and not verdict.bad_gpus
    assert verdict.degraded == ("GpuMemoryDegraded", "GpuPcieDegraded")


def test_row_remap_failure_and_unhealthy_inventory_take_gpus_out() -> None:
    verdict = judge(
        _node(
            cond(ConditionType.GPU_MEMORY_DEGRADED, Reason.ROW_REMAP_FAILURE.value, gpus=(0,)),
            gpus=(Gpu(0), Gpu(1, healthy=False)),
        )
    )
    assert set(verdict.bad_gpus) == {0, 1}
