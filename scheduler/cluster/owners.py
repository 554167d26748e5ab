"""Reading a pod's owners (Job, JobSet, PyTorchJob, RayCluster, ...) for pod grouping.

:func:`scheduler.cluster.grouping.derive_group` decides a pod's group from its
owner chain; this module fetches that chain. Owners are read as raw objects
through the custom-objects API, which serves every non-core API group, so a
cluster without the Kubeflow, Ray, JobSet, LeaderWorkerSet or Argo CRDs
answers 404 for those kinds and the chain simply ends there: never an error.

Owners change rarely and many pods share one, so each object is cached by
its UID for ``ttl_s``; a gang of 64 workers costs one read per owner, not 64.
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
        ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"),
        ("argoproj.io", "Workflow"),
    }
)
# An owner chain longer than this is a loop or a mistake.
MAX_DEPTH = 6


@dataclass(slots=True)
class _Cached:
    obj: Mapping[str, Any] | None
    at: float


def _controller_ref(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    if not isinstance(refs, list):
        return None
    controllers = [r for r in refs if isinstance(r, dict) and r.get("controller")]
    chosen = controllers or [r for r in refs if isinstance(r, dict)]
    return chosen[0] if chosen else None


class OwnerResolver:
    """The owner chain of a pod, from its controller up, each owner read at most once per ``ttl_s``."""

    def __init__(self, api: KubeApi, *, ttl_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._api = api
        self._ttl = ttl_s
        self._clock = clock
        self._cache: dict[str, _Cached] = {}

    def chain(self, pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
        owners: list[Mapping[str, Any]] = []
        current: Mapping[str, Any] = pod
        for _ in range(MAX_DEPTH):
            ref = _controller_ref(current)
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
        try:
            obj = self._api.get_namespaced_object(group, version, kind.lower() + "s", namespace, name)
        except ApiError as exc:
            # A CRD that is not installed, or RBAC that does not cover the kind:
            # the pod is grouped on what is known, and the next read may work.
            log.info("owner_unreadable", kind=kind, name=name, namespace=namespace, status=exc.status, error=exc.detail)
            obj = None
        if obj is not None and uid and str((obj.get("metadata") or {}).get("uid") or "") != uid:
            obj = None  # an owner of that name that is not this pod's (deleted and recreated)
        if uid:
            self._cache[uid] = _Cached(obj, now)
        if len(self._cache) > 50_000:
            self._prune(now)
        return obj

    def _prune(self, now: float) -> None:
        for uid in [u for u, c in self._cache.items() if now - c.at >= self._ttl]:
            del self._cache[uid]
