"""Prometheus metrics: raw hardware signals and the agent's verdicts, per scrape.

Alerts and dashboards need the raw numbers (a replay counter's slope, an IB
port's rate) as well as the agent's judgement (the condition), so both are
exported. Hardware counters are exported as Prometheus counters carrying the
device's own cumulative value, like node_exporter does, so ``rate()`` and
``increase()`` work and a device reset shows up as a counter reset; nothing
here keeps a last-value of an event (XIDs are counted, not overwritten).

The collector renders the latest sample and report at scrape time instead of
mirroring every value into client objects each poll: the monitor only hands
over two references, and a GPU or port that disappears stops being exported
without stale series. Names and labels follow Prometheus conventions with the
``gpuwarden_`` prefix: ``gpu`` (index) and ``uuid`` on GPU series, ``link``
on NVLink series, ``device`` and ``port`` on InfiniBand series. XID counts
also carry ``pci_bus_id``: a kernel-log XID seen while NVML is down knows its
GPU by bus id only, and without that label two GPUs with the same XID would
render as one duplicate series (``gpu=""``, ``uuid=""``), which Prometheus
rejects with the whole scrape. The node is not a label here; the scrape adds
it (see manifests/monitoring/).

A value that is not a finite number (an IB rate sysfs printed as ``inf``) is
left out rather than exported as NaN or infinity.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.model import HealthReport
from agent.publish.conditions import ConditionState, desired_conditions
from agent.remediation.model import RemediationCounts
from agent.samples import GpuSample, IbPortSample, NodeSample, PodResourcesFailure
from gpuwarden import __version__
from gpuwarden.contract import METRICS_PREFIX, ConditionType
from gpuwarden.kube import RequestStats
from gpuwarden.metricdoc import MetricFamilyDoc, family

P = METRICS_PREFIX

GPU_LABELS = ["gpu", "uuid"]
XID_LABELS = [*GPU_LABELS, "pci_bus_id", "xid"]
NVLINK_LABELS = ["gpu", "uuid", "link"]
IB_LABELS = ["device", "port"]

# Poll durations span a fast sysfs-only poll (milliseconds) to a poll stuck
# behind a slow NVML call or a hung mount check (seconds).
POLL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

# An IB port is "up" when it can carry traffic: logical state ACTIVE and
# physical state LinkUp (sysfs spellings).
IB_ACTIVE = "ACTIVE"
IB_LINK_UP = "LinkUp"


def _doc(name: str, kind: str, help: str, labels: list[str]) -> MetricFamilyDoc:
    return family(P, name, kind, help, labels)


FAMILIES: tuple[MetricFamilyDoc, ...] = (
    _doc("xid_events_total", "counter", "XID events seen per GPU and XID since the agent started.", XID_LABELS),
    _doc(
        "gpu_remapped_rows_total",
        "counter",
        "Memory rows remapped by the GPU, by the error that caused it (correctable, uncorrectable).",
        [*GPU_LABELS, "type"],
    ),
    _doc("gpu_row_remap_pending", "gauge", "1 if a row remap waits for a GPU reset to take effect.", GPU_LABELS),
    _doc("gpu_row_remap_failure", "gauge", "1 if the GPU failed to remap a row (no spare row left).", GPU_LABELS),
    _doc(
        "gpu_retired_pages_total",
        "counter",
        "Memory pages retired by dynamic page retirement (pre-Ampere GPUs), by ECC error type.",
        [*GPU_LABELS, "type"],
    ),
    _doc("gpu_retired_pages_pending", "gauge", "1 if retired pages wait for a GPU reset or reboot.", GPU_LABELS),
    _doc("gpu_healthy", "gauge", "1 if the GPU is in service (its memory counts in node capacity).", GPU_LABELS),
    _doc(
        "gpu_lost",
        "gauge",
        "1 if NVML reports the GPU lost (fallen off the bus) or cannot reach it at all.",
        GPU_LABELS,
    ),
    _doc("nvlink_up", "gauge", "1 if the NVLink is active.", NVLINK_LABELS),
    _doc(
        "nvlink_errors_total",
        "counter",
        "NVLink data-link error counters, by type (replay, recovery, crc_flit, crc_data).",
        [*NVLINK_LABELS, "type"],
    ),
    _doc("pcie_link_generation", "gauge", "Current PCIe link generation of the GPU.", GPU_LABELS),
    _doc("pcie_link_max_generation", "gauge", "Maximum PCIe link generation of the GPU and its slot.", GPU_LABELS),
    _doc("pcie_link_width", "gauge", "Current PCIe link width (lanes) of the GPU.", GPU_LABELS),
    _doc("pcie_link_max_width", "gauge", "Maximum PCIe link width (lanes) of the GPU and its slot.", GPU_LABELS),
    _doc("pcie_replays_total", "counter", "PCIe replay counter of the GPU.", GPU_LABELS),
    _doc("infiniband_port_up", "gauge", "1 if the port is ACTIVE with its physical link up (LinkUp).", IB_LABELS),
    _doc(
        "infiniband_port_info",
        "gauge",
        "Always 1; the labels carry the port's state, physical state, link layer and netdev.",
        [*IB_LABELS, "state", "phys_state", "link_layer", "netdev"],
    ),
    _doc("infiniband_port_rate_bytes_per_second", "gauge", "Link rate of the port in bytes per second.", IB_LABELS),
    _doc(
        "infiniband_port_errors_total",
        "counter",
        "Port error counters, by type (link_downed, symbol_error, link_error_recovery, port_rcv_errors).",
        [*IB_LABELS, "type"],
    ),
    _doc(
        "node_condition",
        "gauge",
        "1 while the agent's NodeCondition of this type is True (problem present); reason as on the Node.",
        ["condition", "reason"],
    ),
    _doc(
        "node_quarantined",
        "gauge",
        "1 while the node carries the gpuwarden.io/quarantined taint (as last read from the Node).",
        [],
    ),
    _doc(
        "node_quarantined_since_timestamp_seconds",
        "gauge",
        "Unix time the quarantine taint was added: its timeAdded, else when the agent first saw it "
        "(kept in the GPUNode across agent restarts); absent while the node is not quarantined.",
        [],
    ),
    _doc("poll_duration_seconds", "histogram", "Time one poll of the hardware and the rules took.", []),
    _doc("last_poll_timestamp_seconds", "gauge", "Unix time of the latest completed poll.", []),
    _doc("api_requests_total", "counter", "Requests sent to the Kubernetes API, by operation.", ["operation"]),
    _doc(
        "api_errors_total",
        "counter",
        "Kubernetes API requests that failed (no answer or an error status), by operation.",
        ["operation"],
    ),
    _doc(
        "gpu_resets_total",
        "counter",
        "GPU resets remediation asked for that the agent carried out, by result (Succeeded, Failed).",
        ["result"],
    ),
    _doc(
        "validations_total",
        "counter",
        "Validations remediation asked for that the agent answered, by result (passed, failed).",
        ["result"],
    ),
    _doc(
        "podresources_up",
        "gauge",
        "1 if the latest read of the kubelet's PodResources API (List and GetAllocatableResources) succeeded.",
        [],
    ),
    _doc(
        "podresources_errors_total",
        "counter",
        "Failed calls to the kubelet's PodResources API, by reason "
        "(missing, refused, timeout, unimplemented, invalid, error).",
        ["reason"],
    ),
    _doc("agent_info", "gauge", "Always 1; the version label is the agent's.", ["version"]),
)


def _gpu_labels(gpu: GpuSample) -> list[str]:
    return [str(gpu.index), gpu.uuid]


def _flag(value: bool) -> float:
    return 1.0 if value else 0.0


class MetricsPublisher(Collector):
    """Owns the agent's registry; the monitor feeds it, scrapes read it.

    ``observe_*`` are called from the monitor and publishing threads and only
    swap references under a lock, so a scrape never sees half a poll.
    """

    def __init__(
        self,
        stats: RequestStats | None = None,
        *,
        clock: Callable[[], float] = time.time,
        remediation: RemediationCounts | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._stats = stats
        self._remediation = remediation
        self._clock = clock
        self._lock = threading.Lock()
        self._sample: NodeSample | None = None
        self._report: HealthReport | None = None
        self._conditions: dict[ConditionType, ConditionState] = {}
        self._quarantined: bool | None = None
        self._quarantined_since: float | None = None
        self._last_poll: float | None = None
        self.poll_duration = Histogram(
            f"{P}_poll_duration_seconds",
            "Time one poll of the hardware and the rules took.",
            buckets=POLL_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(self)

    # -- feeding ------------------------------------------------------------

    def observe_sample(self, sample: NodeSample) -> None:
        with self._lock:
            self._sample = sample

    def observe_report(self, report: HealthReport) -> None:
        with self._lock:
            self._conditions = desired_conditions(report, self._conditions, report.time)
            self._report = report
            self._last_poll = self._clock()

    def observe_poll_duration(self, seconds: float) -> None:
        self.poll_duration.observe(seconds)

    def set_quarantined(self, quarantined: bool, since: float | None = None) -> None:
        """Whether the Node carries the quarantine taint, and since when (Unix time).

        The start time, not a duration and not ``for:`` in the alert, is what
        a rule needs: a gap in scraping cannot restart it.
        """
        with self._lock:
            self._quarantined = quarantined
            self._quarantined_since = since if quarantined else None

    # -- scraping -----------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            sample = self._sample
            report = self._report
            conditions = dict(self._conditions)
            quarantined = self._quarantined
            quarantined_since = self._quarantined_since
            last_poll = self._last_poll
        fam = {d.name: d for d in FAMILIES}

        def gauge(name: str) -> GaugeMetricFamily:
            d = fam[f"{P}_{name}"]
            return GaugeMetricFamily(d.name, d.help, labels=list(d.labels))

        def counter(name: str) -> CounterMetricFamily:
            d = fam[f"{P}_{name}"]
            # prometheus_client appends _total itself.
            return CounterMetricFamily(d.name.removesuffix("_total"), d.help, labels=list(d.labels))

        info = gauge("agent_info")
        info.add_metric([__version__], 1.0)
        yield info

        if sample is not None:
            yield from self._gpu_metrics(sample, gauge, counter)
            yield from self._ib_metrics(sample.ib_ports, gauge, counter)
            if sample.pod_resources is not None:
                # Only where a socket is configured; every reason from the
                # first read on, zeros included, so rate() sees the first failure.
                up = gauge("podresources_up")
                up.add_metric([], _flag(sample.pod_resources.ok))
                yield up
                failed = dict(sample.pod_resources.failures)
                failures = counter("podresources_errors_total")
                for reason in PodResourcesFailure:
                    failures.add_metric([reason.value], float(failed.get(reason, 0)))
                yield failures

        if report is not None:
            healthy = gauge("gpu_healthy")
            for g in report.gpus:
                healthy.add_metric([str(g.index), g.uuid], _flag(g.healthy))
            yield healthy

        if conditions:
            cond = gauge("node_condition")
            for ctype in ConditionType:
                state = conditions.get(ctype)
                if state is not None:
                    cond.add_metric([ctype.value, state.reason], _flag(state.problem))
            yield cond

        if quarantined is not None:
            q = gauge("node_quarantined")
            q.add_metric([], _flag(quarantined))
            yield q
        if quarantined_since is not None:
            qs = gauge("node_quarantined_since_timestamp_seconds")
            qs.add_metric([], quarantined_since)
            yield qs

        if last_poll is not None:
            lp = gauge("last_poll_timestamp_seconds")
            lp.add_metric([], last_poll)
            yield lp

        if self._stats is not None:
            requests, errors = self._stats.snapshot()
            req = counter("api_requests_total")
            err = counter("api_errors_total")
            for op in sorted(requests):
                req.add_metric([op], float(requests[op]))
                # Zero-valued error series exist from the first request, so
                # rate() sees the first error as an increase.
                err.add_metric([op], float(errors.get(op, 0)))
            yield req
            yield err

        if self._remediation is not None:
            # Every result from the start, zeros included, so rate() sees the first one.
            resets, validations = self._remediation.snapshot()
            for name, counts in (("gpu_resets_total", resets), ("validations_total", validations)):
                family = counter(name)
                for result in sorted(counts):
                    family.add_metric([result], float(counts[result]))
                yield family

    @staticmethod
    def _gpu_metrics(
        sample: NodeSample,
        gauge: Callable[[str], GaugeMetricFamily],
        counter: Callable[[str], CounterMetricFamily],
    ) -> Iterator[Metric]:
        xid = counter("xid_events_total")
        by_uuid = {g.uuid: g for g in sample.gpus}
        by_bus = {g.pci_bus_id: g for g in sample.gpus}
        for c in sample.xid_counts:
            gpu = by_uuid.get(c.uuid or "") or by_bus.get(c.pci_bus_id or "")
            index = c.gpu_index if c.gpu_index is not None else (gpu.index if gpu else None)
            uuid = c.uuid or (gpu.uuid if gpu else "")
            bus = c.pci_bus_id or (gpu.pci_bus_id if gpu else "")
            xid.add_metric(["" if index is None else str(index), uuid, bus, str(c.xid)], float(c.count))
        yield xid

        remapped = counter("gpu_remapped_rows_total")
        pending = gauge("gpu_row_remap_pending")
        failure = gauge("gpu_row_remap_failure")
        retired = counter("gpu_retired_pages_total")
        retired_pending = gauge("gpu_retired_pages_pending")
        lost = gauge("gpu_lost")
        nv_up = gauge("nvlink_up")
        nv_err = counter("nvlink_errors_total")
        gen = gauge("pcie_link_generation")
        max_gen = gauge("pcie_link_max_generation")
        width = gauge("pcie_link_width")
        max_width = gauge("pcie_link_max_width")
        replays = counter("pcie_replays_total")
        for g in sample.gpus:
            labels = _gpu_labels(g)
            lost.add_metric(labels, _flag(g.lost))
            rr = g.remapped_rows
            if rr is not None:
                remapped.add_metric([*labels, "correctable"], float(rr.correctable))
                remapped.add_metric([*labels, "uncorrectable"], float(rr.uncorrectable))
                pending.add_metric(labels, _flag(rr.pending))
                failure.add_metric(labels, _flag(rr.failure))
            rp = g.retired_pages
            if rp is not None:
                retired.add_metric([*labels, "single_bit_ecc"], float(rp.single_bit_ecc))
                retired.add_metric([*labels, "double_bit_ecc"], float(rp.double_bit_ecc))
                retired_pending.add_metric(labels, _flag(rp.pending))
            for link in g.nvlinks:
                link_labels = [*labels, str(link.link)]
                nv_up.add_metric(link_labels, _flag(link.active))
                for kind, value in (
                    ("replay", link.replay_errors),
                    ("recovery", link.recovery_errors),
                    ("crc_flit", link.crc_flit_errors),
                    ("crc_data", link.crc_data_errors),
                ):
                    if value is not None:
                        nv_err.add_metric([*link_labels, kind], float(value))
            pcie = g.pcie
            if pcie is not None:
                for family, value in (
                    (gen, pcie.current_gen),
                    (max_gen, pcie.max_gen),
                    (width, pcie.current_width),
                    (max_width, pcie.max_width),
                ):
                    if value is not None:
                        family.add_metric(labels, float(value))
                if pcie.replay_counter is not None:
                    replays.add_metric(labels, float(pcie.replay_counter))
        yield from (
            remapped,
            pending,
            failure,
            retired,
            retired_pending,
            lost,
            nv_up,
            nv_err,
            gen,
            max_gen,
            width,
            max_width,
            replays,
        )

    @staticmethod
    def _ib_metrics(
        ports: tuple[IbPortSample, ...],
        gauge: Callable[[str], GaugeMetricFamily],
        counter: Callable[[str], CounterMetricFamily],
    ) -> Iterator[Metric]:
        up = gauge("infiniband_port_up")
        info = gauge("infiniband_port_info")
        rate = gauge("infiniband_port_rate_bytes_per_second")
        errors = counter("infiniband_port_errors_total")
        for p in ports:
            labels = [p.device, str(p.port)]
            up.add_metric(labels, _flag(p.state == IB_ACTIVE and p.phys_state == IB_LINK_UP))
            info.add_metric([*labels, p.state, p.phys_state, p.link_layer, p.netdev or ""], 1.0)
            if p.rate_gbps is not None and math.isfinite(p.rate_gbps):
                rate.add_metric(labels, p.rate_gbps * 1e9 / 8)
            c = p.counters
            for kind, value in (
                ("link_downed", c.link_downed),
                ("symbol_error", c.symbol_error),
                ("link_error_recovery", c.link_error_recovery),
                ("port_rcv_errors", c.port_rcv_errors),
            ):
                if value is not None:
                    errors.add_metric([*labels, kind], float(value))
        yield from (up, info, rate, errors)
