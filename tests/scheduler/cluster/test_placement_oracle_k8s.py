"""gpuwarden's placement rules against the upstream kube-scheduler, on random clusters.

gpuwarden promises that a pod it places could have been placed there by
kube-scheduler, and that a pod it leaves pending could not have been placed
anywhere (apart from the stricter cases its rules document). This test
checks both promises against the real thing: the kube-scheduler binary that
``make controlplane`` builds, on the test control plane, over clusters drawn
at random per seed (``--placement-seeds N``, ``--placement-first-seed S``).

Each seed builds, in fresh namespaces, 3-8 Ready nodes with zones, racks,
GPU products, integer labels, taints, cordons and small allocatables (pods,
CPU, memory, GPUs, an extended resource, ephemeral storage, hugepages);
pods bound directly to them by a scheduler nobody runs (labels, requests,
host ports, required anti-affinity; some finished, some terminating); and
pending gpuwarden pods with random constraints. gpuwarden's decision comes
from the objects listed back from the API server, converted by
:func:`scheduler.cluster.convert.snapshot_from` and run through the engine.
kube-scheduler then judges a copy of each pod (``schedulerName:
default-scheduler``), one pod at a time, so that both see the same cluster:

- gpuwarden bound it to node X: the copy must be scheduled onto X. The copy
  names X as its ``status.nominatedNodeName`` (written while a scheduling
  gate holds it, then the gate is lifted): kube-scheduler runs every filter
  on a nominated node first and takes it if it passes. Pinning with a
  nodeSelector instead would change what is checked: a topology spread
  constraint with ``nodeAffinityPolicy: Honor`` (the default) counts only
  the nodes that match the pod's node selector, so a pinned copy would
  always satisfy its spread.
- gpuwarden did not bind it: a copy free to go anywhere must stay
  unschedulable, unless the pod falls under a documented stricter case:
  a cordoned or not-Ready node (gpuwarden places nothing there even for a
  pod that tolerates it), a required pod-affinity term with a labelled
  namespace selector (refused as UnsupportedPlacement), or an anti-affinity
  term with a labelled namespace selector (gpuwarden counts every
  namespace; the copy is judged with the selector widened to every
  namespace, which is what gpuwarden enforces).

The first pods of each seed are also compared node by node: gpuwarden's
static predicates and ``fits`` (room and the rules that read the pods
around) against a copy nominated to each node in turn, which lands there
exactly when kube-scheduler's filters pass it. Every node is a verdict, not
only the one a session picked, so a rule that only decides between nodes
is tested too.

A multi-pod round per seed then checks "pods placed earlier in the same
session": several pods, gangs among them (2-3 members with anti-affinity to
each other on the hostname), in one engine session; for each bind, in the
order the engine placed them, a copy nominated to its node must be
scheduled there, and is kept, so later copies see the earlier ones.

A disagreement is retried before it is reported (kube-scheduler's caches
follow the API server by watch, and a node created a moment ago may not be
in them yet); the report names the seed, the pod's spec, the nodes and the
pods on them, gpuwarden's reason and kube-scheduler's message.
"""

from __future__ import annotations

import contextlib
import copy
import json
import random
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes import client

from gpuwarden.contract import RESOURCE_NVIDIA_GPU, SCHEDULER_NAME
from gpuwarden.localcluster import LABEL_HOSTNAME, ManagedProcess, create_gpu_node
from scheduler.cluster.convert import GroupInfo, snapshot_from
from scheduler.engine.build import build_cluster
from scheduler.engine.caches import SessionCaches
from scheduler.engine.model import Bind, Decisions, Queue, SchedulerConfig, Snapshot, Task, TaskStatus
from scheduler.engine.predicates import static_exclusion
from scheduler.engine.rules import needs_verdict, verdict_for
from scheduler.engine.scoring import fits
from scheduler.engine.session import act
from tests.harness import ControlPlane, unique_name
from tests.harness import kube_scheduler as start_kube_scheduler
from tests.waiting import wait_for

pytestmark = [pytest.mark.k8s]

KUBE_SCHEDULER = "default-scheduler"
# Existing pods are bound by hand, as if by a scheduler neither runs.
NOBODY = "nobody"
QUEUE = "oracle"
GATE = "gpuwarden.io/oracle-pin"
IMAGE = "registry.invalid/gpuwarden-oracle:1"

ZONE = "topology.kubernetes.io/zone"
RACK = "example.com/rack"
PRODUCT = "nvidia.com/gpu.product"
TIER = "example.com/tier"
GENERATION = "example.com/generation"
FOO = "example.com/foo"
HUGEPAGES = "hugepages-2Mi"
ENV = "example.com/env"
# On every node a seed makes, so that its cleanup finds them even after a failure.
ORACLE_SEED_LABEL = "example.com/oracle-seed"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"

APPS = ("web", "db", "cache", "batch")
TEAMS = ("red", "blue")
PRODUCTS = ("NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "NVIDIA-L40S")
PORTS = (8080, 9000)
TAINTS = (
    ("example.com/dedicated", ("ml", "batch")),
    ("example.com/maintenance", ("",)),
    ("nvidia.com/gpu", ("present",)),
)
EFFECTS = ("NoSchedule", "NoExecute", "PreferNoSchedule")

# How long kube-scheduler may take to judge one copy (the first waits for it to start).
VERDICT_TIMEOUT_S = 60.0
RETRIES = 3
# Per seed, how many of the pods checked one at a time are also compared node by node.
EACH_NODE_PODS = 2
_NODE_COUNT = re.compile(r"^0/(\d+) nodes are available")

JSON = dict[str, Any]


# --------------------------------------------------------------------------
# kube-scheduler
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kube_scheduler(control_plane: ControlPlane) -> Iterator[ManagedProcess]:
    """The upstream kube-scheduler on the test control plane, for this module only."""
    with start_kube_scheduler(
        control_plane, "kube-scheduler-oracle", "--kube-api-qps=1000", "--kube-api-burst=2000", "--v=1"
    ) as proc:
        yield proc


# --------------------------------------------------------------------------
# Random clusters
# --------------------------------------------------------------------------


@dataclass
class World:
    """One seed's cluster: what was created, for the cleanup and for the report."""

    seed: int
    rng: random.Random
    namespaces: tuple[str, str]
    zones: tuple[str, ...]
    nodes: dict[str, JSON] = field(default_factory=dict)
    existing: list[JSON] = field(default_factory=list)

    def describe(self) -> str:
        """Every node with what is bound to it, as the report shows them."""
        lines = []
        for name, node in self.nodes.items():
            lines.append(f"  node {name}: {json.dumps(node, sort_keys=True)}")
            for pod in self.existing:
                if pod["spec"].get("nodeName") == name:
                    lines.append(f"    pod {_ident(pod)}: {_summary(pod)}")
        return "\n".join(lines)


def _ident(pod: JSON) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def _summary(pod: JSON) -> str:
    """The parts of a pod that placement reads."""
    spec = pod["spec"]
    keep = {k: spec[k] for k in ("nodeSelector", "affinity", "topologySpreadConstraints", "tolerations") if k in spec}
    keep["containers"] = [{k: c[k] for k in ("resources", "ports") if k in c} for c in spec["containers"]]
    if "initContainers" in spec:
        keep["initContainers"] = [
            {k: c[k] for k in ("resources", "ports", "restartPolicy") if k in c} for c in spec["initContainers"]
        ]
    extra = {k: pod[k] for k in ("phase", "terminating") if k in pod}
    return json.dumps({"labels": pod["metadata"].get("labels", {}), **extra, **keep}, sort_keys=True)


def _labels(rng: random.Random) -> dict[str, str]:
    labels = {"app": rng.choice(APPS)}
    if rng.random() < 0.7:
        labels["team"] = rng.choice(TEAMS)
    return labels


def _selector(rng: random.Random, own: dict[str, str]) -> JSON:
    r = rng.random()
    if r < 0.35:
        return {"matchLabels": {"app": own["app"]}}
    if r < 0.55:
        return {"matchLabels": {"app": rng.choice(APPS)}}
    if r < 0.7:
        return {"matchExpressions": [{"key": "app", "operator": "In", "values": sorted(rng.sample(APPS, 2))}]}
    if r < 0.8:
        return {"matchExpressions": [{"key": "team", "operator": rng.choice(("Exists", "DoesNotExist"))}]}
    if r < 0.9:
        return {"matchLabels": {"app": rng.choice(APPS), "team": rng.choice(TEAMS)}}
    return {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": [rng.choice(APPS)]}]}


def _selector_keys(selector: JSON) -> set[str]:
    return set(selector.get("matchLabels", {})) | {e["key"] for e in selector.get("matchExpressions", [])}


def _pod_term(rng: random.Random, labels: dict[str, str], world: World, *, labelled_ns: bool) -> JSON:
    selector = _selector(rng, labels)
    term: JSON = {"topologyKey": rng.choice((LABEL_HOSTNAME, LABEL_HOSTNAME, ZONE, RACK)), "labelSelector": selector}
    r = rng.random()
    if r < 0.15:
        term["namespaces"] = [rng.choice(world.namespaces)]
    elif r < 0.25:
        term["namespaceSelector"] = {}
    elif r < 0.33 and labelled_ns:
        term["namespaceSelector"] = {"matchLabels": {ENV: rng.choice(("prod", "dev"))}}
    if rng.random() < 0.12 and "team" in labels and "team" not in _selector_keys(selector):
        term["matchLabelKeys"] = ["team"]
    return term


def _quantity_cpu(milli: int) -> str:
    return f"{milli}m"


def _container(rng: random.Random, name: str, *, heavy: float, ports: float = 0.2) -> JSON:
    """A container with random requests (``heavy`` scales how much) and maybe a host port."""
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if rng.random() < 0.8:
        requests["cpu"] = _quantity_cpu(int(rng.choice((100, 250, 500, 1000, 2000, 4000)) * heavy))
    if rng.random() < 0.7:
        requests["memory"] = f"{int(rng.choice((128, 512, 1024, 4096, 8192)) * heavy)}Mi"
    if rng.random() < 0.4:
        limits[RESOURCE_NVIDIA_GPU] = str(rng.choice((1, 1, 2, 4, 8)))
    if rng.random() < 0.3:
        limits[FOO] = str(rng.randint(1, 3))
    if rng.random() < 0.3:
        requests["ephemeral-storage"] = f"{rng.choice((1, 5, 20, 60))}Gi"
    if rng.random() < 0.15:
        limits[HUGEPAGES] = f"{rng.choice((2, 64, 128))}Mi"
        limits.setdefault("memory", requests.setdefault("memory", "256Mi"))
    container: JSON = {"name": name, "image": IMAGE}
    resources: JSON = {}
    if requests:
        resources["requests"] = requests
    if limits:
        if "memory" in limits and "memory" in requests:
            limits["memory"] = requests["memory"]
        resources["limits"] = limits
    if resources:
        container["resources"] = resources
    if rng.random() < ports:
        port: JSON = {"containerPort": rng.choice(PORTS), "hostPort": rng.choice(PORTS)}
        if rng.random() < 0.3:
            port["protocol"] = "UDP"
        if rng.random() < 0.25:
            port["hostIP"] = "127.0.0.1"
        container["ports"] = [port]
    return container


def _containers(rng: random.Random, spec: JSON, *, heavy: float) -> None:
    spec["containers"] = [_container(rng, "main", heavy=heavy)]
    init = []
    if rng.random() < 0.15:
        # A one-shot init container: its host port is not held while the pod runs.
        init.append(_container(rng, "setup", heavy=heavy * 2, ports=0.5))
    if rng.random() < 0.1:
        sidecar = _container(rng, "sidecar", heavy=heavy / 2, ports=0.4)
        sidecar["restartPolicy"] = "Always"
        init.append(sidecar)
    if init:
        spec["initContainers"] = init


def _node_requirement(rng: random.Random, world: World) -> JSON:
    r = rng.random()
    if r < 0.2:
        return {"key": ZONE, "operator": "In", "values": sorted(rng.sample(world.zones, rng.randint(1, 2)))}
    if r < 0.3:
        return {"key": ZONE, "operator": "NotIn", "values": [rng.choice(world.zones)]}
    if r < 0.4:
        return {"key": RACK, "operator": rng.choice(("Exists", "DoesNotExist"))}
    if r < 0.6:
        return {"key": GENERATION, "operator": rng.choice(("Gt", "Lt")), "values": [str(rng.randint(1, 5))]}
    if r < 0.7:
        return {"key": TIER, "operator": "In", "values": ["gold"]}
    if r < 0.85:
        return {"key": PRODUCT, "operator": "In", "values": sorted(rng.sample(PRODUCTS, 2))}
    return {"key": PRODUCT, "operator": "NotIn", "values": [rng.choice(PRODUCTS)]}


def _node_term(rng: random.Random, world: World) -> JSON:
    term: JSON = {"matchExpressions": [_node_requirement(rng, world) for _ in range(rng.randint(1, 2))]}
    if rng.random() < 0.12:
        name = rng.choice(sorted(world.nodes))
        term["matchFields"] = [{"key": "metadata.name", "operator": rng.choice(("In", "NotIn")), "values": [name]}]
    return term


def _tolerations(rng: random.Random) -> list[JSON]:
    out: list[JSON] = []
    for key, values in TAINTS:
        if rng.random() < 0.3:
            toleration: JSON = {"key": key, "operator": "Exists"}
            if values != ("",) and rng.random() < 0.5:
                toleration = {"key": key, "operator": "Equal", "value": rng.choice(values)}
            if rng.random() < 0.3:
                toleration["effect"] = rng.choice(EFFECTS)
            out.append(toleration)
    if rng.random() < 0.06:
        out.append({"operator": "Exists"})
    if rng.random() < 0.06:
        out.append({"key": UNSCHEDULABLE_TAINT, "operator": "Exists", "effect": "NoSchedule"})
    return out


def _spread(rng: random.Random, labels: dict[str, str]) -> list[JSON]:
    out: list[JSON] = []
    seen: set[tuple[str, str]] = set()
    for _ in range(rng.choice((1, 2, 2))):
        hard = rng.random() < 0.75
        when = "DoNotSchedule" if hard else "ScheduleAnyway"
        key = rng.choice((ZONE, LABEL_HOSTNAME, RACK))
        if (key, when) in seen:
            continue
        seen.add((key, when))
        r = rng.random()
        if r < 0.6:
            selector: JSON = {"matchLabels": {"app": labels["app"]}}
        elif r < 0.75:
            selector = {"matchExpressions": [{"key": "app", "operator": "In", "values": sorted({labels["app"], "db"})}]}
        elif r < 0.85:
            selector = {}
        else:
            selector = {"matchLabels": {"app": rng.choice(APPS)}}
        constraint: JSON = {
            "maxSkew": rng.randint(1, 2),
            "topologyKey": key,
            "whenUnsatisfiable": when,
            "labelSelector": selector,
        }
        if hard and rng.random() < 0.3:
            constraint["minDomains"] = rng.randint(2, 4)
        if rng.random() < 0.4:
            constraint["nodeAffinityPolicy"] = rng.choice(("Honor", "Ignore"))
        if rng.random() < 0.4:
            constraint["nodeTaintsPolicy"] = rng.choice(("Honor", "Ignore"))
        if rng.random() < 0.2 and "team" in labels and "team" not in _selector_keys(selector):
            constraint["matchLabelKeys"] = ["team"]
        out.append(constraint)
    return out


def pending_pod(world: World, name: str, labels: dict[str, str] | None = None) -> JSON:
    """A pending gpuwarden pod with a random set of constraints."""
    rng = world.rng
    labels = labels or _labels(rng)
    namespace = rng.choice(world.namespaces)
    spec: JSON = {"schedulerName": SCHEDULER_NAME, "terminationGracePeriodSeconds": 0}
    _containers(rng, spec, heavy=rng.choice((0.25, 0.5, 1.0)))
    if rng.random() < 0.25:
        key, value = rng.choice(
            ((ZONE, rng.choice(world.zones)), (PRODUCT, rng.choice(PRODUCTS)), (TIER, "gold"), (RACK, "rack-1"))
        )
        spec["nodeSelector"] = {key: value}
    affinity: JSON = {}
    node_affinity: JSON = {}
    if rng.random() < 0.35:
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [_node_term(rng, world) for _ in range(rng.randint(1, 2))]
        }
    if rng.random() < 0.25:
        node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": rng.randint(1, 100), "preference": _node_term(rng, world)}
        ]
    if node_affinity:
        affinity["nodeAffinity"] = node_affinity
    for kind, chance in (("podAffinity", 0.25), ("podAntiAffinity", 0.3)):
        terms: JSON = {}
        if rng.random() < chance:
            terms["requiredDuringSchedulingIgnoredDuringExecution"] = [
                _pod_term(rng, labels, world, labelled_ns=True) for _ in range(rng.randint(1, 2))
            ]
        if rng.random() < 0.15:
            terms["preferredDuringSchedulingIgnoredDuringExecution"] = [
                {"weight": rng.randint(1, 100), "podAffinityTerm": _pod_term(rng, labels, world, labelled_ns=True)}
            ]
        if terms:
            affinity[kind] = terms
    if affinity:
        spec["affinity"] = affinity
    tolerations = _tolerations(rng)
    if tolerations:
        spec["tolerations"] = tolerations
    if rng.random() < 0.35:
        spec["topologySpreadConstraints"] = _spread(rng, labels)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": spec,
    }


def _make_node(api: client.ApiClient, world: World, index: int) -> None:
    rng = world.rng
    name = f"oracle-{world.seed}-{index}-{unique_name('n')[-6:]}"
    gpus = rng.choice((0, 1, 2, 4, 8, 8))
    labels = {ORACLE_SEED_LABEL: str(world.seed)}
    if rng.random() < 0.95:
        labels[ZONE] = rng.choice(world.zones)
    if rng.random() < 0.7:
        labels[RACK] = f"rack-{rng.randint(1, 3)}"
    if gpus:
        labels[PRODUCT] = rng.choice(PRODUCTS)
    if rng.random() < 0.5:
        labels[TIER] = rng.choice(("gold", "silver"))
    if rng.random() < 0.7:
        labels[GENERATION] = str(rng.randint(1, 5))
    create_gpu_node(api, name, gpus=gpus, labels=labels)
    allocatable: dict[str, str | None] = {
        "cpu": rng.choice(("2", "4", "8", "16")),
        "memory": rng.choice(("4Gi", "8Gi", "16Gi", "32Gi")),
        "pods": str(rng.randint(4, 10)),
        "ephemeral-storage": rng.choice(("10Gi", "50Gi", "100Gi")),
        RESOURCE_NVIDIA_GPU: str(gpus),
        FOO: rng.choice((None, "0", "1", "2", "4")),
        HUGEPAGES: rng.choice((None, "0", "64Mi", "256Mi")),
    }
    core = client.CoreV1Api(api)
    status: JSON = {"capacity": allocatable, "allocatable": allocatable}
    taints: list[JSON] = []
    for key, values in TAINTS:
        if rng.random() < 0.15:
            taints.append({"key": key, "value": rng.choice(values), "effect": rng.choice(EFFECTS)})
    cordoned = rng.random() < 0.08
    not_ready = not cordoned and rng.random() < 0.05
    if cordoned:
        # As the node lifecycle controller marks a cordoned node.
        taints.append({"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"})
    if not_ready:
        taints.append({"key": NOT_READY_TAINT, "effect": "NoSchedule"})
        status["conditions"] = [{"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "oracle"}]
    core.patch_node_status(name, {"status": status})
    spec: JSON = {"taints": taints or None}
    if cordoned:
        spec["unschedulable"] = True
    core.patch_node(name, {"spec": spec})
    world.nodes[name] = {
        "labels": labels,
        "allocatable": {k: v for k, v in allocatable.items() if v is not None},
        "taints": taints,
        **({"unschedulable": True} if cordoned else {}),
        **({"notReady": True} if not_ready else {}),
    }


def _make_existing(api: client.ApiClient, world: World, node: str, index: int) -> None:
    rng = world.rng
    labels = _labels(rng)
    namespace = rng.choice(world.namespaces)
    spec: JSON = {"schedulerName": NOBODY, "nodeName": node, "terminationGracePeriodSeconds": 0}
    _containers(rng, spec, heavy=rng.choice((0.25, 0.5)))
    # GPUs as a device plugin would have admitted them: never more than the node has.
    free = int(world.nodes[node]["allocatable"][RESOURCE_NVIDIA_GPU])
    free -= sum(_gpus_of(p) for p in world.existing if p["spec"]["nodeName"] == node)
    for container in spec.get("initContainers", []):
        container.get("resources", {}).get("limits", {}).pop(RESOURCE_NVIDIA_GPU, None)
    limits = spec["containers"][0].get("resources", {}).get("limits", {})
    if RESOURCE_NVIDIA_GPU in limits:
        limits[RESOURCE_NVIDIA_GPU] = str(min(int(limits[RESOURCE_NVIDIA_GPU]), max(0, free)))
        if limits[RESOURCE_NVIDIA_GPU] == "0":
            del limits[RESOURCE_NVIDIA_GPU]
    if rng.random() < 0.25:
        spec["affinity"] = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [_pod_term(rng, labels, world, labelled_ns=False)]
            }
        }
    name = f"bound-{index}"
    body: JSON = {"metadata": {"name": name, "namespace": namespace, "labels": labels}, "spec": spec}
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(namespace, body)
    r = rng.random()
    if r < 0.08:
        core.patch_namespaced_pod_status(name, namespace, {"status": {"phase": "Succeeded"}})
        body["phase"] = "Succeeded"
    elif r < 0.16:
        # No kubelet finishes the deletion: the pod stays, terminating.
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=3600)
        body["terminating"] = True
    world.existing.append(body)


def _gpus_of(pod: JSON) -> int:
    return sum(
        int(c.get("resources", {}).get("limits", {}).get(RESOURCE_NVIDIA_GPU, 0)) for c in pod["spec"]["containers"]
    )


def build_world(api: client.ApiClient, seed: int, namespaces: tuple[str, str]) -> World:
    rng = random.Random(seed)
    zones = tuple(f"zone-{z}" for z in "abc"[: rng.randint(2, 3)])
    world = World(seed=seed, rng=rng, namespaces=namespaces, zones=zones)
    for i in range(rng.randint(3, 8)):
        _make_node(api, world, i)
    count = 0
    for node in list(world.nodes):
        limit = int(world.nodes[node]["allocatable"]["pods"])
        many = limit if rng.random() < 0.15 else rng.randint(0, min(3, limit))
        for _ in range(many):
            _make_existing(api, world, node, count)
            count += 1
    return world


@contextlib.contextmanager
def seed_namespaces(api: client.ApiClient, seed: int) -> Iterator[tuple[str, str]]:
    """Two labelled namespaces for one seed; afterwards every pod in them, the namespaces and the seed's nodes go."""
    core = client.CoreV1Api(api)
    names = (unique_name(f"oracle-{seed}-prod"), unique_name(f"oracle-{seed}-dev"))
    for name, env in zip(names, ("prod", "dev"), strict=True):
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={ENV: env})))
    try:
        yield names
    finally:
        for name in names:
            with contextlib.suppress(client.ApiException):
                core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
            with contextlib.suppress(client.ApiException):
                core.delete_namespace(name)
        for node in core.list_node(label_selector=f"{ORACLE_SEED_LABEL}={seed}").items:
            with contextlib.suppress(client.ApiException):
                core.delete_node(node.metadata.name)


# --------------------------------------------------------------------------
# gpuwarden's decision
# --------------------------------------------------------------------------


def _raw(response: Any) -> list[JSON]:
    """Objects exactly as the API server sends them (what the watch cache holds)."""
    return list(json.loads(response.data)["items"])


@dataclass
class Verdict:
    """gpuwarden's decision for some pending pods: binds in the order the engine placed them."""

    binds: dict[str, Bind]
    order: list[str]
    reasons: dict[str, str]
    tasks: dict[str, Task]
    snapshot: Snapshot


def gpuwarden_decides(api: client.ApiClient, targets: list[JSON], gangs: dict[str, tuple[str, int]]) -> Verdict:
    """Run one engine session over the cluster as listed back, with ``targets`` its only pending pods.

    ``gangs`` maps a pod name to its group and the group's size; every
    other target is its own group. Other pending gpuwarden pods are left out
    of the snapshot, so that the session sees what kube-scheduler sees.
    """
    wanted = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in targets}
    core = client.CoreV1Api(api)
    nodes = {n["metadata"]["name"]: n for n in _raw(core.list_node(_preload_content=False))}
    pods = []
    for pod in _raw(core.list_pod_for_all_namespaces(_preload_content=False)):
        meta, spec = pod["metadata"], pod["spec"]
        ours = spec.get("schedulerName") == SCHEDULER_NAME and not spec.get("nodeName")
        if ours and (meta["namespace"], meta["name"]) not in wanted:
            continue
        pods.append(pod)
    groups: dict[tuple[str, str], GroupInfo] = {}
    pod_groups: dict[str, str] = {}
    for pod in pods:
        meta = pod["metadata"]
        if (meta["namespace"], meta["name"]) in wanted:
            group, size = gangs.get(meta["name"], (meta["name"], 1))
            groups[(meta["namespace"], group)] = GroupInfo(queue=QUEUE, min_member=size)
            pod_groups[meta["uid"]] = group
    snapshot = snapshot_from(
        nodes, {}, pods, (Queue(QUEUE),), groups, time.time(), SchedulerConfig(), pod_groups=pod_groups
    )
    # The engine's own session, kept open to read the order it placed pods in
    # (Decisions lists binds by job and name): a later pod may rely on an
    # earlier one (pod affinity, topology spread), so kube-scheduler must see
    # the copies in that order.
    cluster = build_cluster(snapshot)
    decisions: Decisions = act(cluster, [], None)
    binds = {b.pod: b for b in decisions.binds}
    order: list[str] = []
    for task in cluster.touched:
        if task.spec.name in binds and task.spec.name not in order:
            order.append(task.spec.name)
    reasons = {}
    for status in decisions.pending:
        reasons[status.job.split("/", 1)[1]] = "; ".join(f"{r.code}: {r.message}" for r in status.reasons)
    tasks = {t.name: t for job in snapshot.jobs for t in job.tasks if t.status is TaskStatus.PENDING}
    return Verdict(binds, order, reasons, tasks, snapshot)


# --------------------------------------------------------------------------
# kube-scheduler's verdict on a copy
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    node: str | None
    message: str = ""


def copy_of(pod: JSON, name: str, *, widen: bool = False) -> JSON:
    """A copy of the generated pod for kube-scheduler.

    ``widen``: labelled anti-affinity namespace selectors read as gpuwarden
    reads them (every namespace).
    """
    meta = pod["metadata"]
    spec = copy.deepcopy(pod["spec"])
    spec["schedulerName"] = KUBE_SCHEDULER
    spec.pop("nodeName", None)
    if widen:
        anti = spec.get("affinity", {}).get("podAntiAffinity", {})
        for term in anti.get("requiredDuringSchedulingIgnoredDuringExecution", []):
            if term.get("namespaceSelector"):
                term["namespaceSelector"] = {}
    return {"metadata": {"name": name, "namespace": meta["namespace"], "labels": meta["labels"]}, "spec": spec}


def has_labelled_anti_namespace_selector(pod: JSON) -> bool:
    anti = pod["spec"].get("affinity", {}).get("podAntiAffinity", {})
    return any(t.get("namespaceSelector") for t in anti.get("requiredDuringSchedulingIgnoredDuringExecution", []))


class Judge:
    """Creates copies for kube-scheduler and reads what it did with them."""

    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self.count = 0

    def run(
        self, pod: JSON, *, nominate: str | None = None, widen: bool = False, keep: bool = False
    ) -> tuple[Outcome, str]:
        """kube-scheduler's verdict on a copy of ``pod`` (tried on ``nominate`` first when given), and its name."""
        self.count += 1
        body = copy_of(pod, f"{pod['metadata']['name']}-ks-{self.count}", widen=widen)
        name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
        if nominate is not None:
            body["spec"]["schedulingGates"] = [{"name": GATE}]
        self.core.create_namespaced_pod(namespace, body)
        try:
            if nominate is not None:
                self.core.patch_namespaced_pod_status(name, namespace, {"status": {"nominatedNodeName": nominate}})
                self.core.patch_namespaced_pod(name, namespace, [{"op": "remove", "path": "/spec/schedulingGates"}])
            outcome = wait_for(
                lambda: self._seen(name, namespace),
                timeout=VERDICT_TIMEOUT_S,
                interval=0.05,
                description=f"kube-scheduler's verdict on {namespace}/{name}",
            )
        finally:
            if not keep:
                self.delete(namespace, name)
        return outcome, name

    def _seen(self, name: str, namespace: str) -> Outcome | None:
        pod = self.core.read_namespaced_pod(name, namespace)
        if pod.spec.node_name:
            return Outcome(pod.spec.node_name)
        for condition in pod.status.conditions or []:
            if condition.type == "PodScheduled" and condition.status == "False" and condition.reason == "Unschedulable":
                return Outcome(None, condition.message or "")
        return None

    def delete(self, namespace: str, name: str) -> None:
        with contextlib.suppress(client.ApiException):
            self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        wait_for(lambda: not self._exists(name, namespace), timeout=30, interval=0.05, description=f"{name} deleted")

    def _exists(self, name: str, namespace: str) -> bool:
        try:
            self.core.read_namespaced_pod(name, namespace)
        except client.ApiException as err:
            if err.status == 404:
                return False
            raise
        return True


def _saw_every_node(outcome: Outcome, nodes: int) -> bool:
    """Whether an unschedulable verdict was reached over all ``nodes`` (not a cache still filling)."""
    match = _NODE_COUNT.match(outcome.message)
    return match is not None and int(match.group(1)) == nodes


# --------------------------------------------------------------------------
# The oracle
# --------------------------------------------------------------------------


@dataclass
class Tally:
    seeds: int = 0
    pods: int = 0
    bound_agreed: int = 0
    pending_agreed: int = 0
    session_binds: int = 0
    node_verdicts: int = 0
    stricter: dict[str, int] = field(default_factory=dict)
    disagreements: list[str] = field(default_factory=list)

    def strict(self, case: str) -> None:
        self.stricter[case] = self.stricter.get(case, 0) + 1


def _report(world: World, pod: JSON, what: str, verdict: Verdict, outcome: Outcome, *, extra: str = "") -> str:
    name = pod["metadata"]["name"]
    bind = verdict.binds.get(name)
    ours = f"bound to {bind.node}" if bind else f"not bound: {verdict.reasons.get(name, '?')}"
    theirs = f"scheduled onto {outcome.node}" if outcome.node else f"unschedulable: {outcome.message}"
    return (
        f"seed {world.seed}: {what}\n"
        f"  pod {_ident(pod)}: {_summary(pod)}\n"
        f"  gpuwarden: {ours}\n"
        f"  kube-scheduler: {theirs}{extra}\n"
        f"  cluster:\n{world.describe()}"
    )


def _pinned(judge: Judge, pod: JSON, node: str, *, keep: bool = False, tries: int = RETRIES) -> Outcome:
    """kube-scheduler's verdict with ``node`` nominated; a refusal is retried (its caches may lag).

    With ``keep`` a copy scheduled onto ``node`` stays, so later copies see it.
    """
    outcome = Outcome(None)
    for attempt in range(tries):
        outcome, name = judge.run(pod, nominate=node, keep=True)
        if outcome.node == node:
            if not keep:
                judge.delete(pod["metadata"]["namespace"], name)
            return outcome
        judge.delete(pod["metadata"]["namespace"], name)
        if attempt + 1 < tries:
            time.sleep(0.5)
    return outcome


def _unpinned(judge: Judge, pod: JSON, nodes: int, *, widen: bool) -> Outcome:
    """kube-scheduler's verdict on a free copy; an unschedulable verdict over fewer nodes than exist is retried."""
    outcome = Outcome(None)
    for _ in range(RETRIES):
        outcome, _ = judge.run(pod, widen=widen)
        if outcome.node is not None or _saw_every_node(outcome, nodes):
            return outcome
        time.sleep(0.5)
    return outcome


def _why_not(judge: Judge, pod: JSON, node: str) -> str:
    """kube-scheduler's message for a copy pinned to ``node`` by node selector (for the report only)."""
    pinned = copy.deepcopy(pod)
    pinned["spec"].setdefault("nodeSelector", {})[LABEL_HOSTNAME] = node
    outcome, _ = judge.run(pinned)
    return f"\n  kube-scheduler with nodeSelector {LABEL_HOSTNAME}={node}: {outcome.node or outcome.message}"


def gpuwarden_feasible(snapshot: Snapshot, pod: JSON) -> dict[str, str | None]:
    """Per node, why gpuwarden's rules refuse ``pod`` there (None: they accept it), from the engine's own checks.

    The static predicates and :func:`scheduler.engine.scoring.fits` (room
    and the rules that read the pods around), each node on its own: what a
    session consults before it picks among the nodes that pass.
    """
    cluster = build_cluster(snapshot)
    cluster.pod_index = None
    caches = SessionCaches()
    meta = pod["metadata"]
    task = next(
        t
        for job in cluster.jobs
        for t in job.tasks
        if t.spec.name == meta["name"] and t.spec.namespace == meta["namespace"]
    )
    out: dict[str, str | None] = {}
    for name, state in cluster.nodes.items():
        why = static_exclusion(state, task)
        if why is None and fits(cluster, caches, state, task) is None:
            rules = verdict_for(cluster, caches.rules, task) if needs_verdict(cluster, task) else None
            why = (rules.problem(state) if rules is not None else None) or "no room"
        out[name] = why
    return out


def check_each_node(judge: Judge, world: World, pod: JSON, verdict: Verdict, tally: Tally) -> None:
    """gpuwarden's verdict on every node against kube-scheduler's (a copy nominated to each node in turn).

    Much stronger than the pod's one decision: every node the pod's rules
    refuse or accept is compared, not only the one the session picked.
    """
    name = pod["metadata"]["name"]
    task = verdict.tasks.get(name)
    if task is None or task.unplaceable:
        return
    ours = gpuwarden_feasible(verdict.snapshot, pod)
    refused = {n.name for n in verdict.snapshot.nodes if not n.schedulable}
    widen = has_labelled_anti_namespace_selector(pod)
    for node, why in sorted(ours.items()):
        outcome, _ = judge.run(pod, nominate=node, widen=widen)
        if (outcome.node == node) == (why is None):
            tally.node_verdicts += 1
            continue
        if why is not None and node in refused:
            tally.node_verdicts += 1
            tally.strict("cordoned or not-Ready node")
            continue
        retried, _ = judge.run(pod, nominate=node, widen=widen)
        if (retried.node == node) == (why is None):
            tally.node_verdicts += 1
            continue
        theirs = "yes" if retried.node == node else "no"
        what = f"on node {node} gpuwarden's rules say {why or 'yes'}, kube-scheduler's {theirs}"
        tally.disagreements.append(_report(world, pod, what, verdict, retried))


def check_one(
    api: client.ApiClient, judge: Judge, world: World, pod: JSON, tally: Tally, *, each_node: bool = False
) -> None:
    """Create one pending pod, ask gpuwarden, then kube-scheduler; delete the pod afterwards."""
    core = client.CoreV1Api(api)
    name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
    core.create_namespaced_pod(namespace, pod)
    try:
        verdict = gpuwarden_decides(api, [pod], {})
        tally.pods += 1
        if each_node:
            check_each_node(judge, world, pod, verdict, tally)
        nodes = len(verdict.snapshot.nodes)
        bind = verdict.binds.get(name)
        if bind is not None:
            outcome = _pinned(judge, pod, bind.node)
            if outcome.node == bind.node:
                tally.bound_agreed += 1
            else:
                why = _why_not(judge, pod, bind.node)
                tally.disagreements.append(
                    _report(
                        world, pod, "gpuwarden bound it where kube-scheduler would not", verdict, outcome, extra=why
                    )
                )
            return
        task = verdict.tasks.get(name)
        if task is not None and task.unplaceable:
            outcome, _ = judge.run(pod)
            tally.strict("UnsupportedPlacement" + (" (kube-scheduler placed it)" if outcome.node else ""))
            return
        widen = has_labelled_anti_namespace_selector(pod)
        outcome = _unpinned(judge, pod, nodes, widen=widen)
        if outcome.node is None:
            tally.pending_agreed += 1
            if widen and judge.run(pod)[0].node is not None:
                tally.strict("anti-affinity namespaceSelector read as every namespace")
            return
        refused = {n.name for n in verdict.snapshot.nodes if not n.schedulable}
        if outcome.node in refused:
            # The documented case: the copy went to a cordoned or not-Ready
            # node it tolerates. Every node gpuwarden would use must refuse it.
            for node in sorted({n.name for n in verdict.snapshot.nodes} - refused):
                other = _pinned(judge, pod, node, tries=1)
                if other.node == node:
                    tally.disagreements.append(
                        _report(world, pod, "gpuwarden left it pending but it fits", verdict, other)
                    )
                    return
            tally.pending_agreed += 1
            tally.strict("cordoned or not-Ready node")
            return
        tally.disagreements.append(_report(world, pod, "gpuwarden left it pending but it fits", verdict, outcome))
    finally:
        with contextlib.suppress(client.ApiException):
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)


def check_session(api: client.ApiClient, judge: Judge, world: World, tally: Tally) -> None:
    """Several pods (and a gang) in one session: each bind, in the engine's order, against the copies before it."""
    rng = world.rng
    pods = [pending_pod(world, f"multi-{i}") for i in range(rng.randint(2, 4))]
    gangs: dict[str, tuple[str, int]] = {}
    if rng.random() < 0.85:
        size = rng.randint(2, 3)
        group = f"gang-{world.seed}"
        labels = {"app": rng.choice(APPS), "gang": group}
        namespace = rng.choice(world.namespaces)
        for i in range(size):
            member = pending_pod(world, f"{group}-{i}", labels=dict(labels))
            member["metadata"]["namespace"] = namespace
            affinity = member["spec"].setdefault("affinity", {})
            anti = affinity.setdefault("podAntiAffinity", {})
            anti.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(
                {"topologyKey": LABEL_HOSTNAME, "labelSelector": {"matchLabels": {"gang": group}}}
            )
            gangs[member["metadata"]["name"]] = (group, size)
            pods.append(member)
    core = client.CoreV1Api(api)
    for pod in pods:
        core.create_namespaced_pod(pod["metadata"]["namespace"], pod)
    verdict = gpuwarden_decides(api, pods, gangs)
    by_name = {p["metadata"]["name"]: p for p in pods}
    members = [n for n in gangs if n in verdict.binds]
    if gangs and members:
        hosts = [verdict.binds[n].node for n in members]
        if len(members) != len(gangs) or len(set(hosts)) != len(hosts):
            tally.disagreements.append(f"seed {world.seed}: gang bound partly or onto shared nodes: {hosts}")
    earlier: list[str] = []
    for name in verdict.order:
        pod = by_name[name]
        node = verdict.binds[name].node
        outcome = _pinned(judge, pod, node, keep=True)
        tally.session_binds += 1
        if outcome.node != node:
            before = "".join(f"\n  placed before it in the session: {line}" for line in earlier)
            what = "in one session gpuwarden bound it where kube-scheduler would not"
            tally.disagreements.append(_report(world, pod, what, verdict, outcome, extra=before))
        earlier.append(f"{_ident(pod)} on {node}: {_summary(pod)}")


def test_placement_rules_agree_with_kube_scheduler(
    k8s: client.ApiClient, kube_scheduler: ManagedProcess, request: pytest.FixtureRequest
) -> None:
    seeds = int(request.config.getoption("--placement-seeds"))
    first = int(request.config.getoption("--placement-first-seed"))
    judge = Judge(k8s)
    tally = Tally()
    began = time.monotonic()
    for seed in range(first, first + seeds):
        with seed_namespaces(k8s, seed) as namespaces:
            world = build_world(k8s, seed, namespaces)
            for i in range(world.rng.randint(5, 8)):
                pod = pending_pod(world, f"single-{i}")
                check_one(k8s, judge, world, pod, tally, each_node=i < EACH_NODE_PODS)
            check_session(k8s, judge, world, tally)
        tally.seeds += 1
        assert kube_scheduler.running(), kube_scheduler.log_tail()
    print(
        f"placement oracle: {tally.seeds} seeds, {tally.pods} pods one at a time "
        f"({tally.bound_agreed} bound and confirmed, {tally.pending_agreed} pending and confirmed), "
        f"{tally.session_binds} binds in multi-pod sessions, {tally.node_verdicts} node verdicts, "
        f"documented stricter cases {tally.stricter}, "
        f"{len(tally.disagreements)} disagreements, {time.monotonic() - began:.1f}s"
    )
    assert not tally.disagreements, "\n\n".join(tally.disagreements)
