"""Which pod is in which group: the grouping state of the scheduling cycle, kept from view to view.

A cycle reads as a pipeline, view -> groups -> snapshot -> engine ->
decisions; this module is its second stage and owns everything grouping
keeps. A pod of ours names its PodGroup (annotation
``scheduling.gpuwarden.io/pod-group``) or gets a group derived from its
owners (:func:`~scheduler.cluster.grouping.derive_group`). For each group it
knows the members and their priorities and the group's info (queue, gang
size) for the snapshot.

**Named groups** are what their PodGroup says: a user (or a controller) wrote
it, and it is read as written.

**Derived groups** follow their owner. Their info is worked out from the
owner chain on every cycle (owners can change without their pods changing:
a RayCluster scaled from 2 workers to 1, a Job's parallelism, a queue label
on the owner), so the PodGroup object the scheduler created for one is a
record of the derived spec, never its source. When it no longer says what
the owner says, :meth:`PodGrouper.drifted` names it and the cycle rewrites
its spec. PodGroups made before they were labelled as the scheduler's
(``app.kubernetes.io/managed-by: gpuwarden-scheduler``) are followed the
same way in memory, but are not rewritten.

Given a view that names what changed since the one the state reflects,
only the changed pods and PodGroups are regrouped, plus the pods with a
derived group whose owner chain is not the one their group was derived
from (the owner resolver hands out the object it cached until it reads the
owner again, so an unchanged chain is the same objects, compared by
identity); :meth:`PodGrouper.regroup` hands the assembler what changed.
The chain is looked up once per distinct owner reference, not per pod (a
gang's pods share one), and a pod with no owner reference is never
checked: its chain is empty until its own entry changes.
Without one everything is grouped again. A finished pod (Succeeded or
Failed) keeps the group it finished in: it holds nothing, its owner is not
read again for it, and so thousands of finished pods left in place by
their Jobs cost nothing per cycle.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from gpuwarden import contract
from scheduler.cluster.assemble import Changes
from scheduler.cluster.convert import GroupInfo
from scheduler.cluster.grouping import GroupSpec, derive_group
from scheduler.cluster.logonce import WarnOnce
from scheduler.cluster.owners import OwnerLookupError, controller_ref
from scheduler.cluster.queues import podgroup_spec
from scheduler.cluster.ungrouped import (
    REASON_POD_GROUP_INVALID,
    REASON_POD_GROUP_NOT_FOUND,
    UngroupedPod,
    invalid_message,
    missing_message,
)

warn = WarnOnce(__name__)

GroupKey = tuple[str, str]
# The label on PodGroups the scheduler created for derived groups (and so may rewrite).
MANAGED_BY = "app.kubernetes.io/managed-by"


class OwnerChains(Protocol):
    """Where a pod's owners come from (:class:`~scheduler.cluster.owners.OwnerResolver`)."""

    def chain(self, pod: Mapping[str, Any]) -> list[Mapping[str, Any]]: ...


class GroupingView(Protocol):
    """What grouping reads of a cycle's view (:class:`~scheduler.cluster.cycle.ClusterView`)."""

    @property
    def pods(self) -> Mapping[str, Mapping[str, Any]]: ...

    @property
    def podgroups(self) -> Mapping[GroupKey, Mapping[str, Any]]: ...

    @property
    def generation(self) -> int | None: ...

    @property
    def changed(self) -> Any: ...


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def is_ours(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec")
    return isinstance(spec, dict) and spec.get("schedulerName") == contract.SCHEDULER_NAME


def waiting(pod: Mapping[str, Any]) -> bool:
    """Pending and for the scheduler to place: not bound, not terminating, not gated."""
    spec = pod.get("spec")
    if not isinstance(spec, dict) or spec.get("nodeName") or spec.get("schedulingGates"):
        return False
    return not _meta(pod).get("deletionTimestamp") and not _finished(pod)


def _finished(pod: Mapping[str, Any]) -> bool:
    """Succeeded or Failed: done, holding nothing."""
    status = pod.get("status")
    return isinstance(status, dict) and status.get("phase") in ("Succeeded", "Failed")


def pod_priority(pod: Mapping[str, Any]) -> int:
    # The Priority admission plugin resolves priorityClassName into
    # spec.priority when the pod is created, so the class itself need not be read.
    spec = pod.get("spec")
    value = spec.get("priority") if isinstance(spec, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def managed_by_scheduler(obj: Mapping[str, Any]) -> bool:
    """Whether a PodGroup is one the scheduler created for a derived group (labelled so)."""
    labels = _meta(obj).get("labels")
    return isinstance(labels, dict) and labels.get(MANAGED_BY) == contract.SCHEDULER_COMPONENT


def podgroup_object(spec: GroupSpec) -> dict[str, Any]:
    """The PodGroup the scheduler creates for a derived group: owned by the workload, labelled as the scheduler's."""
    body: dict[str, Any] = {
        "apiVersion": f"{contract.SCHEDULING_API_GROUP}/{contract.SCHEDULING_API_VERSION}",
        "kind": contract.PODGROUP_KIND,
        "metadata": {
            "name": spec.name,
            "namespace": spec.namespace,
            "labels": {MANAGED_BY: contract.SCHEDULER_COMPONENT},
        },
        "spec": spec_fields(spec),
    }
    if spec.owner is not None:
        body["metadata"]["ownerReferences"] = [spec.owner.to_json()]
    return body


def spec_fields(spec: GroupSpec) -> dict[str, Any]:
    """The PodGroup spec a derived group's object carries."""
    fields: dict[str, Any] = {"minMember": spec.min_member, "queue": spec.queue}
    if spec.priority_class_name:
        fields["priorityClassName"] = spec.priority_class_name
    return fields


@dataclass(slots=True)
class _Grouping:
    """What grouping reads of one pod entry (``obj``), kept while the cache holds that entry."""

    obj: Mapping[str, Any]
    ours: bool
    namespace: str = ""
    named: str | None = None
    priority: int = 0


@dataclass(slots=True)
class _Grouped:
    """What the kept grouping holds of one pod: the group it counts for, and whether that was derived."""

    key: GroupKey | None
    derived: bool


@dataclass(frozen=True, slots=True)
class _Derived:
    """One pod's derived group: its spec and the info the snapshot gets."""

    spec: GroupSpec
    info: GroupInfo


class PodGrouper:
    """The grouping state (see the module docstring); one per scheduling cycle object.

    Not thread-safe but for :meth:`mark_created`, which the background
    writer calls once a derived PodGroup exists.
    """

    def __init__(self, owners: OwnerChains, *, default_queue: str, incremental: bool = True) -> None:
        self._owners = owners
        self._default_queue = default_queue
        self._incremental = incremental
        self._groupings: dict[str, _Grouping] = {}
        # The spec read off each PodGroup entry, while the cache holds that entry.
        self._podgroups: dict[GroupKey, tuple[Mapping[str, Any], GroupInfo | None]] = {}
        # Derived PodGroups known to exist (created here, or seen in a view).
        self._created: set[GroupKey] = set()
        # Derived PodGroups found missing since the cycle last took them.
        self._missing: dict[GroupKey, GroupSpec] = {}
        # ``_seen`` is the generation of the view the state reflects, None when none.
        self._seen: int | None = None
        self._grouped: dict[str, _Grouped] = {}
        self._members: dict[GroupKey, dict[str, int]] = {}
        self._derived: dict[GroupKey, dict[str, _Derived]] = {}
        self._derived_uids: set[str] = set()
        # Per pod with a derived group: the pod entry and owner chain it was derived from.
        self._inputs: dict[str, tuple[Mapping[str, Any], tuple[Mapping[str, Any], ...]]] = {}
        self._explicit: dict[GroupKey, GroupInfo] = {}
        self._groups: dict[GroupKey, GroupInfo] = {}
        # Groups that pods count for but that have no info: a named PodGroup missing or malformed.
        self._unknown: set[GroupKey] = set()
        self._by_uid: dict[str, str] = {}
        # What the latest grouping produced (incremental or whole), for the snapshot and the status.
        self.groups: Mapping[GroupKey, GroupInfo] = {}
        self.by_uid: Mapping[str, str] = {}
        self._specs: Mapping[GroupKey, GroupSpec] = {}
        # The groups the latest regroup touched: only they can have drifted from their PodGroup.
        self._dirty: Collection[GroupKey] = ()

    # -- life cycle ---------------------------------------------------------------

    def invalidate(self) -> None:
        """Forget that the state reflects a view: the next :meth:`regroup` groups everything."""
        self._seen = None

    def take_missing(self) -> dict[GroupKey, GroupSpec]:
        """The derived PodGroups found missing since the last call (the cycle creates them)."""
        missing, self._missing = self._missing, {}
        return missing

    def mark_created(self, key: GroupKey) -> None:
        self._created.add(key)

    def created(self, key: GroupKey) -> bool:
        return key in self._created

    # -- grouping -------------------------------------------------------------

    def regroup(self, view: GroupingView) -> Changes | None:
        """Bring the kept grouping up to ``view``; what changed for the assembler, None if everything did.

        Everything is grouped again when the view does not say what changed
        since the view this state reflects (the first cycle, a cache whose
        change log overflowed, a cycle that failed half way).
        """
        changed = view.changed
        full = changed is None or self._seen is None or changed.since != self._seen
        self._seen = None  # until this grouping is complete
        if full:
            self._grouped.clear()
            self._members.clear()
            self._derived.clear()
            self._derived_uids.clear()
            self._inputs.clear()
            self._explicit.clear()
            self._groups.clear()
            self._unknown.clear()
            self._by_uid.clear()
            pod_keys: Collection[str] = list(view.pods)
            group_keys: Collection[GroupKey] = list(view.podgroups)
            # Of the PodGroups created, only those the view still holds stay
            # known as created: one deleted since is made again if its group
            # still needs it (one created but not seen yet only costs a 409).
            self._created.intersection_update(view.podgroups)
        else:
            assert changed is not None
            stale = self._stale_pods(changed.pods, view)
            pod_keys = changed.pods | stale if stale else changed.pods
            group_keys = changed.podgroups
        dirty: set[GroupKey] = set()
        for key in group_keys:
            obj = view.podgroups.get(key)
            if obj is None:
                self._podgroups.pop(key, None)
                self._created.discard(key)  # deleted: made again while its group still needs one
                info = None
            else:
                info = self._read_podgroup(key, obj)
            if info is None:
                before = self._explicit.pop(key, None)
            else:
                before = self._explicit.get(key)
                self._explicit[key] = info
            if before != info:
                dirty.add(key)
        regrouped: set[str] = set()
        for uid in pod_keys:
            before_name = self._by_uid.pop(uid, None)
            self._ungroup(uid, dirty)
            pod = view.pods.get(uid)
            if pod is None:
                self._groupings.pop(uid, None)
            else:
                self._group(uid, pod, view, dirty)
            if self._by_uid.get(uid) != before_name:
                regrouped.add(uid)
        groups_changed: set[GroupKey] = set()
        for key in dirty:
            if self._refresh_group(key):
                groups_changed.add(key)
            derived = self._derived.get(key)
            if derived and key not in view.podgroups:
                # Its PodGroup was deleted while pods still derive the group.
                self._note_missing(key, derived[min(derived)].spec, view)
        self._dirty = dirty
        self._seen = view.generation
        self.groups = self._groups
        self.by_uid = self._by_uid
        self._specs = {}
        if full:
            return None
        return Changes(pods=pod_keys, groups=groups_changed, pod_groups=regrouped)

    def group_all(self, view: GroupingView) -> None:
        """Group every pod of ``view`` from scratch (the reference the incremental path must agree with)."""
        self._groupings.clear()
        self._podgroups.clear()
        explicit: dict[GroupKey, GroupInfo] = {}
        for key, obj in view.podgroups.items():
            info = self._read_podgroup(key, obj)
            if info is not None:
                explicit[key] = info
        by_uid: dict[str, str] = {}
        members: dict[GroupKey, list[int]] = {}
        named: set[GroupKey] = set()
        derived: dict[GroupKey, tuple[str, _Derived]] = {}
        for uid, pod in view.pods.items():
            facts = self._grouping(uid, pod)
            if not facts.ours:
                continue
            if facts.named is not None:
                key = (facts.namespace, facts.named)
                named.add(key)
            else:
                try:
                    found = self._derive(pod)
                except OwnerLookupError:
                    continue  # no group rather than a wrong one: the pod waits (the resolver logged why)
                key = (found.spec.namespace, found.spec.name)
                by_uid[uid] = found.spec.name
                self._note_missing(key, found.spec, view)
                chosen = derived.get(key)
                if chosen is None or uid < chosen[0]:
                    derived[key] = (uid, found)
            members.setdefault(key, []).append(facts.priority)
        groups: dict[GroupKey, GroupInfo] = {}
        specs: dict[GroupKey, GroupSpec] = {}
        for key, priorities in members.items():
            info = self._info(explicit.get(key), derived[key][1] if key in derived else None, key in named)
            if info is not None:
                groups[key] = replace(info, priority=max(priorities))
            if key in derived and key not in named:
                specs[key] = derived[key][1].spec
        for key, info in explicit.items():
            groups.setdefault(key, info)
        self.groups = groups
        self.by_uid = by_uid
        self._specs = specs

    def drifted(self, view: GroupingView) -> list[tuple[GroupSpec, Mapping[str, Any]]]:
        """Derived groups whose PodGroup (one the scheduler created) no longer says what the owner says.

        Each with the object as the view has it; the cycle rewrites its spec.
        """
        out: list[tuple[GroupSpec, Mapping[str, Any]]] = []
        for key, spec in sorted(self._derived_specs().items()):
            obj = view.podgroups.get(key)
            if obj is None or not managed_by_scheduler(obj):
                continue
            current = obj.get("spec")
            current = current if isinstance(current, dict) else {}
            wanted = spec_fields(spec)
            if any(current.get(k) != v for k, v in wanted.items()) or (
                "priorityClassName" not in wanted and current.get("priorityClassName")
            ):
                out.append((spec, obj))
        return out

    def ungrouped(self, view: GroupingView) -> list[UngroupedPod]:
        """Pending pods of ours that name a PodGroup which is missing or malformed.

        Incremental cycles look only at the groups some pod counts for and
        that have no info (a handful); otherwise every pod is looked at.
        """
        if self._incremental:
            wanted = [(key, list(self._members.get(key, ()))) for key in sorted(self._unknown)]
        else:
            by_key: dict[GroupKey, list[str]] = {}
            for uid, pod in view.pods.items():
                facts = self._grouping(uid, pod)
                if facts.ours and facts.named is not None and (facts.namespace, facts.named) not in self.groups:
                    by_key.setdefault((facts.namespace, facts.named), []).append(uid)
            wanted = list(by_key.items())
        out: list[UngroupedPod] = []
        for key, uids in wanted:
            obj = view.podgroups.get(key)
            if obj is None:
                reason, message = REASON_POD_GROUP_NOT_FOUND, missing_message(key[0], key[1])
            else:
                problem = podgroup_spec(obj)
                if not isinstance(problem, str):
                    continue  # readable: grouped next cycle
                reason, message = REASON_POD_GROUP_INVALID, invalid_message(problem)
            for uid in uids:
                member = view.pods.get(uid)
                if member is not None and waiting(member):
                    out.append(UngroupedPod(key[0], str(_meta(member).get("name") or ""), uid, reason, message))
        return out

    # -- one pod, one group ---------------------------------------------------

    def _derive(self, pod: Mapping[str, Any], uid: str | None = None) -> _Derived:
        chain = self._owners.chain(pod)
        spec = derive_group(pod, chain, default_queue=self._default_queue)
        if uid is not None:
            self._inputs[uid] = (pod, tuple(chain))
        return _Derived(spec, GroupInfo(queue=spec.queue, min_member=spec.min_member))

    def _stale_pods(self, changed: Collection[str], view: GroupingView) -> set[str]:
        """The pods with a derived group (their entries unchanged) to derive again: their owner chain
        is no longer the objects it was derived from. Finished pods, and pods without an owner
        reference, are never asked (see _group). Pods that share their first owner reference share
        their chain, which is looked up once for all of them."""
        chains: dict[tuple[str, str, str, str], tuple[Mapping[str, Any], ...] | None] = {}
        stale: set[str] = set()
        for uid in self._derived_uids:
            if uid in changed:
                continue
            inputs = self._inputs.get(uid)
            pod = view.pods.get(uid)
            if inputs is None or pod is None or inputs[0] is not pod:
                stale.add(uid)
                continue
            ref = controller_ref(pod) or {}
            meta = _meta(pod)
            at = (str(meta.get("namespace") or ""), str(ref.get("uid")), str(ref.get("kind")), str(ref.get("name")))
            if at in chains:
                chain = chains[at]
            else:
                try:
                    chain = chains[at] = tuple(self._owners.chain(pod))
                except OwnerLookupError:
                    # Grouped again, which leaves it without a group as a failed derivation does.
                    chain = chains[at] = None
            before = inputs[1]
            if (
                chain is None
                or len(chain) != len(before)
                or any(now is not then for now, then in zip(chain, before, strict=True))
            ):
                stale.add(uid)
        return stale

    def _note_missing(self, key: GroupKey, spec: GroupSpec, view: GroupingView) -> None:
        if key in view.podgroups:
            self._created.add(key)
        elif key not in self._created:
            # Created after the cycle's binds (one round trip each): never ahead of them.
            self._missing.setdefault(key, spec)

    def _read_podgroup(self, key: GroupKey, obj: Mapping[str, Any]) -> GroupInfo | None:
        """What a PodGroup says (None when malformed), read again only when the cache replaced the entry."""
        memo = self._podgroups.get(key)
        if memo is not None and memo[0] is obj:
            return memo[1]
        spec = podgroup_spec(obj)
        info: GroupInfo | None = None
        if isinstance(spec, str):
            warn.warning("podgroup_invalid", ("podgroup", key, spec), podgroup="/".join(key), problem=spec)
        else:
            info = GroupInfo(
                queue=spec.queue,
                min_member=spec.min_member,
                preemptible=spec.preemptible,
                uid=str(_meta(obj).get("uid") or ""),
            )
        self._podgroups[key] = (obj, info)
        return info

    @staticmethod
    def _info(explicit: GroupInfo | None, derived: _Derived | None, named: bool) -> GroupInfo | None:
        """A group's info: a named group's PodGroup; a derived group's owner, with its PodGroup's UID."""
        if derived is None or named:
            return explicit if explicit is not None else (derived.info if derived is not None else None)
        if explicit is None:
            return derived.info
        return replace(derived.info, uid=explicit.uid)

    def _grouping(self, uid: str, pod: Mapping[str, Any]) -> _Grouping:
        """What grouping reads of ``pod``, read again only when the cache replaced the entry."""
        memo = self._groupings.get(uid)
        if memo is not None and memo.obj is pod:
            return memo
        if not is_ours(pod):
            memo = _Grouping(pod, ours=False)
        else:
            meta = _meta(pod)
            annotations = meta.get("annotations") or {}
            named = annotations.get(contract.ANNOTATION_POD_GROUP) if isinstance(annotations, dict) else None
            memo = _Grouping(
                pod,
                ours=True,
                namespace=str(meta.get("namespace") or "default"),
                named=named if isinstance(named, str) and named else None,
                priority=pod_priority(pod),
            )
        self._groupings[uid] = memo
        return memo

    def _ungroup(self, uid: str, dirty: set[GroupKey]) -> None:
        grouped = self._grouped.pop(uid, None)
        if grouped is None or grouped.key is None:
            self._derived_uids.discard(uid)
            self._inputs.pop(uid, None)
            return
        key = grouped.key
        dirty.add(key)
        members = self._members.get(key)
        if members is not None:
            members.pop(uid, None)
            if not members:
                del self._members[key]
        if grouped.derived:
            self._derived_uids.discard(uid)
            self._inputs.pop(uid, None)
            derived = self._derived.get(key)
            if derived is not None:
                derived.pop(uid, None)
                if not derived:
                    del self._derived[key]

    def _group(self, uid: str, pod: Mapping[str, Any], view: GroupingView, dirty: set[GroupKey]) -> None:
        facts = self._grouping(uid, pod)
        if not facts.ours:
            return
        if facts.named is not None:
            key = (facts.namespace, facts.named)
            self._grouped[uid] = _Grouped(key, derived=False)
        else:
            self._derived_uids.add(uid)
            try:
                found = self._derive(pod, uid)
            except OwnerLookupError:
                self._grouped[uid] = _Grouped(None, derived=True)
                return  # no group rather than a wrong one: the pod waits (the resolver logged why)
            if _finished(pod) or controller_ref(pod) is None:
                # Never stale (see the module): out of the per-cycle checks, and
                # its owner objects are not held for a comparison never made.
                self._derived_uids.discard(uid)
                self._inputs.pop(uid, None)
            key = (found.spec.namespace, found.spec.name)
            self._grouped[uid] = _Grouped(key, derived=True)
            self._by_uid[uid] = found.spec.name
            self._note_missing(key, found.spec, view)
            self._derived.setdefault(key, {})[uid] = found
        dirty.add(key)
        self._members.setdefault(key, {})[uid] = facts.priority
        if len(self._groupings) > len(view.pods) + max(1024, len(view.pods) // 4):
            self._groupings = {u: memo for u, memo in self._groupings.items() if u in view.pods}

    def _refresh_group(self, key: GroupKey) -> bool:
        """Recompute one group's info as :meth:`group_all` would; True if it changed."""
        members = self._members.get(key) or {}
        derived = self._derived.get(key)
        named = any(not self._grouped[u].derived for u in members if u in self._grouped)
        # A derived group's spec is its least pod's (by UID): the same whatever order the pods come in.
        chosen = derived[min(derived)] if derived else None
        info = self._info(self._explicit.get(key), chosen, named)
        if info is not None and members:
            info = replace(info, priority=max(members.values()))
        before = self._groups.get(key)
        if info is None:
            self._groups.pop(key, None)
            if members:
                self._unknown.add(key)  # pods name it, and it is missing or malformed
            else:
                self._unknown.discard(key)
        else:
            self._groups[key] = info
            self._unknown.discard(key)
        return before != info

    def _derived_specs(self) -> Mapping[GroupKey, GroupSpec]:
        """The spec (its least pod's) of each derived group no pod names, of those the latest grouping touched."""
        if not self._incremental:
            return self._specs
        out: dict[GroupKey, GroupSpec] = {}
        for key in self._dirty:
            derived = self._derived.get(key)
            if not derived:
                continue
            members = self._members.get(key, {})
            if any(not self._grouped[u].derived for u in members if u in self._grouped):
                continue
            out[key] = derived[min(derived)].spec
        return out
