"""What the remediation worker's device-taint sync costs at 5,000 nodes, beside reading every slice.

The worker syncs the DeviceTaintRules of the quarantined GPUs on every view
in which a Node, a GPUNode or a DRA object changed
(scheduler/remediation/devicetaints.py). Its inputs here: ``--nodes`` Nodes,
each with its GPUNode and the ResourceSlice NVIDIA's DRA driver publishes
for ``--gpus`` GPUs (tests/scheduler/remediation/dra_objects.py), and
``--quarantined`` nodes with one GPU quarantined, whose rules are already in
place (the steady state: the sync writes nothing). Printed, min and median
over ``--runs``, interleaved: the sync as the worker runs it (every Node's
annotations read, only the quarantined nodes' slices parsed), and the
baseline, the same wanted rules worked out from every slice of the cluster.
No API server: a sync that would write fails the run.

Run it: ``.venv/bin/python benchmarks/device_taints.py``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kubernetes import client

from gpuwarden import contract
from gpuwarden.dra import devices_by_node
from gpuwarden.kube import KubeApi
from scheduler.remediation.devicetaints import DeviceTaintPublisher, wanted_rules
from tests.scheduler.remediation.dra_objects import DriverGpu, driver_slice, gpunode_status

JSON = dict[str, Any]


def cluster(nodes: int, gpus: int, quarantined: int) -> tuple[dict[str, JSON], dict[str, JSON], dict[str, JSON]]:
    """Nodes (the first ``quarantined`` with GPU 3 out), their GPUNodes and the driver's slices."""
    node_objs: dict[str, JSON] = {}
    gpunodes: dict[str, JSON] = {}
    slices: dict[str, JSON] = {}
    for n in range(nodes):
        name = f"node-{n:05d}"
        annotations = {contract.ANNOTATION_QUARANTINED_GPUS: "3"} if n < quarantined else {}
        node_objs[name] = {"metadata": {"name": name, "annotations": annotations, "labels": {"pool": "a"}}}
        devices = [DriverGpu(i, i, f"GPU-{n:05d}-{i}", f"00000000:{16 + i:02X}:00.0") for i in range(gpus)]
        gpunodes[name] = {"metadata": {"name": name}, "status": {"gpus": gpunode_status(devices)}}
        slices[f"00000-gpu.nvidia.com-{name}-x"] = driver_slice(name, f"uid-{n}", devices)
    return node_objs, gpunodes, slices


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--quarantined", type=int, default=1, help="nodes with one GPU quarantined")
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    nodes, gpunodes, slices = cluster(args.nodes, args.gpus, args.quarantined)
    in_place = wanted_rules(nodes, gpunodes, devices_by_node(slices.values()))
    rules = {
        name: {**rule.body(), "metadata": {**rule.body()["metadata"], "resourceVersion": "1"}}
        for name, rule in in_place.items()
    }
    publisher = DeviceTaintPublisher(KubeApi(client.ApiClient(), field_manager=contract.SCHEDULER_COMPONENT))
    timings: dict[str, list[float]] = {"sync": [], "every slice": []}
    for _ in range(args.runs):
        began = time.perf_counter()
        report = publisher.sync(nodes, gpunodes, slices, rules)
        timings["sync"].append(time.perf_counter() - began)
        assert report is not None and not (report.created or report.replaced or report.deleted or report.errors)
        began = time.perf_counter()
        baseline = wanted_rules(nodes, gpunodes, devices_by_node(slices.values()))
        timings["every slice"].append(time.perf_counter() - began)
        assert baseline.keys() == in_place.keys()
    print(
        f"{args.nodes} nodes x {args.gpus} DRA GPUs, {args.quarantined} quarantined "
        f"({len(rules)} DeviceTaintRules in place), {args.runs} runs"
    )
    for label, values in timings.items():
        print(f"  {label:<12} min {min(values) * 1000:8.2f} ms   median {statistics.median(values) * 1000:8.2f} ms")


if __name__ == "__main__":
    main()
