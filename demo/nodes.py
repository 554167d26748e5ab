"""The simulated GPU nodes: each a sim node, a real agent publishing to the API server, and its repairs.

Many agents share this process, but each is what ``gpuwarden agent
--backend sim`` runs on its own node: a :class:`~agent.monitor.Monitor` over
the node's simulated hardware and an :class:`~agent.daemon.AgentDaemon` with
its own API client, Node and GPUNode, answering remediation's resets and
validations itself. The demo adds only what a person would do: the reboot
or replacement an escalation asks for (:meth:`SimulatedNode.repair`), and a
stopwatch on the poll loop, so the summary can say whether every agent kept
its poll interval on this machine.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from agent.config import config_from_dict
from agent.daemon import AgentDaemon
from agent.model import HealthReport
from agent.monitor import Monitor
from agent.publish.settings import DaemonSettings
from agent.samples import NodeSample
from agent.sim.dra import SimDraDriver
from agent.sim.node import SimNode
from agent.sim.scenario import Scenario
from agent.sources.podresources import KubeletPodResources
from gpuwarden.localcluster.devices import DeviceManager
from gpuwarden.logconfig import get_logger

log = get_logger(__name__)

# How often the simulated DRA driver looks at its GPUs' health (its slice is written only on a change).
DRA_SYNC_S = 1.0


@dataclass(slots=True)
class PollLag:
    """How late scheduled polls came against the poll interval, as the poll loop saw them."""

    interval_s: float
    polls: int = 0
    worst_s: float = 0.0
    _last: float | None = None

    def scheduled_poll(self, now: float) -> None:
        if self._last is not None:
            self.worst_s = max(self.worst_s, now - self._last - self.interval_s)
        self._last = now
        self.polls += 1


class TimedAgentDaemon(AgentDaemon):
    """The agent, unchanged, with each scheduled poll's time noted for :class:`PollLag`."""

    def __init__(self, monitor: Monitor, api_client: client.ApiClient, settings: DaemonSettings) -> None:
        super().__init__(monitor, api_client, settings)
        self.lag = PollLag(monitor.config.poll_interval_s)
        self._lag_lock = threading.Lock()

    def on_report(self, report: HealthReport, sample: NodeSample) -> None:
        if sample.scheduled:
            with self._lag_lock:
                self.lag.scheduled_poll(time.monotonic())
        super().on_report(report, sample)


class SimulatedNode:
    """One simulated GPU node with its agent; see the module docstring."""

    def __init__(
        self,
        name: str,
        pool: str,
        scenario: Scenario,
        configuration: client.Configuration,
        *,
        poll_interval_s: float,
        heartbeat_period_s: float,
        dra: bool = False,
    ) -> None:
        self.name = name
        self.pool = pool
        self.scenario = scenario
        self.sim = SimNode(scenario, identity=name)
        # The kubelet's device manager for this node, serving PodResources to the agent (see
        # gpuwarden.localcluster.devices): whole-GPU pods get the GPUs it picks, not gpuwarden's.
        self._socket_dir = tempfile.mkdtemp(prefix="gw-demo-pr-")
        socket = f"{self._socket_dir}/kubelet.sock"
        self.devices = DeviceManager(self.sim.device_plugin_devices, socket, node=name)
        config = config_from_dict({"poll_interval_s": poll_interval_s, "pod_resources": {"socket": socket}})
        hardware = self.sim.hardware()
        hardware.pod_resources = KubeletPodResources(socket, config.pod_resources.timeout_s)
        self.monitor = Monitor(config, hardware, name)
        # Its own client (connection pool), as a separate agent process would have.
        self.api = client.ApiClient(configuration)
        self.daemon = TimedAgentDaemon(
            self.monitor,
            self.api,
            DaemonSettings(node_name=name, metrics_port=None, heartbeat_period_s=heartbeat_period_s),
        )
        self._processes: dict[int, int] = {}
        self._lock = threading.Lock()
        # On a DRA node, NVIDIA's DRA driver (simulated) publishes the GPUs and taints a failed one.
        self.dra = SimDraDriver(self.api, name, self.sim) if dra else None
        self._dra_stop = threading.Event()
        self._dra_thread = threading.Thread(target=self._dra_loop, name=f"dra-{name}", daemon=True)

    def start(self) -> None:
        self.devices.start()
        self.daemon.start()
        if self.dra is not None:
            self.dra.sync()
            self._dra_thread.start()

    def _dra_loop(self) -> None:
        assert self.dra is not None
        while not self._dra_stop.wait(DRA_SYNC_S):
            try:
                self.dra.sync()
            except client.ApiException as exc:
                log.warning("demo_dra_slice_not_published", node=self.name, status=exc.status)

    def stop(self) -> None:
        self._dra_stop.set()
        if self._dra_thread.is_alive():
            self._dra_thread.join(5)
        self.daemon.stop()
        self.monitor.close()
        self.devices.stop()
        shutil.rmtree(self._socket_dir, ignore_errors=True)
        self.api.close()  # type: ignore[no-untyped-call]

    def admit(self, pod: Mapping[str, Any]) -> tuple[int, ...] | None:
        """The GPU indices the node's device manager gives ``pod``; None when it cannot (the pod fails)."""
        admitted = self.devices.admit(pod)
        if admitted is None:
            return None
        index = {g.uuid: g.index for g in self.sim.sample_gpus()}
        return tuple(sorted(index[d] for d in admitted.devices if d in index))

    def release(self, namespace: str, pod: str) -> None:
        """The pod's containers stopped: its devices are free for the next."""
        self.devices.release(namespace, pod)

    @property
    def published(self) -> bool:
        return self.daemon.published_seq > 0

    def inject(self, kind: str, **params: object) -> None:
        self.sim.inject(kind, **params)

    def gpu_uuid(self, index: int) -> str:
        report = self.monitor.last_report
        gpus = report.gpus if report is not None else ()
        return next((g.uuid for g in gpus if g.index == index and g.uuid), "")

    def using(self, gpus: tuple[int, ...], delta: int) -> None:
        """A container started (``delta`` 1) or stopped (-1) on ``gpus``: their process counts follow.

        A GPU reset waits until no process uses the GPU, as ``nvidia-smi
        --gpu-reset`` refuses to reset a GPU in use; the stand-in kubelet
        reports its containers here so the sim knows.
        """
        with self._lock:
            for index in gpus:
                count = max(0, self._processes.get(index, 0) + delta)
                self._processes[index] = count
                try:
                    self.sim.inject("processes", gpu=index, count=count)
                except ValueError:
                    log.warning("demo_gpu_unknown", node=self.name, gpu=index)

    def repair(self) -> list[str]:
        """What people do for an escalated node: reboot it, replacing what is broken; the entities cleared.

        Every GPU comes back as after a reset (remaps applied, links
        trained, PCIe at full width), every InfiniBand port up at the
        scenario's rate, and the agent's latched faults -- the XIDs of the
        boot before -- are cleared, as a fresh boot starts a fresh kernel log.
        """
        for index in range(self.scenario.gpus.count):
            self.sim.inject("gpu_reset", gpu=index)
        ib = self.scenario.infiniband
        for h in range(ib.hcas):
            for port in range(1, ib.ports_per_hca + 1):
                self.sim.inject("ib_up", device=f"mlx5_{h}", port=port)
                self.sim.inject("ib_rate", device=f"mlx5_{h}", port=port, rate_gbps=ib.rate_gbps)
        report = self.monitor.last_report
        keys = sorted({f.entity.key for f in report.faults}) if report is not None else []
        for key in keys:
            self.monitor.clear(key)
        log.info("demo_node_repaired", node=self.name, cleared=keys)
        return keys

    def clean(self) -> bool:
        """Whether the agent's latest report shows no fault on this node."""
        report = self.monitor.last_report
        return report is not None and not report.faults
