"""The long-running agent: monitor loop, publishers, HTTP endpoint, signals.

Three threads, so that no part can stall another:

* the **monitor** thread polls the hardware and runs the rules
  (:meth:`agent.monitor.Monitor.run`); for each report it only updates the
  metrics, queues the report's Events and hands the report over. Detection
  never waits for the API server.
* the **publisher** thread writes the latest report to Kubernetes
  (conditions, capacity, GPUNode, Events). It coalesces reports -- only the
  latest state matters, Events are queued separately -- and on failure keeps
  the desired state, backs off with jitter, logs once per outage, and
  republishes everything when the API server answers again.
* the **HTTP** thread serves /metrics, /healthz and /readyz (plain HTTP,
  or TLS with delegated authorization of /metrics: :mod:`gpuwarden.serving`).
* the **remediation** thread carries out the GPU resets and validations the
  scheduler asks for in the GPUNode's spec (:mod:`agent.remediation`), and a
  **watch** thread follows the GPUNode so that a request is seen at once; the
  answers go out with the GPUNode's status.

Restart safety: before publishing anything the agent reads its Node and
GPUNode back, seeds the monitor with the faults they record under the
conditions the Node shows True (latched ones stay raised) and publishes only
reports judged after that, so a restarted agent never reports a latched fault
healthy and a steady node sees no flap. Each report carries the restore
epoch it was judged under (:attr:`HealthReport.restore_epoch`); when the
API server is down at start, the monitor keeps judging without the Node's
faults, and those reports -- including one judged just before the restore
that arrives just after it -- are never published. Their fault Events are
held until the restore and then dropped where they re-announce (or clear) a
fault the Node already had; Events that are no fault transition
(application XIDs) and faults that are really new are written. Those
decisions are pure and live in :mod:`agent.restore`; this module keeps the
threads, the locking and the requests.

Request budget in steady state: one heartbeat patch of nodes/status and one
GET of the GPUNode per heartbeat period (60 s by default), plus one open
watch on the GPUNode (re-opened every few minutes), and nothing else;
the GET is what finds a GPUNode deleted behind the agent's back, since its
status is only sent when it changes. The agent does not
watch or poll its Node: what it needs to know about it -- the quarantine
taint, the uid (a recreated Node), a capacity someone else overwrote --
comes back in the response to that heartbeat patch.
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

from agent.allocations import gpu_allocations
from agent.config import ConfigError
from agent.model import HealthReport
from agent.monitor import Monitor
from agent.publish.capacity import CapacityPublisher
from agent.publish.conditions import ConditionsPublisher, format_time, now_utc, parse_time
from agent.publish.events import MAX_QUEUED, EventsPublisher
from agent.publish.gpunode import GpuHolders, GpuNodePublisher, quarantined_since_from_gpunode
from agent.publish.metrics import MetricsPublisher
from agent.publish.pods import PodDirectory
from agent.publish.settings import DaemonSettings, settings_from_args
from agent.remediation.model import (
    RemediationCounts,
    RemediationSpec,
    answers_from_gpunode,
    repaired_at,
    spec_from_gpunode,
    without_repaired,
)
from agent.remediation.watch import GpuNodeWatch
from agent.remediation.worker import Remediator
from agent.restore import (
    FaultTransition,
    RestoredFaults,
    events_after_restore,
    events_to_write,
    faults_to_restore,
    hold,
)
from agent.samples import NodeSample, PodResourcesSample
from gpuwarden.contract import AGENT_COMPONENT, TAINT_QUARANTINE
from gpuwarden.http import HealthServer
from gpuwarden.kube import JSON, ApiError, Backoff, KubeApi, OutageLog, RequestStats, load_api_client
from gpuwarden.logconfig import get_logger
from gpuwarden.serving import build_server
from gpuwarden.servingcert import ServingCertificateError

log = get_logger(__name__)


def _taints(node: JSON) -> list[JSON]:
    spec = node.get("spec") or {}
    return [t for t in spec.get("taints") or [] if isinstance(t, dict)]


class AgentDaemon:
    """One node's agent, connected to Kubernetes. See the module docstring."""

    def __init__(
        self,
        monitor: Monitor,
        api_client: client.ApiClient,
        settings: DaemonSettings,
    ) -> None:
        self.monitor = monitor
        self.settings = settings
        self.stats = RequestStats()
        self.api = KubeApi(
            api_client, field_manager=AGENT_COMPONENT, timeout_s=settings.api_timeout_s, stats=self.stats
        )
        node = settings.node_name
        self.remediation_counts = RemediationCounts()
        self.metrics = MetricsPublisher(self.stats, remediation=self.remediation_counts)
        self.conditions = ConditionsPublisher(
            self.api, node, heartbeat_period_s=settings.heartbeat_period_s, on_node=self._observe_node
        )
        self.capacity = CapacityPublisher(self.api, node)
        self.gpunode = GpuNodePublisher(self.api, node, on_object=self._gpunode_seen)
        self.events = EventsPublisher(self.api, node)
        # UID and scheduler of the pods PodResources says hold a GPU (only where a socket is read).
        self.pods = PodDirectory(self.api, node)
        self.remediator = Remediator(monitor, monitor.hardware.gpu, self._answers, counts=self.remediation_counts)
        self.watch = GpuNodeWatch(
            api_client,
            node,
            self._gpunode_watched,
            stats=self.stats,
            backoff=Backoff(base_s=settings.backoff_base_s, cap_s=settings.backoff_cap_s),
        )
        self.server: HealthServer | None = None
        if settings.metrics_port is not None:
            self.server = build_server(
                self.metrics.registry,
                settings.metrics_security,
                host=settings.metrics_host,
                port=settings.metrics_port,
                liveness=self.liveness,
                readiness=self.readiness,
                api_client=api_client,
                field_manager=AGENT_COMPONENT,
                hosts=[node],
            )
        self._backoff = Backoff(base_s=settings.backoff_base_s, cap_s=settings.backoff_cap_s)
        self._outage = OutageLog()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._latest: HealthReport | None = None
        self._pod_resources: PodResourcesSample | None = None
        self._seq = 0
        # The restore epoch a report must carry to be published; None until
        # the Node's state has been read back.
        self._epoch: int | None = None
        self._restored_faults = RestoredFaults(frozenset(), frozenset())
        # Fault Events of reports judged before the restore, until it comes.
        self._held: list[FaultTransition] = []
        self._retry_at = 0.0
        self._node_uid: str | None = None
        self._quarantined_since: datetime | None = None
        self._started_at = time.monotonic()
        self._last_report_at: float | None = None
        self._published_seq = 0
        self._threads: list[threading.Thread] = []
        # Monotonic start of the publish iteration in progress (None: idle).
        self._publishing_since: float | None = None
        # Every request ends within the API timeout, answered or not, and
        # between requests an iteration only computes: this long inside one
        # iteration with no request finishing is a hang (a deadlock, a call
        # outside the API client), not a slow API server.
        self.publisher_stuck_after_s = max(60.0, 4 * (settings.api_timeout_s + settings.backoff_cap_s))

    # ---------------------------------------------------------------- life

    def start(self) -> None:
        """Read state back, then start the HTTP, publisher and monitor threads.

        The first read-back is tried here, before the first poll, so that in
        the usual case the very first report already carries restored
        faults; if the API server does not answer, the publisher thread keeps
        trying and detection starts anyway.
        """
        self._started_at = time.monotonic()
        try:
            self._restore()
        except ApiError as exc:
            self._failed(exc)
        if self.server is not None:
            self.server.start()
        for name, target in (
            ("gpuwarden-publisher", self._publish_loop),
            ("gpuwarden-monitor", self._monitor_loop),
            ("gpuwarden-remediation", lambda: self.remediator.run(self._stop)),
            ("gpuwarden-gpunode-watch", lambda: self.watch.run(self._stop)),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        log.info(
            "agent_daemon_started",
            node=self.settings.node_name,
            heartbeat_period_s=self.settings.heartbeat_period_s,
            metrics_port=self.server.port if self.server else None,
        )

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the threads; a last attempt writes queued Events.

        The publisher thread may outlive the join (stuck in a request to a
        dead API server); the last flush then waits for its flush rather
        than writing the same Events beside it (EventsPublisher serialises
        flushes), and gives up after ``timeout_s`` so that shutdown cannot
        hang.
        """
        self._stop.set()
        self._wake.set()
        self.monitor.wake()
        self.remediator.wake()
        self.watch.interrupt()
        for thread in self._threads:
            thread.join(timeout=timeout_s)
        self._threads = []
        if self.server is not None:
            self.server.stop()
        if self.events.pending():
            try:
                self.events.flush(wait_s=timeout_s)
            except ApiError as exc:
                log.warning("events_not_written_at_exit", pending=self.events.pending(), error=str(exc))
            else:
                if self.events.pending():
                    log.warning("events_not_written_at_exit", pending=self.events.pending(), error="publisher busy")
        log.info("agent_daemon_stopped", node=self.settings.node_name)

    def __enter__(self) -> AgentDaemon:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------- probes

    def liveness(self, now: float | None = None) -> tuple[bool, str]:
        """Fails when the poll loop stalls, the publisher is stuck, or a thread died.

        The publisher counts as stuck when it has been inside one iteration
        for :attr:`publisher_stuck_after_s` with no API request finishing:
        only a restart gets it going again. Not on API-server trouble -- a
        request to an absent server fails within the timeout and the thread
        backs off between iterations -- since restarting would not fix that.
        ``now`` is the monotonic time to judge at (default: now).
        """
        now = time.monotonic() if now is None else now
        problems: list[str] = []
        limit = max(60.0, 6 * self.monitor.config.poll_interval_s)
        last = self._last_report_at if self._last_report_at is not None else self._started_at
        age = now - last
        if age > limit:
            problems.append(f"no poll completed for {age:.0f}s (limit {limit:.0f}s)")
        since = self._publishing_since
        if since is not None and not self._stop.is_set():
            finished = self.stats.last_finished
            stuck = now - (since if finished is None else max(since, finished))
            if stuck > self.publisher_stuck_after_s:
                problems.append(
                    f"publisher stuck for {stuck:.0f}s with no API request finishing "
                    f"(limit {self.publisher_stuck_after_s:.0f}s)"
                )
        dead = [t.name for t in self._threads if not t.is_alive()]
        if dead and not self._stop.is_set():
            problems.append(f"thread stopped: {', '.join(dead)}")
        return (False, "; ".join(problems)) if problems else (True, "ok")

    def readiness(self) -> tuple[bool, str]:
        if self._last_report_at is None:
            return False, "no poll completed yet"
        return True, "ok"

    # ------------------------------------------------------------ monitor

    def _monitor_loop(self) -> None:
        self.monitor.run(self._stop, self.on_report)

    def on_report(self, report: HealthReport, sample: NodeSample) -> None:
        """Monitor thread: metrics now, Events queued, report handed over.

        The fault Events of a report judged before the restore are held (no
        restore yet) or filtered against the restored faults (a report that
        was being judged while the restore ran); see the module docstring.
        """
        self.metrics.observe_sample(sample)
        self.metrics.observe_report(report)
        self.remediator.observe(report)
        self.metrics.observe_poll_duration(max(0.0, (datetime.now(UTC) - sample.time).total_seconds()))
        with self._lock:
            self._latest = report
            self._pod_resources = sample.pod_resources
            self._seq += 1
            events, held = events_to_write(report, self._epoch, self._restored_faults)
            if held:
                self._hold(held)
        self.events.enqueue(events)
        self._last_report_at = time.monotonic()
        self._wake.set()

    def _hold(self, transitions: list[FaultTransition]) -> None:
        """Keep fault Events until the restore can judge them (caller holds the lock).

        Bounded like the Events queue: an API server that stays away from
        the start cannot grow this without limit; the oldest go first.
        """
        self._held, overflow = hold(self._held, transitions, MAX_QUEUED)
        if overflow > 0:
            log.warning("held_events_dropped", node=self.settings.node_name, dropped=overflow, limit=MAX_QUEUED)

    # -------------------------------------------------------- remediation

    def _gpunode_seen(self, obj: JSON) -> None:
        """A state of the GPUNode read or written by the publisher: its spec holds the requests."""
        self.remediator.set_spec(spec_from_gpunode(obj))

    def _gpunode_watched(self, obj: JSON | None) -> None:
        self.remediator.set_spec(spec_from_gpunode(obj) if obj is not None else RemediationSpec())

    def _answers(self, status: JSON) -> None:
        """Remediation thread: new answers, written by the publisher with the next status."""
        self.gpunode.set_remediation(status)
        self._wake.set()

    # ---------------------------------------------------------- publisher

    def _publish_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._wait_s())
            self._wake.clear()
            if self._stop.is_set():
                return
            if time.monotonic() < self._retry_at:
                continue
            self._publishing_since = time.monotonic()
            try:
                self.publish_once()
            except ApiError as exc:
                self._failed(exc)
            except Exception:
                # A bug must not end publishing for good: log it with its
                # traceback, back off, and try again with the next report.
                log.exception("publish_failed_unexpectedly")
                self._retry_at = time.monotonic() + self._backoff.next_delay()
            finally:
                self._publishing_since = None

    def _wait_s(self) -> float:
        now = time.monotonic()
        if self._retry_at > now:
            return self._retry_at - now
        due = self.conditions.next_due()
        if due is None:
            return 1.0
        return min(max(0.0, due - now), 60.0)

    def publish_once(self) -> None:
        """Bring the API server up to date with the latest report (publisher thread).

        Raises :class:`ApiError`; on success after failures, logs the
        recovery. Public for tests that drive publishing step by step.
        """
        if self._epoch is None:
            self._restore()
        with self._lock:
            report, seq, epoch = self._latest, self._seq, self._epoch
            pod_resources = self._pod_resources
        if report is None or epoch is None or report.restore_epoch < epoch:
            # Judged without the Node's faults: publishing it could turn a
            # latched condition False. The monitor was woken for a new one.
            return
        due = self.conditions.next_due()
        heartbeat = due is not None and time.monotonic() >= due

        def gpunode() -> None:
            if heartbeat:
                # The status goes out only when it changes: without this read a
                # deleted GPUNode would stay gone while the node is steady.
                self.gpunode.verify()
            self.gpunode.publish(report, self._holders(report, pod_resources))

        # Each output on its own: a GPUNode whose CRD is missing must not hold
        # back the conditions or the Events, and a retry re-sends only what
        # failed (what succeeded was answered, so its cache is right).
        failures: list[ApiError] = []
        for publish, publisher in (
            (lambda: self.conditions.publish(report), self.conditions),
            (lambda: self.capacity.publish(report), self.capacity),
            (gpunode, self.gpunode),
            (self.events.flush, None),
        ):
            try:
                publish()
            except ApiError as exc:
                failures.append(exc)
                if publisher is not None:
                    # The request may have been applied without an answer:
                    # this output is sent whole on the retry.
                    publisher.invalidate()
        if failures:
            raise failures[0]
        self._published_seq = seq
        if self._outage.in_outage:
            self._outage.recovered()
        self._backoff.reset()
        self._retry_at = 0.0

    def _holders(self, report: HealthReport, sample: PodResourcesSample | None) -> GpuHolders | None:
        """The GPUs' holders for the GPUNode: the read joined with the pods' identity (None: no socket read).

        Only pods the kubelet says hold a GPU are read (:class:`PodDirectory`);
        a read that fails costs the holders their UID and scheduler, never the
        rest of the GPUNode.
        """
        if sample is None:
            return None
        if not sample.listed:
            return GpuHolders(sample)
        uuids = [g.uuid for g in report.gpus] or self.gpunode.gpu_uuids()
        keys = {(h.namespace, h.pod) for a in gpu_allocations(sample, uuids).values() for h in a.holders}
        return GpuHolders(sample, self.pods.resolve(keys))

    def _failed(self, exc: ApiError) -> None:
        self._outage.failed(exc)
        if exc.status is None:
            # No answer at all: the API server's state is unknown (etcd may
            # come back from a backup), so everything is resent once it
            # answers. An output that was refused invalidated itself alone.
            self.conditions.invalidate()
            self.capacity.invalidate()
            self.gpunode.invalidate()
        self._retry_at = time.monotonic() + self._backoff.next_delay()

    def _restore(self) -> None:
        name = self.settings.node_name
        try:
            node = self.api.get_own_node(name)
        except ApiError as exc:
            if exc.status != 404:
                raise
            raise ApiError(
                "get_node",
                404,
                f"node {name!r} does not exist: --node-name (NODE_NAME from the downward API) "
                "must be the Node's name, which is not always the hostname",
            ) from exc
        gpunode = self.api.get_gpunode(name)
        # Read before the taint is looked at: a quarantine the previous run
        # saw begin keeps its start time.
        self._quarantined_since = quarantined_since_from_gpunode(gpunode)
        self._observe_node(node)
        found = self.conditions.restore(node)
        self.capacity.restore(node)
        # A GPU's last successful reset: what it repaired stays repaired, and
        # kernel-log XIDs from before it (read again from the ring buffer's
        # start) are history.
        resets, validations = answers_from_gpunode(gpunode)
        repaired = repaired_at(resets)
        faults = without_repaired(faults_to_restore(found, self.gpunode.restore(gpunode)), repaired)
        added = self.monitor.restore(faults, repaired)
        self.remediator.restore(resets, validations)
        restored = RestoredFaults.of(faults)
        with self._lock:
            self._epoch = self.monitor.restore_epoch
            self._restored_faults = restored
            held, self._held = self._held, []
        kept = events_after_restore(held, restored)
        self.events.enqueue(kept)
        log.info(
            "state_restored",
            node=name,
            true_conditions=sorted(t.value for t, s in found.items() if s.problem),
            faults=len(faults),
            new_faults=added,
            held_events=len(held),
            held_events_dropped=len(held) - len(kept),
        )
        self.monitor.wake()

    def _observe_node(self, node: JSON) -> None:
        uid = (node.get("metadata") or {}).get("uid")
        if isinstance(uid, str) and uid:
            if self._node_uid is not None and uid != self._node_uid:
                # The Node was deleted and created again under the same name:
                # it has none of our conditions or capacity any more.
                log.warning("node_recreated", node=self.settings.node_name, old_uid=self._node_uid, uid=uid)
                self.conditions.invalidate()
                self.gpunode.invalidate()
            self._node_uid = uid
            self.gpunode.set_node_uid(uid)
            self.events.set_node_uid(uid)
        self.capacity.observe(node)
        self._observe_quarantine(node)

    def _observe_quarantine(self, node: JSON) -> None:
        """Follow the quarantine taint, and since when the node carries it.

        The start is the taint's ``timeAdded`` when its writer set one, else
        the first time this agent (or, through the GPUNode, a previous run)
        saw the taint. Exported as a timestamp so that the "quarantined too
        long" alert compares it with ``time()`` and no scrape gap or agent
        restart restarts its clock.
        """
        taint = next((t for t in _taints(node) if t.get("key") == TAINT_QUARANTINE), None)
        since: datetime | None = None
        if taint is not None:
            since = parse_time(taint.get("timeAdded")) or self._quarantined_since or now_utc()
        if since != self._quarantined_since:
            log.info(
                "quarantine_observed",
                node=self.settings.node_name,
                quarantined=taint is not None,
                since=format_time(since) if since else None,
            )
        self._quarantined_since = since
        self.gpunode.set_quarantined_since(since)
        self.metrics.set_quarantined(taint is not None, since.timestamp() if since else None)

    @property
    def outages(self) -> int:
        """API-server outages seen since start (each logged once)."""
        return self._outage.outages

    @property
    def published_seq(self) -> int:
        """How many reports had arrived when the API server was last brought up to date."""
        return self._published_seq


def run_daemon(args: argparse.Namespace, monitor: Monitor) -> int:
    """``gpuwarden agent`` in connected mode: run until SIGTERM or SIGINT."""
    try:
        settings = settings_from_args(args)
        api_client = load_api_client(args.kubeconfig)
    except ConfigError as exc:
        log.error("agent_config_invalid", error=str(exc))
        return 2
    except Exception as exc:  # the kubernetes config loaders raise several unrelated types
        log.error("kubernetes_config_unusable", kubeconfig=args.kubeconfig, error=str(exc))
        return 2
    stop = threading.Event()

    def _stop(signum: int, _frame: Any) -> None:
        log.info("agent_stopping", signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    with api_client:
        try:
            daemon = AgentDaemon(monitor, api_client, settings)
        except ServingCertificateError as exc:
            log.error("metrics_certificate_unusable", error=str(exc))
            return 2
        except OSError as exc:
            log.error("metrics_port_unavailable", port=settings.metrics_port, error=str(exc))
            return 2
        daemon.start()
        try:
            while not stop.wait(1.0):
                pass
        finally:
            daemon.stop()
    return 0
