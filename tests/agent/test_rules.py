"""Health rules: one table row per condition, then latching and hysteresis."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.config import config_from_dict
from agent.model import Entity, EventType, Fault
from agent.probes.kmsg import ClockAnchor, parse_record
from agent.rules.base import RateWindow
from agent.rules.engine import HealthRules
from agent.rules.memory import MemoryRule
from agent.rules.storage import StorageRule
from agent.samples import EventSource, GpuEvent, GpuEventKind, IbCounters, MountSample, NodeSample, RetiredPages
from gpuwarden.contract import Action, ConditionType, Reason
from gpuwarden.xid_catalogue import XID_CATALOGUE, XidKind
from tests.agent.samples_factory import T0, at, gpu, link, node, pcie, port, xid

C = ConditionType
G0 = gpu(0)
G1 = gpu(1)
GPU0 = f"gpu/{G0.uuid}"
GPU1 = f"gpu/{G1.uuid}"


@dataclass
class Case:
    name: str
    samples: list[NodeSample]
    expected: set[tuple[str, str, str, str]]  # condition, reason, entity key, action
    config: dict[str, Any] = field(default_factory=dict)


CASES = [
    Case("healthy node", [node()], set()),
    Case(
        "row remap pending",
        [node(gpus=(G0, gpu(1, remapped_rows=replace(G1.remapped_rows, pending=True, uncorrectable=1))))],
        {(C.GPU_MEMORY_DEGRADED, Reason.ROW_REMAP_PENDING, GPU1, Action.RESET_GPU)},
    ),
    Case(
        "row remap failure",
        [node(gpus=(gpu(0, remapped_rows=replace(G0.remapped_rows, failure=True)),))],
        {(C.GPU_MEMORY_DEGRADED, Reason.ROW_REMAP_FAILURE, GPU0, Action.REPLACE)},
    ),
    Case(
        "retired pages pending and over the limit (pre-Ampere)",
        [node(gpus=(gpu(0, remapped_rows=None, retired_pages=RetiredPages(60, 5, True)),))],
        {
            (C.GPU_MEMORY_DEGRADED, Reason.RETIRED_PAGES_PENDING, GPU0, Action.RESET_GPU),
            (C.GPU_MEMORY_DEGRADED, Reason.RETIRED_PAGES_LIMIT, GPU0, Action.REPLACE),
        },
    ),
    Case(
        "NVLink goes down after being up",
        [node(), node(t=at(10), gpus=(G0, gpu(1, nvlinks=(link(0), link(1, active=False), link(2), link(3)))))],
        {(C.GPU_NVLINK_DEGRADED, Reason.NVLINK_DOWN, GPU1, Action.RESET_GPU)},
    ),
    Case(
        "NVLink down from the start while up on the same model",
        [node(gpus=(G0, gpu(1, nvlinks=(link(0), link(1), link(2, active=False), link(3)))))],
        {(C.GPU_NVLINK_DEGRADED, Reason.NVLINK_DOWN, GPU1, Action.RESET_GPU)},
    ),
    Case(
        "NVLinks never up anywhere (PCIe-only cards) are no fault",
        [node(gpus=tuple(gpu(i, nvlinks=(link(0, active=False),)) for i in range(2)))],
        set(),
    ),
    Case(
        "NVLink errors growing too fast",
        [
            node(),
            node(t=at(60), gpus=(gpu(0, nvlinks=(link(0, replay=500), link(1), link(2), link(3))), G1)),
        ],
        {(C.GPU_NVLINK_DEGRADED, Reason.NVLINK_ERROR_RATE, GPU0, Action.RESET_GPU)},
    ),
    Case(
        "NVLink errors growing slowly",
        [node(), node(t=at(60), gpus=(gpu(0, nvlinks=(link(0, replay=10), link(1), link(2), link(3))), G1))],
        set(),
    ),
    Case(
        "a burst of NVLink errors right after start is counted over the whole window",
        # 11 replays in the first 10 s: 11 in a 5-minute window, not 66/min.
        [node(), node(t=at(10), gpus=(gpu(0, nvlinks=(link(0, replay=11), link(1), link(2), link(3))), G1))],
        set(),
    ),
    Case(
        "a burst of PCIe replays right after the counter reset is counted over the whole window",
        [
            node(gpus=(gpu(0, pcie=pcie(replay_counter=5000)), G1)),
            node(t=at(100), gpus=(gpu(0, pcie=pcie(replay_counter=5010)), G1)),
            node(t=at(110), gpus=(gpu(0, pcie=pcie(replay_counter=0)), G1)),  # GPU reset
            node(t=at(120), gpus=(gpu(0, pcie=pcie(replay_counter=40)), G1)),
        ],
        set(),
    ),
    Case(
        "PCIe width below maximum",
        [node(gpus=(gpu(0, pcie=pcie(current_width=8)),))],
        {(C.GPU_PCIE_DEGRADED, Reason.PCIE_WIDTH_DEGRADED, GPU0, Action.REBOOT)},
    ),
    Case(
        "PCIe generation drop while idle is power saving",
        [node(gpus=(gpu(0, pcie=pcie(current_gen=1), utilization_gpu_pct=0),))],
        set(),
    ),
    Case(
        "PCIe generation drop under load",
        [node(gpus=(gpu(0, pcie=pcie(current_gen=3), utilization_gpu_pct=95),))],
        {(C.GPU_PCIE_DEGRADED, Reason.PCIE_GEN_DEGRADED, GPU0, Action.REBOOT)},
    ),
    Case(
        "PCIe generation drop sustained past gen_sustained_s",
        [
            node(gpus=(gpu(0, pcie=pcie(current_gen=1)),)),
            node(t=at(120), gpus=(gpu(0, pcie=pcie(current_gen=1)),)),
        ],
        {(C.GPU_PCIE_DEGRADED, Reason.PCIE_GEN_DEGRADED, GPU0, Action.REBOOT)},
        {"pcie": {"gen_sustained_s": 100}},
    ),
    Case(
        "PCIe replays growing",
        [node(), node(t=at(60), gpus=(gpu(0, pcie=pcie(replay_counter=400)), G1))],
        {(C.GPU_PCIE_DEGRADED, Reason.PCIE_REPLAY_RATE, GPU0, Action.REBOOT)},
    ),
    Case(
        "IB port goes down after being active",
        [node(), node(t=at(10), ports=(port("mlx5_0"), port("mlx5_1", state="DOWN", phys_state="Polling")))],
        {(C.INFINIBAND_DEGRADED, Reason.IB_PORT_DOWN, "ib/mlx5_1/1", Action.REPLACE)},
    ),
    Case(
        "RoCE port ACTIVE but its netdev lost its link",
        [
            node(
                ports=(
                    port("mlx5_0"),
                    port("mlx5_1", netdev="eth1", netdev_oper_state="LOWERLAYERDOWN", netdev_admin_up=True),
                )
            )
        ],
        {(C.INFINIBAND_DEGRADED, Reason.IB_PORT_DOWN, "ib/mlx5_1/1", Action.REPLACE)},
    ),
    Case(
        "an IPoIB netdev set down on purpose (RDMA-only fabric) is no fault",
        [node(ports=(port("mlx5_0"), port("mlx5_1", netdev="ib1", netdev_oper_state="DOWN", netdev_admin_up=False)))],
        set(),
    ),
    Case(
        "IB port retrains at half the rate it ran at",
        [node(), node(t=at(10), ports=(port("mlx5_0"), port("mlx5_1", rate_gbps=200.0)))],
        {(C.INFINIBAND_DEGRADED, Reason.IB_RATE_DEGRADED, "ib/mlx5_1/1", Action.REPLACE)},
    ),
    Case(
        # Without a configured rate one port's reading is no measure of another's:
        # a 200 Gb/s port next to 400 Gb/s ones may be cabled so on purpose.
        "IB ports at different rates from the start, none configured",
        [node(ports=(port("mlx5_0"), port("mlx5_1", rate_gbps=200.0)))],
        set(),
    ),
    Case(
        "IB port at half the configured rate from the start",
        [node(ports=(port("mlx5_0"), port("mlx5_1", rate_gbps=200.0)))],
        {(C.INFINIBAND_DEGRADED, Reason.IB_RATE_DEGRADED, "ib/mlx5_1/1", Action.REPLACE)},
        {"infiniband": {"expected_rate_gbps": 400}},
    ),
    Case(
        "an infinite rate on one port sets no expectation for the others",
        [node(ports=(port("mlx5_0", rate_gbps=float("inf")), port("mlx5_1"))), node(t=at(10))],
        set(),
    ),
    Case(
        "IB port down from the first read",
        [node(ports=(port("mlx5_0"), port("mlx5_1", state="DOWN", phys_state="Disabled")))],
        {(C.INFINIBAND_DEGRADED, Reason.IB_PORT_DOWN, "ib/mlx5_1/1", Action.REPLACE)},
    ),
    Case(
        "RoCE port down from the first read",
        [node(ports=(port("mlx5_0"), port("mlx5_1", link_layer="Ethernet", state="DOWN", phys_state="Disabled")))],
        {(C.INFINIBAND_DEGRADED, Reason.IB_PORT_DOWN, "ib/mlx5_1/1", Action.REPLACE)},
    ),
    Case(
        "an ignored port is never judged",
        [
            node(ports=(port("mlx5_0"), port("mlx5_1", state="DOWN", phys_state="Disabled"))),
            node(t=at(10), ports=(port("mlx5_0"), port("mlx5_1", rate_gbps=25.0, counters=IbCounters(5, 0, 0, 0)))),
            node(t=at(20), ports=(port("mlx5_0"),)),
        ],
        set(),
        {"infiniband": {"ignore_ports": ["mlx5_1/1"], "expected_rate_gbps": 400}},
    ),
    Case(
        "IB port vanishes from sysfs",
        [node(), node(t=at(10), ports=(port("mlx5_0"),))],
        {(C.INFINIBAND_DEGRADED, Reason.IB_PORT_MISSING, "ib/mlx5_1/1", Action.REPLACE)},
    ),
    Case(
        "every IB port vanishes with the driver",
        [node(), node(t=at(10), ports=())],
        {
            (C.INFINIBAND_DEGRADED, Reason.IB_PORT_MISSING, "ib/mlx5_0/1", Action.REPLACE),
            (C.INFINIBAND_DEGRADED, Reason.IB_PORT_MISSING, "ib/mlx5_1/1", Action.REPLACE),
        },
    ),
    Case(
        "an expected port that is absent",
        [node()],
        {(C.INFINIBAND_DEGRADED, Reason.IB_PORT_MISSING, "ib/mlx5_7/1", Action.REPLACE)},
        {"infiniband": {"expected_ports": ["mlx5_7/1"]}},
    ),
    Case(
        "IB ports all below the configured rate",
        [node()],
        {
            (C.INFINIBAND_DEGRADED, Reason.IB_RATE_DEGRADED, "ib/mlx5_0/1", Action.REPLACE),
            (C.INFINIBAND_DEGRADED, Reason.IB_RATE_DEGRADED, "ib/mlx5_1/1", Action.REPLACE),
        },
        {"infiniband": {"expected_rate_gbps": 800}},
    ),
    Case(
        "IB link_downed increments",
        [
            node(),
            node(t=at(10), ports=(port("mlx5_0"), port("mlx5_1", counters=IbCounters(1, 0, 0, 0)))),
        ],
        {(C.INFINIBAND_DEGRADED, Reason.IB_LINK_DOWNED, "ib/mlx5_1/1", Action.RESTART_APP)},
    ),
    Case(
        "fewer GPUs than configured",
        [node(gpus=2)],
        {(C.GPU_MISSING, Reason.GPU_COUNT_MISMATCH, "node", Action.REBOOT)},
        {"gpu": {"expected_count": 8}},
    ),
    Case(
        "fewer GPUs than first seen",
        [node(gpus=2), node(t=at(10), gpus=1)],
        {(C.GPU_MISSING, Reason.GPU_COUNT_MISMATCH, "node", Action.REBOOT)},
    ),
    Case(
        "a lost GPU",
        [node(), node(t=at(10), gpus=(G0, replace(G1, lost=True, nvlinks=(), pcie=None)))],
        {
            (C.GPU_MISSING, Reason.GPU_LOST, GPU1, Action.REBOOT),
            (C.GPU_MISSING, Reason.GPU_COUNT_MISMATCH, "node", Action.REBOOT),
        },
    ),
    Case(
        "NVML unavailable is not zero GPUs",
        [node(), node(t=at(10), gpus=0, gpu_source_error="NVML could not initialise: Driver Not Loaded")],
        set(),
    ),
    Case(
        "a mount that is not mounted",
        [node(mounts=(MountSample("/mnt/shared", mounted=False, responsive=False, error="not a mount point"),))],
        {(C.STORAGE_DEGRADED, Reason.MOUNT_MISSING, "mount//mnt/shared", Action.REBOOT)},
    ),
    Case(
        "a mount that does not answer",
        [node(mounts=(MountSample("/mnt/shared", mounted=True, responsive=False, error="timed out"),))],
        {(C.STORAGE_DEGRADED, Reason.MOUNT_HUNG, "mount//mnt/shared", Action.REBOOT)},
    ),
    Case(
        "hardware XID",
        [node(events=(xid(1, 79),))],
        {(C.GPU_XID_ERROR, "Xid79", GPU1, Action.REBOOT)},
    ),
    Case("application XID", [node(events=(xid(1, 13), xid(0, 31), xid(0, 43), xid(0, 45), xid(0, 68)))], set()),
    Case("unknown XID", [node(events=(xid(0, 999),))], set()),
    Case(
        "unknown XID configured to raise",
        [node(events=(xid(0, 999),))],
        {(C.GPU_XID_ERROR, "Xid999", GPU0, Action.REBOOT)},
        {"xid": {"unknown": "condition", "unknown_action": "REBOOT"}},
    ),
    Case(
        "XID override turns an application XID into a hardware one",
        [node(events=(xid(0, 13),))],
        {(C.GPU_XID_ERROR, "Xid13", GPU0, Action.RESET_GPU)},
        {"xid": {"overrides": {13: {"kind": "hardware", "action": "RESET_GPU"}}}},
    ),
    Case(
        "fallen off the bus in the kernel log",
        [node(events=(GpuEvent(GpuEventKind.FALLEN_OFF_BUS, EventSource.KMSG, T0, pci_bus_id=G1.pci_bus_id),))],
        {(C.GPU_MISSING, Reason.GPU_LOST, GPU1, Action.REBOOT)},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_condition_table(case: Case) -> None:
    rules = HealthRules(config_from_dict(case.config), "node-a")
    for sample in case.samples:
        report = rules.evaluate(sample)
    got = {(f.condition.value, f.reason, f.entity.key, f.action.value) for f in report.faults}
    assert got == {(c.value if isinstance(c, C) else c, str(r), k, a.value) for c, r, k, a in case.expected}
    for f in report.faults:
        assert f.action.value in f.message and f.entity.describe() in f.message
    present = {g.uuid for g in case.samples[-1].gpus if not g.lost}
    for g in report.gpus:
        assert g.healthy == (not g.faults and g.uuid in present)
        assert {f.entity.key for f in g.faults} <= {f"gpu/{g.uuid}"}


def test_every_catalogue_entry_is_used_as_documented() -> None:
    required = {
        13,
        31,
        43,
        45,
        46,
        48,
        54,
        61,
        62,
        63,
        64,
        68,
        69,
        74,
        79,
        92,
        94,
        95,
        109,
        110,
        119,
        120,
        121,
        136,
        137,
        140,
        143,
        151,
        154,
        155,
        156,
        158,
    }
    assert required <= set(XID_CATALOGUE)
    for number, info in XID_CATALOGUE.items():
        rules = HealthRules(config_from_dict(None), "n")
        report = rules.evaluate(node(events=(xid(0, number),)))
        assert [e.reason for e in report.events] == [f"Xid{number}"]
        raised = report.faults_for(C.GPU_XID_ERROR)
        if info.kind is XidKind.HARDWARE:
            assert [(f.reason, f.action, f.latched) for f in raised] == [(f"Xid{number}", info.action, True)]
        else:
            assert raised == ()
    for app in (13, 31, 43, 45, 68):
        assert XID_CATALOGUE[app].kind is XidKind.APPLICATION


def test_xid_events_name_the_gpu_and_meaning() -> None:
    report = HealthRules(config_from_dict(None), "n").evaluate(node(events=(xid(1, 13), xid(0, 999))))
    texts = [e.message for e in report.events]
    assert "GPU 1" in texts[0] and G1.pci_bus_id in texts[0] and "RESTART_APP" in texts[0]
    assert "not in the catalogue" in texts[1]
    assert all(e.type is EventType.WARNING for e in report.events)


@pytest.mark.parametrize(
    ("number", "action"),
    [
        (137, Action.RESTART_APP),  # NVLink FLA privilege error: the application's illegal access
    ],
)
def test_follow_on_and_application_nvlink_xids_are_events_only(number: int, action: Action) -> None:
    report = HealthRules(config_from_dict(None), "n").evaluate(node(events=(xid(0, number),)))
    assert report.faults == ()
    (event,) = report.events
    assert event.reason == f"Xid{number}" and f"recommended action {action}" in event.message
    assert XID_CATALOGUE[number].kind is XidKind.APPLICATION and XID_CATALOGUE[number].action is action


@pytest.mark.parametrize("number", sorted(n for n, info in XID_CATALOGUE.items() if info.action is Action.NONE))
def test_informational_xids_make_normal_events(number: int) -> None:
    """An XID that asks for nothing is news, not a warning: "recommended
    action NONE" in a Warning Event sends people looking for a problem."""
    assert XID_CATALOGUE[number].action is Action.NONE
    report = HealthRules(config_from_dict(None), "n").evaluate(node(events=(xid(0, number),)))
    assert report.faults == ()
    (event,) = report.events
    assert (event.type, event.reason) == (EventType.NORMAL, f"Xid{number}")
    assert "recommended action" not in event.message and G0.pci_bus_id in event.message


def _kmsg_154(text: str) -> GpuEvent:
    """An XID 154 on GPU 1, as the kernel log prints it."""
    ev = parse_record(f"4,161,5000000,-;NVRM: Xid (PCI:0000:2a:00): 154, {text}", ClockAnchor(T0.timestamp(), 5.0))
    assert ev is not None and ev.pci_bus_id == G1.pci_bus_id
    return ev


@pytest.mark.parametrize(
    ("text", "action"),
    [
        ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", Action.RESET_GPU),
        ("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", Action.REBOOT),
        ("GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)", Action.RESTART_APP),
        ("GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)", Action.RESET_GPU),
        ("pid=9, name=python3, GPU recovery action changed from 0x1 (GPU Reset) to 0x2 (Node Reboot)", Action.REBOOT),
        # Text we cannot read, or a code we do not know: the catalogue's action.
        ("GPU recovery action changed", Action.RESET_GPU),
        ("GPU recovery action changed from 0x0 (None) to 0x5 (Recover IMEX Domain)", Action.RESET_GPU),
    ],
)
def test_xid_154_takes_its_action_from_the_driver(text: str, action: Action) -> None:
    report = HealthRules(config_from_dict(None), "n").evaluate(node(events=(_kmsg_154(text),)))
    (fault,) = report.faults
    assert (fault.condition, fault.reason, fault.action, fault.entity.key) == (C.GPU_XID_ERROR, "Xid154", action, GPU1)
    assert f"recommended action {action}" in fault.message
    assert [e.type for e in report.events] == [EventType.WARNING]


def test_xid_154_to_no_recovery_action_is_no_fault() -> None:
    ev = _kmsg_154("GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)")
    report = HealthRules(config_from_dict(None), "n").evaluate(node(events=(ev,)))
    assert report.faults == ()
    (event,) = report.events
    assert (event.type, event.reason) == (EventType.NORMAL, "Xid154") and "no recovery needed" in event.message


def test_xid_154_follows_the_driver_when_its_action_changes() -> None:
    """Drain P2P first; once drained the driver asks for a reset: one fault, since
    the first report, its action the latest one."""
    rules = HealthRules(config_from_dict(None), "n")
    drain = _kmsg_154("GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)")
    (first,) = rules.evaluate(node(events=(drain,))).faults
    reset = replace(
        _kmsg_154("GPU recovery action changed from 0x3 (Drain P2P) to 0x1 (GPU Reset Required)"), time=at(60)
    )
    (second,) = rules.evaluate(node(t=at(60), events=(reset,))).faults
    assert (first.action, second.action) == (Action.RESTART_APP, Action.RESET_GPU)
    assert second.since == first.since and second.latched
    # Both changes within one poll: the latest action, the earliest since.
    (both,) = HealthRules(config_from_dict(None), "n").evaluate(node(t=at(60), events=(drain, reset))).faults
    assert (both.action, both.since) == (Action.RESET_GPU, drain.time)


def test_a_supplement_updates_the_fault_without_a_second_event() -> None:
    """NVML's report came first without the action; the kernel log's twin,
    passed on as a supplement, corrects the action."""
    rules = HealthRules(config_from_dict(None), "n")
    nvml = xid(1, 154)
    (fault,) = rules.evaluate(node(events=(nvml,))).faults
    assert fault.action is Action.RESET_GPU and "not given" in fault.message
    twin = replace(_kmsg_154("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"), time=T0)
    report = rules.evaluate(node(t=at(1), events=(twin.as_supplement(),)))
    (updated,) = report.faults
    assert updated.action is Action.REBOOT and updated.since == fault.since
    assert report.events == ()


def test_an_operator_override_of_xid_154_wins_over_the_driver_text() -> None:
    cfg = config_from_dict({"xid": {"overrides": {154: {"kind": "hardware", "action": "REPLACE"}}}})
    ev = _kmsg_154("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)")
    (fault,) = HealthRules(cfg, "n").evaluate(node(events=(ev,))).faults
    assert fault.action is Action.REPLACE


def test_ignored_xid_gives_nothing() -> None:
    rules = HealthRules(config_from_dict({"xid": {"overrides": {45: {"kind": "ignore"}}}}), "n")
    report = rules.evaluate(node(events=(xid(0, 45),)))
    assert report.events == () and report.faults == ()


def test_xid_on_a_gpu_nvml_never_showed_is_still_named() -> None:
    ev = GpuEvent(GpuEventKind.XID, EventSource.KMSG, T0, pci_bus_id="00000000:C1:00.0", xid=79)
    report = HealthRules(config_from_dict(None), "n").evaluate(NodeSample(time=T0, events=(ev,), gpu_source_error="x"))
    (fault,) = report.faults
    assert fault.entity.pci_bus_id == "00000000:C1:00.0" and "00000000:C1:00.0" in fault.message


NVML_DOWN = "NVML could not initialise: Driver Not Loaded"


@pytest.mark.parametrize("clear_by", ["uuid", "bus id"])
@pytest.mark.parametrize(
    ("kind", "condition", "reason"),
    [(GpuEventKind.XID, C.GPU_XID_ERROR, "Xid79"), (GpuEventKind.FALLEN_OFF_BUS, C.GPU_MISSING, Reason.GPU_LOST)],
)
def test_a_gpu_first_known_by_its_bus_id_keeps_one_fault_key(
    kind: GpuEventKind, condition: C, reason: str, clear_by: str
) -> None:
    """A kernel-log event while NVML is down names the GPU by bus id only;
    once NVML names it, its fault is the GPU's, under its UUID."""
    rules = HealthRules(config_from_dict(None), "n")
    seen = GpuEvent(kind, EventSource.KMSG, T0, pci_bus_id=G1.pci_bus_id, xid=79 if kind is GpuEventKind.XID else None)
    (early,) = rules.evaluate(NodeSample(time=T0, events=(seen,), gpu_source_error=NVML_DOWN)).faults
    assert early.entity.key == f"gpu/{G1.pci_bus_id}"

    report = rules.evaluate(node(t=at(10)))
    (fault,) = report.faults
    assert fault.key == (condition.value, reason, GPU1) and fault.since == T0 and fault.latched
    assert fault.entity.describe() in fault.message and G1.uuid in fault.message
    (status,) = [g for g in report.gpus if g.uuid == G1.uuid]
    assert not status.healthy and status.faults == (fault,)
    assert report.healthy_gpu_memory_mib == G0.memory_total_mib

    # A later report of the same fault, by UUID, is the same fault.
    again = replace(seen, source=EventSource.NVML, uuid=G1.uuid, time=at(20))
    (same,) = rules.evaluate(node(t=at(20), events=(again,))).faults
    assert same.key == fault.key and same.since == T0

    key = GPU1 if clear_by == "uuid" else f"gpu/{G1.pci_bus_id}"
    assert [f.key for f in rules.clear(key, when=at(30))] == [fault.key]
    assert rules.evaluate(node(t=at(40))).faults == ()
    # The kernel log replayed (agent restart): history from before the repair.
    assert rules.evaluate(node(t=at(50), events=(seen,))).faults == ()


def test_a_bus_keyed_fault_from_before_the_last_repair_is_dropped_once_the_gpu_is_named() -> None:
    """A restarted agent replays the kernel log while NVML is down: it cannot
    tell the XID is from before the repair recorded under the GPU's UUID until
    NVML names the GPU; then the fault is history."""
    rules = HealthRules(config_from_dict(None), "n")
    rules.restore([], cleared_at={GPU1: at(0)})
    old = GpuEvent(GpuEventKind.XID, EventSource.KMSG, at(-600), pci_bus_id=G1.pci_bus_id, xid=79)
    assert rules.evaluate(NodeSample(time=at(5), events=(old,), gpu_source_error=NVML_DOWN)).faults
    report = rules.evaluate(node(t=at(10)))
    assert report.faults == () and all(g.healthy for g in report.gpus)


def test_a_kernel_log_record_read_by_the_previous_run_raises_its_fault_quietly() -> None:
    """History (see GpuEvent.history): the fault comes back from it when the
    Node could not be read, but there is no Event for it, and it never
    rewrites a fault restored from the Node."""
    old = replace(xid(1, 79, t=at(-600), source=EventSource.KMSG), message="pid=7, GPU has fallen off the bus.")
    history = replace(old, history=True)
    rules = HealthRules(config_from_dict(None), "n")
    report = rules.evaluate(node(t=T0, events=(history,)))
    (fault,) = report.faults
    assert (fault.reason, fault.latched, fault.since) == ("Xid79", True, at(-600))
    assert report.events == ()

    published = replace(fault, message="GPU 1: XID 79, as the previous run published it")
    fresh = HealthRules(config_from_dict(None), "n")
    fresh.restore([published])
    (kept,) = fresh.evaluate(node(t=T0, events=(history,))).faults
    assert kept.message == published.message and kept.since == published.since
    # A live report of the same fault still updates it.
    (live,) = fresh.evaluate(node(t=at(10), events=(replace(old, time=at(5)),))).faults
    assert live.message != published.message and live.since == published.since


def test_a_fallen_off_the_bus_record_read_by_the_previous_run_raises_gpu_lost_quietly() -> None:
    """The standalone agent has no Node to restore from: a restart raises the
    GPU's GpuLost again from the kernel log, but the previous run announced
    it, so no Event -- nor when NVML, too, says the GPU is lost now."""
    old = GpuEvent(GpuEventKind.FALLEN_OFF_BUS, EventSource.KMSG, at(-600), pci_bus_id=G1.pci_bus_id, history=True)
    report = HealthRules(config_from_dict(None), "n").evaluate(node(t=T0, events=(old,)))
    assert [(f.reason, f.entity.key, f.latched, f.since) for f in report.faults] == [
        (Reason.GPU_LOST, GPU1, True, at(-600))
    ]
    assert report.events == ()

    lost = node(t=T0, gpus=(G0, replace(G1, lost=True, nvlinks=(), pcie=None)), events=(old,))
    report = HealthRules(config_from_dict({"gpu": {"expected_count": 1}}), "n").evaluate(lost)
    assert [(f.reason, f.since) for f in report.faults] == [(Reason.GPU_LOST, at(-600))]
    assert report.events == ()
    # A GPU lost in this run is announced as ever.
    fresh = HealthRules(config_from_dict({"gpu": {"expected_count": 1}}), "n").evaluate(replace(lost, events=()))
    assert [e.reason for e in fresh.events] == [Reason.GPU_LOST]


def test_restoring_a_fault_already_judged_again_keeps_the_nodes_since_time() -> None:
    rules = HealthRules(config_from_dict(None), "n")
    (seen,) = rules.evaluate(node(t=at(600), gpus=(NARROW, G1))).faults  # before the Node could be read
    published = replace(seen, since=T0)
    assert rules.restore([published]) == 0
    (fault,) = rules.evaluate(node(t=at(610), gpus=(NARROW, G1))).faults
    assert fault.since == T0 and fault.key == seen.key


def test_a_restored_bus_keyed_fault_moves_onto_its_gpu() -> None:
    rules = HealthRules(config_from_dict(None), "n")
    (fault,) = rules.evaluate(
        NodeSample(
            time=T0,
            events=(GpuEvent(GpuEventKind.XID, EventSource.KMSG, T0, pci_bus_id=G0.pci_bus_id, xid=48),),
            gpu_source_error=NVML_DOWN,
        )
    ).faults
    fresh = HealthRules(config_from_dict(None), "n")
    fresh.restore([replace(fault, latched=False)])
    (moved,) = fresh.evaluate(node(t=at(60))).faults
    assert moved.entity.key == GPU0 and moved.latched and moved.since == T0


# --------------------------------------------------------------------------
# Latching, hysteresis, since-times, restore and clear
# --------------------------------------------------------------------------

PENDING = gpu(0, remapped_rows=replace(G0.remapped_rows, pending=True))
NARROW = gpu(0, pcie=pcie(current_width=8))


def with_gpu0(g: Any, t: float) -> NodeSample:
    return node(t=at(t), gpus=(g, G1))


def test_latched_fault_survives_its_signal_until_cleared() -> None:
    rules = HealthRules(config_from_dict(None), "n")
    first = rules.evaluate(with_gpu0(PENDING, 0)).faults
    assert [f.reason for f in first] == [Reason.ROW_REMAP_PENDING] and first[0].latched
    for t in range(1, 20):
        report = rules.evaluate(with_gpu0(G0, t * 10))
        assert report.faults == first  # same since, same everything
    gone = rules.clear(GPU0)
    assert [f.reason for f in gone] == [Reason.ROW_REMAP_PENDING]
    report = rules.evaluate(with_gpu0(G0, 500))
    assert report.faults == ()
    assert [e.reason for e in report.events] == ["GpuMemoryHealthy"]


def test_clear_with_the_signal_still_there_raises_again() -> None:
    rules = HealthRules(config_from_dict(None), "n")
    rules.evaluate(with_gpu0(PENDING, 0))
    rules.clear(GPU0)
    again = rules.evaluate(with_gpu0(PENDING, 10)).faults
    assert [f.reason for f in again] == [Reason.ROW_REMAP_PENDING] and again[0].since == at(10)


def test_non_latched_fault_clears_after_clear_polls() -> None:
    rules = HealthRules(config_from_dict({"hysteresis": {"clear_polls": 3}}), "n")
    assert rules.evaluate(with_gpu0(NARROW, 0)).faults
    assert rules.evaluate(with_gpu0(G0, 10)).faults
    assert rules.evaluate(with_gpu0(G0, 20)).faults
    report = rules.evaluate(with_gpu0(G0, 30))
    assert report.faults == () and [e.type for e in report.events] == [EventType.NORMAL]


def test_polls_a_gpu_event_woke_early_do_not_count_toward_clearing() -> None:
    """A burst of XIDs makes many polls in one interval; "absent for three
    polls" must still mean three poll intervals."""
    rules = HealthRules(config_from_dict({"hysteresis": {"clear_polls": 3}}), "n")
    assert rules.evaluate(with_gpu0(NARROW, 0)).faults
    for t in (1, 2, 3, 4, 5):  # woken by events within the first interval
        assert rules.evaluate(replace(with_gpu0(G0, t), scheduled=False)).faults
    assert rules.evaluate(with_gpu0(G0, 10)).faults
    assert rules.evaluate(with_gpu0(G0, 20)).faults
    assert rules.evaluate(with_gpu0(G0, 30)).faults == ()


def test_since_is_kept_while_raised_and_message_follows_the_signal() -> None:
    rules = HealthRules(config_from_dict(None), "n")
    rules.evaluate(with_gpu0(NARROW, 0))
    (f,) = rules.evaluate(with_gpu0(gpu(0, pcie=pcie(current_width=4)), 10)).faults
    assert f.since == at(0) and "x4" in f.message


def test_raise_polls_delays_a_state_fault() -> None:
    rules = HealthRules(config_from_dict({"hysteresis": {"raise_polls": 2}}), "n")
    assert rules.evaluate(with_gpu0(NARROW, 0)).faults == ()
    (f,) = rules.evaluate(with_gpu0(NARROW, 10)).faults
    assert f.since == at(10)


def test_restored_faults_latch_by_reason_and_keep_their_since() -> None:
    rules = HealthRules(config_from_dict(None), "n")
    old = rules.evaluate(with_gpu0(PENDING, 0)).faults + rules.evaluate(with_gpu0(NARROW, 5)).faults
    restored = [replace(f, latched=False, since=at(-3600)) for f in old]  # as read back from a Node
    fresh = HealthRules(config_from_dict(None), "n")
    assert fresh.restore(restored) == len({f.key for f in restored})
    report = fresh.evaluate(with_gpu0(G0, 100))
    by_reason = {f.reason: f for f in report.faults}
    assert by_reason[Reason.ROW_REMAP_PENDING].latched and by_reason[Reason.ROW_REMAP_PENDING].since == at(-3600)
    for t in (110, 120, 130):
        report = fresh.evaluate(with_gpu0(G0, t))
    assert [f.reason for f in report.faults] == [Reason.ROW_REMAP_PENDING]


def test_restored_xid_fault_latches_and_a_replayed_xid_keeps_it() -> None:
    rules = HealthRules(config_from_dict(None), "n")
    (f,) = rules.evaluate(node(events=(xid(1, 79, t=at(-600), source=EventSource.KMSG),))).faults
    fresh = HealthRules(config_from_dict(None), "n")
    fresh.restore([replace(f, latched=False)])
    (again,) = fresh.evaluate(node(t=at(10), events=(xid(1, 79, t=at(-600), source=EventSource.KMSG),))).faults
    assert again.latched and again.since == at(-600)


def test_rate_fault_has_two_thresholds() -> None:
    cfg = config_from_dict({"nvlink": {"error_rate_per_min": 100, "window_s": 60}, "hysteresis": {"clear_polls": 1}})
    rules = HealthRules(cfg, "n")
    count = 0

    def poll(t: int, per_min: int) -> bool:
        nonlocal count
        count += per_min // 6  # polls every 10 s
        g = gpu(0, nvlinks=(link(0, replay=count), link(1), link(2), link(3)))
        return bool(rules.evaluate(with_gpu0(g, t)).faults)

    assert not poll(0, 0)
    raised = [poll(t, 150) for t in range(10, 130, 10)]
    assert raised[-1]
    # Between the clearing threshold (50/min) and the raising one (100/min): stays raised.
    assert all(poll(t, 80) for t in range(130, 400, 10))
    assert not all(poll(t, 0) for t in range(400, 600, 10))


@settings(max_examples=200, deadline=None)
@given(
    signal=st.lists(st.booleans(), min_size=1, max_size=60),
    raise_polls=st.integers(1, 4),
    clear_polls=st.integers(1, 5),
)
def test_hysteresis_never_flaps(signal: list[bool], raise_polls: int, clear_polls: int) -> None:
    cfg = config_from_dict({"hysteresis": {"raise_polls": raise_polls, "clear_polls": clear_polls}})
    rules = HealthRules(cfg, "n")
    states = [bool(rules.evaluate(with_gpu0(NARROW if s else G0, i * 10)).faults) for i, s in enumerate(signal)]
    for i, state in enumerate(states):
        before = states[i - 1] if i else False
        if state and not before:  # raised: the signal was there for raise_polls polls
            assert i + 1 >= raise_polls and all(signal[i + 1 - raise_polls : i + 1])
        if before and not state:  # cleared: the signal was gone for clear_polls polls
            assert i + 1 >= clear_polls and not any(signal[i + 1 - clear_polls : i + 1])
        if state:  # never raised without the signal having been present
            assert any(signal[: i + 1])


@settings(max_examples=200, deadline=None)
@given(signal=st.lists(st.booleans(), min_size=1, max_size=60), clear_at=st.integers(0, 70))
def test_latched_faults_never_drop_until_cleared(signal: list[bool], clear_at: int) -> None:
    rules = HealthRules(config_from_dict({"hysteresis": {"clear_polls": 1}}), "n")
    raised_since = None
    for i, s in enumerate(signal):
        if i == clear_at:
            rules.clear(GPU0)
            raised_since = None
        faults = rules.evaluate(with_gpu0(PENDING if s else G0, i * 10)).faults
        if s and raised_since is None:
            raised_since = at(i * 10)
        if raised_since is None:
            assert faults == ()
        else:
            assert [(f.reason, f.since) for f in faults] == [(Reason.ROW_REMAP_PENDING, raised_since)]


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.tuples(st.floats(0, 120), st.integers(0, 1000)), min_size=1, max_size=400))
def test_rate_window_stays_bounded(steps: list[tuple[float, int]]) -> None:
    window = RateWindow(300.0)
    t, value = 0.0, 0
    for dt, inc in steps:
        t, value = t + dt, value + inc
        rate = window.add(t, value)
        assert len(window) <= 34  # a 32nd of the window apart, plus the ends
        assert rate is None or rate >= 0


@dataclass
class RateCase:
    name: str
    points: list[tuple[float, int]]  # (seconds, counter value)
    rate: float | None  # per minute, after the last point
    full: bool


RATE_CASES = [
    RateCase("one point has no rate", [(0, 5)], None, False),
    RateCase("a burst in the first 10 s is its increase over the window", [(0, 0), (10, 11)], 2.2, False),
    RateCase("a half-filled window at a steady 60/min reads 30/min", [(t, t) for t in range(0, 151, 10)], 30.0, False),
    RateCase("a full window at a steady 60/min reads 60/min", [(t, t) for t in range(0, 601, 10)], 60.0, True),
    RateCase(
        "a burst older than the window has left it",
        [(0, 0), (10, 500), *((t, 500) for t in range(20, 321, 10))],
        0.0,
        True,
    ),
    RateCase("sparse polls: a span longer than the window", [(0, 0), (600, 600)], 60.0, True),
    RateCase(
        "after a counter reset the history restarts and a burst is counted over the window",
        [(0, 9000), (100, 9500), (110, 0), (120, 11)],
        2.2,
        False,
    ),
    RateCase("a clock stepped back restarts the history", [(0, 0), (100, 50), (50, 60)], None, False),
    RateCase(
        "a stalled clock merges points instead of dividing by zero", [(0, 0), (5, 10), (5, 20), (5, 30)], 6.0, False
    ),
]


@pytest.mark.parametrize("case", RATE_CASES, ids=[c.name for c in RATE_CASES])
def test_rate_window(case: RateCase) -> None:
    window = RateWindow(300.0)
    for t, value in case.points:
        rate = window.add(t, value)
    assert rate == (None if case.rate is None else pytest.approx(case.rate))
    assert window.full is case.full


def test_rate_window_survives_a_stalled_clock() -> None:
    stalled = RateWindow(300.0)
    for i in range(1000):
        stalled.add(5.0, i)
    assert len(stalled) <= 2


def _window_rate(history: list[tuple[float, int]], window_s: float) -> tuple[float | None, bool]:
    """The rate a window of ``window_s`` should show after ``history`` (points
    since the last counter reset, oldest first), computed from scratch: the
    increase from the newest point at least a window old (else the oldest)."""
    t, v = history[-1]
    old = [p for p in history if t - p[0] >= window_s]
    t0, v0 = old[-1] if old else history[0]
    if t <= t0:
        return None, False
    return (v - v0) * 60.0 / max(t - t0, window_s), t - t0 >= window_s


RATE_RULES = {
    "nvlink": (
        Reason.NVLINK_ERROR_RATE,
        lambda n: gpu(0, nvlinks=(link(0, replay=n), link(1), link(2), link(3))),
        lambda threshold: {"nvlink": {"error_rate_per_min": threshold, "window_s": 60}},
    ),
    "pcie": (
        Reason.PCIE_REPLAY_RATE,
        lambda n: gpu(0, pcie=pcie(replay_counter=n)),
        lambda threshold: {"pcie": {"replay_rate_per_min": threshold, "window_s": 60}},
    ),
}


@settings(max_examples=200, deadline=None)
@given(
    rule=st.sampled_from(sorted(RATE_RULES)),
    # Errors per 10-second poll; None is a counter reset (GPU reset, driver reload).
    steps=st.lists(st.one_of(st.integers(0, 30), st.none()), min_size=1, max_size=80),
    clear_ratio=st.sampled_from([0.25, 0.5, 0.8, 1.0]),
)
def test_rate_faults_never_flap(rule: str, steps: list[int | None], clear_ratio: float) -> None:
    """Raised only above the threshold, cleared only below the lower one over
    a whole window, and otherwise left as it is: a rate hovering between the
    two thresholds, a burst over a half-filled window or a counter reset can
    neither raise nor clear the fault."""
    reason, make_gpu, section = RATE_RULES[rule]
    threshold = 60.0
    cfg = config_from_dict(
        {**section(threshold), "hysteresis": {"raise_polls": 1, "clear_polls": 1, "clear_ratio": clear_ratio}}
    )
    rules = HealthRules(cfg, "n")
    value = 0
    history: list[tuple[float, int]] = []
    before = False
    for i, step in enumerate(steps):
        t = i * 10.0
        if step is None:
            if value > 0:
                history = []
            value = 0
        else:
            value += step
        history.append((t, value))
        rate, full = _window_rate(history, 60.0)
        report = rules.evaluate(with_gpu0(make_gpu(value), t))
        now = reason in {f.reason for f in report.faults}
        if now and not before:
            assert rate is not None and rate > threshold
        if before and not now:
            assert full and rate is not None and rate <= threshold * clear_ratio
        if not before and rate is not None and rate > threshold:
            assert now  # and it is raised as soon as the rate is over
        if before and full and rate is not None and rate <= threshold * clear_ratio:
            assert not now  # and cleared as soon as a whole window is under the lower threshold
        before = now


def test_kernel_log_history_from_before_a_repair_does_not_raise_again() -> None:
    replayed = xid(1, 79, t=at(-600), source=EventSource.KMSG)
    rules = HealthRules(config_from_dict(None), "n")
    (fault,) = rules.evaluate(node(events=(replayed,))).faults
    rules.clear(GPU1, when=at(0))
    # The agent restarts and reads the kernel log from the start again.
    fresh = HealthRules(config_from_dict(None), "n")
    fresh.restore([], cleared_at={GPU1: at(0)})
    assert fresh.evaluate(node(t=at(5), events=(replayed,))).faults == ()
    (again,) = fresh.evaluate(node(t=at(20), events=(xid(1, 79, t=at(15), source=EventSource.KMSG),))).faults
    assert again.key == fault.key and again.since == at(15)


def test_gpu_count_survives_an_agent_restart_within_one_boot(tmp_path: Path) -> None:
    state = tmp_path / "state" / "gpus.json"
    cfg = config_from_dict({"gpu": {"state_file": str(state)}})
    first = HealthRules(cfg, "n")
    assert first.evaluate(node(gpus=8)).faults == ()
    assert json.loads(state.read_text())["max_gpus"] == 8
    # Restart after a GPU vanished from enumeration: still a mismatch.
    restarted = HealthRules(cfg, "n")
    (fault,) = restarted.evaluate(node(t=at(60), gpus=7)).faults
    assert fault.reason == Reason.GPU_COUNT_MISMATCH and "7 of 8" in fault.message
    # After a reboot (another boot id) the count starts afresh.
    state.write_text(json.dumps({"boot_id": "another-boot", "max_gpus": 8}))
    assert HealthRules(cfg, "n").evaluate(node(t=at(120), gpus=7)).faults == ()
    # A corrupt file is logged and ignored, not fatal.
    state.write_text("{not json")
    assert HealthRules(cfg, "n").evaluate(node(t=at(180), gpus=7)).faults == ()


def test_faults_are_held_while_their_source_is_blind() -> None:
    cfg = {"hysteresis": {"clear_polls": 1}, "infiniband": {"expected_rate_gbps": 400}}
    rules = HealthRules(config_from_dict(cfg), "n")
    rules.evaluate(
        node(
            gpus=(NARROW, G1),
            ports=(port("mlx5_0"), port("mlx5_1", rate_gbps=200.0)),
            mounts=(MountSample("/mnt/shared", mounted=True, responsive=False, error="timed out"),),
        )
    )
    blind = NodeSample(
        time=at(10),
        gpu_source_error="NVML could not initialise: Driver Not Loaded",
        ib_source_error="Permission denied",
        mounts_source_error="storage probe failed",
    )
    for t in range(10, 100, 10):
        held = rules.evaluate(replace(blind, time=at(t))).faults
        assert {f.reason for f in held} == {Reason.PCIE_WIDTH_DEGRADED, Reason.IB_RATE_DEGRADED, Reason.MOUNT_HUNG}
    # Sources back and healthy: the faults clear as usual.
    assert rules.evaluate(node(t=at(200))).faults == ()


class _BrokenRule:
    """A rule with a bug: it raises something no rule is expected to raise."""

    conditions = frozenset({ConditionType.STORAGE_DEGRADED})

    def __init__(self) -> None:
        self.broken = False

    def evaluate(self, sample: NodeSample, ctx: Any) -> Any:
        if self.broken:
            raise RuntimeError("a bug in the rule")
        return StorageRule(config_from_dict(None)).evaluate(sample, ctx)


def test_a_failing_rule_holds_its_own_conditions_and_costs_no_other() -> None:
    cfg = config_from_dict({"hysteresis": {"clear_polls": 1}})
    broken = _BrokenRule()
    rules = HealthRules(cfg, "n", rules=(broken, MemoryRule(cfg)))
    hung = MountSample("/mnt/shared", mounted=True, responsive=False, error="timed out")
    assert [f.reason for f in rules.evaluate(node(mounts=(hung,))).faults] == [Reason.MOUNT_HUNG]
    broken.broken = True
    pending = gpu(0, remapped_rows=replace(G0.remapped_rows, pending=True))
    report = rules.evaluate(node(t=at(10), gpus=(pending,)))
    # The storage fault is held (its rule could not judge), the memory rule still ran.
    assert {f.reason for f in report.faults} == {Reason.MOUNT_HUNG, Reason.ROW_REMAP_PENDING}


def test_a_raised_fault_keeps_its_message_while_the_numbers_behind_it_move() -> None:
    """A condition's message is re-sent whenever it changes: a live rate,
    utilisation or duration in it would patch the Node on every poll."""
    cfg = config_from_dict({"pcie": {"gen_sustained_s": 100}, "hysteresis": {"clear_polls": 3}})
    rules = HealthRules(cfg, "n")
    messages: dict[str, set[str]] = {}
    counter = 0
    for step in range(1, 40):
        counter += 100 + 37 * (step % 5)  # errors keep growing, at a rate that varies
        g = gpu(
            0,
            nvlinks=(link(0, replay=counter), link(1), link(2), link(3)),
            pcie=pcie(current_gen=3, replay_counter=counter),
            utilization_gpu_pct=[35, 90, 60, 20][step % 4],
        )
        hung = MountSample("/mnt/shared", mounted=True, responsive=False, error="statvfs has not answered within 5s")
        for f in rules.evaluate(node(t=at(10 * step), gpus=(g,), mounts=(hung,))).faults:
            messages.setdefault(f.reason, set()).add(f.message)
    assert set(messages) >= {Reason.NVLINK_ERROR_RATE, Reason.PCIE_REPLAY_RATE, Reason.PCIE_GEN_DEGRADED}
    # PCIe gen: "under load" until it has lasted gen_sustained_s, then "for more than": two texts, once each.
    assert {r: len(m) for r, m in messages.items()} == {
        Reason.NVLINK_ERROR_RATE: 1,
        Reason.PCIE_REPLAY_RATE: 1,
        Reason.PCIE_GEN_DEGRADED: 2,
        Reason.MOUNT_HUNG: 1,
    }


def test_a_gpu_known_by_its_bus_id_only_is_named_by_it() -> None:
    """A kernel-log XID while NVML is down: the message names the bus id, not "GPU None"."""
    ev = GpuEvent(GpuEventKind.XID, EventSource.KMSG, T0, pci_bus_id=G1.pci_bus_id, xid=79)
    report = HealthRules(config_from_dict(None), "n").evaluate(
        NodeSample(time=T0, gpu_source_error="NVML could not initialise: Driver Not Loaded", events=(ev,))
    )
    (fault,) = report.faults
    assert fault.message.startswith(f"GPU at {G1.pci_bus_id}: XID 79")
    assert "None" not in fault.message and "unknown" not in fault.message
    assert all(e.message.startswith(f"GPU at {G1.pci_bus_id}") for e in report.events)


def test_a_restored_link_downed_fault_is_held_until_its_since_plus_the_hold() -> None:
    """A restart must not cut the hold short: it ends link_downed_hold_s after the flap."""
    cfg = config_from_dict({"hysteresis": {"clear_polls": 1}, "infiniband": {"link_downed_hold_s": 600}})
    flapped = node(t=at(100), ports=(port("mlx5_0"), port("mlx5_1", counters=IbCounters(3, 0, 0, 0))))
    restored = Fault(
        condition=C.INFINIBAND_DEGRADED,
        reason=Reason.IB_LINK_DOWNED,
        message="mlx5_1 port 1: link went down 1 time(s) recently (link_downed 3); recommended action RESTART_APP",
        action=Action.RESTART_APP,
        entity=Entity.ib("mlx5_1", 1),
        since=at(0),
    )
    rules = HealthRules(cfg, "n")
    assert rules.restore([restored]) == 1
    for t in (100, 110, 300, 599):
        report = rules.evaluate(replace(flapped, time=at(t)))
        assert [(f.reason, f.entity.key, f.since) for f in report.faults] == [
            (Reason.IB_LINK_DOWNED, "ib/mlx5_1/1", at(0))
        ], t
    assert rules.evaluate(replace(flapped, time=at(600))).faults == ()
