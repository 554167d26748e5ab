"""/metrics, /healthz and /readyz served for real over HTTP on loopback."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from agent.publish.metrics import FAMILIES, MetricsPublisher
from agent.samples import (
    GpuSample,
    IbCounters,
    IbPortSample,
    NodeSample,
    NvlinkSample,
    PcieSample,
    RemappedRows,
    XidCount,
)
from gpuwarden.http import HealthServer
from gpuwarden.kube import RequestStats
from tests.agent.publish.reports import T0, gpu_entity, report, xid_fault

REPO = Path(__file__).resolve().parents[3]
RULES = REPO / "manifests" / "monitoring" / "gpuwarden-rules.yaml"
README = REPO / "README.md"


def _sample() -> NodeSample:
    gpus = []
    for i in range(2):
        e = gpu_entity(i)
        gpus.append(
            GpuSample(
                index=i,
                uuid=e.uuid or "",
                pci_bus_id=e.pci_bus_id or "",
                name="NVIDIA H100 80GB HBM3",
                memory_total_bytes=80 * 1024**3,
                remapped_rows=RemappedRows(correctable=2, uncorrectable=1 if i else 0, pending=bool(i), failure=False),
                nvlinks=(NvlinkSample(0, True, 0, 0, 5, 0), NvlinkSample(1, i == 0, 1, None, None, None)),
                pcie=PcieSample(
                    current_gen=5, max_gen=5, current_width=16 if i == 0 else 8, max_width=16, replay_counter=7
                ),
            )
        )
    return NodeSample(
        time=T0,
        gpus=tuple(gpus),
        xid_counts=(XidCount(gpus[1].pci_bus_id, gpus[1].uuid, 1, 79, 3),),
        ib_ports=(
            IbPortSample("mlx5_0", 1, "ACTIVE", "LinkUp", 400.0, "InfiniBand", IbCounters(0, 12, 1, 3), "ib0"),
            IbPortSample("mlx5_1", 1, "DOWN", "Disabled", None, "InfiniBand", IbCounters(link_downed=4)),
        ),
    )


@pytest.fixture
def served() -> Iterator[tuple[MetricsPublisher, HealthServer, dict[str, tuple[bool, str]]]]:
    stats = RequestStats()
    stats.record("patch_node_status", ok=True)
    stats.record("patch_node_status", ok=False)
    metrics = MetricsPublisher(stats, clock=lambda: 1_700_000_000.0)
    checks = {"live": (True, "ok"), "ready": (False, "no poll yet")}
    server = HealthServer(
        metrics.registry,
        host="127.0.0.1",
        port=0,
        liveness=lambda: checks["live"],
        readiness=lambda: checks["ready"],
    )
    server.start()
    try:
        yield metrics, server, checks
    finally:
        server.stop()


def _get(server: HealthServer, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def test_metrics_render_raw_signals_and_verdicts(
    served: tuple[MetricsPublisher, HealthServer, dict[str, tuple[bool, str]]],
) -> None:
    metrics, server, _ = served
    metrics.observe_sample(_sample())
    metrics.observe_report(report(xid_fault(1)))
    metrics.observe_poll_duration(0.02)
    metrics.set_quarantined(True, since=T0.timestamp())
    code, text = _get(server, "/metrics")
    assert code == 200
    s = _samples(text)
    g1 = {"gpu": "1", "uuid": "GPU-0001-aaaa"}
    bus1 = "00000000:19:00.0"
    assert _value(s, "gpuwarden_xid_events_total", **g1, pci_bus_id=bus1, xid="79") == 3
    assert _value(s, "gpuwarden_gpu_remapped_rows_total", **g1, type="uncorrectable") == 1
    assert _value(s, "gpuwarden_gpu_row_remap_pending", **g1) == 1
    assert _value(s, "gpuwarden_gpu_row_remap_failure", **g1) == 0
    assert _value(s, "gpuwarden_nvlink_up", **g1, link="1") == 0
    assert _value(s, "gpuwarden_nvlink_up", gpu="0", uuid="GPU-0000-aaaa", link="1") == 1
    assert _value(s, "gpuwarden_nvlink_errors_total", gpu="0", uuid="GPU-0000-aaaa", link="0", type="crc_flit") == 5
    assert ("gpuwarden_nvlink_errors_total", frozenset({**g1, "link": "1", "type": "recovery"}.items())) not in s
    assert _value(s, "gpuwarden_pcie_link_width", **g1) == 8
    assert _value(s, "gpuwarden_pcie_link_max_width", **g1) == 16
    assert _value(s, "gpuwarden_pcie_link_generation", **g1) == 5
    assert _value(s, "gpuwarden_pcie_replays_total", **g1) == 7
    assert _value(s, "gpuwarden_infiniband_port_up", device="mlx5_0", port="1") == 1
    assert _value(s, "gpuwarden_infiniband_port_up", device="mlx5_1", port="1") == 0
    assert _value(s, "gpuwarden_infiniband_port_rate_bytes_per_second", device="mlx5_0", port="1") == 50e9
    assert _value(s, "gpuwarden_infiniband_port_errors_total", device="mlx5_0", port="1", type="symbol_error") == 12
    assert _value(s, "gpuwarden_node_condition", condition="GpuXidError", reason="Xid79") == 1
    assert _value(s, "gpuwarden_node_condition", condition="GpuMissing", reason="AllGpusPresent") == 0
    assert _value(s, "gpuwarden_gpu_healthy", **g1) == 0
    assert _value(s, "gpuwarden_node_quarantined") == 1
    assert _value(s, "gpuwarden_node_quarantined_since_timestamp_seconds") == T0.timestamp()
    assert _value(s, "gpuwarden_poll_duration_seconds_count") == 1
    assert _value(s, "gpuwarden_api_requests_total", operation="patch_node_status") == 2
    assert _value(s, "gpuwarden_api_errors_total", operation="patch_node_status") == 1


def test_xid_counts_of_gpus_nvml_cannot_name_are_one_series_per_gpu(
    served: tuple[MetricsPublisher, HealthServer, dict[str, tuple[bool, str]]],
) -> None:
    """While NVML is down a kernel-log XID names its GPU by PCI bus id only:
    without that label two GPUs with the same XID would be one duplicate
    series, and Prometheus rejects the whole scrape."""
    metrics, server, _ = served
    buses = ("00000000:18:00.0", "00000000:2A:00.0")
    metrics.observe_sample(
        NodeSample(
            time=T0,
            gpu_source_error="NVML could not initialise: Driver Not Loaded",
            xid_counts=tuple(XidCount(bus, None, None, 79, n) for n, bus in enumerate(buses, 1)),
        )
    )
    text = _get(server, "/metrics")[1]
    series = [line for line in text.splitlines() if line.startswith("gpuwarden_xid_events_total{")]
    assert len(series) == len(set(series)) == 2
    s = _samples(text)
    for n, bus in enumerate(buses, 1):
        assert _value(s, "gpuwarden_xid_events_total", gpu="", uuid="", pci_bus_id=bus, xid="79") == n


def test_a_rate_that_is_not_a_number_is_not_exported(
    served: tuple[MetricsPublisher, HealthServer, dict[str, tuple[bool, str]]],
) -> None:
    metrics, server, _ = served
    ports = (
        IbPortSample("mlx5_0", 1, "ACTIVE", "LinkUp", float("nan"), "InfiniBand"),
        IbPortSample("mlx5_1", 1, "ACTIVE", "LinkUp", float("inf"), "InfiniBand"),
        IbPortSample("mlx5_2", 1, "ACTIVE", "LinkUp", 400.0, "InfiniBand"),
    )
    metrics.observe_sample(NodeSample(time=T0, ib_ports=ports))
    s = _samples(_get(server, "/metrics")[1])
    rates = {dict(labels)["device"]: v for (name, labels), v in s.items() if name.endswith("_rate_bytes_per_second")}
    assert rates == {"mlx5_2": 50e9}


def test_every_metric_the_alert_rules_use_is_exported_and_documented(
    served: tuple[MetricsPublisher, HealthServer, dict[str, tuple[bool, str]]],
) -> None:
    metrics, server, _ = served
    metrics.observe_sample(_sample())
    metrics.observe_report(report())
    metrics.set_quarantined(True, since=T0.timestamp())
    exported = {name for name, _ in _samples(_get(server, "/metrics")[1])}
    documented = {d.name for d in FAMILIES}
    rules = yaml.safe_load(RULES.read_text())
    # The scheduler's and remediation's alerts use their own families
    # (tests/scheduler/cluster/test_metrics.py, tests/scheduler/remediation/test_metrics.py).
    theirs = ("gpuwarden_scheduler_", "gpuwarden_remediation_", "gpuwarden_queue_")
    used = {
        m
        for g in rules["groups"]
        for r in g["rules"]
        for m in re.findall(r"\b(gpuwarden_[a-z_]+)", r["expr"])
        if not m.startswith(theirs)
    }
    assert used, "the rules use no gpuwarden metric"
    assert used <= exported
    assert used <= documented
    # And everything exported is documented (the README lists FAMILIES).
    bases = {re.sub(r"_(bucket|count|sum|created)$", "", n) for n in exported}
    assert bases <= documented | {"gpuwarden_poll_duration_seconds"}


def test_probes_answer_with_status_and_reason(
    served: tuple[MetricsPublisher, HealthServer, dict[str, tuple[bool, str]]],
) -> None:
    _, server, checks = served
    assert _get(server, "/healthz") == (200, "ok\n")
    assert _get(server, "/readyz") == (503, "no poll yet\n")
    checks["ready"] = (True, "ok")
    checks["live"] = (False, "poll loop stalled for 95s")
    assert _get(server, "/readyz") == (200, "ok\n")
    assert _get(server, "/healthz") == (503, "poll loop stalled for 95s\n")
    assert _get(server, "/nope")[0] == 404


def test_metrics_before_the_first_poll_are_valid_and_small(
    served: tuple[MetricsPublisher, HealthServer, dict[str, tuple[bool, str]]],
) -> None:
    _, server, _ = served
    code, text = _get(server, "/metrics")
    assert code == 200
    names = {name for name, _ in _samples(text)}
    assert "gpuwarden_agent_info" in names
    assert "gpuwarden_node_condition" not in names


def _readme_metrics_table() -> list[tuple[str, str, tuple[str, ...], str]]:
    """The rows of the README's metrics table: name, type, labels, meaning."""
    lines = README.read_text().splitlines()
    start = lines.index("| metric | type | labels | meaning |")
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        name, kind, labels, meaning = (cell.strip() for cell in line.strip("|").split("|"))
        label_names = () if labels == "—" else tuple(x.strip().strip("`") for x in labels.split(","))
        rows.append((name.strip("`"), kind, label_names, meaning.replace("`", "")))
    return rows


def test_the_readme_documents_exactly_the_exported_metric_families() -> None:
    documented = _readme_metrics_table()
    assert len({row[0] for row in documented}) == len(documented), "a metric is listed twice"
    assert documented == [(d.name, d.kind, d.labels, d.help) for d in FAMILIES]


def test_the_quarantine_start_is_exported_only_while_quarantined(
    served: tuple[MetricsPublisher, HealthServer, dict[str, tuple[bool, str]]],
) -> None:
    metrics, server, _ = served
    metrics.set_quarantined(True, since=T0.timestamp())
    metrics.set_quarantined(False, since=T0.timestamp())
    s = _samples(_get(server, "/metrics")[1])
    assert _value(s, "gpuwarden_node_quarantined") == 0
    # Absent, not 0: time() - 0 would be a quarantine since 1970.
    assert ("gpuwarden_node_quarantined_since_timestamp_seconds", frozenset()) not in s
