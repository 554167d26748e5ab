"""The webhook's bounds on GPU-sharing annotations hold before it knows the cluster's GPUs.

Its inventory of GPUs is empty until its watch has listed the nodes (and
stays empty in a cluster without GPU nodes); the annotations' own bounds
(``gpuwarden.contract``: decimals of a fraction, the MiB ceiling, the
device count) do not wait for it, and the scheduler reads the same bounds
through the same parser.
"""

from __future__ import annotations

import pytest

from gpuwarden import contract
from scheduler.cluster.convert import task_from_pod
from scheduler.cluster.webhook.review import ALLOWED, review_pod
from scheduler.engine.resources import parse_gpu_request


def _pod(annotations: dict[str, str]) -> dict[str, object]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "annotations": annotations},
        "spec": {"schedulerName": contract.SCHEDULER_NAME, "containers": [{"name": "c"}]},
    }


@pytest.mark.parametrize(
    ("annotations", "fragment"),
    [
        ({contract.ANNOTATION_GPU_FRACTION: "1e-300"}, "must be a plain decimal such as 0.25"),
        ({contract.ANNOTATION_GPU_FRACTION: "0." + "1" * 4998}, "(5000 characters) must be a plain decimal"),
        ({contract.ANNOTATION_KAI_GPU_FRACTION: "0.0001"}, "gpu-fraction='0.0001' has more than 3 decimal places"),
        ({contract.ANNOTATION_GPU_MEMORY: "99999999999"}, "more than any GPU holds (at most 1048576 MiB)"),
        (
            {contract.ANNOTATION_GPU_MEMORY: "1024", contract.ANNOTATION_GPU_FRACTION_NUM_DEVICES: "100"},
            "must be at least 1 and at most 64",
        ),
    ],
)
def test_out_of_bounds_annotations_are_refused_before_the_inventory_synced(
    annotations: dict[str, str], fragment: str
) -> None:
    pod = _pod(annotations)
    verdict = review_pod(pod, largest_gpu_mib=None, runtime_class=None)
    assert not verdict.allowed
    assert fragment in verdict.message
    # The very words the scheduler puts on a pod that skipped the webhook.
    task = task_from_pod(pod)
    problem = parse_gpu_request(task.gpus, task.annotations)
    assert isinstance(problem, str) and verdict.message == f"gpuwarden: {problem}; {ALLOWED}"


def test_the_largest_amounts_the_contract_allows_are_admitted_before_the_inventory_synced() -> None:
    pod = _pod(
        {
            contract.ANNOTATION_GPU_MEMORY: str(contract.MAX_GPU_MEMORY_MIB),
            contract.ANNOTATION_GPU_FRACTION_NUM_DEVICES: str(contract.MAX_GPU_FRACTION_NUM_DEVICES),
        }
    )
    assert review_pod(pod, largest_gpu_mib=None, runtime_class=None).allowed
    assert review_pod(
        _pod({contract.ANNOTATION_GPU_FRACTION: "0.001"}), largest_gpu_mib=None, runtime_class=None
    ).allowed
