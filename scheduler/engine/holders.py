"""Which GPUs a running pod really holds: the kubelet's word over gpuwarden's guess.

On a device-plugin node the kubelet's device manager, not gpuwarden, picks
the devices a whole-GPU container gets, among those the device plugin calls
healthy; gpuwarden's assignment annotation names what it meant, and the
kubelet may have chosen otherwise. The agent reads the kubelet's
PodResources API and publishes, per GPU, the pods holding it
(:attr:`scheduler.engine.model.Node.kubelet_holders`). These functions are
the one rule for reading that, so that health eviction, placement, the
accounting of other schedulers' pods and the work lost to faults all agree:

- a pod the kubelet lists holds the GPUs it lists, whatever its assignment;
- a pod it does not list (not admitted yet, a node whose agent publishes no
  mapping, a read that failed before the pod started) holds what the
  assignment says, as before;
- a holder is matched by UID; by ``namespace/name`` only when the agent
  could not read its UID (a pod recreated under its old name is another pod);
- a GPU slice is never read from the mapping: gpuwarden writes its device
  itself (``NVIDIA_VISIBLE_DEVICES``), so its assignment is exact.
"""

from __future__ import annotations

from scheduler.engine.health import judge
from scheduler.engine.model import Node, Task


def holder_key(namespace: str, name: str) -> str:
    """The key of a holder whose UID the agent could not read."""
    return f"{namespace}/{name}"


def kubelet_gpus(node: Node, task: Task) -> tuple[int, ...] | None:
    """The GPU indices the node's kubelet reports ``task`` holding; None when it does not say."""
    held = node.kubelet_holders
    if not held:
        return None
    found = held.get(task.uid) if task.uid else None
    if found is None:
        found = held.get(holder_key(task.namespace, task.name))
    return found or None


def held_gpus(node: Node, task: Task, whole: bool) -> tuple[int, ...]:
    """What a running pod holds on ``node``: the kubelet's GPUs for a whole-GPU pod it lists, else the assignment."""
    if whole:
        real = kubelet_gpus(node, task)
        if real is not None:
            return real
    return task.gpu_indices


def reported_gpus(node: Node) -> frozenset[int]:
    """Every GPU the node's kubelet reports some pod holding."""
    held = node.kubelet_holders
    if not held:
        return frozenset()
    return frozenset(i for indices in held.values() for i in indices)


def misplaced_on(node: Node, task: Task, usable: frozenset[int]) -> tuple[int, ...]:
    """GPUs out of service that the kubelet gave ``task`` although gpuwarden assigned others.

    Not a GPU that failed under the pod: one the device plugin still offered
    and the device manager chose while it was already out of service, so the
    pod should never have started there. A kubelet's choice that differs
    from the assignment is not wrong in itself (the device manager chooses
    as it likes among healthy devices); it is misplaced only when the GPU's
    fault is older than the pod (:func:`failed_under`). ``usable`` are the
    node's GPUs in service.
    """
    real = kubelet_gpus(node, task)
    if real is None or not task.gpu_indices:
        return ()
    assigned = set(task.gpu_indices)
    wrong = [i for i in real if i not in assigned and i not in usable]
    if not wrong:
        return ()
    since = {g.index: g.faulted_since for g in node.gpus}
    return tuple(i for i in wrong if not failed_under(task.started, since.get(i)))


def failed_under(started: float | None, faulted_since: float | None) -> bool:
    """Whether a GPU's fault came after the pod that holds it had started: it failed under the pod.

    Both times are the node's clock (the kubelet writes ``startTime``, the
    agent its fault's ``since``). The kubelet gives a container its devices
    at admission, a moment before it writes ``startTime`` (whole seconds),
    so a fault within a second of the start is taken as older than the pod:
    the device manager could have been told. Unknown times say nothing, and
    a GPU out of service with no fault listed (a quarantine that outlived
    its fault, through reset and validation) has been out since before any
    pod that holds it now could start, since the fault evicted the ones
    before it.
    """
    if started is None or faulted_since is None:
        return False
    return faulted_since >= started + 1.0


def misplaced_gpus(node: Node, task: Task) -> tuple[int, ...]:
    """:func:`misplaced_on` with the node's GPUs in service judged as placement judges them."""
    if kubelet_gpus(node, task) is None:
        return ()
    verdict = judge(node)
    if verdict.node_fatal is not None:
        return ()  # the whole node is out: the pod goes for that, wherever it sits
    usable = frozenset(g.index for g in node.gpus if g.index not in verdict.bad_gpus and not g.mig_enabled)
    return misplaced_on(node, task, usable)
