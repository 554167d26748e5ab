"""The GPU assignment annotation: what the binder writes is what the cache reads."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.cluster.assignment import decode_assignment, encode_assignment
from scheduler.engine.model import Bind, Gpu, Node

NODE = Node(name="n1", gpus=tuple(Gpu(i, uuid=f"GPU-{i}", memory_mib=81920) for i in range(8)))


def test_whole_gpus_carry_each_device_memory_and_uuid() -> None:
    text = encode_assignment(Bind("j", "ns", "p", "u", "n1", gpu_indices=(3, 1)), NODE)
    assert json.loads(text) == {
        "node": "n1",
        "gpus": [
            {"index": 3, "uuid": "GPU-3", "memoryMiB": 81920},
            {"index": 1, "uuid": "GPU-1", "memoryMiB": 81920},
        ],
    }
    assert decode_assignment(text) == (3, 1)


def test_a_slice_carries_the_granted_memory() -> None:
    text = encode_assignment(Bind("j", "ns", "p", "u", "n1", gpu_indices=(0,), gpu_memory_mib=(20480,)), NODE)
    assert json.loads(text)["gpus"] == [{"index": 0, "uuid": "GPU-0", "memoryMiB": 20480}]


def test_the_same_assignment_gives_the_same_bytes() -> None:
    bind = Bind("j", "ns", "p", "u", "n1", gpu_indices=(2,))
    assert encode_assignment(bind, NODE) == encode_assignment(bind, NODE)


def test_an_assignment_for_another_node_is_not_held_here() -> None:
    text = encode_assignment(Bind("j", "ns", "p", "u", "n1", gpu_indices=(2,)), NODE)
    assert decode_assignment(text, "n1") == (2,)
    assert decode_assignment(text, "n2") is None


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "not json",
        "[]",
        '{"gpus": 3}',
        '{"gpus": [{"uuid": "x"}]}',
        '{"gpus": [{"index": -1}]}',
        '{"gpus": [{"index": true}]}',
        '{"gpus": [3]}',
    ],
)
def test_anything_unreadable_decodes_to_none(text: str | None) -> None:
    assert decode_assignment(text) is None


def test_no_gpus_is_an_empty_assignment_and_unknown_keys_are_ignored() -> None:
    assert decode_assignment('{"gpus": [], "future": 1}') == ()


@given(st.lists(st.integers(min_value=0, max_value=7), max_size=8), st.booleans())
def test_encode_then_decode_gives_the_indices_back(indices: list[int], sliced: bool) -> None:
    slices = tuple(1000 for _ in indices) if sliced else None
    bind = Bind("j", "ns", "p", "u", "n1", gpu_indices=tuple(indices), gpu_memory_mib=slices)
    assert decode_assignment(encode_assignment(bind, NODE), "n1") == tuple(indices)


@given(st.text(max_size=200))
def test_decode_never_raises(text: str) -> None:
    decode_assignment(text)
