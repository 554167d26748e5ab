"""The DRA stage on plain objects: inventory, the devices claims hold, pending pods' device sets and refusals."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from gpuwarden import contract
from scheduler.cluster.claims import ClaimStage, DraObjects, extended_classes, extended_requests, pod_claims
from scheduler.cluster.convert import pod_amounts
from scheduler.engine.backlog import BacklogMemo
from scheduler.engine.model import Gpu, Job, Node, Queue, QueueResource, Reservation, Snapshot, Task, TaskStatus
from scheduler.engine.session import run_session
from tests.scheduler.remediation.dra_objects import DEVICECLASSES, DriverGpu, driver_slice, mig_devices

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
        ({"name": "gpu", "exactly": {"deviceClassName": "mig.nvidia.com"}}, "no GPU or MIG device"),
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
    assert extended.requests == (("container-1-request-1", 1), ("container-2-request-0", 2))
    assert extended.mappings == (("a", "container-1-request-1"), ("b", "container-2-request-0"))
    assert extended.device_class == "gpu.nvidia.com"
    plan = stage.plans["uid-p"]
    assert plan.writes_on("n1") and not plan.writes_on("plugin")


def _container(name: str, gpus: int, *, sidecar: bool = False, cpu: bool = False) -> dict[str, Any]:
    requests = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    if cpu:
        requests["cpu"] = "1"
    out: dict[str, Any] = {"name": name, "resources": {"requests": requests}}
    if sidecar:
        out["restartPolicy"] = "Always"
    return out


def test_a_one_shot_init_container_reuses_the_devices_of_the_containers_after_it() -> None:
    """KEP-5004 as kube-scheduler builds the claim: the init container asks only what those after it leave short."""
    pod = {"spec": {"initContainers": [_container("ic0", 2)], "containers": [_container("c0", 1)]}}
    requests, mappings = extended_requests(pod, "nvidia.com/gpu")
    assert requests == (("container-0-request-0", 1), ("container-1-request-0", 1))
    assert mappings == (
        ("c0", "container-1-request-0"),
        ("ic0", "container-1-request-0"),
        ("ic0", "container-0-request-0"),
    )
    # Covered by the containers after it: no request of its own, mapped to theirs.
    pod = {"spec": {"initContainers": [_container("ic0", 2)], "containers": [_container("c0", 1), _container("c1", 4)]}}
    requests, mappings = extended_requests(pod, "nvidia.com/gpu")
    assert requests == (("container-1-request-0", 1), ("container-2-request-0", 4))
    assert mappings[2:] == (("ic0", "container-1-request-0"), ("ic0", "container-2-request-0"))


def test_one_shot_init_containers_share_the_largest_request_and_sidecars_run_beside_them() -> None:
    pod = {
        "spec": {
            "initContainers": [
                _container("a", 1),
                _container("side", 1, sidecar=True, cpu=True),
                _container("b", 3),
            ],
            "containers": [_container("main", 1)],
        }
    }
    requests, mappings = extended_requests(pod, "nvidia.com/gpu")
    # side: container 1, GPU its second request; b asks 3, main (after it) covers 1: b's own is 2.
    # a (index 0) reuses side and main (2 >= 1).
    assert requests == (("container-1-request-1", 1), ("container-2-request-0", 2), ("container-3-request-0", 1))
    assert mappings == (
        ("side", "container-1-request-1"),
        ("main", "container-3-request-0"),
        ("a", "container-1-request-1"),
        ("b", "container-3-request-0"),
        ("b", "container-2-request-0"),
    )


def test_init_containers_short_of_devices_are_all_mapped_to_the_largest_request() -> None:
    pod = {"spec": {"initContainers": [_container("a", 2), _container("b", 3)], "containers": [_container("c", 0)]}}
    requests, mappings = extended_requests(pod, "nvidia.com/gpu")
    assert requests == (("container-1-request-0", 3),)
    assert mappings == (("a", "container-1-request-0"), ("b", "container-1-request-0"))


_LAYOUT = st.lists(st.tuples(st.booleans(), st.integers(0, 4)), max_size=4)


@given(inits=_LAYOUT, containers=st.lists(st.integers(0, 4), max_size=3))
def test_the_claim_holds_the_pod_s_effective_request(inits: list[tuple[bool, int]], containers: list[int]) -> None:
    """What the engine places (the effective request) is what the claim asks for; every mapping is a request."""
    pod = {
        "metadata": {"name": "p"},
        "spec": {
            "initContainers": [_container(f"i{n}", g, sidecar=s) for n, (s, g) in enumerate(inits)],
            "containers": [_container(f"c{n}", g) for n, g in enumerate(containers)],
        },
    }
    requests, mappings = extended_requests(pod, "nvidia.com/gpu")
    assert sum(n for _, n in requests) == pod_amounts(pod["spec"], "ns/p")[2]
    names = {r for r, _ in requests}
    assert len(names) == len(requests) and {r for _, r in mappings} == names
    asking = {
        c["name"] for c in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]] if c["resources"]["requests"]
    }
    assert {c for c, _ in mappings} == asking


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


def _two_products() -> JSON:
    body = _slice()
    for i in (2, 3):
        body["spec"]["devices"][i]["attributes"]["productName"] = {"string": "NVIDIA A100-SXM4-80GB"}
    return body


def _product(name: str) -> list[JSON]:
    return [{"cel": {"expression": f"device.attributes['gpu.nvidia.com'].productName.startsWith('{name}')"}}]


def test_requests_are_matched_one_by_one_as_kube_scheduler_does() -> None:
    """One request for an H100, one for an A100: each gets its own, where one set for both would find none."""
    requests = [
        {"name": "h100", "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": _product("NVIDIA H100")}},
        {"name": "a100", "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": _product("NVIDIA A100")}},
    ]
    snapshot, stage = _run([_pod("p", {"gpu": "c"})], [_claim("c", requests)], [_two_products()])
    task = _task(snapshot, "p")
    assert task.gpus == 2 and task.devices is not None
    assert task.devices.nodes == {"n1": frozenset(range(4))}
    assert task.devices.choices == {"n1": (((1, frozenset({0, 1})), (1, frozenset({2, 3}))),)}
    (bind,) = run_session(snapshot).binds
    assert bind.gpu_indices == (0, 2)
    assert stage.plans["uid-p"].choices == task.devices.choices


def test_match_attribute_offers_every_group_that_can_hold_the_request() -> None:
    """Two products, two GPUs each: either pair will do; the engine takes the first free one (largest first)."""
    claim = _claim("c", [_request(2)], constraints=[{"matchAttribute": "gpu.nvidia.com/productName"}])
    snapshot, _ = _run([_pod("p", {"gpu": "c"})], [claim], [_two_products()])
    devices = _task(snapshot, "p").devices
    assert devices is not None
    assert devices.choices == {"n1": (((2, frozenset({0, 1})),), ((2, frozenset({2, 3})),))}
    # The H100s held by someone else's claim: the A100 pair.
    held = _claim("other", [_request(2)], allocation=_allocated("n1", "gpu-0", "gpu-1"))
    snapshot, _ = _run([_pod("p", {"gpu": "c"})], [claim, held], [_two_products()])
    (bind,) = [b for b in run_session(snapshot).binds if b.pod == "p"]
    assert bind.gpu_indices == (2, 3)


def test_a_constraint_binds_its_own_claim_s_requests_only() -> None:
    """Two claims, each wanting two GPUs of one product: H100s for one and A100s for the other will do."""
    constraint = [{"matchAttribute": "gpu.nvidia.com/productName"}]
    claims = [_claim(c, [_request(2)], constraints=constraint) for c in ("c1", "c2")]
    snapshot, _ = _run([_pod("p", {"a": "c1", "b": "c2"})], claims, [_two_products()])
    (bind,) = run_session(snapshot).binds
    assert bind.gpu_indices == (0, 1, 2, 3)
    # One request named by the constraint, one not: only the named one is bound to a product.
    requests = [_request(2), {**_request(1), "name": "free"}]
    partial = _claim("c", requests, constraints=[{"matchAttribute": "gpu.nvidia.com/productName", "requests": ["gpu"]}])
    snapshot, _ = _run([_pod("p", {"gpu": "c"})], [partial], [_two_products()])
    devices = _task(snapshot, "p").devices
    assert devices is not None
    assert devices.choices["n1"][0] == ((2, frozenset({0, 1})), (1, frozenset(range(4))))


def test_a_claim_allocated_for_a_pending_pod_keeps_its_devices_from_everyone_else() -> None:
    """A bind that wrote the claim but did not bind the pod (an undo that failed, a failover): the GPU stays taken.

    The pod is pinned to the claim's node and asks only for what is still to
    allocate; a bigger pod of higher priority is not given the claim's GPU.
    """
    mine = _claim("mine", [_request()], allocation=_allocated("n1", "gpu-0", reserved=("p",)))
    want = _claim("want", [_request(4)])
    snapshot, stage = _run([_pod("p", {"gpu": "mine"}), _pod("q", {"gpu": "want"})], [mine, want])
    snapshot = replace(snapshot, jobs=tuple(replace(j, priority=50) if j.name == "q" else j for j in snapshot.jobs))
    assert _task(snapshot, "p").gpus == 0
    binds = {b.pod: b for b in run_session(snapshot).binds}
    assert set(binds) == {"p"} and binds["p"].node == "n1" and binds["p"].gpu_indices == ()
    assert stage.plans["uid-p"].claims[0].done


def test_a_running_pod_s_extended_resource_claim_is_held_once_by_the_pod() -> None:
    """KEP-5004: the claim named in the pod's status is the pod's, not another scheduler's placeholder's."""
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "uid-p"},
        "spec": {
            "schedulerName": contract.SCHEDULER_NAME,
            "nodeName": "n1",
            "containers": [{"name": "a", "resources": {"requests": {"nvidia.com/gpu": "1"}}}],
        },
        "status": {"extendedResourceClaimStatus": {"resourceClaimName": "p-ext"}},
    }
    claim = _claim("p-ext", [_request()], owner="p", allocation=_allocated("n1", "gpu-2", reserved=("p",)))
    claim["metadata"]["annotations"] = {"resource.kubernetes.io/extended-resource-claim": "true"}
    task = Task(name="p", namespace="ns", uid="uid-p", gpus=1, status=TaskStatus.RUNNING, node="n1", gpu_indices=(0,))
    snapshot = Snapshot(
        nodes=(Node("n1", cpu_milli=64000, memory_mib=10**6),),
        queues=(Queue("q"),),
        jobs=(Job(name="p", queue="q", namespace="ns", tasks=(task,)),),
    )
    objects = DraObjects(
        pods={"uid-p": pod},
        claims={"ns/p-ext": claim},
        classes=CLASSES,
        slices={"s": _slice()},
        rules={},
        nodes={"n1": {"status": {"allocatable": {}}}},
    )
    out = ClaimStage().apply(snapshot, objects)
    assert [j.name for j in out.jobs] == ["p"], "no placeholder holds the pod's own claim"
    assert _task(out, "p").gpu_indices == (2,), "the allocation, not the annotation, says which GPU"


def test_an_unallocated_claim_two_pending_pods_share_is_allocated_for_one_and_the_other_waits() -> None:
    """As kube-scheduler: the claim is allocated once, for the first pod; the second is added to it after."""
    shared = _claim("shared", [_request(1)])
    snapshot, stage = _run([_pod("a", {"gpu": "shared"}), _pod("b", {"gpu": "shared"})], [shared])
    assert _task(snapshot, "a").gpus == 1 and not _task(snapshot, "a").unplaceable
    waiting = _task(snapshot, "b").unplaceable
    assert waiting is not None and "shared with pending pod ns/a" in waiting, waiting
    assert [b.pod for b in run_session(snapshot).binds] == ["a"]
    assert set(stage.plans) == {"uid-a"}
    # Once allocated for a (and a running), b is only added to the claim, on a's node, and takes no GPU of its own.
    allocated = _claim("shared", [_request(1)], allocation=_allocated("n1", "gpu-0", reserved=("a",)))
    snapshot, stage = _run([_pod("a", {"gpu": "shared"}, node="n1"), _pod("b", {"gpu": "shared"})], [allocated])
    b = _task(snapshot, "b")
    assert b.gpus == 0 and not b.unplaceable
    (claim,) = stage.plans["uid-b"].claims
    assert claim.reserve_only


def test_when_resource_claims_cannot_be_listed_nothing_is_allocated_and_the_pod_says_why() -> None:
    """A 403 on ResourceClaims (RBAC from an older release) must not read as "no device is held"."""
    pod = _pod("p", {"gpu": "c"})
    task = Task(name="p", namespace="ns", uid="uid-p")
    snapshot = Snapshot(
        nodes=(Node("n1", cpu_milli=64000, memory_mib=10**6),),
        queues=(Queue("q"),),
        jobs=(Job(name="p", queue="q", namespace="ns", tasks=(task,)),),
    )
    objects = DraObjects(
        pods={"uid-p": pod},
        claims={},
        classes=CLASSES,
        slices={"s": _slice()},
        rules={},
        claims_readable=False,
    )
    out = ClaimStage().apply(snapshot, objects)
    why = _task(out, "p").unplaceable
    assert why is not None and "ResourceClaims cannot be listed" in why, why
    assert run_session(out).binds == ()


def test_unchanged_nodes_are_not_read_again_for_their_device_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    """Which nodes have a device plugin is read once per Node version: a cycle with the same Nodes reads none."""
    import scheduler.cluster.claims as claims_module

    reads: list[str] = []
    original = claims_module._plugin_gpus

    def counting(node: Any) -> int:
        reads.append(node["metadata"]["name"])
        return original(node)

    monkeypatch.setattr(claims_module, "_plugin_gpus", counting)

    def node(name: str, gpus: int) -> JSON:
        allocatable = {contract.RESOURCE_NVIDIA_GPU: str(gpus)} if gpus else {}
        return {"metadata": {"name": name}, "status": {"allocatable": allocatable}}

    engine_nodes = tuple(Node(n, gpus=tuple(Gpu(i) for i in range(2))) for n in ("a", "b", "c"))
    raw = {"a": node("a", 2), "b": node("b", 0), "c": node("c", 0)}
    stage = ClaimStage()
    first = stage._plugin_nodes(engine_nodes, dict(raw))
    assert first == (frozenset({"b", "c"}), frozenset({"a"}), frozenset())
    assert sorted(reads) == ["a", "b", "c"]
    reads.clear()
    again = stage._plugin_nodes(engine_nodes, dict(raw))  # a new view of the same objects
    assert again == first and again[0] is first[0] and reads == []
    # One Node changes (its device plugin starts): only it is read again.
    raw["b"] = node("b", 2)
    changed = stage._plugin_nodes(engine_nodes, dict(raw))
    assert changed == (frozenset({"c"}), frozenset({"a", "b"}), frozenset()) and reads == ["b"]
    # A Node goes: the answer follows, nothing is read.
    reads.clear()
    del raw["c"]
    assert stage._plugin_nodes(engine_nodes[:2], dict(raw)) == (frozenset(), frozenset({"a", "b"}), frozenset())
    assert reads == []


# --------------------------------------------------------------------------
# MIG devices (static MIG, as the driver publishes it)
# --------------------------------------------------------------------------

MIG_LAYOUT = [("1g.5gb", 0), ("1g.5gb", 1), ("1g.5gb", 2), ("3g.20gb", 4)]


def _gpu_pod(name: str) -> JSON:
    """A pending pod of ours that asks for one nvidia.com/gpu, as users write it (a limit)."""
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": {
            "schedulerName": contract.SCHEDULER_NAME,
            "nodeName": "",
            "containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
    }


def _on_n1(tasks: list[Task], pods: dict[str, JSON], **objects: Any) -> Snapshot:
    """The claim stage's verdict on one node n1 and a job per task (``objects``: DraObjects' other fields)."""
    snapshot = Snapshot(
        nodes=(Node("n1", cpu_milli=64000, memory_mib=10**6),),
        queues=(Queue("q"),),
        jobs=tuple(Job(name=t.name, queue="q", namespace="ns", tasks=(t,)) for t in tasks),
    )
    return ClaimStage().apply(snapshot, DraObjects(pods=pods, **{"claims": {}, "rules": {}, **objects}))


def _mig_slice(node: str = "n1") -> JSON:
    """GPU 0 in MIG mode (three 1g.5gb and one 3g.20gb instance, not published whole), GPUs 1-3 whole."""
    body = driver_slice(node, "uid", GPUS[1:])
    body["metadata"]["name"] = f"slice-{node}"
    body["spec"]["devices"] = mig_devices(GPUS[0], MIG_LAYOUT) + body["spec"]["devices"]
    return body


def _mig_request(profile: str = "", count: int = 1) -> JSON:
    exactly: JSON = {"deviceClassName": "mig.nvidia.com", "count": count}
    if profile:
        exactly["selectors"] = [{"cel": {"expression": f"device.attributes['gpu.nvidia.com'].profile == '{profile}'"}}]
    return {"name": "gpu", "exactly": exactly}


def test_mig_devices_are_gpus_of_their_own_carved_from_a_parent_in_mig_mode() -> None:
    """The driver does not publish a GPU in MIG mode: its parent is made from its instances, which take nothing."""
    snapshot, _ = _run([], [], [_mig_slice()])
    (node,) = snapshot.nodes
    by_index = {g.index: g for g in node.gpus}
    assert sorted(by_index) == [0, 1, 2, 3, 1000, 1001, 1002, 1004]
    parent = by_index[0]
    assert parent.mig_enabled and parent.uuid == GPUS[0].uuid and parent.parent is None
    assert [(g.parent, g.memory_mib, g.milli_gpus) for g in (by_index[1000], by_index[1004])] == [
        (0, 4864, 142),  # 1g of the 7 compute slices, rounded down
        (0, 19968, 428),
    ]
    assert not any(by_index[i].mig_enabled for i in (1, 2, 3, 1000))
    # What the engine offers: three whole GPUs and the instances' shares, never the parent.
    decisions = run_session(snapshot)
    assert decisions.binds == ()


def test_a_mig_claim_takes_an_instance_its_selectors_allow_and_is_charged_its_share() -> None:
    snapshot, stage = _run([_pod("p", {"gpu": "c"})], [_claim("c", [_mig_request("1g.5gb")])], [_mig_slice()])
    task = _task(snapshot, "p")
    assert task.devices is not None and task.devices.nodes == {"n1": frozenset({1000, 1001, 1002})}
    assert (task.gpus, task.gpu_milli) == (1, 142)
    (bind,) = run_session(snapshot).binds
    assert bind.gpu_indices == (1000,)
    assert stage.plans["uid-p"].devices["n1"][1000] == ("n1", "gpu-0-mig-1g5gb-19-0")
    # The larger instance, by its profile; a request either may satisfy is charged the larger share.
    snapshot, _ = _run([_pod("p", {"gpu": "c"})], [_claim("c", [_mig_request("3g.20gb")])], [_mig_slice()])
    assert _task(snapshot, "p").devices.nodes == {"n1": frozenset({1004})}  # type: ignore[union-attr]
    snapshot, _ = _run([_pod("p", {"gpu": "c"})], [_claim("c", [_mig_request(count=2)])], [_mig_slice()])
    assert _task(snapshot, "p").gpu_milli == 2 * 428


def test_a_running_pod_and_a_foreign_claim_hold_their_mig_devices_and_are_charged_their_shares() -> None:
    mine = _claim("mine", [_mig_request()], allocation=_allocated("n1", "gpu-0-mig-3g20gb-9-4", reserved=("run",)))
    foreign = _claim(
        "foreign", [_mig_request()], allocation=_allocated("n1", "gpu-0-mig-1g5gb-19-1", reserved=("other",))
    )
    want = _claim("want", [_mig_request(count=2)])
    snapshot, _ = _run(
        [_pod("run", {"gpu": "mine"}, node="n1"), _pod("new", {"gpu": "want"})], [mine, foreign, want], [_mig_slice()]
    )
    running = _task(snapshot, "run")
    assert (running.gpu_indices, running.gpu_milli) == ((1004,), 428)
    (holder,) = [t for j in snapshot.jobs if j.name.startswith("external:claims:") for t in j.tasks]
    assert (holder.gpu_indices, holder.gpu_milli) == ((1001,), 142)
    (bind,) = run_session(snapshot).binds
    assert sorted(bind.gpu_indices) == [1000, 1002]


def test_whole_gpu_pods_never_take_a_mig_device() -> None:
    """nvidia.com/gpu through DRA (KEP-5004) and whole-GPU claims: the class selects whole GPUs only; when they are
    taken the pod waits, though MIG instances are free."""
    whole = [Task(name=f"w{i}", namespace="ns", uid=f"uid-w{i}", gpus=1) for i in range(4)]
    judged = _on_n1(
        whole,
        {t.uid: _gpu_pod(t.name) for t in whole},
        classes=CLASSES,
        slices={"s": _mig_slice()},
        nodes={"n1": {"status": {"allocatable": {}}}},
    )
    binds = run_session(judged).binds
    assert sorted(i for b in binds for i in b.gpu_indices) == [1, 2, 3]
    assert all(_task(judged, t.name).devices is not None for t in whole)


def test_on_a_node_with_a_device_plugin_mig_devices_are_not_offered() -> None:
    """There a device-plugin pod may take any free GPU of the engine's: MIG devices are left to kube-scheduler."""
    judged = _on_n1(
        [Task(name="p", namespace="ns", uid="uid-p")],
        {"uid-p": _pod("p", {"gpu": "c"})},
        claims={"ns/c": _claim("c", [_mig_request()])},
        classes=CLASSES,
        slices={"s": _mig_slice()},
        nodes={"n1": {"status": {"allocatable": {"nvidia.com/gpu": "3"}}}},
    )
    assert not any(g.parent is not None for g in judged.nodes[0].gpus)
    assert "MIG devices only on nodes without a device plugin" in _task(judged, "p").unplaceable


def test_a_mig_device_is_out_with_its_parent() -> None:
    """A fault of the GPU (the agent's GPUNode says it is unhealthy) takes its instances out of the engine's offer."""
    snapshot, _ = _run([_pod("p", {"gpu": "c"})], [_claim("c", [_mig_request("1g.5gb")])], [_mig_slice()])
    (node,) = snapshot.nodes
    sick = replace(node, gpus=tuple(replace(g, healthy=False) if g.index == 0 else g for g in node.gpus))
    assert run_session(replace(snapshot, nodes=(sick,))).binds == ()
    assert run_session(snapshot).binds != ()


@given(shares=st.lists(st.sampled_from([("1g.5gb", 1), ("3g.20gb", 4)]), min_size=1, max_size=5))
def test_the_instances_of_one_gpu_never_count_for_more_than_it(shares: list[tuple[str, int]]) -> None:
    layout, start = [], 0
    for profile, size in shares:
        if start + size > 8:
            break
        layout.append((profile, start))
        start += size
    body = _mig_slice()
    body["spec"]["devices"] = mig_devices(GPUS[0], layout)
    snapshot, _ = _run([], [], [body])
    assert sum(g.milli_gpus for g in snapshot.nodes[0].gpus if g.parent == 0) <= 1000


def test_partitionable_devices_are_never_offered_but_what_claims_hold_of_them_is_held() -> None:
    """The driver's dynamic MIG (KEP-4815 counters): the GPU and every placement consume one counter set."""
    body = driver_slice("n1", "uid", GPUS)
    body["metadata"]["name"] = "slice-n1"
    counters = [{"counterSet": "gpu-0-counter-set", "counters": {"memory-slice-0": {"value": "1"}}}]
    body["spec"]["devices"][0]["consumesCounters"] = counters
    (placement,) = mig_devices(GPUS[0], [("1g.5gb", 0)])
    del placement["attributes"]["uuid"]  # dynamic MIG devices have none
    placement["consumesCounters"] = counters
    body["spec"]["devices"].append(placement)
    held = _claim("held", [_mig_request()], allocation=_allocated("n1", placement["name"], reserved=("other",)))
    snapshot, _ = _run(
        [_pod("mig", {"gpu": "m"}), _pod("whole", {"gpu": "w"})],
        [_claim("m", [_mig_request()]), _claim("w", [_request(4)]), held],
        [body],
    )
    assert "no partitionable device" in _task(snapshot, "mig").unplaceable
    assert "no partitionable device" in _task(snapshot, "whole").unplaceable  # GPU 0 is not offered: 3 of 4
    (holder,) = [t for j in snapshot.jobs if j.name.startswith("external:claims:") for t in j.tasks]
    assert holder.gpu_indices == (0,)  # the placement holds its GPU


def _mig_world(entries: list[tuple[str, JSON, str, dict[str, Any]]]) -> Snapshot:
    """The MIG node with one pod per entry: (name, its claim, its node or '' pending, its job's fields)."""
    claims, pods, jobs = {}, {}, []
    for name, claim, node, fields in entries:
        claims[f"ns/{claim['metadata']['name']}"] = claim
        pods[f"uid-{name}"] = _pod(name, {"gpu": claim["metadata"]["name"]}, node=node)
        status = TaskStatus.RUNNING if node else TaskStatus.PENDING
        task = Task(name=name, namespace="ns", uid=f"uid-{name}", status=status, node=node or None)
        jobs.append(Job(name=name, queue="q", namespace="ns", tasks=(task,), **fields))
    snapshot = Snapshot(nodes=(Node("n1", cpu_milli=64000, memory_mib=10**6),), queues=(Queue("q"),), jobs=tuple(jobs))
    objects = DraObjects(pods=pods, claims=claims, classes=CLASSES, slices={"s": _mig_slice()}, rules={})
    return ClaimStage().apply(snapshot, objects)


def _held(name: str, device: str, profile: str = "") -> JSON:
    return _claim(f"c-{name}", [_mig_request(profile)], allocation=_allocated("n1", device, reserved=(name,)))


def test_preemption_frees_as_many_mig_devices_as_the_pod_needs() -> None:
    """The victim search counts only the devices the pod may take: free devices of another profile do not count."""
    low = {"priority": 1, "preemptible": True}
    entries = [(n, _held(n, f"gpu-0-mig-1g5gb-19-{k}"), "n1", low) for k, n in enumerate("abc")]
    busy = _claim("c-w", [_request(3)], allocation=_allocated("n1", "gpu-1", "gpu-2", "gpu-3", reserved=("w",)))
    entries.append(("w", busy, "n1", {"priority": 1000, "preemptible": False}))
    entries.append(("p", _claim("c-p", [_mig_request("1g.5gb", count=2)]), "", {"priority": 100}))
    decisions = run_session(_mig_world(entries))
    (bind,) = decisions.binds
    assert bind.pod == "p" and len(decisions.evictions) == 2


def test_a_running_pod_holding_devices_through_claims_is_not_moved_to_make_room() -> None:
    """Consolidation would re-place it on a whole GPU its recreated claim cannot take; the two would swap forever."""
    same = {"priority": 50, "preemptible": True}
    decisions = run_session(
        _mig_world(
            [
                ("y", _held("y", "gpu-0-mig-3g20gb-9-4"), "n1", same),
                ("p", _claim("c-p", [_mig_request("3g.20gb")]), "", same),
            ]
        )
    )
    assert decisions.binds == () and decisions.evictions == () and decisions.reservations == ()


def test_room_reserved_on_a_mig_device_is_charged_its_share() -> None:
    pods = [_pod(f"p{i}", {"gpu": f"c{i}"}) for i in range(2)]
    snapshot, _ = _run(pods, [_claim(f"c{i}", [_mig_request("1g.5gb")]) for i in range(2)], [_mig_slice()])
    limited = replace(
        snapshot,
        queues=(Queue("q", gpu=QueueResource(quota=1000, limit=1000)),),
        reservations=(Reservation(job="ns/p0", node="n1", gpu_indices=(1000,), expires=1e12),),
        now=0.0,
    )
    assert sorted(b.pod for b in run_session(limited).binds) == ["p0", "p1"]


def test_a_pod_whose_devices_appear_is_tried_again() -> None:
    """A remembered "no room" for pods of one claim shape does not outlive the device sets it was judged on."""
    held = _claim("held", [_mig_request()], allocation=_allocated("n2", "gpu-0-mig-3g20gb-9-4", reserved=("run",)))
    pods = {"uid-run": _pod("run", {"gpu": "held"}, node="n2"), "uid-p": _pod("p", {"gpu": "want"})}
    run = Task(name="run", namespace="ns", uid="uid-run", status=TaskStatus.RUNNING, node="n2")
    jobs = (
        Job(name="run", queue="q", namespace="ns", tasks=(run,), priority=1000, preemptible=False),
        Job(name="p", queue="q", namespace="ns", tasks=(Task(name="p", namespace="ns", uid="uid-p"),)),
    )
    nodes = tuple(Node(n, cpu_milli=64000, memory_mib=10**6) for n in ("n1", "n2"))
    snapshot = Snapshot(nodes=nodes, queues=(Queue("q"),), jobs=jobs)

    def world(n1_layout: list[tuple[str, int]]) -> dict[str, JSON]:
        out = {}
        for node, layout in (("n1", n1_layout), ("n2", [("3g.20gb", 4)])):
            body = driver_slice(node, "uid", GPUS[1:])
            body["metadata"]["name"] = f"slice-{node}"
            body["spec"]["devices"] = mig_devices(GPUS[0], layout, serial=len(layout)) + body["spec"]["devices"]
            out[node] = body
        return out

    stage, memo = ClaimStage(), BacklogMemo()
    claims = {"ns/held": held, "ns/want": _claim("want", [_mig_request("3g.20gb")])}
    objects = DraObjects(pods=pods, claims=claims, classes=CLASSES, slices=world([("1g.5gb", 0)]), rules={})
    assert run_session(stage.apply(snapshot, objects), memo=memo).binds == ()
    grown = replace(objects, slices=world([("1g.5gb", 0), ("3g.20gb", 4)]))
    (bind,) = run_session(stage.apply(snapshot, grown), memo=memo).binds
    assert (bind.node, bind.gpu_indices) == ("n1", (1004,))


def test_without_a_class_serving_nvidia_gpu_pods_stay_off_dra_only_nodes() -> None:
    """A node whose GPUs only its slice lists (no GPUNode, no device plugin): its kubelet would refuse such a pod."""
    classes = copy.deepcopy(CLASSES)
    del classes["gpu.nvidia.com"]["spec"]["extendedResourceName"]
    task = Task(name="p", namespace="ns", uid="uid-p", gpus=1)
    for body in (_mig_slice(), _slice()):
        judged = _on_n1(
            [task], {"uid-p": _gpu_pod("p")}, classes=classes, slices={"s": body}, nodes={"n1": {"status": {}}}
        )
        assert _task(judged, "p").devices is not None
        assert run_session(judged).binds == ()


def test_a_node_whose_device_plugin_hands_out_mig_devices_offers_none_through_claims() -> None:
    """The device plugin's mixed strategy advertises nvidia.com/mig-<profile>: the two must not hand out one device."""
    raw = {"n1": {"status": {"allocatable": {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.5gb": "3"}}}}
    judged = _on_n1([], {}, classes=CLASSES, slices={"s": _mig_slice()}, nodes=raw)
    assert not any(g.parent is not None for g in judged.nodes[0].gpus)
