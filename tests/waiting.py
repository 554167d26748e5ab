"""Waiting for something asynchronous without sleeping blindly: the one polling helper of the tests.

Controllers, agent threads and checks in their own threads all act in their
own time, so a test polls a predicate; when it gives up, the message says what
was awaited and what was last seen, which is usually the whole diagnosis.
Kept free of the Kubernetes client so that unit tests import it cheaply; the
control-plane harness re-exports it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    interval: float = 0.05,
    *,
    description: str | None = None,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``predicate`` until it returns something truthy, and return that.

    Exceptions of the types in ``ignore`` (e.g. ``ApiException`` while an
    object does not exist yet) count as a falsy answer; others propagate.
    On timeout, raises ``TimeoutError`` naming the condition and the last
    value or exception seen, which is usually the whole diagnosis.
    """
    what = description or getattr(predicate, "__qualname__", repr(predicate))
    deadline = time.monotonic() + timeout
    last: str = "never evaluated"
    while True:
        try:
            value = predicate()
        except ignore as err:
            last = f"raised {type(err).__name__}: {err}"
        else:
            if value:
                return value
            last = f"returned {value!r}"
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} not true within {timeout}s; last call {last}")
        time.sleep(interval)
