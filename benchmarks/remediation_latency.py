"""How fast a failing node is quarantined and drained, against a real API server.

Starts the test control plane, makes ``--nodes`` GPU nodes (100), each with
a connected agent on the sim backend (they share this process, each talking
to the API as its own agent does), the scheduler with remediation (leader
election, watch cache, cycle, controller: ``SchedulerRunner``, in threads),
and a stand-in kubelet that marks bound pods Running and finishes the
deletion of evicted ones (there is no real kubelet). Then it measures:

* **one failing node**, ``--samples`` times on different nodes: an XID 79
  (REBOOT) injected into the node's sim until the Node is cordoned with the
  quarantine taint (*quarantined*), and until no pod is left on it
  (*drained*; its pods have no disruption budget). Targets: quarantined p99
  under 2 s, drained p50 under 10 s.
* **30 failing at once** (the breaker raised so that all may go out): the
  same two latencies per node. Target: quarantined p99 under 5 s.
* **evictions per second** while draining ``--drain-pods`` (3,000) pods of
  other schedulers from the 30 nodes, at ``--evictions-per-second``
  (the scheduler's flag; its default is 10).

For scale: NVSentinel's published scale test took 163 s (p90) to quarantine
375 failing nodes and 39 minutes to evict 11,683 pods at 5 evictions/s.

Run it (not part of ``make test``; a few minutes)::

    make controlplane
    .venv/bin/python benchmarks/remediation_latency.py [--nodes 100] [--samples 5] [--at-once 30]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kubernetes import client, watch  # noqa: E402

from agent.config import config_from_dict  # noqa: E402
from agent.daemon import AgentDaemon  # noqa: E402
from agent.monitor import Monitor  # noqa: E402
from agent.publish.settings import DaemonSettings  # noqa: E402
from agent.sim.node import SimNode  # noqa: E402
from agent.sim.scenario import load_scenario  # noqa: E402
from gpuwarden import contract  # noqa: E402
from gpuwarden.logconfig import configure_logging  # noqa: E402
from scheduler.cluster.leader import LeaderElectionConfig  # noqa: E402
from scheduler.remediation.breaker import BreakerSettings  # noqa: E402
from scheduler.remediation.policy import ControllerSettings, Settings  # noqa: E402
from scheduler.runner import RunnerSettings, SchedulerRunner  # noqa: E402
from tests.harness import (  # noqa: E402
    complete_pod_deletion,
    create_gpu_node,
    mark_pod_running,
    running_control_plane,
    unique_name,
    wait_for,
)

NAMESPACE = "bench-remediation"


class StandInKubelet:
    """Marks bound pods Running and finishes evicted pods' deletion, as kubelets would, at once."""

    def __init__(self, api: client.ApiClient) -> None:
        self._api = api
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubelet", daemon=True)
        self.running: set[str] = set()

    def __enter__(self) -> StandInKubelet:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        core = client.CoreV1Api(self._api)
        while not self._stop.is_set():
            stream = watch.Watch()
            try:
                for event in stream.stream(core.list_namespaced_pod, NAMESPACE, timeout_seconds=30):
                    if self._stop.is_set():
                        break
                    pod = event["object"]
                    name = pod.metadata.name
                    if event["type"] == "DELETED":
                        self.running.discard(name)
                        continue
                    if pod.metadata.deletion_timestamp is not None:
                        with contextlib.suppress(client.ApiException):
                            complete_pod_deletion(self._api, name, NAMESPACE)
                    elif pod.spec.node_name and name not in self.running and pod.status.phase != "Running":
                        with contextlib.suppress(client.ApiException):
                            mark_pod_running(self._api, name, NAMESPACE)
                            self.running.add(name)
            except Exception:  # the API server answering badly for a moment; watch again
                time.sleep(0.2)
            finally:
                stream.stop()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))
    return ordered[k]


def summary(name: str, values: list[float], target: str) -> None:
    if not values:
        print(f"{name}: no samples")
        return
    print(
        f"{name}: n={len(values)} p50 {percentile(values, 0.5):.2f} s, p99 {percentile(values, 0.99):.2f} s, "
        f"max {max(values):.2f} s  [target {target}]"
    )


def start_agent(api: client.ApiClient, node: str, poll: float) -> tuple[AgentDaemon, Monitor, SimNode]:
    sim = SimNode(load_scenario("healthy"), identity=node)
    monitor = Monitor(config_from_dict({"poll_interval_s": poll}), sim.hardware(), node)
    daemon = AgentDaemon(monitor, api, DaemonSettings(node_name=node, metrics_port=None))
    daemon.start()
    return daemon, monitor, sim


def submit(api: client.ApiClient, name: str, *, node: str | None = None, gpus: int = 1) -> None:
    """A pod: ours (scheduled by gpuwarden, one GPU) or, with ``node``, another scheduler's, bound there."""
    limits = {contract.RESOURCE_NVIDIA_GPU: str(gpus)} if gpus else None
    body = client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            scheduler_name=contract.SCHEDULER_NAME if node is None else "default-scheduler",
            node_name=node,
            containers=[
                client.V1Container(
                    name="main",
                    image="registry.invalid/train:1",
                    resources=client.V1ResourceRequirements(requests={"cpu": "10m", "memory": "16Mi"}, limits=limits),
                )
            ],
        ),
    )
    client.CoreV1Api(api).create_namespaced_pod(NAMESPACE, body)


def pods_on(api: client.ApiClient, node: str) -> int:
    pods = client.CoreV1Api(api).list_namespaced_pod(NAMESPACE, field_selector=f"spec.nodeName={node}").items
    return len(pods)


def cordoned(api: client.ApiClient, node: str) -> bool:
    stored = client.CoreV1Api(api).read_node(node)
    taints = stored.spec.taints or []
    return bool(stored.spec.unschedulable) and any(t.key == contract.TAINT_QUARANTINE for t in taints)


def watch_until(checks: dict[str, Callable[[], bool]], timeout: float) -> dict[str, float]:
    """Poll every check until each is true; when each first was, from now (seconds)."""
    start = time.monotonic()
    done: dict[str, float] = {}
    while len(done) < len(checks) and time.monotonic() - start < timeout:
        for key, check in checks.items():
            if key not in done and check():
                done[key] = time.monotonic() - start
        time.sleep(0.05)
    return done


def fail_nodes(api: client.ApiClient, sims: dict[str, SimNode], nodes: list[str]) -> tuple[list[float], list[float]]:
    """Inject XID 79 on GPU 0 of each node at once; quarantine and drain latencies per node."""
    for node in nodes:
        sims[node].inject("xid", gpu=0, xid=79)
    checks: dict[str, Callable[[], bool]] = {}
    for node in nodes:
        checks[f"q/{node}"] = lambda n=node: cordoned(api, n)  # type: ignore[misc]
        checks[f"d/{node}"] = lambda n=node: pods_on(api, n) == 0  # type: ignore[misc]
    done = watch_until(checks, 180)
    quarantined = [v for k, v in done.items() if k.startswith("q/")]
    drained = [v for k, v in done.items() if k.startswith("d/")]
    missing = len(checks) - len(done)
    if missing:
        print(f"  {missing} of {len(checks)} transitions did not happen within 180 s")
    return quarantined, drained


@contextlib.contextmanager
def scheduler(api: client.ApiClient, evictions_per_s: float) -> Iterator[SchedulerRunner]:
    machine = Settings(breaker=BreakerSettings(max_out_fraction=1.0, max_concurrent_drains=1000))
    settings = RunnerSettings(
        period_s=0.5,
        lease=LeaderElectionConfig(namespace="gpuwarden", identity=unique_name("bench"), lease_duration_s=15.0),
        evictions_per_s=evictions_per_s,
        remediation=ControllerSettings(machine=machine),
    )
    runner = SchedulerRunner(api, settings)
    stop = threading.Event()
    thread = threading.Thread(target=runner.run, args=(stop,), name="scheduler", daemon=True)
    thread.start()
    try:
        wait_for(runner.elector.is_leader, 30, description="the scheduler leads")
        yield runner
    finally:
        stop.set()
        thread.join(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--samples", type=int, default=5, help="single failing nodes, one after another")
    parser.add_argument("--at-once", type=int, default=30, help="nodes failing at the same moment")
    parser.add_argument("--pods-per-node", type=int, default=8, help="gpuwarden pods on each node before its fault")
    parser.add_argument("--drain-pods", type=int, default=3000, help="other schedulers' pods drained from the 30")
    parser.add_argument("--evictions-per-second", type=float, default=200.0)
    parser.add_argument("--poll-interval", type=float, default=5.0, help="agent poll interval, seconds")
    args = parser.parse_args()
    if args.samples + 2 * args.at_once > args.nodes:
        parser.error("--nodes must cover --samples plus twice --at-once")
    configure_logging("console", "error")
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    started = time.monotonic()
    with running_control_plane() as plane:
        for crd in ("crd-gpunodes.yaml", "scheduler/crds"):
            flag = "-k" if not crd.endswith(".yaml") else "-f"
            plane.kubectl("apply", flag, str(REPO / "manifests" / crd))
        plane.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        print(f"control plane up in {time.monotonic() - started:.1f} s")
        with plane.api_client() as api:
            core = client.CoreV1Api(api)
            for ns in (NAMESPACE, "gpuwarden"):
                core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
            client.CustomObjectsApi(api).create_cluster_custom_object(
                contract.SCHEDULING_API_GROUP,
                contract.SCHEDULING_API_VERSION,
                contract.QUEUE_PLURAL,
                {
                    "apiVersion": f"{contract.SCHEDULING_API_GROUP}/{contract.SCHEDULING_API_VERSION}",
                    "kind": contract.QUEUE_KIND,
                    "metadata": {"name": "default"},
                    "spec": {"resources": {"gpu": {"quota": 8 * args.nodes}}},
                },
            )
            names = [f"bench-gpu-{i:03d}" for i in range(args.nodes)]
            agents: list[tuple[AgentDaemon, Monitor, SimNode]] = []
            sims: dict[str, SimNode] = {}
            try:
                t0 = time.monotonic()
                for name in names:
                    create_gpu_node(api, name, gpus=8)
                    agent = start_agent(api, name, args.poll_interval)
                    agents.append(agent)
                    sims[name] = agent[2]
                wait_for(lambda: all(a[0].published_seq > 0 for a in agents), 120, description="agents publish")
                print(f"{args.nodes} nodes with agents in {time.monotonic() - t0:.1f} s")
                with StandInKubelet(api), scheduler(api, args.evictions_per_second):
                    total = args.pods_per_node * (args.samples + args.at_once)
                    for i in range(total):
                        submit(api, f"work-{i}")
                    wait_for(
                        lambda: sum(1 for p in core.list_namespaced_pod(NAMESPACE).items if p.spec.node_name) >= total,
                        180,
                        description="the work is placed",
                    )
                    print(f"{total} gpuwarden pods placed")
                    single_q: list[float] = []
                    single_d: list[float] = []
                    for node in names[: args.samples]:
                        q, d = fail_nodes(api, sims, [node])
                        single_q += q
                        single_d += d
                    summary("one node failing: quarantined", single_q, "p99 < 2 s")
                    summary("one node failing: drained", single_d, "p50 < 10 s")
                    group = names[args.samples : args.samples + args.at_once]
                    q, d = fail_nodes(api, sims, group)
                    summary(f"{len(group)} nodes failing at once: quarantined", q, "p99 < 5 s")
                    summary(f"{len(group)} nodes failing at once: drained", d, "p50 < 10 s")

                    # Evictions per second: other schedulers' pods on 30 healthy nodes, then their fault.
                    drained_group = names[args.samples + args.at_once : args.samples + 2 * args.at_once]
                    for i in range(args.drain_pods):
                        submit(api, f"other-{i}", node=drained_group[i % len(drained_group)], gpus=0)
                    wait_for(
                        lambda: sum(pods_on(api, n) for n in drained_group) >= args.drain_pods,
                        120,
                        description="the pods to drain exist",
                    )
                    t1 = time.monotonic()
                    for node in drained_group:
                        sims[node].inject("xid", gpu=0, xid=79)
                    wait_for(
                        lambda: sum(pods_on(api, n) for n in drained_group) == 0,
                        max(600.0, 3 * args.drain_pods / args.evictions_per_second),
                        interval=0.25,
                        description="the drain finishes",
                    )
                    seconds = time.monotonic() - t1
                    print(
                        f"drained {args.drain_pods} pods of other schedulers from {len(drained_group)} nodes in "
                        f"{seconds:.1f} s: {args.drain_pods / seconds:.0f} evictions/s "
                        f"(limit {args.evictions_per_second:g}/s; NVSentinel: 5/s)"
                    )
            finally:
                for daemon, monitor, _ in agents:
                    daemon.stop()
                    monitor.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
