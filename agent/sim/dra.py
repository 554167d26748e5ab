"""NVIDIA's DRA driver for a simulated node: the ResourceSlice it publishes, and its health taints.

On a node of the GPU Operator's DRA mode there is no device plugin: NVIDIA's
DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu) publishes the GPUs as
devices of one ResourceSlice, and its health checks taint a device that
fails. This module plays that driver for a :class:`~agent.sim.node.SimNode`,
so that the demo (``gpuwarden demo --dra``) and the tests run gpuwarden's
DRA path against the objects the driver writes:

- the slice: driver ``gpu.nvidia.com``, one pool named after the node, a
  device ``gpu-<minor>`` per GPU (the simulated minor number is the index)
  with the attributes ``type``, ``uuid``, ``productName``, ``brand``,
  ``architecture``, ``cudaComputeCapability``, ``driverVersion``,
  ``cudaDriverVersion`` and ``resource.kubernetes.io/pciBusID`` (the
  kernel's 4-digit domain), capacity ``memory``; ``generateName``
  ``<index>-<driver>-<node>-``, owned by the Node, as the driver's vendored
  resourceslice controller makes it;
- the taints: ``gpu.nvidia.com/xid=<XID>:NoSchedule`` on a GPU that saw a
  critical XID (one the device plugin would not skip), and
  ``gpu.nvidia.com/gpu-lost:NoSchedule`` on a GPU fallen off the bus. Like
  the driver's, they stay until the plugin restarts, which in the
  simulation is the GPU's reset or the node's repair;
- a GPU in MIG mode is not published whole: as the driver does with
  instances made beforehand (static MIG), its instances are, named
  ``gpu-<minor>-mig-<profile without dots>-<GPU instance profile ID>-<placement
  start>``, ``type: mig`` with ``uuid``, ``parentUUID``, ``profile`` and the
  GPU's other attributes, capacity the profile's engines, multiprocessors,
  memory and one ``memorySlice<i>`` per memory slice. The simulated GPU has
  mig-parted's ``all-1g`` layout (seven one-slice instances, placements 0
  to 6), with the figures of NVIDIA's MIG user guide for the A100 40 GB
  and the H100 80 GB (:data:`ALL_1G`); a product not there publishes
  nothing in MIG mode. An
  instance carries its GPU's health taints.

The slice is written only when what it says changed, with the admin's
client: the driver has an identity of its own, not the agent's.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from agent.sim.node import DraGpuState, SimNode
from gpuwarden import contract
from gpuwarden.logconfig import get_logger

log = get_logger(__name__)

DRIVER = contract.NVIDIA_DRA_DRIVER
TAINT_XID = f"{DRIVER}/xid"
TAINT_GPU_LOST = f"{DRIVER}/gpu-lost"
_ARCHITECTURES = {"H100": ("Hopper", "9.0.0"), "H200": ("Hopper", "9.0.0"), "A100": ("Ampere", "8.0.0")}
DRIVER_VERSION = "580.82.7"
CUDA_DRIVER_VERSION = "13.0.0"


def _architecture(product: str) -> tuple[str, str]:
    for key, found in _ARCHITECTURES.items():
        if key in product:
            return found
    return ("Hopper", "9.0.0")


def _kernel_bus(bus: str) -> str:
    """NVML's 8-digit PCI domain as the kernel writes it: 00000000:18:00.0 -> 0000:18:00.0."""
    domain, _, rest = bus.partition(":")
    return f"{int(domain, 16):04x}:{rest}".lower() if rest else bus.lower()


def device(gpu: DraGpuState) -> dict[str, Any]:
    """One GPU as a device of the driver's slice, its taints included."""
    architecture, capability = _architecture(gpu.name)
    entry: dict[str, Any] = {
        "name": f"gpu-{gpu.index}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": gpu.uuid},
            "productName": {"string": gpu.name},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": architecture},
            "cudaComputeCapability": {"version": capability},
            "driverVersion": {"version": DRIVER_VERSION},
            "cudaDriverVersion": {"version": CUDA_DRIVER_VERSION},
            "resource.kubernetes.io/pciBusID": {"string": _kernel_bus(gpu.bus)},
        },
        "capacity": {"memory": {"value": f"{gpu.memory_mib}Mi"}},
    }
    taints = []
    if gpu.last_xid:
        taints.append({"key": TAINT_XID, "value": str(gpu.last_xid), "effect": "NoSchedule"})
    if gpu.lost:
        taints.append({"key": TAINT_GPU_LOST, "effect": "NoSchedule"})
    if taints:
        entry["taints"] = taints
    return entry


# mig-parted's all-1g layout, per product (NVML's name): the profile, its GPU instance profile ID,
# and the capacity the driver publishes for an instance of it. The 80 GB A100 and other H100s have
# other profiles, which the simulation does not have.
ALL_1G: dict[str, tuple[str, int, dict[str, str]]] = {
    "NVIDIA A100-PCIE-40GB": (
        "1g.5gb",
        19,
        {
            "copyEngines": "1",
            "decoders": "0",
            "encoders": "0",
            "jpegEngines": "0",
            "ofaEngines": "0",
            "multiprocessors": "14",
            "memory": "4864Mi",
        },
    ),
    "NVIDIA H100 80GB HBM3": (
        "1g.10gb",
        19,
        {
            "copyEngines": "1",
            "decoders": "1",
            "encoders": "0",
            "jpegEngines": "1",
            "ofaEngines": "0",
            "multiprocessors": "16",
            "memory": "9984Mi",
        },
    ),
}
MIG_PLACEMENTS = 7


def mig_instances(gpu: DraGpuState) -> list[dict[str, Any]]:
    """The instances of a GPU in MIG mode (module docstring); none for a product the simulation has no layout for."""
    layout = ALL_1G.get(gpu.name)
    if layout is None:
        return []
    profile, gi, capacity = layout
    whole = device(gpu)
    shared = {k: v for k, v in whole["attributes"].items() if k not in ("type", "uuid")}
    out = []
    for start in range(MIG_PLACEMENTS):
        caps: dict[str, Any] = {name: {"value": value} for name, value in capacity.items()}
        caps[f"memorySlice{start}"] = {"value": "1"}
        entry: dict[str, Any] = {
            "name": f"gpu-{gpu.index}-mig-{profile.replace('.', '')}-{gi}-{start}",
            "attributes": {
                "type": {"string": "mig"},
                "uuid": {"string": f"MIG-{gpu.uuid.removeprefix('GPU-')[:32]}{start:04x}"},
                "parentUUID": {"string": gpu.uuid},
                "profile": {"string": profile},
                **shared,
            },
            "capacity": caps,
        }
        if "taints" in whole:
            entry["taints"] = whole["taints"]
        out.append(entry)
    return out


def devices(gpus: tuple[DraGpuState, ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for g in gpus:
        out.extend(mig_instances(g) if g.mig else [device(g)])
    return out


class SimDraDriver:
    """Publishes one simulated node's ResourceSlice and keeps its taints current; call :meth:`sync` to publish."""

    def __init__(self, api: client.ApiClient, node: str, sim: SimNode) -> None:
        self._custom = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)
        self._node = node
        self._sim = sim
        self._name: str | None = None
        self._published: list[dict[str, Any]] | None = None

    def sync(self) -> bool:
        """Create or update the slice when its devices changed; whether it wrote."""
        wanted = devices(self._sim.dra_gpus())
        if wanted == self._published:
            return False
        if self._name is None:
            meta = self._core.read_node(self._node).metadata
            uid = meta.uid if meta is not None else None
            body = {
                "apiVersion": f"{contract.DRA_API_GROUP}/{contract.DRA_API_VERSION}",
                "kind": "ResourceSlice",
                "metadata": {
                    "generateName": f"{self._node}-{DRIVER}-",
                    "ownerReferences": [
                        {"apiVersion": "v1", "kind": "Node", "name": self._node, "uid": uid, "controller": True}
                    ],
                },
                "spec": {
                    "driver": DRIVER,
                    "nodeName": self._node,
                    "pool": {"name": self._node, "generation": 1, "resourceSliceCount": 1},
                    "devices": wanted,
                },
            }
            made: dict[str, Any] = self._custom.create_cluster_custom_object(  # type: ignore[assignment]
                contract.DRA_API_GROUP, contract.DRA_API_VERSION, contract.RESOURCESLICE_PLURAL, body
            )
            self._name = str(made["metadata"]["name"])
        else:
            self._custom.patch_cluster_custom_object(
                contract.DRA_API_GROUP,
                contract.DRA_API_VERSION,
                contract.RESOURCESLICE_PLURAL,
                self._name,
                {"spec": {"devices": wanted}},
            )
        tainted = [d["name"] for d in wanted if d.get("taints")]
        log.info("sim_dra_slice_published", node=self._node, devices=len(wanted), tainted=tainted)
        self._published = wanted
        return True

    def delete(self) -> None:
        if self._name is not None:
            try:
                self._custom.delete_cluster_custom_object(
                    contract.DRA_API_GROUP, contract.DRA_API_VERSION, contract.RESOURCESLICE_PLURAL, self._name
                )
            except client.ApiException as exc:
                if exc.status != 404:
                    raise
            self._name = None
            self._published = None
