"""The poll loop: event-driven reports, de-duplication, restore, clear, and
carrying on when NVML is not there."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pynvml
import pytest

from agent.config import MountConfig, config_from_dict
from agent.model import HealthReport
from agent.monitor import Monitor
from agent.probes.gpu import GpuProbe
from agent.samples import GpuEvent, NodeSample
from agent.sim.node import SimNode
from agent.sim.scenario import load_scenario
from agent.sources.base import KmsgSource, NodeHardware
from agent.sources.infiniband import SysfsIbSource
from agent.sources.nvml import NvmlBackend
from agent.sources.storage import StatvfsMountSource
from gpuwarden.contract import ConditionType, Reason
from tests.agent.conftest import REAL_NVML
from tests.agent.fake_pynvml import h100_node
from tests.agent.sysfs_tree import two_hcas
from tests.waiting import wait_for


@pytest.fixture
def sim() -> Iterator[tuple[SimNode, Monitor]]:
    node = SimNode(load_scenario("default"))
    monitor = Monitor(config_from_dict({"poll_interval_s": 3600}), node.hardware(), "node-a")
    try:
        yield node, monitor
    finally:
        monitor.close()


class Collector:
    def __init__(self) -> None:
        self.reports: list[tuple[HealthReport, NodeSample]] = []
        self.lock = threading.Lock()

    def __call__(self, report: HealthReport, sample: NodeSample) -> None:
        with self.lock:
            self.reports.append((report, sample))

    def latest(self) -> HealthReport | None:
        with self.lock:
            return self.reports[-1][0] if self.reports else None


def test_first_poll_of_the_default_scenario(sim: tuple[SimNode, Monitor]) -> None:
    _, monitor = sim
    report, sample = monitor.step()
    assert {(f.condition, f.reason) for f in report.faults} == {
        (ConditionType.GPU_MEMORY_DEGRADED, Reason.ROW_REMAP_PENDING),
        (ConditionType.INFINIBAND_DEGRADED, Reason.IB_PORT_DOWN),
    }
    assert "Xid13" in [e.reason for e in report.events]
    assert [(c.gpu_index, c.xid, c.count) for c in sample.xid_counts] == [(1, 13, 1)]
    assert len(sample.gpus) == 8 and len(sample.ib_ports) == 8 and report.errors == ()
    assert monitor.last_report is report and monitor.polls == 1


def test_an_injected_xid_produces_a_report_before_the_next_poll(sim: tuple[SimNode, Monitor]) -> None:
    node, monitor = sim
    stop = threading.Event()
    got = Collector()
    thread = threading.Thread(target=monitor.run, args=(stop, got), daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: len(got.reports) >= 1)
        assert got.reports[0][1].scheduled  # the first poll is on schedule
        node.inject("xid", gpu=4, xid=79)
        # The poll interval is an hour: only the event path can deliver this.
        assert wait_for(lambda: (r := got.latest()) is not None and bool(r.faults_for(ConditionType.GPU_XID_ERROR)))
        report = got.latest()
        assert report is not None
        (fault,) = report.faults_for(ConditionType.GPU_XID_ERROR)
        assert fault.reason == "Xid79" and fault.entity.gpu_index == 4 and fault.latched
        with got.lock:
            woken = [sample for r, sample in got.reports if r.faults_for(ConditionType.GPU_XID_ERROR)]
        assert not woken[0].scheduled  # woken early by the event: hysteresis does not count it
        # Seen by NVML and by the kernel log, counted once.
        assert wait_for(lambda: monitor.hub.duplicates >= 2)  # XID 13 at start and XID 79 now
        _, sample = monitor.step()
        assert {(c.gpu_index, c.xid): c.count for c in sample.xid_counts} == {(1, 13): 1, (4, 79): 1}
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()


def test_a_restarted_agent_raises_old_xids_again_but_announces_and_counts_them_once(tmp_path: Path) -> None:
    """Two agents, one after the other, on one boot of one node: the second
    replays the kernel log from its start. The latched fault comes back from
    it; the Events and the XID counts are the first run's alone."""
    node = SimNode(load_scenario("default"))  # XID 13 (an application's) at start
    config = config_from_dict({"poll_interval_s": 3600, "kmsg_state_file": str(tmp_path / "kmsg-cursor.json")})
    first = Monitor(config, node.hardware(), "node-a")
    try:
        first.step()
        node.inject("xid", gpu=4, xid=79)
        assert wait_for(lambda: first.hub.duplicates >= 2)  # both sources saw both XIDs
        report, sample = first.step()
        (fault,) = report.faults_for(ConditionType.GPU_XID_ERROR)
        assert "Xid79" in {e.reason for e in report.events}
        assert {(c.gpu_index, c.xid): c.count for c in sample.xid_counts} == {(1, 13): 1, (4, 79): 1}
    finally:
        first.close()
    second = Monitor(config, node.hardware(), "node-a")
    try:
        report, sample = second.step()
        (again,) = report.faults_for(ConditionType.GPU_XID_ERROR)
        assert (again.reason, again.entity.gpu_index, again.latched) == ("Xid79", 4, True)
        # Dated by the kernel log's record, the first run's fault by whichever
        # source reported first: the same moment, to the clock readings' jitter.
        assert abs((again.since - fault.since).total_seconds()) < 1
        assert not [e for e in report.events if e.reason in {"Xid13", "Xid79"}]
        assert sample.xid_counts == ()
        assert second.kmsg_probe is not None and second.kmsg_probe.history == 2
        # Something new after the restart is announced and counted as usual.
        node.inject("xid", gpu=1, xid=13)
        assert wait_for(lambda: second.hub.duplicates >= 1)
        report, sample = second.step()
        assert "Xid13" in {e.reason for e in report.events}
        assert {(c.gpu_index, c.xid): c.count for c in sample.xid_counts} == {(1, 13): 1}
    finally:
        second.close()


def test_a_restarted_standalone_agent_does_not_announce_a_lost_gpu_again(tmp_path: Path) -> None:
    """Without a Node to read faults back from, the kernel log's history is
    all a restarted agent knows: the GPU that fell off the bus is GpuLost
    again, without a second Warning for it."""
    node = SimNode(load_scenario("healthy"))
    config = config_from_dict({"poll_interval_s": 3600, "kmsg_state_file": str(tmp_path / "kmsg-cursor.json")})
    first = Monitor(config, node.hardware(), "node-a")
    try:
        first.step()
        node.inject("gpu_lost", gpu=4)
        assert wait_for(lambda: first.hub.duplicates >= 1)  # XID 79 from both sources
        reports = [first.poll() for _ in range(2)]
        assert "GpuLost" in {e.reason for r in reports for e in r.events}
    finally:
        first.close()
    second = Monitor(config, node.hardware(), "node-a")
    try:
        report = second.poll()
        assert {f.reason for f in report.faults} >= {"GpuLost", "Xid79"}
        assert not [e for e in report.events if e.reason in {"GpuLost", "Xid79"}]
    finally:
        second.close()


class StartingOver(KmsgSource):
    """A kernel log that hands out its records, then the same ones again."""

    def __init__(self, records: list[str]) -> None:
        self.batches = [records, records]
        self.closed = threading.Event()
        self.exhausted = threading.Event()

    def read(self, timeout_s: float) -> list[str]:
        if self.batches:
            return self.batches.pop(0)
        if timeout_s > 0:
            self.exhausted.set()  # the reader thread came back after both
        self.closed.wait(timeout_s)
        return []

    def close(self) -> None:
        self.closed.set()


def test_kernel_log_records_read_twice_are_announced_and_counted_once() -> None:
    """The same sequence numbers twice in one process: one Event per XID and
    one count in ``gpuwarden_xid_events_total``, not two."""
    node = SimNode(load_scenario("healthy"))
    bus = f"0000:{node.sample_gpus()[2].pci_bus_id.split(':')[1].lower()}:00"  # as the kernel log spells it
    records = [f"4,{seq},1000,-;NVRM: Xid (PCI:{bus}): 48, pid=1, name=a, DBE" for seq in (5, 6)]
    source = StartingOver(records)
    monitor = Monitor(
        config_from_dict({"poll_interval_s": 3600}),
        replace(node.hardware(), kmsg=source),
        "node-a",
    )
    try:
        report = monitor.poll()
        assert source.exhausted.wait(30)  # back for more: the repeat has been handled
        later, later_sample = monitor.step()
    finally:
        monitor.close()
    events = [e for r in (report, later) for e in r.events if e.reason == "Xid48"]
    assert len(events) == 2  # the two records, once each
    assert {(c.gpu_index, c.xid): c.count for c in later_sample.xid_counts} == {(2, 48): 2}


def test_a_failing_report_handler_does_not_stop_detection(sim: tuple[SimNode, Monitor]) -> None:
    node, monitor = sim
    stop = threading.Event()
    calls: list[int] = []

    def broken(report: HealthReport, sample: NodeSample) -> None:
        calls.append(1)
        raise RuntimeError("API server unreachable")

    thread = threading.Thread(target=monitor.run, args=(stop, broken), daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: len(calls) >= 1)
        node.inject("xid", gpu=0, xid=48)
        assert wait_for(lambda: len(calls) >= 2)
    finally:
        stop.set()
        thread.join(10)


def test_restore_and_clear(sim: tuple[SimNode, Monitor]) -> None:
    node, monitor = sim
    first = monitor.poll()
    pending = next(f for f in first.faults if f.reason == Reason.ROW_REMAP_PENDING)

    # A restarted agent: the GPU was reset meanwhile, but the fault latches.
    node.inject("gpu_reset", gpu=3)
    node2 = SimNode(load_scenario("healthy"))
    fresh = Monitor(config_from_dict(None), node2.hardware(), "node-a")
    try:
        assert fresh.restore([replace(pending, latched=False)]) == 1
        report = fresh.poll()
        assert [f.reason for f in report.faults] == [Reason.ROW_REMAP_PENDING]
        cleared = fresh.clear(pending.entity.key)
        assert [f.reason for f in cleared] == [Reason.ROW_REMAP_PENDING]
        report = fresh.poll()
        assert report.faults == () and [e.reason for e in report.events] == ["GpuMemoryHealthy"]
    finally:
        fresh.close()


def test_nvml_missing_keeps_storage_and_infiniband_serving(tmp_path: Path) -> None:
    two_hcas(tmp_path)
    backend = NvmlBackend(pynvml)  # the real library: no driver on this machine
    hardware = NodeHardware(
        gpu=backend,
        kmsg=None,
        ib=SysfsIbSource(str(tmp_path)),
        mounts=StatvfsMountSource([MountConfig(str(tmp_path))], interval_s=0.05),
    )
    monitor = Monitor(config_from_dict(None), hardware, "node-a")
    try:
        assert wait_for(lambda: monitor.hardware.mounts.check()[0].latency_s is not None)
        report = monitor.poll()
        reasons = {f.reason for f in report.faults}
        assert Reason.IB_PORT_DOWN in reasons and Reason.MOUNT_MISSING in reasons
        if REAL_NVML:
            assert report.errors == () and report.gpus
        else:
            assert report.gpus == ()
            assert len(report.errors) == 1 and "NVML could not initialise" in report.errors[0]
            assert "Library Not Found" in report.errors[0]
            assert Reason.GPU_COUNT_MISMATCH not in reasons
    finally:
        monitor.close()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_gpu_probe_retries_with_backoff_and_recovers() -> None:
    nv = h100_node(2)
    nv.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    clock = Clock()
    probe = GpuProbe(NvmlBackend(nv), lambda ev: None, retry_initial_s=1, retry_max_s=4, monotonic=clock)
    tries = []
    for t in [0, 0.5, 1, 2, 2.5, 3, 5, 7, 8, 11, 12, 15, 16]:
        clock.now = t
        gpus, error = probe.sample()
        assert gpus == () and error is not None and "Driver Not Loaded" in error
        tries.append(probe.attempts)
    # Attempts at 0, 1, 3 (after 2 s), 7 (4 s), 11 (capped at 4 s), 15.
    assert tries == [1, 1, 2, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6]
    nv.init_error = None
    clock.now = 19
    gpus, error = probe.sample()
    assert error is None and len(gpus) == 2 and probe.is_open
    probe.stop()


def test_the_gpu_event_thread_survives_a_failing_sink() -> None:
    """Nothing restarts the event thread: one event the sink chokes on must
    not end event delivery for the life of the agent."""
    nv = h100_node(2)
    received: list[int | None] = []

    def sink(ev: GpuEvent) -> None:
        if not received:
            received.append(None)
            raise RuntimeError("sink bug")
        received.append(ev.xid)

    probe = GpuProbe(NvmlBackend(nv), sink, retry_initial_s=0.01)
    try:
        assert probe.sample()[1] is None
        probe.start_events()
        nv.emit_xid(0, 13)
        assert wait_for(lambda: len(received) == 1)
        nv.emit_xid(1, 79)
        assert wait_for(lambda: received == [None, 79])
    finally:
        probe.stop()


def test_monitor_close_stops_its_threads(sim: tuple[SimNode, Monitor]) -> None:
    _, monitor = sim
    before = {t.name for t in threading.enumerate()}
    monitor.start()
    assert {"gpuwarden-kmsg", "gpuwarden-gpu-events"} <= {t.name for t in threading.enumerate()}
    monitor.close()
    assert wait_for(lambda: not ({"gpuwarden-kmsg", "gpuwarden-gpu-events"} & {t.name for t in threading.enumerate()}))
    assert before >= {t.name for t in threading.enumerate()} - {"gpuwarden-kmsg", "gpuwarden-gpu-events"}


def test_a_restarted_agent_replays_the_kernel_log_but_respects_repairs() -> None:
    node = SimNode(load_scenario("healthy"))
    node.inject("xid", gpu=2, xid=79)
    first = Monitor(config_from_dict(None), node.hardware(), "node-a")
    try:
        (fault,) = first.poll().faults
        assert fault.reason == "Xid79"
    finally:
        first.close()

    # Restart: the new agent reads the kernel log from the start of the ring.
    second = Monitor(config_from_dict(None), node.hardware(), "node-a")
    try:
        (replayed,) = second.poll().faults
        assert replayed.key == fault.key and replayed.since <= fault.since
        repaired_at = datetime.now(UTC)
        assert [f.key for f in second.clear(fault.entity.key, repaired_at)] == [fault.key]
    finally:
        second.close()

    third = Monitor(config_from_dict(None), node.hardware(), "node-a")
    try:
        third.restore([], cleared_at={fault.entity.key: repaired_at})
        assert third.poll().faults == ()
    finally:
        third.close()


def test_one_failing_probe_costs_only_its_own_source(tmp_path: Path) -> None:
    from pyroute2.netlink.exceptions import NetlinkError

    from agent.samples import IbPortSample
    from agent.sources.base import IbSource
    from agent.sources.netdev import NetdevReader, NetdevState

    class BrokenHca(IbSource):
        def read_ports(self) -> tuple[IbPortSample, ...]:
            raise RuntimeError("mlx5 driver returned nonsense")

    class NetlinkDown(NetdevReader):
        def read(self, names: set[str]) -> dict[str, NetdevState]:
            raise NetlinkError(105, "No buffer space available")

    node = SimNode(load_scenario("default"))
    sim_hw = node.hardware()
    broken = Monitor(config_from_dict(None), replace(sim_hw, ib=BrokenHca()), "node-a")
    try:
        report = broken.poll()
        assert len(report.gpus) == 8 and report.ib_ports == ()
        assert report.errors == ("infiniband: InfiniBand probe failed: RuntimeError('mlx5 driver returned nonsense')",)
        assert {f.reason for f in report.faults} == {Reason.ROW_REMAP_PENDING}
    finally:
        broken.close()

    two_hcas(tmp_path)
    ports = SysfsIbSource(str(tmp_path), NetlinkDown()).read_ports()
    assert len(ports) == 3 and all(p.netdev_oper_state is None for p in ports)


def test_the_degrading_scenario_plays_out_into_every_condition() -> None:
    clock = Clock()
    node = SimNode(load_scenario("degrading"), monotonic=clock)
    wall = [datetime(2026, 1, 1, tzinfo=UTC)]
    monitor = Monitor(config_from_dict(None), node.hardware(), "node-a", clock=lambda: wall[0])
    seen: list[set[str]] = []
    try:
        for t in range(0, 140, 10):
            clock.now = float(t)
            wall[0] = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=t)
            seen.append({f"{f.condition}/{f.reason}" for f in monitor.poll().faults})
        # XID 79 and "fallen off the bus" arrive on the event threads, after the
        # poll that noticed the lost GPU; they wake the next poll.
        assert wait_for(lambda: monitor.hub.duplicates >= 1)
        seen.append({f"{f.condition}/{f.reason}" for f in monitor.poll().faults})
    finally:
        monitor.close()
    assert seen[0] == set()
    assert seen[2] == {"GpuPcieDegraded/PcieWidthDegraded"}
    assert "GpuNvlinkDegraded/NvlinkDown" in seen[4]
    assert "InfinibandDegraded/IbLinkDowned" in seen[6]
    assert seen[-1] == {
        "GpuPcieDegraded/PcieWidthDegraded",
        "GpuNvlinkDegraded/NvlinkDown",
        "InfinibandDegraded/IbLinkDowned",
        "GpuXidError/Xid79",
        "GpuMissing/GpuLost",
        "GpuMissing/GpuCountMismatch",
        "StorageDegraded/MountHung",
    }
