"""The scheduler's picture of the cluster, kept current by one watch per collection.

Each collection (Nodes, GPUNodes, Pods, Queues, PodGroups, PDBs, and the
PersistentVolumeClaims and PersistentVolumes pending pods' volumes use) has a
:class:`~scheduler.cluster.watch.Reflector` that feeds one store, a dict from
object key to a pruned entry (:mod:`scheduler.cluster.slim`). An event costs
one prune and one dict assignment under the lock, whatever the size of the
cluster, so a cycle pays for what changed, not for every running pod.

A scheduling cycle takes a :meth:`ClusterCache.view`: shallow copies of every
store made under one lock hold, so the cycle sees one consistent moment while
the watches carry on. Entries are never changed in place (an update replaces
the entry), which is what makes shallow copies enough.

The loop runs "every second, or sooner after a change" with
:meth:`ClusterCache.wait_for_change`; a change that cannot alter a decision
(a status the scheduler wrote itself, a bound pod starting) is stored and
logged without waking it at once (:mod:`scheduler.cluster.wakes`); an idle
loop may ask to fold such changes in once they settled (``settle_s``).

A cycle that kept what it read of the previous view needs only what changed
since: the cache keeps a bounded log of the keys each event touched, and a
view taken ``since`` an earlier generation names them
(:attr:`CacheView.changed`). A relist reaches the stores as the events it
found (added, changed, vanished), so it is logged like any other change;
once more changes came than the log holds, the view says it cannot tell
(``changed`` is None) and the cycle reads everything again.

At 150,000 pods most of an initial sync is Python's cyclic collector
scanning the young containers of each decoded list page; a process that
hosts the cache should raise the collector's first threshold (e.g.
``gc.set_threshold(50_000, 10, 10)``): 24 s become 10 s in
benchmarks/scheduler_cache.py. The cache does not change that global
setting itself.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from kubernetes import client

from gpuwarden import contract
from gpuwarden.kube import JSON, RequestStats
from gpuwarden.logconfig import get_logger
from scheduler.cluster.slim import slim_claim, slim_node, slim_pod, slim_volume, without_managed_fields
from scheduler.cluster.wakes import (
    QuietChange,
    never_wakes,
    pod_frees_room,
    quiet_pod_change,
    quiet_podgroup_change,
    quiet_status_change,
)
from scheduler.cluster.watch import EventType, ListFunction, Reflector, ReflectorSettings, WatchEvent

log = get_logger(__name__)

NODES = "nodes"
GPUNODES = "gpunodes"
PODS = "pods"
QUEUES = "queues"
PODGROUPS = "podgroups"
PDBS = "poddisruptionbudgets"
CLAIMS = "persistentvolumeclaims"
VOLUMES = "persistentvolumes"
RESOURCESLICES = "resourceslices"
DEVICETAINTRULES = "devicetaintrules"
RESOURCECLAIMS = "resourceclaims"
DEVICECLASSES = "deviceclasses"


@dataclass(frozen=True)
class WatchedResource:
    """One collection the cache keeps: its store name, how to list it, what to keep of each object."""

    name: str
    list_fn: Callable[[client.ApiClient], ListFunction]
    slim: Callable[[JSON], JSON] = without_managed_fields
    # Which updates wait for the next cycle instead of waking the loop (:mod:`.wakes`); None: all wake.
    quiet: QuietChange | None = None
    # Which updates only free room: quiet too while no cycle waits for room (ClusterCache.room_wanted).
    frees_room: QuietChange | None = None
    # What no cycle needs: a list refused (403) leaves it empty, like a collection
    # not served, and neither is an API error (see Reflector's ``optional``).
    optional: bool = False


def _custom_cluster(
    group: str, version: str, plural: str, field_selector: str | None = None
) -> Callable[[client.ApiClient], ListFunction]:
    def make(api: client.ApiClient) -> ListFunction:
        list_fn = client.CustomObjectsApi(api).list_cluster_custom_object
        if field_selector is None:
            return functools.partial(list_fn, group, version, plural)
        return functools.partial(list_fn, group, version, plural, field_selector=field_selector)

    return make


def _custom_all_namespaces(group: str, version: str, plural: str) -> Callable[[client.ApiClient], ListFunction]:
    def make(api: client.ApiClient) -> ListFunction:
        return functools.partial(
            client.CustomObjectsApi(api).list_custom_object_for_all_namespaces, group, version, plural
        )

    return make


def default_resources() -> tuple[WatchedResource, ...]:
    """Everything the scheduler reads (DESIGN.md, How data flows)."""
    return (
        WatchedResource(NODES, lambda api: client.CoreV1Api(api).list_node, slim_node),
        WatchedResource(GPUNODES, _custom_cluster(contract.API_GROUP, contract.API_VERSION, contract.GPUNODE_PLURAL)),
        WatchedResource(
            PODS,
            lambda api: client.CoreV1Api(api).list_pod_for_all_namespaces,
            slim_pod,
            quiet_pod_change,
            pod_frees_room,
        ),
        WatchedResource(
            QUEUES,
            _custom_cluster(contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION, contract.QUEUE_PLURAL),
            quiet=quiet_status_change,
        ),
        WatchedResource(
            PODGROUPS,
            _custom_all_namespaces(
                contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION, contract.PODGROUP_PLURAL
            ),
            quiet=quiet_podgroup_change,
        ),
        WatchedResource(PDBS, lambda api: client.PolicyV1Api(api).list_pod_disruption_budget_for_all_namespaces),
        WatchedResource(
            CLAIMS, lambda api: client.CoreV1Api(api).list_persistent_volume_claim_for_all_namespaces, slim_claim
        ),
        WatchedResource(VOLUMES, lambda api: client.CoreV1Api(api).list_persistent_volume, slim_volume),
        # NVIDIA's DRA driver's devices and the DeviceTaintRules on them, for
        # remediation's device taints (scheduler.remediation.devicetaints).
        # Their updates do not wake the loop (no cycle reads them; an object's
        # deletion does, as every deletion does). A cluster that serves
        # no resource.k8s.io/v1, or RBAC that grants no list of them (the
        # manifests of an older release), leaves both empty.
        WatchedResource(
            RESOURCESLICES,
            _custom_cluster(
                contract.DRA_API_GROUP,
                contract.DRA_API_VERSION,
                contract.RESOURCESLICE_PLURAL,
                field_selector=f"spec.driver={contract.NVIDIA_DRA_DRIVER}",
            ),
            quiet=never_wakes,
            optional=True,
        ),
        WatchedResource(
            DEVICETAINTRULES,
            _custom_cluster(contract.DRA_API_GROUP, contract.DRA_API_VERSION, contract.DEVICETAINTRULE_PLURAL),
            quiet=never_wakes,
            optional=True,
        ),
        # The ResourceClaims and DeviceClasses that pods with DRA claims are
        # placed and allocated by (scheduler.cluster.claims). A claim's
        # change wakes the loop: the resourceclaim controller creating a
        # pod's claim from its template, or a claim deallocated, is what a
        # pending pod waits for.
        WatchedResource(
            RESOURCECLAIMS,
            _custom_all_namespaces(contract.DRA_API_GROUP, contract.DRA_API_VERSION, contract.RESOURCECLAIM_PLURAL),
            optional=True,
        ),
        WatchedResource(
            DEVICECLASSES,
            _custom_cluster(contract.DRA_API_GROUP, contract.DRA_API_VERSION, contract.DEVICECLASS_PLURAL),
            quiet=never_wakes,
            optional=True,
        ),
    )


@dataclass(frozen=True)
class CacheView:
    """The cluster at one moment, for one scheduling cycle.

    ``stores`` maps a collection name (:data:`PODS`, ...) to its entries by
    key (``namespace/name``, or ``name`` for cluster-scoped objects). The
    dicts are copies that stay as they were taken (views taken while a
    collection did not change share one); neither they nor their entries
    may be changed. ``generation`` is the change counter the view was taken at;
    ``missing`` names collections whose API is not served (a CRD not
    installed), which are empty. ``changed``, for a view taken ``since`` an
    earlier generation, holds per collection the keys added, replaced or
    removed after it (a collection absent from it did not change); None
    when that is not known (no ``since``, or the change log no longer
    reaches back to it): everything may have changed.
    """

    stores: Mapping[str, Mapping[str, JSON]]
    generation: int
    synced: bool
    missing: frozenset[str] = field(default_factory=frozenset)
    changed: Mapping[str, frozenset[str]] | None = None
    since: int | None = None
    # Collections that hold only the entries changed since ``since`` (see ClusterCache.view).
    partial: frozenset[str] = field(default_factory=frozenset)

    def store(self, name: str) -> Mapping[str, JSON]:
        return self.stores.get(name, {})

    @property
    def nodes(self) -> Mapping[str, JSON]:
        return self.store(NODES)

    @property
    def gpunodes(self) -> Mapping[str, JSON]:
        return self.store(GPUNODES)

    @property
    def pods(self) -> Mapping[str, JSON]:
        return self.store(PODS)

    @property
    def queues(self) -> Mapping[str, JSON]:
        return self.store(QUEUES)

    @property
    def podgroups(self) -> Mapping[str, JSON]:
        return self.store(PODGROUPS)

    @property
    def pdbs(self) -> Mapping[str, JSON]:
        return self.store(PDBS)

    @property
    def claims(self) -> Mapping[str, JSON]:
        return self.store(CLAIMS)

    @property
    def volumes(self) -> Mapping[str, JSON]:
        return self.store(VOLUMES)

    @property
    def resource_slices(self) -> Mapping[str, JSON]:
        return self.store(RESOURCESLICES)

    @property
    def device_taint_rules(self) -> Mapping[str, JSON]:
        return self.store(DEVICETAINTRULES)

    @property
    def resource_claims(self) -> Mapping[str, JSON]:
        return self.store(RESOURCECLAIMS)

    @property
    def device_classes(self) -> Mapping[str, JSON]:
        return self.store(DEVICECLASSES)


class ClusterCache:
    """Watched stores of every collection the scheduler reads; thread-safe.

    Without an ``api_client`` (benchmarks, tests of the stores) nothing is
    watched and events are fed with :meth:`apply`. ``change_log`` bounds
    how many changes a later view can still name (see the module
    docstring); a sync of the whole cluster needs no log, since the first
    view reads everything anyway.
    """

    def __init__(
        self,
        api_client: client.ApiClient | None = None,
        *,
        resources: Sequence[WatchedResource] | None = None,
        settings: ReflectorSettings | None = None,
        stats: RequestStats | None = None,
        change_log: int = 100_000,
    ) -> None:
        self._resources = {r.name: r for r in (resources if resources is not None else default_resources())}
        self._stores: dict[str, dict[str, JSON]] = {name: {} for name in self._resources}
        # Per collection, the copy the last view took, while the store has not
        # changed since: views share it (see view). A change drops it.
        self._copies: dict[str, dict[str, JSON]] = {}
        self._changed = threading.Condition(threading.Lock())
        self._generation = 0
        # The generation of the last change that wakes the loop (see .wakes).
        self._woken = 0
        # Whether a cycle may wait for room (work pending or room reserved):
        # the scheduling loop says so after each cycle. While it does not, a
        # change that only frees room (a bound pod that ended) waits for the
        # next cycle; under steady churn with nothing waiting, such changes
        # were half of the cycles. True until the loop says otherwise.
        self.room_wanted = True
        # (generation, collection, key, monotonic time) per change, oldest
        # first; a change at or before ``_log_floor`` may have been dropped.
        self._log: deque[tuple[int, str, str, float]] = deque()
        # Waiters that fold quiet changes in (wait_for_change's settle_s) and
        # wait for the first of them: while there are any, a quiet change
        # notifies. Collections no cycle reads (never_wakes) start no clock.
        self._settling = 0
        self._unread = frozenset(name for name, r in self._resources.items() if r.quiet is never_wakes)
        self._log_size = max(1, change_log)
        self._log_floor = 0
        self._reflectors: list[Reflector] = []
        if api_client is not None:
            for resource in self._resources.values():
                self._reflectors.append(
                    Reflector(
                        resource.name,
                        resource.list_fn(api_client),
                        functools.partial(self.apply, resource.name),
                        on_synced=self._bump,
                        settings=settings,
                        stats=stats,
                        optional=resource.optional,
                    )
                )

    # -- life cycle -------------------------------------------------------

    def start(self) -> ClusterCache:
        for reflector in self._reflectors:
            reflector.start()
        return self

    def stop(self) -> None:
        for reflector in self._reflectors:
            reflector.stop()

    def __enter__(self) -> ClusterCache:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def reflectors(self) -> tuple[Reflector, ...]:
        return tuple(self._reflectors)

    def synced(self) -> bool:
        """Every collection listed once (an unserved one counts, as empty)."""
        return all(r.synced for r in self._reflectors)

    def wait_synced(self, timeout: float) -> bool:
        """Wait until every collection has been listed once; False if ``timeout`` ran out first."""
        deadline = time.monotonic() + timeout
        return all(r.wait_synced(max(0.0, deadline - time.monotonic())) for r in self._reflectors)

    # -- changes ----------------------------------------------------------

    def apply(self, resource: str, event: WatchEvent) -> None:
        """Apply one watch event to one store: O(1), the prune done outside the lock."""
        if event.type is EventType.DELETED:
            with self._changed:
                self._stores[resource].pop(event.key, None)
                self._copies.pop(resource, None)
                self._logged(resource, event.key, wakes=True)
            return
        watched = self._resources[resource]
        entry = watched.slim(event.obj)
        with self._changed:
            store = self._stores[resource]
            before = store.get(event.key)
            quiet = (watched.quiet is not None and watched.quiet(before, entry)) or (
                not self.room_wanted and watched.frees_room is not None and watched.frees_room(before, entry)
            )
            store[event.key] = entry
            self._copies.pop(resource, None)
            self._logged(resource, event.key, wakes=not quiet)

    def _logged(self, resource: str, key: str, *, wakes: bool) -> None:
        """Count one change and log its key; wake the waiters unless it is quiet. The caller holds the lock."""
        self._generation += 1
        entries = self._log
        entries.append((self._generation, resource, key, time.monotonic()))
        if len(entries) > self._log_size:
            self._log_floor = entries.popleft()[0]
        if wakes:
            self._woken = self._generation
            self._changed.notify_all()
        elif self._settling and resource not in self._unread:
            self._changed.notify_all()

    def _bump(self) -> None:
        with self._changed:
            self._generation += 1
            self._woken = self._generation
            self._changed.notify_all()

    @property
    def generation(self) -> int:
        """Counts every change (and every completed list) since start."""
        with self._changed:
            return self._generation

    @property
    def woken(self) -> int:
        """The generation of the last change that woke the waiters (quiet ones leave it, see :mod:`.wakes`)."""
        with self._changed:
            return self._woken

    def wait_for_change(self, since: int, timeout: float, *, settle_s: float | None = None) -> int:
        """Block until a waking change (:mod:`.wakes`) passes ``since`` or ``timeout`` ends; return the generation.

        The loop passes the generation of the view it last scheduled from, so
        a change that came while it was busy wakes it at once. Quiet changes
        after ``since`` do not end the wait; they are in the stores and the
        log for whichever view comes next.

        With ``settle_s``, quiet changes end it too, once the waiter has
        waited ``settle_s`` and the first of them after ``since`` is as
        old: an idle loop folds them in (grouping, assembly, the engine's
        kept state) before the next waking change, whose cycle then pays
        only for itself. Under single-pod churn each arrival's cycle
        otherwise also folded in the echo of the previous bind, its pod
        starting and the pods that ended meanwhile: at 200 nodes its turn
        took 0.55-0.65 ms instead of 0.32-0.38 (benchmarks/scheduler_churn.py). Waiting
        ``settle_s`` gathers a burst of them into one cycle, and counting
        it from the start of the wait too keeps changes that came during
        the last cycle from starting the next one at once: however busy the
        watches, the loop idles ``settle_s`` between cycles of quiet
        changes. Changes of collections no cycle reads start no clock.
        """
        began = time.monotonic()
        deadline = began + timeout
        with self._changed:
            while self._woken <= since:
                due = deadline
                waits_for_first = False
                if settle_s is not None:
                    first = self._first_change_after(since)
                    if first is None:
                        waits_for_first = True
                    else:
                        due = min(deadline, max(first, began) + settle_s)
                left = due - time.monotonic()
                if left <= 0:
                    break
                self._settling += waits_for_first
                try:
                    self._changed.wait(left)
                finally:
                    self._settling -= waits_for_first
            return self._generation

    def _first_change_after(self, since: int) -> float | None:
        """When the first change after generation ``since`` that a cycle reads came; None if none did.

        -inf if the log no longer reaches back to ``since``.
        """
        if self._generation <= since:
            return None
        if since < self._log_floor:
            return float("-inf")
        first = None
        unread = self._unread
        for generation, resource, _, at in reversed(self._log):
            if generation <= since:
                break
            if resource not in unread:
                first = at
        return first

    # -- reading ----------------------------------------------------------

    def view(self, since: int | None = None, *, partial: Collection[str] = ()) -> CacheView:
        """Shallow copies of every store, taken together under the lock.

        With ``since`` (the generation of an earlier view) the view also
        names the keys changed after it, when the log still reaches back.
        Then the collections named in ``partial`` hold only their entries
        changed since (a key named changed and absent is gone): a caller
        that keeps its own copy up to date by the changes needs no more.
        Copying every pod and PodGroup for every cycle was 8 % of the
        scheduling thread's CPU under steady arrivals at 11,000 pods, most
        of it touching each entry to count the new reference.

        A collection that did not change since the last view is not copied
        again: the views share its copy, which nothing changes (the entries
        of a view are read-only, and a change to the store drops the copy
        instead of writing to it). Copying the Nodes, GPUNodes, Queues and
        DRA objects for every view was 7 % of the scheduling thread's GIL
        time under single-pod churn at 200 nodes, spent between a pod's
        arrival and its cycle.
        """
        missing = frozenset(r.name for r in self._reflectors if r.missing)
        with self._changed:
            generation = self._generation
            changed = self._changes_since(since) if since is not None else None
            only = frozenset(partial) if changed is not None else frozenset()
            stores: dict[str, dict[str, JSON]] = {}
            for name, store in self._stores.items():
                if changed is not None and name in only:
                    stores[name] = {key: store[key] for key in changed.get(name, ()) if key in store}
                else:
                    copy = self._copies.get(name)
                    if copy is None:
                        copy = self._copies[name] = dict(store)
                    stores[name] = copy
        return CacheView(
            stores=stores,
            generation=generation,
            synced=self.synced(),
            missing=missing,
            changed=changed,
            since=since,
            partial=only,
        )

    def _changes_since(self, since: int) -> dict[str, frozenset[str]] | None:
        """Keys changed after generation ``since``, per collection; None if the log lost some."""
        if since < self._log_floor or since > self._generation:
            return None
        keys: dict[str, set[str]] = {}
        for generation, resource, key, _ in reversed(self._log):
            if generation <= since:
                break
            found = keys.get(resource)
            if found is None:
                keys[resource] = {key}
            else:
                found.add(key)
        return {resource: frozenset(found) for resource, found in keys.items()}

    def get(self, resource: str, key: str) -> JSON | None:
        with self._changed:
            return self._stores[resource].get(key)

    def count(self, resource: str) -> int:
        with self._changed:
            return len(self._stores[resource])
