"""Writing a pod's DRA claim allocations before its bind, and taking them back when the bind does not happen.

What kube-scheduler's DynamicResources plugin does at PreBind, for the
devices gpuwarden's engine chose (:mod:`.claims` planned which claims):

1. read the claim afresh (the cycle's view may be behind) and check that it
   is still the claim planned for (same UID, still unallocated, or still
   allocated for a claim only to reserve);
2. add the ``resource.kubernetes.io/delete-protection`` finalizer, so the
   claim is not deleted while allocated;
3. write ``status.allocation`` (the devices per request, the DeviceClass's
   and the claim's opaque config, a node selector naming the node) and
   ``status.reservedFor`` (the pod) in one status write;

and only then is the pod bound. Every write names the resourceVersion it
read, so a claim changed meanwhile (another scheduler allocated it) fails
the write instead of being overwritten.

Claim writes are lease-fenced like binds (:mod:`.fence`). An allocation is
the moment a device is given away, so a replica paused after its lease
check must not write one once another replica leads and may have given
that device to another claim. The status subresource cannot carry the
replica's term itself (the API server keeps a claim's metadata as it was on
a status write), so the claim is stamped first: the object write that adds
the finalizer also sets ``scheduling.gpuwarden.io/lease-holder`` to this
replica's term, and the fence policy refuses it unless that term holds the
Lease. The status write then names the stamped resourceVersion and is
checked by the same policy against the stamp it finds: a paused replica's
allocation is refused once another replica leads, whether or not that one
touched the claim (if it did, the resourceVersion no longer matches).

A failure at any step leaves nothing half done: what was written for the
pod is taken back (reservation removed; an allocation this bind made is
cleared and its finalizer removed) before the bind is reported failed, and
the same happens when the bind itself fails. Once the pod is bound, freeing
the claim is the resourceclaim controller's work, as upstream: it removes
a finished or deleted pod from ``reservedFor`` and deallocates a claim no
one reserves, and deletes the claims it made from templates with their pod.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpuwarden.contract import ANNOTATION_LEASE_HOLDER
from gpuwarden.kube import JSON, ApiError, KubeApi
from gpuwarden.logconfig import get_logger
from scheduler.cluster.claims import (
    DRIVER,
    EXTENDED_ANNOTATION,
    FINALIZER,
    ClaimPlan,
    ClaimToWrite,
    ExtendedClaim,
    RequestPlan,
)
from scheduler.engine.model import Bind, assign_devices

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class _Written:
    """One claim this bind wrote: allocated by it (``allocated``), or only reserved for the pod."""

    namespace: str
    name: str
    allocated: bool
    finalizer_added: bool
    # Made by this bind (a pod's extended resources, KEP-5004): deleted when taken back.
    created: str = ""  # its UID


class _StopError(Exception):
    """A step that failed: the message says which claim and why."""


def _d(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


class ClaimBinder:
    """Allocates and reserves a pod's claims before its bind; thread-safe (binds run on a pool)."""

    def __init__(
        self,
        api: KubeApi,
        plans: Callable[[], Mapping[str, ClaimPlan]],
        *,
        holder: Callable[[], str | None] | None = None,
    ) -> None:
        self._api = api
        self._plans = plans
        # The lease term the writes name (the fence's token); None: not fenced.
        self._holder = holder or (lambda: None)
        self._lock = threading.Lock()
        self._written: dict[str, list[_Written]] = {}
        self._held: dict[str, ClaimPlan] = {}

    def hold(self, bind: Bind) -> bool:
        """Keep the plan of ``bind``'s pod for its bind; whether it has claims to write first.

        Called on the cycle's thread as the bind is sent: the bind itself may
        run on the pool while the next cycle already made new plans (in
        which the pod, bound or assumed, has none), so the plan it was
        decided with is kept until :meth:`settle`.
        """
        plan = self._plans().get(bind.uid)
        with self._lock:
            if plan is None or not plan.writes_on(bind.node):
                # A plan kept from an earlier attempt must not be used for this one.
                self._held.pop(bind.uid, None)
                return False
            self._held[bind.uid] = plan
        return True

    def prepare(self, bind: Bind) -> str | None:
        """Write the claims of ``bind``'s pod; None to go on with the bind, else why not (nothing is left written)."""
        with self._lock:
            plan = self._held.get(bind.uid)
        if plan is None:
            return None
        written: list[_Written] = []
        try:
            chosen = self._in_request_order(plan, bind)
            for claim in plan.claims:
                if claim.done:
                    continue
                if claim.reserve_only:
                    written.append(self._reserve(claim, bind))
                else:
                    take = sum(r.count for r in claim.requests)
                    picked, chosen = chosen[:take], chosen[take:]
                    written.append(self._allocate(claim, bind, plan, picked))
            if plan.extended is not None and bind.node in plan.devices:
                self._extended(plan.extended, bind, plan, chosen, written)
        except (_StopError, ApiError) as err:
            self._undo(bind, written)
            with self._lock:
                self._held.pop(bind.uid, None)
            return f"resource claims not allocated: {err}"
        with self._lock:
            self._written[bind.uid] = written
        return None

    def settle(self, bind: Bind, bound: bool) -> None:
        """After the bind: forget what was written (bound), or take it back (not bound)."""
        with self._lock:
            written = self._written.pop(bind.uid, [])
            self._held.pop(bind.uid, None)
        if not bound and written:
            self._undo(bind, written)

    @staticmethod
    def _in_request_order(plan: ClaimPlan, bind: Bind) -> list[int]:
        """The GPUs the engine chose for the claims to allocate, in the order their requests take them.

        Where the requests' GPUs must be told apart (``plan.choices``), an
        assignment of the chosen GPUs to the requests (:func:`assign_devices`;
        the engine found one) says which request gets which; otherwise any
        order will do. Claims allocated already are not among them: their
        devices stay theirs.
        """
        alternatives = plan.choices.get(bind.node)
        if alternatives is None:
            return list(bind.gpu_indices)
        assigned = assign_devices(alternatives, sorted(bind.gpu_indices))
        if assigned is None:
            raise _StopError(f"GPUs {sorted(bind.gpu_indices)} of node {bind.node} do not satisfy the claims' requests")
        return [index for group in assigned for index in group]

    # -- the writes -------------------------------------------------------------

    def _fresh(self, claim: ClaimToWrite) -> JSON:
        obj = self._api.get_resource_claim(claim.namespace, claim.name)
        ident = f"resourceclaim {claim.namespace}/{claim.name}"
        if obj is None:
            raise _StopError(f"{ident} is gone")
        meta = _d(obj.get("metadata"))
        if claim.uid and meta.get("uid") != claim.uid:
            raise _StopError(f"{ident} was replaced by another claim of that name")
        if meta.get("deletionTimestamp"):
            raise _StopError(f"{ident} is being deleted")
        return obj

    def _allocate(
        self, claim: ClaimToWrite, bind: Bind, plan: ClaimPlan, picked: list[int], fresh: JSON | None = None
    ) -> _Written:
        ident = f"resourceclaim {claim.namespace}/{claim.name}"
        devices = plan.devices.get(bind.node, {})
        results: list[JSON] = []
        configs: list[JSON] = []
        at = 0
        for request in claim.requests:
            names = picked[at : at + request.count]
            at += request.count
            if len(names) < request.count:
                raise _StopError(f"{ident} request {request.name!r}: {request.count} GPUs needed, {len(names)} chosen")
            for index in names:
                device = devices.get(index)
                if device is None:
                    raise _StopError(f"{ident}: GPU {index} of node {bind.node} is no DRA device")
                result: JSON = {"request": request.name, "driver": DRIVER, "pool": device[0], "device": device[1]}
                if request.tolerations:
                    result["tolerations"] = [dict(t) for t in request.tolerations]
                results.append(result)
            for config in request.class_config:
                configs.append({"source": "FromClass", "requests": [request.name], **_opaque(config)})
        for config in claim.claim_config:
            configs.append({"source": "FromClaim", **_opaque(config, keep_requests=True)})
        obj = fresh if fresh is not None else self._fresh(claim)
        status = _d(obj.get("status"))
        if status.get("allocation"):
            raise _StopError(f"{ident} was allocated meanwhile (by another scheduler?)")
        finalizers = list(_d(obj.get("metadata")).get("finalizers") or [])
        added = FINALIZER not in finalizers
        obj = self._stamp(claim.namespace, claim.name, obj, [*finalizers, FINALIZER] if added else finalizers)
        allocation: JSON = {
            "devices": {"results": results, **({"config": configs} if configs else {})},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [bind.node]}]}
                ]
            },
            "allocationTimestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        body = {**obj, "status": {**_d(obj.get("status")), "allocation": allocation, "reservedFor": [_consumer(bind)]}}
        try:
            self._api.replace_resource_claim_status(claim.namespace, claim.name, body)
        except ApiError:
            if added:
                self._drop_finalizer(claim.namespace, claim.name)
            raise
        log.debug(
            "resource_claim_allocated",
            claim=f"{claim.namespace}/{claim.name}",
            pod=f"{bind.namespace}/{bind.pod}",
            node=bind.node,
            devices=[r["device"] for r in results],
        )
        return _Written(claim.namespace, claim.name, allocated=True, finalizer_added=added)

    def _reserve(self, claim: ClaimToWrite, bind: Bind) -> _Written:
        ident = f"resourceclaim {claim.namespace}/{claim.name}"
        obj = self._fresh(claim)
        status = _d(obj.get("status"))
        if not status.get("allocation"):
            raise _StopError(f"{ident} was deallocated meanwhile")
        reserved = list(status.get("reservedFor") or [])
        if not any(_d(r).get("uid") == bind.uid for r in reserved):
            obj = self._stamp(claim.namespace, claim.name, obj)
            body = {**obj, "status": {**status, "reservedFor": [*reserved, _consumer(bind)]}}
            self._api.replace_resource_claim_status(claim.namespace, claim.name, body)
        return _Written(claim.namespace, claim.name, allocated=False, finalizer_added=False)

    def _extended(
        self, extended: ExtendedClaim, bind: Bind, plan: ClaimPlan, chosen: list[int], written: list[_Written]
    ) -> None:
        """Make, allocate and record the claim of a pod's extended resources, as kube-scheduler does (KEP-5004).

        Claims made for the pod before (a bind that did not go through) go
        first. The new claim is owned by the pod (the garbage collector
        deletes it with the pod) and marked with kube-scheduler's annotation;
        the pod's ``status.extendedResourceClaimStatus`` names it and maps each
        container to its request, which is how the kubelet finds it.
        """
        for stale in extended.stale:
            self._delete_created(bind.namespace, stale, "")
        base = f"{bind.pod}-extended-resources-"[:58]
        body: JSON = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "generateName": base,
                "annotations": {EXTENDED_ANNOTATION: "true", **self._term()},
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Pod", "name": bind.pod, "uid": bind.uid, "controller": True}
                ],
            },
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": request,
                            "exactly": {
                                "deviceClassName": extended.device_class,
                                "allocationMode": "ExactCount",
                                "count": count,
                            },
                        }
                        for request, count in extended.requests
                    ]
                }
            },
        }
        made = self._api.create_resource_claim(bind.namespace, body)
        meta = _d(made.get("metadata"))
        name, uid = str(meta.get("name")), str(meta.get("uid"))
        written.append(_Written(bind.namespace, name, allocated=True, finalizer_added=True, created=uid))
        claim = ClaimToWrite(
            bind.namespace,
            name,
            uid,
            requests=tuple(RequestPlan(r, n, (), extended.class_config) for r, n in extended.requests),
        )
        self._allocate(claim, bind, plan, chosen[: sum(n for _, n in extended.requests)], fresh=made)
        mappings = [
            {"containerName": container, "resourceName": extended.resource, "requestName": request}
            for container, request in extended.mappings
        ]
        # The patch names the pod's resourceVersion as just read: a replica paused here while
        # another took the lease over (and wrote its own claim's name there) gets a 409 instead
        # of pointing the pod at a claim of its own, which the new leader deletes as stale.
        pod = self._api.get_pod(bind.namespace, bind.pod)
        meta = _d(_d(pod).get("metadata"))
        if pod is None or (bind.uid and meta.get("uid") != bind.uid):
            raise _StopError(f"pod {bind.namespace}/{bind.pod} is gone or was replaced")
        self._api.patch_pod_status(
            bind.namespace,
            bind.pod,
            {
                "metadata": {"resourceVersion": meta.get("resourceVersion")},
                "status": {"extendedResourceClaimStatus": {"resourceClaimName": name, "requestMappings": mappings}},
            },
        )

    def _delete_created(self, namespace: str, name: str, uid: str) -> None:
        """Delete a claim made for a pod's extended resources: its finalizer first, then the claim."""
        for _ in range(3):
            obj = self._api.get_resource_claim(namespace, name)
            if obj is None:
                return
            meta = _d(obj.get("metadata"))
            if uid and meta.get("uid") != uid:
                return
            finalizers = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
            try:
                if len(finalizers) != len(meta.get("finalizers") or []):
                    self._stamp(namespace, name, obj, finalizers)
                self._api.delete_resource_claim(namespace, name, str(meta.get("uid") or ""))
                return
            except ApiError as err:
                if err.status != 409:
                    raise

    def _term(self) -> dict[str, str]:
        token = self._holder()
        return {ANNOTATION_LEASE_HOLDER: token} if token else {}

    def _stamp(self, namespace: str, name: str, obj: JSON, finalizers: list[str] | None = None) -> JSON:
        """The claim stamped with this replica's lease term (and ``finalizers``): written only where it changes.

        Every object write of a claim goes through here, so the fence policy
        checks each against the Lease, and the status write after it finds
        the term it is checked against (see the module's docstring). Without
        a term (no leader election) the stamp is removed rather than left
        naming another replica's old term.
        """
        meta = _d(obj.get("metadata"))
        annotations = {k: v for k, v in _d(meta.get("annotations")).items() if k != ANNOTATION_LEASE_HOLDER}
        annotations.update(self._term())
        old_finalizers = list(meta.get("finalizers") or [])
        new_finalizers = old_finalizers if finalizers is None else finalizers
        if annotations == _d(meta.get("annotations")) and new_finalizers == old_finalizers:
            return obj
        new_meta = {**meta, "annotations": annotations, "finalizers": new_finalizers}
        return self._api.replace_resource_claim(namespace, name, {**obj, "metadata": new_meta})

    # -- taking it back -----------------------------------------------------------

    def _undo(self, bind: Bind, written: list[_Written]) -> None:
        for claim in reversed(written):
            try:
                self._unreserve(bind, claim)
            except ApiError as err:
                # The resourceclaim controller removes a reservation for a pod that
                # is gone; one for a pod still pending stays until retried here.
                log.warning(
                    "resource_claim_not_released",
                    claim=f"{claim.namespace}/{claim.name}",
                    pod=f"{bind.namespace}/{bind.pod}",
                    error=str(err),
                )

    def _unreserve(self, bind: Bind, claim: _Written) -> None:
        if claim.created:
            self._delete_created(claim.namespace, claim.name, claim.created)
            return
        for _ in range(3):  # a conflict is someone else's write meanwhile: read again
            obj = self._api.get_resource_claim(claim.namespace, claim.name)
            if obj is None:
                return
            status = _d(obj.get("status"))
            reserved = [r for r in status.get("reservedFor") or [] if _d(r).get("uid") != bind.uid]
            new_status = {**status, "reservedFor": reserved}
            if claim.allocated and not reserved:
                new_status.pop("allocation", None)
            if not reserved:
                new_status.pop("reservedFor", None)
            try:
                if new_status != status:
                    obj = self._stamp(claim.namespace, claim.name, obj)
                    self._api.replace_resource_claim_status(claim.namespace, claim.name, {**obj, "status": new_status})
            except ApiError as err:
                if err.status == 409:
                    continue
                raise
            if claim.finalizer_added and "allocation" not in new_status:
                self._drop_finalizer(claim.namespace, claim.name)
            return

    def _drop_finalizer(self, namespace: str, name: str) -> None:
        for _ in range(3):
            obj = self._api.get_resource_claim(namespace, name)
            if obj is None:
                return
            meta = _d(obj.get("metadata"))
            finalizers = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
            if len(finalizers) == len(meta.get("finalizers") or []) or _d(obj.get("status")).get("allocation"):
                return
            try:
                self._stamp(namespace, name, obj, finalizers)
                return
            except ApiError as err:
                if err.status != 409:
                    raise


def _consumer(bind: Bind) -> JSON:
    return {"resource": "pods", "name": bind.pod, "uid": bind.uid}


def _opaque(config: Mapping[str, Any], *, keep_requests: bool = False) -> JSON:
    """A class's or claim's config entry as the allocation carries it (its opaque parameters, its requests)."""
    out: JSON = {}
    if "opaque" in config:
        out["opaque"] = config["opaque"]
    if keep_requests and config.get("requests"):
        out["requests"] = list(config["requests"])
    return out
