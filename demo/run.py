"""``gpuwarden demo``: the whole system on one machine, from start to a clean stop.

In order: the local control plane (with the Job controller), the manifests'
objects that make sense without a kubelet (namespace, CRDs, RBAC, admission
policies, config; not the DaemonSet, Deployment or Services), the admission
webhook for GPU slices (served in this process), the queue tree, the
simulated nodes with their agents, the scheduler with remediation (watch
cache, leader election, cycle, remediation controller: the
:class:`~scheduler.runner.SchedulerRunner` the Deployment runs), the
stand-in kubelet and training operator, the workload, the fault schedule and
the people. Then the live view until ``--duration`` or Ctrl-C, the summary,
and everything stopped in reverse order: threads joined, the servers
stopped, their folder removed. The servers also die with this process if it
is killed (parent-death signal), and the next run reaps any leftovers.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml
from kubernetes import client

from agent.sim.scenario import load_scenario as load_node_scenario
from demo.admission import DemoWebhook
from demo.faults import FaultSchedule, People
from demo.kubelet import LABEL_PART_OF, PART_OF, StandInKubelet
from demo.nodes import SimulatedNode
from demo.observe import Observer
from demo.scenario import DemoScenario
from demo.summary import CycleLag, Performance, render_summary
from demo.view import LiveView, PlainView, View
from demo.workload import StandInOperator, Workload, queue_objects
from gpuwarden import contract
from gpuwarden.localcluster import (
    DEFAULT_CONTROLLERS,
    FIRST_BUILD_HINT,
    ControlPlane,
    ControlPlaneError,
    create_gpu_node,
    find_binaries,
)
from gpuwarden.localcluster.processes import SOURCE_ROOT
from gpuwarden.logconfig import get_logger
from scheduler.cluster.cycle import CycleResult
from scheduler.cluster.leader import LeaderElectionConfig
from scheduler.remediation.breaker import BreakerSettings
from scheduler.remediation.policy import ControllerSettings, Settings
from scheduler.runner import RunnerSettings, SchedulerRunner

log = get_logger(__name__)

MANIFESTS = SOURCE_ROOT / "manifests"
DEMO_MANIFESTS = Path(__file__).resolve().parent / "manifests"
# What a cluster runs as pods, which the local cluster cannot: no kubelet.
# The admission webhook is served by the scheduler pod's second container and
# reached through its Service: neither runs here, and with its failurePolicy
# Fail the configuration alone would refuse every GPU slice pod. The demo
# serves the webhook itself and registers its configuration (demo/admission.py).
_NEEDS_KUBELET = frozenset({"DaemonSet", "Deployment", "Service", "MutatingWebhookConfiguration"})
READY_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class DemoOptions:
    scenario: DemoScenario
    duration_s: float
    nodes: int
    tty: bool
    # DRA nodes (module docstring of agent/sim/dra.py): no device plugin, the driver's slices.
    dra: bool = False


class StopRequestedError(Exception):
    """SIGTERM: stop as Ctrl-C does."""


def _raise_stopped(_signum: int, _frame: Any) -> None:
    raise StopRequestedError


@contextlib.contextmanager
def _logs_to(path: Path) -> Iterator[None]:
    """Send the process's logs to ``path``: the terminal belongs to the view."""
    root = logging.getLogger()
    with path.open("a") as handle:
        streams = [(h, h.setStream(handle)) for h in root.handlers if isinstance(h, logging.StreamHandler)]
        try:
            yield
        finally:
            for h, before in streams:
                if before is not None:
                    h.setStream(before)


def apply_manifests(plane: ControlPlane) -> None:
    """The shipped base minus what needs a kubelet, then the demo's PyTorchJob CRD; CRDs established."""
    built = plane.kubectl("kustomize", str(MANIFESTS)).stdout
    docs = [d for d in yaml.safe_load_all(built) if d and d.get("kind") not in _NEEDS_KUBELET]
    plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    plane.kubectl("apply", "-f", str(DEMO_MANIFESTS / "pytorchjob-crd.yaml"))
    plane.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")


class NodeDevices:
    """The simulated nodes' device managers, for the stand-in kubelet (:class:`demo.kubelet.Devices`)."""

    def __init__(self, api: client.ApiClient, nodes: Mapping[str, SimulatedNode]) -> None:
        self._core = client.CoreV1Api(api)
        self._nodes = nodes

    def admit(self, node: str, pod: Mapping[str, Any]) -> tuple[int, ...] | None:
        found = self._nodes.get(node)
        return found.admit(pod) if found is not None else ()

    def release(self, node: str, namespace: str, name: str) -> None:
        found = self._nodes.get(node)
        if found is not None:
            found.release(namespace, name)

    def quarantined(self, node: str) -> frozenset[int]:
        try:
            meta = self._core.read_node(node).metadata
        except client.ApiException:
            return frozenset()
        annotations = (meta.annotations if meta is not None else None) or {}
        listed = str(annotations.get(contract.ANNOTATION_QUARANTINED_GPUS, ""))
        return frozenset(int(p) for p in listed.split(",") if p.strip().isdigit())


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


def run_demo(options: DemoOptions, out: IO[str] = sys.stdout) -> int:
    """Run the demo; 0 when it ran to its end (or Ctrl-C), 2 when it could not start."""
    try:
        binaries = find_binaries()
    except ControlPlaneError as exc:
        print(f"gpuwarden demo needs the local control plane: {exc}", file=out)
        print(f"Build it once with `make controlplane` ({FIRST_BUILD_HINT}); `make run` does it for you.", file=out)
        return 2
    run_dir = Path(tempfile.mkdtemp(prefix="gpuwarden-demo-"))
    log_file = run_dir / "demo.log"
    previous_term = signal.signal(signal.SIGTERM, _raise_stopped)
    print(f"gpuwarden demo: starting the control plane (logs: {log_file})", file=out, flush=True)
    # The servers are started from this (the main) thread: their parent-death signal follows it.
    controllers: tuple[str, ...] = (*DEFAULT_CONTROLLERS, "job")
    if options.dra:
        # The resourceclaim controller frees the claims of finished pods; the device-taint
        # eviction controller runs to show that gpuwarden writes nothing it would act on.
        controllers = (*controllers, "resourceclaim-controller", "device-taint-eviction-controller")
    plane = ControlPlane.start(binaries, controllers=controllers)
    stack = contextlib.ExitStack()
    # The logs go to the file until everything has stopped: the agents and the
    # scheduler log their own stops, which would follow the summary on the terminal.
    with _logs_to(log_file):
        try:
            stack.callback(plane.stop)
            return _run(options, plane, stack, out)
        except (KeyboardInterrupt, StopRequestedError):
            print("\ngpuwarden demo: stopping", file=out, flush=True)
            return 0
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
            try:
                stack.close()
            finally:
                signal.signal(signal.SIGINT, signal.default_int_handler)
                signal.signal(signal.SIGTERM, previous_term)
                print("gpuwarden demo: stopped; nothing left running", file=out, flush=True)


def _run(options: DemoOptions, plane: ControlPlane, stack: contextlib.ExitStack, out: IO[str]) -> int:
    sc = options.scenario
    print(f"gpuwarden demo: control plane up in {plane.startup_seconds:.1f}s", file=out)
    print(f"  kubeconfig: {plane.kubeconfig}", file=out)
    print(f"  try: KUBECONFIG={plane.kubeconfig} kubectl get nodes -L gpuwarden.io/state", file=out, flush=True)
    apply_manifests(plane)
    if options.dra:
        plane.kubectl("apply", "-f", str(DEMO_MANIFESTS / "dra-deviceclasses.yaml"))
    api = plane.api_client()
    stack.callback(api.close)
    core = client.CoreV1Api(api)
    node_scenario = load_node_scenario(sc.cluster.node_scenario)
    pools = sc.cluster.pools
    pool_gpus = {
        pool: sum(1 for i in range(options.nodes) if pools[i % len(pools)] == pool) * node_scenario.gpus.count
        for pool in pools
    }
    workload = Workload(api, sc, options.nodes, options.duration_s)
    for ns in workload.namespaces:
        core.create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=ns, labels={LABEL_PART_OF: PART_OF}))
        )
    # The admission webhook for GPU slices, in this process (demo/admission.py).
    webhook = DemoWebhook(api)
    stack.callback(webhook.stop)
    webhook.start(probe_namespace=workload.namespaces[0])
    custom = client.CustomObjectsApi(api)
    for queue in queue_objects(sc.queues, pool_gpus):
        custom.create_cluster_custom_object(
            contract.SCHEDULING_API_GROUP, contract.SCHEDULING_API_VERSION, contract.QUEUE_PLURAL, queue
        )

    # Nodes and their agents.
    nodes: list[SimulatedNode] = []

    def stop_nodes() -> None:
        for node in reversed(nodes):
            node.stop()

    stack.callback(stop_nodes)
    for i in range(options.nodes):
        name, pool = f"gpu-node-{i:02d}", pools[i % len(pools)]
        create_gpu_node(
            api,
            name,
            # A DRA node's kubelet has no device plugin: no nvidia.com/gpu in its capacity.
            gpus=0 if options.dra else node_scenario.gpus.count,
            labels={contract.LABEL_NODE_POOL: pool, "nvidia.com/gpu.present": "true"},
        )
        node = SimulatedNode(
            name,
            pool,
            node_scenario,
            plane.configuration(),
            poll_interval_s=sc.cluster.poll_interval_s,
            heartbeat_period_s=sc.cluster.heartbeat_period_s,
            dra=options.dra,
        )
        node.start()
        nodes.append(node)
    _wait(lambda: all(n.published for n in nodes), READY_TIMEOUT_S, "every agent to publish")
    by_name = {n.name: n for n in nodes}
    print(
        f"gpuwarden demo: {len(nodes)} nodes x {node_scenario.gpus.count} GPUs with their agents"
        + (" (DRA: no device plugin, GPUs in NVIDIA's DRA driver's ResourceSlices)" if options.dra else ""),
        file=out,
        flush=True,
    )

    # The scheduler with remediation, as the Deployment runs it.
    lag = CycleLag(sc.scheduler.period_s)
    machine = Settings(breaker=BreakerSettings(max_out_fraction=sc.scheduler.max_out_fraction))
    # Its own client, with a connection for each bind worker, as the scheduler's process has.
    scheduler_config = plane.configuration()
    scheduler_config.connection_pool_maxsize = 32
    scheduler_api = client.ApiClient(scheduler_config)
    stack.callback(scheduler_api.close)
    runner = SchedulerRunner(
        scheduler_api,
        RunnerSettings(
            period_s=sc.scheduler.period_s,
            lease=LeaderElectionConfig(namespace="gpuwarden", identity="gpuwarden-demo"),
            evictions_per_s=sc.scheduler.evictions_per_s,
            remediation=ControllerSettings(machine=machine),
            metrics_port=None,
        ),
    )

    def timed(result: CycleResult) -> None:
        lag.cycle(time.monotonic(), result.seconds)

    runner.on_cycle = timed
    stop_scheduler = threading.Event()
    scheduler_thread = threading.Thread(target=runner.run, args=(stop_scheduler,), name="demo-scheduler", daemon=True)
    scheduler_thread.start()

    def stop_runner() -> None:
        stop_scheduler.set()
        scheduler_thread.join(30)

    stack.callback(stop_runner)
    _wait(runner.elector.is_leader, READY_TIMEOUT_S, "the scheduler to lead")

    observer = Observer(api)

    def on_gpus(node: str, gpus: tuple[int, ...], delta: int) -> None:
        if node in by_name:
            by_name[node].using(gpus, delta)

    kubelet = StandInKubelet(api, on_gpus, clock=observer.elapsed, devices=NodeDevices(api, by_name))
    kubelet.start()
    stack.callback(kubelet.stop)
    operator = StandInOperator(api, workload.namespaces)
    operator.start()
    stack.callback(operator.stop)
    observer.start()
    stack.callback(observer.stop)
    workload.start()
    stack.callback(workload.stop)
    faults = FaultSchedule(sc.faults, nodes, observer.elapsed)
    faults.start()
    stack.callback(faults.stop)
    people = People(api, by_name, observer, sc.people.repair_after_s)
    people.start()
    stack.callback(people.stop)
    print(f"gpuwarden demo: running for {options.duration_s:.0f}s (Ctrl-C stops)", file=out, flush=True)

    view: View = LiveView(str(plane.kubeconfig)) if options.tty else PlainView(out)
    try:
        deadline = time.monotonic() + options.duration_s
        while time.monotonic() < deadline:
            view.show(observer.latest)
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    finally:
        # A second Ctrl-C (or one forwarded twice) must not cut the summary short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        view.close()
        # The summary's last read, before anything stops.
        workload.stop()
        faults.stop()
        people.stop()
        final = observer.latest
        with contextlib.suppress(client.ApiException):
            final = observer.observe()
        worst = max((n.daemon.lag.worst_s for n in nodes), default=0.0)
        polls = sum(n.daemon.lag.polls for n in nodes)
        print(
            render_summary(
                duration_s=observer.elapsed(),
                nodes=len(nodes),
                gpus_per_node=node_scenario.gpus.count,
                injected=faults.injected,
                skipped=len(faults.skipped),
                history=observer.snapshot_history(),
                repairs=people.repairs,
                evicted=kubelet.evicted,
                landed=list(kubelet.landed.values()),
                final=final,
                performance=Performance(lag, polls, worst, sc.cluster.poll_interval_s, len(nodes)),
                kubeconfig=str(plane.kubeconfig),
            ),
            file=out,
            flush=True,
        )
    return 0
