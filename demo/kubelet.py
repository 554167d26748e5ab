"""The stand-in kubelet: bound pods run for their scripted time, evicted pods go, as kubelets would make them.

There are no real kubelets in the local cluster, so the demo writes what
they would: a pod bound to a node is reported Running, and after the
duration its job was given (the ``demo.gpuwarden.io/duration-s`` annotation)
Succeeded, which the Job controller and the stand-in training operator count
as a completion; a pod being deleted (an eviction) is reported Failed, its
containers killed, and removed for good at once, as a kubelet does. While a pod runs, the
GPUs it was given count a process each on the simulated node, so a GPU reset
waits for the drain exactly as it would on real hardware.

Which GPUs a pod is given is the node's device manager's choice
(:class:`Devices`, :mod:`gpuwarden.localcluster.devices`), among those the
simulated device plugin offers, as on a device-plugin node: never read from
gpuwarden's assignment annotation. So a whole-GPU pod can land on a GPU
gpuwarden has quarantined for a fault the device plugin does not check; the
kubelet notes each such landing (:attr:`StandInKubelet.landed`) and when the
pod left that GPU, for the summary.
"""

from __future__ import annotations

import contextlib
import heapq
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes import client, watch

from demo.kube import meta, sub, to_json
from gpuwarden import contract
from gpuwarden.localcluster import complete_pod_deletion, mark_pod_finished, mark_pod_running
from gpuwarden.logconfig import get_logger
from scheduler.cluster.assignment import decode_assignment

log = get_logger(__name__)

LABEL_PART_OF = "app.kubernetes.io/part-of"
PART_OF = "gpuwarden-demo"
ANNOTATION_DURATION = "demo.gpuwarden.io/duration-s"
# The job a pod belongs to (its Job, PyTorchJob or the pod itself), so a pod made again is known as the same work.
LABEL_JOB = "demo.gpuwarden.io/job"

# A container started (+1) or stopped (-1) on these GPUs of this node.
OnGpus = Callable[[str, tuple[int, ...], int], None]


@dataclass(frozen=True, slots=True)
class RunningPod:
    uid: str
    namespace: str
    name: str
    node: str
    gpus: tuple[int, ...]
    job: str


class Devices(Protocol):
    """The nodes' device managers, as the stand-in kubelet asks them."""

    def admit(self, node: str, pod: Mapping[str, Any]) -> tuple[int, ...] | None:
        """The GPU indices the node's device manager gives the pod; None when it cannot (the pod fails)."""
        ...

    def release(self, node: str, namespace: str, name: str) -> None: ...

    def quarantined(self, node: str) -> frozenset[int]:
        """The node's GPUs remediation has quarantined now."""
        ...


@dataclass(slots=True)
class Landing:
    """A pod the device manager started on a quarantined GPU, and when it left it (None: still there).

    ``evicted`` says how it left: deleted (the scheduler's eviction, what
    the summary times) or finished on its own before anyone moved it.
    """

    node: str
    pod: str
    gpus: tuple[int, ...]
    at: float
    left_at: float | None = None
    evicted: bool = False


class StandInKubelet:
    """Watches the demo's pods and plays every node's kubelet for them; see the module docstring."""

    def __init__(
        self,
        api: client.ApiClient,
        on_gpus: OnGpus,
        clock: Callable[[], float] = time.monotonic,
        devices: Devices | None = None,
    ) -> None:
        self._api = api
        self._on_gpus = on_gpus
        self._clock = clock
        self._devices = devices
        # Pods the device manager started on a quarantined GPU, by pod uid.
        self.landed: dict[str, Landing] = {}
        # (when, node, job label) of every running pod whose deletion (an eviction) it finished.
        self.evicted: list[tuple[float, str, str]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._running: dict[str, RunningPod] = {}
        self._due: list[tuple[float, str]] = []
        self._threads = [
            threading.Thread(target=self._watch_loop, name="demo-kubelet-watch", daemon=True),
            threading.Thread(target=self._finish_loop, name="demo-kubelet-finish", daemon=True),
        ]
        self._stream: watch.Watch | None = None
        self.started = 0
        self.finished = 0
        self.deleted = 0

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._stream is not None:
            self._stream.stop()  # type: ignore[no-untyped-call]
        for thread in self._threads:
            thread.join(10)

    # ------------------------------------------------------------- watch

    def _watch_loop(self) -> None:
        core = client.CoreV1Api(self._api)
        while not self._stop.is_set():
            self._stream = watch.Watch()  # type: ignore[no-untyped-call]
            try:
                for event in self._stream.stream(  # type: ignore[no-untyped-call]
                    core.list_pod_for_all_namespaces, label_selector=f"{LABEL_PART_OF}={PART_OF}", timeout_seconds=30
                ):
                    if self._stop.is_set():
                        break
                    self._handle(str(event["type"]), event["object"])
            except Exception as exc:  # an API server answering badly for a moment: watch again
                if not self._stop.is_set():
                    log.warning("demo_kubelet_watch_failed", error=str(exc))
                    self._stop.wait(0.5)
            finally:
                self._stream.stop()  # type: ignore[no-untyped-call]

    def _handle(self, kind: str, obj: object) -> None:
        pod = to_json(self._api, obj)
        metadata, spec, status = meta(pod), sub(pod, "spec"), sub(pod, "status")
        uid, name, namespace = str(metadata.get("uid")), str(metadata.get("name")), str(metadata.get("namespace"))
        if kind == "DELETED":
            self._stopped(uid, evicted=True)
            return
        if metadata.get("deletionTimestamp"):
            running = self._stopped(uid, evicted=True)
            if running is not None:
                self.evicted.append((self._clock(), running.node, running.job))
                # The containers were killed: the pod failed (as a kubelet reports it before the
                # deletion ends), which is what lets the Job controller replace it.
                with contextlib.suppress(client.ApiException):
                    mark_pod_finished(self._api, name, namespace, succeeded=False)
            with contextlib.suppress(client.ApiException):
                complete_pod_deletion(self._api, name, namespace)
                self.deleted += 1
            return
        node = spec.get("nodeName")
        if not isinstance(node, str) or not node or status.get("phase") != "Pending":
            return
        with self._lock:
            if uid in self._running:
                return
        annotations: Mapping[str, str] = metadata.get("annotations") or {}
        labels: Mapping[str, str] = metadata.get("labels") or {}
        gpus = self._admit(node, pod, annotations)
        if gpus is None:
            # The device manager cannot serve it: the kubelet fails the pod at admission.
            with contextlib.suppress(client.ApiException):
                mark_pod_finished(self._api, name, namespace, succeeded=False)
            return
        try:
            mark_pod_running(self._api, name, namespace)
        except client.ApiException as exc:
            log.warning("demo_kubelet_start_failed", pod=f"{namespace}/{name}", status=exc.status)
            if self._devices is not None:
                self._devices.release(node, namespace, name)
            return
        bad = self._devices.quarantined(node).intersection(gpus) if self._devices is not None and gpus else set()
        if bad:
            self.landed[uid] = Landing(node, f"{namespace}/{name}", tuple(sorted(bad)), self._clock())
            log.info("demo_pod_on_quarantined_gpu", node=node, pod=f"{namespace}/{name}", gpus=sorted(bad))
        running = RunningPod(uid, namespace, name, node, gpus, labels.get(LABEL_JOB, name))
        try:
            duration = float(annotations.get(ANNOTATION_DURATION, "60"))
        except ValueError:
            duration = 60.0
        with self._lock:
            self._running[uid] = running
            heapq.heappush(self._due, (time.monotonic() + duration, uid))
        self.started += 1
        if gpus:
            self._on_gpus(running.node, gpus, 1)

    def _admit(self, node: str, pod: Mapping[str, Any], annotations: Mapping[str, str]) -> tuple[int, ...] | None:
        """The GPUs the node's device manager gives the pod (without one: gpuwarden's assignment)."""
        if self._devices is None:
            return decode_assignment(annotations.get(contract.ANNOTATION_GPU_ASSIGNMENT, ""), node=node) or ()
        return self._devices.admit(node, pod)

    def _stopped(self, uid: str, *, evicted: bool = False) -> RunningPod | None:
        with self._lock:
            running = self._running.pop(uid, None)
        if running is not None:
            if running.gpus:
                self._on_gpus(running.node, running.gpus, -1)
            if self._devices is not None:
                self._devices.release(running.node, running.namespace, running.name)
            landing = self.landed.get(running.uid)
            if landing is not None and landing.left_at is None:
                landing.left_at = self._clock()
                landing.evicted = evicted
        return running

    # ------------------------------------------------------------ finish

    def _finish_loop(self) -> None:
        while not self._stop.wait(0.2):
            now = time.monotonic()
            due: list[RunningPod] = []
            with self._lock:
                while self._due and self._due[0][0] <= now:
                    _, uid = heapq.heappop(self._due)
                    running = self._running.get(uid)
                    if running is not None:
                        due.append(running)
            for running in due:
                self._finish(running)

    def _finish(self, running: RunningPod) -> None:
        core = client.CoreV1Api(self._api)
        try:
            pod = meta(to_json(self._api, core.read_namespaced_pod(running.name, running.namespace)))
        except client.ApiException:
            self._stopped(running.uid)
            return
        if pod.get("uid") != running.uid or pod.get("deletionTimestamp"):
            return
        with contextlib.suppress(client.ApiException):
            mark_pod_finished(self._api, running.name, running.namespace)
            self.finished += 1
        self._stopped(running.uid)
