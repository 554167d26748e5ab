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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from gpuwarden.contract import (
    ANNOTATION_GPU_FRACTION,
    ANNOTATION_GPU_FRACTION_NUM_DEVICES,
    ANNOTATION_GPU_MEMORY,
    ANNOTATION_KAI_GPU_FRACTION,
    ANNOTATION_KAI_GPU_FRACTION_NUM_DEVICES,
    ANNOTATION_KAI_GPU_MEMORY,
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
            return f"annotation {devices.key}={devices.value!r} needs a GPU fraction or GPU memory annotation"
        return GpuRequest(whole=whole) if whole else NO_GPU
    if whole:
        return "a pod asks for whole GPUs (nvidia.com/gpu) and a GPU slice at once; choose one"
    if fraction is not None and memory is not None:
        return f"annotations {fraction.key} and {memory.key} both set; choose one"
    num = 1
    if devices is not None:
        try:
            num = int(devices.value)
        except ValueError:
            return f"annotation {devices.key}={devices.value!r} is not a whole number"
        if num < 1:
            return f"annotation {devices.key}={devices.value!r} must be at least 1"
    if fraction is not None:
        try:
            value = float(fraction.value)
        except ValueError:
            return f"annotation {fraction.key}={fraction.value!r} is not a number"
        if not 0.0 < value <= 1.0:
            return f"annotation {fraction.key}={fraction.value!r} must be above 0 and at most 1"
        return GpuRequest(fraction=value, devices=num)
    assert memory is not None
    try:
        mib = int(memory.value)
    except ValueError:
        return f"annotation {memory.key}={memory.value!r} is not a whole number of MiB"
    if mib < 1:
        return f"annotation {memory.key}={memory.value!r} must be at least 1 MiB"
    return GpuRequest(memory_mib=mib, devices=num)


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
