"""Small helpers that let many tests share one cluster and wait for it without sleeping blindly.

One control plane serves the whole session, so every test names its objects
with :func:`unique_name` or works in a :func:`temporary_namespace`; and since
controllers act asynchronously, tests poll with :func:`wait_for`, whose
timeout message says what was awaited and what was last seen.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from kubernetes import client

T = TypeVar("T")


def unique_name(prefix: str) -> str:
    """A DNS-1123 name that no other test uses, e.g. ``gpu-node-3f9a1c``."""
    base = "".join(c if c.isalnum() else "-" for c in prefix.lower()).strip("-")[:50] or "x"
    return f"{base}-{secrets.token_hex(3)}"


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


def simple_pod(name: str, *, labels: dict[str, str] | None = None, node_name: str | None = None) -> client.V1Pod:
    """A one-container pod object (not created) for tests that need any pod."""
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1PodSpec(
            node_name=node_name,
            containers=[client.V1Container(name="main", image="registry.invalid/gpuwarden-test:1")],
        ),
    )


@contextlib.contextmanager
def temporary_namespace(api: client.ApiClient, prefix: str = "test") -> Iterator[str]:
    """Create a uniquely named namespace and delete it afterwards (not waiting)."""
    core = client.CoreV1Api(api)
    name = unique_name(prefix)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(name)
