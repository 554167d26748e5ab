"""Fault keys: named fields, yet the same value as the plain tuple they replace."""

from __future__ import annotations

from agent.model import FaultKey
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
