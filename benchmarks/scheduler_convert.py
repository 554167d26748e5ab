"""Time turning watched objects (raw JSON dicts) into the engine's Snapshot.

5,000 nodes x 8 GPUs (a Node and a GPUNode each, in the agent's format, a
few of them with GPU faults) and 150,000 pods: gangs of 8 running with
their GPU assignment annotation, 10 % pending, CPU-only pods, and two
DaemonSet pods of another scheduler per node. Objects are built once, as
``json.loads`` would hand them over, and only :func:`snapshot_from` is
timed, three runs; the script prints each run and the minimum and median.
Target: well under 10 s.

Run: ``python benchmarks/scheduler_convert.py [--nodes N] [--pods N] [--runs N] [--gc]``
(``--gc`` keeps the cyclic garbage collector running while timing; by
default it is paused, as a session pauses it).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time
from typing import Any

from gpuwarden.contract import (
    ANNOTATION_GPU_ASSIGNMENT,
    ANNOTATION_POD_GROUP,
    LABEL_NODE_POOL,
    LABEL_QUEUE,
    RESOURCE_NVIDIA_GPU,
    SCHEDULER_NAME,
    ConditionType,
)
from scheduler.cluster.convert import GroupInfo, snapshot_from
from scheduler.engine.model import UNLIMITED, Queue, QueueResource, SchedulerConfig

GPUS = 8
GANG = 8


def node_objects(i: int, rng: random.Random) -> tuple[dict[str, Any], dict[str, Any]]:
    name = f"gpu-node-{i:05d}"
    sick = rng.random() < 0.01
    conditions: list[dict[str, Any]] = [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"},
        {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory", "message": "ok"},
    ]
    for ctype in ConditionType:
        conditions.append(
            {"type": ctype.value, "status": "False", "reason": "Healthy", "message": "fine",
             "lastTransitionTime": "2026-11-29T10:00:00Z", "lastHeartbeatTime": "2026-11-29T10:00:00Z"}
        )  # fmt: skip
    gpus = []
    for g in range(GPUS):
        bad = sick and g == 2
        gpus.append(
            {"index": g, "uuid": f"GPU-{i:05d}-{g:02d}-0000-0000", "pciBusId": f"00000000:{0x18 + g:02X}:00.0",
             "model": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559, "migMode": "Disabled", "healthy": not bad,
             "faults": [{"condition": "GpuXidError", "reason": "Xid48", "message": "XID 48", "action": "RESET_GPU",
                         "since": "2026-11-29T10:00:00Z", "latched": True}] if bad else []}
        )  # fmt: skip
    if sick:
        conditions[2] = {
            "type": "GpuXidError", "status": "True", "reason": "Xid48",
            "message": f"GPU 2 (GPU-{i:05d}-02-0000-0000, 00000000:1A:00.0): XID 48 (fatal), double-bit ECC error. "
            "Recommended action: RESET_GPU.",
        }  # fmt: skip
    node = {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1",
                     "labels": {"kubernetes.io/hostname": name, LABEL_NODE_POOL: f"pool-{i % 4}",
                                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
        "spec": {"providerID": f"aws:///{name}"},
        "status": {
            "capacity": {"cpu": "192", "memory": "2097152Mi", "pods": "110", RESOURCE_NVIDIA_GPU: "8"},
            "allocatable": {"cpu": "191450m", "memory": "2063512Mi", "pods": "110", RESOURCE_NVIDIA_GPU: "8",
                            "gpuwarden.io/gpu-memory": str(81559 * 8)},
            "conditions": conditions,
        },
    }  # fmt: skip
    gpunode = {
        "apiVersion": "gpuwarden.io/v1alpha1", "kind": "GPUNode",
        "metadata": {"name": name},
        "status": {"gpuCount": GPUS, "healthyGpuCount": GPUS - sick, "action": "RESET_GPU" if sick else "NONE",
                   "probeErrors": [], "gpus": gpus, "ibPorts": [], "nodeFaults": []},
    }  # fmt: skip
    return node, gpunode


def pod(name: str, namespace: str, *, scheduler: str, node: str | None, gpus: int, cpu: str, memory: str,
        group: str | None, assignment: str | None, queue: str) -> dict[str, Any]:  # fmt: skip
    annotations = {"kubectl.kubernetes.io/default-container": "main"}
    if group:
        annotations[ANNOTATION_POD_GROUP] = group
    if assignment:
        annotations[ANNOTATION_GPU_ASSIGNMENT] = assignment
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}}
    if gpus:
        resources["requests"][RESOURCE_NVIDIA_GPU] = str(gpus)
        resources["limits"][RESOURCE_NVIDIA_GPU] = str(gpus)
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [{"name": "main", "image": "registry.example/train:1", "resources": resources,
                        "env": [{"name": "RANK", "value": "0"}]}],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                         "tolerationSeconds": 300}],
        "priorityClassName": "train",
    }  # fmt: skip
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}",
                     "creationTimestamp": "2026-11-29T09:00:00Z", "labels": {LABEL_QUEUE: queue},
                     "annotations": annotations},
        "spec": spec,
        "status": {"phase": "Running" if node else "Pending"},
    }  # fmt: skip


def build(n_nodes: int, n_pods: int, seed: int) -> tuple[Any, ...]:
    rng = random.Random(seed)
    nodes: dict[str, Any] = {}
    gpunodes: dict[str, Any] = {}
    for i in range(n_nodes):
        node, gpunode = node_objects(i, rng)
        nodes[node["metadata"]["name"]] = node
        gpunodes[node["metadata"]["name"]] = gpunode
    names = list(nodes)
    pods: list[dict[str, Any]] = []
    groups: dict[tuple[str, str], GroupInfo] = {}
    queues = [
        Queue(f"team-{q}", node_pool=f"pool-{q % 4}", gpu=QueueResource(1000 * 1000, UNLIMITED),
              cpu=QueueResource(UNLIMITED, UNLIMITED), memory=QueueResource(UNLIMITED, UNLIMITED))
        for q in range(40)
    ]  # fmt: skip
    for node in names:  # two DaemonSet pods of another scheduler on every node
        for ds in ("dcgm-exporter", "node-exporter"):
            pods.append(pod(f"{ds}-{node}", "monitoring", scheduler="default-scheduler", node=node, gpus=0,
                            cpu="100m", memory="128Mi", group=None, assignment=None, queue=""))  # fmt: skip
    slot = 0
    g = 0
    while len(pods) < n_pods:
        queue = f"team-{g % 40}"
        namespace = f"ns-{g % 40}"
        group = f"pg-{g:06d}"
        groups[(namespace, group)] = GroupInfo(queue=queue, min_member=GANG, priority=50)
        kind = rng.random()
        for k in range(GANG):
            name = f"{group}-{k}"
            if kind < 0.1:  # pending gang
                pods.append(pod(name, namespace, scheduler=SCHEDULER_NAME, node=None, gpus=1, cpu="8",
                                memory="64Gi", group=group, assignment=None, queue=queue))  # fmt: skip
            elif kind < 0.3:  # CPU-only
                node = names[rng.randrange(len(names))]
                pods.append(pod(name, namespace, scheduler=SCHEDULER_NAME, node=node, gpus=0, cpu="500m",
                                memory="2Gi", group=group, assignment=None, queue=queue))  # fmt: skip
            else:  # running, one GPU each, with its assignment
                node = names[(slot // GPUS) % len(names)]
                index = slot % GPUS
                slot += 1
                text = json.dumps({"gpus": [{"index": index, "memoryMiB": 81559, "uuid": f"GPU-{index}"}],
                                   "node": node}, sort_keys=True, separators=(",", ":"))  # fmt: skip
                pods.append(pod(name, namespace, scheduler=SCHEDULER_NAME, node=node, gpus=1, cpu="4",
                                memory="32Gi", group=group, assignment=text, queue=queue))  # fmt: skip
            if len(pods) >= n_pods:
                break
        g += 1
    # Hand the objects over as the API server would: fresh dicts from JSON.
    return (json.loads(json.dumps(nodes)), json.loads(json.dumps(gpunodes)), json.loads(json.dumps(pods)),
            queues, groups)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--gc", action="store_true", help="keep the garbage collector running while timing")
    args = parser.parse_args()
    nodes, gpunodes, pods, queues, groups = build(args.nodes, args.pods, args.seed)
    config = SchedulerConfig()
    times: list[float] = []
    snapshot = None
    for run in range(args.runs):
        snapshot = None
        gc.collect()
        if not args.gc:
            gc.disable()
        start = time.perf_counter()
        snapshot = snapshot_from(nodes, gpunodes, pods, queues, groups, 1_800_000_000.0, config)
        elapsed = time.perf_counter() - start
        gc.enable()
        times.append(elapsed)
        print(f"run {run + 1}: {elapsed:.3f} s")
    assert snapshot is not None
    tasks = sum(len(j.tasks) for j in snapshot.jobs)
    print(
        f"{len(nodes)} nodes, {len(pods)} pods -> {len(snapshot.nodes)} nodes, {len(snapshot.jobs)} jobs, "
        f"{tasks} tasks, {len(snapshot.queues)} queues"
    )
    collector = "on" if args.gc else "paused"
    print(f"snapshot_from: min {min(times):.3f} s, median {statistics.median(times):.3f} s (gc {collector})")


if __name__ == "__main__":
    main()
