"""RFC 3339 times as the API server writes them, read one way everywhere.

Kubernetes writes ``2026-12-01T14:05:00Z``; agents and the scheduler write
fractions of a second where order within a second matters. Both read back
here, a time without a zone is taken as UTC, and anything else is None, so
no caller trips over a malformed field in an object someone edited by hand.
"""

from __future__ import annotations

from datetime import UTC, datetime


def parse_time(text: object) -> datetime | None:
    """An RFC 3339 time, fractions of a second kept (None when it is not one)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def parse_epoch(text: object) -> float | None:
    """:func:`parse_time` as seconds since the epoch."""
    parsed = parse_time(text)
    return parsed.timestamp() if parsed is not None else None
