"""The GPU assignment annotation: which GPUs of its node a pod was given.

The binder writes it on the pod (``gpuwarden.io/gpu-assignment``) before it
binds, and the scheduler reads it back from every running pod to know which
GPUs are taken, so this module is the one place that defines it::

    {"node": "gpu-node-7",
     "gpus": [{"index": 0, "uuid": "GPU-1b2c...", "memoryMiB": 20480},
              {"index": 3, "uuid": "GPU-9f00...", "memoryMiB": 20480}]}

- ``node``: the node the assignment was made for. A pod bound somewhere
  else (a bind that failed and was retried) does not hold these GPUs, so a
  reader that knows the pod's node ignores an assignment for another one.
- ``gpus``: one entry per GPU, in the order the engine chose them.
  ``index`` is the GPU's index on the node (as in the GPUNode and in
  NVML), ``uuid`` its UUID when known (empty otherwise; the device side can
  check it survived a re-enumeration), ``memoryMiB`` the GPU memory granted:
  the slice for a fractional pod, the whole device's memory otherwise.

Compact JSON with sorted keys, so that writing the same assignment twice
gives the same bytes. Readers ignore keys they do not know, so a field can
be added without breaking an older scheduler.
"""

from __future__ import annotations

import json

from scheduler.engine.model import Bind, Node

KEY_NODE = "node"
KEY_GPUS = "gpus"
KEY_INDEX = "index"
KEY_UUID = "uuid"
KEY_MEMORY = "memoryMiB"


def encode_assignment(bind: Bind, node: Node) -> str:
    """The annotation value for a bind onto ``node`` (the Node the engine saw)."""
    by_index = {g.index: g for g in node.gpus}
    slices = bind.gpu_memory_mib
    entries: list[dict[str, object]] = []
    for position, index in enumerate(bind.gpu_indices):
        gpu = by_index.get(index)
        if slices is not None and position < len(slices):
            memory = slices[position]
        else:
            memory = gpu.memory_mib if gpu is not None else 0
        entries.append({KEY_INDEX: index, KEY_UUID: gpu.uuid if gpu is not None else "", KEY_MEMORY: memory})
    return json.dumps({KEY_NODE: bind.node, KEY_GPUS: entries}, sort_keys=True, separators=(",", ":"))


def decode_assignment(text: object, node: str | None = None) -> tuple[int, ...] | None:
    """The GPU indices an annotation names, or None when it names none usably.

    None for anything that is not the format above (not JSON, no ``gpus``
    list, an entry without an integer index) and, when ``node`` is given, for
    an assignment made for another node. The caller decides what an unreadable
    assignment means; the engine counts a running pod's GPUs as held even
    when it cannot tell which.
    """
    if not isinstance(text, str) or not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    if node is not None:
        written_for = data.get(KEY_NODE)
        if isinstance(written_for, str) and written_for and written_for != node:
            return None
    gpus = data.get(KEY_GPUS)
    if not isinstance(gpus, list):
        return None
    indices: list[int] = []
    for entry in gpus:
        if not isinstance(entry, dict):
            return None
        index = entry.get(KEY_INDEX)
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            return None
        indices.append(index)
    return tuple(indices)
