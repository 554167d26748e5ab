"""Time the scheduler's watch cache at 5,000 GPU nodes and 150,000 pods, without an API server.

The objects are what the API server would send: a realistic Node (images,
addresses, kubelet conditions, managedFields), GPUNode (8 GPUs) and training
Pod (containers with env, mounts and probes, container statuses,
managedFields), built once as JSON and varied by name. They go through the
cache's real code path, a :class:`~scheduler.cluster.watch.Reflector` whose
list function answers from memory in pages of 500, so decoding, diffing,
pruning and storing are all measured.

Pods are gangs of 8 with their PodGroups, in 50 queues: one gang in five
on whole GPUs (with the GPU assignment a bind writes), the rest CPU-only.
Measured, each over 3 runs (min and median):

- (iv) the initial sync: 5,000 Nodes, 5,000 GPUNodes and 150,000 Pods
  listed and turned into cache entries [target under 10 s];
- the cost per event of 1,000 MODIFIED pod events read from a watch stream;
- a view (shallow copies of every store) for one scheduling cycle;
- the memory the synced cache holds, next to what keeping the raw dicts
  would take (measured on 10,000 raw pods and scaled);
- cycles on the synced cache: (i) the first full cycle, (ii) one after 100
  pods changed [target under 0.3 s], (iii) one after 1,000 pending pods
  (125 gangs) arrived [target under 1 s]. A cycle here is the cache's view,
  the engine's input (grouping and Snapshot, ``SchedulingCycle.prepare``)
  and the session (``SchedulingCycle.decide``), without the executors (no
  API calls). Each is timed on the full rebuild (every object converted by
  ``snapshot_from`` and the working state built from all of it,
  ``incremental=False``) and on the incremental cycle (conversions kept per
  cache entry, the engine's working state kept and updated by what
  changed), in the same process on the same views, alternating which goes
  first; both must give equal snapshots and decisions. Each prints its
  phases: view, prepare, the session's build (or update), its undo, the
  whole session; then the remediation pass the leader runs after each
  cycle over the same view, old by a controller that reads every node
  again, new by the term's controller that keeps its readings (every node
  carries the state label remediation's first pass writes, so no pass
  patches anything), with the worker's device-taint sync (no GPU is
  quarantined: a look at every Node's annotations, nothing written), and
  the cycle and the pass together [(ii): target under 0.3 s].

The collector runs with the scheduler process's thresholds
(``scheduler.runner.GC_THRESHOLDS``); with Python's default
(``--gc-threshold0 700``) about two thirds of the sync is spent collecting
the young containers of each decoded page.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from gpuwarden import contract
from gpuwarden.kube import KubeApi
from scheduler.cluster.assemble import canonical
from scheduler.cluster.cache import (
    CLAIMS,
    GPUNODES,
    NODES,
    PODGROUPS,
    PODS,
    QUEUES,
    VOLUMES,
    ClusterCache,
    WatchedResource,
)
from scheduler.cluster.cycle import SchedulingCycle
from scheduler.cluster.evict import Evictor
from scheduler.cluster.slim import slim_claim, slim_node, slim_pod, slim_volume, without_managed_fields
from scheduler.cluster.watch import Reflector, ReflectorSettings
from scheduler.engine.model import Decisions, Snapshot
from scheduler.remediation.controller import RemediationController
from scheduler.remediation.devicetaints import DeviceTaintPublisher
from scheduler.runner import GC_THRESHOLDS, ClusterViews, cluster_view

PAGE = 500
RUNS = 3
CHANGED = 100
ARRIVING = 1000
GPUS_PER_NODE = 8
GANG = 8
TEAMS = 50
NOW = 1_800_000_000.0
TIMESTAMP = "2026-11-30T08:15:42Z"


def _managed_fields(manager: str, fields: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "manager": manager,
            "operation": "Update",
            "apiVersion": "v1",
            "time": TIMESTAMP,
            "fieldsType": "FieldsV1",
            "fieldsV1": fields,
        }
    ]


def node_template() -> dict[str, Any]:
    conditions = [
        {
            "type": kind,
            "status": status,
            "lastHeartbeatTime": TIMESTAMP,
            "lastTransitionTime": TIMESTAMP,
            "reason": reason,
            "message": f"kubelet {reason}",
        }
        for kind, status, reason in [
            ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            ("PIDPressure", "False", "KubeletHasSufficientPID"),
            ("Ready", "True", "KubeletReady"),
            ("GpuXidError", "False", "NoFatalXid"),
            ("GpuMemoryDegraded", "False", "GpuMemoryHealthy"),
            ("InfinibandDegraded", "False", "InfinibandHealthy"),
        ]
    ]
    resources = {
        "cpu": "192",
        "memory": "2063731760Ki",
        "pods": "110",
        "ephemeral-storage": "7499362532Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        contract.RESOURCE_NVIDIA_GPU: "8",
        contract.RESOURCE_GPU_MEMORY: str(8 * 81559),
        "rdma/ib": "8",
    }
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": "NAME",
            "uid": "1e7c8a8e-5d55-4b0e-9f0a-6f1b9d3b7c11",
            "resourceVersion": "RV",
            "creationTimestamp": TIMESTAMP,
            "labels": {
                "kubernetes.io/hostname": "NAME",
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "p5.48xlarge",
                "topology.kubernetes.io/zone": "us-east-1a",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/gpu.count": "8",
                contract.LABEL_NODE_POOL: "training",
                contract.LABEL_REMEDIATION_STATE: "healthy",  # as remediation's first pass leaves it
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
            "managedFields": _managed_fields("kubelet", {"f:status": {"f:conditions": {".": {}}, "f:images": {}}}),
        },
        "spec": {"podCIDR": "10.244.1.0/24", "providerID": "aws:///us-east-1a/i-0abc"},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": "10.0.12.34"}, {"type": "Hostname", "address": "NAME"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": "ec2a1b2c3d4e5f",
                "systemUUID": "ec2a1b2c-3d4e-5f60-7182-93a4b5c6d7e8",
                "bootID": "4f3e2d1c-0b9a-8765-4321-0fedcba98765",
                "kernelVersion": "6.1.0",
                "osImage": "Ubuntu 22.04.4 LTS",
                "containerRuntimeVersion": "containerd://2.0.0",
                "kubeletVersion": "v1.37.2",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": [
                {
                    "names": [
                        f"registry.example/team/image-{i}@sha256:{'ab' * 32}",
                        f"registry.example/team/image-{i}:v1",
                    ],
                    "sizeBytes": 10_000_000_000 + i,
                }
                for i in range(20)
            ],
        },
    }


def gpunode_template() -> dict[str, Any]:
    return {
        "apiVersion": f"{contract.API_GROUP}/{contract.API_VERSION}",
        "kind": contract.GPUNODE_KIND,
        "metadata": {
            "name": "NAME",
            "uid": "0f9e8d7c-6b5a-4938-2716-05f4e3d2c1b0",
            "resourceVersion": "RV",
            "creationTimestamp": TIMESTAMP,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "NAME", "uid": "1e7c8a8e"}],
            "managedFields": _managed_fields(contract.AGENT_COMPONENT, {"f:status": {"f:gpus": {}}}),
        },
        "spec": {"nodeName": "NAME"},
        "status": {
            "gpuCount": GPUS_PER_NODE,
            "healthyGpuCount": GPUS_PER_NODE,
            "healthyGpuMemoryMiB": GPUS_PER_NODE * 81559,
            "action": "NONE",
            "gpus": [
                {
                    "index": i,
                    "uuid": f"GPU-1a2b3c4d-0000-0000-0000-00000000000{i}",
                    "pciBusId": f"00000000:{0x18 + i:02X}:00.0",
                    "model": "NVIDIA H100 80GB HBM3",
                    "memoryMiB": 81559,
                    "migMode": "Disabled",
                    "healthy": True,
                    "faults": [],
                }
                for i in range(GPUS_PER_NODE)
            ],
            "infinibandPorts": [
                {"device": f"mlx5_{i}", "port": 1, "state": "ACTIVE", "rateGbps": 400} for i in range(GPUS_PER_NODE)
            ],
        },
    }


def pod_template() -> dict[str, Any]:
    container = {
        "name": "trainer",
        "image": "registry.example/team/trainer:2026.11.3",
        "command": ["torchrun"],
        "args": ["--nproc-per-node=8", "train.py", "--config=/etc/job/config.yaml"],
        "env": [{"name": f"VAR_{i}", "value": f"value-{i}"} for i in range(12)]
        + [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}}],
        "resources": {
            "limits": {"cpu": "16", "memory": "200Gi", contract.RESOURCE_NVIDIA_GPU: "1"},
            "requests": {"cpu": "16", "memory": "200Gi", contract.RESOURCE_NVIDIA_GPU: "1"},
        },
        "volumeMounts": [
            {"name": "data", "mountPath": "/data"},
            {"name": "dshm", "mountPath": "/dev/shm"},
            {
                "name": "kube-api-access-abcde",
                "readOnly": True,
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
            },
        ],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"}, "periodSeconds": 10},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    }
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": "NAME",
            "generateName": "job-",
            "namespace": "NAMESPACE",
            "uid": "9a8b7c6d-5e4f-4321-8765-0a1b2c3d4e5f",
            "resourceVersion": "RV",
            "creationTimestamp": TIMESTAMP,
            "labels": {
                "app.kubernetes.io/name": "trainer",
                "batch.kubernetes.io/job-name": "job-1234",
                "training.kubeflow.org/replica-type": "worker",
                contract.LABEL_QUEUE: "team-a",
            },
            "annotations": {contract.ANNOTATION_POD_GROUP: "job-1234", "prometheus.io/scrape": "true"},
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": "job-1234",
                    "uid": "5f4e3d2c",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": _managed_fields("kube-controller-manager", {"f:metadata": {"f:labels": {}}, "f:spec": {}})
            + _managed_fields("kubelet", {"f:status": {"f:conditions": {}, "f:containerStatuses": {}}}),
        },
        "spec": {
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "team-a-data"}},
                {"name": "dshm", "emptyDir": {"medium": "Memory"}},
                {
                    "name": "kube-api-access-abcde",
                    "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]},
                },
            ],
            "containers": [container],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "nodeName": "NODE",
            "schedulerName": contract.SCHEDULER_NAME,
            "priorityClassName": "train",
            "priority": 50,
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
                {"key": contract.RESOURCE_NVIDIA_GPU, "operator": "Exists", "effect": "NoSchedule"},
            ],
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": TIMESTAMP}
                for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "hostIP": "10.0.12.34",
            "podIP": "10.244.1.17",
            "podIPs": [{"ip": "10.244.1.17"}],
            "startTime": TIMESTAMP,
            "containerStatuses": [
                {
                    "name": "trainer",
                    "state": {"running": {"startedAt": TIMESTAMP}},
                    "lastState": {},
                    "ready": True,
                    "restartCount": 0,
                    "image": "registry.example/team/trainer:2026.11.3",
                    "imageID": f"registry.example/team/trainer@sha256:{'cd' * 32}",
                    "containerID": f"containerd://{'ef' * 32}",
                    "started": True,
                }
            ],
            "qosClass": "Guaranteed",
        },
    }


def _place_pod(obj: dict[str, Any], i: int, nodes: int) -> None:
    """Pod ``i`` is worker ``i % 8`` of gang ``i // 8``, in that gang's namespace, queue and PodGroup.

    One gang in five runs on whole GPUs, eight to a node, with its GPU
    assignment written as a bind writes it (30,000 of the 40,000 GPUs at
    150,000 pods); the others are CPU-only pods spread over every node, so
    the cluster has room for the pending gangs that arrive in (iii).
    """
    gang, worker = divmod(i, GANG)
    team = f"team-{gang % TEAMS:02d}"
    meta, spec = obj["metadata"], obj["spec"]
    meta["name"] = f"job-{gang:06d}-worker-{worker}"
    meta["namespace"] = team
    meta["labels"][contract.LABEL_QUEUE] = team
    meta["annotations"][contract.ANNOTATION_POD_GROUP] = f"job-{gang:06d}"
    container = spec["containers"][0]
    if gang % 5 == 0:
        slot = (gang // 5) * GANG + worker
        node = f"gpu-node-{(slot // GPUS_PER_NODE) % nodes:05d}"
        index = slot % GPUS_PER_NODE
        meta["annotations"][contract.ANNOTATION_GPU_ASSIGNMENT] = json.dumps(
            {"node": node, "gpus": [{"index": index, "uuid": f"GPU-{index}", "memoryMiB": 81559}]},
            separators=(",", ":"),
        )
    else:
        node = f"gpu-node-{i % nodes:05d}"
        cpu_only = {"cpu": "500m", "memory": "2Gi"}
        container["resources"] = {"limits": dict(cpu_only), "requests": dict(cpu_only)}
    spec["nodeName"] = node


def _varied(template: dict[str, Any], i: int, rv: int, nodes: int) -> dict[str, Any]:
    """The template with a distinct name, uid and resourceVersion (and place, for pods)."""
    obj = copy.deepcopy(template)
    meta = obj["metadata"]
    kind = obj.get("kind")
    name = f"gpu-node-{i:05d}"
    meta["name"] = name
    meta["uid"] = f"{meta['uid'][:-8]}{i:08x}"
    meta["resourceVersion"] = str(rv)
    if kind == "Pod":
        _place_pod(obj, i, nodes)
    else:
        obj["spec"] = {k: (name if v == "NAME" else v) for k, v in obj["spec"].items()}
        if "labels" in meta:
            meta["labels"]["kubernetes.io/hostname"] = name
    return obj


def _page(items: list[dict[str, Any]], start: int, count: int) -> bytes:
    """One list response: ``items`` from ``start`` of ``count``, with a continue token unless last."""
    meta: dict[str, Any] = {"resourceVersion": str(10_000_000)}
    if start + PAGE < count:
        meta["continue"] = f"page-{start + PAGE}"
    return json.dumps({"kind": "List", "apiVersion": "v1", "metadata": meta, "items": items}).encode()


def pages(template: dict[str, Any], count: int, nodes: int) -> list[bytes]:
    """The list responses of ``count`` variations of ``template``, built a page at a time."""
    return [
        _page([_varied(template, i, 1000 + i, nodes) for i in range(start, min(count, start + PAGE))], start, count)
        for start in range(0, count, PAGE)
    ]


def object_pages(objects: list[dict[str, Any]]) -> list[bytes]:
    """The list responses of ``objects``."""
    count = len(objects)
    return [_page(objects[start : start + PAGE], start, count) for start in range(0, max(1, count), PAGE)]


def queue_objects() -> list[dict[str, Any]]:
    """One Queue per team in the nodes' pool, each with an equal GPU quota."""
    return [
        {
            "apiVersion": f"{contract.SCHEDULING_API_GROUP}/{contract.SCHEDULING_API_VERSION}",
            "kind": contract.QUEUE_KIND,
            "metadata": {"name": f"team-{t:02d}", "uid": f"queue-{t:02d}", "resourceVersion": "5"},
            "spec": {"nodePool": "training", "resources": {"gpu": {"quota": 800, "overQuotaWeight": 1}}},
        }
        for t in range(TEAMS)
    ]


def claim_objects() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each team's data claim (the pods mount it), bound to a shared volume that any node can reach.

    Without them every pending pod would wait for a claim that does not
    exist, and (iii) would decide no bind at all.
    """
    claims, volumes = [], []
    for t in range(TEAMS):
        team, volume = f"team-{t:02d}", f"pv-team-{t:02d}-data"
        claims.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": "team-a-data", "namespace": team, "uid": f"pvc-{t:02d}", "resourceVersion": "7"},
                "spec": {"accessModes": ["ReadWriteMany"], "volumeName": volume, "storageClassName": "nfs"},
                "status": {"phase": "Bound"},
            }
        )
        volumes.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": volume, "uid": f"pv-{t:02d}", "resourceVersion": "7"},
                "spec": {"claimRef": {"namespace": team, "name": "team-a-data"}, "nfs": {"server": "nfs", "path": "/"}},
                "status": {"phase": "Bound"},
            }
        )
    return claims, volumes


def podgroup_object(gang: int) -> dict[str, Any]:
    team = f"team-{gang % TEAMS:02d}"
    return {
        "apiVersion": f"{contract.SCHEDULING_API_GROUP}/{contract.SCHEDULING_API_VERSION}",
        "kind": contract.PODGROUP_KIND,
        "metadata": {"name": f"job-{gang:06d}", "namespace": team, "uid": f"pg-{gang:08x}", "resourceVersion": "7"},
        "spec": {"minMember": GANG, "queue": team},
    }


class Answer:
    """A response from memory, shaped as the client's raw response."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    def read(self, amt: int | None = None, decode_content: bool | None = None) -> bytes:
        return self.body

    def stream(self, amt: int | None = None, decode_content: bool | None = None) -> Iterator[bytes]:
        for i in range(0, len(self.body), 65536):
            yield self.body[i : i + 65536]

    def shutdown(self) -> None:
        pass

    def release_conn(self) -> None:
        pass

    def close(self) -> None:
        pass


class MemoryCollection:
    """A list function over prepared pages, and a watch that returns prepared lines."""

    def __init__(self, list_pages: list[bytes]) -> None:
        self.pages = list_pages
        self.watch_body = b""

    def __call__(self, **params: Any) -> Answer:
        if params.get("watch"):
            return Answer(self.watch_body)
        token = params.get("_continue") or ""
        index = int(token.split("-")[1]) // PAGE if token else 0
        return Answer(self.pages[index])


def build_cache(collections: dict[str, MemoryCollection]) -> tuple[ClusterCache, dict[str, Reflector]]:
    slims = {NODES: slim_node, PODS: slim_pod, CLAIMS: slim_claim, VOLUMES: slim_volume}
    cache = ClusterCache(
        resources=[
            WatchedResource(name, lambda api: None, slims.get(name, without_managed_fields)) for name in collections
        ]
    )
    reflectors = {
        name: Reflector(name, fn, lambda e, n=name: cache.apply(n, e), settings=ReflectorSettings(page_size=PAGE))
        for name, fn in collections.items()
    }
    return cache, reflectors


def modified_events(count: int, pods: int, nodes: int, *, first: int = 0, step: int = 97) -> bytes:
    """``count`` changes to pods spread over the whole store (a label changed), as watch lines."""
    template = pod_template()
    lines = []
    for i in range(count):
        pod = _varied(template, (first + i * step) % pods, 20_000_000 + first + i, nodes)
        pod["metadata"]["labels"]["step"] = str(first + i)
        lines.append(json.dumps({"type": "MODIFIED", "object": pod}).encode())
    return b"\n".join(lines) + b"\n"


def arriving_gangs(count: int, pods: int, nodes: int) -> tuple[bytes, bytes]:
    """``count`` new pending pods (gangs of 8, one whole GPU each) and their PodGroups, as watch lines."""
    template = pod_template()
    pod_lines = []
    gangs = set()
    for i in range(pods, pods + count):
        pod = _varied(template, i, 30_000_000 + i, nodes)
        gang = i // GANG
        gangs.add(gang)
        del pod["spec"]["nodeName"]
        pod["spec"]["containers"] = template["spec"]["containers"]
        pod["metadata"]["annotations"].pop(contract.ANNOTATION_GPU_ASSIGNMENT, None)
        pod["status"] = {"phase": "Pending", "qosClass": "Guaranteed"}
        pod_lines.append(json.dumps({"type": "ADDED", "object": pod}).encode())
    group_lines = [json.dumps({"type": "ADDED", "object": podgroup_object(g)}).encode() for g in sorted(gangs)]
    return b"\n".join(pod_lines) + b"\n", b"\n".join(group_lines) + b"\n"


def raw_pod_bytes(sample: int, nodes: int) -> float:
    """Memory per pod if the cache kept raw dicts, from a decoded sample."""
    body = pages(pod_template(), sample, nodes)
    gc.collect()
    tracemalloc.start()
    kept = [obj for page in body for obj in json.loads(page)["items"]]
    gc.collect()
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return held / len(kept)


def cache_memory(collections: dict[str, MemoryCollection]) -> int:
    """Bytes the synced cache holds (stores and reflector keys), traced in a run of its own.

    Resident memory cannot tell: pages decoded and dropped leave their
    memory in the allocator's arenas. tracemalloc counts only what is still
    allocated once the sync is done.
    """
    gc.collect()
    tracemalloc.start()
    cache, reflectors = build_cache(collections)
    for reflector in reflectors.values():
        reflector.list_once()
    gc.collect()
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert cache.count(PODS) > 0
    return held


@dataclass
class CycleTimes:
    """Seconds of one timed cycle, by phase."""

    view: float  # cache.view() and the cycle's keys
    prepare: float  # grouping and the Snapshot (the engine's input)
    build: float  # the session's build (old) or update (new) of the working state
    undo: float  # taking the session's work back out of the kept state (new only)
    session: float  # the whole session (build, actions, decisions, undo)

    @property
    def total(self) -> float:
        return self.view + self.prepare + self.session


def timed_cycle(
    cycle: SchedulingCycle, cache: ClusterCache, views: ClusterViews | None
) -> tuple[CycleTimes, Snapshot, Decisions]:
    """One cycle without its executors: the view, the engine's input and the session.

    With ``views`` the view is re-keyed by what changed since the previous
    one (as the scheduler's loop does); without, every entry is re-keyed.
    """
    clock = time.perf_counter
    began = clock()
    view = views.next(views.take(cache)) if views is not None else cluster_view(cache.view())
    viewed = clock()
    snapshot = cycle.prepare(view, NOW)
    prepared = clock()
    phases: dict[str, float] = {}
    decisions = cycle.decide(snapshot, phases)
    done = clock()
    times = CycleTimes(viewed - began, prepared - viewed, phases["build"], phases.get("undo", 0.0), done - prepared)
    return times, snapshot, decisions


@dataclass(frozen=True)
class Changes:
    """The watch streams that (ii) and (iii) read."""

    modified: bytes  # (ii): pods changed
    arrivals: bytes  # (iii): new pending pods
    groups: bytes  # (iii): their PodGroups


def cycles(
    cache: ClusterCache,
    reflectors: dict[str, Reflector],
    collections: dict[str, MemoryCollection],
    changes: Changes,
    *,
    results: dict[str, dict[str, list[CycleTimes]]],
    remediation: dict[str, dict[str, list[float]]],
    observed: dict[str, dict[str, int]],
    decided: dict[str, tuple[int, int]],
    flip: bool,
) -> None:
    """(i), (ii) and (iii) on a synced cache, each timed on today's full rebuild and on the incremental cycle.

    Both cycles see the same views; which goes first alternates between runs.
    Their snapshots and decisions must be equal, or the figures mean nothing.
    """
    api = KubeApi(client.ApiClient(), field_manager=contract.SCHEDULER_COMPONENT)  # never called: no executors run
    sides = {"old": SchedulingCycle(api, incremental=False), "new": SchedulingCycle(api)}
    kept = RemediationController(api, Evictor(api))
    taints = DeviceTaintPublisher(api)  # no node quarantined a GPU: it writes nothing
    views = {"old": None, "new": ClusterViews()}
    order = ("new", "old") if flip else ("old", "new")
    for label in ("i", "ii", "iii"):
        if label == "ii":
            collections[PODS].watch_body = changes.modified
            reflectors[PODS].watch_once()
        elif label == "iii":
            collections[PODGROUPS].watch_body = changes.groups
            reflectors[PODGROUPS].watch_once()
            collections[PODS].watch_body = changes.arrivals
            reflectors[PODS].watch_once()
        seen: dict[str, tuple[Snapshot, Decisions]] = {}
        for side in order:
            gc.collect()
            times, snapshot, decisions = timed_cycle(sides[side], cache, views[side])
            results[label][side].append(times)
            seen[side] = (snapshot, decisions)
        # The remediation pass the leader runs after the cycle, over the same view:
        # "old" reads every node again, as a controller without kept readings
        # does; "new" is the term's controller, which read them all in (i).
        current = cluster_view(cache.view())
        for side in order:
            controller = kept if side == "new" else RemediationController(api, Evictor(api))
            gc.collect()
            began = time.perf_counter()
            report = controller.run(current.nodes, current.gpunodes, current.pods.values())
            # The worker's device-taint sync, on every view in which a Node changed.
            synced = taints.sync(current.nodes, current.gpunodes, current.resource_slices, current.device_taint_rules)
            remediation[label][side].append(time.perf_counter() - began)
            assert not (synced.created or synced.errors)
            assert not report.errors and len(report.transitions) == len(current.nodes), report.errors[:3]
            observed[label][side] = len(report.observed)
        # Jobs and pods may come in another order, which the engine does not read (it sorts them).
        same = canonical(seen["old"][0]) == canonical(seen["new"][0]) and seen["old"][1] == seen["new"][1]
        assert same, f"({label}): the incremental cycle differs from the full rebuild"
        decided[label] = (len(seen["new"][0].jobs), len(seen["new"][1].binds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--runs", type=int, default=RUNS, help="runs to take the min and median of")
    parser.add_argument(
        "--gc-threshold0",
        type=int,
        default=GC_THRESHOLDS[0],
        help="the cyclic collector's first threshold (default: the scheduler process's; Python's is 700); decoding "
        "a list page makes tens of thousands of containers, and collecting them young is most of the sync's cost",
    )
    args = parser.parse_args()
    _, second, third = GC_THRESHOLDS
    gc.set_threshold(args.gc_threshold0, second, third)
    print(f"gc thresholds {gc.get_threshold()}")

    print(f"building {args.nodes} Nodes, {args.nodes} GPUNodes and {args.pods} Pods as list pages ...", flush=True)
    collections = {
        NODES: MemoryCollection(pages(node_template(), args.nodes, args.nodes)),
        GPUNODES: MemoryCollection(pages(gpunode_template(), args.nodes, args.nodes)),
        PODS: MemoryCollection(pages(pod_template(), args.pods, args.nodes)),
    }
    raw_total = sum(len(p) for c in collections.values() for p in c.pages)
    objects = 2 * args.nodes + args.pods
    pod_size = len(collections[PODS].pages[0]) // PAGE
    print(f"  {objects} objects, {raw_total / 2**20:.0f} MiB of JSON; a pod is {pod_size} bytes of JSON")
    gangs = (args.pods + GANG - 1) // GANG
    claims, volumes = claim_objects()
    scheduling = {
        QUEUES: MemoryCollection(object_pages(queue_objects())),
        PODGROUPS: MemoryCollection(object_pages([podgroup_object(g) for g in range(gangs)])),
        CLAIMS: MemoryCollection(object_pages(claims)),
        VOLUMES: MemoryCollection(object_pages(volumes)),
    }
    per_event_body = modified_events(1000, args.pods, args.nodes)
    arrivals, arriving_groups = arriving_gangs(ARRIVING, args.pods, args.nodes)
    changes = Changes(modified_events(CHANGED, args.pods, args.nodes, first=1, step=1409), arrivals, arriving_groups)

    sync_s: list[float] = []
    event_us: list[float] = []
    view_ms: list[float] = []
    results: dict[str, dict[str, list[CycleTimes]]] = {k: {"old": [], "new": []} for k in ("i", "ii", "iii")}
    remediation: dict[str, dict[str, list[float]]] = {k: {"old": [], "new": []} for k in ("i", "ii", "iii")}
    observed: dict[str, dict[str, int]] = {k: {} for k in ("i", "ii", "iii")}
    decided: dict[str, tuple[int, int]] = {}
    for run in range(args.runs):
        gc.collect()
        cache, reflectors = build_cache({**collections, **scheduling})
        began = time.perf_counter()
        for name in (NODES, GPUNODES, PODS):
            reflectors[name].list_once()
        sync_s.append(time.perf_counter() - began)
        assert cache.count(PODS) == args.pods and cache.count(NODES) == args.nodes
        for name in scheduling:
            reflectors[name].list_once()

        collections[PODS].watch_body = per_event_body
        began = time.perf_counter()
        reflectors[PODS].watch_once()
        event_us.append((time.perf_counter() - began) / 1000 * 1e6)
        assert cache.get(PODS, "team-00/job-000000-worker-0") is not None

        began = time.perf_counter()
        view = cache.view()
        view_ms.append((time.perf_counter() - began) * 1000)
        assert len(view.pods) == args.pods
        del view

        # As the scheduler process does once synced: what the sync built stays out of later collections.
        gc.collect()
        gc.freeze()
        print(f"run {run + 1}: cycles ...", flush=True)
        cycles(
            cache,
            reflectors,
            {**collections, **scheduling},
            changes,
            results=results,
            remediation=remediation,
            observed=observed,
            decided=decided,
            flip=run % 2 == 1,
        )
        del cache, reflectors
        gc.unfreeze()

    store_mib = cache_memory(collections) / 2**20
    per_raw = raw_pod_bytes(min(10_000, args.pods), args.nodes)

    def line(label: str, values: list[float], unit: str) -> str:
        return f"  {label:<46} min {min(values):9.3f} {unit}   median {statistics.median(values):9.3f} {unit}"

    print(f"results over {args.runs} runs:")
    print(line(f"(iv) initial sync ({objects} objects)", sync_s, "s") + "   [target < 10 s]")
    print(line("  per object", [s / objects * 1e6 for s in sync_s], "us"))
    print(line("MODIFIED pod event (decode + prune + store)", event_us, "us"))
    print(line(f"view() ({objects} entries copied)", view_ms, "ms"))
    print(f"  memory the synced cache holds                  {store_mib:9.0f} MiB (reflector keys included)")
    print(
        f"  raw pods kept as decoded dicts would take      {per_raw * args.pods / 2**20:9.0f} MiB"
        f" ({per_raw / 1024:.1f} KiB a pod, measured on 10,000)"
    )
    print(
        "cycles: the cache's view, the engine's input (grouping, Snapshot) and the session; no API calls "
        "(binds, evictions and status writes are not part of it). old: every object converted each cycle "
        "(snapshot_from) and the working state built from all of it (run_session); new: conversions kept per "
        "cache entry (SnapshotAssembler) and the working state kept, undone and updated (Engine)"
    )
    titles = {
        "i": "(i) first full cycle",
        "ii": f"(ii) cycle after {CHANGED} pods changed",
        "iii": f"(iii) cycle after {ARRIVING} pending pods arrived",
    }
    targets = {"i": "", "ii": "   [target < 0.3 s]", "iii": "   [target < 1 s]"}
    for key, title in titles.items():
        jobs, binds = decided[key]
        print(f"  {title}: {jobs} jobs, {binds} binds decided (the same by both)")
        for side in ("old", "new"):
            runs = results[key][side]
            print(line(f"{title}, {side}", [r.total for r in runs], "s") + (targets[key] if side == "new" else ""))
            for phase in ("view", "prepare", "build", "undo", "session"):
                print(line(f"    {phase}", [getattr(r, phase) for r in runs], "s"))
            passes = remediation[key][side]
            print(line(f"    remediation pass ({observed[key][side]} nodes observed)", passes, "s"))
            with_pass = [r.total + p for r, p in zip(runs, passes, strict=True)]
            print(line("    cycle and remediation pass", with_pass, "s") + (targets[key] if side == "new" else ""))


if __name__ == "__main__":
    main()
