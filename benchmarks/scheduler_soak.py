"""A soak of the real ``gpuwarden scheduler`` process under open-loop churn, against a real API server.

Starts the test control plane (etcd, kube-apiserver, kube-controller-manager),
``--nodes`` fake nodes of 8 GPUs, each Ready and with the GPUNode and
NodeConditions its agent would publish, the scheduler's CRDs, namespace, RBAC
and admission policies as the manifests ship them, and ``gpuwarden scheduler``
as its own process with the shipped defaults, authenticated as its
ServiceAccount by a pod-bound token (what the Deployment's pod mounts).
Work arrives as a Poisson process (open loop: an arrival never waits for the
cluster, so a slow scheduler meets a growing queue, not a slower stream), and
a stand-in kubelet plays every bound pod out: Running as soon as its bind is
seen, Succeeded once its time is up (left in place, as a Job's pods are);
an evicted pod's deletion is completed at once, and the pod is made again
under a new name, as a Job's controller replaces a disrupted pod, so that
evicted work waits again instead of leaving the run.

Modes (``--mode``):

* ``steady``: mixed work at about 70 % of the GPUs (``--rate`` overrides the
  jobs per second): half the jobs one whole-GPU pod, three in ten one
  half-GPU slice (``gpuwarden.io/gpu-fraction: 0.5``, created as the admission
  webhook leaves it: runtime class and the ``envFrom`` of its slice ConfigMap),
  two in ten a gang of 2 to 4 pods of 8 GPUs with its PodGroup (``minMember``
  the gang's size, pods naming it by ``scheduling.gpuwarden.io/pod-group``).
  Each job runs uniformly 0.5 to 1.5 times ``--job-seconds`` (60). Jobs go to
  four leaf queues in two departments whose GPU quotas add up to 130 % of
  the cluster (35/15/30/20 % of the arrivals).
* ``backlog``: the same at about 150 %, so thousands of jobs wait.
* ``contender``: single-GPU pods only (70 %), in alternating phases of
  ``--phase-seconds`` (60) on the same nodes, each in a fresh namespace with
  only one scheduler running: ``gpuwarden scheduler`` (pods with
  ``schedulerName: gpuwarden``, bare pods in one queue) and the upstream
  kube-scheduler built with the control plane (``--kube-api-qps=1000
  --kube-api-burst=2000``, leader election off; pods with
  ``schedulerName: default-scheduler`` requesting ``nvidia.com/gpu: 1``).
  Each phase starts once its scheduler bound a canary pod (its start-up and
  first sync are not timed); pods still unbound 10 s after its arrivals end
  are deleted. The idle scheduler is stopped, not left running, so that
  neither pays for the other's churn in CPU. The phases' pods keep running
  into the next phase, so each scheduler meets the other's as foreign load,
  as in a cluster with two schedulers; only the first phase (gpuwarden's)
  starts on an empty cluster. With ``--baseline DIR`` (a checkout of another
  revision, e.g. ``git worktree add DIR REV``) that revision's gpuwarden
  takes phases of its own in the same run (this checkout's, kube-scheduler,
  the baseline's, kube-scheduler, ...); each gpuwarden phase is compared
  with the kube-scheduler phase after it, and the ratios of both revisions
  are printed side by side (min and median over their minutes), so that a
  change is judged against the same machine's noise.

What is measured, all from outside the scheduler except its ``/metrics``:

* every ``--report-seconds`` (10): pods pending (and jobs waiting), running
  and finished, from one watch on the run's pods; the cycles in the interval
  and their mean (the ``gpuwarden_scheduler_cycle_duration_seconds``
  histogram's sum and count) and max (the exact maximum is read from the
  scheduler's ``cycle_done`` log lines; the histogram only bounds it, and
  that bound is printed too); **bind latency** p50/p99 of the pods whose bind
  was seen in the interval, from the moment the watch first saw the pod to the
  moment it saw its ``spec.nodeName`` (both on the same stream, so the
  stream's own delay cancels out); the stand-in kubelet's lag, from bind
  seen to Running written and from due-to-finish to Succeeded written; and
  the arrivals' lag (a create sent later than its arrival time), which must
  stay near zero for the load to be what it claims;
* a summary: the first and last ``--window-seconds`` (60) of arrivals side by
  side (cycles, mean and max, bind p50/p99 per kind, pending), and the
  targets: steady, the cycle mean of the last minute within 1.5x of the
  first's and bind p99 under 3 s in every minute; backlog, cycle mean under
  1 s with 3,000 jobs waiting (500 nodes, 15 minutes); contender, per minute
  gpuwarden's bind p50 and p99 within 1.5x of kube-scheduler's (200 nodes,
  10 minutes), with the ratios;
* **the engine's share** (steady and backlog), over the last 30 s of
  arrivals: the ``gpuwarden_scheduler_session_phase_duration_seconds``
  histograms' sums over every phase (build or update of the working state,
  each action, decisions, undo: the whole engine session) divided by the
  cycle histogram's sum, i.e. engine time over the time the scheduling thread
  spent in cycles; printed per cycle, per phase, and against the window's wall
  time. What the thread does between cycles (waiting for a change, taking
  the cache's view) is in neither histogram;
* **CPU per quiet cycle** (steady): once arrivals stopped and every pod
  finished, and the watch saw no pod change for 5 s, ``utime + stime`` of
  the scheduler process (``/proc/<pid>/stat``) over ``--quiet-seconds`` (30)
  divided by the cycles counted in it; target under 20 ms at 500 nodes.

The targets are the issue's at its sizes (``steady``/``backlog``: 500 nodes,
15 minutes; ``contender``: 200 nodes, 10 minutes), the defaults here; at other
sizes each is still printed beside its figure, for reading, not judging.

Run it (not part of ``make test``)::

    make controlplane   # builds the kube-scheduler too
    .venv/bin/python benchmarks/scheduler_soak.py --mode steady      # 500 nodes, 15 minutes
    .venv/bin/python benchmarks/scheduler_soak.py --mode backlog     # 500 nodes, 15 minutes
    .venv/bin/python benchmarks/scheduler_soak.py --mode contender   # 200 nodes, 10 one-minute phases
    .venv/bin/python benchmarks/scheduler_soak.py --quick [--mode M] # a smoke run: 10 nodes, 15 s, 4 s jobs

``--nodes``, ``--minutes``, ``--job-seconds``, ``--rate`` (jobs per second)
and ``--seed`` change the run; ``--scheduler-arg`` passes one more flag to
``gpuwarden scheduler`` (repeatable); ``--profile DIR`` runs gpuwarden's scheduler
under cProfile and leaves one profile per process there; ``KUBE_SCHEDULER``
names a kube-scheduler binary to use instead of the one beside kube-apiserver.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import heapq
import itertools
import json
import logging
import math
import os
import random
import shutil
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kubernetes import client  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from gpuwarden import contract  # noqa: E402
from gpuwarden.logconfig import configure_logging  # noqa: E402
from scheduler.cluster.sliceadmission import slice_env_source  # noqa: E402
from tests.harness import (  # noqa: E402
    ControlPlane,
    ManagedProcess,
    create_gpu_node,
    find_binaries,
    free_ports,
    pod_bound_token,
    running_control_plane,
)

GPUS_PER_NODE = 8
GPU_MIB = 81559  # what the published GPUNode says each GPU holds (an H100 80GB)
MODES = ("steady", "backlog", "contender")
LOAD = {"steady": 0.7, "backlog": 1.5, "contender": 0.7}
LEASE_NAMESPACE = "gpuwarden"
SCHEDULER_ACCOUNT = "gpuwarden-scheduler"
NAMESPACE_PREFIX = "soak"
LABEL_RUN = "soak.gpuwarden.io/run"
LABEL_KIND = "soak.gpuwarden.io/kind"
LABEL_JOB = "soak.gpuwarden.io/job"
ANNOTATION_SECONDS = "soak.gpuwarden.io/seconds"
IMAGE = "registry.invalid/train:1"
SETUP_THREADS = 8
CREATE_THREADS = 8
KUBELET_THREADS = 6
WATCH_TIMEOUT_S = 60
QUIET_SETTLE_S = 5.0
ENGINE_WINDOW_S = 30.0
READY_TIMEOUT_S = 120.0
CANARY = "canary"
# The sizes: targets are judged there.
TARGET_SIZES = {"steady": (500, 15.0), "backlog": (500, 15.0), "contender": (200, 10.0)}
BACKLOG_WAITING_TARGET = 3000

JSON = dict[str, Any]


# ---------------------------------------------------------------------------
# Settings and the workload
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Settings:
    """One run's parameters, as the command line gave them."""

    mode: str
    nodes: int
    minutes: float
    job_seconds: float
    rate: float | None
    seed: int
    report_s: float
    window_s: float
    quiet_s: float
    phase_s: float

    @property
    def arrival_s(self) -> float:
        return self.minutes * 60.0

    @property
    def gpus(self) -> int:
        return self.nodes * GPUS_PER_NODE

    @property
    def at_target_size(self) -> bool:
        return (self.nodes, self.minutes) == TARGET_SIZES[self.mode]


@dataclass(frozen=True, slots=True)
class Kind:
    """A kind of job in the mix: how often it comes, how many pods, what each asks for."""

    name: str
    weight: float
    min_pods: int
    max_pods: int
    gpus_per_pod: float  # 0.5: a half-GPU slice

    @property
    def mean_gpus(self) -> float:
        return (self.min_pods + self.max_pods) / 2 * self.gpus_per_pod


MIXED = (
    Kind("single", 0.5, 1, 1, 1.0),
    Kind("slice", 0.3, 1, 1, 0.5),
    Kind("gang", 0.2, 2, 4, float(GPUS_PER_NODE)),
)
SINGLE_ONLY = (Kind("single", 1.0, 1, 1, 1.0),)


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """A queue of the tree: its parent, its GPU quota as a share of the cluster, its share of the arrivals."""

    name: str
    parent: str | None
    quota: float
    arrivals: float = 0.0


# Two departments whose quotas add up to 130 % of the GPUs; four leaves take the work.
QUEUE_TREE = (
    QueueSpec("soak-research", None, 0.65),
    QueueSpec("soak-train", "soak-research", 0.40, 0.35),
    QueueSpec("soak-tune", "soak-research", 0.25, 0.15),
    QueueSpec("soak-prod", None, 0.65),
    QueueSpec("soak-serve", "soak-prod", 0.35, 0.30),
    QueueSpec("soak-batch", "soak-prod", 0.30, 0.20),
)
CONTENDER_QUEUE = QueueSpec("soak-churn", None, 1.0, 1.0)


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One arrival: a job of some kind, in a queue, for a while."""

    name: str
    namespace: str
    kind: Kind
    queue: str
    pods: int
    seconds: float
    scheduler: str
    due: float  # when it arrives (monotonic)


class Workload:
    """Draws jobs from the mix with a seeded generator, so a seed gives the same arrivals every run."""

    def __init__(self, kinds: Sequence[Kind], queues: Sequence[QueueSpec], job_seconds: float, seed: int) -> None:
        self.kinds = tuple(kinds)
        self.queues = tuple(q for q in queues if q.arrivals > 0)
        self.job_seconds = job_seconds
        self.rng = random.Random(seed)
        self._seq = itertools.count()

    @property
    def mean_gpus(self) -> float:
        total = sum(k.weight for k in self.kinds)
        return sum(k.weight * k.mean_gpus for k in self.kinds) / total

    def rate_for(self, load: float, gpus: int) -> float:
        """Jobs per second that keep ``load`` of ``gpus`` busy (Little's law: rate x GPUs x seconds)."""
        return load * gpus / (self.mean_gpus * self.job_seconds)

    def next(self, namespace: str, scheduler: str, due: float) -> JobSpec:
        kind = self.rng.choices(self.kinds, weights=[k.weight for k in self.kinds])[0]
        queue = self.rng.choices(self.queues, weights=[q.arrivals for q in self.queues])[0]
        pods = self.rng.randint(kind.min_pods, kind.max_pods)
        seconds = self.job_seconds * self.rng.uniform(0.5, 1.5)
        name = f"{kind.name}-{next(self._seq):06d}"
        return JobSpec(name, namespace, kind, queue.name, pods, seconds, scheduler, due)


# ---------------------------------------------------------------------------
# Small statistics
# ---------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    k = max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))
    return ordered[k]


# Each kind of figure keeps one unit whatever its size, so that compare.py,
# which keys a figure by its line's text and unit, matches it across runs.


def secs(value: float) -> str:
    """A latency or lag in seconds; ``-`` for none."""
    return "- s" if math.isnan(value) else f"{value:.3f} s"


def millis(value: float) -> str:
    """A cycle's (or a phase's) duration or CPU time in milliseconds; ``-`` for none."""
    return "- ms" if math.isnan(value) else f"{value * 1000:.1f} ms"


def pcts(values: Sequence[float]) -> str:
    return f"p50 {secs(percentile(values, 0.5))} p99 {secs(percentile(values, 0.99))}"


def verdict(ok: bool | None) -> str:
    return "not reached" if ok is None else ("meets" if ok else "MISSES")


@dataclass(slots=True)
class Samples:
    """Timestamped values (a lag, a latency) that reports slice by time; thread-safe."""

    values: list[tuple[float, float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, at: float, value: float) -> None:
        with self.lock:
            self.values.append((at, value))

    def between(self, start: float, end: float) -> list[float]:
        with self.lock:
            return [v for t, v in self.values if start <= t < end]


# ---------------------------------------------------------------------------
# The pods, as one watch sees them
# ---------------------------------------------------------------------------


@dataclass(slots=True)
class PodState:
    kind: str
    job: str
    seen: float
    bound: float | None = None
    node: str = ""
    phase: str = "Pending"
    deleting: bool = False
    gone: bool = False


@dataclass(slots=True)
class JobState:
    spec: JobSpec
    pods: int
    created: int = 0
    bound: int = 0
    failed: bool = False
    replaced: int = 0  # pods made again after an eviction


@dataclass(frozen=True, slots=True)
class Counts:
    pending: int
    waiting_jobs: int
    running: int
    finished: int
    evicted: int
    oldest_pending_s: float


class PodWatch:
    """One watch on every pod of the run (by label): creation, bind, phase, deletion, each timestamped.

    The stream is read by hand (JSON lines, decoded as they arrive), so a
    timestamp is when the event reached this process. A bind seen is handed
    to the stand-in kubelet, a deletion in progress too.
    """

    def __init__(self, plane: ControlPlane, run: str, kubelet: StandInKubelet) -> None:
        self._api = plane.api_client()  # the stream holds its connection: a client of its own
        self._core = client.CoreV1Api(self._api)
        self._selector = f"{LABEL_RUN}={run}"
        self._kubelet = kubelet
        self.lock = threading.Lock()
        self.pods: dict[str, PodState] = {}
        self.jobs: dict[str, JobState] = {}
        self.binds: list[tuple[float, float, str, str]] = []  # (seen at, latency, kind, namespace)
        self.events = 0
        self.last_event = time.monotonic()
        # Called with a job and the name of its pod that was evicted (deleted
        # while bound and unfinished): the pod's controller makes it again.
        self.on_evicted: Callable[[JobSpec, str], None] | None = None
        self._stop = threading.Event()
        self._resp: Any = None
        self._version = self._relist()
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)
        self._thread.start()

    def register(self, job: JobSpec) -> None:
        with self.lock:
            self.jobs[f"{job.namespace}/{job.name}"] = JobState(job, job.pods)

    def created(self, job: JobSpec, ok: bool) -> None:
        with self.lock:
            state = self.jobs[f"{job.namespace}/{job.name}"]
            if ok:
                state.created += 1
            else:
                state.failed = True

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):
                resp.shutdown()
        self._thread.join(WATCH_TIMEOUT_S + 5)
        self._api.close()  # type: ignore[no-untyped-call]

    def counts(self, now: float) -> Counts:
        with self.lock:
            pending = running = finished = evicted = 0
            oldest = 0.0
            for p in self.pods.values():
                if p.kind == CANARY:
                    continue
                if p.bound is None:
                    if not p.gone and not p.deleting:
                        pending += 1
                        oldest = max(oldest, now - p.seen)
                elif p.phase == "Succeeded":
                    finished += 1
                elif p.gone or p.deleting:
                    evicted += 1
                else:
                    running += 1
            waiting = sum(1 for j in self.jobs.values() if not j.failed and j.bound < j.pods)
        return Counts(pending, waiting, running, finished, evicted, oldest)

    def latencies(self, start: float, end: float, kind: str | None = None, namespace: str | None = None) -> list[float]:
        with self.lock:
            return [
                lat
                for at, lat, k, ns in self.binds
                if start <= at < end and (kind is None or k == kind) and (namespace is None or ns == namespace)
            ]

    def dump(self, path: Path) -> None:
        """Each pod's first sighting and bind, in wall-clock seconds (to set beside the schedulers' logs)."""
        offset = time.time() - time.monotonic()
        with self.lock:
            rows = [
                {
                    "pod": key,
                    "kind": p.kind,
                    "seen": round(p.seen + offset, 6),
                    "bound": None if p.bound is None else round(p.bound + offset, 6),
                    "node": p.node,
                }
                for key, p in self.pods.items()
            ]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))

    def kinds(self) -> list[str]:
        with self.lock:
            return sorted({p.kind for p in self.pods.values() if p.kind and p.kind != CANARY})

    def bound(self, key: str) -> bool:
        with self.lock:
            state = self.pods.get(key)
            return state is not None and state.bound is not None

    def all_bound(self, namespace: str) -> bool:
        return not self.unbound(namespace)

    def unbound(self, namespace: str) -> list[str]:
        prefix = f"{namespace}/"
        with self.lock:
            return [k for k, p in self.pods.items() if k.startswith(prefix) and p.bound is None and not p.gone]

    def _relist(self) -> str:
        """The current pods as if each had just changed; the version to watch from."""
        listed: Any = self._core.list_pod_for_all_namespaces(label_selector=self._selector, _preload_content=False)
        body = json.loads(listed.data)
        now = time.monotonic()
        for item in body.get("items") or []:
            self._handle({"type": "MODIFIED", "object": item}, now)
        version: str = body["metadata"]["resourceVersion"]
        return version

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._stream()
            except Exception:
                if self._stop.is_set():
                    return
                time.sleep(0.2)
                with contextlib.suppress(Exception):
                    self._version = self._relist()

    def _stream(self) -> None:
        resp: Any = self._core.list_pod_for_all_namespaces(
            label_selector=self._selector,
            watch=True,
            resource_version=self._version,
            timeout_seconds=WATCH_TIMEOUT_S,
            allow_watch_bookmarks=True,
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

    def _handle(self, event: JSON, now: float) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        meta = obj.get("metadata") or {}
        if kind == "ERROR":
            raise RuntimeError(f"watch ended: {obj.get('message')}")
        self._version = meta.get("resourceVersion") or self._version
        if kind == "BOOKMARK":
            return
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        labels = meta.get("labels") or {}
        spec = obj.get("spec") or {}
        node = spec.get("nodeName")
        phase = (obj.get("status") or {}).get("phase") or "Pending"
        bound_now = False
        evicted: JobSpec | None = None
        with self.lock:
            self.events += 1
            self.last_event = now
            state = self.pods.get(key)
            if state is None:
                state = PodState(labels.get(LABEL_KIND, ""), labels.get(LABEL_JOB, ""), now)
                self.pods[key] = state
            state.phase = phase
            if node and state.bound is None:
                state.bound, state.node, bound_now = now, node, True
                self.binds.append((now, now - state.seen, state.kind, key.split("/", 1)[0]))
                job = self.jobs.get(f"{key.split('/', 1)[0]}/{state.job}")
                if job is not None:
                    job.bound += 1
            deleting = meta.get("deletionTimestamp") is not None and not state.deleting
            if deleting:
                state.deleting = True
            if kind == "DELETED":
                state.gone = True
                job = self.jobs.get(f"{key.split('/', 1)[0]}/{state.job}")
                if job is not None and state.bound is not None and phase not in ("Succeeded", "Failed"):
                    job.bound -= 1  # waiting again, for the pod that replaces it
                    job.replaced += 1
                    evicted = job.spec
        namespace, name = key.split("/", 1)
        if evicted is not None and self.on_evicted is not None:
            self.on_evicted(evicted, name)
        if bound_now and phase == "Pending":
            seconds = float((meta.get("annotations") or {}).get(ANNOTATION_SECONDS) or 0)
            self._kubelet.start(namespace, name, now, seconds)
        if deleting and kind != "DELETED":
            self._kubelet.delete(namespace, name)


# ---------------------------------------------------------------------------
# The stand-in kubelet
# ---------------------------------------------------------------------------


def _now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def running_status() -> JSON:
    now = _now_text()
    return {
        "status": {
            "phase": "Running",
            "startTime": now,
            "podIP": "10.1.0.1",
            "hostIP": "10.0.0.1",
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": now}
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ],
            "containerStatuses": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "imageID": "",
                    "ready": True,
                    "restartCount": 0,
                    "started": True,
                    "state": {"running": {"startedAt": now}},
                }
            ],
        }
    }


def succeeded_status(started: str) -> JSON:
    now = _now_text()
    return {
        "status": {
            "phase": "Succeeded",
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now},
                {"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now},
            ],
            "containerStatuses": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "started": False,
                    "state": {
                        "terminated": {
                            "exitCode": 0,
                            "reason": "Completed",
                            "startedAt": started,
                            "finishedAt": now,
                        }
                    },
                }
            ],
        }
    }


def drain(resp: Any) -> int:
    """Read an undecoded reply to its end and give the connection back; its HTTP status."""
    try:
        _ = resp.data
    finally:
        resp.release_conn()
    status: int = resp.status
    return status


@dataclass(order=True, slots=True)
class _Task:
    due: float
    seq: int
    action: str = field(compare=False)  # "run", "finish" or "delete"
    namespace: str = field(compare=False)
    name: str = field(compare=False)
    seconds: float = field(compare=False, default=0.0)
    started: str = field(compare=False, default="")


class StandInKubelet:
    """Writes what kubelets would, from a pool of threads: Running at bind, Succeeded when due, deletions.

    Its own lag is measured, so that a slow kubelet is never mistaken for a
    slow scheduler: ``run_lag`` from bind seen to Running written,
    ``finish_lag`` from due to Succeeded written.
    """

    def __init__(self, plane: ControlPlane, threads: int = KUBELET_THREADS) -> None:
        config = plane.configuration()
        config.connection_pool_maxsize = threads + 2
        self._api = client.ApiClient(config)
        self._core = client.CoreV1Api(self._api)
        self._heap: list[_Task] = []
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._stop = False
        self._gone: set[tuple[str, str]] = set()
        self.run_lag = Samples()
        self.finish_lag = Samples()
        self.errors = 0
        self._threads = [threading.Thread(target=self._work, name=f"kubelet-{i}", daemon=True) for i in range(threads)]
        for t in self._threads:
            t.start()

    def start(self, namespace: str, name: str, seen: float, seconds: float) -> None:
        self._push(_Task(seen, next(self._seq), "run", namespace, name, seconds))

    def delete(self, namespace: str, name: str) -> None:
        self._push(_Task(time.monotonic(), next(self._seq), "delete", namespace, name))

    def backlog(self) -> int:
        now = time.monotonic()
        with self._cond:
            return sum(1 for t in self._heap if t.due <= now)

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        for t in self._threads:
            t.join(15)
        self._api.close()  # type: ignore[no-untyped-call]

    def _push(self, task: _Task) -> None:
        with self._cond:
            heapq.heappush(self._heap, task)
            self._cond.notify()

    def _next(self) -> _Task | None:
        with self._cond:
            while not self._stop:
                now = time.monotonic()
                if self._heap and self._heap[0].due <= now:
                    return heapq.heappop(self._heap)
                self._cond.wait(min(1.0, self._heap[0].due - now) if self._heap else 1.0)
            return None

    def _work(self) -> None:
        while (task := self._next()) is not None:
            key = (task.namespace, task.name)
            try:
                if task.action == "delete":
                    self._gone.add(key)
                    with contextlib.suppress(client.ApiException):
                        drain(
                            self._core.delete_namespaced_pod(
                                task.name, task.namespace, grace_period_seconds=0, _preload_content=False
                            )
                        )
                    continue
                if key in self._gone:
                    continue
                if task.action == "run":
                    started = _now_text()
                    drain(
                        self._core.patch_namespaced_pod_status(
                            task.name, task.namespace, running_status(), _preload_content=False
                        )
                    )
                    done = time.monotonic()
                    self.run_lag.add(done, done - task.due)
                    self._push(
                        _Task(done + task.seconds, next(self._seq), "finish", task.namespace, task.name, 0.0, started)
                    )
                else:
                    drain(
                        self._core.patch_namespaced_pod_status(
                            task.name, task.namespace, succeeded_status(task.started), _preload_content=False
                        )
                    )
                    done = time.monotonic()
                    self.finish_lag.add(done, done - task.due)
            except client.ApiException as exc:
                if exc.status != 404:  # an evicted pod that went before its time was up is no error
                    self.errors += 1
            except Exception:
                self.errors += 1


# ---------------------------------------------------------------------------
# Arrivals
# ---------------------------------------------------------------------------


def pod_body(job: JobSpec, index: int, run: str, name: str | None = None) -> JSON:
    """A pod of ``job``: whole GPUs as a limit (as users write it), or a half-GPU slice as admitted."""
    name = name or (f"{job.name}-{index}" if job.pods > 1 else job.name)
    labels = {LABEL_RUN: run, LABEL_KIND: job.kind.name, LABEL_JOB: job.name}
    annotations = {ANNOTATION_SECONDS: f"{job.seconds:.1f}"}
    container: JSON = {"name": "main", "image": IMAGE}
    spec: JSON = {
        "schedulerName": job.scheduler,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 5,
        "containers": [container],
    }
    if job.scheduler == contract.SCHEDULER_NAME:
        labels[contract.LABEL_QUEUE] = job.queue
    if job.kind.name == CANARY:
        container["resources"] = {"requests": {"cpu": "10m", "memory": "16Mi"}}
    elif job.kind.gpus_per_pod < 1:
        # What the admission webhook gives a slice pod: the slice's envFrom and runtime class.
        annotations[contract.ANNOTATION_GPU_FRACTION] = f"{job.kind.gpus_per_pod:g}"
        container["resources"] = {"requests": {"cpu": "1", "memory": "4Gi"}}
        container["envFrom"] = [slice_env_source(name)]
        spec["runtimeClassName"] = contract.SLICE_RUNTIME_CLASS
    else:
        gpus = int(job.kind.gpus_per_pod)
        cpu, memory = ("1", "4Gi") if gpus == 1 else (str(gpus), f"{8 * gpus}Gi")
        gpu = {contract.RESOURCE_NVIDIA_GPU: str(gpus)}
        container["resources"] = {"requests": {"cpu": cpu, "memory": memory, **gpu}, "limits": gpu}
    if job.kind.max_pods > 1:
        annotations[contract.ANNOTATION_POD_GROUP] = job.name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": spec,
    }


def podgroup_body(job: JobSpec) -> JSON:
    return {
        "apiVersion": f"{contract.SCHEDULING_API_GROUP}/{contract.SCHEDULING_API_VERSION}",
        "kind": contract.PODGROUP_KIND,
        "metadata": {"name": job.name},
        "spec": {"minMember": job.pods, "queue": job.queue},
    }


class Arrivals:
    """Open-loop Poisson arrivals: a thread draws the times, a pool of threads creates the jobs.

    ``lag`` is how late each job's first create left after its arrival time;
    it grows when the pool cannot keep up, and then the offered load is less
    than claimed.
    """

    def __init__(self, plane: ControlPlane, watch: PodWatch, run: str) -> None:
        config = plane.configuration()
        config.connection_pool_maxsize = CREATE_THREADS + 2
        self._api = client.ApiClient(config)
        self._core = client.CoreV1Api(self._api)
        self._custom = client.CustomObjectsApi(self._api)
        self._watch = watch
        self._run = run
        self._pool = ThreadPoolExecutor(CREATE_THREADS, thread_name_prefix="create")
        self.lag = Samples()
        self.jobs = 0
        self.replaced = 0
        self.errors = 0
        self.last_error = ""
        watch.on_evicted = self.replace

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._api.close()  # type: ignore[no-untyped-call]

    def play(
        self, workload: Workload, rate: float, seconds: float, *, namespace: str, scheduler: str, stop: threading.Event
    ) -> None:
        """Submit jobs for ``seconds`` at ``rate`` per second (returns when the last is submitted)."""
        start = time.monotonic()
        due = start
        while not stop.is_set():
            due += workload.rng.expovariate(rate)
            if due >= start + seconds:
                break
            delay = due - time.monotonic()
            if delay > 0 and stop.wait(delay):
                break
            job = workload.next(namespace, scheduler, due)
            self._watch.register(job)
            self.jobs += 1
            self._pool.submit(self._create, job)

    def create(self, job: JobSpec) -> None:
        """One job at once, from the calling thread (a canary)."""
        self._watch.register(job)
        self._create(job)

    def replace(self, job: JobSpec, evicted: str) -> None:
        """Make an evicted pod again under a new name, as its Job's controller would (the job runs from scratch).

        Without this an evicted job just vanished, and reclaim could keep a
        backlog from ever building up: the work it evicted left the run.
        """
        base, _, attempt = evicted.rpartition("-r")
        if not (base and attempt.isdigit()):
            base, attempt = evicted, "0"
        with contextlib.suppress(RuntimeError):  # the pool was shut down: the run is over
            self._pool.submit(self._create_one, job, f"{base}-r{int(attempt) + 1}")
            self.replaced += 1

    def _create_one(self, job: JobSpec, name: str) -> None:
        try:
            body = pod_body(job, 0, self._run, name)
            drain(self._core.create_namespaced_pod(job.namespace, body, _preload_content=False))
        except Exception as exc:
            self.errors += 1
            self.last_error = str(exc)[:300]

    def _create(self, job: JobSpec) -> None:
        body: Callable[[JobSpec, int, str], Any] = pod_body  # the client takes the dict as its V1Pod
        started = time.monotonic()
        if job.kind.name != CANARY:
            self.lag.add(started, started - job.due)
        try:
            if job.kind.max_pods > 1:
                self._custom.create_namespaced_custom_object(
                    contract.SCHEDULING_API_GROUP,
                    contract.SCHEDULING_API_VERSION,
                    job.namespace,
                    contract.PODGROUP_PLURAL,
                    podgroup_body(job),
                )
            for i in range(job.pods):
                drain(self._core.create_namespaced_pod(job.namespace, body(job, i, self._run), _preload_content=False))
                self._watch.created(job, True)
        except Exception as exc:
            self.errors += 1
            self.last_error = str(exc)[:300]
            self._watch.created(job, False)


# ---------------------------------------------------------------------------
# The scheduler processes and what they tell
# ---------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/<pid>/stat (the fields after the command's parenthesis)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


@dataclass(frozen=True, slots=True)
class Scrape:
    """What one read of the scheduler's /metrics (and of its CPU time) said."""

    at: float
    cycles_ok: float = 0.0
    cycles_error: float = 0.0
    cycle_sum: float = 0.0
    cycle_count: float = 0.0
    cycle_buckets: tuple[tuple[float, float], ...] = ()
    phase_sum: Mapping[str, float] = field(default_factory=dict)
    phase_count: Mapping[str, float] = field(default_factory=dict)
    pending: float = 0.0
    binds: Mapping[str, float] = field(default_factory=dict)
    evictions: Mapping[str, float] = field(default_factory=dict)  # "action outcome": count
    api_errors: Mapping[str, float] = field(default_factory=dict)  # by operation
    leader: bool = False
    cpu_s: float = 0.0


def parse_metrics(text: str, at: float, cpu_s: float) -> Scrape:
    cycles: dict[str, float] = {}
    buckets: list[tuple[float, float]] = []
    phase_sum: dict[str, float] = {}
    phase_count: dict[str, float] = {}
    binds: dict[str, float] = {}
    evictions: dict[str, float] = {}
    errors: dict[str, float] = {}
    values: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name, labels, value = s.name, s.labels, float(s.value)
            p = "gpuwarden_scheduler_"
            if name == f"{p}cycles_total":
                cycles[labels.get("result", "")] = value
            elif name == f"{p}cycle_duration_seconds_bucket":
                buckets.append((float(labels["le"]), value))
            elif name == f"{p}session_phase_duration_seconds_sum":
                phase_sum[labels["phase"]] = value
            elif name == f"{p}session_phase_duration_seconds_count":
                phase_count[labels["phase"]] = value
            elif name == f"{p}binds_total":
                binds[labels["outcome"]] = value
            elif name == f"{p}evictions_total":
                evictions[f"{labels['action']} {labels['outcome']}"] = value
            elif name == f"{p}api_errors_total":
                errors[labels["operation"]] = value
            elif name == f"{p}pending_pods":
                values[name] = values.get(name, 0.0) + value
            elif name in (f"{p}cycle_duration_seconds_sum", f"{p}cycle_duration_seconds_count", f"{p}leader"):
                values[name] = value
    return Scrape(
        at=at,
        cycles_ok=cycles.get("ok", 0.0),
        cycles_error=cycles.get("error", 0.0),
        cycle_sum=values.get("gpuwarden_scheduler_cycle_duration_seconds_sum", 0.0),
        cycle_count=values.get("gpuwarden_scheduler_cycle_duration_seconds_count", 0.0),
        cycle_buckets=tuple(sorted(buckets)),
        phase_sum=phase_sum,
        phase_count=phase_count,
        pending=values.get("gpuwarden_scheduler_pending_pods", 0.0),
        binds=binds,
        evictions=evictions,
        api_errors=errors,
        leader=values.get("gpuwarden_scheduler_leader", 0.0) == 1.0,
        cpu_s=cpu_s,
    )


@dataclass(frozen=True, slots=True)
class CycleStats:
    """The cycles between two scrapes: how many, their mean, the histogram's bound on their max."""

    cycles: int
    seconds: float
    engine_s: float
    phases: Mapping[str, float]
    max_bound: float
    cpu_s: float

    @property
    def mean(self) -> float:
        return self.seconds / self.cycles if self.cycles else math.nan

    @staticmethod
    def between(a: Scrape, b: Scrape) -> CycleStats:
        count = round(b.cycle_count - a.cycle_count)
        before = dict(a.cycle_buckets)
        bound = math.nan
        for le, n in b.cycle_buckets:
            if count and n - before.get(le, 0.0) >= count:
                bound = le
                break
        phases = {k: v - a.phase_sum.get(k, 0.0) for k, v in b.phase_sum.items()}
        return CycleStats(count, b.cycle_sum - a.cycle_sum, sum(phases.values()), phases, bound, b.cpu_s - a.cpu_s)


class LogTail:
    """Reads a scheduler's JSON log as it grows: each cycle's exact seconds, and what it warned about."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._offset = 0
        self._rest = b""
        self.warnings: dict[str, int] = {}
        self.examples: dict[str, str] = {}

    def cycles(self) -> list[float]:
        """The seconds of each cycle logged since the last call."""
        try:
            with self._path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        *lines, self._rest = (self._rest + data).split(b"\n")
        out: list[float] = []
        for line in lines:
            if not line.startswith(b"{"):
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            event = str(entry.get("event", ""))
            if event == "cycle_done":
                out.append(float(entry.get("seconds", 0.0)))
            elif entry.get("level") in ("warning", "error", "critical"):
                key = f"{entry.get('level')} {event}"
                self.warnings[key] = self.warnings.get(key, 0) + 1
                self.examples.setdefault(key, json.dumps(entry)[:400])
        return out


def kube_scheduler_binary() -> Path:
    """``KUBE_SCHEDULER``, else the kube-scheduler built beside kube-apiserver."""
    override = os.environ.get("KUBE_SCHEDULER")
    path = Path(override) if override else find_binaries().kube_apiserver.parent / "kube-scheduler"
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise SystemExit(f"no kube-scheduler at {path}: build it with `make controlplane` (or set KUBE_SCHEDULER)")
    return path


@dataclass
class SchedulerProcess:
    """One scheduler process (gpuwarden's, or the upstream one) against the control plane."""

    name: str
    proc: ManagedProcess
    metrics_port: int | None = None
    log: LogTail | None = None

    @property
    def pid(self) -> int:
        assert self.proc.popen is not None
        return self.proc.popen.pid

    def cpu_s(self) -> float:
        try:
            return cpu_seconds(self.pid)
        except (OSError, AssertionError):
            return math.nan

    def scrape(self) -> Scrape | None:
        if self.metrics_port is None:
            return None
        now = time.monotonic()
        cpu = self.cpu_s()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as resp:
                text = resp.read().decode()
        except (OSError, urllib.error.URLError):
            return None
        return parse_metrics(text, now, cpu)

    def ready(self) -> bool:
        if not self.proc.running():
            raise RuntimeError(f"{self.name} exited; its log ends:\n{self.proc.log_tail(30)}")
        if self.metrics_port is None:
            return True
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/readyz", timeout=5) as resp:
                if resp.status != 200:
                    return False
        except (OSError, urllib.error.URLError):
            return False
        scrape = self.scrape()
        return scrape is not None and scrape.leader

    def stop(self) -> None:
        self.proc.stop()


@dataclass
class Launcher:
    """Starts the schedulers: gpuwarden's with its ServiceAccount's kubeconfig, kube-scheduler as admin."""

    plane: ControlPlane
    kubeconfig: Path
    profile_dir: Path | None = None
    # More flags for `gpuwarden scheduler` (--scheduler-arg), to compare its settings.
    extra: tuple[str, ...] = ()
    # A checkout of another revision (--baseline): its gpuwarden, in phases of its own, beside this one's.
    baseline: Path | None = None
    started: list[SchedulerProcess] = field(default_factory=list)
    _count: itertools.count[int] = field(default_factory=itertools.count)

    def gpuwarden(self, *, baseline: bool = False) -> SchedulerProcess:
        """This checkout's scheduler; with ``baseline``, the baseline checkout's (its code, the same flags)."""
        n = next(self._count)
        (port,) = free_ports(1)
        name = f"gpuwarden-scheduler-{n}"
        # Run from the checkout (this one, or the baseline): `-m` imports gpuwarden from the working directory.
        checkout = REPO
        if baseline:
            assert self.baseline is not None
            checkout = self.baseline
        tree = [
            "-C",
            str(checkout),
            "PYTHONPATH=" + os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH")])),
        ]
        python = [sys.executable]
        if self.profile_dir is not None:  # written when the process exits on SIGTERM
            python += ["-m", "cProfile", "-o", str(self.profile_dir / f"{name}.prof")]
        argv = [
            "env",
            *tree,
            f"POD_NAME={name}",  # the identity's prefix, as the Deployment sets it
            *python,
            "-m",
            "gpuwarden.cli",
            "--log-format=json",
            "scheduler",
            f"--kubeconfig={self.kubeconfig}",
            f"--lease-namespace={LEASE_NAMESPACE}",
            "--metrics-address=127.0.0.1",
            f"--metrics-port={port}",
            *self.extra,
        ]
        log_path = self.plane.run_dir / "logs" / f"{name}.log"
        return self._start(SchedulerProcess(name, self._process(name, argv, log_path), port, LogTail(log_path)))

    def kube_scheduler(self, binary: Path) -> SchedulerProcess:
        n = next(self._count)
        name = f"kube-scheduler-{n}"
        argv = [
            str(binary),
            f"--kubeconfig={self.plane.kubeconfig}",
            "--leader-elect=false",
            "--secure-port=0",
            "--kube-api-qps=1000",
            "--kube-api-burst=2000",
            "--v=1",
        ]
        return self._start(SchedulerProcess(name, self._process(name, argv, self.plane.run_dir / "logs" / name)))

    def _process(self, name: str, argv: list[str], log_path: Path) -> ManagedProcess:
        return ManagedProcess(name=name, argv=argv, log_path=log_path, pid_file=self.plane.run_dir / "pids")

    def _start(self, sched: SchedulerProcess) -> SchedulerProcess:
        sched.proc.start()
        self.started.append(sched)
        return sched

    def stop_all(self) -> None:
        for sched in self.started:
            sched.stop()
        self.started.clear()


def wait_until(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.25) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)


# ---------------------------------------------------------------------------
# The cluster
# ---------------------------------------------------------------------------


def publish_health(api: client.ApiClient, node: str) -> None:
    from tests.scheduler.cluster.kube_objects import publish_health as publish

    publish(api, node)


def make_nodes(api: client.ApiClient, count: int) -> list[str]:
    """Ready GPU nodes, each with the GPUNode, capacity and conditions its agent would publish."""
    names = [f"soak-node-{i:04d}" for i in range(count)]

    def one(name: str) -> None:
        create_gpu_node(api, name, gpus=GPUS_PER_NODE, gpu_memory_mib=GPUS_PER_NODE * GPU_MIB)
        publish_health(api, name)

    with ThreadPoolExecutor(SETUP_THREADS) as pool:
        list(pool.map(one, names))
    return names


def make_queues(api: client.ApiClient, tree: Sequence[QueueSpec], gpus: int) -> None:
    custom = client.CustomObjectsApi(api)
    for q in tree:
        spec: JSON = {"resources": {"gpu": {"quota": max(1, math.floor(q.quota * gpus))}}}
        if q.parent:
            spec["parentQueue"] = q.parent
        custom.create_cluster_custom_object(
            contract.SCHEDULING_API_GROUP,
            contract.SCHEDULING_API_VERSION,
            contract.QUEUE_PLURAL,
            {
                "apiVersion": f"{contract.SCHEDULING_API_GROUP}/{contract.SCHEDULING_API_VERSION}",
                "kind": contract.QUEUE_KIND,
                "metadata": {"name": q.name},
                "spec": spec,
            },
        )


def make_namespace(api: client.ApiClient, name: str) -> str:
    client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    return name


def install(plane: ControlPlane, api: client.ApiClient) -> None:
    """CRDs, the scheduler's namespace, RBAC and admission policies as shipped, and the slices' runtime class."""
    manifests = REPO / "manifests"
    plane.kubectl("apply", "-f", str(manifests / "crd-gpunodes.yaml"))
    plane.kubectl("apply", "-k", str(manifests / "scheduler" / "crds"))
    plane.kubectl("apply", "-f", str(manifests / "namespace.yaml"))
    plane.kubectl("apply", "-f", str(manifests / "scheduler" / "rbac.yaml"))
    plane.kubectl("apply", "-f", str(manifests / "scheduler" / "admission-policy.yaml"))
    plane.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    runtime_class: Any = {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": contract.SLICE_RUNTIME_CLASS},
        "handler": "hami",
    }
    client.NodeV1Api(api).create_runtime_class(runtime_class)


def scheduler_kubeconfig(plane: ControlPlane, token: str) -> Path:
    """The control plane's kubeconfig with the scheduler pod's token instead of the admin's."""
    config = yaml.safe_load(plane.kubeconfig.read_text())
    cluster = config["clusters"][0]["name"]
    config["users"] = [{"name": SCHEDULER_ACCOUNT, "user": {"token": token}}]
    config["contexts"] = [{"name": SCHEDULER_ACCOUNT, "context": {"cluster": cluster, "user": SCHEDULER_ACCOUNT}}]
    config["current-context"] = SCHEDULER_ACCOUNT
    path = plane.run_dir / "scheduler.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


# ---------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Interval:
    """One report interval of a gpuwarden run."""

    start: float
    end: float
    counts: Counts
    cycles: CycleStats | None
    logged: tuple[float, ...]
    binds: tuple[float, ...]


@dataclass
class Reporter:
    """Prints a line every interval and keeps what the summary needs."""

    watch: PodWatch
    kubelet: StandInKubelet
    arrivals: Arrivals
    origin: float
    scrapes: list[Scrape] = field(default_factory=list)
    intervals: list[Interval] = field(default_factory=list)
    slack: float = 1.0  # how far from a window's bounds a scrape may have been taken
    _last: float = 0.0

    @property
    def last_tick(self) -> float:
        return self._last

    def begin(self, sched: SchedulerProcess | None) -> None:
        self._last = time.monotonic()
        if sched is not None and (s := sched.scrape()) is not None:
            self.scrapes.append(s)
        if sched is not None and sched.log is not None:
            sched.log.cycles()  # what came before is not the interval's

    def tick(self, sched: SchedulerProcess | None, label: str = "") -> Interval:
        now = time.monotonic()
        start, self._last = self._last, now
        counts = self.watch.counts(now)
        scrape = sched.scrape() if sched is not None else None
        stats: CycleStats | None = None
        if scrape is not None:
            if self.scrapes:
                stats = CycleStats.between(self.scrapes[-1], scrape)
            self.scrapes.append(scrape)
        logged = tuple(sched.log.cycles()) if sched is not None and sched.log is not None else ()
        binds = tuple(self.watch.latencies(start, now))
        interval = Interval(start, now, counts, stats, logged, binds)
        self.intervals.append(interval)
        run_lag = self.kubelet.run_lag.between(start, now)
        finish_lag = self.kubelet.finish_lag.between(start, now)
        arrival_lag = self.arrivals.lag.between(start, now)
        if stats is not None:
            top = max(logged) if logged else math.nan
            cycles = (
                f"cycles {stats.cycles} mean {millis(stats.mean)} max {millis(top)} "
                f"(histogram <= {millis(stats.max_bound)})"
            )
        else:
            cycles = "cycles -"
        c = counts
        print(
            f"{label}at {now - self.origin:.0f} s: pending {c.pending:,} ({c.waiting_jobs:,} jobs, oldest "
            f"{secs(c.oldest_pending_s)}) running {c.running:,} finished {c.finished:,} evicted {c.evicted:,}"
            f" | {cycles} | bind n={len(binds)} {pcts(binds)} | kubelet lag run p99 "
            f"{secs(percentile(run_lag, 0.99))} finish p99 {secs(percentile(finish_lag, 0.99))}"
            f" queued {self.kubelet.backlog()} | arrival lag p99 {secs(percentile(arrival_lag, 0.99))}",
            flush=True,
        )
        return interval

    def window(self, start: float, end: float) -> tuple[CycleStats | None, list[float], list[Interval]]:
        """The cycles (between the scrapes closest to the bounds), the logged cycles and binds of a window."""
        slack = self.slack
        inside = [i for i in self.intervals if i.start >= start - slack and i.end <= end + slack]
        stats = None
        near = [s for s in self.scrapes if start - slack <= s.at <= end + slack]
        if len(near) >= 2:
            stats = CycleStats.between(near[0], near[-1])
        logged = [s for i in inside for s in i.logged]
        return stats, logged, inside


def describe_window(name: str, reporter: Reporter, start: float, end: float) -> CycleStats | None:
    stats, logged, inside = reporter.window(start, end)
    watch = reporter.watch
    binds = watch.latencies(start, end)
    kinds = watch.kinds()
    per_kind = ", ".join(f"{k} {pcts(watch.latencies(start, end, k))}" for k in kinds)
    cycles = "cycles -"
    if stats is not None:
        cycles = f"cycles {stats.cycles} mean {millis(stats.mean)} max {millis(max(logged) if logged else math.nan)}"
    waiting = max((i.counts.waiting_jobs for i in inside), default=0)
    pending = max((i.counts.pending for i in inside), default=0)
    print(
        f"{name} ({end - start:.0f} s): {cycles}; bind n={len(binds)} {pcts(binds)} ({per_kind}); "
        f"pending up to {pending:,} ({waiting:,} jobs)"
    )
    return stats


def report_engine_share(reporter: Reporter, end: float) -> None:
    """Engine time against cycle time and wall time over the last 30 s of arrivals."""
    start = end - ENGINE_WINDOW_S
    near = [s for s in reporter.scrapes if start - reporter.slack <= s.at <= end + reporter.slack]
    if len(near) < 2:
        print("engine share: no window of scrapes")
        return
    a, b = near[0], near[-1]
    stats = CycleStats.between(a, b)
    wall = b.at - a.at
    if not stats.cycles:
        print("engine share: no cycles in the window")
        return
    share = stats.engine_s / stats.seconds if stats.seconds else math.nan
    print(
        f"engine share over the last {wall:.0f} s of arrivals: {stats.cycles} cycles, engine "
        f"{millis(stats.engine_s / stats.cycles)} of {millis(stats.mean)} per cycle ({share:.0%}); "
        f"in cycles {stats.seconds:.2f} s of {wall:.2f} s wall ({stats.seconds / wall:.0%}), engine "
        f"{stats.engine_s:.2f} s ({stats.engine_s / wall:.0%}); scheduler CPU {stats.cpu_s:.2f} s, "
        f"{millis(stats.cpu_s / stats.cycles)} per cycle"
    )
    phases = sorted(stats.phases.items())
    print("  per cycle: " + ", ".join(f"{k} {millis(v / stats.cycles)}" for k, v in phases))


# ---------------------------------------------------------------------------
# The runs
# ---------------------------------------------------------------------------


@dataclass
class Run:
    """What every mode shares: the cluster, the watch, the kubelet, the arrivals, the launcher."""

    settings: Settings
    plane: ControlPlane
    api: client.ApiClient
    launcher: Launcher
    run_id: str
    watch: PodWatch
    kubelet: StandInKubelet
    arrivals: Arrivals
    stop: threading.Event = field(default_factory=threading.Event)

    def report_while(self, reporter: Reporter, busy: Callable[[], bool], sched: SchedulerProcess | None) -> None:
        """Tick every report interval while ``busy()``; the interval the run ends in is reported too."""
        next_tick = time.monotonic() + self.settings.report_s
        while busy():
            time.sleep(min(0.2, max(0.0, next_tick - time.monotonic())))
            if time.monotonic() >= next_tick:
                reporter.tick(sched)
                next_tick += self.settings.report_s
        if time.monotonic() - reporter.last_tick > 1.0:
            reporter.tick(sched)

    def canary(self, namespace: str, scheduler: str, queue: str, n: int) -> None:
        kind = Kind(CANARY, 0, 1, 1, 0)
        job = JobSpec(f"{CANARY}-{n}", namespace, kind, queue, 1, 3600.0, scheduler, time.monotonic())
        self.arrivals.create(job)
        wait_until(lambda: self.watch.bound(f"{namespace}/{job.name}"), READY_TIMEOUT_S, f"{scheduler} binds a canary")


def run_mixed(run: Run) -> None:
    s = run.settings
    namespace = make_namespace(run.api, f"{NAMESPACE_PREFIX}-{s.mode}")
    workload = Workload(MIXED, QUEUE_TREE, s.job_seconds, s.seed)
    rate = s.rate if s.rate is not None else workload.rate_for(LOAD[s.mode], s.gpus)
    offered = rate * workload.mean_gpus * s.job_seconds / s.gpus
    print(
        f"{s.mode}: {s.nodes} nodes x {GPUS_PER_NODE} GPUs, {rate:.2f} jobs/s for {s.minutes:g} min, jobs "
        f"{s.job_seconds:g} s on average (0.5-1.5x), {workload.mean_gpus:.2f} GPUs per job: offered "
        f"{offered:.0%} of the GPUs",
        flush=True,
    )
    sched = run.launcher.gpuwarden()
    wait_until(sched.ready, READY_TIMEOUT_S, "gpuwarden scheduler ready and leading")
    reporter = Reporter(run.watch, run.kubelet, run.arrivals, time.monotonic(), slack=s.report_s / 2)
    reporter.begin(sched)
    origin = reporter.origin
    player = threading.Thread(
        target=functools.partial(
            run.arrivals.play,
            workload,
            rate,
            s.arrival_s,
            namespace=namespace,
            scheduler=contract.SCHEDULER_NAME,
            stop=run.stop,
        ),
        name="arrivals",
        daemon=True,
    )
    player.start()
    run.report_while(reporter, lambda: time.monotonic() < origin + s.arrival_s, sched)
    player.join()
    end = reporter.intervals[-1].end
    print(
        f"arrivals done: {run.arrivals.jobs:,} jobs, {len(run.watch.pods):,} pods "
        f"({run.arrivals.replaced:,} made again after an eviction), create errors "
        f"{run.arrivals.errors}{' (' + run.arrivals.last_error + ')' if run.arrivals.errors else ''}",
        flush=True,
    )

    window = max(s.report_s, min(s.window_s, math.floor(s.arrival_s / 2 / s.report_s) * s.report_s))
    print(f"\nsummary {s.mode} (first and last {window:.0f} s of arrivals):")
    first = describe_window("first window", reporter, origin, origin + window)
    last = describe_window("last window", reporter, end - window, end)
    sized = "" if s.at_target_size else f"; judged at {TARGET_SIZES[s.mode][0]} nodes, {TARGET_SIZES[s.mode][1]:g} min"
    if s.mode == "steady":
        if first is not None and last is not None and first.cycles and last.cycles:
            ratio = last.mean / first.mean
            print(
                f"target cycle mean, last window over first: {millis(last.mean)} / "
                f"{millis(first.mean)} = {ratio:.2f}x [target under 1.5x: {verdict(ratio < 1.5)}{sized}]"
            )
        minutes = per_minute(reporter, origin, end)
        worst = max((percentile(v, 0.99) for v in minutes if v), default=math.nan)
        print(
            f"target bind p99, worst of {len(minutes)} minutes: {secs(worst)} "
            f"[target under 3 s throughout: {verdict(None if math.isnan(worst) else worst < 3.0)}{sized}]"
        )
    else:
        backlogged = [i for i in reporter.intervals if i.counts.waiting_jobs >= BACKLOG_WAITING_TARGET]
        top = max((i.counts.waiting_jobs for i in reporter.intervals), default=0)
        if backlogged and len(reporter.scrapes) >= 2:
            stats, logged, _ = reporter.window(backlogged[0].start, backlogged[-1].end)
            mean = stats.mean if stats is not None else math.nan
            print(
                f"target cycle mean with {BACKLOG_WAITING_TARGET:,}+ jobs waiting ({len(backlogged)} intervals, up to "
                f"{top:,}): {millis(mean)}, max {millis(max(logged) if logged else math.nan)} "
                f"[target under 1 s: {verdict(mean < 1.0)}{sized}]"
            )
        else:
            mean = last.mean if last is not None else math.nan
            print(
                f"target cycle mean with {BACKLOG_WAITING_TARGET:,} jobs waiting: never that many (up to {top:,}); "
                f"last window {millis(mean)} [target under 1 s: {verdict(None)}{sized}]"
            )
    report_engine_share(reporter, end)
    report_kubelet(run, origin, time.monotonic())
    if s.mode == "steady":
        quiet_cpu(run, reporter, sched)
    report_scheduler(sched)


def per_minute(reporter: Reporter, start: float, end: float) -> list[list[float]]:
    out = []
    t = start
    while t < end - 1.0:
        out.append(reporter.watch.latencies(t, min(end, t + 60.0)))
        t += 60.0
    return out


def report_kubelet(run: Run, start: float, end: float) -> None:
    runs = run.kubelet.run_lag.between(start, end)
    finishes = run.kubelet.finish_lag.between(start, end)
    lags = run.arrivals.lag.between(start, end)
    print(
        f"stand-in kubelet lag: bind seen to Running written {pcts(runs)} max "
        f"{secs(max(runs, default=math.nan))}; due to Succeeded written {pcts(finishes)} max "
        f"{secs(max(finishes, default=math.nan))}; errors {run.kubelet.errors}; arrivals lag {pcts(lags)} "
        f"max {secs(max(lags, default=math.nan))}"
    )


def quiet_cpu(run: Run, reporter: Reporter, sched: SchedulerProcess) -> None:
    """CPU of the scheduler per cycle once nothing changes: every pod finished, no pod event for a while."""
    s = run.settings
    drained = time.monotonic() + 1.5 * s.job_seconds + 60.0

    def settled() -> bool:
        c = run.watch.counts(time.monotonic())
        return c.pending == 0 and c.running == 0 and time.monotonic() - run.watch.last_event > QUIET_SETTLE_S

    while not settled() and time.monotonic() < drained:
        time.sleep(0.5)
    c = run.watch.counts(time.monotonic())
    if not settled():
        print(f"quiet window: the cluster never settled ({c.pending} pending, {c.running} running)")
        return
    a = sched.scrape()
    events = run.watch.events
    time.sleep(s.quiet_s)
    b = sched.scrape()
    if a is None or b is None:
        print("quiet window: no metrics")
        return
    stats = CycleStats.between(a, b)
    changed = run.watch.events - events
    per = stats.cpu_s / stats.cycles if stats.cycles else math.nan
    sized = "" if s.nodes == TARGET_SIZES["steady"][0] else f"; judged at {TARGET_SIZES['steady'][0]} nodes"
    print(
        f"quiet window {b.at - a.at:.1f} s ({c.finished:,} finished pods in place, {changed} pod events): "
        f"{stats.cycles} cycles, mean {millis(stats.mean)}, scheduler CPU {stats.cpu_s:.2f} s"
    )
    print(
        f"target CPU per quiet cycle: {millis(per)} [target under 20 ms: "
        f"{verdict(None if math.isnan(per) else per < 0.020)}{sized}]"
    )


def counted(counts: Mapping[str, float]) -> str:
    """The non-zero counts of a family, by label: ``a 3, b 1``."""
    return ", ".join(f"{k} {v:.0f}" for k, v in sorted(counts.items()) if v) or "none"


def report_scheduler(sched: SchedulerProcess) -> None:
    """What the scheduler itself counted and complained about over the run."""
    scrape = sched.scrape()
    if scrape is not None:
        binds = ", ".join(f"{k} {v:.0f}" for k, v in sorted(scrape.binds.items()))
        print(
            f"scheduler: cycles ok {scrape.cycles_ok:.0f} error {scrape.cycles_error:.0f}; binds {binds}; "
            f"evictions {sum(scrape.evictions.values()):.0f} ({counted(scrape.evictions)}); API errors "
            f"{sum(scrape.api_errors.values()):.0f} ({counted(scrape.api_errors)})"
        )
    if sched.log is not None:
        sched.log.cycles()
        for key, n in sorted(sched.log.warnings.items()):
            print(f"  logged {key} x{n}: {sched.log.examples[key]}")


GPUWARDEN = "gpuwarden"
BASELINE = "baseline"
KUBE_SCHEDULER = "kube-scheduler"


def run_contender(run: Run) -> None:
    s = run.settings
    workload = Workload(SINGLE_ONLY, (CONTENDER_QUEUE,), s.job_seconds, s.seed)
    rate = s.rate if s.rate is not None else workload.rate_for(LOAD["contender"], s.gpus)
    # With a baseline checkout its gpuwarden takes phases of its own:
    # this tree's, kube-scheduler, the baseline's, kube-scheduler, ...
    # Each gpuwarden phase is compared with the kube-scheduler phase after it.
    order = [GPUWARDEN, KUBE_SCHEDULER]
    if run.launcher.baseline is not None:
        order += [BASELINE, KUBE_SCHEDULER]
    phases = max(2, round(s.arrival_s / s.phase_s))
    phases += -phases % len(order)  # whole turns: each side gets as many minutes
    print(
        f"contender: {s.nodes} nodes x {GPUS_PER_NODE} GPUs, single-GPU pods at {rate:.2f}/s "
        f"({rate * s.job_seconds / s.gpus:.0%} of the GPUs), jobs {s.job_seconds:g} s on average; "
        f"{phases} phases of {s.phase_s:g} s, " + ", ".join(order) + " in turn",
        flush=True,
    )
    binary = kube_scheduler_binary()
    results: dict[str, list[list[float]]] = {side: [] for side in order}
    paired: dict[str, list[tuple[list[float], list[float]]]] = {GPUWARDEN: [], BASELINE: []}
    origin = time.monotonic()
    reporter = Reporter(run.watch, run.kubelet, run.arrivals, origin, slack=s.report_s / 2)
    for phase in range(phases):
        name = order[phase % len(order)]
        scheduler_name = "default-scheduler" if name == KUBE_SCHEDULER else contract.SCHEDULER_NAME
        namespace = make_namespace(run.api, f"{NAMESPACE_PREFIX}-{phase:02d}-{name}")
        if name == KUBE_SCHEDULER:
            sched = run.launcher.kube_scheduler(binary)
        else:
            sched = run.launcher.gpuwarden(baseline=name == BASELINE)
        try:
            if name != KUBE_SCHEDULER:
                wait_until(sched.ready, READY_TIMEOUT_S, "gpuwarden scheduler ready and leading")
                # Which checkout the process runs (its working directory, which `-m` imports from).
                print(f"[{phase + 1} {name}] code from {os.readlink(f'/proc/{sched.pid}/cwd')}", flush=True)
            run.canary(namespace, scheduler_name, CONTENDER_QUEUE.name, phase)
            reporter.begin(sched)
            cpu0 = sched.cpu_s()
            servers = run.plane.server_pids()
            servers0 = {name: cpu_seconds(pid) for name, pid in servers.items()}
            began = time.monotonic()
            player = threading.Thread(
                target=functools.partial(
                    run.arrivals.play,
                    workload,
                    rate,
                    s.phase_s,
                    namespace=namespace,
                    scheduler=scheduler_name,
                    stop=run.stop,
                ),
                name="arrivals",
                daemon=True,
            )
            player.start()
            label = f"[{phase + 1} {name}] "
            next_tick = began + s.report_s
            while player.is_alive():
                player.join(min(0.2, max(0.0, next_tick - time.monotonic())))
                if time.monotonic() >= next_tick:
                    reporter.tick(sched, label)
                    next_tick += s.report_s
            # The phase's last pods get a moment to bind; those that do not are removed.
            with contextlib.suppress(TimeoutError):
                wait_until(functools.partial(run.watch.all_bound, namespace), 10.0, "the phase's pods bind")
            reporter.tick(sched, label)
            cpu = sched.cpu_s() - cpu0
            # The API server's and etcd's CPU in the phase: what the
            # scheduler's own writes (binds, and gpuwarden's PodGroups and
            # statuses) cost the control plane that both share.
            plane_cpu = {n: cpu_seconds(p) - servers0[n] for n, p in servers.items() if n != "kube-controller-manager"}
            if name != KUBE_SCHEDULER:
                report_scheduler(sched)
        finally:
            sched.stop()
        for key in run.watch.unbound(namespace):
            with contextlib.suppress(client.ApiException):
                client.CoreV1Api(run.api).delete_namespaced_pod(key.split("/", 1)[1], namespace, grace_period_seconds=0)
        lat = run.watch.latencies(began, time.monotonic(), "single", namespace)
        results[name].append(lat)
        if name == KUBE_SCHEDULER:
            previous = order[(phase - 1) % len(order)]
            paired[previous].append((results[previous][-1], lat))
        print(
            f"phase {phase + 1} {name}: n={len(lat)} bind {pcts(lat)} max {secs(max(lat, default=math.nan))}; "
            f"scheduler CPU {cpu:.2f} s; " + ", ".join(f"{n} CPU {v:.2f} s" for n, v in sorted(plane_cpu.items())),
            flush=True,
        )

    print(
        f"\nsummary contender ({len(paired[GPUWARDEN])} minutes of gpuwarden, each against the kube-scheduler minute"
        " after it):"
    )
    sized = "" if s.at_target_size else f"; judged at {TARGET_SIZES['contender'][0]} nodes, 10 min"
    every = True
    for side in (GPUWARDEN, BASELINE):
        for k, (ours, theirs) in enumerate(paired[side]):
            r50 = percentile(ours, 0.5) / percentile(theirs, 0.5)
            r99 = percentile(ours, 0.99) / percentile(theirs, 0.99)
            ok = r50 <= 1.5 and r99 <= 1.5
            judged = ""
            if side == GPUWARDEN:
                every = every and ok
                judged = f" [target within 1.5x: {verdict(ok)}]"
            print(
                f"minute {k + 1}: {side} {pcts(ours)}, kube-scheduler {pcts(theirs)}, ratio p50 {r50:.2f}x "
                f"p99 {r99:.2f}x{judged}"
            )
    for side in dict.fromkeys(order):
        values = [v for m in results[side] for v in m]
        print(f"all minutes: {side} n={len(values)} {pcts(values)}")
    if run.launcher.baseline is not None:
        for q in (0.5, 0.99):
            spread = []
            for side in (BASELINE, GPUWARDEN):
                values = [percentile(o, q) / percentile(t, q) for o, t in paired[side]]
                spread.append(f"{side} {min(values):.2f}x / {statistics.median(values):.2f}x")
            print(f"ratio to kube-scheduler, p{round(q * 100)}, min / median over minutes: " + "; ".join(spread))
    print(
        f"target gpuwarden's bind p50 and p99 within 1.5x of kube-scheduler's in every minute: {verdict(every)}{sized}"
    )
    report_kubelet(run, origin, time.monotonic())


def keep_logs(source: Path, target: Path) -> None:
    """Copy the run's logs out before the control plane's directory is removed with them."""
    target.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.glob("*.log")):
        shutil.copy2(path, target / path.name)
    print(f"logs kept in {target}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=MODES, default="steady")
    parser.add_argument(
        "--nodes", type=int, default=None, help="fake nodes of 8 GPUs (steady/backlog 500, contender 200)"
    )
    parser.add_argument(
        "--minutes", type=float, default=None, help="minutes of arrivals (steady/backlog 15, contender 10)"
    )
    parser.add_argument("--job-seconds", type=float, default=60.0, help="mean seconds a job runs")
    parser.add_argument("--rate", type=float, default=None, help="jobs per second (default: the mode's load)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--report-seconds", type=float, default=10.0, help="seconds between report lines")
    parser.add_argument("--window-seconds", type=float, default=60.0, help="first and last window compared")
    parser.add_argument("--quiet-seconds", type=float, default=30.0, help="the quiet window for CPU per cycle")
    parser.add_argument("--phase-seconds", type=float, default=60.0, help="contender: seconds of one phase")
    parser.add_argument("--profile", type=Path, default=None, help="run gpuwarden under cProfile, profiles here")
    parser.add_argument(
        "--scheduler-arg",
        action="append",
        default=[],
        help="one more flag for `gpuwarden scheduler` (repeatable), e.g. --scheduler-arg=--bookkeeping-defer=5",
    )
    parser.add_argument(
        "--keep-logs",
        type=Path,
        default=None,
        help="copy the schedulers' and the control plane's logs here when the run ends (it removes its own copies), "
        "with pods.jsonl: each pod's first sighting and bind in wall-clock seconds",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="contender: a checkout of another revision (git worktree add DIR REV); its gpuwarden gets phases of "
        "its own, interleaved with this checkout's, and both are printed against kube-scheduler",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 10 nodes, 15 s, 4 s jobs, 5 s reports")
    args = parser.parse_args(argv)
    nodes, minutes = TARGET_SIZES[args.mode]
    if args.quick:
        nodes, minutes = 10, 0.25
        args.job_seconds, args.report_seconds, args.quiet_seconds = 4.0, 5.0, 5.0
        args.window_seconds, args.phase_seconds = 5.0, 8.0
        if args.mode == "contender":
            minutes = 2 * args.phase_seconds / 60
    settings = Settings(
        mode=args.mode,
        nodes=args.nodes or nodes,
        minutes=args.minutes or minutes,
        job_seconds=args.job_seconds,
        rate=args.rate,
        seed=args.seed,
        report_s=args.report_seconds,
        window_s=args.window_seconds,
        quiet_s=args.quiet_seconds,
        phase_s=args.phase_seconds,
    )
    if settings.nodes < 1 or settings.minutes <= 0 or settings.job_seconds <= 0:
        parser.error("--nodes, --minutes and --job-seconds must be positive")
    if settings.rate is not None and settings.rate <= 0:
        parser.error("--rate must be positive")
    configure_logging("console", "error")
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    # The scheduler process imports gpuwarden from this checkout.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    if args.baseline is not None:
        args.baseline = args.baseline.resolve()
        if settings.mode != "contender" or not (args.baseline / "gpuwarden" / "cli.py").is_file():
            parser.error("--baseline is for --mode contender, and names a checkout of gpuwarden")
    if settings.mode == "contender":
        kube_scheduler_binary()  # fail before minutes of set-up
    if args.profile is not None:
        args.profile = args.profile.resolve()
        args.profile.mkdir(parents=True, exist_ok=True)

    began = time.monotonic()
    with running_control_plane() as plane:
        config = plane.configuration()
        config.connection_pool_maxsize = SETUP_THREADS + 2
        with client.ApiClient(config) as api:
            install(plane, api)
            make_nodes(api, settings.nodes)
            queues = (CONTENDER_QUEUE,) if settings.mode == "contender" else QUEUE_TREE
            make_queues(api, queues, settings.gpus)
            print(f"control plane and {settings.nodes} nodes up in {time.monotonic() - began:.1f} s", flush=True)
            with pod_bound_token(api, SCHEDULER_ACCOUNT, LEASE_NAMESPACE) as token:
                launcher = Launcher(
                    plane, scheduler_kubeconfig(plane, token), args.profile, tuple(args.scheduler_arg), args.baseline
                )
                run_id = f"{settings.mode}-{os.getpid()}"
                kubelet = StandInKubelet(plane)
                watch = PodWatch(plane, run_id, kubelet)
                arrivals = Arrivals(plane, watch, run_id)
                run = Run(settings, plane, api, launcher, run_id, watch, kubelet, arrivals)
                try:
                    if settings.mode == "contender":
                        run_contender(run)
                    else:
                        run_mixed(run)
                finally:
                    run.stop.set()
                    launcher.stop_all()
                    arrivals.close()
                    watch.stop()
                    kubelet.stop()
                    if args.keep_logs is not None:
                        keep_logs(plane.run_dir / "logs", args.keep_logs)
                        watch.dump(args.keep_logs / "pods.jsonl")
    print(f"done in {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
