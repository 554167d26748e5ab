"""The GPU assignment annotation: which GPUs of its node a bound pod holds.

The scheduler writes it on the pod before binding (see :mod:`.bind`); the
node side reads it to expose exactly those devices, and the watch cache reads
it back so a restarted scheduler knows which GPUs are taken. Format, compact
JSON::

    {"node": "gpu-1", "gpus": [{"index": 3, "uuid": "GPU-...", "memoryMiB": 20480}]}

``memoryMiB`` is the slice for a fractional pod and the whole GPU's memory
otherwise, so a reader never needs the node's inventory to know the amount.
A MIG device given through a DRA claim is a GPU of the scheduler's own
numbering (``index`` 1000 and up, its MIG UUID) and names the GPU it is
carved from as ``parentIndex``: what a drain of that GPU must see leave.
``node`` lets a reader tell a current assignment from one left by a bind that
failed: only an assignment naming the pod's own ``spec.nodeName`` counts.
"""

from __future__ import annotations

import json

from scheduler.engine.model import Bind, Node


def encode_assignment(bind: Bind, node: Node) -> str:
    """The annotation value for ``bind`` on ``node``.

    Raises ValueError when the bind names a GPU index the node does not have,
    or gives slice sizes for a different number of GPUs: writing such an
    assignment would hand the pod a device nobody accounted for.
    """
    if bind.node != node.name:
        raise ValueError(f"bind targets node {bind.node!r}, not {node.name!r}")
    by_index = {gpu.index: gpu for gpu in node.gpus}
    slices = bind.gpu_memory_mib
    if slices is not None and len(slices) != len(bind.gpu_indices):
        raise ValueError(f"{len(slices)} GPU memory slices for {len(bind.gpu_indices)} GPUs")
    gpus = []
    for position, index in enumerate(bind.gpu_indices):
        gpu = by_index.get(index)
        if gpu is None:
            raise ValueError(f"node {node.name!r} has no GPU {index}")
        memory = gpu.memory_mib if slices is None else slices[position]
        entry: dict[str, object] = {"index": index, "uuid": gpu.uuid, "memoryMiB": memory}
        if gpu.parent is not None:
            entry["parentIndex"] = gpu.parent
        gpus.append(entry)
    return json.dumps({"node": node.name, "gpus": gpus}, separators=(",", ":"))


def decode_assignment(text: str, *, node: str | None = None, parents: bool = False) -> tuple[int, ...] | None:
    """The GPU indices in an annotation value; None when it is malformed.

    With ``node`` given, an assignment written for another node is None too:
    it was left by a bind that did not happen and holds nothing. With
    ``parents``, a MIG device reads as the physical GPU it is carved from
    (each GPU once).
    """
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    written_for = data.get("node")
    if not isinstance(written_for, str) or (node is not None and written_for != node):
        return None
    gpus = data.get("gpus")
    if not isinstance(gpus, list):
        return None
    indices: list[int] = []
    for gpu in gpus:
        index = gpu.get("index") if isinstance(gpu, dict) else None
        # bool is an int to Python; true is not a GPU index.
        if not isinstance(index, int) or isinstance(index, bool) or index < 0 or index in indices:
            return None
        indices.append(index)
    if parents:
        physical: list[int] = []
        for gpu, index in zip(gpus, indices, strict=True):
            parent = gpu.get("parentIndex")
            held = parent if isinstance(parent, int) and not isinstance(parent, bool) and parent >= 0 else index
            if held not in physical:
                physical.append(held)
        return tuple(physical)
    return tuple(indices)
