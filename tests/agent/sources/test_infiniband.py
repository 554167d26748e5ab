"""InfiniBand from a sysfs fixture tree with two HCAs, healthy and degraded."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import agent.sources.infiniband as infiniband_source
from agent.config import ConfigError, config_from_dict
from agent.rules.engine import HealthRules
from agent.samples import NodeSample
from agent.sources.infiniband import SysfsIbSource, parse_rate_gbps
from gpuwarden.contract import ConditionType, Reason
from tests.agent.sysfs_tree import PortSpec, two_hcas, write_port

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_reads_state_rate_counters_and_netdev(tmp_path: Path) -> None:
    two_hcas(tmp_path)
    ports = SysfsIbSource(str(tmp_path)).read_ports()
    by = {(p.device, p.port): p for p in ports}
    assert list(by) == [("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_1", 2)]
    healthy = by[("mlx5_0", 1)]
    assert (healthy.state, healthy.phys_state, healthy.rate_gbps, healthy.link_layer) == (
        "ACTIVE",
        "LinkUp",
        400.0,
        "InfiniBand",
    )
    assert healthy.netdev == "ib0" and healthy.counters.link_downed == 0
    slow = by[("mlx5_1", 1)]
    assert slow.rate_gbps == 200.0 and slow.counters.link_downed == 3 and slow.counters.symbol_error == 12
    assert slow.counters.port_rcv_errors == 4 and slow.netdev == "ib1"
    down = by[("mlx5_1", 2)]
    assert (down.state, down.phys_state, down.netdev) == ("DOWN", "Polling", "ib2")
    # Without a netlink reader the netdev state is unknown, not made up.
    assert down.netdev_oper_state is None and down.netdev_speed_mbps is None


def test_missing_files_are_none_not_errors(tmp_path: Path) -> None:
    write_port(tmp_path, PortSpec("mlx5_4", 1, link_layer="Ethernet", rate_gbps=100.0, counters={}))
    (port,) = SysfsIbSource(str(tmp_path)).read_ports()
    assert port.link_layer == "Ethernet" and port.rate_gbps == 100.0
    assert port.counters.link_downed is None and port.netdev is None


def test_no_infiniband_at_all(tmp_path: Path) -> None:
    assert SysfsIbSource(str(tmp_path)).read_ports() == ()


def test_rate_text() -> None:
    assert parse_rate_gbps("400 Gb/sec (4X NDR)") == 400.0
    assert parse_rate_gbps("2.5 Gb/sec (1X SDR)") == 2.5
    assert parse_rate_gbps("") is None and parse_rate_gbps("n/a") is None


@pytest.mark.parametrize("text", ["inf Gb/sec (4X NDR)", "nan Gb/sec", "-inf Gb/sec", "-400 Gb/sec", "1e400 Gb/sec"])
def test_rate_text_that_is_no_rate(text: str) -> None:
    assert parse_rate_gbps(text) is None


class _Log:
    def __init__(self) -> None:
        self.warnings: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **kw: Any) -> None:
        self.warnings.append((event, kw))


def test_an_unparsable_rate_is_logged_once_per_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = _Log()
    monkeypatch.setattr(infiniband_source, "log", log)
    for dev in ("mlx5_0", "mlx5_1"):
        write_port(tmp_path, PortSpec(dev, 1))
        (tmp_path / "class" / "infiniband" / dev / "ports" / "1" / "rate").write_text("inf Gb/sec (4X NDR)\n")
    source = SysfsIbSource(str(tmp_path))
    for _ in range(3):
        assert [p.rate_gbps for p in source.read_ports()] == [None, None]
    assert [(e, kw["device"], kw["port"]) for e, kw in log.warnings] == [
        ("ib_rate_unparsable", "mlx5_0", 1),
        ("ib_rate_unparsable", "mlx5_1", 1),
    ]


def test_degraded_hca_judged_from_the_tree(tmp_path: Path) -> None:
    two_hcas(tmp_path)
    source = SysfsIbSource(str(tmp_path))
    rules = HealthRules(config_from_dict({"infiniband": {"expected_rate_gbps": 400}}), "n")
    report = rules.evaluate(NodeSample(time=T0, ib_ports=source.read_ports()))
    found = {(f.entity.key, f.reason) for f in report.faults_for(ConditionType.INFINIBAND_DEGRADED)}
    assert found == {("ib/mlx5_1/1", Reason.IB_RATE_DEGRADED), ("ib/mlx5_1/2", Reason.IB_PORT_DOWN)}
    assert [p.healthy for p in report.ib_ports] == [True, False, False]

    # The flapping port goes down once more: link_downed increments.
    write_port(
        tmp_path,
        PortSpec(
            "mlx5_1",
            1,
            rate_gbps=200.0,
            netdev="ib1",
            counters={"link_downed": 4, "symbol_error": 12, "link_error_recovery": 1, "port_rcv_errors": 4},
        ),
    )
    report = rules.evaluate(NodeSample(time=T0 + timedelta(seconds=10), ib_ports=source.read_ports()))
    reasons = {f.reason for f in report.faults if f.entity.key == "ib/mlx5_1/1"}
    assert reasons == {Reason.IB_RATE_DEGRADED, Reason.IB_LINK_DOWNED}


def test_a_port_down_from_the_first_read_is_a_fault(tmp_path: Path) -> None:
    """On a GPU node every fabric port found is expected up, even one never seen up."""
    two_hcas(tmp_path)
    rules = HealthRules(config_from_dict(None), "n")
    report = rules.evaluate(NodeSample(time=T0, ib_ports=SysfsIbSource(str(tmp_path)).read_ports()))
    found = {(f.entity.key, f.reason) for f in report.faults}
    assert ("ib/mlx5_1/2", Reason.IB_PORT_DOWN) in found


def test_an_ignored_port_is_not_judged(tmp_path: Path) -> None:
    two_hcas(tmp_path)
    cfg = {"infiniband": {"ignore_ports": ["mlx5_1/2"], "expected_rate_gbps": 400}}
    rules = HealthRules(config_from_dict(cfg), "n")
    report = rules.evaluate(NodeSample(time=T0, ib_ports=SysfsIbSource(str(tmp_path)).read_ports()))
    assert {f.entity.key for f in report.faults} == {"ib/mlx5_1/1"}


def test_ignore_ports_are_checked_at_load() -> None:
    assert config_from_dict({"infiniband": {"ignore_ports": ["mlx5_4/1"]}}).infiniband.ignore_ports == ["mlx5_4/1"]
    with pytest.raises(ConfigError, match=r"infiniband\.ignore_ports\[0\]: expected 'device/port', got 'mlx5_4'"):
        config_from_dict({"infiniband": {"ignore_ports": ["mlx5_4"]}})
    with pytest.raises(ConfigError, match=r"infiniband\.ignore_ports: expected a list"):
        config_from_dict({"infiniband": {"ignore_ports": "mlx5_4/1"}})
    with pytest.raises(ConfigError, match=r"infiniband\.ignore_ports\[0\]: 'mlx5_4/1' is also in expected_ports"):
        config_from_dict({"infiniband": {"ignore_ports": ["mlx5_4/1"], "expected_ports": ["mlx5_4/1"]}})


def test_an_hca_that_disappears_from_sysfs_is_flagged_missing(tmp_path: Path) -> None:
    for dev in ("mlx5_0", "mlx5_1"):
        write_port(tmp_path, PortSpec(dev, 1, netdev=f"ib{dev[-1]}"))
    source = SysfsIbSource(str(tmp_path))
    rules = HealthRules(config_from_dict({"hysteresis": {"clear_polls": 1}}), "n")
    assert rules.evaluate(NodeSample(time=T0, ib_ports=source.read_ports())).faults == ()
    shutil.rmtree(tmp_path / "class" / "infiniband" / "mlx5_1")
    report = rules.evaluate(NodeSample(time=T0 + timedelta(seconds=10), ib_ports=source.read_ports()))
    (fault,) = report.faults
    assert (fault.entity.key, fault.reason) == ("ib/mlx5_1/1", Reason.IB_PORT_MISSING)
    assert "missing from sysfs" in fault.message and "mlx5_1 port 1" in fault.message
    # The driver brings it back: the fault clears as usual.
    write_port(tmp_path, PortSpec("mlx5_1", 1, netdev="ib1"))
    assert rules.evaluate(NodeSample(time=T0 + timedelta(seconds=20), ib_ports=source.read_ports())).faults == ()


def test_an_hca_that_appears_later_is_read_with_its_netdev(tmp_path: Path) -> None:
    write_port(tmp_path, PortSpec("mlx5_0", 1, netdev="ib0"))
    source = SysfsIbSource(str(tmp_path))
    assert [p.netdev for p in source.read_ports()] == ["ib0"]
    write_port(tmp_path, PortSpec("mlx5_1", 1, netdev="ib1"))  # driver reloaded, second HCA back
    assert [(p.device, p.netdev) for p in source.read_ports()] == [("mlx5_0", "ib0"), ("mlx5_1", "ib1")]


def test_a_port_whose_restored_fault_is_raised_stays_down_while_it_is_missing(tmp_path: Path) -> None:
    """The agent restarts after the HCA vanished: it never saw the port, but
    the fault read back from the Node names it, so it is not cleared."""
    from agent.model import Entity, Fault
    from gpuwarden.contract import Action

    write_port(tmp_path, PortSpec("mlx5_0", 1))
    rules = HealthRules(config_from_dict({"hysteresis": {"clear_polls": 1}}), "n")
    entity = Entity.ib("mlx5_1", 1)
    rules.restore([Fault(ConditionType.INFINIBAND_DEGRADED, Reason.IB_PORT_DOWN, "down", Action.REPLACE, entity, T0)])
    source = SysfsIbSource(str(tmp_path))
    for step in range(1, 4):
        report = rules.evaluate(NodeSample(time=T0 + timedelta(seconds=10 * step), ib_ports=source.read_ports()))
        (fault,) = report.faults
        assert fault.entity == entity and "missing from sysfs" in fault.message
