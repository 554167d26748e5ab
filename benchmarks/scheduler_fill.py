"""How fast schedulers fill an empty GPU cluster: gpuwarden beside the upstream kube-scheduler.

Against the real API server (the test control plane: etcd, kube-apiserver,
kube-controller-manager) with ``--nodes`` fake nodes of 8 GPUs, each contender
binds ``--pods`` single-GPU pods, and a watch on the pods timestamps the moment
the last one gets its ``spec.nodeName``. Contenders:

* ``gpuwarden``: ``gpuwarden scheduler`` as its own process, as deployed;
* ``kube-scheduler``: the upstream scheduler built from the same Kubernetes
  module as the API server, with its defaults (a client rate limit of 50
  requests per second);
* ``kube-scheduler-tuned``: the same with ``--kube-api-qps=1000
  --kube-api-burst=2000``;
* ``bare-N``: N threads of this process that bind the pods through
  pods/binding with no scheduling at all, the ceiling of the machine.

Two workloads, each in a fresh namespace:

* ``created``: the scheduler runs (a canary pod it bound proves it ready)
  while a pool of threads creates the pods as fast as the API server takes
  them; timed from the first create to the last bind. Pod creation bounds this,
  so its rate is printed too.
* ``backlog``: the pods are created first, with no scheduler running; timed
  from starting the scheduler (process start, cache sync and all) to the
  last bind. The bare binders run only here.

The contenders are interleaved (each run visits all of them, in a rotated
order) and each figure is printed as min and median over ``--runs``, in pods
per second, with the ratios the target is judged by: gpuwarden over the tuned
kube-scheduler, and gpuwarden's backlog over the best bare binder. Every run
also checks that no node got more pods than it has GPUs.

The fake nodes are Ready, with the not-ready taint lifted; no node-lifecycle
controller runs, so none is tainted during the run. Each carries the GPUNode an
agent would publish (8 healthy GPUs), so gpuwarden sees its GPUs in service.
gpuwarden's pods are bare pods in a queue whose GPU quota covers them all, so
each gets a derived PodGroup, as a user's bare pods would.

Run it (not part of ``make test``; at the defaults about 7 minutes per run)::

    make controlplane   # builds the kube-scheduler too
    .venv/bin/python benchmarks/scheduler_fill.py [--runs 3] [--nodes 500] [--pods 4000]
    .venv/bin/python benchmarks/scheduler_fill.py --quick   # a smoke run: 10 nodes, 60 pods, one run

``--dra`` runs the same on DRA nodes, as the GPU Operator's DRA mode leaves
them: no device plugin (``nvidia.com/gpu`` 0) and no GPUNode, each node's
8 GPUs in the ResourceSlice NVIDIA's DRA driver publishes, its
DeviceClasses installed. Each pod takes one GPU through a claim of a
ResourceClaimTemplate, which kube-controller-manager's resourceclaim
controller (run for the whole benchmark) makes for it; the scheduler
allocates the claim and binds. The bare binders do not run (a bind without
an allocation is not a DRA bind), and every run counts as over-filled each
device allocated twice and each pod bound without an allocated claim.

``--profile DIR`` runs gpuwarden's scheduler under cProfile and leaves one
profile per run there; ``KUBE_SCHEDULER`` names a kube-scheduler binary to
use instead of the one beside kube-apiserver.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kubernetes import client  # noqa: E402

from gpuwarden import contract  # noqa: E402
from gpuwarden.logconfig import configure_logging  # noqa: E402
from tests.harness import (  # noqa: E402  # noqa: E402
    ControlPlane,
    ManagedProcess,
    create_gpu_node,
    find_binaries,
    free_ports,
    running_control_plane,
    unique_name,
)

GPUS_PER_NODE = 8
CREATE_THREADS = 16
SETUP_THREADS = 16
WORKLOADS = ("created", "backlog")
LEASE_NAMESPACE = "gpuwarden"
# A scheduler that binds nothing for this long is stuck (or too slow to measure).
STALL_TIMEOUT_S = 120.0
CANARY = "canary"
# Watches end after this and are resumed, so a stopped watch thread never lingers.
WATCH_TIMEOUT_S = 30


# ---------------------------------------------------------------------------
# Contenders and results
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Contender:
    """One way of binding the pods: a scheduler process, or bare binds from N threads."""

    name: str
    kind: str  # "gpuwarden", "kube-scheduler" or "bare"
    args: tuple[str, ...] = ()
    threads: int = 0

    @property
    def scheduler_name(self) -> str:
        """The schedulerName its pods carry; the bare binders' pods name a scheduler nobody runs."""
        if self.kind == "gpuwarden":
            return contract.SCHEDULER_NAME
        if self.kind == "kube-scheduler":
            return "default-scheduler"
        return "nobody"


def contenders(bare_threads: Sequence[int]) -> list[Contender]:
    return [
        Contender("gpuwarden", "gpuwarden"),
        Contender("kube-scheduler", "kube-scheduler"),
        Contender("kube-scheduler-tuned", "kube-scheduler", ("--kube-api-qps=1000", "--kube-api-burst=2000")),
        *(Contender(f"bare-{n}", "bare", threads=n) for n in bare_threads),
    ]


@dataclass(frozen=True, slots=True)
class Outcome:
    """One timed run: how long until the last pod was bound, and whether any node was over-filled."""

    contender: str
    workload: str
    pods: int
    seconds: float
    bound: int
    overfilled_nodes: int
    create_seconds: float | None = None

    @property
    def rate(self) -> float:
        return self.bound / self.seconds if self.seconds > 0 else 0.0


# ---------------------------------------------------------------------------
# Watching the binds
# ---------------------------------------------------------------------------


class BindWatch:
    """A watch on one namespace's pods that notes when each first shows a ``spec.nodeName``.

    The stream is read by hand (JSON lines, decoded as they arrive), so a
    timestamp is the time the event reached this process, not the time some
    client library got round to it.
    """

    def __init__(self, plane: ControlPlane, namespace: str, prefix: str) -> None:
        # A client of its own: the stream holds its connection, which must
        # never go back to a pool other requests draw from.
        self._api = plane.api_client()
        self._core = client.CoreV1Api(self._api)
        self.namespace = namespace
        self._prefix = prefix
        self._lock = threading.Condition()
        self.created: set[str] = set()
        self.bound: dict[str, tuple[str, float]] = {}
        self.last_progress = time.monotonic()
        self._stop = threading.Event()
        self._resp: Any = None
        listed = self._core.list_namespaced_pod(namespace, limit=1)
        self._version: str = listed.metadata.resource_version
        self._thread = threading.Thread(target=self._run, name="bind-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):
                resp.shutdown()  # unblocks the read in the watch thread
        self._thread.join(timeout=WATCH_TIMEOUT_S + 5)
        self._api.close()

    def wait(self, predicate: Callable[[], bool], what: str, stall_s: float = STALL_TIMEOUT_S) -> None:
        """Wait until ``predicate`` holds (under the lock); fail when nothing changed for ``stall_s``."""
        with self._lock:
            while not predicate():
                if time.monotonic() - self.last_progress > stall_s:
                    raise TimeoutError(
                        f"{what}: nothing new for {stall_s:.0f} s "
                        f"({len(self.created)} pods seen, {len(self.bound)} bound)"
                    )
                self._lock.wait(1.0)

    def last_bind(self, names: Sequence[str]) -> float:
        with self._lock:
            return max(self.bound[n][1] for n in names)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._stream()
            except Exception:
                if self._stop.is_set():
                    return
                time.sleep(0.2)

    def _stream(self) -> None:
        resp: Any = self._core.list_namespaced_pod(
            self.namespace,
            watch=True,
            resource_version=self._version,
            timeout_seconds=WATCH_TIMEOUT_S,
            _preload_content=False,
        )
        self._resp = resp
        buffer = b""
        for chunk in resp.stream(65536, decode_content=False):
            now = time.monotonic()
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.strip():
                    self._handle(json.loads(line), now)
            if self._stop.is_set():
                break
        resp.release_conn()

    def _handle(self, event: dict[str, Any], now: float) -> None:
        obj = event.get("object") or {}
        if event.get("type") == "ERROR":
            # The version expired (it does not while we watch, but be safe):
            # resume from the current state, which a fresh list gives.
            self._version = self._core.list_namespaced_pod(self.namespace, limit=1).metadata.resource_version
            raise RuntimeError("watch expired")
        meta = obj.get("metadata") or {}
        name = meta.get("name") or ""
        self._version = meta.get("resourceVersion") or self._version
        if event.get("type") == "DELETED" or not name.startswith(self._prefix):
            return
        node = (obj.get("spec") or {}).get("nodeName")
        with self._lock:
            changed = False
            if name not in self.created:
                self.created.add(name)
                changed = True
            if node and name not in self.bound:
                self.bound[name] = (node, now)
                changed = True
            if changed:
                self.last_progress = now
                self._lock.notify_all()

    def overfilled_nodes(self, gpus: int) -> int:
        with self._lock:
            per_node: dict[str, int] = {}
            for name, (node, _) in self.bound.items():
                if not name.endswith(CANARY):  # it takes no GPU
                    per_node[node] = per_node.get(node, 0) + 1
        return sum(1 for n in per_node.values() if n > gpus)


# ---------------------------------------------------------------------------
# The cluster
# ---------------------------------------------------------------------------


def make_client(plane: ControlPlane, pool: int) -> client.ApiClient:
    """An admin client whose connection pool fits ``pool`` threads (the default holds a few)."""
    config = plane.configuration()
    config.connection_pool_maxsize = max(pool, 4)
    return client.ApiClient(config)


def make_nodes(api: client.ApiClient, count: int, dra: bool = False) -> list[str]:
    """Ready GPU nodes, each with the GPUNode and conditions its agent would publish.

    With ``dra``, DRA-only nodes: no device plugin, no GPUNode, the driver's slice.
    """
    from tests.scheduler.cluster.kube_objects import publish_health
    from tests.scheduler.remediation.dra_objects import DriverGpu, driver_slice

    names = [f"fill-node-{i:04d}" for i in range(count)]

    def one(name: str) -> None:
        if dra:
            node = create_gpu_node(api, name, gpus=0)
            gpus = [
                DriverGpu(
                    i, i, f"GPU-{abs(hash(name)) % 10**8:08d}-0000-0000-0000-{i:012d}", f"00000000:{0x18 + i:02X}:00.0"
                )
                for i in range(GPUS_PER_NODE)
            ]
            client.CustomObjectsApi(api).create_cluster_custom_object(
                "resource.k8s.io", "v1", "resourceslices", driver_slice(name, node.metadata.uid, gpus)
            )
            return
        create_gpu_node(api, name, gpus=GPUS_PER_NODE)
        publish_health(api, name)

    with ThreadPoolExecutor(SETUP_THREADS) as pool:
        list(pool.map(one, names))
    return names


def make_queue(api: client.ApiClient, gpus: int) -> str:
    name = unique_name("fill")
    client.CustomObjectsApi(api).create_cluster_custom_object(
        contract.SCHEDULING_API_GROUP,
        contract.SCHEDULING_API_VERSION,
        contract.QUEUE_PLURAL,
        {
            "apiVersion": f"{contract.SCHEDULING_API_GROUP}/{contract.SCHEDULING_API_VERSION}",
            "kind": contract.QUEUE_KIND,
            "metadata": {"name": name},
            "spec": {"resources": {"gpu": {"quota": gpus}}},
        },
    )
    return name


DRA_TEMPLATE = "one-gpu"


def dra_template(api: client.ApiClient, namespace: str) -> None:
    """The ResourceClaimTemplate every DRA pod of a run uses: one GPU of the driver's class."""
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        "resource.k8s.io",
        "v1",
        namespace,
        "resourceclaimtemplates",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": DRA_TEMPLATE},
            "spec": {
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}
            },
        },
    )


def pod_body(name: str, scheduler: str, queue: str, gpus: int = 1, dra: bool = False) -> dict[str, Any]:
    """A training pod: one GPU (a limit, as users write it, or with ``dra`` a claim), a core and 4 GiB."""
    if dra and gpus:
        body = pod_body(name, scheduler, queue, gpus=0)
        body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": DRA_TEMPLATE}]
        body["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
        return body
    limits = {contract.RESOURCE_NVIDIA_GPU: str(gpus)} if gpus else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {contract.LABEL_QUEUE: queue}},
        "spec": {
            "schedulerName": scheduler,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/train:1",
                    "resources": {"requests": {"cpu": "1", "memory": "4Gi"}, **({"limits": limits} if limits else {})},
                }
            ],
        },
    }


def drain(resp: Any) -> int:
    """Read an undecoded reply to its end and give the connection back; its HTTP status.

    A connection returned with its reply unread would hand the rest of that
    reply to the next request on it.
    """
    try:
        _ = resp.data
    finally:
        resp.release_conn()
    status: int = resp.status
    return status


def create_pods(
    api: client.ApiClient, namespace: str, names: Sequence[str], scheduler: str, queue: str, *, dra: bool = False
) -> float:
    """Create the pods from a pool of threads, as fast as the API server takes them; seconds taken."""
    core = client.CoreV1Api(api)

    def one(name: str) -> None:
        body = pod_body(name, scheduler, queue, dra=dra)
        drain(core.create_namespaced_pod(namespace, body, _preload_content=False))

    started = time.monotonic()
    with ThreadPoolExecutor(CREATE_THREADS) as pool:
        list(pool.map(one, names))
    return time.monotonic() - started


def bare_bind(api: client.ApiClient, namespace: str, names: Sequence[str], nodes: Sequence[str], threads: int) -> None:
    """Bind pod i to node i // 8 from ``threads`` threads: pods/binding and nothing else.

    The client's ``create_namespaced_pod_binding`` applies the bind and then
    fails to parse the reply (it expects a ``target`` it does not get), so
    the reply is not decoded: its HTTP status says whether the bind happened.
    """
    core = client.CoreV1Api(api)
    work = iter(enumerate(names))
    lock = threading.Lock()
    failures: list[str] = []

    def worker() -> None:
        while True:
            with lock:
                item = next(work, None)
            if item is None:
                return
            i, name = item
            body = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": nodes[i // GPUS_PER_NODE]},
            }
            try:
                status = drain(core.create_namespaced_pod_binding(name, namespace, body, _preload_content=False))
            except client.ApiException as exc:
                status = exc.status
            if status != 201:
                failures.append(f"{name}: HTTP {status}")

    pool = [threading.Thread(target=worker, name=f"bare-bind-{i}") for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if failures:
        raise RuntimeError(f"{len(failures)} bare binds failed, e.g. {failures[0]}")


@contextlib.contextmanager
def fresh_namespace(api: client.ApiClient) -> Iterator[str]:
    """A namespace for one run; its pods are removed at once (no kubelet would finish a graceful delete)."""
    core = client.CoreV1Api(api)
    name = unique_name("fill")
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
        release_claims(api, name)
        core.delete_namespace(name)
        deadline = time.monotonic() + STALL_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                core.read_namespace(name)
            except client.ApiException as exc:
                if exc.status == 404:
                    break
                raise
            time.sleep(0.5)


def release_claims(api: client.ApiClient, namespace: str) -> None:
    """Drop the allocated claims' finalizers, so the namespace goes without waiting for the claim controller."""
    custom = client.CustomObjectsApi(api)
    try:
        items = custom.list_namespaced_custom_object("resource.k8s.io", "v1", namespace, "resourceclaims")["items"]
    except client.ApiException:
        return

    def one(claim: dict[str, Any]) -> None:
        with contextlib.suppress(client.ApiException):
            custom.patch_namespaced_custom_object(
                "resource.k8s.io",
                "v1",
                namespace,
                "resourceclaims",
                claim["metadata"]["name"],
                {"metadata": {"finalizers": None}},
            )

    with ThreadPoolExecutor(SETUP_THREADS) as pool:
        list(pool.map(one, [c for c in items if c["metadata"].get("finalizers")]))


def wait_for_claims(api: client.ApiClient, namespace: str, count: int) -> None:
    """Until the resourceclaim controller made ``count`` claims in the namespace (a backlog starts with all made)."""
    custom = client.CustomObjectsApi(api)
    deadline = time.monotonic() + STALL_TIMEOUT_S
    while time.monotonic() < deadline:
        listed = custom.list_namespaced_custom_object("resource.k8s.io", "v1", namespace, "resourceclaims", limit=1)
        remaining = listed["metadata"].get("remainingItemCount") or 0
        if len(listed["items"]) + remaining >= count:
            return
        time.sleep(0.5)
    raise TimeoutError(f"the resourceclaim controller made fewer than {count} claims in {STALL_TIMEOUT_S:.0f} s")


def claim_faults(api: client.ApiClient, namespace: str, bound: Collection[str]) -> int:
    """Devices more than one claim of the namespace holds, and bound pods with no claim allocated for them.

    Each counts as an over-filled node: either is a pod the kubelet would not
    start (an unallocated claim) or a GPU given twice.
    """
    items = client.CustomObjectsApi(api).list_namespaced_custom_object(
        "resource.k8s.io", "v1", namespace, "resourceclaims"
    )["items"]
    held: dict[tuple[str, str], int] = {}
    served: set[str] = set()
    for claim in items:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or ():
            key = (result["pool"], result["device"])
            held[key] = held.get(key, 0) + 1
        if allocation:
            served.update(str(r.get("name")) for r in (claim.get("status") or {}).get("reservedFor") or ())
    twice = sum(1 for n in held.values() if n > 1)
    return twice + sum(1 for name in bound if not name.endswith(CANARY) and name not in served)


# ---------------------------------------------------------------------------
# Scheduler processes
# ---------------------------------------------------------------------------


def kube_scheduler_binary() -> Path:
    """``KUBE_SCHEDULER``, else the kube-scheduler built beside kube-apiserver."""
    override = os.environ.get("KUBE_SCHEDULER")
    path = Path(override) if override else find_binaries().kube_apiserver.parent / "kube-scheduler"
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise SystemExit(
            f"no kube-scheduler at {path}: build it with `make controlplane` (or point KUBE_SCHEDULER at one)"
        )
    return path


@dataclass
class Launcher:
    """Starts one contender's scheduler process against the control plane; logs go to its run folder."""

    plane: ControlPlane
    kube_scheduler: Path
    profile_dir: Path | None = None
    started: list[ManagedProcess] = field(default_factory=list)
    _count: itertools.count[int] = field(default_factory=itertools.count)

    def start(self, contender: Contender) -> ManagedProcess:
        n = next(self._count)
        if contender.kind == "gpuwarden":
            (port,) = free_ports(1)
            python = [sys.executable]
            if self.profile_dir is not None:
                python += ["-m", "cProfile", "-o", str(self.profile_dir / f"gpuwarden-{n:02d}.prof")]
            argv = [
                *python,
                "-m",
                "gpuwarden.cli",
                "--log-format=json",
                "scheduler",
                f"--kubeconfig={self.plane.kubeconfig}",
                f"--lease-namespace={LEASE_NAMESPACE}",
                f"--lease-name=fill-{n}",
                "--metrics-address=127.0.0.1",
                f"--metrics-port={port}",
                *contender.args,
            ]
        else:
            argv = [
                str(self.kube_scheduler),
                f"--kubeconfig={self.plane.kubeconfig}",
                "--leader-elect=false",
                "--secure-port=0",
                "--v=1",
                *contender.args,
            ]
        proc = ManagedProcess(
            name=f"{contender.name}-{n}",
            argv=argv,
            log_path=self.plane.run_dir / "logs" / f"{contender.name}-{n:02d}.log",
            pid_file=self.plane.run_dir / "pids",
        )
        proc.start()
        self.started.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.started:
            proc.stop()
        self.started.clear()


def stop_gently(proc: ManagedProcess, timeout: float = 60.0) -> None:
    """SIGTERM and a minute to exit: a profiled scheduler writes its profile on the way out."""
    if proc.popen is not None and proc.popen.poll() is None:
        proc.popen.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(timeout)
    proc.stop()


# ---------------------------------------------------------------------------
# One timed run
# ---------------------------------------------------------------------------


@dataclass
class Bench:
    plane: ControlPlane
    api: client.ApiClient
    nodes: list[str]
    queue: str
    pods: int
    launcher: Launcher
    dra: bool = False

    def run(self, contender: Contender, workload: str) -> Outcome:
        names = [f"fill-{i:05d}" for i in range(self.pods)]
        with fresh_namespace(self.api) as namespace:
            if self.dra:
                dra_template(self.api, namespace)
            watch = BindWatch(self.plane, namespace, "fill-")
            proc: ManagedProcess | None = None
            try:
                create_seconds: float | None = None
                if workload == "created":
                    proc = self._start_ready(contender, namespace, watch)
                    started = time.monotonic()
                    create_seconds = create_pods(
                        self.api, namespace, names, contender.scheduler_name, self.queue, dra=self.dra
                    )
                else:
                    create_pods(self.api, namespace, names, contender.scheduler_name, self.queue, dra=self.dra)
                    watch.wait(lambda: len(watch.created) >= len(names), "backlog creation")
                    if self.dra:
                        wait_for_claims(self.api, namespace, len(names))
                    started = time.monotonic()
                    if contender.kind == "bare":
                        bare_bind(self.api, namespace, names, self.nodes, contender.threads)
                    else:
                        proc = self.launcher.start(contender)
                self._wait_bound(watch, names, contender, proc)
                overfilled = watch.overfilled_nodes(GPUS_PER_NODE)
                if self.dra:
                    overfilled += claim_faults(self.api, namespace, names)
                return Outcome(
                    contender=contender.name,
                    workload=workload,
                    pods=len(names),
                    seconds=watch.last_bind(names) - started,
                    bound=len(names),
                    overfilled_nodes=overfilled,
                    create_seconds=create_seconds,
                )
            finally:
                watch.stop()
                if proc is not None:
                    stop_gently(proc)

    def _start_ready(self, contender: Contender, namespace: str, watch: BindWatch) -> ManagedProcess:
        """Start the scheduler and wait until it bound a canary pod (needs no GPU): it is up and scheduling."""
        proc = self.launcher.start(contender)
        body = pod_body(f"fill-{CANARY}", contender.scheduler_name, self.queue, gpus=0)
        drain(client.CoreV1Api(self.api).create_namespaced_pod(namespace, body, _preload_content=False))
        self._wait_bound(watch, [f"fill-{CANARY}"], contender, proc)
        return proc

    def _wait_bound(
        self, watch: BindWatch, names: Sequence[str], contender: Contender, proc: ManagedProcess | None
    ) -> None:
        def done() -> bool:
            if proc is not None and not proc.running():
                raise RuntimeError(f"{contender.name} exited; its log ends:\n{proc.log_tail()}")
            return all(n in watch.bound for n in names)

        try:
            watch.wait(done, f"{contender.name} binding {len(names)} pods")
        except TimeoutError as err:
            tail = f"\nits log ends:\n{proc.log_tail(20)}" if proc is not None else ""
            over = watch.overfilled_nodes(GPUS_PER_NODE)
            raise TimeoutError(f"{err}; {over} nodes hold more pods than GPUs{tail}{self._why(watch, names)}") from err

    def _why(self, watch: BindWatch, names: Sequence[str]) -> str:
        """The Warning Events of the namespace (a pending group's explanation), for a run that got stuck."""
        events = client.CoreV1Api(self.api).list_namespaced_event(watch.namespace).items
        left = sorted(n for n in names if n not in watch.bound)
        lines = [f"{e.involved_object.name}: {e.reason}: {e.message}" for e in events if e.type == "Warning"]
        return f"\nunbound: {', '.join(left[:10])}\nwarnings:\n" + "\n".join(lines[-10:])


# ---------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------


def figures(outcomes: Sequence[Outcome], contender: str, workload: str) -> list[float]:
    return [o.rate for o in outcomes if o.contender == contender and o.workload == workload]


def report(outcomes: Sequence[Outcome], names: Sequence[str], pods: int, nodes: int, dra: bool = False) -> None:
    kind = "single-GPU claim pods onto DRA" if dra else "single-GPU pods onto"
    print(f"\n{pods} {kind} {nodes} nodes x {GPUS_PER_NODE} GPUs; pods per second, min and median of runs")
    medians: dict[tuple[str, str], float] = {}
    for workload in WORKLOADS:
        for name in names:
            rates = figures(outcomes, name, workload)
            if not rates:
                continue
            medians[(name, workload)] = statistics.median(rates)
            over = sum(o.overfilled_nodes for o in outcomes if o.contender == name and o.workload == workload)
            print(
                f"result workload={workload} contender={name} runs={len(rates)} "
                f"min={min(rates):.1f} median={statistics.median(rates):.1f} overfilled_nodes={over}"
            )
        creates = [
            o.pods / o.create_seconds for o in outcomes if o.workload == workload and o.create_seconds is not None
        ]
        if creates:
            print(
                f"result workload={workload} contender=pod-creation runs={len(creates)} "
                f"min={min(creates):.1f} median={statistics.median(creates):.1f} overfilled_nodes=0"
            )
    for workload in WORKLOADS:
        ours = medians.get(("gpuwarden", workload))
        tuned = medians.get(("kube-scheduler-tuned", workload))
        default = medians.get(("kube-scheduler", workload))
        if ours is not None and tuned:
            print(f"ratio workload={workload} gpuwarden/kube-scheduler-tuned={ours / tuned:.2f}")
        if ours is not None and default:
            print(f"ratio workload={workload} gpuwarden/kube-scheduler={ours / default:.2f}")
    bare = [v for (n, w), v in medians.items() if w == "backlog" and n.startswith("bare-")]
    ours = medians.get(("gpuwarden", "backlog"))
    if bare and ours is not None:
        print(f"ratio workload=backlog gpuwarden/bare-ceiling={ours / max(bare):.2f}")
    tuned = medians.get(("kube-scheduler-tuned", "created"))
    ours_created = medians.get(("gpuwarden", "created"))
    tuned_backlog = medians.get(("kube-scheduler-tuned", "backlog"))
    if dra and ours_created is not None and tuned and ours is not None and tuned_backlog:
        meets = ours_created >= tuned and ours >= tuned_backlog
        print(f"target: at least the tuned kube-scheduler's rate, both workloads: {'meets' if meets else 'MISSES'}")
    if ours_created is not None and tuned and bare and ours is not None:
        meets = (
            ours_created > tuned
            and ours > medians.get(("kube-scheduler-tuned", "backlog"), 0)
            and ours >= max(bare) / 2
        )
        print(
            f"target: faster than kube-scheduler-tuned and at least half the bare ceiling on the backlog: "
            f"{'meets' if meets else 'MISSES'}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="runs per contender and workload")
    parser.add_argument("--nodes", type=int, default=500, help="fake nodes of 8 GPUs")
    parser.add_argument("--pods", type=int, default=4000, help="single-GPU pods per run")
    parser.add_argument("--bare-threads", default="1,8,32", help="thread counts of the bare binders, comma-separated")
    parser.add_argument("--only", default="", help="contenders to run, comma-separated (default: all)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="workloads to run, comma-separated")
    parser.add_argument("--profile", type=Path, default=None, help="run gpuwarden under cProfile, profiles here")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 10 nodes, 60 pods, one run")
    parser.add_argument("--dra", action="store_true", help="DRA nodes and claim pods (module docstring)")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.nodes, args.pods = 1, 10, 60
    if args.pods > args.nodes * GPUS_PER_NODE:
        parser.error(f"{args.pods} pods do not fit {args.nodes} nodes of {GPUS_PER_NODE} GPUs")
    everyone = contenders([int(t) for t in args.bare_threads.split(",") if t.strip()])
    wanted = {n.strip() for n in args.only.split(",") if n.strip()}
    unknown = wanted - {c.name for c in everyone}
    if unknown:
        parser.error(f"unknown contenders: {', '.join(sorted(unknown))}")
    chosen = [c for c in everyone if (not wanted or c.name in wanted) and not (args.dra and c.kind == "bare")]
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if set(workloads) - set(WORKLOADS):
        parser.error(f"workloads are {', '.join(WORKLOADS)}")
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    configure_logging("console", "error")
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    # The scheduler process imports gpuwarden from this checkout.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    kube_scheduler = kube_scheduler_binary()

    began = time.monotonic()
    with running_control_plane() as plane, contextlib.ExitStack() as extra:
        launcher = Launcher(plane, kube_scheduler, args.profile)
        if args.dra:
            plane.kubectl(
                "apply", "-f", str(REPO / "tests" / "scheduler" / "remediation" / "dra" / "deviceclasses.yaml")
            )
            # Its client's default rate (20 requests a second, two writes per pod) would
            # bound every contender; raised, as large clusters raise it.
            extra.enter_context(
                plane.extra_controllers(
                    "resourceclaim-controller", flags=("--kube-api-qps=1000", "--kube-api-burst=2000")
                )
            )
        try:
            plane.kubectl("apply", "-f", str(REPO / "manifests" / "crd-gpunodes.yaml"))
            plane.kubectl("apply", "-k", str(REPO / "manifests" / "scheduler" / "crds"))
            plane.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
            with make_client(plane, max(CREATE_THREADS, SETUP_THREADS, *(c.threads for c in chosen))) as api:
                client.CoreV1Api(api).create_namespace(
                    client.V1Namespace(metadata=client.V1ObjectMeta(name=LEASE_NAMESPACE))
                )
                nodes = make_nodes(api, args.nodes, dra=args.dra)
                queue = make_queue(api, args.pods)
                print(
                    f"control plane and {len(nodes)} nodes up in {time.monotonic() - began:.1f} s; "
                    f"{args.runs} runs of {len(chosen)} contenders",
                    flush=True,
                )
                bench = Bench(plane, api, nodes, queue, args.pods, launcher, dra=args.dra)
                outcomes: list[Outcome] = []
                for run in range(args.runs):
                    order = chosen[run % len(chosen) :] + chosen[: run % len(chosen)]
                    for workload in workloads:
                        for contender in order:
                            if contender.kind == "bare" and workload != "backlog":
                                continue
                            outcome = bench.run(contender, workload)
                            outcomes.append(outcome)
                            print(
                                f"run={run + 1} workload={workload} contender={contender.name} "
                                f"seconds={outcome.seconds:.2f} pods_per_s={outcome.rate:.1f} "
                                f"overfilled_nodes={outcome.overfilled_nodes}",
                                flush=True,
                            )
                report(outcomes, [c.name for c in chosen], args.pods, args.nodes, dra=args.dra)
        finally:
            launcher.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
