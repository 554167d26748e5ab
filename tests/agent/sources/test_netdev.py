"""pyroute2 against real links: a veth pair in a network namespace."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.config import config_from_dict
from agent.rules.engine import HealthRules
from agent.samples import NodeSample
from agent.sources.infiniband import SysfsIbSource
from agent.sources.netdev import NetdevReader
from gpuwarden.contract import Reason
from tests.agent.sysfs_tree import PortSpec, write_port

pytestmark = pytest.mark.netns


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def veth_ns() -> Iterator[str]:
    """A fresh namespace holding veth pair gwa <-> gwb, both up."""
    name = f"gw-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    ip("netns", "add", name)
    try:
        ip("-n", name, "link", "add", "gwa", "type", "veth", "peer", "name", "gwb")
        ip("-n", name, "link", "set", "gwa", "up")
        ip("-n", name, "link", "set", "gwb", "up")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True, timeout=30)


@pytest.fixture
def reader(veth_ns: str) -> Iterator[NetdevReader]:
    r = NetdevReader(netns=veth_ns)
    try:
        yield r
    finally:
        r.close()


def test_up_links_report_up_and_veth_speed(reader: NetdevReader) -> None:
    states = reader.read({"gwa", "gwb", "absent0"})
    assert set(states) == {"gwa", "gwb"}
    assert states["gwa"].oper_state == "UP" and states["gwb"].oper_state == "UP"
    assert states["gwa"].speed_mbps == 10000
    assert states["gwa"].admin_up is True and states["gwb"].admin_up is True


def test_peer_down_shows_as_lowerlayerdown_and_recovers(veth_ns: str, reader: NetdevReader) -> None:
    ip("-n", veth_ns, "link", "set", "gwb", "down")
    states = reader.read({"gwa", "gwb"})
    assert (states["gwb"].oper_state, states["gwb"].admin_up) == ("DOWN", False)
    assert (states["gwa"].oper_state, states["gwa"].admin_up) == ("LOWERLAYERDOWN", True)
    ip("-n", veth_ns, "link", "set", "gwb", "up")
    states = reader.read({"gwa", "gwb"})
    assert states["gwa"].oper_state == "UP" and states["gwb"].oper_state == "UP"


def test_host_namespace_does_not_see_the_test_links(reader: NetdevReader) -> None:
    host = NetdevReader()
    try:
        assert host.read({"gwa", "gwb"}) == {}
    finally:
        host.close()
    assert set(reader.read({"gwa"})) == {"gwa"}


def test_roce_port_with_its_netdev_down_is_judged_down(tmp_path: Path, veth_ns: str, reader: NetdevReader) -> None:
    # A RoCE HCA whose netdev is gwa: the port itself stays ACTIVE in sysfs.
    write_port(tmp_path, PortSpec("mlx5_0", 1, link_layer="Ethernet", rate_gbps=100.0, netdev="gwa"))
    source = SysfsIbSource(str(tmp_path), reader)
    rules = HealthRules(config_from_dict({"hysteresis": {"clear_polls": 1}}), "n")
    from datetime import UTC, datetime, timedelta

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    (port,) = source.read_ports()
    assert (port.netdev, port.netdev_oper_state, port.netdev_speed_mbps) == ("gwa", "UP", 10000)
    assert rules.evaluate(NodeSample(time=t0, ib_ports=(port,))).faults == ()

    ip("-n", veth_ns, "link", "set", "gwb", "down")
    (port,) = source.read_ports()
    assert port.netdev_oper_state == "LOWERLAYERDOWN"
    report = rules.evaluate(NodeSample(time=t0 + timedelta(seconds=10), ib_ports=(port,)))
    assert [f.reason for f in report.faults] == [Reason.IB_PORT_DOWN]
    assert "gwa LOWERLAYERDOWN" in report.faults[0].message

    ip("-n", veth_ns, "link", "set", "gwb", "up")
    (port,) = source.read_ports()
    report = rules.evaluate(NodeSample(time=t0 + timedelta(seconds=20), ib_ports=(port,)))
    assert report.faults == ()

    # Set down on purpose (an interface nobody configured): not a fault.
    ip("-n", veth_ns, "link", "set", "gwa", "down")
    (port,) = source.read_ports()
    assert (port.netdev_oper_state, port.netdev_admin_up) == ("DOWN", False)
    report = rules.evaluate(NodeSample(time=t0 + timedelta(seconds=30), ib_ports=(port,)))
    assert report.faults == ()
