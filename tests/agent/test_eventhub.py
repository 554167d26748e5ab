"""The event hub: twins from NVML and the kernel log are one event, storms stay bounded, one GPU one key."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from agent.config import config_from_dict
from agent.eventhub import EventHub
from agent.probes.kmsg import ClockAnchor, parse_record
from agent.rules.engine import HealthRules
from agent.samples import EventSource, GpuEvent, GpuEventKind, NodeSample
from gpuwarden.contract import Action
from tests.agent.samples_factory import gpu


def test_each_report_matches_at_most_one_twin_from_the_other_source() -> None:
    """A crash-looping job: NVML reports XID 13 twice, then the kernel log
    twice. Two occurrences, two duplicates; and a kernel-log line outside the
    window is an occurrence of its own."""
    hub = EventHub(dedup_window_s=10, wake=lambda: None)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)

    def xid(source: EventSource, seconds: float) -> GpuEvent:
        return GpuEvent(
            GpuEventKind.XID, source, t0 + timedelta(seconds=seconds), pci_bus_id="00000000:3B:00.0", xid=13
        )

    for event in (
        xid(EventSource.NVML, 0),
        xid(EventSource.NVML, 1),
        xid(EventSource.KMSG, 1.5),
        xid(EventSource.KMSG, 2),
        xid(EventSource.KMSG, 3),
        xid(EventSource.NVML, 30),  # its twin below, 40 s on, is too late to be one
        xid(EventSource.KMSG, 70),
    ):
        hub.push(event)
    assert hub.duplicates == 2
    assert [(c.xid, c.count) for c in hub.counts()] == [(13, 5)]
    assert len(hub.drain()) == 5


def test_the_kernel_log_twin_completes_an_xid_154_nvml_reported_first() -> None:
    """NVML's XID 154 event has no text; the kernel log's line names the
    recovery action. Whichever comes first, the rules get the action, one
    Event and one count."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    bus, uuid = "00000000:3B:00.0", "GPU-00000000-0000-0000-0000-000000000003"
    nvml = GpuEvent(GpuEventKind.XID, EventSource.NVML, t0, pci_bus_id=bus, uuid=uuid, xid=154)
    kmsg = parse_record(
        "4,161,5000000,-;NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) "
        "to 0x2 (Node Reboot Required)",
        ClockAnchor(t0.timestamp() + 0.5, 5.0),
    )
    assert kmsg is not None and kmsg.recovery_action == 2

    # The twin arrives before the next poll: the queued report is completed.
    hub = EventHub(dedup_window_s=10, wake=lambda: None)
    hub.push(nvml)
    hub.push(kmsg)
    (event,) = hub.drain()
    assert (event.source, event.recovery_action, event.supplement) == (EventSource.NVML, 2, False)
    assert "Node Reboot Required" in event.message

    # The poll already took NVML's report: the twin follows as a supplement.
    hub = EventHub(dedup_window_s=10, wake=lambda: None)
    rules = HealthRules(config_from_dict(None), "n")
    hub.push(nvml)
    report = rules.evaluate(NodeSample(time=t0, events=hub.drain()))
    assert [f.action for f in report.faults] == [Action.RESET_GPU]  # not given yet: the catalogue's
    hub.push(kmsg)
    (supplement,) = hub.drain()
    assert supplement.supplement and supplement.recovery_action == 2
    report = rules.evaluate(NodeSample(time=t0 + timedelta(seconds=1), events=(supplement,)))
    assert [f.action for f in report.faults] == [Action.REBOOT] and report.events == ()
    assert [(c.xid, c.count) for c in hub.counts()] == [(154, 1)] and hub.duplicates == 1

    # The kernel log first: NVML's twin adds nothing and is dropped.
    hub = EventHub(dedup_window_s=10, wake=lambda: None)
    hub.push(kmsg)
    hub.push(nvml)
    assert [(e.source, e.recovery_action) for e in hub.drain()] == [(EventSource.KMSG, 2)]


def test_one_gpu_keeps_one_key_in_the_hub_across_the_first_inventory() -> None:
    """An NVML event before the first poll knows its GPU by UUID only; the
    kernel log and every later report know it by bus id. One GPU is one XID
    count series, and the early report still matches its kernel-log twin."""
    hub = EventHub(dedup_window_s=10, wake=lambda: None)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    g = gpu(3)
    hub.push(GpuEvent(GpuEventKind.XID, EventSource.NVML, t0, uuid=g.uuid, xid=13))
    assert [(c.pci_bus_id, c.uuid, c.count) for c in hub.counts()] == [(None, g.uuid, 1)]
    hub.set_inventory([g])
    hub.push(GpuEvent(GpuEventKind.XID, EventSource.KMSG, t0 + timedelta(seconds=1), pci_bus_id=g.pci_bus_id, xid=13))
    assert hub.duplicates == 1
    hub.push(GpuEvent(GpuEventKind.XID, EventSource.NVML, t0 + timedelta(seconds=60), uuid=g.uuid, xid=13))
    hub.push(GpuEvent(GpuEventKind.XID, EventSource.KMSG, t0 + timedelta(seconds=90), pci_bus_id=g.pci_bus_id, xid=13))
    assert [(c.pci_bus_id, c.uuid, c.gpu_index, c.xid, c.count) for c in hub.counts()] == [
        (g.pci_bus_id, g.uuid, 3, 13, 3)
    ]


def test_a_one_source_storm_keeps_only_a_window_of_unmatched_reports() -> None:
    hub = EventHub(dedup_window_s=10, wake=lambda: None)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(10_000):
        hub.push(GpuEvent(GpuEventKind.ECC_SINGLE_BIT, EventSource.NVML, t0 + timedelta(seconds=i / 100), uuid="GPU-a"))
    assert hub.duplicates == 0 and len(hub.drain()) == 10_000
    (by_source,) = hub._unmatched.values()
    assert len(by_source[EventSource.NVML]) <= 1001
