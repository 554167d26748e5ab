"""Reading snapshot and fair-share YAML into engine units."""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gpuwarden.contract import Action
from scheduler.engine.model import UNLIMITED, PlacementStrategy, TaintEffect, TaskStatus
from scheduler.engine.session import run_session
from scheduler.snapshot_io import KNOWN_KEYS, SnapshotError, parse_fairshare, parse_snapshot


def test_units_are_converted_to_engine_units() -> None:
    snap = parse_snapshot(
        {
            "now": 10,
            "config": {"strategy": "spread", "poolStrategies": {"p": "binpack"}, "staleGangGraceSeconds": 5},
            "nodes": [
                {
                    "name": "n",
                    "cpu": "1500m",
                    "memory": "2Gi",
                    "gpus": [{"index": 3, "memory": "40Gi", "healthy": False, "mig": True}],
                    "taints": [{"key": "k", "effect": "NoExecute"}],
                    "conditions": [{"type": "GpuXidError", "status": "True", "action": "REBOOT", "gpus": [3]}],
                }
            ],
            "queues": [{"name": "q", "gpu": {"quota": 2.5, "limit": "unlimited"}, "memory": {"quota": "1Ti"}}],
            "jobs": [
                {
                    "name": "j",
                    "queue": "q",
                    "minMember": 2,
                    "tasks": [{"name": "t", "replicas": 2, "cpu": 0.25, "memory": 1048576, "status": "Running"}],
                }
            ],
        }
    )
    node = snap.nodes[0]
    assert node.cpu_milli == 1500 and node.memory_mib == 2048
    assert node.gpus[0].index == 3 and node.gpus[0].memory_mib == 40960
    assert not node.gpus[0].healthy and node.gpus[0].mig_enabled
    assert node.taints[0].effect is TaintEffect.NO_EXECUTE
    assert node.conditions[0].action is Action.REBOOT and node.conditions[0].gpu_indices == (3,)
    q = snap.queues[0]
    assert q.gpu.quota == 2500 and q.gpu.limit == UNLIMITED and q.memory.quota == 1024 * 1024
    job = snap.jobs[0]
    assert [t.name for t in job.tasks] == ["t-0", "t-1"]
    assert job.tasks[0].cpu_milli == 250 and job.tasks[0].memory_mib == 1
    assert job.tasks[0].status is TaskStatus.RUNNING
    assert snap.config.strategy("p") is PlacementStrategy.BINPACK
    assert snap.config.strategy("other") is PlacementStrategy.SPREAD


def test_fairshare_input() -> None:
    data = parse_fairshare(
        {
            "capacity": {"default": {"gpu": 8, "cpu": 16, "memory": "64Gi"}},
            "queues": [{"name": "a"}],
            "demand": {"a": {"gpu": 0.5}},
        }
    )
    assert data.capacity["default"] == (8000, 16000, 65536)
    assert data.demand["a"] == (500, 0, 0)


def test_every_problem_is_reported_with_its_place() -> None:
    with pytest.raises(SnapshotError) as info:
        parse_snapshot(
            {
                "nodes": "not a list",
                "queues": [{"name": "q", "gpu": {"overQuotaWeight": -1}}],
                "jobs": [
                    {
                        "name": "j",
                        "queue": "q",
                        "preemptible": "maybe",
                        "tasks": [{"name": "t", "gpus": 1.5, "cpu": -2}],
                    }
                ],
                "config": {"strategy": "random"},
            }
        )
    text = str(info.value)
    assert "nodes: expected a list" in text
    assert "queues[0].gpu.overQuotaWeight: must not be negative" in text
    assert "jobs[0].preemptible: expected true or false" in text
    assert "jobs[0].tasks[0].gpus: expected a whole number" in text
    assert "config.strategy: unknown strategy 'random'" in text
    assert "jobs[0].tasks[0].cpu: must not be negative, got -2" in text


def problems(parse: Callable[[Mapping[str, Any]], object], text: str) -> str:
    """The refusal of the document ``text``, read as YAML the way the loader reads it."""
    with pytest.raises(SnapshotError) as info:
        parse(yaml.safe_load(text))
    return str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("queues: [{name: a, gpu: {quota: .nan}}]", "queues[0].gpu.quota: must be a finite number, got nan"),
        ("queues: [{name: a, gpu: {limit: .inf}}]", "queues[0].gpu.limit: must be a finite number, got inf"),
        ("queues: [{name: a, cpu: {quota: -.inf}}]", "queues[0].cpu.quota: must be a finite number, got -inf"),
        ("queues: [{name: a, memory: {quota: .inf}}]", "queues[0].memory.quota: must be a finite number, got inf"),
        ("queues: [{name: a, gpu: {overQuotaWeight: .nan}}]", "queues[0].gpu.overQuotaWeight: must be a finite"),
        ("capacity: {default: {gpu: .inf}}", "capacity.default.gpu: must be a finite number, got inf"),
        ("capacity: {default: {cpu: .nan}}", "capacity.default.cpu: must be a finite number, got nan"),
        ("capacity: {default: {cpu: nan}}", "capacity.default.cpu: must be a finite number, got 'nan'"),
        ("demand: {a: {gpu: .nan}}", "demand.a.gpu: must be a finite number, got nan"),
    ],
)
def test_nan_and_inf_are_refused_by_key_and_value(text: str, message: str) -> None:
    assert message in problems(parse_fairshare, text)


def test_nan_and_inf_in_a_snapshot_are_refused_by_key_and_value() -> None:
    text = problems(
        parse_snapshot,
        "now: .nan\nconfig: {staleGangGraceSeconds: .inf}\nnodes: [{name: n, cpu: .inf, memory: .nan}]\n"
        "jobs: [{name: j, queue: q, created: .inf, tasks: [{name: t, cpu: .nan}]}]\n",
    )
    assert "now: must be a finite number, got nan" in text
    assert "config.staleGangGraceSeconds: must be a finite number, got inf" in text
    assert "nodes[0].cpu: must be a finite number, got inf" in text
    assert "nodes[0].memory: must be a finite number, got nan" in text
    assert "jobs[0].created: must be a finite number, got inf" in text
    assert "jobs[0].tasks[0].cpu: must be a finite number, got nan" in text


def test_numbers_yaml_reads_as_strings_are_numbers() -> None:
    """YAML 1.1 reads ``1e3`` (no dot) as a string: where a number is meant it is one."""
    data = parse_fairshare(
        yaml.safe_load(
            "capacity: {default: {gpu: 1e3, cpu: 2e3, memory: 1e9}}\n"
            "queues: [{name: a, gpu: {quota: 1e2, overQuotaWeight: 2e0}}]\n"
        )
    )
    assert data.capacity["default"] == (1_000_000, 2_000_000, math.ceil(1e9 / 2**20))
    assert data.queues[0].gpu.quota == 100_000 and data.queues[0].gpu.over_quota_weight == 2.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("queues: [{name: a, gpu: {quota: 1e300}}]", "queues[0].gpu.quota: 1e300 GPUs is beyond any cluster"),
        ("capacity: {default: {gpu: 1e300}}", "capacity.default.gpu: 1e300 GPUs is beyond any cluster"),
        ("capacity: {default: {cpu: 1e300}}", "capacity.default.cpu: 1e300 cores is beyond any cluster"),
        ("capacity: {default: {memory: 1e300}}", "capacity.default.memory: 1e300 bytes is beyond any cluster"),
        ("demand: {a: {memory: 9999999Pi}}", "demand.a.memory: '9999999Pi' is beyond any cluster"),
        ("queues: [{name: a, gpu: {overQuotaWeight: 1e300}}]", "queues[0].gpu.overQuotaWeight: 1e300 is beyond"),
    ],
)
def test_amounts_beyond_any_cluster_are_refused(text: str, message: str) -> None:
    assert message in problems(parse_fairshare, text)


def test_counts_beyond_any_cluster_are_refused() -> None:
    text = problems(
        parse_snapshot,
        "nodes: [{name: n, gpus: 100000000}]\n"
        "jobs: [{name: j, queue: q, minMember: 1e300, tasks: [{name: t, replicas: 1000000000, gpus: 1e300}]}]\n",
    )
    assert "nodes[0].gpus: 100000000 is beyond any node" in text
    assert "jobs[0].minMember: 1e300 is beyond any cluster" in text
    assert "jobs[0].tasks[0].replicas: 1000000000 is beyond any cluster" in text
    assert "jobs[0].tasks[0].gpus: 1e300 is beyond any node" in text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("queues: [{name: a, gpu: {overquotaweight: 2}}]", "queues[0].gpu.overquotaweight: unknown key"),
        ("queues: [{name: a, gpu: {limt: 2}}]", "queues[0].gpu.limt: unknown key 'limt' (did you mean 'limit'?)"),
        ("queues: [{name: a, prority: 2}]", "queues[0].prority: unknown key 'prority' (did you mean 'priority'?)"),
        ("queues: [{name: a, gpus: {quota: 1}}]", "queues[0].gpus: unknown key 'gpus' (did you mean 'gpu'?)"),
        ("demnd: {a: {gpu: 1}}", "demnd: unknown key 'demnd' (did you mean 'demand'?)"),
        ("capacity: {default: {gpus: 1}}", "capacity.default.gpus: unknown key 'gpus' (did you mean 'gpu'?)"),
        ("demand: {a: {memroy: 1Gi}}", "demand.a.memroy: unknown key 'memroy' (did you mean 'memory'?)"),
    ],
)
def test_unknown_fairshare_keys_are_refused_with_a_suggestion(text: str, message: str) -> None:
    assert message in problems(parse_fairshare, text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nodse: []", "nodse: unknown key 'nodse' (did you mean 'nodes'?)"),
        ("config: {stratgy: spread}", "config.stratgy: unknown key 'stratgy' (did you mean 'strategy'?)"),
        ("nodes: [{name: n, gpuMem: 1Gi}]", "nodes[0].gpuMem: unknown key 'gpuMem' (did you mean 'gpuMemory'?)"),
        ("nodes: [{name: n, gpus: [{helthy: false}]}]", "nodes[0].gpus[0].helthy: unknown key 'helthy'"),
        ("nodes: [{name: n, taints: [{key: k, efect: NoSchedule}]}]", "nodes[0].taints[0].efect: unknown key"),
        ("nodes: [{name: n, conditions: [{type: X, acton: REBOOT}]}]", "nodes[0].conditions[0].acton: unknown key"),
        ("jobs: [{name: j, queue: q, minMembers: 2}]", "jobs[0].minMembers: unknown key 'minMembers'"),
        ("jobs: [{name: j, queue: q, tasks: [{name: t, gpu: 1}]}]", "jobs[0].tasks[0].gpu: unknown key 'gpu'"),
        (
            "jobs: [{name: j, queue: q, tasks: [{name: t, tolerations: [{key: k, operater: Exists}]}]}]",
            "jobs[0].tasks[0].tolerations[0].operater: unknown key 'operater' (did you mean 'operator'?)",
        ),
    ],
)
def test_unknown_snapshot_keys_are_refused_with_a_suggestion(text: str, message: str) -> None:
    assert message in problems(parse_snapshot, text)


def test_free_form_mappings_keep_any_key() -> None:
    snap = parse_snapshot(
        yaml.safe_load(
            "config: {poolStrategies: {my-pool: spread}}\n"
            "nodes: [{name: n, labels: {limt: x, kai.scheduler/queue: q}}]\n"
            "jobs: [{name: j, queue: q, tasks: [{name: t, nodeSelector: {prority: x},"
            " annotations: {gpu-fraction: '0.5', gpuwarden.io/gpu-memory: '2000'}}]}]\n"
        )
    )
    assert snap.nodes[0].labels == {"limt": "x", "kai.scheduler/queue": "q"}
    assert snap.jobs[0].tasks[0].annotations["gpu-fraction"] == "0.5"
    assert snap.config.strategy("my-pool") is PlacementStrategy.SPREAD


@pytest.mark.parametrize("parse", [parse_fairshare, parse_snapshot])
def test_a_queue_defined_twice_is_named_with_both_places(parse: Callable[[Mapping[str, Any]], object]) -> None:
    text = problems(parse, "queues: [{name: a}, {name: x}, {name: b}, {name: x}]")
    assert "queues[3].name: queue 'x' is defined twice (queues[1] and queues[3])" in text


@functools.cache
def _examples() -> list[tuple[str, Callable[[Mapping[str, Any]], object], Any]]:
    root = resources.files("scheduler") / "examples"
    return [
        ("fairshare.yaml", parse_fairshare, yaml.safe_load(root.joinpath("fairshare.yaml").read_text())),
        ("snapshot.yaml", parse_snapshot, yaml.safe_load(root.joinpath("snapshot.yaml").read_text())),
        ("the kubelet's word", parse_snapshot, yaml.safe_load(_KUBELET_WORD)),
    ]


# Mappings whose keys are names the user chose (pools, queues, labels), not the format's keys.
_FREE_FORM = {"labels", "annotations", "nodeSelector", "poolStrategies", "kubeletHolders", "capacity", "demand"}


def _mappings(value: Any, path: str, free: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """Every mapping of the format in ``value`` with its key path, free-form ones left out."""
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(value, dict):
        if not free:
            found.append((path, value))
        for key, child in value.items():
            found += _mappings(child, f"{path}.{key}" if path else str(key), key in _FREE_FORM)
    elif isinstance(value, list):
        for i, child in enumerate(value):
            found += _mappings(child, f"{path}[{i}]")
    return found


def _typo(key: str, kind: int, at: int, letter: str) -> str:
    at %= len(key)
    if kind == 0:  # a letter dropped
        return key[:at] + key[at + 1 :]
    if kind == 1:  # a letter doubled or added
        return key[:at] + letter + key[at:]
    if kind == 2:  # two letters swapped
        return key[:at] + key[at + 1 : at + 2] + key[at] + key[at + 2 :]
    return key.lower() if key != key.lower() else key.upper()  # the wrong case


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_misspelt_key_is_refused_by_name(data: st.DataObject) -> None:
    name, parse, document = data.draw(st.sampled_from(_examples()))
    document = copy.deepcopy(document)
    place, mapping = data.draw(st.sampled_from(_mappings(document, "")))
    key = data.draw(st.sampled_from(sorted(mapping)))
    typo = _typo(
        key,
        data.draw(st.integers(0, 3)),
        data.draw(st.integers(0, 40)),
        data.draw(st.sampled_from("aeiorstx")),
    )
    assume(typo and typo != key and typo not in KNOWN_KEYS)
    mapping[typo] = mapping.pop(key)
    dotted = f"{place}.{typo}" if place else typo
    with pytest.raises(SnapshotError) as info:
        parse(document)
    assert f"{dotted}: unknown key {typo!r}" in str(info.value), name


# A device-plugin node as its GPUNode tells it: GPU 0 faulted (an NVLink the
# plugin does not check, so still offered) before pod a started, and the
# kubelet reports pod a there although gpuwarden assigned it GPU 1.
_KUBELET_WORD = """
now: 1700000100
nodes:
  - name: n1
    cpu: 64
    memory: 512Gi
    gpus:
      - {index: 0, healthy: false, offered: true, faultedSince: 1699999000}
      - {index: 1, offered: true}
      - {index: 2, offered: false}
      - {index: 3}
    conditions:
      - {type: GpuNvlinkDegraded, status: "True", reason: NvlinkDown, action: RESET_GPU, gpus: [0]}
    kubeletHolders:
      uid-a: [0]
      other/theirs: [3]
  - {name: n2, cpu: 64, memory: 512Gi, gpus: 4}
queues:
  - {name: q, gpu: {quota: 8}}
jobs:
  - name: a
    queue: q
    created: 1699990000
    tasks:
      - {name: a, uid: uid-a, status: Running, node: n1, gpus: 1, gpuIndices: [1], started: 1699999500}
"""


def test_the_kubelets_word_is_read_as_the_gpunode_gives_it() -> None:
    snap = parse_snapshot(yaml.safe_load(_KUBELET_WORD))
    n1, n2 = snap.nodes
    assert [g.offered for g in n1.gpus] == [True, True, False, None]
    assert [g.faulted_since for g in n1.gpus] == [1699999000.0, None, None, None]
    assert n1.kubelet_holders == {"uid-a": (0,), "other/theirs": (3,)}
    assert n2.kubelet_holders is None, "a node that says nothing is not one that says no pod holds a GPU"
    (task,) = snap.jobs[0].tasks
    assert task.started == 1699999500.0


def test_an_empty_holder_mapping_is_kept_apart_from_none() -> None:
    data = yaml.safe_load(_KUBELET_WORD)
    data["nodes"][1]["kubeletHolders"] = {}
    assert parse_snapshot(data).nodes[1].kubelet_holders == {}


def test_a_snapshot_with_the_kubelets_word_is_scheduled_by_it() -> None:
    # The device manager started pod a on GPU 0 after GPU 0 had faulted: a
    # misplacement. The pod the kubelet reports on the bad GPU goes, with a reason
    # naming that GPU (not GPU 1, which gpuwarden meant).
    (ev,) = run_session(parse_snapshot(yaml.safe_load(_KUBELET_WORD))).evictions
    assert ev.pod == "a" and "GPU 0 on node n1" in ev.reason, ev.reason


def test_a_pod_started_before_its_gpu_failed_is_not_a_misplacement() -> None:
    data = yaml.safe_load(_KUBELET_WORD)
    data["jobs"][0]["tasks"][0]["started"] = 1699998000  # before the fault
    (ev,) = run_session(parse_snapshot(data)).evictions
    assert "device manager" not in ev.reason, ev.reason


@pytest.mark.parametrize(
    ("holders", "message"),
    [
        ({"uid-a": [-1]}, "nodes[0].kubeletHolders.uid-a[0]: expected a GPU index from 0 to 1023, got -1"),
        ({"uid-a": ["0"]}, "nodes[0].kubeletHolders.uid-a[0]: expected a GPU index from 0 to 1023, got '0'"),
        ({"uid-a": [True]}, "nodes[0].kubeletHolders.uid-a[0]: expected a GPU index from 0 to 1023, got True"),
        ({"uid-a": 0}, "nodes[0].kubeletHolders.uid-a: expected a list"),
        ([0], "nodes[0].kubeletHolders: expected a mapping, got list"),
    ],
)
def test_unreadable_holders_are_refused_by_place(holders: Any, message: str) -> None:
    data = yaml.safe_load(_KUBELET_WORD)
    data["nodes"][0]["kubeletHolders"] = holders
    with pytest.raises(SnapshotError) as info:
        parse_snapshot(data)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        ("offered", "maybe", "nodes[0].gpus[0].offered: expected true or false, got 'maybe'"),
        ("faultedSince", math.inf, "nodes[0].gpus[0].faultedSince: must be a finite number"),
        ("faultedSince", "yesterday", "nodes[0].gpus[0].faultedSince: expected seconds since the epoch"),
    ],
)
def test_unreadable_gpu_truth_is_refused_by_place(where: str, value: object, message: str) -> None:
    data = yaml.safe_load(_KUBELET_WORD)
    data["nodes"][0]["gpus"][0][where] = value
    with pytest.raises(SnapshotError) as info:
        parse_snapshot(data)
    assert message in str(info.value)
