"""Small helpers: waiting that explains its timeouts, and names that never collide.

Every Kubernetes test waits with ``wait_for`` and names objects with
``unique_name`` in a cluster shared by the whole session; a wrong timeout
message or a repeated name would show up as a confusing failure elsewhere.
"""

from __future__ import annotations

import pytest

from tests.harness import unique_name, wait_for


def test_wait_for_returns_first_truthy_value() -> None:
    answers = iter([None, 0, "", "ready", "later"])
    assert wait_for(lambda: next(answers), timeout=5, interval=0) == "ready"


def test_wait_for_timeout_names_condition_and_last_value() -> None:
    def never_ready() -> int:
        return 0

    with pytest.raises(TimeoutError, match=r"never_ready not true within 0\.05s; last call returned 0"):
        wait_for(never_ready, timeout=0.05, interval=0.01)


def test_wait_for_retries_ignored_exceptions_only() -> None:
    calls = {"n": 0}

    def flaky() -> str:
        calls["n"] += 1
        if calls["n"] < 3:
            raise KeyError("not yet")
        return "done"

    assert wait_for(flaky, timeout=5, interval=0, ignore=(KeyError,)) == "done"
    with pytest.raises(ZeroDivisionError):
        wait_for(lambda: 1 // 0, timeout=5, interval=0, ignore=(KeyError,))
    empty: dict[str, str] = {}
    with pytest.raises(TimeoutError, match="raised KeyError"):
        wait_for(lambda: empty["missing"], timeout=0.05, interval=0.01, ignore=(KeyError,))


def test_unique_name_is_a_distinct_dns_label() -> None:
    names = {unique_name("GPU_Node.x") for _ in range(50)}
    assert len(names) == 50
    for name in names:
        assert name.startswith("gpu-node-x-")
        assert len(name) <= 63
        assert all(c.isdigit() or c == "-" or c.islower() for c in name)
    assert len(unique_name("p" * 200)) <= 63
