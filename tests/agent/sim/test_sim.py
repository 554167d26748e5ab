"""The sim backend: scenario files, the timeline, and run-time injection."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import ConfigError
from agent.probes.kmsg import KERNEL_LOG_CLOCK, parse_record
from agent.sim.node import SimNode
from agent.sim.scenario import list_scenarios, load_scenario, scenario_from_dict


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_shipped_scenarios_load() -> None:
    names = list_scenarios()
    assert {"default", "healthy", "degrading"} <= set(names)
    for name in names:
        sc = load_scenario(name)
        assert sc.name == name and sc.gpus.count > 0 and sc.description


def test_default_scenario_node() -> None:
    node = SimNode(load_scenario("default"))
    gpus = node.sample_gpus()
    assert len(gpus) == 8 and len({g.uuid for g in gpus}) == 8 and len({g.pci_bus_id for g in gpus}) == 8
    assert gpus[3].remapped_rows is not None and gpus[3].remapped_rows.pending
    assert all(len(g.nvlinks) == 18 for g in gpus)
    ports = node.ib_ports()
    assert [p.state for p in ports].count("DOWN") == 1 and len(ports) == 8
    assert [m.path for m in node.mounts()] == ["/mnt/shared"]


def test_timeline_plays_out_with_time() -> None:
    clock = Clock()
    node = SimNode(load_scenario("degrading"), monotonic=clock)
    assert node.sample_gpus()[5].pcie.current_width == 16  # type: ignore[union-attr]
    clock.now += 25
    assert node.sample_gpus()[5].pcie.current_width == 8  # type: ignore[union-attr]
    clock.now += 100
    assert node.sample_gpus()[6].lost
    assert not node.mounts()[0].responsive


def test_xid_injection_reaches_nvml_events_and_the_kernel_log() -> None:
    node = SimNode(load_scenario("healthy"))
    node.inject("xid", gpu=2, xid=79)
    ev = node.wait_event(1.0)
    assert ev is not None and ev.xid == 79 and ev.pci_bus_id == node.sample_gpus()[2].pci_bus_id
    records, _ = node.read_kmsg(0, 0)
    parsed = [e for e in (parse_record(r, KERNEL_LOG_CLOCK.anchor()) for r in records) if e is not None]
    assert [(e.xid, e.pci_bus_id) for e in parsed] == [(79, ev.pci_bus_id)]


def test_an_injected_xid_154_names_its_recovery_action_in_both_sources() -> None:
    node = SimNode(load_scenario("healthy"))
    node.inject(
        "xid", gpu=1, xid=154, message="GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    )
    ev = node.wait_event(1.0)
    assert ev is not None and (ev.xid, ev.recovery_action) == (154, 2)
    records, _ = node.read_kmsg(0, 0)
    parsed = [e for e in (parse_record(r, KERNEL_LOG_CLOCK.anchor()) for r in records) if e is not None]
    assert [(e.xid, e.recovery_action) for e in parsed] == [(154, 2)]


@pytest.mark.parametrize(
    ("kind", "params", "check"),
    [
        ("remap_failure", {"gpu": 1}, lambda n: n.sample_gpus()[1].remapped_rows.failure),
        ("nvlink_down", {"gpu": 1, "link": 3}, lambda n: not n.sample_gpus()[1].nvlinks[3].active),
        ("nvlink_errors", {"gpu": 1, "link": 3, "count": 9}, lambda n: n.sample_gpus()[1].nvlinks[3].error_total == 9),
        ("pcie_gen", {"gpu": 0, "gen": 3}, lambda n: n.sample_gpus()[0].pcie.current_gen == 3),
        ("pcie_replays", {"gpu": 0, "count": 5}, lambda n: n.sample_gpus()[0].pcie.replay_counter == 5),
        ("utilization", {"gpu": 0, "pct": 90}, lambda n: n.sample_gpus()[0].utilization_gpu_pct == 90),
        ("ib_down", {"device": "mlx5_2", "port": 1}, lambda n: n.ib_ports()[2].netdev_oper_state == "LOWERLAYERDOWN"),
        (
            "ib_link_downed",
            {"device": "mlx5_2", "port": 1, "count": 2},
            lambda n: n.ib_ports()[2].counters.link_downed == 2,
        ),
        ("mount_missing", {"path": "/mnt/shared"}, lambda n: not n.mounts()[0].mounted),
    ],
)
def test_injections(kind: str, params: dict[str, object], check: object) -> None:
    node = SimNode(load_scenario("healthy"))
    node.inject(kind, **params)
    assert check(node)  # type: ignore[operator]


def test_gpu_reset_applies_pending_remaps_and_retrains_links() -> None:
    node = SimNode(load_scenario("default"))
    node.inject("nvlink_down", gpu=3, link=0)
    node.inject("pcie_width", gpu=3, width=4)
    node.inject("gpu_reset", gpu=3)
    g = node.sample_gpus()[3]
    assert not g.remapped_rows.pending and g.nvlinks[0].active and g.pcie.current_width == 16  # type: ignore[union-attr]


def test_bad_injections_name_the_problem() -> None:
    node = SimNode(load_scenario("healthy"))
    with pytest.raises(ValueError, match="unknown sim fault kind 'melt'"):
        node.inject("melt", gpu=1)
    with pytest.raises(ValueError, match="xid needs xid"):
        node.inject("xid", gpu=1)
    with pytest.raises(ValueError, match="no GPU 12"):
        node.inject("gpu_lost", gpu=12)
    with pytest.raises(ValueError, match="no IB port mlx5_9/1"):
        node.inject("ib_down", device="mlx5_9", port=1)


def test_bad_scenarios_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"gpus.count: expected an integer"):
        scenario_from_dict({"gpus": {"count": "eight"}})
    with pytest.raises(ConfigError, match=r"faults\[0\].inject: unknown kind 'boom'"):
        scenario_from_dict({"faults": [{"at": 0, "inject": "boom"}]})
    with pytest.raises(ConfigError, match=r"faults\[0\]: xid needs gpu"):
        scenario_from_dict({"faults": [{"at": 0, "inject": "xid", "xid": 79}]})
    with pytest.raises(ConfigError, match="no scenario named 'nope'"):
        load_scenario("nope")
    path = tmp_path / "node.yaml"
    path.write_text("name: custom\ngpus: {count: 2, nvlinks: 0}\ninfiniband: {hcas: 0}\n")
    sc = load_scenario(str(path))
    assert sc.name == "custom" and SimNode(sc).ib_ports() == ()


def test_a_scenario_file_that_is_not_utf8_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_bytes(b"name: \xc3\x28\n")
    with pytest.raises(ConfigError, match=rf"scenario file {path} is not UTF-8 text: byte 0xc3 at offset 6"):
        load_scenario(str(path))


def test_a_misspelt_scenario_key_names_the_file_and_the_closest_key(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text("gpus: {cuont: 2}\n")
    with pytest.raises(ConfigError, match=rf"{path}: gpus.cuont: unknown key 'cuont' \(did you mean 'count'\?\)"):
        load_scenario(str(path))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"faults": [{"at": float("nan"), "inject": "gpu_lost", "gpu": 1}]}, "faults[0].at: must be a finite"),
        ({"faults": [{"at": float("inf"), "inject": "gpu_lost", "gpu": 1}]}, "faults[0].at: must be a finite"),
        ({"faults": [{"at": -1, "inject": "gpu_lost", "gpu": 1}]}, "faults[0].at: must be a finite"),
        (
            {"faults": [{"at": 0, "inject": "ib_rate", "device": "mlx5_0", "port": 1, "rate_gbps": float("nan")}]},
            "faults[0].rate_gbps: must be a finite number greater than 0, got nan",
        ),
        ({"infiniband": {"rate_gbps": float("inf")}}, "infiniband.rate_gbps: must be a finite number greater than 0"),
    ],
)
def test_non_finite_scenario_numbers_are_refused_by_key(data: object, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        scenario_from_dict(data, "s.yaml")
    assert f"s.yaml: {message}" in str(err.value)
