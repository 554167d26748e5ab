"""Kubernetes quantities ("500m", "64Gi", "1.5Ti", "1e3") to engine units and back.

The grammar is :mod:`gpuwarden.quantity`'s (the agent reads it too); this
module turns its exact amounts into the engine's units.

Custom objects are not normalised by the API server the way a pod's
resources are: a Queue keeps ``cpu: "1.5"`` or ``memory: 68719476736`` as
written. So the scheduler reads the quantity grammar itself, exactly (as a
:class:`~fractions.Fraction`, never through a float, so ``0.1`` of a GPU is
100 milli-GPUs and not 100.00000000000001), and rounds up to engine units
the way Kubernetes rounds a request up: a quota never reads as less than
what was written.

Only amounts (nothing negative, nothing not finite) are accepted; a problem
comes back as a sentence, never as an exception, so that one bad Queue
marks that queue rather than stopping the watch.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache
from typing import Final

# The grammar itself is the shared core's: the agent reads its gpu-memory back with it.
from gpuwarden.quantity import QuantityError, exact, parse_quantity
from scheduler.engine.resources import MIB_PER_GIB, MILLI

__all__ = [
    "QuantityError",
    "count_ceil",
    "count_floor",
    "cpu_milli_ceil",
    "cpu_milli_floor",
    "format_cpu",
    "format_gpus",
    "format_memory",
    "mebibytes",
    "mib_ceil",
    "mib_floor",
    "milli_gpus",
    "millicores",
    "parse_quantity",
]

_BYTES_PER_MIB: Final = 2**20

MAX_GPUS: Final = 1_000_000
MAX_CORES: Final = 100_000_000
MAX_BYTES: Final = 2**60  # 1Ei


def _bounded(amount: Fraction | str, maximum: int, unit: str) -> Fraction | str:
    if isinstance(amount, Fraction) and amount > maximum:
        return f"{float(amount):g} {unit} is beyond any cluster (at most {maximum:g})"
    return amount


def milli_gpus(value: object) -> int | str:
    """GPUs (a number, fractions allowed) -> milli-GPUs, rounded up."""
    amount = _bounded(parse_quantity(value), MAX_GPUS, "GPUs")
    return amount if isinstance(amount, str) else math.ceil(amount * MILLI)


def millicores(value: object) -> int | str:
    """Cores or a CPU quantity ("500m") -> millicores, rounded up."""
    amount = _bounded(parse_quantity(value), MAX_CORES, "cores")
    return amount if isinstance(amount, str) else math.ceil(amount * MILLI)


def mebibytes(value: object) -> int | str:
    """Bytes or a memory quantity ("64Gi") -> MiB, rounded up."""
    amount = _bounded(parse_quantity(value), MAX_BYTES, "bytes")
    return amount if isinstance(amount, str) else math.ceil(amount / _BYTES_PER_MIB)


# -- objects the API server normalises (pods, nodes) ---------------------------
#
# A pod's requests and a node's allocatable are read for every object of a
# large cluster, from a small set of distinct spellings, so these convert
# through a cache and raise (the caller logs once per object and reads the
# field conservatively). What a pod asks rounds up, what a node offers down,
# so the engine never places more than fits.


def _exact(text: str | int | float) -> Fraction:
    return exact(text)


def _ceil(value: Fraction) -> int:
    return -((-value.numerator) // value.denominator)


@lru_cache(maxsize=4096, typed=True)
def cpu_milli_ceil(text: str | int | float) -> int:
    """Millicores, rounded up (what a pod asks)."""
    return _ceil(_exact(text) * MILLI)


@lru_cache(maxsize=4096, typed=True)
def cpu_milli_floor(text: str | int | float) -> int:
    """Millicores, rounded down (what a node offers)."""
    return math.floor(_exact(text) * MILLI)


@lru_cache(maxsize=4096, typed=True)
def mib_ceil(text: str | int | float) -> int:
    """Bytes as MiB, rounded up (what a pod asks)."""
    return _ceil(_exact(text) / _BYTES_PER_MIB)


@lru_cache(maxsize=4096, typed=True)
def mib_floor(text: str | int | float) -> int:
    """Bytes as MiB, rounded down (what a node offers)."""
    return math.floor(_exact(text) / _BYTES_PER_MIB)


@lru_cache(maxsize=4096, typed=True)
def count_ceil(text: str | int | float) -> int:
    """A count (GPUs, MiB of an extended resource), rounded up."""
    return _ceil(_exact(text))


@lru_cache(maxsize=4096, typed=True)
def count_floor(text: str | int | float) -> int:
    """A count, rounded down."""
    return math.floor(_exact(text))


# -- back to text, for status -----------------------------------------------


def format_gpus(milli: int) -> int | float:
    """Milli-GPUs as the number of GPUs a Queue's status shows (4, 0.5)."""
    return milli // MILLI if milli % MILLI == 0 else milli / MILLI


def format_cpu(milli: int) -> str:
    """Millicores as Kubernetes writes them: whole cores ("8") or "1500m"."""
    return str(milli // MILLI) if milli % MILLI == 0 else f"{milli}m"


def format_memory(mib: int) -> str:
    """MiB as the largest exact binary quantity ("64Gi", "1536Mi", "2Ti")."""
    for suffix, per in (("Pi", MIB_PER_GIB**3), ("Ti", MIB_PER_GIB**2), ("Gi", MIB_PER_GIB)):
        if mib and mib % per == 0:
            return f"{mib // per}{suffix}"
    return f"{mib}Mi"
