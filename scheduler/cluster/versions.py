"""Unchanging versions of a changing dict, each made at the cost of the changes since the last.

A cycle's PodGroups are read behind the cycles (the status writer works
off a batch of an earlier cycle), so the mapping a cycle hands out must
stay as it was while the next cycles change theirs. Copying every PodGroup
each cycle made that cost follow the cluster's history: every group a
finished job left behind, about 6,000 after ten minutes of single-pod
churn, copied and freed some twenty times a second for the handful that
changed.

:class:`Versioned` keeps a base (a copy made now and then) and an overlay
of what changed since; :meth:`Versioned.freeze` copies only the overlay.
Once the overlay grows past about twice the square root of the dict's
size it is folded into a new base: with ``c`` changes a cycle among ``n``
entries, a version then costs about ``sqrt(n * c)`` entries copied, not
``n``. Old versions keep their own base and overlay, neither of which is
changed again, so a reader on another thread needs no lock.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Final, Generic, TypeVar, overload

K = TypeVar("K")
V = TypeVar("V")
D = TypeVar("D")


class _Gone(enum.Enum):
    """Marks a key removed since the base was made."""

    GONE = enum.auto()


_GONE: Final = _Gone.GONE
# Below this many changes the overlay is kept whatever the dict's size:
# folding a small dict costs as little as copying its overlay.
_MIN_OVERLAY = 16


class Frozen(Mapping[K, V], Generic[K, V]):
    """One version: a base under an overlay of changes, neither of which changes again."""

    __slots__ = ("_base", "_len", "_over")

    def __init__(self, base: Mapping[K, V], over: Mapping[K, V | _Gone], length: int) -> None:
        self._base = base
        self._over = over
        self._len = length

    def __getitem__(self, key: K) -> V:
        over = self._over
        if key in over:
            value = over[key]
            if value is _GONE:
                raise KeyError(key)
            return value
        return self._base[key]

    @overload
    def get(self, key: K, /) -> V | None: ...
    @overload
    def get(self, key: K, default: V | D, /) -> V | D: ...
    def get(self, key: K, default: object = None, /) -> object:
        over = self._over
        if key in over:
            value = over[key]
            return default if value is _GONE else value
        return self._base.get(key, default)

    def __contains__(self, key: object) -> bool:
        over = self._over
        if key in over:
            return over[key] is not _GONE  # type: ignore[index]
        return key in self._base

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[K]:
        over = self._over
        for key in self._base:
            if key not in over:
                yield key
        for key, value in over.items():
            if value is not _GONE:
                yield key

    def __repr__(self) -> str:
        return f"Frozen({len(self)} entries, {len(self._over)} changed since its base)"


class Versioned(Generic[K, V]):
    """Hands out :class:`Frozen` versions of ``live``, a dict its owner changes and then names the changed keys of."""

    def __init__(self, live: Mapping[K, V]) -> None:
        self._live = live
        self._base: dict[K, V] = dict(live)
        self._over: dict[K, V | _Gone] = {}

    def changed(self, keys: Iterable[K]) -> None:
        """Take the entries of ``keys`` (set, replaced or removed in ``live``) into the next version."""
        live, over = self._live, self._over
        for key in keys:
            over[key] = live.get(key, _GONE)

    def freeze(self) -> Frozen[K, V]:
        """``live`` as it is now, unchanged by what it becomes later."""
        if len(self._over) > _MIN_OVERLAY + 2 * math.isqrt(len(self._live)):
            self._base = dict(self._live)
            self._over = {}
        return Frozen(self._base, dict(self._over), len(self._live))
