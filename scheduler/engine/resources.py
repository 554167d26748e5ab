"""Resource units, a pod's GPU request, and how amounts read to people.

Three resources, always in this order: GPU (milli-GPUs), CPU (millicores) and
memory (MiB). Vectors are plain lists/tuples of three ints indexed by
``GPU``, ``CPU``, ``MEMORY``: the hot paths add and compare them thousands of
times per session, and a list index is the cheapest thing Python offers.

A GPU slice is read from the pod's annotations (gpuwarden's spelling first,
then KAI's) here and nowhere else, so that a malformed value turns into one
clear error string that the session puts on the job.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import NamedTuple

from gpuwarden.contract import (
    ANNOTATION_GPU_FRACTION,
    ANNOTATION_GPU_FRACTION_NUM_DEVICES,
    ANNOTATION_GPU_MEMORY,
    ANNOTATION_KAI_GPU_FRACTION,
    ANNOTATION_KAI_GPU_FRACTION_NUM_DEVICES,
    ANNOTATION_KAI_GPU_MEMORY,
    GPU_FRACTION_DECIMALS,
    MAX_GPU_FRACTION_NUM_DEVICES,
    MAX_GPU_MEMORY_MIB,
    MIN_GPU_FRACTION,
)

GPU = 0
CPU = 1
MEMORY = 2
RESOURCES = (GPU, CPU, MEMORY)
RESOURCE_NAMES = ("gpu", "cpu", "memory")

MILLI = 1000
MIB_PER_GIB = 1024
# "Whole units" in which fair share is handed out: one GPU, one core, one GiB.
WHOLE_UNIT = (MILLI, MILLI, MIB_PER_GIB)


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """What a pod asks of GPUs: whole devices, or one slice on ``devices`` GPUs.

    Exactly one of ``whole``, ``fraction`` and ``memory_mib`` is set (or none,
    for a CPU-only pod).
    """

    whole: int = 0
    fraction: float | None = None
    memory_mib: int | None = None
    devices: int = 1

    @property
    def is_slice(self) -> bool:
        return self.fraction is not None or self.memory_mib is not None

    def slice_on(self, gpu_memory_mib: int) -> int:
        """MiB this slice takes on a GPU with ``gpu_memory_mib``.

        Fractions round down so that slices adding up to 1.0 never exceed the
        device; a slice is at least 1 MiB.
        """
        if self.memory_mib is not None:
            return self.memory_mib
        assert self.fraction is not None
        return max(1, int(self.fraction * gpu_memory_mib))

    def milli_gpus(self, reference_memory_mib: int) -> int:
        """Milli-GPUs charged to the queue.

        MiB slices are converted against the pool's reference GPU memory (its
        largest GPU), the same figure before and after placement, so quota
        accounting never changes with the node a pod lands on.
        """
        if self.whole:
            return self.whole * MILLI
        if self.fraction is not None:
            return math.ceil(self.fraction * MILLI) * self.devices
        if self.memory_mib is not None:
            if reference_memory_mib <= 0:
                return MILLI * self.devices
            per = min(MILLI, math.ceil(self.memory_mib * MILLI / reference_memory_mib))
            return per * self.devices
        return 0


NO_GPU = GpuRequest()

# What the annotations may spell (see the bounds in gpuwarden.contract): plain
# digits only, so that "1e-300", "nan", "0x10", "1_000", full-width digits or
# thousands of digits never reach a float or an int.
_DECIMAL_TEXT = re.compile(r"[+-]?(?:[0-9]{1,12}(?:\.[0-9]{0,24})?|\.[0-9]{1,24})")
_WHOLE_TEXT = re.compile(r"[0-9]{1,12}")


class _Annotation(NamedTuple):
    """One annotation as the pod spelt it: messages name the key the user wrote (ours or KAI's)."""

    key: str
    value: str


def _annotation(annotations: Mapping[str, str], key: str, kai_key: str) -> _Annotation | None:
    if key in annotations:
        return _Annotation(key, annotations[key])
    if kai_key in annotations:
        return _Annotation(kai_key, annotations[kai_key])
    return None


def parse_gpu_request(whole: int, annotations: Mapping[str, str]) -> GpuRequest | str:
    """The pod's GPU request, or an error message saying what is wrong with it."""
    if whole < 0:
        return f"nvidia.com/gpu request {whole} is negative"
    if not annotations:
        return GpuRequest(whole=whole) if whole else NO_GPU
    fraction = _annotation(annotations, ANNOTATION_GPU_FRACTION, ANNOTATION_KAI_GPU_FRACTION)
    memory = _annotation(annotations, ANNOTATION_GPU_MEMORY, ANNOTATION_KAI_GPU_MEMORY)
    devices = _annotation(annotations, ANNOTATION_GPU_FRACTION_NUM_DEVICES, ANNOTATION_KAI_GPU_FRACTION_NUM_DEVICES)
    if fraction is None and memory is None:
        if devices is not None:
            return f"annotation {devices.key}={_shown(devices.value)} needs a GPU fraction or GPU memory annotation"
        return GpuRequest(whole=whole) if whole else NO_GPU
    if whole:
        return "a pod asks for whole GPUs (nvidia.com/gpu) and a GPU slice at once; choose one"
    if fraction is not None and memory is not None:
        return f"annotations {fraction.key} and {memory.key} both set; choose one"
    num = 1
    if devices is not None:
        text = devices.value.strip()
        if not (text.isascii() and text.isdigit()):
            return f"annotation {devices.key}={_shown(devices.value)} is not a whole number"
        num = int(text) if len(text) <= 12 else MAX_GPU_FRACTION_NUM_DEVICES + 1
        if not 1 <= num <= MAX_GPU_FRACTION_NUM_DEVICES:
            return (
                f"annotation {devices.key}={_shown(devices.value)} must be at least 1 "
                f"and at most {MAX_GPU_FRACTION_NUM_DEVICES} (GPUs of one node)"
            )
    if fraction is not None:
        return _fraction(fraction, num)
    assert memory is not None
    text = memory.value.strip()
    if not _WHOLE_TEXT.fullmatch(text):
        if text.startswith("-") and _WHOLE_TEXT.fullmatch(text[1:]):
            return f"annotation {memory.key}={_shown(memory.value)} must be at least 1 MiB"
        if not (text.isascii() and text.isdigit()):
            return f"annotation {memory.key}={_shown(memory.value)} is not a whole number of MiB"
    mib = int(text) if len(text) <= 12 else MAX_GPU_MEMORY_MIB + 1
    if mib < 1:
        return f"annotation {memory.key}={_shown(memory.value)} must be at least 1 MiB"
    if mib > MAX_GPU_MEMORY_MIB:
        return (
            f"annotation {memory.key}={_shown(memory.value)} is more than any GPU holds "
            f"(at most {MAX_GPU_MEMORY_MIB} MiB)"
        )
    return GpuRequest(memory_mib=mib, devices=num)


def _fraction(fraction: _Annotation, devices: int) -> GpuRequest | str:
    """A GPU fraction: a plain decimal above 0 and at most 1, in thousandths at the finest."""
    text = fraction.value.strip()
    shown = _shown(fraction.value)
    if not _DECIMAL_TEXT.fullmatch(text):
        if _looks_numeric(text):
            return (
                f"annotation {fraction.key}={shown} must be a plain decimal such as 0.25 "
                f"(no exponent, at most {GPU_FRACTION_DECIMALS} decimal places)"
            )
        return f"annotation {fraction.key}={shown} is not a number"
    exact = Decimal(text)
    if not 0 < exact <= 1:
        return f"annotation {fraction.key}={shown} must be above 0 and at most 1"
    exponent = exact.normalize().as_tuple().exponent
    if isinstance(exponent, int) and -exponent > GPU_FRACTION_DECIMALS:
        return (
            f"annotation {fraction.key}={shown} has more than {GPU_FRACTION_DECIMALS} decimal places; "
            f"the smallest slice is {MIN_GPU_FRACTION} of a GPU"
        )
    return GpuRequest(fraction=float(exact), devices=devices)


def _shown(value: str) -> str:
    """An annotation value as a message quotes it: 5,000 digits are not repeated back in full."""
    return repr(value) if len(value) <= 40 else f"{value[:32]!r}... ({len(value)} characters)"


def _looks_numeric(text: str) -> bool:
    """A number written some other way (an exponent, too many digits), not a word."""
    body = text.lstrip("+-")
    return bool(body) and body[0] in "0123456789." and any(c.isdigit() for c in body)


def format_amount(resource: int, value: int) -> str:
    """A human amount: ``2.5 GPUs``, ``4 cores``, ``64 GiB``."""
    if resource == GPU:
        text = f"{value / MILLI:g}"
        return f"{text} GPU" if value == MILLI else f"{text} GPUs"
    if resource == CPU:
        text = f"{value / MILLI:g}"
        return f"{text} core" if value == MILLI else f"{text} cores"
    return f"{value / MIB_PER_GIB:g} GiB"


def format_vector(values: list[int] | tuple[int, ...]) -> str:
    return ", ".join(format_amount(r, values[r]) for r in RESOURCES if values[r])
