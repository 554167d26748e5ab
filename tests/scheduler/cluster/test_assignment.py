"""The GPU assignment annotation: what the binder writes is what the cache reads back."""

from __future__ import annotations

import json

import pytest

from scheduler.cluster.assignment import decode_assignment, encode_assignment
from scheduler.engine.model import Bind, Gpu, Node

NODE = Node(
    name="gpu-1",
    gpus=tuple(Gpu(index=i, uuid=f"GPU-{i:04d}", memory_mib=81920) for i in range(4)),
)


def _bind(indices: tuple[int, ...], slices: tuple[int, ...] | None = None, node: str = "gpu-1") -> Bind:
    return Bind(job="ns/j", namespace="ns", pod="p", uid="u", node=node, gpu_indices=indices, gpu_memory_mib=slices)


def test_whole_gpus_carry_their_uuid_and_whole_memory() -> None:
    text = encode_assignment(_bind((2, 0)), NODE)
    assert json.loads(text) == {
        "node": "gpu-1",
        "gpus": [
            {"index": 2, "uuid": "GPU-0002", "memoryMiB": 81920},
            {"index": 0, "uuid": "GPU-0000", "memoryMiB": 81920},
        ],
    }
    assert " " not in text
    assert decode_assignment(text) == (2, 0)
    assert decode_assignment(text, node="gpu-1") == (2, 0)


def test_a_fractional_pod_carries_its_slice() -> None:
    text = encode_assignment(_bind((3,), (20480,)), NODE)
    assert json.loads(text)["gpus"] == [{"index": 3, "uuid": "GPU-0003", "memoryMiB": 20480}]
    assert decode_assignment(text) == (3,)


def test_a_mig_device_names_the_gpu_it_is_carved_from() -> None:
    """Read back as itself by the scheduler; as its parent by a drain of that GPU."""
    node = Node(
        name="gpu-1",
        gpus=(
            Gpu(index=0, uuid="GPU-0000", mig_enabled=True),
            Gpu(index=1000, uuid="MIG-a", memory_mib=4864, parent=0, milli_gpus=142),
            Gpu(index=1001, uuid="MIG-b", memory_mib=4864, parent=0, milli_gpus=142),
            Gpu(index=1, uuid="GPU-0001"),
        ),
    )
    text = encode_assignment(_bind((1001, 1000, 1)), node)
    assert json.loads(text)["gpus"][0] == {"index": 1001, "uuid": "MIG-b", "memoryMiB": 4864, "parentIndex": 0}
    assert decode_assignment(text) == (1001, 1000, 1)
    assert decode_assignment(text, parents=True) == (0, 1)


@pytest.mark.parametrize(
    ("bind", "problem"),
    [
        (_bind((7,)), "no GPU 7"),
        (_bind((0, 1), (100,)), "1 GPU memory slices for 2 GPUs"),
        (_bind((0,), node="gpu-2"), "not 'gpu-1'"),
    ],
)
def test_an_assignment_the_node_cannot_honour_is_refused(bind: Bind, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        encode_assignment(bind, NODE)


def test_an_assignment_for_another_node_holds_nothing_there() -> None:
    text = encode_assignment(_bind((1,)), NODE)
    assert decode_assignment(text, node="gpu-2") is None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json",
        "[]",
        '{"gpus": [{"index": 0}]}',
        '{"node": "n", "gpus": {}}',
        '{"node": "n", "gpus": [{"index": "0"}]}',
        '{"node": "n", "gpus": [{"index": true}]}',
        '{"node": "n", "gpus": [{"index": -1}]}',
        '{"node": "n", "gpus": [{"index": 1}, {"index": 1}]}',
        '{"node": "n", "gpus": [3]}',
    ],
)
def test_malformed_annotations_read_as_none(text: str) -> None:
    assert decode_assignment(text) is None


def test_no_gpus_is_an_empty_assignment_not_a_malformed_one() -> None:
    assert decode_assignment('{"node": "n", "gpus": []}') == ()
