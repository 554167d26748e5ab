"""The sim's fault table: every kind loads from a scenario, is checked, and shows in the node's reads."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from agent.sim.faults import FAULTS, missing_params
from agent.sim.node import SimNode
from agent.sim.scenario import Scenario, SimFault, SimGpus, SimInfiniband, scenario_from_dict

MOUNT = "/mnt/shared"

# Parameters that name something the small node below has.
PARAMS: dict[str, dict[str, Any]] = {
    "xid": {"gpu": 1, "xid": 79},
    "gpu_lost": {"gpu": 1},
    "gpu_reset": {"gpu": 1},
    "remap_pending": {"gpu": 1},
    "remap_failure": {"gpu": 1},
    "nvlink_down": {"gpu": 1, "link": 2},
    "nvlink_up": {"gpu": 1, "link": 2},
    "nvlink_errors": {"gpu": 1, "link": 2, "count": 5},
    "pcie_width": {"gpu": 1, "width": 8},
    "pcie_gen": {"gpu": 1, "gen": 3},
    "pcie_replays": {"gpu": 1, "count": 7},
    "utilization": {"gpu": 1, "pct": 55},
    "processes": {"gpu": 1, "count": 3},
    "ib_rate": {"device": "mlx5_1", "port": 1, "rate_gbps": 200.0},
    "ib_down": {"device": "mlx5_1", "port": 1},
    "ib_up": {"device": "mlx5_1", "port": 1},
    "ib_link_downed": {"device": "mlx5_1", "port": 1},
    "mount_hung": {"path": MOUNT},
    "mount_missing": {"path": MOUNT},
    "mount_ok": {"path": MOUNT},
}

# Kinds that undo another: the node is first put in the state they undo.
UNDOES = {
    "gpu_reset": ("pcie_width", {"gpu": 1, "width": 8}),
    "nvlink_up": ("nvlink_down", {"gpu": 1, "link": 2}),
    "ib_up": ("ib_down", {"device": "mlx5_1", "port": 1}),
    "mount_ok": ("mount_hung", {"path": MOUNT}),
}


def small_node() -> SimNode:
    return SimNode(Scenario(gpus=SimGpus(count=2, nvlinks=4), infiniband=SimInfiniband(hcas=2), mounts=[MOUNT]))


def reads(node: SimNode) -> tuple[Any, ...]:
    events = []
    while (ev := node.wait_event(0)) is not None:
        events.append((ev.kind, ev.xid, ev.uuid))
    records, _ = node.read_kmsg(0, 0)
    gpus = node.sample_gpus()
    processes = tuple(node.running_processes(g.index) for g in gpus)
    return gpus, processes, node.ib_ports(), node.mounts(), tuple(events), len(records)


def test_the_table_names_every_kind_once_with_parameters_a_scenario_can_hold() -> None:
    assert set(FAULTS) == set(PARAMS)
    fields = {f.name for f in dataclasses.fields(SimFault)} - {"at", "inject"}
    for kind, spec in FAULTS.items():
        assert set(spec.params) <= fields, kind
        assert missing_params(kind, PARAMS[kind]) == []


@pytest.mark.parametrize("kind", sorted(FAULTS))
def test_every_kind_loads_from_a_scenario_file(kind: str) -> None:
    sc = scenario_from_dict({"mounts": [MOUNT], "faults": [{"at": 0, "inject": kind, **PARAMS[kind]}]})
    assert sc.faults[0].inject == kind
    assert sc.faults[0].params() == PARAMS[kind]


@pytest.mark.parametrize("kind", sorted(FAULTS))
def test_every_kind_changes_what_the_node_reports(kind: str) -> None:
    node = small_node()
    if kind in UNDOES:
        before_kind, before_params = UNDOES[kind]
        node.inject(before_kind, **before_params)
    before = reads(node)
    node.inject(kind, **PARAMS[kind])
    assert reads(node) != before
    assert node.injected == (2 if kind in UNDOES else 1)


@pytest.mark.parametrize("kind", sorted(k for k, spec in FAULTS.items() if spec.params))
def test_a_missing_parameter_is_named(kind: str) -> None:
    first = FAULTS[kind].params[0]
    params = {k: v for k, v in PARAMS[kind].items() if k != first}
    with pytest.raises(ValueError, match=f"needs {first}"):
        small_node().inject(kind, **params)


@pytest.mark.parametrize(
    ("kind", "params", "says"),
    [
        ("xid", {"gpu": 9, "xid": 79}, "no GPU 9"),
        ("nvlink_down", {"gpu": 0, "link": 40}, "no NVLink 40"),
        ("ib_down", {"device": "mlx5_9", "port": 1}, "no IB port mlx5_9/1"),
        ("mount_hung", {"path": "/nope"}, "no mount /nope"),
    ],
)
def test_a_fault_on_something_the_node_lacks_is_refused(kind: str, params: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        small_node().inject(kind, **params)


def test_nodes_in_one_process_share_nothing() -> None:
    a, b = small_node(), small_node()
    assert a.boot_id != b.boot_id
    untouched = reads(b)
    a.inject("gpu_lost", gpu=0)
    a.inject("ib_down", device="mlx5_0", port=1)
    a.inject("mount_missing", path=MOUNT)
    assert a.sample_gpus()[0].lost
    assert reads(b) == untouched
    assert b.injected == 0


def test_nodes_given_their_own_identity_have_gpus_of_their_own() -> None:
    scenario = small_node().scenario
    by_name = [[g.uuid for g in SimNode(scenario, identity=name).sample_gpus()] for name in ("gpu-a", "gpu-b", "gpu-a")]
    assert by_name[0] == by_name[2]  # stable for one node across restarts of the simulation
    assert not set(by_name[0]) & set(by_name[1])
    # Without an identity the scenario names the GPUs, as a single simulated node always did.
    assert [g.uuid for g in SimNode(scenario).sample_gpus()] == [g.uuid for g in small_node().sample_gpus()]
