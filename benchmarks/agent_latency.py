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
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import ssl
import statistics
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kubernetes import client  # noqa: E402

from agent.config import config_from_dict  # noqa: E402
from agent.daemon import AgentDaemon  # noqa: E402
from agent.monitor import Monitor  # noqa: E402
from agent.publish.settings import DaemonSettings  # noqa: E402
from agent.sim.node import SimNode  # noqa: E402
from agent.sim.scenario import load_scenario  # noqa: E402
from gpuwarden.logconfig import configure_logging  # noqa: E402
from tests.harness import ControlPlane, create_gpu_node, running_control_plane, unique_name, wait_for  # noqa: E402

# Hardware XIDs (the catalogue's "hardware" kind): each raises GpuXidError.
# Rotating GPU and XID keeps two injections from being one de-duplicated event.
FATAL_XIDS = (79, 48, 95, 46, 61, 62, 74, 109, 119, 120, 140, 158)


class NodeWatch:
    """A watch on one Node, reporting when a condition reaches a status.

    The stream is read by hand (chunked JSON lines) so that the time of each
    event is the time the bytes arrived, not when a client library got to it.
    """

    def __init__(self, api: client.ApiClient, node: str) -> None:
        self._core = client.CoreV1Api(api)
        self._node = node
        self._lock = threading.Lock()
        self._want: tuple[str, str] | None = None
        self._seen = threading.Event()
        self._seen_at = 0.0
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

    def expect(self, ctype: str, status: str) -> None:
        with self._lock:
            self._want = (ctype, status)
            self._seen.clear()

    def wait(self, timeout: float) -> float:
        """Monotonic time the expected status was seen; raises on timeout."""
        if not self._seen.wait(timeout):
            raise TimeoutError(f"watch did not see {self._want} within {timeout}s")
        return self._seen_at

    def _run(self) -> None:
        version = ""
        while not self._stop.is_set():
            try:
                resp: Any = self._core.list_node(
                    field_selector=f"metadata.name={self._node}",
                    watch=True,
                    resource_version=version or None,
                    timeout_seconds=300,
                    _preload_content=False,
                )
                self._resp = resp
                buffer = b""
                expired = False
                for chunk in resp.stream(4096, decode_content=False):
                    now = time.monotonic()
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
        """Note the wanted status if this event shows it; the event's resourceVersion.

        Returns None for an ERROR event (the watch's version is gone, so the
        caller must not resume from it) and "" for an event without a version.
        """
        obj = event.get("object") or {}
        if event.get("type") == "ERROR":
            return None
        conditions = {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []}
        with self._lock:
            if self._want is not None and conditions.get(self._want[0]) == self._want[1] and not self._seen.is_set():
                self._seen_at = now
                self._seen.set()
        version = (obj.get("metadata") or {}).get("resourceVersion")
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
        watch.expect("GpuXidError", "True")
        t0 = time.monotonic()
        sim.inject("xid", gpu=gpu.index, xid=xid)
        latencies.append(watch.wait(10) - t0)
        # Repair and re-validation done: the latched fault is cleared.
        watch.expect("GpuXidError", "False")
        monitor.clear(f"gpu/{gpu.uuid}")
        watch.wait(10)
        time.sleep(random.uniform(0.05, 0.2))
    return latencies


def measure_polled(monitor: Monitor, sim: SimNode, watch: NodeWatch, samples: int, interval: float) -> list[float]:
    latencies = []
    gpus = sorted(monitor.last_report.gpus if monitor.last_report else (), key=lambda g: g.index)
    for i in range(samples):
        gpu = gpus[i % len(gpus)]
        # Inject at a random phase of the poll cycle, as a real fault would.
        time.sleep(random.uniform(0, interval))
        watch.expect("GpuPcieDegraded", "True")
        t0 = time.monotonic()
        sim.inject("pcie_width", gpu=gpu.index, width=8)
        latencies.append(watch.wait(interval * 3 + 10) - t0)
        watch.expect("GpuPcieDegraded", "False")
        sim.inject("pcie_width", gpu=gpu.index, width=16)
        monitor.clear(f"gpu/{gpu.uuid}")
        watch.wait(interval * 3 + 10)
    return latencies


def apiserver_agent_requests(plane: ControlPlane) -> float:
    """Requests the API server counted on the resources only agents write."""
    ctx = ssl.create_default_context(cafile=str(plane.ca_file))
    req = urllib.request.Request(f"{plane.server}/metrics", headers={"Authorization": f"Bearer {plane.admin_token}"})
    with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
        text = resp.read().decode()
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":
            continue
        for s in family.samples:
            if not s.name.endswith("_total"):
                continue
            labels = s.labels
            resource = labels.get("resource")
            sub = labels.get("subresource", "")
            # The verbs the agent uses; the garbage collector's DELETEs and
            # every client's LIST/WATCH are not agent requests.
            if labels.get("verb") not in {"GET", "POST", "PATCH", "PUT"}:
                continue
            if (resource == "nodes" and sub == "status") or resource in {"gpunodes", "events"}:
                total += s.value
    return total


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=40, help="latency samples per kind")
    parser.add_argument("--poll-interval", type=float, default=2.0, help="agent poll interval, seconds")
    parser.add_argument("--steady-seconds", type=float, default=180.0, help="steady-state window, seconds")
    parser.add_argument("--steady-agents", type=int, default=4, help="agents in the steady-state window")
    args = parser.parse_args()
    configure_logging("console", "error")
    logging.getLogger("urllib3").setLevel(logging.ERROR)

    started = time.monotonic()
    with running_control_plane() as plane:
        plane.kubectl("apply", "-f", str(REPO / "manifests" / "crd-gpunodes.yaml"))
        plane.kubectl("wait", "--for=condition=Established", "crd/gpunodes.gpuwarden.io", "--timeout=60s")
        print(f"control plane up in {time.monotonic() - started:.1f} s; poll interval {args.poll_interval} s")
        with plane.api_client() as api:
            # Steady state first, before any object is deleted (the garbage
            # collector's follow-up requests would count as agent traffic).
            measure_steady(plane, api, args.steady_agents, args.steady_seconds, args.poll_interval)
            node = unique_name("bench-latency")
            create_gpu_node(api, node)
            daemon, monitor, sim = start_agent(api, node, args.poll_interval)
            watch = NodeWatch(plane.api_client(), node)
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
