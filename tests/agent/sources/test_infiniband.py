"""InfiniBand from a sysfs fixture tree with two HCAs, healthy and degraded."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from agent.config import config_from_dict
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


def test_degraded_hca_judged_from_the_tree(tmp_path: Path) -> None:
    two_hcas(tmp_path)
    source = SysfsIbSource(str(tmp_path))
    rules = HealthRules(config_from_dict({"infiniband": {"expected_ports": ["mlx5_1/2"]}}), "n")
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


def test_unused_port_is_not_a_fault(tmp_path: Path) -> None:
    two_hcas(tmp_path)
    rules = HealthRules(config_from_dict(None), "n")
    report = rules.evaluate(NodeSample(time=T0, ib_ports=SysfsIbSource(str(tmp_path)).read_ports()))
    assert {f.entity.key for f in report.faults} == {"ib/mlx5_1/1"}


def test_an_hca_that_appears_later_is_read_with_its_netdev(tmp_path: Path) -> None:
    write_port(tmp_path, PortSpec("mlx5_0", 1, netdev="ib0"))
    source = SysfsIbSource(str(tmp_path))
    assert [p.netdev for p in source.read_ports()] == ["ib0"]
    write_port(tmp_path, PortSpec("mlx5_1", 1, netdev="ib1"))  # driver reloaded, second HCA back
    assert [(p.device, p.netdev) for p in source.read_ports()] == [("mlx5_0", "ib0"), ("mlx5_1", "ib1")]
