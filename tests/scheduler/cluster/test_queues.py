"""Queue and PodGroup objects, as the API server returns them, to engine data."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.cluster.queues import PodGroupSpec, podgroup_spec, queue_from_object
from scheduler.engine.model import UNGOVERNED, UNLIMITED, Queue, QueueResource


def queue_obj(name: str = "vision", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.gpuwarden.io/v1alpha1",
        "kind": "Queue",
        "metadata": {"name": name, "uid": "u1", "resourceVersion": "7"},
        "spec": spec,
    }


def podgroup_obj(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "train", "namespace": "ml"}, "spec": spec}


def test_a_full_queue_converts_to_engine_units() -> None:
    q = queue_from_object(
        queue_obj(
            parentQueue="research",
            priority=5,
            nodePool="a100",
            resources={
                "gpu": {"quota": 2.5, "limit": 8, "overQuotaWeight": 2},
                "cpu": {"quota": "500m", "limit": 64},
                "memory": {"quota": "64Gi", "limit": "1.5Ti", "overQuotaWeight": 0},
            },
        )
    )
    assert q == Queue(
        name="vision",
        parent="research",
        priority=5,
        node_pool="a100",
        gpu=QueueResource(2500, 8000, 2.0),
        cpu=QueueResource(500, 64000, 1.0),
        memory=QueueResource(65536, 1536 * 1024, 0.0),
    )


def test_a_gpu_only_queue_governs_nothing_else() -> None:
    q = queue_from_object(queue_obj(resources={"gpu": {"quota": 4}}))
    assert isinstance(q, Queue)
    assert q.parent is None
    assert q.node_pool == "default"
    assert q.gpu == QueueResource(4000, UNLIMITED, 1.0)
    assert q.cpu == UNGOVERNED
    assert q.memory == UNGOVERNED


def test_a_queue_without_resources_governs_nothing() -> None:
    q = queue_from_object(queue_obj())
    assert isinstance(q, Queue)
    assert q.resources == (UNGOVERNED, UNGOVERNED, UNGOVERNED)


def test_a_named_resource_without_quota_may_only_borrow() -> None:
    q = queue_from_object(queue_obj(resources={"cpu": {"limit": "8"}}))
    assert isinstance(q, Queue)
    assert q.cpu == QueueResource(0, 8000, 1.0)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"resources": {"gpu": {"quota": -1}}}, "queue vision: spec.resources.gpu.quota: must not be negative"),
        ({"resources": {"cpu": {"limit": "-2"}}}, "spec.resources.cpu.limit: must not be negative"),
        ({"resources": {"memory": {"quota": "64GB"}}}, "spec.resources.memory.quota: not a quantity: '64GB'"),
        ({"resources": {"gpu": {"quota": float("nan")}}}, "spec.resources.gpu.quota: must be a finite number"),
        ({"resources": {"gpu": {"quota": float("inf")}}}, "spec.resources.gpu.quota: must be a finite number"),
        ({"resources": {"gpu": {"quota": 8, "limit": 4}}}, "spec.resources.gpu: limit 4 is below quota 8"),
        ({"resources": {"gpu": {"overQuotaWeight": -1}}}, "overQuotaWeight: must be between 0 and 1000000"),
        ({"resources": {"gpu": {"overQuotaWeight": float("nan")}}}, "overQuotaWeight: expected a finite number"),
        ({"resources": {"gpu": {"overQuotaWeight": "2"}}}, "overQuotaWeight: expected a finite number"),
        ({"resources": {"gpu": {"qouta": 4}}}, "spec.resources.gpu: unknown field 'qouta'"),
        ({"resources": {"nvidia.com/gpu": {"quota": 4}}}, "unknown resource 'nvidia.com/gpu'"),
        ({"resources": {"gpu": 4}}, "spec.resources.gpu: expected an object, got 4"),
        ({"resources": [1]}, "spec.resources: expected an object"),
        ({"priority": 2_000_000}, "spec.priority: must be between"),
        ({"priority": "high"}, "spec.priority: expected a whole number"),
        ({"priority": True}, "spec.priority: expected a whole number"),
        ({"parentQueue": 3}, "spec.parentQueue: expected a string"),
        ({"resources": {"gpu": {"quota": 2_000_000}}}, "beyond any cluster"),
    ],
)
def test_a_bad_queue_is_named_with_its_field(spec: dict[str, Any], message: str) -> None:
    problem = queue_from_object(queue_obj(**spec))
    assert isinstance(problem, str)
    assert message in problem
    assert problem.startswith("queue vision: ")


def test_a_queue_object_without_name_or_spec_is_refused() -> None:
    assert queue_from_object({"spec": {}}) == "queue object: metadata.name: missing"
    assert queue_from_object({"metadata": {"name": "x"}}) == "queue x: spec: missing"


def test_a_podgroup_converts() -> None:
    assert podgroup_spec(
        podgroup_obj(minMember=4, queue="vision", priorityClassName="train", preemptibility="non-preemptible")
    ) == PodGroupSpec(4, "vision", "train", False)
    assert podgroup_spec(podgroup_obj(queue="vision", preemptibility="preemptible")) == (1, "vision", None, True)
    assert podgroup_spec(podgroup_obj(queue="vision")) == (1, "vision", None, None)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"queue": "q", "minMember": 0}, "spec.minMember: must be between 1 and 1000000, got 0"),
        ({"queue": "q", "minMember": 2.5}, "spec.minMember: expected a whole number"),
        ({"minMember": 2}, "spec.queue: missing"),
        ({"queue": "q", "preemptibility": "sometimes"}, "must be 'preemptible' or 'non-preemptible', got 'sometimes'"),
        ({"queue": "q", "priorityClassName": 5}, "spec.priorityClassName: expected a string"),
    ],
)
def test_a_bad_podgroup_is_named_with_its_field(spec: dict[str, Any], message: str) -> None:
    problem = podgroup_spec(podgroup_obj(**spec))
    assert isinstance(problem, str)
    assert problem.startswith("pod group ml/train: ")
    assert message in problem
