"""The kubelet's PodResources API over its unix socket: which container holds which device.

On a device-plugin node the kubelet's device manager picks the GPUs a
container gets; the kubelet says which over gRPC
(``/var/lib/kubelet/pod-resources/kubelet.sock``, service
``v1.PodResourcesLister``). ``List`` names per container the device IDs of each
resource (GPU UUIDs for ``nvidia.com/gpu``) and the DRA devices of its claims;
``GetAllocatableResources`` the devices the plugins offer.

Every call carries a deadline (``timeout_s``), so a hung kubelet costs a poll
that long and no more. A failed call closes the channel and the next one
dials again: gRPC's own reconnect backoff grows to two minutes, and a kubelet
that restarted (a new socket at the same path) must be read again at the next
poll. The gRPC status is turned into a :class:`PodResourcesFailure`, the
reason the agent logs and counts.
"""

from __future__ import annotations

import os
import stat
import threading

import grpc

from agent.samples import HeldDevices, PodResourcesFailure
from agent.sources.base import PodResourcesError, PodResourcesSource
from gpuwarden.podresources.v1 import api_pb2, api_pb2_grpc

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"

# A node runs at most a few hundred pods; an answer past these bounds is not
# the kubelet's, and is cut rather than carried into the GPUNode.
MAX_PODS = 1024
MAX_DEVICE_IDS = 256
# The kubelet's answer for a full node is tens of KiB; refuse much more.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

_FAILURES = {
    grpc.StatusCode.DEADLINE_EXCEEDED: PodResourcesFailure.TIMEOUT,
    grpc.StatusCode.UNIMPLEMENTED: PodResourcesFailure.UNIMPLEMENTED,
    grpc.StatusCode.PERMISSION_DENIED: PodResourcesFailure.REFUSED,
    grpc.StatusCode.RESOURCE_EXHAUSTED: PodResourcesFailure.INVALID,
}


def held_from_list(answer: api_pb2.ListPodResourcesResponse) -> tuple[HeldDevices, ...]:
    """Every (container, resource) with devices in a ``List`` answer.

    Device-plugin devices keep their resource name; a DRA claim's devices
    are ``dra:<driver>`` with the device name first and its CDI device names
    after. Containers with no devices (CPU-only, or exclusive CPUs and
    memory only) give nothing; neither do CPU ids, memory or topology.
    """
    out: list[HeldDevices] = []
    for pod in answer.pod_resources[:MAX_PODS]:
        for container in pod.containers:
            for devices in container.devices:
                ids = tuple(devices.device_ids[:MAX_DEVICE_IDS])
                if ids:
                    out.append(HeldDevices(pod.namespace, pod.name, container.name, devices.resource_name, ids))
            for dynamic in container.dynamic_resources:
                for claimed in dynamic.claim_resources:
                    names = [claimed.device_name] if claimed.device_name else []
                    names += [cdi.name for cdi in claimed.cdi_devices if cdi.name]
                    if names:
                        out.append(
                            HeldDevices(
                                pod.namespace,
                                pod.name,
                                container.name,
                                f"dra:{claimed.driver_name}",
                                tuple(names[:MAX_DEVICE_IDS]),
                            )
                        )
    return tuple(out)


def ids_from_allocatable(answer: api_pb2.AllocatableResourcesResponse) -> frozenset[str]:
    """The device IDs a ``GetAllocatableResources`` answer offers, of every resource."""
    return frozenset(i for devices in answer.devices for i in devices.device_ids)


def status_of(error: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    """The status code and details of a failed call (an ``RpcError`` raised by a call is also a ``Call``)."""
    code_of, details_of = getattr(error, "code", None), getattr(error, "details", None)
    code = code_of() if callable(code_of) else None
    details = details_of() if callable(details_of) else None
    return (code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN), str(details or error)


def failure_of(error: grpc.RpcError) -> PodResourcesFailure:
    """The reason a failed call counts under.

    UNAVAILABLE is what gRPC says both for nobody listening and for a peer
    that does not speak HTTP/2; the first is refused, the second invalid.
    INTERNAL is a call whose answer did not decode (or a kubelet's own
    error); the answer then is not the service's.
    """
    code, details = status_of(error)
    if code is grpc.StatusCode.UNAVAILABLE:
        lowered = details.lower()
        if "refused" in lowered or "no such file" in lowered or "permission" in lowered:
            return PodResourcesFailure.REFUSED
        return PodResourcesFailure.INVALID
    if code is grpc.StatusCode.INTERNAL and "deserializ" in details.lower():
        return PodResourcesFailure.INVALID
    return _FAILURES.get(code, PodResourcesFailure.ERROR)


class KubeletPodResources(PodResourcesSource):
    """``v1.PodResourcesLister`` on the kubelet's socket at ``path``; see the module docstring."""

    def __init__(self, path: str = DEFAULT_SOCKET, timeout_s: float = 2.0) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: api_pb2_grpc.PodResourcesListerStub | None = None

    def _connect(self) -> api_pb2_grpc.PodResourcesListerStub:
        try:
            mode = os.stat(self.path).st_mode
        except FileNotFoundError as exc:
            raise PodResourcesError(PodResourcesFailure.MISSING, f"no socket at {self.path}") from exc
        except OSError as exc:
            raise PodResourcesError(PodResourcesFailure.REFUSED, f"{self.path}: {exc.strerror or exc}") from exc
        if not stat.S_ISSOCK(mode):
            raise PodResourcesError(PodResourcesFailure.INVALID, f"{self.path} is not a socket")
        with self._lock:
            if self._stub is None:
                self._channel = grpc.insecure_channel(
                    f"unix://{self.path}",
                    options=[
                        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                        # One call at a time, from the poll loop: no retries behind its back.
                        ("grpc.enable_retries", 0),
                    ],
                )
                self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
            return self._stub

    def _failed(self, call: str, error: grpc.RpcError) -> PodResourcesError:
        self.close()
        failure = failure_of(error)
        code, details = status_of(error)
        return PodResourcesError(failure, f"{call} on {self.path}: {code.name}: {details}")

    def list(self) -> tuple[HeldDevices, ...]:
        stub = self._connect()
        try:
            answer = stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise self._failed("List", exc) from exc
        return held_from_list(answer)

    def allocatable(self) -> frozenset[str]:
        stub = self._connect()
        try:
            answer = stub.GetAllocatableResources(api_pb2.AllocatableResourcesRequest(), timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise self._failed("GetAllocatableResources", exc) from exc
        return ids_from_allocatable(answer)

    def close(self) -> None:
        with self._lock:
            channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            channel.close()
