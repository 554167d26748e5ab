"""The two conversions the demo needs between the generated Kubernetes client and plain JSON."""

from __future__ import annotations

from typing import Any, cast

from kubernetes import client

JSON = dict[str, Any]


def to_json(api: client.ApiClient, obj: object) -> Any:
    """A client model (or a list of them) as the API server's JSON: plain dicts keyed by the wire names."""
    return api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]


def items(api: client.ApiClient, listing: object) -> list[JSON]:
    """The items of a list call, as JSON."""
    return cast(list[JSON], to_json(api, getattr(listing, "items", None) or []))


def meta(obj: JSON) -> JSON:
    m = obj.get("metadata")
    return m if isinstance(m, dict) else {}


def sub(obj: JSON, key: str) -> JSON:
    """``obj[key]`` when it is a mapping, else empty: a missing spec or status reads as empty."""
    value = obj.get(key)
    return value if isinstance(value, dict) else {}
