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

A pod with DRA claims (``spec.resourceClaims``) starts only once every claim
it names is allocated and reserved for it (``status.reservedFor``), as the
kubelet's DRA manager refuses to prepare the resources of any other: until
then it stays Pending (checked again every second), with a Warning Event
``FailedPrepareDynamicResources`` saying which claim is not ready. Its GPUs
are the devices of its claims' allocations (the driver names a GPU
``gpu-<minor>``; the simulated nodes' minor numbers are their indices), not
the device manager's.
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
from gpuwarden.dra import device_minor
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

_DRA_GROUP, _DRA_VERSION = contract.DRA_API_GROUP, contract.DRA_API_VERSION
CLAIM_RECHECK_S = 1.0


def claims_ready(api: client.ApiClient, pod: dict[str, Any]) -> tuple[int, ...] | str:
    """The GPU indices a pod's DRA claims give it on its node, or why the kubelet would not start it yet."""
    metadata, spec, status = meta(pod), sub(pod, "spec"), sub(pod, "status")
    namespace, uid, node = str(metadata.get("namespace")), metadata.get("uid"), spec.get("nodeName")
    made: dict[object, object] = {
        s.get("name"): s.get("resourceClaimName")
        for s in status.get("resourceClaimStatuses") or ()
        if isinstance(s, dict)
    }
    custom = client.CustomObjectsApi(api)
    gpus: set[int] = set()
    entries = list(spec.get("resourceClaims") or ())
    extended = sub(status, "extendedResourceClaimStatus").get("resourceClaimName")
    if extended:
        # The claim the scheduler made for the pod's extended resources (KEP-5004).
        entries.append({"name": "", "resourceClaimName": extended})
    for entry in entries:
        name = entry.get("resourceClaimName") or made.get(entry.get("name"))
        if entry.get("resourceClaimTemplateName") and entry.get("name") in made and made[entry.get("name")] is None:
            continue  # the template needed no claim
        if not isinstance(name, str) or not name:
            return f"claim {entry.get('name')!r} of the pod has not been created yet"
        try:
            claim = custom.get_namespaced_custom_object(_DRA_GROUP, _DRA_VERSION, namespace, "resourceclaims", name)
        except client.ApiException as exc:
            return f"resourceclaim {name}: {exc.status} {exc.reason}"
        claim_status = sub(claim, "status") if isinstance(claim, dict) else {}
        allocation = claim_status.get("allocation")
        if not allocation:
            return f"resourceclaim {name} is not allocated"
        if not any(r.get("uid") == uid for r in claim_status.get("reservedFor") or ()):
            return f"resourceclaim {name} is not reserved for the pod"
        for result in (allocation.get("devices") or {}).get("results") or ():
            minor = device_minor(str(result.get("device")))
            if result.get("driver") == contract.NVIDIA_DRA_DRIVER and result.get("pool") == node and minor is not None:
                gpus.add(minor)
    return tuple(sorted(gpus))


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
        # Pods whose claims are not ready yet (uid -> pod), checked again every second; why, by uid.
        self._waiting: dict[str, dict[str, Any]] = {}
        self.refused: dict[str, str] = {}
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
            with self._lock:
                self._waiting.pop(uid, None)
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
        self._start(pod, node)

    def _start(self, pod: dict[str, Any], node: str) -> None:
        metadata = meta(pod)
        uid, name, namespace = str(metadata.get("uid")), str(metadata.get("name")), str(metadata.get("namespace"))
        annotations: Mapping[str, str] = metadata.get("annotations") or {}
        labels: Mapping[str, str] = metadata.get("labels") or {}
        if sub(pod, "spec").get("resourceClaims") or sub(pod, "status").get("extendedResourceClaimStatus"):
            ready = claims_ready(self._api, pod)
            if isinstance(ready, str):
                self._refuse(pod, ready)
                return
            with self._lock:
                self._waiting.pop(uid, None)
            self.refused.pop(uid, None)
            gpus: tuple[int, ...] | None = ready
        else:
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

    def _refuse(self, pod: dict[str, Any], why: str) -> None:
        """Keep the pod Pending and say why once, as the kubelet's DRA manager does; it is tried again later."""
        metadata = meta(pod)
        uid = str(metadata.get("uid"))
        with self._lock:
            self._waiting[uid] = pod
        if self.refused.get(uid) == why:
            return
        self.refused[uid] = why
        log.info("demo_pod_claims_not_ready", pod=f"{metadata.get('namespace')}/{metadata.get('name')}", why=why)
        event: dict[str, Any] = {
            "metadata": {"generateName": f"{metadata.get('name')}."},
            "involvedObject": {
                "kind": "Pod",
                "namespace": metadata.get("namespace"),
                "name": metadata.get("name"),
                "uid": uid,
            },
            "type": "Warning",
            "reason": "FailedPrepareDynamicResources",
            "message": f"Failed to prepare dynamic resources: {why}",
            "source": {"component": "kubelet", "host": sub(pod, "spec").get("nodeName")},
        }
        with contextlib.suppress(client.ApiException):
            client.CoreV1Api(self._api).create_namespaced_event(str(metadata.get("namespace")), event)  # type: ignore[arg-type]

    def _recheck(self) -> None:
        """Try the pods waiting for their claims again, each as it is now."""
        with self._lock:
            waiting = list(self._waiting.items())
        core = client.CoreV1Api(self._api)
        for uid, old in waiting:
            metadata = meta(old)
            try:
                pod = to_json(
                    self._api, core.read_namespaced_pod(str(metadata.get("name")), str(metadata.get("namespace")))
                )
            except client.ApiException:
                with self._lock:
                    self._waiting.pop(uid, None)
                continue
            node = sub(pod, "spec").get("nodeName")
            if meta(pod).get("uid") != uid or meta(pod).get("deletionTimestamp") or not isinstance(node, str):
                with self._lock:
                    self._waiting.pop(uid, None)
                continue
            self._start(pod, node)

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
        checked = time.monotonic()
        while not self._stop.wait(0.2):
            now = time.monotonic()
            if self._waiting and now - checked >= CLAIM_RECHECK_S:
                checked = now
                self._recheck()
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
