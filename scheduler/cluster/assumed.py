"""Binds the API server accepted that the watch has not shown yet: counted as bound until it does.

A cycle that binds a thousand pods ends long before the watch has delivered
those thousand MODIFIED events, and the next cycle starts as soon as the first
of them arrive. Scheduled from the cache alone, it would see most of the pods
just bound as still pending and their GPUs as free: it would place them again
(a 409 for each) and, worse, place other pods onto GPUs that are taken. The
API server accepts a binding to a full node (only the kubelet would refuse the
pod later), so a fast fill would over-commit nodes.

So, as kube-scheduler's cache "assumes" a pod it bound, the runner remembers
every bind that succeeded, with the node and GPU assignment it wrote, and
shows the next cycles each such pod as bound until the watch does: until the
cache has the pod with a ``spec.nodeName`` (whatever node: the API server's
word wins) or no longer has the pod at all. Nothing expires by time: a bind
that was answered 201 happened, and the watch will show it.

Evictions the same (:class:`AssumedEvictions`): a pod whose eviction the
API server accepted is shown terminating until the watch shows it so or
gone. Scheduled from the cache alone, the next cycle (often a few
milliseconds later) saw the victim still running on the room just freed,
found the reservation made for that room "held by other work", dropped it,
and evicted another victim for the same job.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from gpuwarden.contract import ANNOTATION_GPU_ASSIGNMENT
from scheduler.cluster.assignment import encode_assignment
from scheduler.cluster.cycle import ClusterView, CycleResult
from scheduler.cluster.evict import EvictOutcome
from scheduler.engine.model import Bind, Node

JSON = dict[str, Any]
T = TypeVar("T")


class _Assumed(ABC, Generic[T]):
    """Pods an earlier cycle wrote that the cache does not show written yet, by pod UID, with what was written.

    Used from the scheduling loop's one thread.
    """

    def __init__(self) -> None:
        self._pods: dict[str, T] = {}
        # Pods no longer assumed although the cache did not change them: the
        # next view names them changed, so that a cycle reading only what
        # changed reads them again.
        self._dropped: set[str] = set()

    def __len__(self) -> int:
        return len(self._pods)

    @abstractmethod
    def _confirmed(self, pod: Mapping[str, Any]) -> bool:
        """Whether the cache's ``pod`` shows the write (or can show nothing of it)."""

    @abstractmethod
    def _shown(self, pod: Mapping[str, Any], assumed: T) -> JSON:
        """A copy of ``pod`` as the API server holds it after the write (the cache's own dict is not touched)."""

    def overlay(self, view: ClusterView) -> ClusterView:
        """``view`` with every assumed pod shown written; assumptions the view confirms are dropped."""
        dropped, self._dropped = self._dropped, set()
        if not self._pods and not dropped:
            return view
        shown: dict[str, JSON] = {}
        for uid, assumed in list(self._pods.items()):
            pod = view.pods.get(uid)
            if pod is None or self._confirmed(pod):
                del self._pods[uid]  # gone, or the watch caught up
                continue
            shown[uid] = self._shown(pod, assumed)
        if not shown and not dropped:
            return view
        # The shown pods are new objects: a cycle reading only what changed
        # must read them too (and again each cycle while they are assumed).
        changed = view.changed
        if changed is not None:
            changed = replace(changed, pods=frozenset(changed.pods) | frozenset(shown) | dropped)
        return replace(view, pods=_Shown(shown, view.pods) if shown else view.pods, changed=changed)


class _Shown(Mapping[str, JSON]):
    """``base`` with the pods of ``shown`` (all of them in ``base``) shown as written.

    Not a merged copy: copying every pod for every cycle in which a bind
    was still unconfirmed cost more than the cycle's own reading of what
    changed.
    """

    __slots__ = ("_base", "_shown")

    def __init__(self, shown: Mapping[str, JSON], base: Mapping[str, JSON]) -> None:
        self._shown = shown
        self._base = base

    def __getitem__(self, uid: str) -> JSON:
        found = self._shown.get(uid)
        return found if found is not None else self._base[uid]

    def get(self, uid: str, default: Any = None) -> Any:
        found = self._shown.get(uid)
        return found if found is not None else self._base.get(uid, default)

    def __contains__(self, uid: object) -> bool:
        return uid in self._base

    def __iter__(self) -> Iterator[str]:
        return iter(self._base)

    def __len__(self) -> int:
        return len(self._base)


@dataclass(frozen=True, slots=True)
class AssumedBind:
    """Where a pod was bound, and the assignment annotation the bind wrote (None: no GPUs)."""

    node: str
    assignment: str | None


class AssumedBinds(_Assumed[AssumedBind]):
    """Pods bound by earlier cycles whose binding the cache does not show yet.

    A bind sent in the background (:mod:`.inflight`) is assumed when sent;
    if its answer says it failed, the pod is shown as the cache has it
    again, and read again by the next cycle although the cache did not
    change it.
    """

    def record(self, result: CycleResult) -> None:
        """Remember the binds of ``result`` sent or accepted; forget those answered as failed."""
        nodes = result.nodes_by_name or {n.name: n for n in result.snapshot.nodes}
        for bind in result.sent:
            self._assume(bind, nodes.get(bind.node))
        for outcome in result.binds:
            bind = outcome.bind
            if not bind.uid:
                continue
            if outcome.ok:
                self._assume(bind, nodes.get(bind.node))
            elif self._pods.pop(bind.uid, None) is not None:
                self._dropped.add(bind.uid)

    def _assume(self, bind: Bind, node: Node | None) -> None:
        if not bind.uid:
            return
        assignment = None
        if bind.gpu_indices and node is not None:
            try:
                assignment = encode_assignment(bind, node)
            except ValueError:
                assignment = None  # the binder refuses such a bind; nothing is written
        self._pods[bind.uid] = AssumedBind(bind.node, assignment)

    def _confirmed(self, pod: Mapping[str, Any]) -> bool:
        spec = pod.get("spec")
        return not isinstance(spec, dict) or bool(spec.get("nodeName"))

    def _shown(self, pod: Mapping[str, Any], assumed: AssumedBind) -> JSON:
        return shown_bound(pod, pod["spec"], assumed)


def shown_bound(pod: Mapping[str, Any], spec: Mapping[str, Any], assumed: AssumedBind) -> JSON:
    """A copy of the pod as the API server holds it after the bind (the cache's own dict is not touched)."""
    meta = pod.get("metadata")
    meta = dict(meta) if isinstance(meta, dict) else {}
    if assumed.assignment is not None:
        annotations = meta.get("annotations")
        meta["annotations"] = {
            **(annotations if isinstance(annotations, dict) else {}),
            ANNOTATION_GPU_ASSIGNMENT: assumed.assignment,
        }
    return {**pod, "metadata": meta, "spec": {**spec, "nodeName": assumed.node}}


class AssumedEvictions(_Assumed[str]):
    """Pods evicted by earlier cycles that the cache still shows running, with the time asked.

    An eviction the API server answered 201 (or 404: gone already) has set
    the pod's deletion timestamp or removed it, and the watch will show
    which: nothing expires by time.
    """

    def record(self, result: CycleResult) -> None:
        """Remember the evictions of ``result`` that the API server accepted."""
        if not result.evictions:
            return
        asked = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for outcome in result.evictions:
            uid = outcome.eviction.uid
            if uid and outcome.outcome in (EvictOutcome.EVICTED, EvictOutcome.GONE):
                self._pods[uid] = asked

    def _confirmed(self, pod: Mapping[str, Any]) -> bool:
        meta = pod.get("metadata")
        return not isinstance(meta, dict) or bool(meta.get("deletionTimestamp"))

    def _shown(self, pod: Mapping[str, Any], assumed: str) -> JSON:
        return {**pod, "metadata": {**pod["metadata"], "deletionTimestamp": assumed}}
