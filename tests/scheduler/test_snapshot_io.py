"""Reading snapshot and fair-share YAML into engine units."""

from __future__ import annotations

import pytest

from gpuwarden.contract import Action
from scheduler.engine.model import UNLIMITED, PlacementStrategy, TaintEffect, TaskStatus
from scheduler.snapshot_io import SnapshotError, parse_fairshare, parse_snapshot


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
