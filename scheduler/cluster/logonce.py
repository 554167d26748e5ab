"""Warn about a bad field once, not once per cycle.

The snapshot is rebuilt from the watch cache every cycle, so a malformed
object would otherwise repeat the same warning every second for as long as
it exists. Each (event, key) pair is logged the first time only; the memory
is bounded, and forgetting everything when it is full just means a few
warnings are repeated.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from gpuwarden.logconfig import get_logger


class WarnOnce:
    def __init__(self, name: str, limit: int = 10_000) -> None:
        self._log = get_logger(name)
        self._seen: set[tuple[str, Hashable]] = set()
        self._limit = limit

    def warning(self, event: str, key: Hashable, /, **fields: Any) -> bool:
        """Log ``event`` unless it was already logged for ``key``; True if it was logged now."""
        mark = (event, key)
        if mark in self._seen:
            return False
        if len(self._seen) >= self._limit:
            self._seen.clear()
        self._seen.add(mark)
        self._log.warning(event, **fields)
        return True

    def forget(self) -> None:
        self._seen.clear()
