"""Reading a pod's owners (Job, JobSet, PyTorchJob, RayCluster, ...) for pod grouping.

:func:`scheduler.cluster.grouping.derive_group` decides a pod's group from its
owner chain; this module fetches that chain. Owners are read as raw objects
through the custom-objects API, which serves every non-core API group, so a
cluster without the Kubeflow, Trainer, Ray, JobSet, LeaderWorkerSet or Argo CRDs
answers 404 for those kinds and the chain simply ends there: never an error.
Pods are owners too: a LeaderWorkerSet's worker StatefulSet is owned by its
group's leader pod, so the chain of a worker runs worker StatefulSet, leader
pod, leader StatefulSet, LeaderWorkerSet, and the core pod is read by its own
path. Each owner is read at the version its reference names, so an MPIJob of
mpi-operator (``kubeflow.org/v2beta1``) is read as v2beta1, with its
``launcherCreationPolicy``, and one of the v1 training operator as v1.

Owners change rarely and many pods share one, so each object is cached by
its UID for ``ttl_s``; a gang of 1,000 workers costs one read per owner, not
1,000. A definite answer is cached, and so is a 404 (owner deleted, CRD not
installed) or a 403 (RBAC without the kind): the owner cannot be known, and
the pod is grouped by the reference alone. A timeout, a refused
connection, a 429 or a 5xx says nothing about the owner, and grouping on it
would persist a PodGroup of one for what may be a gang of 64; the resolver
then answers the last object it had (even past ``ttl_s``), else raises
:class:`OwnerLookupError` and the cycle leaves the pod for the next one. The
failure is remembered for ``retry_s``, so that 1,000 pods of an owner that
cannot be read cost one request then too, not 1,000 per cycle.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuwarden.kube import ApiError, KubeApi
from gpuwarden.logconfig import get_logger

log = get_logger(__name__)

# The owner kinds worth following, by API group. Their plurals follow the
# Kubernetes convention (lower-case kind plus "s"); a kind not listed ends
# the chain, and derive_group groups its pods as it groups unknown owners.
FOLLOWED_KINDS: frozenset[tuple[str, str]] = frozenset(
    {
        ("", "Pod"),
        ("apps", "ReplicaSet"),
        ("apps", "Deployment"),
        ("apps", "StatefulSet"),
        ("apps", "DaemonSet"),
        ("batch", "Job"),
        ("batch", "CronJob"),
        ("jobset.x-k8s.io", "JobSet"),
        ("kubeflow.org", "PyTorchJob"),
        ("kubeflow.org", "TFJob"),
        ("kubeflow.org", "MPIJob"),
        ("kubeflow.org", "XGBoostJob"),
        ("kubeflow.org", "PaddleJob"),
        ("kubeflow.org", "JAXJob"),
        ("ray.io", "RayCluster"),
        ("ray.io", "RayJob"),
        # Followed for their labels (a queue): a RayService's RayClusters and
        # a TrainJob's JobSet are the gangs, sized from their own specs.
        ("ray.io", "RayService"),
        ("trainer.kubeflow.org", "TrainJob"),
        ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"),
        ("argoproj.io", "Workflow"),
    }
)
# An owner chain longer than this is a loop or a mistake.
MAX_DEPTH = 6


# Statuses that are about the server, not the owner: worth asking again.
_TRANSIENT = frozenset({408, 429})


class OwnerLookupError(Exception):
    """An owner could not be read for a reason that says nothing about it (timeout, 5xx)."""


def _transient(exc: ApiError) -> bool:
    return exc.status is None or exc.status in _TRANSIENT or exc.status >= 500


@dataclass(slots=True)
class _Cached:
    obj: Mapping[str, Any] | None
    at: float


def controller_ref(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference a chain follows from ``obj``: its controller's, else its first; None without one."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    if not isinstance(refs, list):
        return None
    controllers = [r for r in refs if isinstance(r, dict) and r.get("controller")]
    chosen = controllers or [r for r in refs if isinstance(r, dict)]
    return chosen[0] if chosen else None


class OwnerResolver:
    """The owner chain of a pod, from its controller up, each owner read at most once per ``ttl_s``."""

    def __init__(
        self,
        api: KubeApi,
        *,
        ttl_s: float = 30.0,
        retry_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._ttl = ttl_s
        self._retry = retry_s
        self._clock = clock
        self._cache: dict[str, _Cached] = {}
        # Owner UID -> (when a read failed transiently, why), asked again after retry_s.
        self._failed: dict[str, tuple[float, str]] = {}

    def chain(self, pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        """The owners read, from the pod's controller up; raises :class:`OwnerLookupError` (see the module)."""
        namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
        owners: list[Mapping[str, Any]] = []
        current: Mapping[str, Any] = pod
        for _ in range(MAX_DEPTH):
            ref = controller_ref(current)
            if ref is None:
                break
            owner = self._owner(namespace, ref)
            if owner is None:
                break
            owners.append(owner)
            current = owner
        return owners

    def _owner(self, namespace: str, ref: Mapping[str, Any]) -> Mapping[str, Any] | None:
        api_version = str(ref.get("apiVersion") or "")
        kind = str(ref.get("kind") or "")
        name = str(ref.get("name") or "")
        uid = str(ref.get("uid") or "")
        group, _, version = api_version.rpartition("/")
        if (group, kind) not in FOLLOWED_KINDS or not name or not version:
            return None
        now = self._clock()
        cached = self._cache.get(uid) if uid else None
        if cached is not None and now - cached.at < self._ttl:
            return cached.obj
        failed = self._failed.get(uid) if uid else None
        if failed is not None and now - failed[0] < self._retry:
            if cached is not None:
                return cached.obj
            raise OwnerLookupError(failed[1])
        try:
            if group == "" and kind == "Pod":
                obj = self._api.get_pod(namespace, name)
            else:
                obj = self._api.get_namespaced_object(group, version, kind.lower() + "s", namespace, name)
        except ApiError as exc:
            if _transient(exc):
                log.warning(
                    "owner_read_failed", kind=kind, name=name, namespace=namespace, status=exc.status, error=exc.detail
                )
                why = f"{kind} {namespace}/{name}: {exc.detail}"
                if uid:
                    self._failed[uid] = (now, why)
                if cached is not None:
                    return cached.obj  # stale, but about this very owner: better than guessing
                raise OwnerLookupError(why) from exc
            # RBAC that does not cover the kind: the pod is grouped on what is
            # known (a 404 is no exception: get_* answers None).
            log.info("owner_unreadable", kind=kind, name=name, namespace=namespace, status=exc.status, error=exc.detail)
            obj = None
        if obj is not None and uid and str((obj.get("metadata") or {}).get("uid") or "") != uid:
            obj = None  # an owner of that name that is not this pod's (deleted and recreated)
        if uid:
            self._cache[uid] = _Cached(obj, now)
            self._failed.pop(uid, None)
        if len(self._cache) > 50_000:
            self._prune(now)
        return obj

    def _prune(self, now: float) -> None:
        for uid in [u for u, c in self._cache.items() if now - c.at >= self._ttl]:
            del self._cache[uid]
        for uid in [u for u, (at, _) in self._failed.items() if now - at >= self._retry]:
            del self._failed[uid]
