"""gpuwarden's DRA allocation against the upstream kube-scheduler's, on random devices and claims.

gpuwarden promises three things about a ResourceClaim on a node where
nothing else holds a device: it allocates nothing where kube-scheduler finds
no allocation, it allocates where kube-scheduler does (its requests are
matched one by one, and each group of devices a ``matchAttribute``
constraint allows is tried, as upstream) unless a selector fails on some
device (gpuwarden evaluates every device, so the error always aborts the
allocation; kube-scheduler meets it only on the devices its search
visits), and every allocation it writes satisfies every selector and
constraint of the claim. This test checks all
three against the kube-scheduler binary ``make controlplane`` builds, per
seed (``--dra-seeds N``, default 20):

- three DRA-only nodes with the same ResourceSlice (NVIDIA's driver's
  shape, ``dra_objects``, with random products, memory, driver versions, a
  NUMA attribute on some devices and the driver's XID taint on some; some
  GPUs in MIG mode, published as their instances);
- one random claim spec: one or two requests of the driver's classes (whole GPUs or MIG devices), counts
  1-3, CEL selectors over attributes, capacity (quantities), versions
  (semver) and the sets extension, sometimes one that fails on a device, sometimes a toleration,
  sometimes a ``matchAttribute`` constraint;
- kube-scheduler allocates it for a pod pinned to node K; gpuwarden's cycle
  for a pod of its own with only node G in view;
- where gpuwarden allocated, the allocation is checked by pinning: the same
  claim, each request narrowed to the UUIDs gpuwarden gave it, for a pod of
  kube-scheduler's pinned to node P. kube-scheduler must allocate it, which
  it does only if those devices satisfy every selector, taint and
  constraint.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from gpuwarden import contract
from gpuwarden.kube import KubeApi
from gpuwarden.localcluster import LABEL_HOSTNAME, ManagedProcess, create_gpu_node
from scheduler.cluster.bind import Binder
from scheduler.cluster.cycle import SchedulingCycle
from tests.harness import ControlPlane, unique_name
from tests.harness import kube_scheduler as start_kube_scheduler
from tests.scheduler.cluster.kube_objects import podgroup
from tests.scheduler.cluster.test_claims_k8s import DRA, dra_view
from tests.scheduler.cluster.test_cycle_k8s import NO_WAIT, podgroup_status
from tests.scheduler.remediation.dra_objects import DRIVER, DriverGpu, mig_devices
from tests.waiting import wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.usefixtures("scheduler_crds", "gpunode_crd")]

JSON = dict[str, Any]
PRODUCTS = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB")
MEMORY = ("40Gi", "80Gi", "81559Mi")
DRIVER_VERSIONS = ("535.161.8", "550.54.15", "580.82.7")
XID = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
VERDICT_TIMEOUT_S = 60.0


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "dra_seed" in metafunc.fixturenames:
        count = int(metafunc.config.getoption("--dra-seeds"))
        metafunc.parametrize("dra_seed", range(count))


@pytest.fixture(scope="module")
def kube_scheduler(control_plane: ControlPlane) -> Iterator[ManagedProcess]:
    with start_kube_scheduler(control_plane, "kube-scheduler-dra-oracle", "--v=1") as proc:
        yield proc


def _raw(response: Any) -> Any:
    return json.loads(response.data)


# --------------------------------------------------------------------------
# Random devices and claims
# --------------------------------------------------------------------------


def _devices(rng: random.Random) -> list[JSON]:
    out = []
    for minor in range(rng.randint(2, 6)):
        attributes: JSON = {
            "type": {"string": "gpu"},
            "uuid": {"string": f"GPU-{rng.getrandbits(32):08x}-0000-0000-0000-{minor:012d}"},
            "productName": {"string": rng.choice(PRODUCTS)},
            "driverVersion": {"version": rng.choice(DRIVER_VERSIONS)},
            "resource.kubernetes.io/pciBusID": {"string": f"0000:{0x18 + minor:02x}:00.0"},
        }
        if rng.random() < 0.8:
            attributes["numa"] = {"int": rng.randint(0, 1)}
        device: JSON = {
            "name": f"gpu-{minor}",
            "attributes": attributes,
            "capacity": {"memory": {"value": rng.choice(MEMORY)}},
        }
        if rng.random() < 0.4:
            # In MIG mode: the driver publishes the GPU's instances, not the GPU.
            parent = DriverGpu(minor, minor, attributes["uuid"]["string"], f"00000000:{0x18 + minor:02X}:00.0")
            for instance in mig_devices(parent, _mig_layout(rng), serial=rng.getrandbits(16)):
                instance["attributes"].update({k: v for k, v in attributes.items() if k not in ("type", "uuid")})
                if rng.random() < 0.2:
                    instance["taints"] = [dict(XID)]
                out.append(instance)
            continue
        if rng.random() < 0.2:
            device["taints"] = [dict(XID)]
        out.append(device)
    return out


def _mig_layout(rng: random.Random) -> list[tuple[str, int]]:
    """Instances an A100 can hold at once: 1g.5gb at any of starts 0-6, or 3g.20gb at 4 and 1g.5gb below it."""
    big = rng.random() < 0.5
    starts = rng.sample(range(4 if big else 7), rng.randint(1, 3))
    return [("1g.5gb", s) for s in sorted(starts)] + ([("3g.20gb", 4)] if big else [])


def _selector(rng: random.Random) -> str:
    a = 'device.attributes["gpu.nvidia.com"]'
    return rng.choice(
        (
            f'{a}.productName == "{rng.choice(PRODUCTS)}"',
            f'{a}.productName.startsWith("NVIDIA H")',
            f'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("{rng.choice(("48Gi", "80Gi"))}")) >= 0',
            f'{a}.driverVersion.isGreaterThan(semver("{rng.choice(DRIVER_VERSIONS)}"))',
            f"{a}.driverVersion.major() >= 550",
            f"sets.contains({sorted(rng.sample(PRODUCTS, rng.randint(1, 2)))}, [{a}.productName])",
            f"sets.intersects([{a}.driverVersion.major(), 0], [{rng.choice((550, 570, 580))}, 1])",
            f'"numa" in {a} && {a}.numa == {rng.randint(0, 1)}',
            f'{a}.type == "mig" && {a}.profile == "{rng.choice(("1g.5gb", "3g.20gb"))}"',
            # CEL's bindings extension: the value read only where the body reads the name (no error
            # on a device without the attribute), nested and shadowing.
            f'cel.bind(n, {a}.numa, "numa" in {a} && n == {rng.randint(0, 1)})',
            f'cel.bind(d, {a}, cel.bind(d, d.productName, d.startsWith("NVIDIA H")) && d.driverVersion.major() >= 550)',
            # Fails on a device without the attribute: an error for both, never "does not match".
            f"{a}.numa == {rng.randint(0, 1)}",
        )
    )


def _claim_spec(rng: random.Random) -> JSON:
    requests = []
    for i in range(rng.choice((1, 1, 2))):
        exactly: JSON = {
            "deviceClassName": rng.choice(("gpu.nvidia.com", "mig.nvidia.com")),
            "count": rng.choice((1, 1, 2, 3)),
        }
        if rng.random() < 0.7:
            exactly["selectors"] = [{"cel": {"expression": _selector(rng)}} for _ in range(rng.randint(1, 2))]
        if rng.random() < 0.15:
            exactly["tolerations"] = [{"key": XID["key"], "operator": "Exists", "effect": "NoSchedule"}]
        requests.append({"name": f"r{i}", "exactly": exactly})
    devices: JSON = {"requests": requests}
    if rng.random() < 0.25:
        devices["constraints"] = [{"matchAttribute": rng.choice(("gpu.nvidia.com/productName", "gpu.nvidia.com/numa"))}]
    return {"devices": devices}


# --------------------------------------------------------------------------
# The cluster
# --------------------------------------------------------------------------


def _node(k8s: client.ApiClient, devices: list[JSON], made: list[tuple[str, str]]) -> str:
    name = unique_name("dra-oracle")
    node = create_gpu_node(k8s, name, gpus=0)
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"00000-{DRIVER}-{name}-"},
        "spec": {
            "driver": DRIVER,
            "nodeName": name,
            "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
            "devices": json.loads(json.dumps(devices)),
        },
    }
    body["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node.metadata.uid, "controller": True}
    ]
    made.append(
        (
            name,
            client.CustomObjectsApi(k8s).create_cluster_custom_object(*DRA, "resourceslices", body)["metadata"]["name"],
        )
    )
    return name


def _claim(k8s: client.ApiClient, namespace: str, spec: JSON) -> str:
    name = unique_name("c")
    client.CustomObjectsApi(k8s).create_namespaced_custom_object(
        *DRA,
        namespace,
        "resourceclaims",
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name}, "spec": spec},
    )
    return name


def _pod(k8s: client.ApiClient, namespace: str, claim: str, *, scheduler: str, node: str = "", group: str = "") -> str:
    name = unique_name("p")
    spec: JSON = {
        "schedulerName": scheduler,
        "resourceClaims": [{"name": "gpus", "resourceClaimName": claim}],
        "containers": [
            {
                "name": "main",
                "image": "registry.invalid/x:1",
                "resources": {"requests": {"cpu": "100m"}, "claims": [{"name": "gpus"}]},
            }
        ],
    }
    if node:
        spec["nodeSelector"] = {LABEL_HOSTNAME: node}
    meta: JSON = {"name": name}
    if group:
        meta["annotations"] = {contract.ANNOTATION_POD_GROUP: group}
    client.CoreV1Api(k8s).create_namespaced_pod(namespace, {"metadata": meta, "spec": spec})
    return name


def _results(k8s: client.ApiClient, namespace: str, claim: str) -> list[JSON] | None:
    obj = client.CustomObjectsApi(k8s).get_namespaced_custom_object(*DRA, namespace, "resourceclaims", claim)
    allocation = (obj.get("status") or {}).get("allocation")
    return None if not allocation else list(allocation["devices"]["results"])


def _unschedulable(k8s: client.ApiClient, namespace: str, pod: str) -> str:
    status = _raw(client.CoreV1Api(k8s).read_namespaced_pod(pod, namespace, _preload_content=False)).get("status") or {}
    for condition in status.get("conditions") or ():
        # Unschedulable, or SchedulerError: a selector kube-scheduler could not evaluate.
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return f"{condition.get('reason')}: {condition.get('message')}"
    return ""


def _kube_verdict(k8s: client.ApiClient, namespace: str, claim: str, pod: str) -> list[JSON] | str:
    """kube-scheduler's allocation of ``claim`` for ``pod``, or why it found none."""

    def decided() -> list[JSON] | str | None:
        found = _results(k8s, namespace, claim)
        if found is not None:
            return found
        return _unschedulable(k8s, namespace, pod) or None

    verdict = wait_for(decided, timeout=VERDICT_TIMEOUT_S, interval=0.2, description="kube-scheduler's verdict")
    assert verdict is not None
    return verdict


@pytest.fixture
def world(k8s: client.ApiClient, namespace: str) -> Iterator[list[tuple[str, str]]]:
    made: list[tuple[str, str]] = []
    yield made
    custom = client.CustomObjectsApi(k8s)
    for claim in custom.list_namespaced_custom_object(*DRA, namespace, "resourceclaims")["items"]:
        with contextlib.suppress(client.ApiException):
            custom.patch_namespaced_custom_object(
                *DRA, namespace, "resourceclaims", claim["metadata"]["name"], {"metadata": {"finalizers": None}}
            )
    for node, slice_name in made:
        with contextlib.suppress(client.ApiException):
            custom.delete_cluster_custom_object(*DRA, "resourceslices", slice_name)
        with contextlib.suppress(client.ApiException):
            client.CoreV1Api(k8s).delete_node(node)


@pytest.mark.usefixtures("kube_scheduler", "device_classes")
def test_dra_allocation_agrees_with_kube_scheduler(
    k8s: client.ApiClient,
    namespace: str,
    queue: Callable[..., str],
    world: list[tuple[str, str]],
    dra_seed: int,
) -> None:
    rng = random.Random(f"dra-oracle-{dra_seed}")
    devices = _devices(rng)
    spec = _claim_spec(rng)
    kube_node, ours, pinned = (_node(k8s, devices, world) for _ in range(3))
    report = f"seed {dra_seed}\ndevices {json.dumps(devices, sort_keys=True)}\nclaim {json.dumps(spec, sort_keys=True)}"

    kube_claim = _claim(k8s, namespace, spec)
    kube_pod = _pod(k8s, namespace, kube_claim, scheduler="default-scheduler", node=kube_node)
    kube = _kube_verdict(k8s, namespace, kube_claim, kube_pod)

    q = queue(64)
    group = unique_name("g")
    podgroup(k8s, namespace, group, q, 1)
    our_claim = _claim(k8s, namespace, spec)
    _pod(k8s, namespace, our_claim, scheduler=contract.SCHEDULER_NAME, group=group)
    api = KubeApi(k8s, field_manager=contract.SCHEDULER_COMPONENT)
    SchedulingCycle(api, binder=Binder(api, retry=NO_WAIT)).run(dra_view(k8s, {ours}))
    given = _results(k8s, namespace, our_claim)

    if isinstance(kube, str):
        assert given is None, f"kube-scheduler found no allocation ({kube}); gpuwarden gave {given}\n{report}"
        return
    if given is None:
        # The one way gpuwarden may refuse where kube-scheduler allocates: a selector that fails
        # on some device. gpuwarden evaluates every device, so the error aborts the allocation
        # wherever it is; kube-scheduler's search stops at the first allocation it finds and
        # meets the error only on a device it visits.
        (condition,) = podgroup_status(k8s, namespace, group)["conditions"]
        assert "failed on this device" in condition["message"], (
            f"kube-scheduler allocated {kube}; gpuwarden allocated nothing: {condition['message']}\n{report}"
        )
        return
    # Pin: each request narrowed to the UUIDs gpuwarden gave it, on a third copy of the node.
    uuid_of = {d["name"]: d["attributes"]["uuid"]["string"] for d in devices}
    check = json.loads(json.dumps(spec))
    for request in check["devices"]["requests"]:
        chosen = sorted(uuid_of[r["device"]] for r in given if r["request"] == request["name"])
        assert len(chosen) == request["exactly"]["count"], f"request {request['name']} got {chosen}\n{report}"
        listed = ", ".join(f'"{u}"' for u in chosen)
        request["exactly"].setdefault("selectors", []).append(
            {"cel": {"expression": f'device.attributes["gpu.nvidia.com"].uuid in [{listed}]'}}
        )
    pin_claim = _claim(k8s, namespace, check)
    pin_pod = _pod(k8s, namespace, pin_claim, scheduler="default-scheduler", node=pinned)
    pinned_verdict = _kube_verdict(k8s, namespace, pin_claim, pin_pod)
    assert not isinstance(pinned_verdict, str), (
        f"gpuwarden's allocation {given} does not satisfy the claim by kube-scheduler: {pinned_verdict}\n{report}"
    )


# --------------------------------------------------------------------------
# KEP-5004: the claim made for nvidia.com/gpu, with init containers and sidecars
# --------------------------------------------------------------------------


def _extended_pod_spec(rng: random.Random) -> JSON:
    """Random init containers (one-shot and sidecars) and containers, some asking for nvidia.com/gpu."""

    def container(name: str, *, sidecar: bool = False) -> JSON:
        requests: JSON = {}
        if rng.random() < 0.7:
            requests[contract.RESOURCE_NVIDIA_GPU] = str(rng.randint(1, 3))
        if rng.random() < 0.5:
            requests["cpu"] = "100m"
        if rng.random() < 0.3:
            requests["memory"] = "64Mi"
        out: JSON = {"name": name, "image": "registry.invalid/x:1", "resources": {"requests": requests}}
        if contract.RESOURCE_NVIDIA_GPU in requests:
            # An extended resource needs its limit; users often write only that, which the API
            # server copies into the request.
            out["resources"]["limits"] = {contract.RESOURCE_NVIDIA_GPU: requests[contract.RESOURCE_NVIDIA_GPU]}
            if rng.random() < 0.5:
                del requests[contract.RESOURCE_NVIDIA_GPU]
        if sidecar:
            out["restartPolicy"] = "Always"
        return out

    inits = [container(f"init-{i}", sidecar=rng.random() < 0.4) for i in range(rng.randint(0, 3))]
    containers = [container(f"main-{i}") for i in range(rng.randint(1, 2))]
    return {"initContainers": inits, "containers": containers}


def _gpu_pod(
    k8s: client.ApiClient, namespace: str, spec: JSON, *, scheduler: str, node: str = "", group: str = ""
) -> str:
    name = unique_name("p")
    body: JSON = {"schedulerName": scheduler, **json.loads(json.dumps(spec))}
    if node:
        body["nodeSelector"] = {LABEL_HOSTNAME: node}
    meta: JSON = {"name": name}
    if group:
        meta["annotations"] = {contract.ANNOTATION_POD_GROUP: group}
    client.CoreV1Api(k8s).create_namespaced_pod(namespace, {"metadata": meta, "spec": body})
    return name


def _extended_claim(k8s: client.ApiClient, namespace: str, pod: str) -> tuple[list[JSON], list[JSON]] | None:
    """The requests of the claim made for ``pod``'s extended resources and its mappings; None until written."""
    status = _raw(client.CoreV1Api(k8s).read_namespaced_pod(pod, namespace, _preload_content=False)).get("status")
    extended = (status or {}).get("extendedResourceClaimStatus")
    if not extended:
        return None
    claim = client.CustomObjectsApi(k8s).get_namespaced_custom_object(
        *DRA, namespace, "resourceclaims", extended["resourceClaimName"]
    )
    return claim["spec"]["devices"]["requests"], extended["requestMappings"]


@pytest.mark.usefixtures("kube_scheduler", "device_classes")
def test_the_claim_for_nvidia_gpu_is_the_one_kube_scheduler_makes(
    k8s: client.ApiClient,
    namespace: str,
    queue: Callable[..., str],
    world: list[tuple[str, str]],
    dra_seed: int,
) -> None:
    """Init containers, sidecars and containers asking for nvidia.com/gpu on a DRA node: the same claim."""
    rng = random.Random(f"dra-extended-{dra_seed}")
    spec = _extended_pod_spec(rng)
    devices = [
        {
            "name": f"gpu-{minor}",
            "attributes": {
                "type": {"string": "gpu"},
                "uuid": {"string": f"GPU-{rng.getrandbits(32):08x}-0000-0000-0000-{minor:012d}"},
                "productName": {"string": PRODUCTS[0]},
            },
            "capacity": {"memory": {"value": "80Gi"}},
        }
        for minor in range(8)
    ]
    kube_node, ours = (_node(k8s, devices, world) for _ in range(2))
    report = f"seed {dra_seed}\npod {json.dumps(spec, sort_keys=True)}"
    asks = any("limits" in c["resources"] for c in [*spec["initContainers"], *spec["containers"]])

    kube_pod = _gpu_pod(k8s, namespace, spec, scheduler="default-scheduler", node=kube_node)
    q = queue(64)
    group = unique_name("g")
    podgroup(k8s, namespace, group, q, 1)
    our_pod = _gpu_pod(k8s, namespace, spec, scheduler=contract.SCHEDULER_NAME, group=group)
    api = KubeApi(k8s, field_manager=contract.SCHEDULER_COMPONENT)
    SchedulingCycle(api, binder=Binder(api, retry=NO_WAIT)).run(dra_view(k8s, {ours}))

    def bound(pod: str) -> str | None:
        got = _raw(client.CoreV1Api(k8s).read_namespaced_pod(pod, namespace, _preload_content=False))
        return got["spec"].get("nodeName") or _unschedulable(k8s, namespace, pod) or None

    verdict = wait_for(lambda: bound(kube_pod), timeout=VERDICT_TIMEOUT_S, interval=0.2)
    if verdict != kube_node:
        # More GPUs than the node has (the sidecars' and the containers' together): neither binds.
        assert verdict is not None and verdict.startswith("Unschedulable"), f"{verdict}\n{report}"
        node = _raw(client.CoreV1Api(k8s).read_namespaced_pod(our_pod, namespace, _preload_content=False))
        assert not node["spec"].get("nodeName"), report
        assert _extended_claim(k8s, namespace, our_pod) is None, report
        return
    assert bound(our_pod) == ours, report
    kube = _extended_claim(k8s, namespace, kube_pod)
    given = _extended_claim(k8s, namespace, our_pod)
    if not asks:
        assert kube is None and given is None, report
        return
    assert kube is not None and given is not None, report
    assert given == kube, f"kube-scheduler made {kube}; gpuwarden {given}\n{report}"
