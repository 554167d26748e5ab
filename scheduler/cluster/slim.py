"""What the cache keeps of each object: the API's own JSON shape, pruned to what scheduling reads.

A pod as the API server sends it is mostly managedFields, container specs
(images, commands, env, probes, mounts) and container statuses; scheduling
reads its identity, owner, scheduler name, priority, requests, placement
constraints, phase and a few annotations. 150,000 raw pods take gigabytes in
Python; pruned, a few hundred MiB (see benchmarks/scheduler_cache.py). The
shape stays the API's, with the same keys at the same paths, so that code
converting cache entries reads them exactly as it would read a raw pod, and
a field added to the lists below needs no other change.

Strings that repeat across objects (label keys, namespaces, node names,
phases) are interned, so 150,000 pods share one copy of each.

Entries are never changed after they are built: the cache replaces an
entry on an update, so a view handed to a scheduling cycle stays as it was.
"""

from __future__ import annotations

import sys
from typing import Any

from gpuwarden.kube import JSON
from scheduler.cluster.sliceadmission import kept_env

# Written by kubectl apply: a copy of the whole object, read by nobody here.
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"

_POD_META = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "generateName")
_POD_SPEC = (
    "nodeName",
    "schedulerName",
    "priority",
    "priorityClassName",
    "preemptionPolicy",
    "nodeSelector",
    "affinity",
    "tolerations",
    "overhead",
    "resources",
    "runtimeClassName",
    "schedulingGates",
    "topologySpreadConstraints",
    # DRA claims (scheduler.cluster.claims).
    "resourceClaims",
)
# resourceClaimStatuses and extendedResourceClaimStatus name a pod's DRA claims (scheduler.cluster.claims).
_POD_STATUS = (
    "phase",
    "nominatedNodeName",
    "startTime",
    "qosClass",
    "resourceClaimStatuses",
    "extendedResourceClaimStatus",
)
# Whether the pod was judged unschedulable, or is about to be disrupted; the
# kubelet's Ready/Initialized conditions (with timestamps) would double a
# running pod's size.
_POD_CONDITIONS = frozenset({"PodScheduled", "DisruptionTarget"})
_CONDITION = ("type", "status", "reason")
# envFrom, and of env only the slice's own variables: whether a GPU slice
# pod carries what the admission webhook gives it (.sliceadmission).
_CONTAINER = ("name", "resources", "restartPolicy", "envFrom")

_NODE_META = ("name", "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp")
_NODE_SPEC = ("unschedulable", "taints", "providerID")
_NODE_STATUS = ("capacity", "allocatable", "conditions")

_CLAIM_META = ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp")
_CLAIM_SPEC = ("volumeName", "storageClassName", "accessModes")
_VOLUME_META = ("name", "uid", "resourceVersion", "labels")
_VOLUME_SPEC = ("nodeAffinity", "claimRef")


# Fields whose values repeat across many objects; the others (names, uids,
# timestamps) are unique and interning them would only cost time.
_REPEATED = frozenset(
    {
        "namespace",
        "generateName",
        "nodeName",
        "schedulerName",
        "priorityClassName",
        "preemptionPolicy",
        "phase",
        "qosClass",
        "runtimeClassName",
        "apiVersion",
        "kind",
        "type",
        "status",
        "reason",
    }
)


def _intern(value: Any) -> Any:
    return sys.intern(value) if isinstance(value, str) else value


def _pick(source: JSON | None, keys: tuple[str, ...]) -> JSON:
    if not source:
        return {}
    return {key: _intern(source[key]) if key in _REPEATED else source[key] for key in keys if key in source}


def _strings(mapping: JSON | None, *, drop: str | None = None) -> JSON | None:
    """Labels or annotations with interned keys (and values: most repeat)."""
    if not mapping:
        return None
    return {sys.intern(k): _intern(v) for k, v in mapping.items() if k != drop}


def _meta(raw: JSON, keys: tuple[str, ...]) -> JSON:
    source = raw.get("metadata") or {}
    meta = _pick(source, keys)
    labels = _strings(source.get("labels"))
    if labels:
        meta["labels"] = labels
    annotations = _strings(source.get("annotations"), drop=LAST_APPLIED)
    if annotations:
        meta["annotations"] = annotations
    owners = source.get("ownerReferences")
    if owners:
        meta["ownerReferences"] = [_pick(o, ("apiVersion", "kind", "name", "uid", "controller")) for o in owners]
    return meta


def _container(raw: JSON) -> JSON:
    container = _pick(raw, _CONTAINER)
    env = kept_env(raw.get("env"))
    if env:
        container["env"] = env
    ports = raw.get("ports")
    if ports:
        host = [p for p in ports if isinstance(p, dict) and p.get("hostPort")]
        if host or not isinstance(ports, list):
            container["ports"] = host if isinstance(ports, list) else ports
    return container


# Volume sources that name a PersistentVolumeClaim (scheduler.cluster.volumes).
_CLAIM_SOURCES = frozenset({"persistentVolumeClaim", "ephemeral"})


def _claim_volume(raw: JSON) -> JSON:
    """A volume that uses a claim: its name and claim, without an ephemeral volume's template."""
    kept: JSON = {"name": raw.get("name")}
    if "persistentVolumeClaim" in raw:
        kept["persistentVolumeClaim"] = raw["persistentVolumeClaim"]
    if "ephemeral" in raw:
        kept["ephemeral"] = {}
    return kept


# The claim volumes of a workload's pods are all alike (the same claim under
# the same name): a cache of 150,000 pods would hold as many copies. Each
# distinct list is kept once and shared, as cache entries are never edited.
_VOLUMES: dict[tuple[object, ...], list[JSON]] = {}
_VOLUMES_KEPT = 4096


def _volume_key(volume: JSON) -> tuple[object, ...]:
    claim = volume.get("persistentVolumeClaim")
    return (volume.get("name"), tuple(claim.items()) if isinstance(claim, dict) else claim, "ephemeral" in volume)


def _shared_volumes(claims: list[JSON]) -> list[JSON]:
    try:
        key = tuple(_volume_key(v) for v in claims)
        shared = _VOLUMES.get(key)
    except TypeError:  # a field of a type no volume has: kept as it is, unshared
        return claims
    if shared is None:
        if len(_VOLUMES) >= _VOLUMES_KEPT:
            _VOLUMES.clear()
        shared = _VOLUMES[key] = claims
    return shared


def slim_pod(raw: JSON) -> JSON:
    """A pod with its identity, owner, requests, constraints and phase; no container specs or statuses.

    Of each container what scheduling reads: its name, requests, restart
    policy (sidecars), ``envFrom``, the entries of ``env`` that would
    override a GPU slice's variables (:func:`~scheduler.cluster.sliceadmission.kept_env`)
    and its host ports (other container ports constrain nothing). Of the
    volumes only those that use a claim.
    """
    spec = raw.get("spec") or {}
    slim_spec = _pick(spec, _POD_SPEC)
    slim_spec["containers"] = [_container(c) for c in spec.get("containers") or ()]
    init = spec.get("initContainers")
    if init:
        slim_spec["initContainers"] = [_container(c) for c in init]
    volumes = spec.get("volumes")
    if volumes:
        claims = [_claim_volume(v) for v in volumes if isinstance(v, dict) and _CLAIM_SOURCES & v.keys()]
        if claims:
            slim_spec["volumes"] = _shared_volumes(claims)
    status = raw.get("status") or {}
    slim_status = _pick(status, _POD_STATUS)
    conditions = [_pick(c, _CONDITION) for c in status.get("conditions") or () if c.get("type") in _POD_CONDITIONS]
    if conditions:
        slim_status["conditions"] = conditions
    return {"metadata": _meta(raw, _POD_META), "spec": slim_spec, "status": slim_status}


def slim_node(raw: JSON) -> JSON:
    """A node with labels, taints, capacity and conditions; no images, addresses or system info."""
    return {
        "metadata": _meta(raw, _NODE_META),
        "spec": _pick(raw.get("spec"), _NODE_SPEC),
        "status": _pick(raw.get("status"), _NODE_STATUS),
    }


def slim_claim(raw: JSON) -> JSON:
    """A PersistentVolumeClaim: whether and to which volume it is bound, and how it may be shared."""
    return {
        "metadata": _pick(raw.get("metadata"), _CLAIM_META),
        "spec": _pick(raw.get("spec"), _CLAIM_SPEC),
        "status": _pick(raw.get("status"), ("phase",)),
    }


def slim_volume(raw: JSON) -> JSON:
    """A PersistentVolume: its node affinity and zone labels, which bind where its pods may run."""
    return {
        "metadata": _pick(raw.get("metadata"), _VOLUME_META),
        "spec": _pick(raw.get("spec"), _VOLUME_SPEC),
        "status": _pick(raw.get("status"), ("phase",)),
    }


def without_managed_fields(raw: JSON) -> JSON:
    """Any other object whole, less managedFields and kubectl's last-applied copy.

    GPUNodes, Queues, PodGroups and PDBs number in the thousands at most and
    their specs and statuses are what the scheduler reads, so only the
    bookkeeping goes.
    """
    meta = raw.get("metadata")
    if not meta or ("managedFields" not in meta and LAST_APPLIED not in (meta.get("annotations") or {})):
        return raw
    slim_meta = {k: v for k, v in meta.items() if k != "managedFields"}
    annotations = _strings(meta.get("annotations"), drop=LAST_APPLIED)
    if annotations:
        slim_meta["annotations"] = annotations
    else:
        slim_meta.pop("annotations", None)
    return {**raw, "metadata": slim_meta}
