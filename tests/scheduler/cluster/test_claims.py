"""The DRA stage on plain objects: inventory, the devices claims hold, pending pods' device sets and refusals."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest
import yaml

from gpuwarden import contract
from scheduler.cluster.claims import ClaimStage, DraObjects, extended_classes, pod_claims
from scheduler.engine.model import Gpu, Job, Node, Queue, Snapshot, Task, TaskStatus
from scheduler.engine.session import run_session
from tests.scheduler.remediation.dra_objects import DEVICECLASSES, DriverGpu, driver_slice

JSON = dict[str, Any]
GPUS = [DriverGpu(i, i, f"GPU-{i:08d}-aaaa-bbbb-cccc-dddddddddddd", f"00000000:{0x18 + i:02X}:00.0") for i in range(4)]
CLASSES = {c["metadata"]["name"]: c for c in yaml.safe_load_all(DEVICECLASSES.read_text()) if c}


def _slice(node: str = "n1", taints: dict[int, JSON] | None = None) -> JSON:
    body = driver_slice(node, "uid", GPUS)
    body["metadata"]["name"] = f"slice-{node}"
    for i, taint in (taints or {}).items():
        body["spec"]["devices"][i]["taints"] = [taint]
    return body


def _claim(name: str, requests: list[JSON], *, owner: str = "", allocation: JSON | None = None, **devices: Any) -> JSON:
    meta: JSON = {"name": name, "namespace": "ns", "uid": f"claim-{name}", "resourceVersion": "1"}
    if owner:
        meta["ownerReferences"] = [{"kind": "Pod", "name": owner, "uid": f"uid-{owner}", "controller": True}]
    claim: JSON = {"metadata": meta, "spec": {"devices": {"requests": requests, **devices}}}
    if allocation is not None:
        claim["status"] = {"allocation": allocation, "reservedFor": allocation.pop("_reserved", [])}
    return claim


def _request(count: int = 1, **exactly: Any) -> JSON:
    return {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": count, **exactly}}


def _pod(name: str, claims: dict[str, str], *, node: str = "") -> JSON:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": {
            "schedulerName": contract.SCHEDULER_NAME,
            "nodeName": node,
            "resourceClaims": [{"name": k, "resourceClaimName": v} for k, v in claims.items()],
        },
    }


def _allocated(node: str, *devices: str, reserved: tuple[str, ...] = ()) -> JSON:
    return {
        "devices": {
            "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": d} for d in devices]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
        },
        "_reserved": [{"resource": "pods", "name": r, "uid": f"uid-{r}"} for r in reserved],
    }


def _run(pods: list[JSON], claims: list[JSON], slices: list[JSON] | None = None) -> tuple[Snapshot, ClaimStage]:
    tasks = []
    for pod in pods:
        node = pod["spec"]["nodeName"] or None
        tasks.append(
            Task(
                name=pod["metadata"]["name"],
                namespace="ns",
                uid=pod["metadata"]["uid"],
                status=TaskStatus.RUNNING if node else TaskStatus.PENDING,
                node=node,
            )
        )
    jobs = tuple(Job(name=t.name, queue="q", namespace="ns", tasks=(t,)) for t in tasks)
    snapshot = Snapshot(nodes=(Node("n1", cpu_milli=64000, memory_mib=10**6),), queues=(Queue("q"),), jobs=jobs)
    stage = ClaimStage()
    objects = DraObjects(
        pods={p["metadata"]["uid"]: p for p in pods},
        claims={f"ns/{c['metadata']['name']}": c for c in claims},
        classes=CLASSES,
        slices={s["metadata"]["name"]: s for s in (slices if slices is not None else [_slice()])},
        rules={},
    )
    return stage.apply(snapshot, objects), stage


def _task(snapshot: Snapshot, name: str) -> Task:
    return next(t for j in snapshot.jobs for t in j.tasks if t.name == name)


def test_a_node_with_only_dra_gpus_gets_them_indexed_by_the_driver_s_minor_numbers() -> None:
    snapshot, _ = _run([], [])
    (node,) = snapshot.nodes
    assert [(g.index, g.uuid, g.memory_mib) for g in node.gpus] == [(i, GPUS[i].uuid, 81559) for i in range(4)]


def test_devices_of_claims_no_pod_of_ours_holds_are_held_and_ours_hold_their_own() -> None:
    foreign = _claim("foreign", [_request()], allocation=_allocated("n1", "gpu-2", reserved=("someone",)))
    mine = _claim("mine", [_request()], allocation=_allocated("n1", "gpu-0", reserved=("run",)))
    want = _claim("want", [_request(2)])
    snapshot, stage = _run(
        [_pod("run", {"gpu": "mine"}, node="n1"), _pod("new", {"gpu": "want"})], [foreign, mine, want]
    )
    assert _task(snapshot, "run").gpu_indices == (0,)
    holders = [j for j in snapshot.jobs if j.name.startswith("external:claims:")]
    assert [(t.name, t.gpu_indices) for j in holders for t in j.tasks] == [("claim:ns/foreign", (2,))]
    pending = _task(snapshot, "new")
    assert pending.gpus == 2 and pending.devices is not None and pending.devices.nodes == {"n1": frozenset(range(4))}
    (bind,) = run_session(snapshot).binds
    assert sorted(bind.gpu_indices) == [1, 3]
    plan = stage.plans["uid-new"]
    assert plan.devices["n1"][1] == ("n1", "gpu-1")


def test_a_shared_claim_allocated_already_pins_its_next_pod_to_the_node_and_takes_no_more_gpus() -> None:
    shared = _claim("shared", [_request()], allocation=_allocated("n1", "gpu-1", reserved=("first",)))
    snapshot, stage = _run([_pod("first", {"gpu": "shared"}, node="n1"), _pod("second", {"gpu": "shared"})], [shared])
    second = _task(snapshot, "second")
    assert second.gpus == 0
    assert second.placement is not None and second.placement.volume_terms
    (claim,) = stage.plans["uid-second"].claims
    assert claim.reserve_only and not claim.done


@pytest.mark.parametrize(
    ("request_", "said"),
    [
        ({"name": "gpu", "firstAvailable": [{"name": "a", "deviceClassName": "gpu.nvidia.com"}]}, "firstAvailable"),
        (_request(allocationMode="All"), "allocationMode All"),
        (_request(adminAccess=True), "admin access"),
        (
            {"name": "gpu", "exactly": {"deviceClassName": "nosuch.example.com"}},
            "deviceclass 'nosuch.example.com' not found",
        ),
        ({"name": "gpu", "exactly": {"deviceClassName": "mig.nvidia.com"}}, "no whole GPU"),
        (_request(0), "not a positive integer"),
    ],
)
def test_what_gpuwarden_does_not_allocate_is_refused_with_the_reason(request_: JSON, said: str) -> None:
    snapshot, stage = _run([_pod("p", {"gpu": "c"})], [_claim("c", [request_])])
    task = _task(snapshot, "p")
    assert said in task.unplaceable, task.unplaceable
    assert "uid-p" not in stage.plans


def test_a_template_s_claim_not_made_yet_or_made_for_another_pod_waits() -> None:
    pod = _pod("p", {})
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "t"}]
    snapshot, _ = _run([pod], [])
    assert "resourceclaim controller" in _task(snapshot, "p").unplaceable
    made = copy.deepcopy(pod)
    made["status"] = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x"}]}
    snapshot, _ = _run([made], [_claim("p-gpu-x", [_request()], owner="other")])
    assert "not created for this pod" in _task(snapshot, "p").unplaceable
    snapshot, _ = _run([made], [_claim("p-gpu-x", [_request()], owner="p")])
    assert _task(snapshot, "p").gpus == 1
    assert pod_claims(made) == [("gpu", "p-gpu-x", "t")]


def test_tainted_devices_are_left_out_unless_the_request_tolerates_the_taint() -> None:
    xid = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
    snapshot, _ = _run([_pod("p", {"gpu": "c"})], [_claim("c", [_request()])], [_slice(taints={0: xid})])
    devices = _task(snapshot, "p").devices
    assert devices is not None and devices.nodes == {"n1": frozenset({1, 2, 3})}
    tolerant = _request(tolerations=[{"key": "gpu.nvidia.com/xid", "operator": "Exists"}])
    snapshot, _ = _run([_pod("p", {"gpu": "c"})], [_claim("c", [tolerant])], [_slice(taints={0: xid})])
    devices = _task(snapshot, "p").devices
    assert devices is not None and devices.nodes == {"n1": frozenset(range(4))}


def test_match_attribute_allows_only_devices_that_share_the_value() -> None:
    body = _slice()
    body["spec"]["devices"][3]["attributes"]["productName"] = {"string": "NVIDIA A100-SXM4-80GB"}
    claim = _claim("c", [_request(2)], constraints=[{"matchAttribute": "gpu.nvidia.com/productName"}])
    snapshot, _ = _run([_pod("p", {"gpu": "c"})], [claim], [body])
    devices = _task(snapshot, "p").devices
    assert devices is not None and devices.nodes == {"n1": frozenset({0, 1, 2})}


def _class(name: str, created: str, resource: str = "") -> JSON:
    spec: JSON = {"selectors": []}
    if resource:
        spec["extendedResourceName"] = resource
    return {"metadata": {"name": name, "creationTimestamp": created}, "spec": spec}


def test_the_class_serving_an_extended_resource_is_the_newest_then_the_first_by_name() -> None:
    classes = {
        "old.example.com": _class("old.example.com", "2026-01-01T00:00:00Z", "nvidia.com/gpu"),
        "b.example.com": _class("b.example.com", "2026-06-01T00:00:00Z", "nvidia.com/gpu"),
        "a.example.com": _class("a.example.com", "2026-06-01T00:00:00Z", "nvidia.com/gpu"),
        "plain.example.com": _class("plain.example.com", "2026-09-01T00:00:00Z"),
    }
    mapping = extended_classes(classes)
    assert mapping["nvidia.com/gpu"] == "a.example.com"
    # Every class also serves its implicit name.
    assert mapping["deviceclass.resource.kubernetes.io/plain.example.com"] == "plain.example.com"


def test_nvidia_gpu_pods_take_any_gpu_on_plugin_nodes_and_the_class_s_devices_on_dra_nodes() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "uid-p"},
        "spec": {
            "schedulerName": contract.SCHEDULER_NAME,
            "nodeName": "",
            "initContainers": [{"name": "setup", "resources": {"requests": {"cpu": "1"}}}],
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"}}},
                {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
            ],
        },
    }
    task = Task(name="p", namespace="ns", uid="uid-p", gpus=3)
    plugin = Node("plugin", cpu_milli=64000, memory_mib=10**6, gpus=tuple(Gpu(i) for i in range(8)))
    dra = Node("n1", cpu_milli=64000, memory_mib=10**6)
    snapshot = Snapshot(
        nodes=(plugin, dra), queues=(Queue("q"),), jobs=(Job(name="p", queue="q", namespace="ns", tasks=(task,)),)
    )
    stage = ClaimStage()
    raw_nodes = {
        "plugin": {"status": {"allocatable": {"nvidia.com/gpu": "8"}}},
        "n1": {"status": {"allocatable": {"nvidia.com/gpu": "0"}}},
    }
    objects = DraObjects(
        pods={"uid-p": pod}, claims={}, classes=CLASSES, slices={"s": _slice()}, rules={}, nodes=raw_nodes
    )
    judged = stage.apply(snapshot, objects)
    devices = _task(judged, "p").devices
    assert devices is not None
    assert devices.plain == frozenset({"plugin"}) and devices.nodes == {"n1": frozenset(range(4))}
    extended = stage.plans["uid-p"].extended
    assert extended is not None
    # Init container first (index 0); a's requests in name order: cpu, nvidia.com/gpu; b's only one.
    assert extended.requests == (("a", "container-1-request-1", 1), ("b", "container-2-request-0", 2))
    assert extended.device_class == "gpu.nvidia.com"
    plan = stage.plans["uid-p"]
    assert plan.writes_on("n1") and not plan.writes_on("plugin")


def test_without_a_class_serving_nvidia_gpu_whole_gpu_pods_stay_off_nodes_without_a_device_plugin() -> None:
    """A GPUNode lists the node's GPUs, but a kubelet without the plugin would refuse the pod: never bound there."""
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "uid-p"},
        "spec": {"schedulerName": contract.SCHEDULER_NAME, "nodeName": "", "containers": []},
    }
    task = Task(name="p", namespace="ns", uid="uid-p", gpus=1)
    pluginless = Node("bare", cpu_milli=64000, memory_mib=10**6, gpus=tuple(Gpu(i) for i in range(8)))
    plugin = Node("plugin", cpu_milli=64000, memory_mib=10**6, gpus=tuple(Gpu(i) for i in range(8)))
    snapshot = Snapshot(
        nodes=(pluginless, plugin),
        queues=(Queue("q"),),
        jobs=(Job(name="p", queue="q", namespace="ns", tasks=(task,)),),
    )
    raw = {
        "bare": {"status": {"allocatable": {"nvidia.com/gpu": "0"}}},
        "plugin": {"status": {"allocatable": {"nvidia.com/gpu": "8"}}},
    }
    stage = ClaimStage()
    judged = stage.apply(
        snapshot, DraObjects(pods={"uid-p": pod}, claims={}, classes={}, slices={}, rules={}, nodes=raw)
    )
    (bind,) = run_session(judged).binds
    assert bind.node == "plugin"
    assert "uid-p" not in stage.plans
    # With the plugin's node full, the pod waits rather than go where its kubelet would refuse it.
    full = replace(judged, nodes=(pluginless, replace(plugin, gpus=())))
    waiting = run_session(full)
    assert waiting.binds == ()
    assert "no device plugin serves nvidia.com/gpu" in waiting.pending[0].reasons[0].message
