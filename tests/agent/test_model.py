"""Fault keys: named fields, yet the same value as the plain tuple they replace."""

from __future__ import annotations

import pytest

from agent.model import Entity, EntityKind, FaultKey
from tests.agent.publish.reports import xid_fault


def test_a_fault_key_names_its_fields_and_equals_the_plain_tuple() -> None:
    fault = xid_fault(2)
    key = fault.key
    assert isinstance(key, FaultKey)
    assert (key.condition, key.reason, key.entity) == (fault.condition.value, fault.reason, fault.entity.key)
    plain = (fault.condition.value, fault.reason, fault.entity.key)
    assert key == plain
    assert hash(key) == hash(plain)
    assert plain in {key}


BUS = "00000000:3B:00.0"
UUID = "GPU-0003-aaaa"


@pytest.mark.parametrize(
    ("entity", "text"),
    [
        (Entity.gpu(3, UUID, BUS), f"GPU 3 ({UUID}, {BUS})"),
        (Entity(EntityKind.GPU, gpu_index=3, pci_bus_id=BUS), f"GPU 3 ({BUS})"),
        (Entity(EntityKind.GPU, gpu_index=3, uuid=UUID), f"GPU 3 ({UUID})"),
        (Entity(EntityKind.GPU, pci_bus_id=BUS), f"GPU at {BUS}"),
        (Entity(EntityKind.GPU, uuid=UUID, pci_bus_id=BUS), f"GPU at {BUS} ({UUID})"),
        (Entity(EntityKind.GPU, uuid=UUID), f"GPU {UUID}"),
        (Entity(EntityKind.GPU, gpu_index=3), "GPU 3"),
        (Entity(EntityKind.GPU), "a GPU that could not be identified"),
    ],
)
def test_a_gpu_is_described_by_what_is_known_of_it(entity: Entity, text: str) -> None:
    """A GPU known by bus id only (NVML down, an XID from the kernel log) is
    named by it, not as ``GPU None (uuid unknown, ...)``."""
    assert entity.describe() == text
    assert "None" not in text and "unknown" not in text
