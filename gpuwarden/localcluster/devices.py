"""The stand-in kubelet's device manager: which GPUs a container gets, told over PodResources.

On a device-plugin node it is the kubelet's device manager, not the
scheduler, that picks the devices of a container asking for
``nvidia.com/gpu``: among those the device plugin lists Healthy and no other
container holds. It never reads gpuwarden's assignment annotation, so it can
hand a whole-GPU pod a GPU that gpuwarden has quarantined for a fault the
device plugin does not check (a row-remap failure, a downed NVLink). This
class plays that part for one simulated node, so that the demo and the tests
have the same gap a real cluster has, and serves the kubelet's PodResources
API (``List``, ``GetAllocatableResources``) on a unix socket through
:class:`gpuwarden.podresources.fake.FakePodResources`, which the node's sim
agent reads as it reads a real kubelet's.

The choice is deterministic so that a test can predict it: the free offered
devices in the order the plugin lists them (the real kubelet asks the
plugin's preferred allocation, else takes any). A pod whose request cannot
be met is refused (the real kubelet fails it with UnexpectedAdmissionError).
Devices are held from admission until :meth:`DeviceManager.release` (the
pod's containers stopped), keyed by the pod's namespace and name as
PodResources names them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuwarden.contract import RESOURCE_NVIDIA_GPU
from gpuwarden.logconfig import get_logger
from gpuwarden.podresources.fake import FakePodResources
from gpuwarden.podresources.v1 import api_pb2

log = get_logger(__name__)

PodKey = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True, slots=True)
class Admitted:
    """The devices one pod's containers were given, container by container."""

    namespace: str
    pod: str
    containers: tuple[tuple[str, tuple[str, ...]], ...]

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(d for _, ids in self.containers for d in ids)


def _requested(container: Mapping[str, Any], resource: str) -> int:
    """Devices of ``resource`` a container asks for (its limit, which extended resources must set)."""
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return 0
    for key in ("limits", "requests"):
        amounts = resources.get(key)
        if isinstance(amounts, dict) and resource in amounts:
            try:
                return max(0, int(str(amounts[resource])))
            except ValueError:
                return 0
    return 0


class DeviceManager:
    """One node's device manager for one resource; see the module docstring. Thread-safe."""

    def __init__(
        self,
        offered: Callable[[], Sequence[str]],
        socket_path: str | None = None,
        *,
        resource: str = RESOURCE_NVIDIA_GPU,
        node: str = "",
    ) -> None:
        """``offered`` says which device IDs the device plugin lists Healthy now, in its order."""
        self._offered = offered
        self._resource = resource
        self._node = node
        self._lock = threading.Lock()
        self._pods: dict[PodKey, Admitted] = {}
        self._server = FakePodResources(socket_path, answers=self.answers) if socket_path else None
        self.refused = 0

    def start(self) -> DeviceManager:
        if self._server is not None:
            self._server.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.vanish()

    def __enter__(self) -> DeviceManager:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    # ------------------------------------------------------------ devices

    def admit(self, pod: Mapping[str, Any]) -> Admitted | None:
        """Give the pod's containers their devices (at most once per pod); None when there are too few.

        The pod is read as the API server returns it (``metadata``,
        ``spec.containers``). Already admitted: what it was given.
        """
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        key = (str(meta.get("namespace") or "default"), str(meta.get("name") or ""))
        wants = [
            (str(c.get("name") or ""), _requested(c, self._resource))
            for c in spec.get("containers") or []
            if isinstance(c, dict)
        ]
        with self._lock:
            known = self._pods.get(key)
            if known is not None:
                return known
            held = {d for a in self._pods.values() for d in a.devices}
            free = [d for d in self._offered() if d not in held]
            if sum(n for _, n in wants) > len(free):
                self.refused += 1
                log.info("standin_devices_refused", node=self._node, pod=f"{key[0]}/{key[1]}", free=len(free))
                return None
            given: list[tuple[str, tuple[str, ...]]] = []
            for name, n in wants:
                if n:
                    given.append((name, tuple(free[:n])))
                    free = free[n:]
            admitted = Admitted(key[0], key[1], tuple(given))
            self._pods[key] = admitted
            return admitted

    def release(self, namespace: str, name: str) -> Admitted | None:
        """The pod's containers stopped: its devices are free again."""
        with self._lock:
            return self._pods.pop((namespace, name), None)

    def devices_of(self, namespace: str, name: str) -> tuple[str, ...]:
        with self._lock:
            admitted = self._pods.get((namespace, name))
        return admitted.devices if admitted is not None else ()

    def holders(self) -> dict[str, PodKey]:
        """Device ID -> the pod holding it."""
        with self._lock:
            return {d: (a.namespace, a.pod) for a in self._pods.values() for d in a.devices}

    # --------------------------------------------------------- PodResources

    def answers(self) -> tuple[api_pb2.ListPodResourcesResponse, api_pb2.AllocatableResourcesResponse]:
        """What the kubelet's ``List`` and ``GetAllocatableResources`` say now."""
        with self._lock:
            pods = sorted(self._pods.values(), key=lambda a: (a.namespace, a.pod))
        listed = api_pb2.ListPodResourcesResponse(
            pod_resources=[
                api_pb2.PodResources(
                    name=a.pod,
                    namespace=a.namespace,
                    containers=[
                        api_pb2.ContainerResources(
                            name=container,
                            devices=[api_pb2.ContainerDevices(resource_name=self._resource, device_ids=list(ids))],
                        )
                        for container, ids in a.containers
                    ],
                )
                for a in pods
            ]
        )
        allocatable = api_pb2.AllocatableResourcesResponse(
            devices=[api_pb2.ContainerDevices(resource_name=self._resource, device_ids=list(self._offered()))]
        )
        return listed, allocatable
