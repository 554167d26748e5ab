"""How fast a fault becomes visible through the Kubernetes API, and what an idle agent costs.

Starts the test control plane (etcd, kube-apiserver, kube-controller-manager
from ``make controlplane``), runs connected sim agents against it exactly as
``gpuwarden agent --backend sim`` does, and measures:

* **XID latency**: a fatal XID injected into the sim node (NVML event and
  kernel-log line) until a watch on the Node sees ``GpuXidError`` True. XIDs
  are event-driven, so this does not wait for a poll. Target: p99 < 1 s.
* **Polled-signal latency**: a PCIe link trained down to x8 until the watch
  sees ``GpuPcieDegraded`` True. This waits for the next poll, so it is
  spread over one poll interval. Target: p99 < poll interval + 1 s.
* **Steady-state requests**: API requests per agent per minute while nothing
  changes, counted twice -- by the agents themselves and by the API server's
  own ``apiserver_request_total`` for the resources only agents write
  (nodes/status, gpunodes, events). Target: at most 2.

Run it (not part of ``make test``; it takes about five minutes)::

    make controlplane
    .venv/bin/python benchmarks/agent_latency.py [--samples 40] [--poll-interval 2] [--steady-seconds 180]

**A fleet** (``--agents N``): N connected sim agents, each with its own Node,
GPUNode, API client, publisher and GPUNode watch, as N agent pods would have,
shared out over ``--processes`` worker processes (the agents of one process
share its interpreter, as the demo's do, so this also shows whether one
interpreter keeps up with many agents' event paths). Every agent polls every
``--poll-interval`` (10 s here, the shipped default) and the starts are
spread over ``--stagger-seconds``. Once all have published, a steady window
counts the API server's requests per second by verb and resource
(``apiserver_request_total``), then fatal XIDs are injected into randomly
chosen agents, ``--concurrent`` at a time, and the time from the injection
(``time.time()`` in the worker, just before the sim node gets it) to the
watch in this process seeing the node's ``GpuXidError`` True (``time.time()``
as the bytes arrive; one machine, one realtime clock) is the figure.
Target: p99 < 100 ms::

    .venv/bin/python benchmarks/agent_latency.py --agents 500 [--processes 4] [--samples 200]
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import random
import resource
import ssl
import statistics
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kubernetes import client  # noqa: E402

from agent.config import config_from_dict  # noqa: E402
from agent.daemon import AgentDaemon  # noqa: E402
from agent.model import HealthReport  # noqa: E402
from agent.monitor import Monitor  # noqa: E402
from agent.publish.settings import DaemonSettings  # noqa: E402
from agent.samples import NodeSample  # noqa: E402
from agent.sim.node import SimNode  # noqa: E402
from agent.sim.scenario import load_scenario  # noqa: E402
from gpuwarden.contract import ConditionType  # noqa: E402
from gpuwarden.logconfig import configure_logging  # noqa: E402
from tests.harness import ControlPlane, create_gpu_node, running_control_plane, unique_name, wait_for  # noqa: E402

# Hardware XIDs (the catalogue's "hardware" kind): each raises GpuXidError.
# Rotating GPU and XID keeps two injections from being one de-duplicated event.
FATAL_XIDS = (79, 48, 95, 46, 61, 62, 74, 109, 119, 120, 140, 158)


@dataclass(slots=True)
class _Wanted:
    """A status one node's condition is awaited to reach, and when the watch saw it."""

    ctype: str
    status: str
    seen: threading.Event = field(default_factory=threading.Event)
    seen_at: float = 0.0


class NodeWatch:
    """A watch on Nodes (one, or all of a label), reporting when a node's condition reaches a status.

    The stream is read by hand (chunked JSON lines) so that the time of each
    event is the time the bytes arrived, not when a client library got to it.
    Times are ``time.time()``: the fleet's injections happen in other
    processes, and the realtime clock is the one they share with this one.
    """

    def __init__(
        self, api: client.ApiClient, *, field_selector: str | None = None, label_selector: str | None = None
    ) -> None:
        self._core = client.CoreV1Api(api)
        self._field_selector = field_selector
        self._label_selector = label_selector
        self._lock = threading.Lock()
        self._wanted: dict[str, _Wanted] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-watch", daemon=True)
        self._resp: Any = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._resp is not None:
            self._resp.release_conn()
        self._thread.join(timeout=5)

    def expect(self, node: str, ctype: str, status: str) -> None:
        """Await ``node``'s ``ctype`` at ``status``; call before causing it, so no event is missed."""
        with self._lock:
            self._wanted[node] = _Wanted(ctype, status)

    def wait(self, node: str, timeout: float) -> float:
        """Wall time the expected status was seen; raises on timeout."""
        with self._lock:
            wanted = self._wanted[node]
        if not wanted.seen.wait(timeout):
            with self._lock:
                self._wanted.pop(node, None)
            raise TimeoutError(f"watch did not see {node} {wanted.ctype}={wanted.status} within {timeout}s")
        return wanted.seen_at

    def _run(self) -> None:
        version = ""
        while not self._stop.is_set():
            try:
                resp: Any = self._core.list_node(
                    field_selector=self._field_selector,
                    label_selector=self._label_selector,
                    watch=True,
                    resource_version=version or None,
                    timeout_seconds=300,
                    _preload_content=False,
                )
                self._resp = resp
                buffer = b""
                expired = False
                for chunk in resp.stream(65536, decode_content=False):
                    now = time.time()
                    buffer += chunk
                    while b"\n" in buffer and not expired:
                        line, buffer = buffer.split(b"\n", 1)
                        if line.strip():
                            seen = self._handle(json.loads(line), now)
                            if seen is None:
                                # The resourceVersion expired (410 Gone): start
                                # the next watch from the current state.
                                version, expired = "", True
                            elif seen:
                                version = seen
                    if self._stop.is_set():
                        return
                    if expired:
                        resp.release_conn()
                        break
            except Exception:
                if self._stop.is_set():
                    return
                time.sleep(0.1)

    def _handle(self, event: dict[str, Any], now: float) -> str | None:
        """Note a wanted status if this event shows it; the event's resourceVersion.

        Returns None for an ERROR event (the watch's version is gone, so the
        caller must not resume from it) and "" for an event without a version.
        """
        obj = event.get("object") or {}
        if event.get("type") == "ERROR":
            return None
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        with self._lock:
            wanted = self._wanted.get(name) if isinstance(name, str) else None
            if wanted is not None:
                conditions = {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []}
                if conditions.get(wanted.ctype) == wanted.status:
                    wanted.seen_at = now
                    wanted.seen.set()
                    del self._wanted[name]
        version = meta.get("resourceVersion")
        return version if isinstance(version, str) else ""


def start_agent(
    api: client.ApiClient, node: str, poll_interval: float, heartbeat: float = 60.0
) -> tuple[AgentDaemon, Monitor, SimNode]:
    sim = SimNode(load_scenario("healthy"), identity=node)
    monitor = Monitor(config_from_dict({"poll_interval_s": poll_interval}), sim.hardware(), node)
    daemon = AgentDaemon(monitor, api, DaemonSettings(node_name=node, metrics_port=None, heartbeat_period_s=heartbeat))
    daemon.start()
    return daemon, monitor, sim


def has_published(daemon: AgentDaemon) -> Callable[[], bool]:
    return lambda: daemon.published_seq > 0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary(name: str, values: list[float], target: float) -> None:
    p50, p99 = percentile(values, 0.5), percentile(values, 0.99)
    verdict = "meets" if p99 < target else "MISSES"
    print(
        f"{name:<32} n={len(values):<4} p50={p50 * 1000:7.1f} ms  p99={p99 * 1000:7.1f} ms  "
        f"max={max(values) * 1000:7.1f} ms  mean={statistics.mean(values) * 1000:7.1f} ms  "
        f"({verdict} target p99 < {target:.1f} s)"
    )


def measure_xid(monitor: Monitor, sim: SimNode, watch: NodeWatch, samples: int) -> list[float]:
    latencies = []
    gpus = sorted(monitor.last_report.gpus if monitor.last_report else (), key=lambda g: g.index)
    for i in range(samples):
        gpu = gpus[i % len(gpus)]
        xid = FATAL_XIDS[(i // len(gpus)) % len(FATAL_XIDS)]
        watch.expect(monitor.node, "GpuXidError", "True")
        t0 = time.time()
        sim.inject("xid", gpu=gpu.index, xid=xid)
        latencies.append(watch.wait(monitor.node, 10) - t0)
        # Repair and re-validation done: the latched fault is cleared.
        watch.expect(monitor.node, "GpuXidError", "False")
        monitor.clear(f"gpu/{gpu.uuid}")
        watch.wait(monitor.node, 10)
        time.sleep(random.uniform(0.05, 0.2))
    return latencies


def measure_polled(monitor: Monitor, sim: SimNode, watch: NodeWatch, samples: int, interval: float) -> list[float]:
    latencies = []
    gpus = sorted(monitor.last_report.gpus if monitor.last_report else (), key=lambda g: g.index)
    for i in range(samples):
        gpu = gpus[i % len(gpus)]
        # Inject at a random phase of the poll cycle, as a real fault would.
        time.sleep(random.uniform(0, interval))
        watch.expect(monitor.node, "GpuPcieDegraded", "True")
        t0 = time.time()
        sim.inject("pcie_width", gpu=gpu.index, width=8)
        latencies.append(watch.wait(monitor.node, interval * 3 + 10) - t0)
        watch.expect(monitor.node, "GpuPcieDegraded", "False")
        sim.inject("pcie_width", gpu=gpu.index, width=16)
        monitor.clear(f"gpu/{gpu.uuid}")
        watch.wait(monitor.node, interval * 3 + 10)
    return latencies


RequestKey = tuple[str, str, str]  # verb, resource, subresource


def apiserver_requests(plane: ControlPlane) -> dict[RequestKey, float]:
    """``apiserver_request_total`` so far, summed per verb, resource and subresource."""
    ctx = ssl.create_default_context(cafile=str(plane.ca_file))
    req = urllib.request.Request(f"{plane.server}/metrics", headers={"Authorization": f"Bearer {plane.admin_token}"})
    with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
        text = resp.read().decode()
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[RequestKey, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":
            continue
        for s in family.samples:
            if s.name.endswith("_total"):
                key = (s.labels.get("verb", ""), s.labels.get("resource", ""), s.labels.get("subresource", ""))
                totals[key] = totals.get(key, 0.0) + s.value
    return totals


def agent_requests(totals: dict[RequestKey, float]) -> float:
    """Of ``totals``, the requests on the resources only agents write.

    The verbs the agent uses; the garbage collector's DELETEs and every
    client's LIST/WATCH are not agent requests.
    """
    return sum(
        value
        for (verb, resource, sub), value in totals.items()
        if verb in {"GET", "POST", "PATCH", "PUT"}
        and ((resource == "nodes" and sub == "status") or resource in {"gpunodes", "events"})
    )


def apiserver_agent_requests(plane: ControlPlane) -> float:
    """Requests the API server counted on the resources only agents write."""
    return agent_requests(apiserver_requests(plane))


def measure_steady(plane: ControlPlane, api: client.ApiClient, agents: int, seconds: float, interval: float) -> None:
    nodes = [unique_name("bench-steady") for _ in range(agents)]
    running: list[tuple[AgentDaemon, Monitor, SimNode]] = []
    try:
        for name in nodes:
            create_gpu_node(api, name)
            running.append(start_agent(api, name, interval))
        # Let every agent publish its first state and settle.
        for daemon, _monitor, _ in running:
            wait_for(has_published(daemon), 30, description="first publish")
        time.sleep(max(5.0, 2 * interval))
        own_before = [d.stats.total_requests() for d, _, _ in running]
        server_before = apiserver_agent_requests(plane)
        t0 = time.monotonic()
        time.sleep(seconds)
        minutes = (time.monotonic() - t0) / 60
        own = [(d.stats.total_requests() - b) / minutes for (d, _, _), b in zip(running, own_before, strict=True)]
        server = (apiserver_agent_requests(plane) - server_before) / minutes / agents
        polls = sum(m.polls for _, m, _ in running)
        print(
            f"{'steady-state requests':<32} agents={agents} window={seconds:.0f} s polls={polls}: "
            f"{statistics.mean(own):.2f} per agent per minute by the agents' count "
            f"(max {max(own):.2f}), {server:.2f} by the API server's count "
            f"({'meets' if max(own) <= 2 and server <= 2 else 'MISSES'} target <= 2)"
        )
    finally:
        for daemon, monitor, _ in running:
            daemon.stop()
            monitor.close()
        core = client.CoreV1Api(api)
        for name in nodes:
            core.delete_node(name)


# ------------------------------------------------------------------ a fleet

FLEET_LABEL = "gpuwarden.io/benchmark-fleet"
FLEET_GPUS = 8


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """One worker process's share of the fleet, and how to reach the API server."""

    worker: int
    workers: int
    server: str
    ca_file: str
    token: str
    nodes: tuple[str, ...]
    poll_interval_s: float
    heartbeat_s: float
    stagger_s: float


class StampedAgentDaemon(AgentDaemon):
    """The agent, unchanged, noting when a report first shows a fatal XID: the figure's first part."""

    def __init__(self, monitor: Monitor, api_client: client.ApiClient, settings: DaemonSettings) -> None:
        super().__init__(monitor, api_client, settings)
        self.xid_reported_at = 0.0
        self._had_xid = False

    def on_report(self, report: HealthReport, sample: NodeSample) -> None:
        has = any(f.condition is ConditionType.GPU_XID_ERROR for f in report.faults)
        if has and not self._had_xid:
            self.xid_reported_at = time.time()
        self._had_xid = has
        super().on_report(report, sample)


@dataclass(slots=True)
class FleetAgent:
    """One node's sim hardware and its agent, with the API client that agent alone uses."""

    sim: SimNode
    monitor: Monitor
    daemon: StampedAgentDaemon
    api: client.ApiClient

    def stop(self) -> None:
        self.daemon.stop()
        self.monitor.close()
        self.api.close()  # type: ignore[no-untyped-call]


def _fleet_configuration(spec: FleetSpec) -> client.Configuration:
    """The admin's connection settings, with urllib3's retries off as ``load_api_client`` sets them."""
    config = client.Configuration()
    config.host = spec.server
    config.ssl_ca_cert = spec.ca_file
    config.verify_ssl = True
    config.api_key = {"authorization": spec.token}
    config.api_key_prefix = {"authorization": "Bearer"}
    config.retries = 0
    return config


def _start_fleet_agent(config: client.Configuration, node: str, spec: FleetSpec) -> FleetAgent:
    sim = SimNode(load_scenario("healthy"), identity=node)
    monitor = Monitor(config_from_dict({"poll_interval_s": spec.poll_interval_s}), sim.hardware(), node)
    api = client.ApiClient(config)
    daemon = StampedAgentDaemon(
        monitor, api, DaemonSettings(node_name=node, metrics_port=None, heartbeat_period_s=spec.heartbeat_s)
    )
    daemon.start()
    return FleetAgent(sim, monitor, daemon, api)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def fleet_worker(spec: FleetSpec, conn: Connection) -> None:
    """A worker process: start its agents (staggered), then answer the parent's commands until "stop".

    Commands are tuples: ``("status",)``, ``("inject", node, gpu, xid)``
    (answered with the wall time just before the sim node got the XID),
    ``("reported", node)`` (when the node's agent last judged a fatal XID
    new), ``("clear", node, gpu)`` (the repair: the GPU's latched fault
    cleared), ``("stats",)`` and ``("stop",)``.
    """
    configure_logging("console", "error")
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    config = _fleet_configuration(spec)
    agents: dict[str, FleetAgent] = {}
    lock = threading.Lock()
    stopping = threading.Event()
    began = time.monotonic()

    def start_all() -> None:
        # Interleaved with the other workers: the fleet's n-th start is at n * stagger / size.
        size = len(spec.nodes) * spec.workers
        for j, node in enumerate(spec.nodes):
            at = began + (j * spec.workers + spec.worker) * spec.stagger_s / max(1, size)
            if stopping.wait(max(0.0, at - time.monotonic())):
                return
            agent = _start_fleet_agent(config, node, spec)
            with lock:
                agents[node] = agent

    starter = threading.Thread(target=start_all, name="fleet-starter", daemon=True)
    starter.start()
    cpu_at_start = _cpu_seconds()
    while True:
        message = conn.recv()
        command = message[0]
        try:
            if command == "status":
                with lock:
                    running = list(agents.values())
                conn.send((len(running), sum(1 for a in running if a.daemon.published_seq > 0)))
            elif command == "inject":
                _, node, gpu, xid = message
                sim = agents[node].sim
                at = time.time()
                sim.inject("xid", gpu=gpu, xid=xid)
                conn.send(at)
            elif command == "reported":
                conn.send(agents[message[1]].daemon.xid_reported_at)
            elif command == "clear":
                _, node, gpu = message
                agent = agents[node]
                report = agent.monitor.last_report
                uuids = [g.uuid for g in (report.gpus if report else ()) if g.index == gpu]
                if not uuids:
                    raise RuntimeError(f"{node}: no GPU {gpu} in the agent's latest report")
                agent.monitor.clear(f"gpu/{uuids[0]}")
                conn.send(True)
            elif command == "stats":
                with lock:
                    running = list(agents.values())
                requests = sum(a.daemon.stats.total_requests() for a in running)
                polls = sum(a.monitor.polls for a in running)
                conn.send(
                    {
                        "requests": requests,
                        "polls": polls,
                        "cpu_s": _cpu_seconds() - cpu_at_start,
                        "rss_mib": _rss_mib(),
                    }
                )
            elif command == "stop":
                stopping.set()
                starter.join()
                with ThreadPoolExecutor(32) as pool:
                    list(pool.map(FleetAgent.stop, agents.values()))
                conn.send(True)
                return
            else:
                conn.send(ValueError(f"unknown command {command!r}"))
        except Exception as exc:
            conn.send(exc)


class FleetWorker:
    """The parent's handle on one worker process: its commands go one at a time."""

    def __init__(self, ctx: Any, spec: FleetSpec) -> None:
        self.spec = spec
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=fleet_worker, args=(spec, child), name=f"fleet-{spec.worker}", daemon=True)
        self._lock = threading.Lock()

    def start(self) -> None:
        self.process.start()

    def call(self, *message: object, timeout: float = 60.0) -> Any:
        with self._lock:
            self._conn.send(message)
            if not self._conn.poll(timeout):
                raise TimeoutError(f"worker {self.spec.worker} did not answer {message[0]!r} within {timeout}s")
            answer = self._conn.recv()
        if isinstance(answer, Exception):
            raise answer
        return answer

    def stop(self) -> None:
        if self.process.is_alive():
            try:
                self.call("stop", timeout=120)
            except (TimeoutError, OSError, EOFError) as exc:
                print(f"worker {self.spec.worker} did not stop cleanly ({exc}); terminating it", file=sys.stderr)
            self.process.join(timeout=10)
            if self.process.is_alive():
                self.process.terminate()
                self.process.join(timeout=10)


def _create_fleet_nodes(plane: ControlPlane, names: list[str]) -> None:
    config = plane.configuration()
    config.connection_pool_maxsize = 8
    with client.ApiClient(config) as api, ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: create_gpu_node(api, n, gpus=FLEET_GPUS, labels={FLEET_LABEL: "true"}), names))


def _request_rates(before: dict[RequestKey, float], after: dict[RequestKey, float], seconds: float) -> None:
    """Print requests per second over a window, in all and per verb and resource, busiest first."""
    deltas = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    deltas = {k: v for k, v in deltas.items() if v > 0}
    total = sum(deltas.values())
    print(f"  API server: {total / seconds:.1f} requests/s in all over {seconds:.0f} s")
    for (verb, res, sub), n in sorted(deltas.items(), key=lambda kv: -kv[1])[:8]:
        name = f"{res}/{sub}" if sub else res
        print(f"    {verb:<6} {name:<22} {n / seconds:8.2f}/s")


@dataclass(slots=True)
class Injections:
    """XIDs injected into random fleet nodes by one or more injector threads, and what the watch saw."""

    workers: dict[str, FleetWorker]
    watch: NodeWatch
    free: list[str]
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Seconds: injection to condition, command sent to injection, injection to the agent's report.
    samples: list[tuple[float, float, float]] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)

    def injector(self, count: int, rng: random.Random) -> None:
        """``count`` times: an XID into a random free node, timed to its condition, then the repair."""
        for _ in range(count):
            time.sleep(rng.uniform(0.1, 0.5))
            with self.lock:
                node = self.free.pop(rng.randrange(len(self.free)))
            worker = self.workers[node]
            gpu, xid = rng.randrange(FLEET_GPUS), rng.choice(FATAL_XIDS)
            self.watch.expect(node, "GpuXidError", "True")
            sent = time.time()
            injected = worker.call("inject", node, gpu, xid)
            try:
                seen = self.watch.wait(node, 30)
            except TimeoutError:
                self.misses.append(node)
            else:
                reported = worker.call("reported", node)
                with self.lock:
                    self.samples.append((seen - injected, injected - sent, reported - injected))
            self.watch.expect(node, "GpuXidError", "False")
            worker.call("clear", node, gpu)
            try:
                self.watch.wait(node, 30)
            except TimeoutError:
                self.misses.append(f"{node} (not cleared)")
                continue  # left out of the free nodes: its state is unknown
            with self.lock:
                self.free.append(node)


def _fleet_stats(handles: list[FleetWorker]) -> list[dict[str, float]]:
    return [h.call("stats") for h in handles]


def run_fleet(plane: ControlPlane, args: argparse.Namespace) -> int:
    """The ``--agents N`` measurement; see the module docstring."""
    n, workers_n = args.agents, max(1, min(args.processes, args.agents))
    names = [f"fleet-{i:04d}" for i in range(n)]
    began = time.monotonic()
    _create_fleet_nodes(plane, names)
    print(f"{n} nodes created in {time.monotonic() - began:.1f} s")
    ctx = multiprocessing.get_context("spawn")
    handles = [
        FleetWorker(
            ctx,
            FleetSpec(
                worker=w,
                workers=workers_n,
                server=plane.server,
                ca_file=str(plane.ca_file),
                token=plane.admin_token,
                nodes=tuple(names[w::workers_n]),
                poll_interval_s=args.poll_interval,
                heartbeat_s=args.heartbeat,
                stagger_s=args.stagger_seconds,
            ),
        )
        for w in range(workers_n)
    ]
    by_node = {node: h for h in handles for node in h.spec.nodes}
    watch = NodeWatch(plane.api_client(), label_selector=f"{FLEET_LABEL}=true")
    watch.start()
    try:
        began = time.monotonic()
        for h in handles:
            h.start()
        deadline = began + args.stagger_seconds + 180
        while True:
            published = sum(h.call("status")[1] for h in handles)
            if published == n:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {published} of {n} agents published")
            time.sleep(1.0)
        print(
            f"{n} agents in {workers_n} processes (poll interval {args.poll_interval:g} s, heartbeat "
            f"{args.heartbeat:g} s, started over {args.stagger_seconds:g} s): all published after "
            f"{time.monotonic() - began:.1f} s"
        )
        # Past the start-up writes and into the polls' rhythm.
        time.sleep(max(5.0, args.poll_interval))

        stats_before, server_before, t0 = _fleet_stats(handles), apiserver_requests(plane), time.monotonic()
        time.sleep(args.steady_seconds)
        stats_after, server_after = _fleet_stats(handles), apiserver_requests(plane)
        window = time.monotonic() - t0
        own = sum(a["requests"] - b["requests"] for a, b in zip(stats_after, stats_before, strict=True))
        server_agent = agent_requests(server_after) - agent_requests(server_before)
        print(
            f"steady state, {n} agents: {own / window:.2f} requests/s by the agents' count "
            f"({own / window * 60 / n:.2f} per agent per minute), {server_agent / window:.2f}/s by the API "
            f"server's count on nodes/status, gpunodes and events"
        )
        _request_rates(server_before, server_after, window)
        for h, a, b in zip(handles, stats_after, stats_before, strict=True):
            cpu = (a["cpu_s"] - b["cpu_s"]) / window * 100
            print(
                f"  worker {h.spec.worker}: {len(h.spec.nodes)} agents, CPU {cpu:.1f} % of a core, "
                f"RSS {a['rss_mib']:.0f} MiB, {(a['polls'] - b['polls']) / window:.1f} polls/s"
            )

        run = Injections(by_node, watch, list(names))
        concurrent = max(1, min(args.concurrent, n))
        shares = [args.samples // concurrent + (1 if i < args.samples % concurrent else 0) for i in range(concurrent)]
        server_before, t0 = apiserver_requests(plane), time.monotonic()
        injectors = [
            threading.Thread(target=run.injector, args=(share, random.Random(i)), daemon=True)
            for i, share in enumerate(shares)
        ]
        for t in injectors:
            t.start()
        for t in injectors:
            t.join()
        window = time.monotonic() - t0
        samples, misses = run.samples, run.misses
        latencies = [lat for lat, _, _ in samples]
        delivery = [d for _, d, _ in samples]
        detected = [r for _, _, r in samples]
        published = [lat - r for lat, _, r in samples]
        print(f"XID injections: {len(samples)} seen, {len(misses)} missed, {concurrent} at a time over {window:.0f} s")
        _request_rates(server_before, apiserver_requests(plane), window)
        if not latencies:
            print("no XID was seen; nothing to report")
            return 1
        p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
        verdict = "meets" if p99 < 0.1 and not misses else "MISSES"
        print(
            f"{'XID -> condition, fleet':<32} n={len(latencies):<4} p50={p50 * 1000:7.1f} ms  "
            f"p99={p99 * 1000:7.1f} ms  min={min(latencies) * 1000:7.1f} ms  max={max(latencies) * 1000:7.1f} ms  "
            f"({verdict} target p99 < 100 ms)"
        )
        for name, part in (
            ("  of it, injection -> report", detected),
            ("  of it, report -> watch", published),
        ):
            print(
                f"{name:<32} p50={percentile(part, 0.5) * 1000:7.1f} ms  p99={percentile(part, 0.99) * 1000:7.1f} ms"
                f"  max={max(part) * 1000:7.1f} ms"
            )
        print(
            f"{'  command to the worker':<32} p50={percentile(delivery, 0.5) * 1000:7.1f} ms  "
            f"p99={percentile(delivery, 0.99) * 1000:7.1f} ms  (not part of the figure above)"
        )
        print(
            f"result mode=fleet agents={n} processes={workers_n} samples={len(latencies)} missed={len(misses)} "
            f"p50_ms={p50 * 1000:.1f} p99_ms={p99 * 1000:.1f} max_ms={max(latencies) * 1000:.1f}"
        )
        return 0 if not misses else 1
    finally:
        watch.stop()
        for h in handles:
            h.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=None, help="latency samples per kind (40; a fleet: 200)")
    parser.add_argument(
        "--poll-interval", type=float, default=None, help="agent poll interval, seconds (2; a fleet: 10)"
    )
    parser.add_argument(
        "--steady-seconds", type=float, default=None, help="steady-state window, seconds (180; a fleet: 120)"
    )
    parser.add_argument("--steady-agents", type=int, default=4, help="agents in the steady-state window")
    parser.add_argument("--agents", type=int, default=0, help="run a fleet of this many agents instead (see above)")
    parser.add_argument("--processes", type=int, default=4, help="a fleet: worker processes its agents share")
    parser.add_argument("--heartbeat", type=float, default=60.0, help="a fleet: agent heartbeat period, seconds")
    parser.add_argument(
        "--stagger-seconds", type=float, default=None, help="a fleet: agent starts spread over this (agents / 20)"
    )
    parser.add_argument("--concurrent", type=int, default=1, help="a fleet: XID injections in flight at once")
    args = parser.parse_args()
    fleet = args.agents > 0
    if args.samples is None:
        args.samples = 200 if fleet else 40
    if args.poll_interval is None:
        args.poll_interval = 10.0 if fleet else 2.0
    if args.steady_seconds is None:
        args.steady_seconds = 120.0 if fleet else 180.0
    if args.stagger_seconds is None:
        args.stagger_seconds = args.agents / 20
    configure_logging("console", "error")
    logging.getLogger("urllib3").setLevel(logging.ERROR)

    started = time.monotonic()
    with running_control_plane() as plane:
        plane.kubectl("apply", "-f", str(REPO / "manifests" / "crd-gpunodes.yaml"))
        plane.kubectl("wait", "--for=condition=Established", "crd/gpunodes.gpuwarden.io", "--timeout=60s")
        print(f"control plane up in {time.monotonic() - started:.1f} s; poll interval {args.poll_interval} s")
        if fleet:
            return run_fleet(plane, args)
        with plane.api_client() as api:
            # Steady state first, before any object is deleted (the garbage
            # collector's follow-up requests would count as agent traffic).
            measure_steady(plane, api, args.steady_agents, args.steady_seconds, args.poll_interval)
            node = unique_name("bench-latency")
            create_gpu_node(api, node)
            daemon, monitor, sim = start_agent(api, node, args.poll_interval)
            watch = NodeWatch(plane.api_client(), field_selector=f"metadata.name={node}")
            watch.start()
            try:
                wait_for(has_published(daemon), 30, description="first publish")
                xid = measure_xid(monitor, sim, watch, args.samples)
                summary("XID -> condition (event-driven)", xid, 1.0)
                polled = measure_polled(monitor, sim, watch, args.samples, args.poll_interval)
                summary("PCIe x8 -> condition (polled)", polled, args.poll_interval + 1.0)
            finally:
                watch.stop()
                daemon.stop()
                monitor.close()
                client.CoreV1Api(api).delete_node(node)
    return 0


if __name__ == "__main__":
    sys.exit(main())
